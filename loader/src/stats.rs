//! Counters shared by the pipeline stages, and the snapshot users read.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::parquet::DecodePaths;

/// Live counters; every stage adds to them.
#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub rows: AtomicU64,
    pub bytes: AtomicU64,
    pub batches: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub mapped_bytes: AtomicU64,
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub first_batch_ns: AtomicU64,
    pub wait_ns: AtomicU64,
    pub fetch_busy_ns: AtomicU64,
    pub decode_busy_ns: AtomicU64,
    pub shuffle_busy_ns: AtomicU64,
    pub collate_busy_ns: AtomicU64,
    /// Time each stage waited for input, and for room for its output.
    pub fetch_blocked_out_ns: AtomicU64,
    pub decode_blocked_in_ns: AtomicU64,
    pub decode_blocked_out_ns: AtomicU64,
    pub shuffle_blocked_in_ns: AtomicU64,
    pub shuffle_blocked_out_ns: AtomicU64,
    pub collate_blocked_in_ns: AtomicU64,
    pub collate_blocked_out_ns: AtomicU64,
    pub decode_queue: AtomicU64,
    pub oversize_batches: AtomicU64,
    pub handoff_batches: AtomicU64,
    pub truncated_rows: AtomicU64,
    /// Rows a [`crate::LoaderBuilder::filter`] dropped.
    pub filtered_rows: AtomicU64,
    pub decode_paths: Mutex<DecodePaths>,
    /// Batches measured for mixing, and the row groups they drew from in all.
    pub mixing_batches: AtomicU64,
    pub mixing_sources: AtomicU64,
    /// Row groups skipped under `OnError::Skip`: (shard, row group) -> error.
    pub skipped: Mutex<BTreeMap<(String, usize), String>>,
    /// Images skipped under `OnError::Skip`: (shard, row group, row, column) -> error.
    pub skipped_images: Mutex<BTreeMap<(String, usize, u64, String), String>>,
    /// Each `next()`'s wait, since the loader started and in this epoch.
    pub waits: Histogram,
    pub epoch_waits: Histogram,
    /// The trace being written, if one was asked for.
    pub trace: Option<crate::trace::Tracer>,
    /// How long each fetch, row group decode, shuffled window and collated
    /// batch took.
    pub fetch_latency: Histogram,
    pub decode_latency: Histogram,
    pub shuffle_latency: Histogram,
    pub collate_latency: Histogram,
}

impl Counters {
    /// A unit of a stage's work, `name`, from `started` to now: into the
    /// stage's latency histogram, and the trace when tracing.
    pub(crate) fn span(&self, name: &'static str, started: Instant, args: crate::trace::Args) {
        let took = started.elapsed();
        match name {
            "fetch" => self.fetch_latency.record(took),
            "decode" => self.decode_latency.record(took),
            "shuffle window" => self.shuffle_latency.record(took),
            "collate batch" => self.collate_latency.record(took),
            _ => {}
        }
        if let Some(t) = &self.trace {
            t.span(name, started, took, args);
        }
    }
}

/// Buckets of a [`Histogram`]: bucket `i` holds durations up to 2^(i/4) µs
/// (the last, anything longer: 2^(95/4) µs is ~14 minutes).
const BUCKETS: usize = 96;

/// Upper bound of bucket `i`, in seconds.
fn bucket_bound(i: usize) -> f64 {
    2f64.powf(i as f64 / 4.0) * 1e-6
}

/// A lock-free histogram of durations: buckets a fourth of a power of two
/// wide (percentiles within 19%), with an exact count, sum and maximum.
#[derive(Debug)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub(crate) fn record(&self, elapsed: Duration) {
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        let us = ns as f64 / 1e3;
        let i = if us <= 1.0 {
            0
        } else {
            ((4.0 * us.log2()).ceil() as usize).min(BUCKETS - 1)
        };
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Forget everything recorded (a new epoch).
    pub(crate) fn reset(&self) {
        for b in &self.buckets {
            b.store(0, Ordering::Relaxed);
        }
        self.count.store(0, Ordering::Relaxed);
        self.sum_ns.store(0, Ordering::Relaxed);
        self.max_ns.store(0, Ordering::Relaxed);
    }

    fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect()
    }

    pub(crate) fn summary(&self) -> WaitSummary {
        let counts = self.counts();
        let total: u64 = counts.iter().sum();
        let max_ms = self.max_ns.load(Ordering::Relaxed) as f64 / 1e6;
        let quantile = |q: f64| -> f64 {
            if total == 0 {
                return 0.0;
            }
            let rank = ((q * total as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    // The bucket's upper bound, never past the largest wait.
                    return (bucket_bound(i) * 1e3).min(max_ms);
                }
            }
            max_ms
        };
        WaitSummary {
            count: total,
            total_ms: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e6,
            p50_ms: quantile(0.50),
            p95_ms: quantile(0.95),
            p99_ms: quantile(0.99),
            max_ms,
        }
    }

    /// Cumulative counts at each bucket's upper bound (seconds), up to the
    /// last bucket holding anything: Prometheus's `le` buckets.
    pub(crate) fn cumulative(&self) -> Vec<(f64, u64)> {
        let counts = self.counts();
        let last = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
        let mut seen = 0;
        counts[..=last]
            .iter()
            .enumerate()
            .map(|(i, &c)| {
                seen += c;
                (bucket_bound(i), seen)
            })
            .collect()
    }
}

/// The distribution of the consumer's waits inside `next()`: percentiles
/// are the upper bound of the bucket they fall in (within 19%, never past
/// the maximum, which is exact).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitSummary {
    /// Calls to `next()` that returned a batch or an error.
    pub count: u64,
    /// Their waits added up, in milliseconds.
    pub total_ms: f64,
    /// Median wait, in milliseconds.
    pub p50_ms: f64,
    /// 95th percentile, in milliseconds.
    pub p95_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// Longest wait, in milliseconds.
    pub max_ms: f64,
}

/// What one pipeline stage did, as fractions of the wall time since the
/// first `next()`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageStats {
    /// Time working (not waiting for input or room for output), per worker:
    /// 1.0 is a stage whose every worker was always busy (briefly more where
    /// the next epoch's pass, with its own workers, overlaps this one's end). For `fetch`, the
    /// time requests were in flight over the requests allowed at once: the
    /// share of its request slots in use (a slow store fills them).
    pub busy_fraction: f64,
    /// Time waiting for input (the stage before it), per worker.
    pub blocked_input_fraction: f64,
    /// Time waiting for room for its output (the stage after it, or the
    /// consumer holding every slab), per worker.
    pub blocked_output_fraction: f64,
    /// Workers of the stage: decode threads, requests allowed in flight
    /// for `fetch`, 1 for the others.
    pub workers: usize,
    /// Busy time, in milliseconds (summed over workers).
    pub busy_ms: f64,
    /// Time blocked on input, in milliseconds (summed over workers).
    pub blocked_input_ms: f64,
    /// Time blocked on output, in milliseconds (summed over workers).
    pub blocked_output_ms: f64,
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

    /// Record that an image was skipped; returns how many distinct images
    /// were skipped so far.
    pub(crate) fn record_image_skip(
        &self,
        shard: &str,
        row_group: usize,
        row: u64,
        column: &str,
        error: &str,
    ) -> usize {
        let mut skipped = self.skipped_images.lock().expect("stats lock");
        let key = (shard.to_string(), row_group, row, column.to_string());
        if skipped.insert(key, error.to_string()).is_none() {
            tracing::warn!(
                shard,
                row_group,
                row,
                column,
                "skipping an image that does not decode (on_error=skip): {error}"
            );
        }
        skipped.len()
    }
}

/// An image left out under `OnError::Skip` (its row is left out of the batch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedImage {
    /// The shard's relative path.
    pub shard: String,
    /// The row group.
    pub row_group: usize,
    /// The row within the row group.
    pub row: u64,
    /// The image column.
    pub column: String,
    /// Why it was skipped.
    pub error: String,
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
    /// Bytes of column chunks read through a mapping of their local shard
    /// (part of `fetched_bytes`; see `LoaderBuilder::mapped_reads`).
    pub mapped_bytes: u64,
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
    /// A packing mixture's source: batches handed on as their rows lie in
    /// the decoded row groups, without collating them (the packer copies
    /// each row once, from there).
    #[serde(default)]
    pub handoff_batches: u64,
    /// List rows truncated to `pad_to`.
    pub truncated_rows: u64,
    /// Rows a [`crate::LoaderBuilder::filter`] dropped.
    #[serde(default)]
    pub filtered_rows: u64,
    /// `"cuda"` or `"page-aligned"`.
    pub pinning: String,
    /// The most slabs the pool holds.
    pub slabs: usize,
    /// Slabs made so far (made on first need, up to `slabs`).
    #[serde(default)]
    pub slabs_made: usize,
    /// Bytes per slab.
    pub slab_bytes: usize,
    /// Buffers made for local reads of 64 KiB and more so far; they are
    /// reused while they hold no more than `byte_budget` together, so this
    /// stops growing once the pipeline has as many as it needs.
    #[serde(default)]
    pub read_buffers_made: u64,
    /// Bytes those read buffers hold now, in use and idle.
    #[serde(default)]
    pub read_buffer_bytes: u64,
    /// Column chunks decoded by each path (the own decoders, or parquet's reader).
    pub decode_paths: DecodePaths,
    /// Row groups skipped as damaged under `OnError::Skip`, each once.
    pub skipped: Vec<SkippedRowGroup>,
    /// Images skipped as undecodable under `OnError::Skip`, each once.
    #[serde(default)]
    pub skipped_images: Vec<SkippedImage>,
    /// How well batches mix the dataset's row groups.
    pub mixing: Mixing,
    /// Time since the first `next()`, in milliseconds.
    pub elapsed_ms: f64,
    /// Fraction of `elapsed_ms` the consumer spent waiting in `next()`.
    pub wait_fraction: f64,
    /// The distribution of waits in `next()` since the loader started.
    pub wait: WaitSummary,
    /// The same over the current epoch so far.
    pub wait_epoch: WaitSummary,
    /// Each stage's share of the time: `fetch`, `decode`, `shuffle`, `collate`.
    pub stages: BTreeMap<String, StageStats>,
    /// The stage the consumer waits on: from the collator upstream, the
    /// first stage that waited for its input under a quarter of its time
    /// (the busiest stage when that one mostly waited for room for its
    /// output: the waits were transients); or
    /// `"trainer"` when, past the first batch, the consumer waited under 5% of
    /// the time (the loader keeps ahead).
    pub bottleneck: String,
    /// Cumulative wait counts at each bucket bound in seconds (for
    /// [`Stats::to_prometheus`]).
    #[serde(skip)]
    pub wait_buckets: Vec<(f64, u64)>,
    /// How long each unit of a stage's work took (a fetch, a row group's
    /// decode, a shuffled window, a collated batch), by stage.
    pub stage_latency: BTreeMap<String, WaitSummary>,
    /// Their cumulative counts at each bucket bound in seconds, by stage.
    #[serde(skip)]
    pub stage_buckets: BTreeMap<String, Vec<(f64, u64)>>,
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
    fn latencies(&self) -> impl Iterator<Item = (&'static str, &Histogram)> {
        [
            ("fetch", &self.fetch_latency),
            ("decode", &self.decode_latency),
            ("shuffle", &self.shuffle_latency),
            ("collate", &self.collate_latency),
        ]
        .into_iter()
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            rows: self.rows.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            mapped_bytes: self.mapped_bytes.load(Ordering::Relaxed),
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
            handoff_batches: self.handoff_batches.load(Ordering::Relaxed),
            truncated_rows: self.truncated_rows.load(Ordering::Relaxed),
            filtered_rows: self.filtered_rows.load(Ordering::Relaxed),
            pinning: String::new(),
            slabs: 0,
            slabs_made: 0,
            slab_bytes: 0,
            read_buffers_made: 0,
            read_buffer_bytes: 0,
            decode_paths: *self.decode_paths.lock().expect("stats lock"),
            mixing: Mixing {
                row_groups_per_batch: self.mixing_sources.load(Ordering::Relaxed) as f64
                    / self.mixing_batches.load(Ordering::Relaxed).max(1) as f64,
                ..Mixing::default()
            },
            wait: self.waits.summary(),
            wait_epoch: self.epoch_waits.summary(),
            wait_buckets: self.waits.cumulative(),
            stage_latency: self
                .latencies()
                .map(|(n, h)| (n.to_string(), h.summary()))
                .collect(),
            stage_buckets: self
                .latencies()
                .map(|(n, h)| (n.to_string(), h.cumulative()))
                .collect(),
            elapsed_ms: 0.0,
            wait_fraction: 0.0,
            stages: [
                (
                    "fetch",
                    &self.fetch_busy_ns,
                    None,
                    &self.fetch_blocked_out_ns,
                ),
                (
                    "decode",
                    &self.decode_busy_ns,
                    Some(&self.decode_blocked_in_ns),
                    &self.decode_blocked_out_ns,
                ),
                (
                    "shuffle",
                    &self.shuffle_busy_ns,
                    Some(&self.shuffle_blocked_in_ns),
                    &self.shuffle_blocked_out_ns,
                ),
                (
                    "collate",
                    &self.collate_busy_ns,
                    Some(&self.collate_blocked_in_ns),
                    &self.collate_blocked_out_ns,
                ),
            ]
            .into_iter()
            .map(|(name, busy, blocked_in, blocked_out)| {
                (
                    name.to_string(),
                    StageStats {
                        busy_ms: ms(busy),
                        blocked_input_ms: blocked_in.map_or(0.0, ms),
                        blocked_output_ms: ms(blocked_out),
                        ..StageStats::default()
                    },
                )
            })
            .collect(),
            bottleneck: String::new(),
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
            skipped_images: self
                .skipped_images
                .lock()
                .expect("stats lock")
                .iter()
                .map(|((shard, row_group, row, column), error)| SkippedImage {
                    shard: shard.clone(),
                    row_group: *row_group,
                    row: *row,
                    column: column.clone(),
                    error: error.clone(),
                })
                .collect(),
        }
    }
}

/// A stage waiting for its input this fraction of its time or more is
/// starved: the bottleneck is further upstream.
const STARVED: f64 = 0.25;

impl Stats {
    /// Fill `elapsed_ms`, `wait_fraction`, `stages` and `bottleneck` for a
    /// loader started `elapsed` ago with `decode_threads` decode threads and
    /// `io_concurrency` requests in flight at most.
    pub(crate) fn derive(
        &mut self,
        elapsed: Duration,
        decode_threads: usize,
        io_concurrency: usize,
    ) {
        self.elapsed_ms = elapsed.as_secs_f64() * 1e3;
        let wall = self.elapsed_ms.max(1e-9);
        self.wait_fraction = (self.wait_ms / wall).min(1.0);
        for (name, stage) in self.stages.iter_mut() {
            stage.workers = match name.as_str() {
                "fetch" => io_concurrency,
                "decode" => decode_threads,
                _ => 1,
            }
            .max(1);
            let per = wall * stage.workers as f64;
            stage.busy_fraction = stage.busy_ms / per;
            stage.blocked_input_fraction = stage.blocked_input_ms / per;
            stage.blocked_output_fraction = stage.blocked_output_ms / per;
        }
        self.bottleneck = if self.elapsed_ms == 0.0 {
            String::new()
        } else if (self.wait_ms - self.time_to_first_batch_ms).max(0.0) / wall < 0.05 {
            // Past the first batch (start-up has its own figure), the
            // consumer hardly waited.
            "trainer".to_string()
        } else {
            self.limiting_stage()
        };
    }

    /// The stage that limits the pipeline: from the collator upstream, the
    /// first stage that waited for its input under a quarter of its time
    /// (the busiest stage when that one mostly waited for room for its
    /// output: the consumer's waits were transients).
    pub fn limiting_stage(&self) -> String {
        // From the consumer upstream: a stage that waited on its input
        // for a quarter of its time or more is fed too slowly; the
        // first that did not is the bottleneck.
        if ["fetch", "decode", "shuffle", "collate"]
            .iter()
            .any(|s| !self.stages.contains_key(*s))
        {
            // Not measured (a snapshot before the first `next()`).
            return String::new();
        }
        let mut at = "collate";
        for upstream in ["shuffle", "decode", "fetch"] {
            if self.stages[at].blocked_input_fraction < STARVED {
                break;
            }
            at = upstream;
        }
        let stage = &self.stages[at];
        if stage.blocked_output_fraction > stage.busy_fraction {
            // Not limited by its input nor by its own work: the waits
            // were transients (epoch starts); the busiest stage is the
            // one closest to its limit.
            self.stages
                .iter()
                .max_by(|a, b| a.1.busy_fraction.total_cmp(&b.1.busy_fraction))
                .map_or(at, |(name, _)| name.as_str())
                .to_string()
        } else {
            at.to_string()
        }
    }

    /// The counters in Prometheus's text exposition format, every metric
    /// named `shardfeed_*` and labelled `rank="RANK"`: counters of rows,
    /// bytes, batches, requests, retries and skipped row groups, the wait
    /// histogram (seconds) and each stage's busy seconds.
    pub fn to_prometheus(&self, rank: usize) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let label = format!("rank=\"{rank}\"");
        let mut counter = |name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP shardfeed_{name} {help}");
            let _ = writeln!(out, "# TYPE shardfeed_{name} counter");
            let _ = writeln!(out, "shardfeed_{name}{{{label}}} {value}");
        };
        counter("rows_total", "Rows yielded.", self.rows as f64);
        counter(
            "bytes_total",
            "Bytes of collated batches yielded.",
            self.bytes as f64,
        );
        counter("batches_total", "Batches yielded.", self.batches as f64);
        counter(
            "fetched_bytes_total",
            "Bytes of footers and column chunks read.",
            self.fetched_bytes as f64,
        );
        counter(
            "requests_total",
            "Requests made to object storage.",
            self.requests as f64,
        );
        counter(
            "retries_total",
            "Storage requests retried.",
            self.retries as f64,
        );
        counter(
            "skipped_row_groups_total",
            "Damaged row groups skipped (on_error=skip).",
            self.skipped.len() as f64,
        );
        counter(
            "skipped_images_total",
            "Images that did not decode, skipped (on_error=skip).",
            self.skipped_images.len() as f64,
        );
        for (name, busy) in [
            ("fetch", self.fetch_busy_ms),
            ("decode", self.decode_busy_ms),
            ("shuffle", self.shuffle_busy_ms),
            ("collate", self.collate_busy_ms),
        ] {
            counter(
                &format!("{name}_busy_seconds_total"),
                &format!("Time the {name} stage spent working (summed over its workers)."),
                busy / 1e3,
            );
        }
        let _ = writeln!(
            out,
            "# HELP shardfeed_wait_seconds Time each next() waited for a batch."
        );
        let _ = writeln!(out, "# TYPE shardfeed_wait_seconds histogram");
        for (bound, count) in &self.wait_buckets {
            let _ = writeln!(
                out,
                "shardfeed_wait_seconds_bucket{{{label},le=\"{bound:e}\"}} {count}"
            );
        }
        let _ = writeln!(
            out,
            "shardfeed_wait_seconds_bucket{{{label},le=\"+Inf\"}} {}",
            self.wait.count
        );
        let _ = writeln!(
            out,
            "shardfeed_wait_seconds_sum{{{label}}} {}",
            self.wait.total_ms / 1e3
        );
        let _ = writeln!(
            out,
            "shardfeed_wait_seconds_count{{{label}}} {}",
            self.wait.count
        );
        let _ = writeln!(
            out,
            "# HELP shardfeed_stage_seconds Time each unit of a stage's work took (a fetch, a row group's decode, a shuffled window, a collated batch)."
        );
        let _ = writeln!(out, "# TYPE shardfeed_stage_seconds histogram");
        for (stage, buckets) in &self.stage_buckets {
            let summary = self.stage_latency.get(stage).cloned().unwrap_or_default();
            for (bound, count) in buckets {
                let _ = writeln!(
                    out,
                    "shardfeed_stage_seconds_bucket{{{label},stage=\"{stage}\",le=\"{bound:e}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "shardfeed_stage_seconds_bucket{{{label},stage=\"{stage}\",le=\"+Inf\"}} {}",
                summary.count
            );
            let _ = writeln!(
                out,
                "shardfeed_stage_seconds_sum{{{label},stage=\"{stage}\"}} {}",
                summary.total_ms / 1e3
            );
            let _ = writeln!(
                out,
                "shardfeed_stage_seconds_count{{{label},stage=\"{stage}\"}} {}",
                summary.count
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_fall_in_the_bucket_of_the_recorded_waits() {
        let h = Histogram::default();
        // 90 waits of 1 ms, 9 of 10 ms, one of 250 ms.
        for _ in 0..90 {
            h.record(Duration::from_millis(1));
        }
        for _ in 0..9 {
            h.record(Duration::from_millis(10));
        }
        h.record(Duration::from_millis(250));
        let s = h.summary();
        assert_eq!(s.count, 100);
        assert!((s.total_ms - 430.0).abs() < 1e-6, "{s:?}");
        // Within a bucket (19%) above the true value, never below it.
        assert!((1.0..1.19).contains(&s.p50_ms), "{s:?}");
        assert!((10.0..11.9).contains(&s.p95_ms), "{s:?}");
        assert!((10.0..11.9).contains(&s.p99_ms), "{s:?}");
        assert_eq!(s.max_ms, 250.0);
        let buckets = h.cumulative();
        assert_eq!(buckets.last().unwrap().1, 100);
        assert!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1)
        );
        h.reset();
        assert_eq!(h.summary(), WaitSummary::default());
    }

    #[test]
    fn prometheus_text_has_every_counter_and_a_consistent_histogram() {
        let h = Histogram::default();
        h.record(Duration::from_micros(300));
        h.record(Duration::from_millis(40));
        let stats = Stats {
            rows: 10,
            batches: 2,
            wait: h.summary(),
            wait_buckets: h.cumulative(),
            ..Stats::default()
        };
        let text = stats.to_prometheus(3);
        assert!(
            text.contains("shardfeed_rows_total{rank=\"3\"} 10\n"),
            "{text}"
        );
        assert!(
            text.contains("shardfeed_batches_total{rank=\"3\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("shardfeed_wait_seconds_count{rank=\"3\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("le=\"+Inf\"} 2\n"), "{text}");
        // Every sample line is `name{labels} value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
        }
    }
}
