//! Large buffers mapped for themselves (read buffers, slabs): anonymous
//! memory outside the allocator's heap, so that buffers of every size come
//! and go without fragmenting it, and are handed back to the system whole.
//!
//! They are not advised to use transparent huge pages (`MADV_HUGEPAGE`):
//! the system's own policy applies. Advised, a buffer's first touch of each
//! 2 MiB costs a whole zeroed huge page, and on a virtual machine whose
//! host takes back the guest's free memory (free page reporting, as on this
//! project's machines) every such page is faulted in again on the host: a
//! fresh process spent 85% of its time before the first batch zeroing huge
//! pages, and its first epoch ran at half the steady rate (docs/performance-notes.md).

use std::ptr::NonNull;

/// Buffers of at least this many bytes are mapped for themselves; their
/// sizes are rounded up to a multiple of it (2 MiB: pooled buffers of
/// nearby sizes fit each other's requests; the pages past `len` are
/// never touched, so they cost no memory).
pub(crate) const MAPPED_FROM: usize = 2 << 20;

/// A new mapping of at least `len` bytes, zeroed, page-aligned: its address
/// and size.
pub(crate) fn map(len: usize) -> std::io::Result<(NonNull<u8>, usize)> {
    let cap = len
        .checked_next_multiple_of(MAPPED_FROM)
        .ok_or_else(|| std::io::Error::other(format!("a buffer of {len} bytes")))?;
    Ok((
        mmap_rw(cap, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)?,
        cap,
    ))
}

/// A new readable and writable mapping of `cap` bytes with `flags`, of
/// `fd` from its start (`-1` for anonymous memory), at an address the
/// system picks.
fn mmap_rw(cap: usize, flags: libc::c_int, fd: libc::c_int) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a new mapping (no fixed address) of `cap` bytes of anonymous
    // memory or of an open file the caller owns; the result is checked
    // before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            cap,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap gave a null address"))
}

/// A new mapping of at least `len` bytes (whole pages), zeroed, that other
/// processes of the same user can map too: the pages of a new memfd, mapped
/// shared. Its address, size, and the memfd (closed on exec; another
/// process opens it as `/proc/<pid>/fd/<fd>`). The memory goes when the
/// mapping is unmapped and the memfd closed here and in every process that
/// mapped it. Unmap it with [`unmap`].
#[cfg(target_os = "linux")]
pub(crate) fn map_shared(
    len: usize,
) -> std::io::Result<(NonNull<u8>, usize, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    const PAGE: usize = 4096;
    let cap = len
        .max(1)
        .checked_next_multiple_of(PAGE)
        .ok_or_else(|| std::io::Error::other(format!("a buffer of {len} bytes")))?;
    let size = libc::off_t::try_from(cap)
        .map_err(|_| std::io::Error::other(format!("a buffer of {len} bytes")))?;
    // SAFETY: a NUL-terminated name and known flags; the result is checked.
    let fd = unsafe { libc::memfd_create(c"shardfeed-slab".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `fd` is an open memfd; the size is not negative.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((mmap_rw(cap, libc::MAP_SHARED, fd.as_raw_fd())?, cap, fd))
}

/// Unmap a buffer [`map`] or [`map_shared`] made.
///
/// # Safety
/// `ptr` and `cap` are what one call of [`map`] (or [`map_shared`]) gave, and nothing uses the
/// buffer after this (nor unmaps it again).
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: the caller's promise: a live mapping of `cap` bytes at `ptr`.
    unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The `VmFlags` of the mapping of `/proc/self/smaps` that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_string();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    /// Buffers are mapped without huge page advice (`hg`), so the system's
    /// policy decides, and are zeroed and writable over their capacity.
    #[test]
    fn mappings_are_not_advised_to_use_huge_pages() {
        let (ptr, cap) = super::map(3 << 20).unwrap();
        assert_eq!(cap, 4 << 20);
        let flags = vm_flags(ptr.as_ptr() as usize);
        assert!(flags.split_whitespace().any(|f| f == "rd"), "{flags}");
        assert!(!flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        // SAFETY: the mapping just made, `cap` bytes long, unmapped below.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), cap) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes.fill(1);
        // SAFETY: what `map` gave; `bytes` is not used after this.
        unsafe { super::unmap(ptr, cap) };
    }

    /// A shared mapping is zeroed, writable, and the same memory as what
    /// another mapping of its memfd (through `/proc/self/fd`, as a worker
    /// process opens it) sees.
    #[test]
    fn shared_mappings_are_seen_through_their_memfd() {
        use std::io::{Read, Seek, SeekFrom};
        use std::os::fd::AsRawFd;
        let (ptr, cap, fd) = super::map_shared(10_000).unwrap();
        assert_eq!(cap, 12_288);
        // SAFETY: the mapping just made, `cap` bytes long, unmapped below.
        let bytes = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), cap) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[5_000..5_004].copy_from_slice(b"slab");
        let mut other = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
        other.seek(SeekFrom::Start(5_000)).unwrap();
        let mut seen = [0u8; 4];
        other.read_exact(&mut seen).unwrap();
        assert_eq!(&seen, b"slab");
        // SAFETY: what `map_shared` gave; `bytes` is not used after this.
        unsafe { super::unmap(ptr, cap) };
    }
}
