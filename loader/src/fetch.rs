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

mod local;
mod parts;
pub(crate) mod stage;

pub(crate) use local::LocalReads;
use local::{BufferPool, Readers, read_at};

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
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::RowGroupMetaData;
use shardfeed_format::{ChunkHash, ChunkSum, Location, Manifest, RetryPolicy};

use crate::cache::ShardCache;
use crate::error::{LoaderError, Result};
use crate::mapfile::{Changed, MapSet, MappedShard};
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
    /// The columns handed on: [`FetchContext::roots`] as decoded, or
    /// fields taken out of their structs.
    pub columns: Arc<crate::select::Columns>,
    /// For an index: where its bases lie, by [`ShardEntry::base`]
    /// (`shardfeed_format::ShardEntry`).
    places: Vec<Location>,
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
    /// Page maps of the row groups read in parts ([`parts`]).
    maps_kept: parts::MapCache,
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
            maps_kept: parts::MapCache::default(),
            cache,
            downloads: Mutex::new(HashMap::new()),
            location,
            places: Vec::new(),
            columns: Arc::new(crate::select::Columns::all(
                &manifest
                    .schema
                    .project(&roots)
                    .expect("roots of the schema"),
            )),
            manifest,
            roots,
            counters,
            retry,
            footers: Mutex::new((HashMap::new(), VecDeque::new())),
            files: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The columns to hand on ([`crate::select::Columns`]), which must read
    /// [`FetchContext::roots`].
    pub(crate) fn with_columns(mut self, columns: crate::select::Columns) -> Self {
        debug_assert_eq!(columns.roots, self.roots);
        self.columns = Arc::new(columns);
        self
    }

    /// For an index: where its bases lie ([`crate::build::index_places`]).
    pub(crate) fn with_places(mut self, places: Vec<Location>) -> Self {
        self.places = places;
        self
    }

    /// Read buffers of local reads made so far, and the bytes they hold
    /// now (see [`BufferPool`]).
    pub(crate) fn read_buffers(&self) -> (u64, u64) {
        self.buffers.usage()
    }

    fn entry(&self, shard: u32) -> &shardfeed_format::ShardEntry {
        &self.manifest.shards[shard as usize]
    }

    /// Where `shard`'s path is relative to: the dataset, or for an index's
    /// file its base.
    fn place(&self, shard: u32) -> &Location {
        match self.entry(shard).base {
            Some(b) => &self.places[b as usize],
            None => &self.location,
        }
    }

    /// The shard as an open local file: a local dataset's file, or a remote
    /// shard's copy in the cache (downloaded once per process); `None` for
    /// remote shards without a cache.
    async fn local(&self, shard: u32) -> Result<Option<Arc<File>>> {
        if let Some(file) = cache_get(&self.files, shard) {
            return Ok(Some(file));
        }
        let entry = self.entry(shard);
        let file = match self.place(shard).local_root() {
            Some(root) => {
                let path = root.join(&entry.path);
                let file = File::open(&path).map_err(|e| self.io_error(shard, &path, e))?;
                let meta = file
                    .metadata()
                    .map_err(|e| self.io_error(shard, &path, e))?;
                if meta.len() != entry.bytes {
                    return Err(self.changed(shard, meta.len()));
                }
                if let Some(expected) = entry.fingerprint.as_ref().and_then(|f| f.modified_ns)
                    && shardfeed_format::modified_ns(&meta) != Some(expected)
                {
                    return Err(self.fingerprint_changed(shard));
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
        if !self.map_reads || self.place(shard).local_root().is_none() {
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
                    op: format!("read {}", self.place(shard).url_of(&entry.path)),
                    source: std::io::Error::new(kind, e),
                };
            }
            Changed::Truncated => self
                .place(shard)
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

    /// The error for an index's file whose fingerprint changed since it was
    /// indexed.
    fn fingerprint_changed(&self, shard: u32) -> LoaderError {
        let entry = self.entry(shard);
        LoaderError::Corrupt {
            shard: self.place(shard).url_of(&entry.path),
            row_group: None,
            detail: "the file changed since it was indexed (its modification time or ETag differs): index it again (`shardfeed index`)".into(),
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
            // An index's file without a recorded checksum: its copy is
            // trusted by size (the cache's name holds the fingerprint), its
            // column chunks by the decoders' bound checks.
            let intact = tokio::task::spawn_blocking(move || match expected {
                Some(expected) => {
                    shardfeed_format::Crc32::of_file(&copy, len).is_ok_and(|crc| crc == expected)
                }
                None => true,
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
        let path = self.place(shard).child(&entry.path);
        let store = self.place(shard).store();
        let pinned = entry.fingerprint.clone().unwrap_or_default();
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
                    || async {
                        let ranges = [range.clone()];
                        let mut parts = get_ranges_pinned(store, &path, &ranges, &pinned).await?;
                        Ok(parts.pop().unwrap_or_default())
                    },
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
                        op: format!("read {}", self.place(shard).url_of(&self.entry(shard).path)),
                        source: std::io::Error::other("the read thread panicked"),
                    })?;
                let (parts, mapped_bytes) =
                    read.map_err(|changed| self.read_error(shard, changed))?;
                Counters::add(&self.counters.mapped_bytes, mapped_bytes);
                parts
            }
            None => {
                let entry = self.entry(shard);
                let place = self.place(shard);
                let path = place.child(&entry.path);
                let store = place.store();
                // Both coalesce nearby ranges into fewer requests. An index's
                // file is read only while it still has the ETag (and
                // version) it was indexed with.
                let pinned = entry
                    .fingerprint
                    .as_ref()
                    .filter(|f| f.etag.is_some() || f.version.is_some());
                let parts = self
                    .retry
                    .run(
                        || async {
                            match pinned {
                                None => store.get_ranges(&path, &ranges).await,
                                Some(f) => get_ranges_pinned(store, &path, &ranges, f).await,
                            }
                        },
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
        let url = self.place(shard).url_of(&self.entry(shard).path);
        match source {
            object_store::Error::Precondition { .. } => self.fingerprint_changed(shard),
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
        permits(self.row_group_cost(&footer.arrow, meta), max_unit)
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
        // than in the page cache's 4 KiB pages (docs/performance-notes.md).
        let mappable: Vec<bool> = leaves.iter().map(|&leaf| mapped_read(rg, leaf)).collect();
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
        let hash = footer.footer.checksums.as_ref().map(|c| c.hash);
        let parts = self
            .read_ranges(segment.shard, ranges, hash, mappable)
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
            footer: Ok(footer),
            chunks,
            parts: Vec::new(),
        })
    }

    /// Whether `error`, met reading `segment`, is an index's file that
    /// changed or went away since it was indexed, which `on_error="skip"`
    /// skips (as the segment's row group's damage, counted); `Err(error)`
    /// otherwise.
    pub(crate) fn lost(
        &self,
        segment: Segment,
        error: LoaderError,
    ) -> std::result::Result<LoaderError, LoaderError> {
        if self.entry(segment.shard).base.is_none() {
            return Err(error);
        }
        let row_group = Some(segment.row_group as usize);
        match error {
            LoaderError::Corrupt { shard, detail, .. } => Ok(LoaderError::Corrupt {
                shard,
                row_group,
                detail,
            }),
            LoaderError::Decode { shard, source, .. } => Ok(LoaderError::Decode {
                shard,
                row_group,
                source,
            }),
            LoaderError::MissingShard { url, error } => Ok(LoaderError::Corrupt {
                shard: url,
                row_group,
                detail: format!("the file is gone: {error}"),
            }),
            other => Err(other),
        }
    }
}

/// Whether column `leaf` of `rg` is read through the shard's mapping
/// (when mapped reads are on): see [`FetchContext::fetch`].
fn mapped_read(rg: &RowGroupMetaData, leaf: usize) -> bool {
    let column = rg.column(leaf).column_descr();
    column.physical_type() == parquet::basic::Type::BYTE_ARRAY || column.max_rep_level() > 0
}

/// Budget permits (KiB) of `bytes`: at least one, at most `max_unit`.
fn permits(bytes: u64, max_unit: u32) -> u32 {
    u32::try_from(bytes.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .clamp(1, max_unit.max(1))
}

/// Read `ranges` of `path` (coalesced as `get_ranges` does) only from the
/// object `fingerprint` names: its ETag and version, where recorded. A
/// changed object is [`object_store::Error::Precondition`].
async fn get_ranges_pinned(
    store: &Arc<dyn object_store::ObjectStore>,
    path: &object_store::path::Path,
    ranges: &[std::ops::Range<u64>],
    fingerprint: &shardfeed_format::Fingerprint,
) -> object_store::Result<Vec<Bytes>> {
    object_store::coalesce_ranges(
        ranges,
        |range| async move {
            let options = object_store::GetOptions {
                if_match: fingerprint.etag.clone(),
                version: fingerprint.version.clone(),
                range: Some(range.into()),
                ..Default::default()
            };
            store.get_opts(path, options).await?.bytes().await
        },
        object_store::OBJECT_STORE_COALESCE_DEFAULT,
    )
    .await
}

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

#[cfg(test)]
mod tests {
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
}
