//! Fetching on the loader's tokio runtime: footers (sized by the manifest, one
//! bounded range each) and the projected column chunks of each row group.
//! Only I/O happens here; checks and decoding run on the decode threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use shardfeed_format::{Location, Manifest, RetryPolicy};

use crate::cache::ShardCache;
use crate::decode::{Fetched, FooterInfo, projection};
use crate::plan::Segment;
use crate::shard::decode_footer;
use crate::stats::Counters;
use crate::{LoaderError, Result};

/// Footers kept decoded at once.
const FOOTER_CACHE: usize = 256;

/// Values by shard, and their insertion order for eviction.
type Cache<T> = (HashMap<u32, T>, VecDeque<u32>);

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
    /// Local datasets are memory-mapped: ranges are slices of the page cache,
    /// with no copy and no trip through the runtime's blocking pool.
    mapped: Mutex<Cache<Bytes>>,
    /// A local copy of remote shards, when configured.
    cache: Option<ShardCache>,
    /// One download per shard per process.
    downloads: Mutex<HashMap<u32, Arc<tokio::sync::OnceCell<Bytes>>>>,
}

impl FetchContext {
    pub(crate) fn new(
        location: Location,
        manifest: Arc<Manifest>,
        roots: Vec<usize>,
        counters: Arc<Counters>,
        retry: RetryPolicy,
        cache: Option<ShardCache>,
    ) -> Self {
        FetchContext {
            cache,
            downloads: Mutex::new(HashMap::new()),
            location,
            manifest,
            roots,
            counters,
            retry,
            footers: Mutex::new((HashMap::new(), VecDeque::new())),
            mapped: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// The whole shard, memory-mapped: a local dataset's file, or a remote
    /// shard's copy in the cache (downloaded once per process).
    async fn local(&self, shard: u32) -> Result<Option<Bytes>> {
        if let Some(bytes) = cache_get(&self.mapped, shard) {
            return Ok(Some(bytes));
        }
        let entry = &self.manifest.shards[shard as usize];
        let Some(root) = self.location.local_root() else {
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
            let bytes = cell
                .get_or_try_init(|| self.cached(shard, cache))
                .await?
                .clone();
            cache_put(&self.mapped, shard, bytes.clone());
            return Ok(Some(bytes));
        };
        let path = root.join(&entry.path);
        let file = std::fs::File::open(&path).map_err(|e| self.io_error(shard, &path, e))?;
        let bytes = self.map(shard, &path, &file)?;
        cache_put(&self.mapped, shard, bytes.clone());
        Ok(Some(bytes))
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

    fn map(&self, shard: u32, path: &std::path::Path, file: &std::fs::File) -> Result<Bytes> {
        // SAFETY: shards (and cached copies) are immutable once published
        // (written aside and renamed into place), so the mapping does not change.
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| self.io_error(shard, path, e))?;
        Ok(Bytes::from_owner(map))
    }

    /// `shard` mapped from the cache, downloaded first unless it is there and intact.
    async fn cached(&self, shard: u32, cache: &ShardCache) -> Result<Bytes> {
        let entry = &self.manifest.shards[shard as usize];
        let path = cache.path(entry);
        if let Some(file) = cache.open(entry) {
            let bytes = self.map(shard, &path, &file)?;
            // Checksumming a whole shard is CPU work: off the async workers.
            let (copy, expected) = (bytes.clone(), entry.crc32);
            let intact =
                tokio::task::spawn_blocking(move || shardfeed_format::Crc32::of(&copy) == expected)
                    .await
                    .unwrap_or(false);
            if intact {
                return Ok(bytes);
            }
            // A damaged copy: replace it.
            let _ = std::fs::remove_file(&path);
        }
        let file = self.download(shard, cache).await?;
        self.map(shard, &path, &file)
    }

    /// Put `shard` in the cache: one whole-object GET. Returns the open file.
    async fn download(&self, shard: u32, cache: &ShardCache) -> Result<std::fs::File> {
        let entry = self.manifest.shards[shard as usize].clone();
        let path = self.location.child(&entry.path);
        let started = Instant::now();
        let store = self.location.store();
        let bytes = self
            .retry
            .run(
                || async { store.get(&path).await?.bytes().await },
                || Counters::add(&self.counters.retries, 1),
            )
            .await
            .map_err(|e| self.store_error(shard, e))?;
        Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
        Counters::add(&self.counters.requests, 1);
        let cache = cache.clone();
        tokio::task::spawn_blocking(move || cache.insert(&entry, &bytes))
            .await
            .map_err(|e| LoaderError::Io {
                op: "write the cache".into(),
                source: std::io::Error::other(e.to_string()),
            })?
            .map_err(|reason| LoaderError::Io {
                op: reason,
                source: std::io::Error::other("cache"),
            })
    }

    /// Read `ranges` of `shard`: slices of the mapping for local datasets,
    /// coalesced range requests otherwise.
    async fn read_ranges(&self, shard: u32, ranges: &[std::ops::Range<u64>]) -> Result<Vec<Bytes>> {
        let started = Instant::now();
        let parts = match self.local(shard).await? {
            Some(file) => {
                let len = file.len() as u64;
                ranges
                    .iter()
                    .map(|r| {
                        if r.end > len {
                            return Err(LoaderError::Corrupt {
                                shard: self.manifest.shards[shard as usize].path.clone(),
                                row_group: None,
                                detail: format!(
                                    "file is {len} bytes, shorter than the manifest says"
                                ),
                            });
                        }
                        Ok(file.slice(r.start as usize..r.end as usize))
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            None => {
                let entry = &self.manifest.shards[shard as usize];
                let path = self.location.child(&entry.path);
                // `get_ranges` coalesces nearby ranges into fewer requests.
                let parts = self
                    .retry
                    .run(
                        || self.location.store().get_ranges(&path, ranges),
                        || Counters::add(&self.counters.retries, 1),
                    )
                    .await
                    .map_err(|e| self.store_error(shard, e))?;
                Counters::add(&self.counters.requests, 1);
                parts
            }
        };
        Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
        Counters::add(
            &self.counters.fetched_bytes,
            parts.iter().map(|b| b.len() as u64).sum(),
        );
        Ok(parts)
    }

    fn store_error(&self, shard: u32, source: object_store::Error) -> LoaderError {
        let url = self
            .location
            .url_of(&self.manifest.shards[shard as usize].path);
        match source {
            object_store::Error::NotFound { .. } => LoaderError::MissingShard { url, source },
            source => LoaderError::Store { url, source },
        }
    }

    /// The checked, decoded footer of `shard` (cached).
    pub(crate) async fn footer(&self, shard: u32) -> Result<Arc<FooterInfo>> {
        if let Some(f) = cache_get(&self.footers, shard) {
            return Ok(f);
        }
        let entry = &self.manifest.shards[shard as usize];
        let range = entry.bytes - entry.footer_len..entry.bytes;
        let bytes = self
            .read_ranges(shard, &[range])
            .await?
            .pop()
            .expect("one range");
        let entry = entry.clone();
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

    /// Fetch the projected column chunks of `segment`'s row group.
    pub(crate) async fn fetch(&self, seq: u64, segment: Segment) -> Result<Fetched> {
        let footer = self.footer(segment.shard).await?;
        let (leaves, _) = projection(&footer.arrow, &self.roots);
        let rg = footer.footer.metadata.row_group(segment.row_group as usize);
        let ranges: Vec<std::ops::Range<u64>> = leaves
            .iter()
            .map(|&leaf| {
                let (start, len) = rg.column(leaf).byte_range();
                start..start + len
            })
            .collect();
        let parts = self.read_ranges(segment.shard, &ranges).await?;
        let chunks = leaves
            .into_iter()
            .zip(ranges)
            .zip(parts)
            .map(|((leaf, range), bytes)| (leaf, range.start, bytes))
            .collect();
        Ok(Fetched {
            seq,
            segment,
            footer,
            chunks,
            mapped: self.location.local_root().is_some() || self.cache.is_some(),
        })
    }
}
