//! Fetching on the loader's tokio runtime: footers (sized by the manifest, one
//! bounded range each) and the projected column chunks of each row group.
//! Only I/O happens here; checks and decoding run on the decode threads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use shardfeed_format::{Location, Manifest};

use crate::decode::{Fetched, FooterInfo, projection};
use crate::plan::Segment;
use crate::shard::decode_footer;
use crate::stats::Counters;
use crate::{LoaderError, Result};

/// Footers kept decoded at once.
const FOOTER_CACHE: usize = 256;

/// Decoded footers by shard, and their insertion order for eviction.
type FooterCache = (HashMap<u32, Arc<FooterInfo>>, VecDeque<u32>);

/// What the fetch stage needs, shared by its concurrent requests.
pub(crate) struct FetchContext {
    pub location: Location,
    pub manifest: Arc<Manifest>,
    /// Top-level columns to read.
    pub roots: Vec<usize>,
    pub counters: Arc<Counters>,
    footers: Mutex<FooterCache>,
}

impl FetchContext {
    pub(crate) fn new(
        location: Location,
        manifest: Arc<Manifest>,
        roots: Vec<usize>,
        counters: Arc<Counters>,
    ) -> Self {
        FetchContext {
            location,
            manifest,
            roots,
            counters,
            footers: Mutex::new((HashMap::new(), VecDeque::new())),
        }
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
        if let Some(f) = self.footers.lock().expect("footer cache").0.get(&shard) {
            return Ok(f.clone());
        }
        let entry = &self.manifest.shards[shard as usize];
        let started = Instant::now();
        let range = entry.bytes - entry.footer_len..entry.bytes;
        let bytes = self
            .location
            .store()
            .get_range(&self.location.child(&entry.path), range)
            .await
            .map_err(|e| self.store_error(shard, e))?;
        Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
        Counters::add(&self.counters.requests, 1);
        Counters::add(&self.counters.fetched_bytes, bytes.len() as u64);
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
        let mut cache = self.footers.lock().expect("footer cache");
        if cache.0.insert(shard, info.clone()).is_none() {
            cache.1.push_back(shard);
            if cache.1.len() > FOOTER_CACHE
                && let Some(old) = cache.1.pop_front()
            {
                cache.0.remove(&old);
            }
        }
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
        let entry = &self.manifest.shards[segment.shard as usize];
        let started = Instant::now();
        // `get_ranges` coalesces nearby ranges into fewer requests.
        let parts = self
            .location
            .store()
            .get_ranges(&self.location.child(&entry.path), &ranges)
            .await
            .map_err(|e| self.store_error(segment.shard, e))?;
        Counters::add_time(&self.counters.fetch_busy_ns, started.elapsed());
        Counters::add(&self.counters.requests, 1);
        let fetched: u64 = parts.iter().map(|b| b.len() as u64).sum();
        Counters::add(&self.counters.fetched_bytes, fetched);
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
        })
    }
}
