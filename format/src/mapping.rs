//! Files mapped read-only, and the `SIGBUS` handler that keeps a file
//! truncated under its mapping from killing the process.
//!
//! A file truncated while it is mapped (`cp` or `rsync --inplace` over a
//! live dataset or input) raises `SIGBUS` on the next touch of a page past
//! its new end. A handler, installed once and chaining to whatever handler
//! was there before, looks the address up among the mappings registered
//! here: when it lies in one, it maps a zero page over the faulting page and
//! marks the mapping, and the read goes on with zeros; the owner of the
//! mapping checks the mark ([`MappedFile::changed`]) before it hands on
//! anything made of those bytes. A fault anywhere else goes to the previous
//! handler (Rust's stack overflow report, Python's `faulthandler`), or kills
//! the process as it would have. The loader maps its local shards this way,
//! `shard` its local Parquet inputs.

use std::fs::File;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings registered for the `SIGBUS` handler at once; a file that finds
/// no free slot is read with `pread`.
const SLOTS: usize = 1024;

/// A registered mapping, as the signal handler sees it: `start..end`
/// (`start == 0`: free), and whether a fault was absorbed in it.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)] // one fresh slot per element
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];

/// A slot taken but not published (its mapping being made or unmapped):
/// matches no address (`end` is set before `start` is published).
const CLAIMED: usize = 1;

/// The system's page size, read at installation.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action found at installation, called for faults outside
/// the registered mappings.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Whether the handler is installed (tried once per process).
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Install the `SIGBUS` handler (once per process); false when it could not
/// be (mappings are then not used).
fn install() -> bool {
    *INSTALLED.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page <= 0 || !(page as usize).is_power_of_two() {
            return false;
        }
        PAGE.store(page as usize, Ordering::Relaxed);
        // SAFETY: sigaction with a null new action only reads the current
        // one into `old`, a zeroed sigaction (a valid bit pattern).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return false;
        }
        let _ = PREVIOUS.set(old);
        // SAFETY: a zeroed sigaction is valid; the handler is an
        // `extern "C"` function of the SA_SIGINFO signature, and its mask
        // is initialised by sigemptyset.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0
        }
    })
}

/// The `SIGBUS` handler. Async-signal-safe: atomics, `mmap`, `sigaction`,
/// `raise`, and the previous handler.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler;
    // errno is thread-local, saved and restored around our calls.
    unsafe {
        let errno = *libc::__errno_location();
        let addr = (*info).si_addr() as usize;
        let page = PAGE.load(Ordering::Relaxed);
        for slot in &REGISTRY {
            let start = slot.start.load(Ordering::Acquire);
            if start <= CLAIMED {
                continue;
            }
            let end = slot.end.load(Ordering::Acquire);
            if (start..end).contains(&addr) {
                let at = addr & !(page - 1);
                // A private zero page over the page past the file's end:
                // the faulting read goes on and reads zeros.
                let mapped = libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if mapped != libc::MAP_FAILED {
                    slot.faulted.store(true, Ordering::Release);
                    *libc::__errno_location() = errno;
                    return;
                }
                break;
            }
        }
        *libc::__errno_location() = errno;
        chain(sig, info, context);
    }
}

/// Hand a fault that is not ours to the action that was there before.
///
/// # Safety
/// Called from the signal handler with its arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restores the default action; a fault then happens again
        // on return and ends the process as it would have without us; a
        // signal sent by a process is raised again.
        unsafe {
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut default.sa_mask);
            libc::sigaction(sig, &default, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(sig);
            }
        }
        return;
    }
    let flags = previous.map_or(0, |p| p.sa_flags);
    // SAFETY: the previous action's handler, called with the signature its
    // flags declare.
    unsafe {
        if flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, context);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

/// Whether any address of `range` lies in one of the registered mappings
/// (memory whose bytes are a file's as it is now, not as it was checked).
pub fn overlaps_mapping(range: Range<usize>) -> bool {
    REGISTRY.iter().any(|slot| {
        let start = slot.start.load(Ordering::Acquire);
        start > CLAIMED && start < range.end && range.start < slot.end.load(Ordering::Acquire)
    })
}

/// How a mapped file changed since it was mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    /// A page past its end was touched: it was truncated.
    Truncated,
    /// Its identity, size or modification time differ (written, truncated,
    /// replaced); its size now (0 where it cannot be read).
    Rewritten(u64),
}

/// What `fstat` says about a file: a write, a truncation or a rename over
/// it changes at least one of these. (Not its change time, which links,
/// `chmod` and backups move too.)

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(file: &File) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

/// A whole file mapped read-only (shared), registered with the `SIGBUS`
/// handler; unmapped when dropped.
pub struct MappedFile {
    ptr: NonNull<u8>,
    len: usize,
    slot: usize,
    stamp: Stamp,
}

// SAFETY: the mapping is read-only and lives until drop; the rest is plain
// data and the registry's atomics.
unsafe impl Send for MappedFile {}
// SAFETY: as above.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Map the first `len` bytes of `file`, which must be its whole size.
    /// `None` when a mapping cannot be used: no handler, no free slot, an
    /// empty file, another size, or `mmap` refused (the caller reads with
    /// `pread` then).
    pub fn map(file: &File, len: u64) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !install() {
            return None;
        }
        let stamp = Stamp::of(file).ok()?;
        if stamp.len != len as u64 {
            return None;
        }
        let slot = REGISTRY.iter().position(|s| {
            s.start
                .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        // SAFETY: a new shared read-only mapping of an open file (no fixed
        // address); the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        let ptr = (ptr != libc::MAP_FAILED)
            .then_some(ptr)
            .and_then(|p| NonNull::new(p.cast::<u8>()));
        let Some(ptr) = ptr else {
            REGISTRY[slot].start.store(0, Ordering::Release);
            return None;
        };
        let entry = &REGISTRY[slot];
        entry.faulted.store(false, Ordering::Relaxed);
        entry
            .end
            .store(ptr.as_ptr() as usize + len, Ordering::Release);
        entry.start.store(ptr.as_ptr() as usize, Ordering::Release);
        Some(MappedFile {
            ptr,
            len,
            slot,
            stamp,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is mapped (never: an empty file is not mapped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of `range` (`None` past the end). A page past the end of a
    /// file truncated since reads as zeros: check [`MappedFile::changed`]
    /// before anything made of them is handed on.
    pub fn get(&self, range: Range<usize>) -> Option<&[u8]> {
        (range.start <= range.end && range.end <= self.len).then(|| {
            // SAFETY: `range` lies inside the live read-only mapping.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) }
        })
    }

    /// Whether a page past the file's end was touched (the handler mapped
    /// zeros over it).
    pub fn faulted(&self) -> bool {
        REGISTRY[self.slot].faulted.load(Ordering::Acquire)
    }

    /// How `file` (the one mapped) changed since it was mapped, if it did.
    pub fn changed(&self, file: &File) -> Option<FileChange> {
        if self.faulted() {
            return Some(FileChange::Truncated);
        }
        match Stamp::of(file) {
            Ok(now) if now == self.stamp => None,
            Ok(now) => Some(FileChange::Rewritten(now.len)),
            Err(_) => Some(FileChange::Rewritten(0)),
        }
    }

    /// Drop the whole pages inside `range` from the process (the page cache
    /// keeps them; a later touch maps them again), so that the process
    /// holds only the parts of the file it is using.
    pub fn drop_pages(&self, range: Range<usize>) {
        let page = PAGE.load(Ordering::Relaxed);
        let (from, to) = (
            range.start.next_multiple_of(page),
            range.end.min(self.len) / page * page,
        );
        if to > from {
            // SAFETY: a page-aligned range inside the live mapping; dropping
            // pages of a read-only file mapping loses nothing.
            unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(from).cast(),
                    to - from,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        let entry = &REGISTRY[self.slot];
        // Matches no address from here on, and stays taken until unmapped.
        entry.start.store(CLAIMED, Ordering::Release);
        // SAFETY: the mapping made in `map`, unmapped once, here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        entry.end.store(0, Ordering::Release);
        entry.start.store(0, Ordering::Release);
    }
}
