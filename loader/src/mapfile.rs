//! Local shards read through a read-only mapping of the file, so that the
//! bytes a batch is made of are copied once (page cache -> slab) instead of
//! twice (page cache -> read buffer -> slab, `pread`'s way): on image rows
//! the kernel's copy was 44% of the loader's CPU (docs/performance-notes.md).
//!
//! A mapping gives up two things `pread` into a private buffer guaranteed,
//! and each is taken back here:
//! - **A file truncated while it is mapped** (`cp` or `rsync --inplace`
//!   over a live dataset) raises `SIGBUS` on the next touch of a page past
//!   its new end, which would kill the process. The handler of
//!   `shardfeed_format::mapping`, installed once and chaining to whatever
//!   handler was there before, looks the address up among the registered
//!   mappings: when it lies in one, it maps a zero page over the faulting
//!   page and marks the mapping, and the read goes on with zeros. The mark
//!   fails the chunk being read (checked after its checksum) and the batch
//!   being made (checked before it is handed on), with an error naming the
//!   shard. A fault anywhere else goes to the previous handler (Rust's
//!   stack overflow report, Python's `faulthandler`), or kills the process
//!   as it would have.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use shardfeed_format::mapping::{FileChange, MappedFile};
use shardfeed_format::{ChunkHash, ChunkSum};

pub(crate) use shardfeed_format::mapping::overlaps_mapping;

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

/// A whole shard mapped read-only, registered with the `SIGBUS` handler.
pub(crate) struct MappedShard {
    /// The shard's index in the manifest.
    pub shard: u32,
    map: MappedFile,
    file: Arc<File>,
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

impl MappedShard {
    /// Map the first `len` bytes of `file` (the manifest's size, checked
    /// against the file by the caller). `None` when mappings cannot be used:
    /// no handler, no free slot, an empty file, or `mmap` refused.
    fn map(shard: u32, file: Arc<File>, len: u64, set: &Arc<MapSet>) -> Option<Self> {
        let map = MappedFile::map(&file, len)?;
        Some(MappedShard {
            shard,
            map,
            file,
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
            (Ok(s), Ok(e)) if s <= e && e <= self.map.len() => (s, e),
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
        self.map.faulted()
    }

    /// Whether the file is still what was mapped.
    pub(crate) fn check(&self) -> Result<(), Changed> {
        match self.map.changed(&self.file) {
            None => Ok(()),
            Some(FileChange::Truncated) => Err(Changed::Truncated),
            Some(FileChange::Rewritten(len)) => Err(Changed::Rewritten(len)),
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
        // The mapping goes with `map` (no chunk references it: each holds
        // an `Arc` of this shard).
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
        // `start <= end <= len`, checked in `chunk`. (A page past a
        // truncated file's end reads as zeros: see the module's notes.)
        self.shard.map.get(self.start..self.end).unwrap_or_default()
    }
}

impl Drop for MapChunk {
    fn drop(&mut self) {
        // The pages wholly inside the chunk leave the process (the page
        // cache keeps them); a neighbour touching one maps it again.
        self.shard.map.drop_pages(self.start..self.end);
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
