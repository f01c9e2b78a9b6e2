//! Counters shared by the pipeline stages, and the snapshot users read.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::parquet::DecodePaths;

/// Live counters; every stage adds to them.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub rows: AtomicU64,
    pub bytes: AtomicU64,
    pub batches: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub first_batch_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub fetch_busy_ns: AtomicU64,
    pub decode_busy_ns: AtomicU64,
    pub shuffle_busy_ns: AtomicU64,
    pub collate_busy_ns: AtomicU64,
    pub decode_queue: AtomicU64,
    pub oversize_batches: AtomicU64,
    pub truncated_rows: AtomicU64,
    pub decode_paths: Mutex<DecodePaths>,
    /// Batches measured for mixing, and the row groups they drew from in all.
    pub mixing_batches: AtomicU64,
    pub mixing_sources: AtomicU64,
    /// Row groups skipped under `OnError::Skip`: (shard, row group) -> error.
    pub skipped: Mutex<BTreeMap<(String, usize), String>>,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, value: u64) {
        counter.fetch_add(value, Ordering::Relaxed);
    }

    pub(crate) fn add_time(counter: &AtomicU64, elapsed: Duration) {
        counter.fetch_add(elapsed.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Count the column chunks a row group's decode took by each path.
    pub(crate) fn add_paths(&self, paths: &DecodePaths) {
        self.decode_paths.lock().expect("stats lock").add(paths);
    }

    /// Record that row group `row_group` of `shard` was skipped because of
    /// `error` (once per row group, whatever the epoch); warns, and returns
    /// how many distinct row groups were skipped so far.
    pub(crate) fn record_skip(&self, shard: &str, row_group: usize, error: &str) -> usize {
        let mut skipped = self.skipped.lock().expect("stats lock");
        if skipped
            .insert((shard.to_string(), row_group), error.to_string())
            .is_none()
        {
            tracing::warn!(
                shard,
                row_group,
                "skipping a damaged row group (on_error=skip): {error}"
            );
        }
        skipped.len()
    }
}

/// A row group left out under `OnError::Skip`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedRowGroup {
    /// The shard's relative path.
    pub shard: String,
    /// The row group.
    pub row_group: usize,
    /// Why it was skipped.
    pub error: String,
}

/// A snapshot of a loader's counters since it was built.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Rows yielded.
    pub rows: u64,
    /// Bytes of collated buffers yielded.
    pub bytes: u64,
    /// Batches yielded.
    pub batches: u64,
    /// Bytes of footers and column chunks read (from storage, local files or the cache).
    pub fetched_bytes: u64,
    /// Requests made to object storage (local files and cache hits make none).
    pub requests: u64,
    /// Requests retried after a transient failure.
    pub retries: u64,
    /// Time from the first `next()` to the first batch, in milliseconds.
    pub time_to_first_batch_ms: f64,
    /// Total time the consumer waited inside `next()`, in milliseconds.
    pub wait_ms: f64,
    /// Time spent in storage reads (summed over concurrent requests), in milliseconds.
    pub fetch_busy_ms: f64,
    /// Time decode threads spent checking and decoding, in milliseconds.
    pub decode_busy_ms: f64,
    /// Time the shuffle stage spent materialising shuffled windows, in milliseconds.
    pub shuffle_busy_ms: f64,
    /// Time the collator spent gathering rows into slabs, in milliseconds.
    pub collate_busy_ms: f64,
    /// Row groups fetched but not yet decoded, now.
    pub decode_queue: u64,
    /// Batches collated but not yet taken by the consumer, now.
    pub output_queue: u64,
    /// Batches too large for a slab, given a one-off buffer.
    pub oversize_batches: u64,
    /// List rows truncated to `pad_to`.
    pub truncated_rows: u64,
    /// `"cuda"` or `"page-aligned"`.
    pub pinning: String,
    /// Slabs in the pool.
    pub slabs: usize,
    /// Bytes per slab.
    pub slab_bytes: usize,
    /// Column chunks decoded by each path (the own decoders, or parquet's reader).
    pub decode_paths: DecodePaths,
    /// Row groups skipped as damaged under `OnError::Skip`, each once.
    pub skipped: Vec<SkippedRowGroup>,
    /// How well batches mix the dataset's row groups.
    pub mixing: Mixing,
}

/// How well batches mix: the row groups a batch draws from (measured on one
/// batch in eight), and the shuffle window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mixing {
    /// Distinct row groups per batch, on average.
    pub row_groups_per_batch: f64,
    /// Row groups per shuffle window.
    pub window_row_groups: usize,
    /// Rows per shuffle window, on average.
    pub window_rows: f64,
    /// Whether the dataset was shuffled at shard time.
    pub shuffled_at_shard_time: bool,
}

fn ms(ns: &AtomicU64) -> f64 {
    ns.load(Ordering::Relaxed) as f64 / 1e6
}

impl Counters {
    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            rows: self.rows.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            retries: self.retries.load(Ordering::Relaxed),
            time_to_first_batch_ms: ms(&self.first_batch_ns),
            wait_ms: ms(&self.wait_ns),
            fetch_busy_ms: ms(&self.fetch_busy_ns),
            decode_busy_ms: ms(&self.decode_busy_ns),
            shuffle_busy_ms: ms(&self.shuffle_busy_ns),
            collate_busy_ms: ms(&self.collate_busy_ns),
            decode_queue: self.decode_queue.load(Ordering::Relaxed),
            output_queue: 0,
            oversize_batches: self.oversize_batches.load(Ordering::Relaxed),
            truncated_rows: self.truncated_rows.load(Ordering::Relaxed),
            pinning: String::new(),
            slabs: 0,
            slab_bytes: 0,
            decode_paths: *self.decode_paths.lock().expect("stats lock"),
            mixing: Mixing {
                row_groups_per_batch: self.mixing_sources.load(Ordering::Relaxed) as f64
                    / self.mixing_batches.load(Ordering::Relaxed).max(1) as f64,
                ..Mixing::default()
            },
            skipped: self
                .skipped
                .lock()
                .expect("stats lock")
                .iter()
                .map(|((shard, row_group), error)| SkippedRowGroup {
                    shard: shard.clone(),
                    row_group: *row_group,
                    error: error.clone(),
                })
                .collect(),
        }
    }
}
