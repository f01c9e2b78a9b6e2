//! Fetching on the loader's tokio runtime: footers (sized by the manifest,
//! one bounded range each) and the projected column chunks of each row
//! group. Only I/O happens here; checks and decoding run on the decode
//! threads.
//!
//! Local shards (and cached copies of remote ones) are read on read threads
//! of their own: with `pread` into pooled buffers, except the byte-array and
//! list column chunks of a local dataset (images, texts, token ids), read
//! through a mapping of the shard ([`crate::mapfile`]: one copy fewer, with
//! a shard truncated or rewritten while it is read still an error naming
//! it, not SIGBUS).

pub(crate) mod stage;

/// What the decode and collate stages need of the fetch context: whether
/// the mapped shards whose bytes they used are still the files that were
/// mapped (a file rewritten under its mapping is an error naming it).
#[derive(Clone)]
pub(crate) struct MappedCheck(Arc<FetchContext>);

impl MappedCheck {
    /// See [`FetchContext::check_mapped`].
    pub(crate) fn check(&self) -> Result<()> {
        self.0.check_mapped()
    }
}

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::RowGroupMetaData;
use shardfeed_format::{ChunkHash, ChunkSum, Location, Manifest, RetryPolicy};

use crate::cache::ShardCache;
use crate::error::{LoaderError, Result};
use crate::mapfile::{Changed, MapSet, MappedShard};
use crate::mapped::MAPPED_FROM;
use crate::parquet::projection;
use crate::plan::Segment;
use crate::shard::{check_schema, decode_footer};
use crate::stage::{Fetched, FooterInfo};
use crate::stats::Counters;

/// Footers (and open files) kept at once.
const FOOTER_CACHE: usize = 256;

/// Values by shard, and their insertion order for eviction.
type Cache<T> = (HashMap<u32, T>, VecDeque<u32>);

/// The largest piece of a shard a download into the cache asks for (and
/// holds) at once.
const CACHE_PIECE_BYTES: u64 = 8 << 20;

fn cache_get<T: Clone>(cache: &Mutex<Cache<T>>, shard: u32) -> Option<T> {
    cache.lock().expect("cache lock").0.get(&shard).cloned()
}

fn cache_put<T>(cache: &Mutex<Cache<T>>, shard: u32, value: T) {
    let mut cache = cache.lock().expect("cache lock");
    if cache.0.insert(shard, value).is_none() {
        cache.1.push_back(shard);
        if cache.1.len() > FOOTER_CACHE
            && let Some(old) = cache.1.pop_front()
        {
            cache.0.remove(&old);
        }
    }
}

/// What the fetch stage needs, shared by its concurrent requests.
pub(crate) struct FetchContext {
    pub location: Location,
    pub manifest: Arc<Manifest>,
    /// Top-level columns to read.
    pub roots: Vec<usize>,
    pub counters: Arc<Counters>,
    retry: RetryPolicy,
    footers: Mutex<Cache<Arc<FooterInfo>>>,
    /// Open local files: a local dataset's shards, or cached copies.
    files: Mutex<Cache<Arc<File>>>,
    /// A local copy of remote shards, when configured.
    cache: Option<ShardCache>,
    /// One download per shard per process.
    downloads: Mutex<HashMap<u32, Arc<tokio::sync::OnceCell<Arc<File>>>>>,
    /// Buffers local reads go into.
    buffers: Arc<BufferPool>,
    /// Local shards mapped for reading column chunks (`None`: read with
    /// `pread`), kept like open files.
    maps: Mutex<Cache<Option<Arc<MappedShard>>>>,
    /// Every mapped shard, checked before a batch is handed on.
    mapped: Arc<MapSet>,
    /// Whether column chunks of local files are read through mappings.
    map_reads: bool,
    /// The threads local reads run on, started at the first one.
    readers: std::sync::OnceLock<Readers>,
    /// How many: [`LocalReads::threads`].
    reader_threads: usize,
}

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
/// rows/s on 2 cores, tokens and tabular level (BENCHMARKS.md).
struct Readers {
    queue: crossbeam_channel::Sender<ReadJob>,
}

impl Readers {
    /// Start `threads` threads; they end when the queue is dropped.
    fn start(threads: usize) -> std::io::Result<Self> {
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
    async fn run<R: Send + 'static>(&self, read: impl FnOnce() -> R + Send + 'static) -> Option<R> {
        let (reply, result) = tokio::sync::oneshot::channel();
        self.queue
            .send(Box::new(move || {
                let _ = reply.send(read());
            }))
            .ok()?;
        result.await.ok()
    }
}

impl FetchContext {
    pub(crate) fn new(
        location: Location,
        manifest: Arc<Manifest>,
        roots: Vec<usize>,
        counters: Arc<Counters>,
        retry: RetryPolicy,
        cache: Option<ShardCache>,
        local: LocalReads,
    ) -> Self {
        FetchContext {
            buffers: BufferPool::new(local.buffer_bytes),
            maps: Mutex::new((HashMap::new(), VecDeque::new())),
            mapped: Arc::new(MapSet::default()),
            map_reads: local.mapped,
            readers: std::sync::OnceLock::new(),
            reader_threads: local.threads,
            cache,
            downloads: Mutex::new(HashMap::new()),
            location,
            manifest,
            roots,
            counters,
            retry,
            footers: Mutex::new((HashMap::new(), VecDeque::new())),
            files: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// Read buffers of local reads made so far, and the bytes they hold
    /// now (see [`BufferPool`]).
    pub(crate) fn read_buffers(&self) -> (u64, u64) {
        self.buffers.usage()
    }

    fn entry(&self, shard: u32) -> &shardfeed_format::ShardEntry {
        &self.manifest.shards[shard as usize]
    }

    /// The shard as an open local file: a local dataset's file, or a remote
    /// shard's copy in the cache (downloaded once per process); `None` for
    /// remote shards without a cache.
    async fn local(&self, shard: u32) -> Result<Option<Arc<File>>> {
        if let Some(file) = cache_get(&self.files, shard) {
            return Ok(Some(file));
        }
        let entry = self.entry(shard);
        let file = match self.location.local_root() {
            Some(root) => {
                let path = root.join(&entry.path);
                let file = File::open(&path).map_err(|e| self.io_error(shard, &path, e))?;
                let len = file
                    .metadata()
                    .map_err(|e| self.io_error(shard, &path, e))?
                    .len();
                if len != entry.bytes {
                    return Err(self.changed(shard, len));
                }
                Arc::new(file)
            }
            None => {
                let Some(cache) = &self.cache else {
                    return Ok(None);
                };
                let cell = self
                    .downloads
                    .lock()
                    .expect("download cells")
                    .entry(shard)
                    .or_default()
                    .clone();
                cell.get_or_try_init(|| self.cached(shard, cache))
                    .await?
                    .clone()
            }
        };
        cache_put(&self.files, shard, file.clone());
        Ok(Some(file))
    }

    /// `shard`'s mapping, made at its first chunk read; `None` when mapped
    /// reads are off, for cached copies of remote shards (the cache marks
    /// a copy used by its modification time, which another process may
    /// move at any time), or when it cannot be mapped: then `pread`.
    fn mapping(&self, shard: u32, file: &Arc<File>) -> Option<Arc<MappedShard>> {
        if !self.map_reads || self.location.local_root().is_none() {
            return None;
        }
        if let Some(mapped) = cache_get(&self.maps, shard) {
            return mapped;
        }
        let mapped = self
            .mapped
            .map(shard, file.clone(), self.entry(shard).bytes);
        cache_put(&self.maps, shard, mapped.clone());
        mapped
    }

    /// The handle the decode and collate stages check mapped shards with.
    pub(crate) fn mapped_check(self: &Arc<Self>) -> MappedCheck {
        MappedCheck(self.clone())
    }

    /// Whether every mapped shard whose bytes were used since it was last
    /// checked is still the file that was mapped: called before a batch
    /// made of those bytes is handed on ([`crate::mapfile`]).
    pub(crate) fn check_mapped(&self) -> Result<()> {
        self.mapped
            .check()
            .map_err(|(shard, changed)| self.read_error(shard, changed))
    }

    /// The error for a local read that failed: a short read or a fault
    /// past the file's end (its size changed), a mapped file found changed,
    /// or an I/O error.
    fn read_error(&self, shard: u32, changed: Changed) -> LoaderError {
        let entry = self.entry(shard);
        let len = match changed {
            Changed::Rewritten(len) => len,
            Changed::Failed(kind, e) => {
                return LoaderError::Io {
                    op: format!("read {}", self.location.url_of(&entry.path)),
                    source: std::io::Error::new(kind, e),
                };
            }
            Changed::Truncated => self
                .location
                .local_root()
                .and_then(|root| std::fs::metadata(root.join(&entry.path)).ok())
                .map_or(0, |m| m.len()),
        };
        if len != entry.bytes {
            return self.changed(shard, len);
        }
        LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: None,
            detail: "the file was written while it was read (rewritten in place, truncated or replaced: a dataset must not change while it is read)".into(),
        }
    }

    /// The error for a shard whose file no longer has its manifest size.
    fn changed(&self, shard: u32, len: u64) -> LoaderError {
        let entry = self.entry(shard);
        LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: None,
            detail: format!(
                "the file is {len} bytes, the manifest says {}: it was truncated or replaced (a dataset must not change while it is read)",
                entry.bytes
            ),
        }
    }

    fn io_error(&self, shard: u32, path: &std::path::Path, e: std::io::Error) -> LoaderError {
        let source = if e.kind() == std::io::ErrorKind::NotFound {
            object_store::Error::NotFound {
                path: path.display().to_string(),
                source: Box::new(e),
            }
        } else {
            object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            }
        };
        self.store_error(shard, source)
    }

    /// `shard` from the cache, downloaded first unless it is there and intact.
    async fn cached(&self, shard: u32, cache: &ShardCache) -> Result<Arc<File>> {
        let entry = self.entry(shard).clone();
        if let Some(file) = cache.open(&entry) {
            // Checksumming a whole shard is CPU work: off the async workers.
            let file = Arc::new(file);
            let (copy, expected, len) = (file.clone(), entry.crc32, entry.bytes);
            let intact = tokio::task::spawn_blocking(move || {
                crc_of_file(&copy, len).is_ok_and(|crc| crc == expected)
            })
            .await
            .unwrap_or(false);
            if intact {
                return Ok(file);
            }
            // A damaged copy: replace it.
            let _ = std::fs::remove_file(cache.path(&entry));
        }
        self.download(shard, cache).await.map(Arc::new)
    }

    /// Put `shard` in the cache: ranged GETs of at most
    /// [`CACHE_PIECE_BYTES`] within the manifest's size, each written to
    /// disk before the next is asked for (the memory a download holds is one
    /// piece, whatever the object's size). Returns the open file.
    async fn download(&self, shard: u32, cache: &ShardCache) -> Result<File> {
        let entry = self.entry(shard).clone();
        let path = self.location.child(&entry.path);
        let store = self.location.store();
        let cache_error = |reason: String| LoaderError::Io {
            op: reason,
            source: std::io::Error::other("cache"),
        };
        let joined = |e: tokio::task::JoinError| LoaderError::Io {
            op: "write the cache".into(),
            source: std::io::Error::other(e.to_string()),
        };
        let mut pending = cache.begin(&entry).map_err(cache_error)?;
        let mut at = 0u64;
        while at < entry.bytes {
            let range = at..entry.bytes.min(at.saturating_add(CACHE_PIECE_BYTES));
            let started = Instant::now();
            let bytes = self
                .retry
                .run(
                    || store.get_range(&path, range.clone()),
                    || Counters::add(&self.counters.retries, 1),
                )
                .await
                .map_err(|e| self.store_error(shard, e))?;
            Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
            Counters::add(&self.counters.requests, 1);
            if bytes.len() as u64 != range.end - range.start {
                return Err(cache_error(format!(
                    "downloaded shard {} is shorter than the manifest's {} bytes",
                    entry.path, entry.bytes
                )));
            }
            at = range.end;
            pending = tokio::task::spawn_blocking(move || pending.write(&bytes).map(|()| pending))
                .await
                .map_err(joined)?
                .map_err(cache_error)?;
        }
        tokio::task::spawn_blocking(move || pending.finish())
            .await
            .map_err(joined)?
            .map_err(cache_error)
    }

    /// Read `ranges` of `shard`: from the local file (with each range's
    /// checksum by `hash`, when given, computed as it is read), or coalesced
    /// range requests to the store (checksummed by the decoder). Local
    /// ranges marked in `mappable` are read through the shard's mapping when
    /// mapped reads are on, the others with `pread`.
    async fn read_ranges(
        &self,
        shard: u32,
        ranges: Vec<std::ops::Range<u64>>,
        hash: Option<ChunkHash>,
        mappable: Vec<bool>,
    ) -> Result<Vec<(Bytes, Option<ChunkSum>)>> {
        let started = Instant::now();
        let parts: Vec<(Bytes, Option<ChunkSum>)> = match self.local(shard).await? {
            Some(file) => {
                let len = self.entry(shard).bytes;
                let pool = self.buffers.clone();
                // Started at the first local read (a remote dataset without
                // a cache never starts them). Two first reads at once may
                // both start threads: the set not kept ends with its queue.
                let readers = match self.readers.get() {
                    Some(r) => r,
                    None => {
                        let started = Readers::start(self.reader_threads).map_err(|source| {
                            LoaderError::Io {
                                op: "start the read threads".into(),
                                source,
                            }
                        })?;
                        self.readers.get_or_init(|| started)
                    }
                };
                let mapped = match mappable.contains(&true) {
                    true => self.mapping(shard, &file),
                    false => None,
                };
                // The job holds nothing of the loader's but the file, its
                // mapping and the buffer pool: a read still running when the
                // loader goes must not keep its counters (and trace) alive.
                let read = readers
                    .run(move || {
                        let mut mapped_bytes = 0u64;
                        ranges
                            .into_iter()
                            .zip(mappable)
                            .map(|(r, map)| match (&mapped, map) {
                                (Some(mapped), true) => {
                                    let read = mapped.chunk(r, hash)?;
                                    mapped_bytes += read.0.len() as u64;
                                    Ok(read)
                                }
                                _ => read_at(&file, &[r], len, &pool, hash)
                                    .map(|mut read| read.remove(0))
                                    .map_err(Changed::from),
                            })
                            .collect::<std::result::Result<Vec<_>, Changed>>()
                            .map(|parts| (parts, mapped_bytes))
                    })
                    .await
                    .ok_or_else(|| LoaderError::Io {
                        op: format!("read {}", self.location.url_of(&self.entry(shard).path)),
                        source: std::io::Error::other("the read thread panicked"),
                    })?;
                let (parts, mapped_bytes) =
                    read.map_err(|changed| self.read_error(shard, changed))?;
                Counters::add(&self.counters.mapped_bytes, mapped_bytes);
                parts
            }
            None => {
                let entry = self.entry(shard);
                let path = self.location.child(&entry.path);
                // `get_ranges` coalesces nearby ranges into fewer requests.
                let parts = self
                    .retry
                    .run(
                        || self.location.store().get_ranges(&path, &ranges),
                        || Counters::add(&self.counters.retries, 1),
                    )
                    .await
                    .map_err(|e| self.store_error(shard, e))?;
                Counters::add(&self.counters.requests, 1);
                parts.into_iter().map(|bytes| (bytes, None)).collect()
            }
        };
        Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
        self.counters
            .span("fetch", started, crate::trace::Args::Index(shard as u64));
        Counters::add(
            &self.counters.fetched_bytes,
            parts.iter().map(|(b, _)| b.len() as u64).sum(),
        );
        Ok(parts)
    }

    fn store_error(&self, shard: u32, source: object_store::Error) -> LoaderError {
        let url = self.location.url_of(&self.entry(shard).path);
        match source {
            object_store::Error::NotFound { .. } => LoaderError::MissingShard {
                url,
                error: source.into(),
            },
            source => LoaderError::Store {
                url,
                error: source.into(),
            },
        }
    }

    /// The checked, decoded footer of `shard` (cached): its checksum and
    /// row groups match the manifest, and its schema is the manifest's.
    pub(crate) async fn footer(&self, shard: u32) -> Result<Arc<FooterInfo>> {
        if let Some(f) = cache_get(&self.footers, shard) {
            return Ok(f);
        }
        let entry = self.entry(shard);
        // The manifest checked footer_len + 4 <= bytes.
        let range = entry.bytes - entry.footer_len..entry.bytes;
        let bytes = self
            .read_ranges(shard, vec![range], None, vec![false])
            .await?
            .pop()
            .expect("one range")
            .0;
        let entry = entry.clone();
        let manifest = self.manifest.clone();
        // Parsing is CPU work: keep it off the async workers.
        let info = tokio::task::spawn_blocking(move || -> Result<FooterInfo> {
            let footer = decode_footer(&entry, &bytes)?;
            let arrow = ArrowReaderMetadata::try_new(
                Arc::new(footer.metadata.clone()),
                ArrowReaderOptions::new(),
            )
            .map_err(|source| LoaderError::Decode {
                shard: entry.path.clone(),
                row_group: None,
                source,
            })?;
            check_schema(&entry, &manifest.schema, arrow.schema())?;
            Ok(FooterInfo { footer, arrow })
        })
        .await
        .map_err(|e| LoaderError::Io {
            op: "decode a footer".into(),
            source: std::io::Error::other(e.to_string()),
        })??;
        let info = Arc::new(info);
        cache_put(&self.footers, shard, info.clone());
        Ok(info)
    }

    /// Bytes a row group of the projected columns takes in the budget: per
    /// column chunk, the larger of its fetched (compressed) and decoded
    /// sizes ([`decoded_bytes`]). Compressed chunks are dropped once
    /// decoded; pages stored uncompressed are decoded into views of the
    /// fetched bytes themselves.
    pub(crate) fn row_group_cost(
        &self,
        arrow: &ArrowReaderMetadata,
        meta: &RowGroupMetaData,
    ) -> u64 {
        let (leaves, _) = projection(arrow, &self.roots);
        leaves
            .iter()
            .map(|&leaf| {
                let c = meta.column(leaf);
                (c.compressed_size().max(0) as u64).max(decoded_bytes(c))
            })
            .fold(0, u64::saturating_add)
    }

    /// Budget permits (KiB) `segment` takes: its row group's cost, at least
    /// one, at most `max_unit`.
    pub(crate) fn segment_cost(&self, footer: &FooterInfo, segment: Segment, max_unit: u32) -> u32 {
        let meta = footer.footer.metadata.row_group(segment.row_group as usize);
        let kib = self.row_group_cost(&footer.arrow, meta).div_ceil(1024);
        u32::try_from(kib)
            .unwrap_or(u32::MAX)
            .clamp(1, max_unit.max(1))
    }

    /// Fetch the projected column chunks of `segment`'s row group.
    pub(crate) async fn fetch(
        &self,
        seq: u64,
        segment: Segment,
        footer: Arc<FooterInfo>,
    ) -> Result<Fetched> {
        let (leaves, _) = projection(&footer.arrow, &self.roots);
        let rg = footer.footer.metadata.row_group(segment.row_group as usize);
        let entry = self.entry(segment.shard);
        let mut ranges = Vec::with_capacity(leaves.len());
        // Read through the shard's mapping: variable-length values (images,
        // texts), copied whole into the slabs straight from it, and lists
        // (token ids), decoded into buffers of their own. Not flat
        // fixed-width values: the shuffle gathers them at random from their
        // pages when those are stored uncompressed, which is faster in a
        // read buffer (its own pages, huge ones where the system allows)
        // than in the page cache's 4 KiB pages (BENCHMARKS.md).
        let mappable: Vec<bool> = leaves
            .iter()
            .map(|&leaf| {
                let column = rg.column(leaf).column_descr();
                column.physical_type() == parquet::basic::Type::BYTE_ARRAY
                    || column.max_rep_level() > 0
            })
            .collect();
        for &leaf in &leaves {
            let (start, len) = rg.column(leaf).byte_range();
            // Offsets come from the (checksummed) footer: still checked
            // against the file's size before anything is read.
            let end = start
                .checked_add(len)
                .filter(|&end| end <= entry.bytes - entry.footer_len)
                .ok_or_else(|| LoaderError::Corrupt {
                    shard: entry.path.clone(),
                    row_group: Some(segment.row_group as usize),
                    detail: format!(
                        "column chunk {leaf} at {start}+{len} lies outside the file's data"
                    ),
                })?;
            ranges.push(start..end);
        }
        let starts: Vec<u64> = ranges.iter().map(|r| r.start).collect();
        let hash = footer.footer.checksums.hash;
        let parts = self
            .read_ranges(segment.shard, ranges, Some(hash), mappable)
            .await?;
        let chunks = leaves
            .into_iter()
            .zip(starts)
            .zip(parts)
            .map(|((leaf, start), (bytes, crc))| (leaf, start, bytes, crc))
            .collect();
        Ok(Fetched {
            seq,
            segment,
            footer,
            chunks,
        })
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
enum ReadBuf {
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
/// fresh pages an epoch; BENCHMARKS.md.)
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

/// Bytes a column chunk decodes to, as far as its footer tells: its pages'
/// uncompressed size, but more where the decoders make more of them (they
/// are what the byte budget holds, so an estimate below them lets the
/// loader hold more than its budget):
/// - `DELTA_BINARY_PACKED` integers decode to plain values, several times
///   the size of their bit-packed deltas: a value's width for each value;
/// - dictionary-encoded values in lists (token ids) are looked up into
///   plain values: the same (a dictionary-encoded token list decodes to
///   about twice its pages);
/// - a flat fixed-width dictionary column stays a dictionary whose keys
///   take 2 bytes a value where the pages hold them bit-packed: 2 bytes a
///   value more than the pages (an underestimate for dictionaries of more
///   than 2^16 values, whose keys take 4: the footer does not say how many).
///
/// Byte-array values keep their pages' size. (Footer counts are untrusted:
/// saturating.)
pub(crate) fn decoded_bytes(c: &parquet::file::metadata::ColumnChunkMetaData) -> u64 {
    use parquet::basic::{Encoding, Type};
    let pages = c.uncompressed_size().max(0) as u64;
    let values = c.num_values().max(0) as u64;
    let descr = c.column_descr();
    let width = match descr.physical_type() {
        Type::INT32 | Type::FLOAT => 4,
        Type::INT64 | Type::DOUBLE => 8,
        Type::INT96 => 12,
        Type::FIXED_LEN_BYTE_ARRAY => descr.type_length().max(0) as u64,
        Type::BOOLEAN | Type::BYTE_ARRAY => return pages,
    };
    let plain = values.saturating_mul(width);
    if c.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED) {
        return pages.max(plain);
    }
    if !c
        .encodings()
        .any(|e| matches!(e, Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY))
    {
        return pages;
    }
    if descr.max_rep_level() > 0 {
        pages.max(plain)
    } else {
        pages.saturating_add(values.saturating_mul(2))
    }
}

/// `ranges` of `file` (whose manifest size is `len`), each into its own
/// buffer from `pool`, with its checksum by `hash` when given.
fn read_at(
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

/// CRC-32 of the first `len` bytes of `file`, read in 1 MiB pieces.
fn crc_of_file(file: &File, len: u64) -> std::io::Result<shardfeed_format::Crc32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        hasher.update(&buf[..n]);
        at += n as u64;
    }
    Ok(shardfeed_format::Crc32(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use super::*;

    /// A delta-encoded integer chunk counts its decoded values (8 bytes
    /// each), not its few bit-packed bytes; a flat dictionary chunk its
    /// pages and 2-byte keys; a dictionary-encoded list its looked-up values;
    /// a plain chunk its pages.
    #[test]
    fn chunks_count_what_they_decode_to() {
        use parquet::basic::Encoding;
        use parquet::file::properties::{WriterProperties, WriterVersion};
        let rows = 10_000i64;
        let batch = arrow_array::RecordBatch::try_from_iter([
            (
                "delta",
                std::sync::Arc::new(arrow_array::Int64Array::from_iter_values(0..rows))
                    as arrow_array::ArrayRef,
            ),
            (
                "dict",
                std::sync::Arc::new(arrow_array::Int64Array::from_iter_values(
                    (0..rows).map(|i| i % 7),
                )),
            ),
            (
                "ids",
                std::sync::Arc::new(arrow_array::ListArray::from_iter_primitive::<
                    arrow_array::types::Int32Type,
                    _,
                    _,
                >(
                    (0..rows).map(|i| Some((0..(i % 5) as i32).map(|t| Some(t * 7 % 50)))),
                )),
            ),
            (
                "plain",
                std::sync::Arc::new(arrow_array::Float64Array::from_iter_values(
                    (0..rows).map(|i| i as f64 * 0.37),
                )),
            ),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_column_dictionary_enabled("delta".into(), false)
            .set_column_encoding("delta".into(), Encoding::DELTA_BINARY_PACKED)
            .set_column_dictionary_enabled("plain".into(), false)
            .build();
        let mut file = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let reader =
            parquet::file::serialized_reader::SerializedFileReader::new(bytes::Bytes::from(file))
                .unwrap();
        use parquet::file::reader::FileReader;
        let group = reader.metadata().row_group(0);
        let (delta, dict, ids, plain) = (
            group.column(0),
            group.column(1),
            group.column(2),
            group.column(3),
        );
        assert!(delta.uncompressed_size() < rows);
        assert_eq!(decoded_bytes(delta), rows as u64 * 8);
        assert_eq!(
            decoded_bytes(dict),
            dict.uncompressed_size() as u64 + rows as u64 * 2
        );
        // 0 + 1 + 2 + 3 + 4 ids per five rows (an empty list is one level).
        let levels = (rows / 5 * 11) as u64;
        assert_eq!(ids.num_values() as u64, levels);
        assert!((ids.uncompressed_size() as u64) < levels * 4);
        assert_eq!(decoded_bytes(ids), levels * 4);
        assert_eq!(decoded_bytes(plain), plain.uncompressed_size() as u64);
        assert!(decoded_bytes(plain) >= rows as u64 * 8);
    }

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
