//! Local shards read through a read-only mapping of the file, so that the
//! bytes a batch is made of are copied once (page cache -> slab) instead of
//! twice (page cache -> read buffer -> slab, `pread`'s way): on image rows
//! the kernel's copy was 44% of the loader's CPU (docs/performance-notes.md).
//!
//! A mapping gives up two things `pread` into a private buffer guaranteed,
//! and each is taken back here:
//! - **A file truncated while it is mapped** (`cp` or `rsync --inplace`
//!   over a live dataset) raises `SIGBUS` on the next touch of a page past
//!   its new end, which would kill the process. A handler, installed once
//!   and chaining to whatever handler was there before, looks the address up
//!   among this module's mappings: when it lies in one, it maps a zero page
//!   over the faulting page and marks the mapping, and the read goes on
//!   with zeros. The mark fails the chunk being read (checked after its
//!   checksum) and the batch being made (checked before it is handed on),
//!   with an error naming the shard. A fault anywhere else goes to the
//!   previous handler (Rust's stack overflow report, Python's
//!   `faulthandler`), or kills the process as it would have.
//! - **The bytes used are the bytes checked**: `pread`'s copy is what its
//!   checksum covered, where a mapping shows the file as it is now. Each
//!   mapping records the file's identity, size and times when it is made;
//!   before a batch is handed on, every mapped shard whose bytes were used
//!   since its last check is `fstat`ed again, and a file written, truncated
//!   or replaced since it was mapped is an error naming the shard (write(2)
//!   and truncate(2) update its modification time). A file changed after that
//!   check cannot affect the batch: its bytes were copied into the slab.
//!
//! Memory stays bounded as with read buffers: when a chunk's last reference
//! goes, its pages are dropped from the process (`MADV_DONTNEED`; they stay
//! in the page cache), so a process maps only the chunks the byte budget
//! lets it hold, not every page of the dataset it has read.
//!
//! Mappings are used for the byte-array and list column chunks of local
//! datasets' shards; footers, other columns, remote ranges, cached copies, and every read when
//! [`crate::LoaderBuilder::mapped_reads`] is off or the handler could not be
//! installed, go through `pread`.

use std::fs::File;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use shardfeed_format::{ChunkHash, ChunkSum};

/// Mappings registered for the `SIGBUS` handler at once; a shard that finds
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

/// A slot taken but not yet published: matches no address (its `end` is
/// set before its `start`).
const CLAIMED: usize = 1;

/// The system's page size, read at installation.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action found at installation, called for faults outside
/// this module's mappings.
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

/// Whether any address of `range` lies in one of this module's mappings
/// (memory whose bytes are a shard's as it is now, not as it was checked).
pub(crate) fn overlaps_mapping(range: Range<usize>) -> bool {
    REGISTRY.iter().any(|slot| {
        let start = slot.start.load(Ordering::Acquire);
        start > CLAIMED && start < range.end && range.start < slot.end.load(Ordering::Acquire)
    })
}

/// How a local shard failed to read: changed since it was opened (mapped
/// or not), or an I/O error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// A page past its end was touched: it was truncated.
    Truncated,
    /// Its identity, size or times differ (written, truncated, replaced);
    /// its size now.
    Rewritten(u64),
    /// A `pread` of it failed otherwise.
    Failed(std::io::ErrorKind, String),
}

impl From<std::io::Error> for Changed {
    /// A short read means the file is shorter than its manifest size.
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Changed::Truncated,
            kind => Changed::Failed(kind, e.to_string()),
        }
    }
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

/// A whole shard mapped read-only, registered with the `SIGBUS` handler.
pub(crate) struct MappedShard {
    /// The shard's index in the manifest.
    pub shard: u32,
    ptr: NonNull<u8>,
    len: usize,
    slot: usize,
    file: Arc<File>,
    stamp: Stamp,
    /// Chunks whose bytes are still referenced.
    live: AtomicUsize,
    /// Chunks made so far, and as of the last check that found none live.
    made: AtomicU64,
    seen: AtomicU64,
    /// Where a shard that changed reports it when it goes unchecked.
    set: Weak<MapSet>,
    /// Each chunk's checksum, computed at its first read: the file is
    /// checked unchanged (device, inode, size, modification time) before
    /// every batch made of its bytes, so later reads of the chunk (later
    /// epochs) reuse the sum instead of reading every byte again.
    sums: std::sync::Mutex<std::collections::HashMap<(usize, usize), ChunkSum>>,
}

// SAFETY: the mapping is read-only and lives until drop; the rest is
// atomics and shared handles.
unsafe impl Send for MappedShard {}
// SAFETY: as above.
unsafe impl Sync for MappedShard {}

impl MappedShard {
    /// Map the first `len` bytes of `file` (the manifest's size, checked
    /// against the file by the caller). `None` when mappings cannot be used:
    /// no handler, no free slot, an empty file, or `mmap` refused.
    fn map(shard: u32, file: Arc<File>, len: u64, set: &Arc<MapSet>) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        if !install() {
            return None;
        }
        let stamp = Stamp::of(&file).ok()?;
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
        Some(MappedShard {
            shard,
            ptr,
            len,
            slot,
            file,
            stamp,
            live: AtomicUsize::new(0),
            made: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            set: Arc::downgrade(set),
            sums: Default::default(),
        })
    }

    /// The bytes of `range` as a chunk that references the mapping, with
    /// its checksum by `hash` (computed at the chunk's first read, then
    /// remembered: see [`MappedShard::sums`]). An error when the range lies
    /// outside the mapping or the file was truncated under it.
    pub(crate) fn chunk(
        self: &Arc<Self>,
        range: Range<u64>,
        hash: Option<ChunkHash>,
    ) -> Result<(Bytes, Option<ChunkSum>), Changed> {
        let (start, end) = match (usize::try_from(range.start), usize::try_from(range.end)) {
            (Ok(s), Ok(e)) if s <= e && e <= self.len => (s, e),
            // As a `pread` past the end: the file is shorter than the range.
            _ => return Err(Changed::Truncated),
        };
        self.live.fetch_add(1, Ordering::AcqRel);
        self.made.fetch_add(1, Ordering::AcqRel);
        let chunk = MapChunk {
            shard: self.clone(),
            start,
            end,
        };
        let sums = || self.sums.lock().unwrap_or_else(|p| p.into_inner());
        let sum = hash.map(|h| {
            let known = sums().get(&(start, end)).copied().filter(|s| s.hash == h);
            known.unwrap_or_else(|| {
                let mut hasher = h.hasher();
                hasher.update(chunk.as_ref());
                let sum = hasher.finish();
                sums().insert((start, end), sum);
                sum
            })
        });
        if self.faulted() {
            return Err(Changed::Truncated);
        }
        Ok((Bytes::from_owner(chunk), sum))
    }

    fn faulted(&self) -> bool {
        REGISTRY[self.slot].faulted.load(Ordering::Acquire)
    }

    /// Whether the file is still what was mapped.
    pub(crate) fn check(&self) -> Result<(), Changed> {
        if self.faulted() {
            return Err(Changed::Truncated);
        }
        match Stamp::of(&self.file) {
            Ok(now) if now == self.stamp => Ok(()),
            Ok(now) => Err(Changed::Rewritten(now.len)),
            Err(_) => Err(Changed::Rewritten(0)),
        }
    }
}

impl Drop for MappedShard {
    fn drop(&mut self) {
        // The last chunk went: bytes used since the last check are checked
        // now, and a change is reported to the set's next check.
        if self.made.load(Ordering::Acquire) != self.seen.load(Ordering::Acquire)
            && let Err(changed) = self.check()
            && let Some(set) = self.set.upgrade()
        {
            set.report(self.shard, changed);
        }
        let entry = &REGISTRY[self.slot];
        entry.start.store(0, Ordering::Release);
        // SAFETY: the mapping made in `map`, unmapped once, here; no chunk
        // references it (each holds an `Arc` of this shard).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        entry.end.store(0, Ordering::Release);
    }
}

/// A column chunk's bytes inside a mapped shard.
struct MapChunk {
    shard: Arc<MappedShard>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MapChunk {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `start <= end <= len` (checked in `chunk`), inside the
        // live read-only mapping this chunk holds an `Arc` of. (A page past
        // a truncated file's end reads as zeros: see the module's notes.)
        unsafe {
            std::slice::from_raw_parts(
                self.shard.ptr.as_ptr().add(self.start),
                self.end - self.start,
            )
        }
    }
}

impl Drop for MapChunk {
    fn drop(&mut self) {
        // The pages wholly inside the chunk leave the process (the page
        // cache keeps them); a neighbour touching one maps it again.
        let page = PAGE.load(Ordering::Relaxed);
        let (from, to) = (self.start.next_multiple_of(page), self.end / page * page);
        if to > from {
            // SAFETY: a page-aligned range inside the live mapping; dropping
            // pages of a read-only file mapping loses nothing.
            unsafe {
                libc::madvise(
                    self.shard.ptr.as_ptr().add(from).cast(),
                    to - from,
                    libc::MADV_DONTNEED,
                )
            };
        }
        self.shard.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A loader's mapped shards, for checking before a batch is handed on.
#[derive(Default)]
pub(crate) struct MapSet {
    shards: Mutex<Vec<Weak<MappedShard>>>,
    /// Shards found changed as their mapping went.
    reported: Mutex<Option<(u32, Changed)>>,
}

impl MapSet {
    /// Map `file` (shard `shard`, `len` bytes) and keep it in the set;
    /// `None` when it cannot be mapped (see [`MappedShard::map`]).
    pub(crate) fn map(
        self: &Arc<Self>,
        shard: u32,
        file: Arc<File>,
        len: u64,
    ) -> Option<Arc<MappedShard>> {
        let mapped = Arc::new(MappedShard::map(shard, file, len, self)?);
        let mut shards = self.shards.lock().expect("mapped shards");
        shards.retain(|s| s.strong_count() > 0);
        shards.push(Arc::downgrade(&mapped));
        Some(mapped)
    }

    fn report(&self, shard: u32, changed: Changed) {
        self.reported
            .lock()
            .expect("mapped shard reports")
            .get_or_insert((shard, changed));
    }

    /// Check every shard whose bytes were used since its last check: the
    /// first one that changed, with how.
    pub(crate) fn check(&self) -> Result<(), (u32, Changed)> {
        if let Some(reported) = self.reported.lock().expect("reports").clone() {
            return Err(reported);
        }
        // Called for every batch: no allocation, the lock held throughout
        // (only a new mapping, once per shard, waits for it; a shard whose
        // last reference goes here reports to `reported`, not this lock).
        let shards = self.shards.lock().expect("mapped shards");
        for s in shards.iter().filter_map(Weak::upgrade) {
            let made = s.made.load(Ordering::Acquire);
            let live = s.live.load(Ordering::Acquire);
            if live == 0 && made == s.seen.load(Ordering::Acquire) {
                continue;
            }
            s.check().map_err(|changed| (s.shard, changed))?;
            if live == 0 {
                s.seen.store(made, Ordering::Release);
            }
        }
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    use super::*;

    fn file_of(bytes: &[u8], name: &str) -> (std::path::PathBuf, Arc<File>) {
        let path = std::env::temp_dir().join(format!(
            "shardfeed-mapfile-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let mut f = File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        drop(f);
        // Times well in the past, so that a write now changes them whatever
        // the clock's granularity.
        let old = libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        };
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid path and two valid timespecs.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [old, old].as_ptr(), 0) },
            0
        );
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        (path, Arc::new(file))
    }

    /// Its bytes, path and open file, the set, the mapped shard.
    type Mapped = (
        Vec<u8>,
        std::path::PathBuf,
        Arc<File>,
        Arc<MapSet>,
        Arc<MappedShard>,
    );
    /// A file of `len` bytes (named after `name`), mapped as shard `id` of a
    /// new set.
    fn mapped(len: usize, name: &str, id: u32) -> Mapped {
        let bytes = data(len);
        let (path, file) = file_of(&bytes, name);
        let set = Arc::new(MapSet::default());
        let shard = set.map(id, file.clone(), len as u64).expect("mapped");
        (bytes, path, file, set, shard)
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect()
    }

    /// Chunks are the file's bytes with their checksums, whatever their
    /// alignment; a range outside the file is refused; an untouched set
    /// checks clean, and dropping every chunk leaves nothing to check.
    #[test]
    fn chunks_are_the_files_bytes() {
        let (bytes, path, _, set, shard) = mapped(3 << 20, "bytes", 7);
        for range in [0..1, 5..70_000, 4096..8192, 1_000_001..3_145_728] {
            let (got, sum) = shard.chunk(range.clone(), Some(ChunkHash::Xxh3)).unwrap();
            let want = &bytes[range.start as usize..range.end as usize];
            assert_eq!(&got[..], want);
            assert_eq!(sum, Some(ChunkHash::Xxh3.of(want)));
            drop(got);
            // Dropped pages come back from the page cache intact.
            let (again, _) = shard.chunk(range.clone(), None).unwrap();
            assert_eq!(&again[..], want);
        }
        assert!(shard.chunk(10..3_145_729, None).is_err());
        assert_eq!(set.check(), Ok(()));
        assert_eq!(shard.live.load(Ordering::Relaxed), 0);
        std::fs::remove_file(path).unwrap();
    }

    /// A file truncated under a live chunk: reading past its new end gives
    /// zeros instead of SIGBUS, and the chunk's shard and the set's check
    /// say it was truncated; a new chunk of it is refused.
    #[test]
    fn a_chunks_addresses_are_known_as_mapped_and_the_heaps_are_not() {
        let (_, path, _, set, shard) = mapped(1 << 20, "overlaps", 5);
        let (chunk, _) = shard.chunk(4096..70_000, None).unwrap();
        let at = chunk.as_ptr() as usize;
        assert!(overlaps_mapping(at..at + 1));
        assert!(overlaps_mapping(at + chunk.len() - 1..at + chunk.len()));
        let heap = vec![1u8; 1 << 16];
        let h = heap.as_ptr() as usize;
        assert!(!overlaps_mapping(h..h + heap.len()));
        drop((chunk, shard, set));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_signal() {
        let (bytes, path, file, set, shard) = mapped(1 << 20, "truncated", 3);
        let (chunk, _) = shard.chunk(0..(1 << 20), None).unwrap();
        file.set_len(4096).unwrap();
        // Past the new end: zeros, where the file had other bytes.
        let tail = &chunk[(1 << 20) - 8192..];
        assert!(tail.iter().all(|&b| b == 0));
        assert_ne!(&bytes[(1 << 20) - 8192..], tail);
        assert_eq!(shard.check(), Err(Changed::Truncated));
        assert_eq!(set.check(), Err((3, Changed::Truncated)));
        assert_eq!(
            shard.chunk(0..100, Some(ChunkHash::Xxh3)).err(),
            Some(Changed::Truncated)
        );
        drop(chunk);
        std::fs::remove_file(path).unwrap();
    }

    /// A file rewritten in place (same size) after a chunk was used is
    /// found by the next check, even once the chunk and the shard are gone.
    #[test]
    fn a_file_rewritten_in_place_is_found() {
        let (bytes, path, file, set, shard) = mapped(1 << 16, "rewritten", 9);
        let (chunk, _) = shard.chunk(0..100, None).unwrap();
        assert_eq!(set.check(), Ok(()));
        file.write_at(b"changed", 10).unwrap();
        drop(chunk);
        drop(shard);
        assert_eq!(
            set.check(),
            Err((9, Changed::Rewritten(bytes.len() as u64)))
        );
        std::fs::remove_file(path).unwrap();
    }

    /// The handler takes only faults in the loader's own mappings: a fault
    /// in another mapping of a truncated file still ends the process with
    /// SIGBUS, as it did before the handler (checked in a child process).
    #[test]
    fn a_fault_elsewhere_still_ends_the_process() {
        use std::os::unix::process::ExitStatusExt;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "mapfile::tests::fault_outside_the_loaders_mappings",
                "--nocapture",
            ])
            .env("SHARDFEED_FAULT_CHILD", "1")
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{out:?}");
        // The child got as far as the fault.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("touching the page"), "{stdout}");
    }

    /// Run by [`a_fault_elsewhere_still_ends_the_process`] in a child.
    #[test]
    #[ignore = "run in a child process by a_fault_elsewhere_still_ends_the_process"]
    fn fault_outside_the_loaders_mappings() {
        use std::os::fd::AsRawFd;
        if std::env::var_os("SHARDFEED_FAULT_CHILD").is_none() {
            return;
        }
        // No core file from the expected death.
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid rlimit for this process.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        // The handler is installed (a loader mapping exists) ...
        let (_, path, _, _set, _shard) = mapped(1 << 16, "child-loader", 1);
        // ... and another mapping of a file, not the loader's, truncated.
        let (other, file) = file_of(&data(1 << 16), "child-other");
        // SAFETY: a new read-only shared mapping of an open file; checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                1 << 16,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        file.set_len(0).unwrap();
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(other);
        println!("touching the page");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // SAFETY: a page of the live mapping above, past the file's new
        // end: the read faults, which is the point.
        let byte = unsafe { std::ptr::read_volatile(ptr.cast::<u8>().add(8192)) };
        panic!("read {byte} past a truncated file's end without a signal");
    }
}
