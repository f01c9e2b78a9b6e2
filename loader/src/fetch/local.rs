//! Reads of local files (a local dataset's shards, or a remote one's cached
//! copies): read threads of their own fed by a queue, pooled read buffers
//! (mapped for large ones), and reads in pieces checksummed as they arrive.

use std::fs::File;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use shardfeed_format::{ChunkHash, ChunkSum};

use crate::mapped::MAPPED_FROM;

/// How local files are read.
pub(crate) struct LocalReads {
    /// Bytes the read buffers (in use and idle) may hold before one handed
    /// back is unmapped rather than kept for reuse.
    pub buffer_bytes: usize,
    /// Threads the reads run on.
    pub threads: usize,
    /// Column chunks read through a mapping of the file ([`crate::mapfile`])
    /// rather than copied out with `pread`.
    pub mapped: bool,
}

/// A read for a [`Readers`] thread.
type ReadJob = Box<dyn FnOnce() + Send>;

/// Threads of their own for reads of local files (copies out of the page
/// cache, and their checksums), fed by a queue: a thread that finishes a
/// read takes the next one queued at once. On the runtime's blocking pool
/// each read was handed to a thread and its result back (two wake-ups, and
/// on a virtual machine whose idle cores halt, each can take a fraction of
/// a millisecond): with reads queued ahead of fewer threads, images +13-24%
/// rows/s on 2 cores, tokens and tabular level (docs/performance-notes.md).
pub(super) struct Readers {
    queue: crossbeam_channel::Sender<ReadJob>,
}

impl Readers {
    /// Start `threads` threads; they end when the queue is dropped.
    pub(super) fn start(threads: usize) -> std::io::Result<Self> {
        let (queue, jobs) = crossbeam_channel::unbounded::<ReadJob>();
        for _ in 0..threads.max(1) {
            let jobs = jobs.clone();
            std::thread::Builder::new()
                .name("shardfeed-read".into())
                .spawn(move || {
                    for job in jobs {
                        // A panicking read drops its reply (an error for the
                        // fetch that asked); the thread goes on.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })?;
        }
        Ok(Readers { queue })
    }

    /// Run `read` on a reader thread; `None` when it panicked.
    pub(super) async fn run<R: Send + 'static>(
        &self,
        read: impl FnOnce() -> R + Send + 'static,
    ) -> Option<R> {
        let (reply, result) = tokio::sync::oneshot::channel();
        self.queue
            .send(Box::new(move || {
                let _ = reply.send(read());
            }))
            .ok()?;
        result.await.ok()
    }
}

/// Buffers smaller than this come from the allocator's own small pages.
const MIN_POOLED: usize = 64 << 10;

/// A read buffer: its first `len` bytes are initialised. Buffers of
/// [`MAPPED_FROM`] bytes or more are mapped for each one alone
/// ([`crate::mapped`]), not the allocator's: column chunks of every size come and go
/// all the time, and mimalloc (which never hands freed memory back, so
/// that it is reused instead of faulted in again) kept ~180 MiB more than
/// the live buffers on an image dataset, whose first epoch pays for every
/// page. A mapped buffer is reused through [`BufferPool`] or unmapped.
pub(super) enum ReadBuf {
    Heap(Vec<u8>),
    Mapped {
        ptr: std::ptr::NonNull<u8>,
        cap: usize,
        len: usize,
        /// Bytes claimed for reads so far (the most at once): the pages
        /// past them were never written and hold no memory.
        claimed: usize,
    },
}

// SAFETY: a mapped buffer is owned memory like a `Vec<u8>`'s: only its
// owner writes it (through `&mut self`), readers share `&self`.
unsafe impl Send for ReadBuf {}
// SAFETY: as above; `&ReadBuf` only reads.
unsafe impl Sync for ReadBuf {}

impl ReadBuf {
    /// An empty buffer with room for at least `cap` bytes.
    fn with_capacity(cap: usize) -> std::io::Result<Self> {
        if cap < MAPPED_FROM {
            return Ok(ReadBuf::Heap(Vec::with_capacity(cap)));
        }
        let (ptr, cap) = crate::mapped::map(cap)?;
        Ok(ReadBuf::Mapped {
            ptr,
            cap,
            len: 0,
            claimed: 0,
        })
    }

    fn capacity(&self) -> usize {
        match self {
            ReadBuf::Heap(v) => v.capacity(),
            ReadBuf::Mapped { cap, .. } => *cap,
        }
    }

    /// The memory the buffer holds: a heap buffer's capacity, a mapped
    /// one's bytes claimed so far.
    fn resident(&self) -> usize {
        match self {
            ReadBuf::Heap(v) => v.capacity(),
            ReadBuf::Mapped { claimed, .. } => *claimed,
        }
    }

    /// Claim the first `len` bytes (at most `capacity()`) for a read: the
    /// bytes by which that grows [`ReadBuf::resident`].
    fn claim(&mut self, len: usize) -> usize {
        match self {
            ReadBuf::Heap(_) => 0,
            ReadBuf::Mapped { claimed, .. } => {
                let grown = len.saturating_sub(*claimed);
                *claimed += grown;
                grown
            }
        }
    }

    /// The start of the buffer, for writing up to `capacity()` bytes.
    fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            ReadBuf::Heap(v) => v.as_mut_ptr(),
            ReadBuf::Mapped { ptr, .. } => ptr.as_ptr(),
        }
    }

    /// Mark the first `len` bytes initialised.
    ///
    /// # Safety
    /// `len <= capacity()`, and the first `len` bytes were written.
    unsafe fn set_len(&mut self, new: usize) {
        match self {
            // SAFETY: the caller's promise.
            ReadBuf::Heap(v) => unsafe { v.set_len(new) },
            ReadBuf::Mapped { len, .. } => *len = new,
        }
    }

    fn clear(&mut self) {
        // SAFETY: no bytes are claimed initialised.
        unsafe { self.set_len(0) }
    }
}

impl AsRef<[u8]> for ReadBuf {
    fn as_ref(&self) -> &[u8] {
        match self {
            ReadBuf::Heap(v) => v,
            // SAFETY: `len <= cap` bytes of the live mapping at `ptr` were
            // written (`set_len`'s contract); nothing writes them while
            // `&self` lives.
            ReadBuf::Mapped { ptr, len, .. } => unsafe {
                std::slice::from_raw_parts(ptr.as_ptr(), *len)
            },
        }
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        if let ReadBuf::Mapped { ptr, cap, .. } = self {
            // SAFETY: the mapping made in `with_capacity`, unmapped once,
            // here, as the buffer goes.
            unsafe { crate::mapped::unmap(*ptr, *cap) };
        }
    }
}

/// Read buffers recycled between row groups: a buffer freshly allocated
/// for every chunk is fresh memory the kernel must zero on first touch
/// (two thirds of the time on image datasets), where a recycled one is
/// already mapped.
///
/// A buffer handed back is kept while the pool's buffers, in use and idle,
/// hold at most `limit` bytes ([`ReadBuf::resident`]), else unmapped. The
/// reads in flight are bounded by the byte budget, so with the budget as
/// `limit` every buffer the pipeline goes on needing is kept, and the
/// buffers never hold much more than the budget. (A limit on the idle
/// buffers alone, a quarter of the budget counted by capacity, unmapped
/// and mapped again a window's buffers at a time when the budget was
/// lowered: images at a 128 MiB budget read 40% slower, faulting in 77 K
/// fresh pages an epoch; docs/performance-notes.md.)
pub(crate) struct BufferPool {
    free: Mutex<Vec<ReadBuf>>,
    /// Bytes held by the pool's buffers, in use and idle.
    resident: std::sync::atomic::AtomicUsize,
    limit: usize,
    /// Buffers made so far (not counting those reused).
    made: std::sync::atomic::AtomicU64,
}

impl BufferPool {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(BufferPool {
            free: Mutex::new(Vec::new()),
            resident: std::sync::atomic::AtomicUsize::new(0),
            limit,
            made: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Buffers made so far, and the bytes the pool's buffers hold now.
    pub(crate) fn usage(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.made.load(Ordering::Relaxed),
            self.resident.load(Ordering::Relaxed) as u64,
        )
    }

    /// An empty buffer with room for `len` bytes: the smallest idle one
    /// that fits and is at most twice as large (a small read never ties up
    /// a large buffer), else a new one.
    fn take(&self, len: usize) -> std::io::Result<ReadBuf> {
        use std::sync::atomic::Ordering;
        if len < MIN_POOLED {
            return ReadBuf::with_capacity(len);
        }
        let mut free = self.free.lock().expect("buffer pool");
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let mut buf = match best {
            Some(i) => free.swap_remove(i),
            None => {
                drop(free);
                let buf = ReadBuf::with_capacity(len)?;
                self.resident.fetch_add(buf.resident(), Ordering::Relaxed);
                self.made.fetch_add(1, Ordering::Relaxed);
                buf
            }
        };
        self.resident.fetch_add(buf.claim(len), Ordering::Relaxed);
        Ok(buf)
    }

    /// Keep `buf` (taken from this pool) for reuse, unless the pool's
    /// buffers hold more than its limit: then it goes.
    fn give(&self, mut buf: ReadBuf) {
        use std::sync::atomic::Ordering;
        if buf.capacity() < MIN_POOLED {
            return;
        }
        if self.resident.load(Ordering::Relaxed) > self.limit {
            self.resident.fetch_sub(buf.resident(), Ordering::Relaxed);
            return;
        }
        buf.clear();
        self.free.lock().expect("buffer pool").push(buf);
    }
}

/// A pooled buffer's bytes; back to the pool when the last reference goes.
struct Pooled {
    buf: Option<ReadBuf>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_ref())
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give(buf);
        }
    }
}

/// Bytes read at a time: the piece just read is still in the cache when
/// its checksum is computed, instead of a second pass over cold memory.
const READ_PIECE: usize = 256 << 10;

/// `ranges` of `file` (whose manifest size is `len`), each into its own
/// buffer from `pool`, with its checksum by `hash` when given.
pub(super) fn read_at(
    file: &File,
    ranges: &[std::ops::Range<u64>],
    len: u64,
    pool: &Arc<BufferPool>,
    hash: Option<ChunkHash>,
) -> std::io::Result<Vec<(Bytes, Option<ChunkSum>)>> {
    use std::os::fd::AsRawFd;
    ranges
        .iter()
        .map(|r| {
            if r.end > len || r.start > r.end {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "range outside the file",
                ));
            }
            let n = (r.end - r.start) as usize;
            // Back to the pool on every path, a failed read's too (the
            // pool counts the bytes its buffers hold).
            let mut pooled = Pooled {
                buf: Some(pool.take(n)?),
                pool: pool.clone(),
            };
            let buf = pooled.buf.as_mut().expect("a buffer just taken");
            let start = buf.as_mut_ptr();
            let mut hasher = hash.map(ChunkHash::hasher);
            let mut done = 0usize;
            while done < n {
                let want = (n - done).min(READ_PIECE);
                // SAFETY: the buffer holds at least `n` bytes (`take` gave an
                // empty buffer of capacity >= n); pread writes at most
                // `want <= n - done` bytes at `start + done`, inside it, and
                // reads none; the descriptor stays open while `file` lives.
                let got = unsafe {
                    libc::pread(
                        file.as_raw_fd(),
                        start.add(done) as *mut libc::c_void,
                        want,
                        (r.start + done as u64) as libc::off_t,
                    )
                };
                match got {
                    0 => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the file ended early",
                        ));
                    }
                    g if g < 0 => {
                        let e = std::io::Error::last_os_error();
                        if e.kind() != std::io::ErrorKind::Interrupted {
                            return Err(e);
                        }
                    }
                    g => {
                        let g = g as usize;
                        // SAFETY: pread initialised the `g` bytes at `start + done`.
                        let piece = unsafe { std::slice::from_raw_parts(start.add(done), g) };
                        if let Some(hasher) = hasher.as_mut() {
                            hasher.update(piece);
                        }
                        done += g;
                    }
                }
            }
            // SAFETY: pread initialised all `n` bytes above.
            unsafe { buf.set_len(n) };
            Ok((Bytes::from_owner(pooled), hasher.map(|h| h.finish())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    /// Reads of every size come back byte for byte with their checksums;
    /// a large one's mapped buffer goes back to the pool and serves the next
    /// read of a similar size; a pool that is full unmaps it; a file shorter
    /// than its manifest says is an error, not a short buffer.
    #[test]
    #[allow(clippy::single_range_in_vec_init)] // one range per read, on purpose
    fn reads_come_back_exact_and_large_buffers_are_reused() {
        let path = std::env::temp_dir().join(format!(
            "shardfeed-read-at-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let data: Vec<u8> = (0..5_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let len = data.len() as u64;
        let pool = BufferPool::new(16 << 20);
        let ranges = vec![100..4_500_000u64, 4_500_000..4_600_000, 7..8, 9..9];
        let parts = read_at(&file, &ranges, len, &pool, Some(ChunkHash::Xxh3)).unwrap();
        for (r, (bytes, sum)) in ranges.iter().zip(&parts) {
            let want = &data[r.start as usize..r.end as usize];
            assert_eq!(&bytes[..], want);
            assert_eq!(*sum, Some(ChunkHash::Xxh3.of(want)));
        }
        let large = parts[0].0.as_ptr();
        // The pool holds what its buffers hold: 4.5 MB written into a mapped
        // 6 MiB (the rest untouched), and the 100 kB heap buffer.
        let held = 4_499_900 + 100_000;
        assert_eq!(pool.resident.load(Relaxed), held);
        drop(parts);
        assert_eq!(pool.resident.load(Relaxed), held, "both kept");
        let again = read_at(&file, &[1_000_000..4_500_000], len, &pool, None).unwrap();
        assert_eq!(again[0].1, None, "no checksum asked for");
        assert_eq!(again[0].0.as_ptr(), large, "the mapped buffer reused");
        assert_eq!(&again[0].0[..], &data[1_000_000..4_500_000]);
        assert_eq!(pool.resident.load(Relaxed), held, "no new memory");
        drop(again);

        let small = BufferPool::new(1 << 20);
        drop(read_at(&file, &[0..3_000_000], len, &small, Some(ChunkHash::Crc32)).unwrap());
        assert_eq!(small.resident.load(Relaxed), 0, "a full pool keeps nothing");
        assert!(small.free.lock().unwrap().is_empty());

        let short = read_at(&file, &[len - 5..len + 5], len + 10, &pool, None);
        assert_eq!(
            short.err().map(|e| e.kind()),
            Some(std::io::ErrorKind::UnexpectedEof)
        );
        std::fs::remove_file(&path).unwrap();
    }

    /// Buffers in use count against the pool's limit with those idle:
    /// all are served, and of those handed back the pool keeps what fits
    /// under its limit (and the next reads reuse them), unmapping the rest.
    #[test]
    fn the_pool_keeps_buffers_while_all_of_them_fit_its_limit() {
        let pool = BufferPool::new(8 << 20);
        let mut taken: Vec<ReadBuf> = (0..4).map(|_| pool.take(2_500_000).unwrap()).collect();
        assert_eq!(pool.resident.load(Relaxed), 10_000_000, "all four served");
        let addresses: Vec<usize> = taken.iter_mut().map(|b| b.as_mut_ptr() as usize).collect();
        for buf in taken {
            pool.give(buf);
        }
        // The first back found 10 MB held (over 8 MiB) and went; the rest fit.
        assert_eq!(pool.resident.load(Relaxed), 7_500_000);
        assert_eq!(pool.free.lock().unwrap().len(), 3);
        let mut again: Vec<ReadBuf> = (0..3).map(|_| pool.take(2_200_000).unwrap()).collect();
        for buf in &mut again {
            assert!(
                addresses[1..].contains(&(buf.as_mut_ptr() as usize)),
                "reused"
            );
        }
        assert_eq!(pool.resident.load(Relaxed), 7_500_000, "no new memory");
        for buf in again {
            pool.give(buf);
        }
        assert_eq!(pool.free.lock().unwrap().len(), 3);
    }

    /// Reads queued to the read threads run there, more of them than
    /// threads, each once; one that panics is `None` for its caller and the
    /// thread goes on to the next.
    #[test]
    fn read_threads_take_queued_reads_and_survive_a_panic() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let readers = Readers::start(2).unwrap();
        runtime.block_on(async {
            let names = futures::future::join_all((0..8).map(|i| {
                readers.run(move || (i, std::thread::current().name().map(str::to_owned)))
            }))
            .await;
            for (i, got) in names.into_iter().enumerate() {
                assert_eq!(got, Some((i, Some("shardfeed-read".to_owned()))));
            }
            // One thread: the one that panicked runs the reads after it.
            let one = Readers::start(1).unwrap();
            let panicked = one.run(|| -> u8 { panic!("a damaged read") }).await;
            assert_eq!(panicked, None);
            let after = futures::future::join_all((0..4).map(|i| one.run(move || i))).await;
            assert_eq!(after, (0..4).map(Some).collect::<Vec<_>>());
        });
    }
}
