//! Large buffers mapped for themselves (read buffers, slabs): anonymous
//! memory in whole huge pages, outside the allocator's heap, so that buffers
//! of every size come and go without fragmenting it, and are handed back
//! to the system whole.

use std::ptr::NonNull;

/// Buffers of at least this many bytes (a huge page) are mapped for
/// themselves; their sizes are rounded up to a multiple of it.
pub(crate) const MAPPED_FROM: usize = 2 << 20;

/// A new mapping of at least `len` bytes, zeroed, page-aligned, advised to
/// use huge pages where the system allows (a fault per 2 MiB, as mimalloc's
/// arenas are; a refusal only costs speed): its address and size.
pub(crate) fn map(len: usize) -> std::io::Result<(NonNull<u8>, usize)> {
    let cap = len
        .checked_next_multiple_of(MAPPED_FROM)
        .ok_or_else(|| std::io::Error::other(format!("a buffer of {len} bytes")))?;
    // SAFETY: a new private anonymous mapping of `cap` bytes (no file, no
    // fixed address); the result is checked before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            cap,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ptr = NonNull::new(ptr.cast::<u8>())
        .ok_or_else(|| std::io::Error::other("mmap gave a null address"))?;
    // SAFETY: advice on the mapping just made, which stays mapped.
    unsafe { libc::madvise(ptr.as_ptr().cast(), cap, libc::MADV_HUGEPAGE) };
    Ok((ptr, cap))
}

/// Unmap a buffer [`map`] made.
///
/// # Safety
/// `ptr` and `cap` are what one call of [`map`] gave, and nothing uses the
/// buffer after this (nor unmaps it again).
pub(crate) unsafe fn unmap(ptr: NonNull<u8>, cap: usize) {
    // SAFETY: the caller's promise: a live mapping of `cap` bytes at `ptr`.
    unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
}
