//! The loader: builder, pipeline threads, iteration, state and resume.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use shardfeed_format::fault::FaultConfig;
use shardfeed_format::{Location, Manifest, RetryPolicy};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::batch::Batch;
use crate::cache::ShardCache;
use crate::collate::{Collation, ColumnPlan, ListMode, plan_columns};
use crate::decode::{Fetched, decode, projection};
use crate::fetch::FetchContext;
use crate::pinned::{Pinning, PinningMode, Pool};
use crate::plan::{EpochPlan, PlanOptions};
use crate::stats::{Counters, Stats};
use crate::{LoaderError, Result};

/// Default rows per batch.
pub const DEFAULT_BATCH_SIZE: usize = 256;
/// Default row groups per shuffle window.
pub const DEFAULT_WINDOW: usize = 8;
/// Default concurrent storage requests.
pub const DEFAULT_IO_CONCURRENCY: usize = 8;
/// Default batches collated ahead of the consumer.
pub const DEFAULT_PREFETCH_BATCHES: usize = 16;
/// Default size limit of the local cache of remote shards: 64 GiB.
pub const DEFAULT_CACHE_LIMIT: u64 = 64 << 30;
/// Default bytes of fetched and decoded row groups held at once.
pub const DEFAULT_BYTE_BUDGET: u64 = 1 << 30;

/// Configures and builds a [`Loader`]. Every setter is optional.
///
/// ```no_run
/// use shardfeed_loader::Loader;
/// let mut loader = Loader::builder("/data/tokens")
///     .batch_size(256)
///     .columns(["input_ids"])
///     .shuffle(true)
///     .seed(0)
///     .pad_to(2048, 0.0)
///     .build()?;
/// for batch in &mut loader {
///     let batch = batch?;
///     let ids: &[i32] = batch.values("input_ids").unwrap();
///     assert_eq!(ids.len(), batch.rows() * 2048);
/// }
/// # Ok::<(), shardfeed_loader::LoaderError>(())
/// ```
#[derive(Clone, Debug)]
pub struct LoaderBuilder {
    url: String,
    location: Option<Location>,
    storage_options: Vec<(String, String)>,
    batch_size: usize,
    columns: Option<Vec<String>>,
    shuffle: bool,
    seed: u64,
    window: usize,
    epoch: u64,
    rank: Option<u64>,
    world_size: Option<u64>,
    drop_last: bool,
    decode_threads: usize,
    io_concurrency: usize,
    io_threads: usize,
    prefetch_batches: usize,
    byte_budget: u64,
    pinning: PinningMode,
    list_mode: ListMode,
    slab_bytes: Option<usize>,
    retry: RetryPolicy,
    cache_dir: Option<std::path::PathBuf>,
    cache_limit: u64,
    faults: Option<FaultConfig>,
}

fn env_u64(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| LoaderError::BadOption {
                option: if name == "RANK" { "rank" } else { "world_size" },
                reason: format!("environment variable {name}={v:?} is not a number"),
            }),
        Err(_) => Ok(None),
    }
}

impl LoaderBuilder {
    fn new(url: &str) -> Self {
        LoaderBuilder {
            url: url.to_string(),
            location: None,
            storage_options: Vec::new(),
            batch_size: DEFAULT_BATCH_SIZE,
            columns: None,
            shuffle: true,
            seed: 0,
            window: DEFAULT_WINDOW,
            epoch: 0,
            rank: None,
            world_size: None,
            drop_last: true,
            decode_threads: 0,
            io_concurrency: DEFAULT_IO_CONCURRENCY,
            io_threads: 2,
            prefetch_batches: DEFAULT_PREFETCH_BATCHES,
            byte_budget: DEFAULT_BYTE_BUDGET,
            pinning: PinningMode::Auto,
            list_mode: ListMode::Ragged,
            slab_bytes: None,
            retry: RetryPolicy::default(),
            cache_dir: None,
            cache_limit: DEFAULT_CACHE_LIMIT,
            faults: None,
        }
    }

    /// Read from an already resolved location (e.g. an in-memory store in tests).
    pub fn location(mut self, location: Location) -> Self {
        self.location = Some(location);
        self
    }
    /// Read the dataset through a [`FaultyStore`](shardfeed_format::fault::FaultyStore)
    /// injecting `faults` (latency, transient failures), as a remote store:
    /// for tests and benchmarks of remote behaviour.
    pub fn inject_faults(mut self, faults: FaultConfig) -> Self {
        self.faults = Some(faults);
        self
    }
    /// An option for the object store's builder (credentials, endpoint, ...).
    pub fn storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage_options.push((key.into(), value.into()));
        self
    }
    /// Rows per batch (default 256).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }
    /// Columns to read, in this order (default: all).
    pub fn columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }
    /// Shuffle row groups and rows (default true).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }
    /// Seed of every shuffle (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Row groups per shuffle window (default 8): rows are permuted within a window.
    pub fn window(mut self, row_groups: usize) -> Self {
        self.window = row_groups;
        self
    }
    /// The first epoch (default 0).
    pub fn epoch(mut self, epoch: u64) -> Self {
        self.epoch = epoch;
        self
    }
    /// This process's rank (default: `$RANK`, else 0).
    pub fn rank(mut self, rank: u64) -> Self {
        self.rank = Some(rank);
        self
    }
    /// Number of ranks (default: `$WORLD_SIZE`, else 1).
    pub fn world_size(mut self, world_size: u64) -> Self {
        self.world_size = Some(world_size);
        self
    }
    /// Drop the remainder rows (default true); see [`crate::plan`].
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }
    /// Decode threads (default: all cores).
    pub fn decode_threads(mut self, threads: usize) -> Self {
        self.decode_threads = threads;
        self
    }
    /// Storage requests in flight (default 8).
    pub fn io_concurrency(mut self, requests: usize) -> Self {
        self.io_concurrency = requests;
        self
    }
    /// Worker threads of the I/O runtime (default 2).
    pub fn io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }
    /// Batches collated ahead of the consumer (default 4).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch_batches = batches;
        self
    }
    /// Bytes of fetched and decoded row groups held at once (default 1 GiB).
    pub fn byte_budget(mut self, bytes: u64) -> Self {
        self.byte_budget = bytes;
        self
    }
    /// How slabs are allocated (default auto).
    pub fn pinning(mut self, mode: PinningMode) -> Self {
        self.pinning = mode;
        self
    }
    /// Pad (or truncate) list columns to `length` elements filled with `value`,
    /// with a lengths buffer, instead of values + offsets.
    pub fn pad_to(mut self, length: usize, value: f64) -> Self {
        self.list_mode = ListMode::Padded { to: length, value };
        self
    }
    /// Keep local copies of remote shards under `dir` (shared safely by the
    /// processes of one machine), so later epochs and runs read no data from
    /// storage. Ignored for local datasets.
    pub fn cache_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }
    /// Bytes the cache may hold (default 64 GiB); least recently used shards go first.
    pub fn cache_limit(mut self, bytes: u64) -> Self {
        self.cache_limit = bytes;
        self
    }
    /// How transient storage failures are retried (default: 8 retries within 30 s,
    /// exponential backoff from 50 ms with jitter).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// Bytes per slab (default: estimated from the data and batch size).
    pub fn slab_bytes(mut self, bytes: usize) -> Self {
        self.slab_bytes = Some(bytes);
        self
    }

    /// Check every option, read the manifest and the first footer, allocate
    /// the pool. Errors name the bad option.
    pub fn build(self) -> Result<Loader> {
        let bad =
            |option: &'static str, reason: String| Err(LoaderError::BadOption { option, reason });
        if self.batch_size == 0 {
            return bad("batch_size", "must be greater than 0".into());
        }
        if self.window == 0 {
            return bad("window", "must be greater than 0".into());
        }
        if self.io_concurrency == 0 || self.io_threads == 0 {
            return bad("io_concurrency", "must be greater than 0".into());
        }
        if let ListMode::Padded { to: 0, .. } = self.list_mode {
            return bad("pad_to", "must be greater than 0".into());
        }
        let world_size = match self.world_size {
            Some(w) => w,
            None => env_u64("WORLD_SIZE")?.unwrap_or(1),
        };
        let rank = match self.rank {
            Some(r) => r,
            None => env_u64("RANK")?.unwrap_or(0),
        };
        if world_size == 0 {
            return bad("world_size", "must be greater than 0".into());
        }
        if rank >= world_size {
            return bad(
                "rank",
                format!("rank {rank} is not below world_size {world_size}"),
            );
        }
        let decode_threads = if self.decode_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            self.decode_threads
        };
        let mut location = match &self.location {
            Some(l) => l.clone(),
            None => Location::parse_with_options(&self.url, self.storage_options.iter().cloned())?,
        };
        if let Some(faults) = &self.faults {
            location = location.with_faults(faults.clone());
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.io_threads)
            .thread_name("shardfeed-io")
            .enable_all()
            .build()
            .map_err(|source| LoaderError::Io {
                op: "start the I/O runtime".into(),
                source,
            })?;
        let manifest = Arc::new(runtime.block_on(location.read_manifest())?);
        let schema = &manifest.schema;
        let names: Vec<String> = match &self.columns {
            Some(c) if c.is_empty() => {
                return bad("columns", "must name at least one column".into());
            }
            Some(c) => c.clone(),
            None => schema.fields().iter().map(|f| f.name().clone()).collect(),
        };
        let mut roots = Vec::with_capacity(names.len());
        for name in &names {
            match schema.index_of(name) {
                Ok(i) => roots.push(i),
                Err(_) => {
                    let known: Vec<&str> =
                        schema.fields().iter().map(|f| f.name().as_str()).collect();
                    return bad(
                        "columns",
                        format!("no column named `{name}`; the dataset has {known:?}"),
                    );
                }
            }
        }
        let mut sorted_roots = roots.clone();
        sorted_roots.sort();
        sorted_roots.dedup();
        if sorted_roots.len() != roots.len() {
            return bad("columns", "a column is named twice".into());
        }
        // Decoded batches hold the projected columns in schema order.
        let projected = schema
            .project(&sorted_roots)
            .map_err(|e| LoaderError::BadOption {
                option: "columns",
                reason: e.to_string(),
            })?;
        let plans = plan_columns(&projected, &names)?;

        // Memory: the permits bound row groups fetched or decoded but not yet
        // collated. The collator holds the windows a batch touches: every row
        // group of the batch's rows plus the rest of its first and last windows.
        let units = manifest.row_group_count().max(1) as u64;
        let unit_bytes = (manifest.input_bytes.max(manifest.total_bytes) / units).max(1);
        let min_group_rows = manifest
            .shards
            .iter()
            .flat_map(|s| s.row_groups.iter().copied())
            .filter(|&r| r > 0)
            .min()
            .unwrap_or(1);
        let batch_groups = (self.batch_size as u64).div_ceil(min_group_rows) + 1;
        let needed = (2 * self.window as u64 + batch_groups.saturating_sub(1))
            .min(units.max(2 * self.window as u64));
        // Beyond what must be held: one more window, so decoding runs a window
        // ahead of the one the shuffle stage assembles instead of idling at
        // each window boundary (the budget still caps it).
        let permits = (self.byte_budget / unit_bytes)
            .min(needed + self.window as u64 + 2 * decode_threads as u64);
        if permits < needed {
            return bad(
                "byte_budget",
                format!(
                    "{} bytes cannot hold the {needed} row groups (~{} bytes each) that two shuffle windows of {} row groups and a batch of {} rows touch; raise it, or lower window or batch_size",
                    self.byte_budget, unit_bytes, self.window, self.batch_size
                ),
            );
        }

        let counters = Arc::new(Counters::default());
        let cache = match (&self.cache_dir, location.local_root()) {
            (Some(dir), None) => Some(
                ShardCache::new(
                    dir,
                    &format!("{}|{}", location.url(), fingerprint(&manifest)),
                    self.cache_limit,
                )
                .map_err(|source| LoaderError::Io {
                    op: format!("create the cache folder {}", dir.display()),
                    source,
                })?,
            ),
            _ => None,
        };
        let fetch = Arc::new(FetchContext::new(
            location.clone(),
            manifest.clone(),
            sorted_roots,
            counters.clone(),
            self.retry.clone(),
            cache,
        ));
        let slab_bytes = match self.slab_bytes {
            Some(b) => b,
            None => estimate_slab_bytes(
                &runtime,
                &fetch,
                &manifest,
                self.batch_size,
                &self.list_mode,
                &plans,
            )?,
        };
        let pool = Arc::new(Pool::new(
            self.prefetch_batches + 3,
            slab_bytes,
            self.pinning,
        )?);
        Ok(Loader {
            config: Arc::new(Config {
                batch_size: self.batch_size,
                shuffle: self.shuffle,
                seed: self.seed,
                window: self.window,
                rank,
                world_size,
                drop_last: self.drop_last,
                decode_threads,
                io_concurrency: self.io_concurrency,
                prefetch_batches: self.prefetch_batches,
                list_mode: self.list_mode,
                fixed_width: plans.iter().all(ColumnPlan::is_fixed_width),
                plans,
            }),
            manifest,
            fetch,
            runtime: Arc::new(runtime),
            pool,
            counters,
            held: Arc::new(AtomicUsize::new(0)),
            epoch: self.epoch,
            position: 0,
            running: None,
            next_pass: None,
            permits: Arc::new(Semaphore::new(permits as usize)),
            started: None,
        })
    }
}

/// Slab size: twice the expected bytes of a batch of the projected columns,
/// from the first shard's footer.
fn estimate_slab_bytes(
    runtime: &tokio::runtime::Runtime,
    fetch: &Arc<FetchContext>,
    manifest: &Manifest,
    batch_size: usize,
    list_mode: &ListMode,
    plans: &[ColumnPlan],
) -> Result<usize> {
    let columns = plans.len();
    let overhead: usize = plans.iter().map(|p| p.overhead_bytes(batch_size)).sum();
    let Some(first) = manifest.shards.iter().position(|s| s.rows > 0) else {
        return Ok(64 << 10);
    };
    let footer = runtime.block_on(fetch.footer(first as u32))?;
    let (leaves, _) = projection(&footer.arrow, &fetch.roots);
    let meta = &footer.footer.metadata;
    // Parquet's uncompressed sizes are of encoded pages (dictionaries, bit
    // packing); scale the dataset's Arrow bytes per row by the projected share.
    let (mut projected, mut all) = (0i64, 0i64);
    for g in meta.row_groups() {
        for (i, c) in g.columns().iter().enumerate() {
            all += c.uncompressed_size();
            if leaves.contains(&i) {
                projected += c.uncompressed_size();
            }
        }
    }
    let arrow_per_row = manifest.input_bytes as f64 / manifest.total_rows.max(1) as f64;
    let per_row = (arrow_per_row * projected.max(0) as f64 / all.max(1) as f64).ceil() as usize;
    let padded = match list_mode {
        ListMode::Padded { to, .. } => to * 8 * columns,
        ListMode::Ragged => 0,
    };
    Ok((2 * batch_size * (per_row + padded) + overhead).max(64 << 10))
}

/// The options every epoch of a loader shares.
#[derive(Debug)]
struct Config {
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    window: usize,
    rank: u64,
    world_size: u64,
    drop_last: bool,
    decode_threads: usize,
    io_concurrency: usize,
    prefetch_batches: usize,
    list_mode: ListMode,
    plans: Vec<ColumnPlan>,
    /// Every projected column is fixed width.
    fixed_width: bool,
}

/// Where a loader is: enough to continue exactly there in a new process.
/// Serialized as JSON it is well under 1 KB.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// State format version.
    pub version: u32,
    /// The shuffle seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// Rows of this epoch already yielded to the consumer.
    pub position: u64,
    /// The rank.
    pub rank: u64,
    /// The number of ranks.
    pub world_size: u64,
    /// Rows per batch.
    pub batch_size: usize,
    /// Whether rows are shuffled.
    pub shuffle: bool,
    /// Row groups per shuffle window.
    pub window: usize,
    /// Identifies the dataset: total rows, shards, and the first shard's checksum.
    pub dataset: String,
}

impl LoaderState {
    /// JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a state always serializes")
    }

    /// Parse JSON written by [`LoaderState::to_json`].
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| LoaderError::BadState {
            reason: e.to_string(),
        })
    }
}

fn fingerprint(manifest: &Manifest) -> String {
    format!(
        "{}:{}:{}",
        manifest.total_rows,
        manifest.shards.len(),
        manifest
            .shards
            .first()
            .map(|s| s.crc32.to_string())
            .unwrap_or_default()
    )
}

/// A running epoch: the threads and channels of one pass.
struct Running {
    epoch: u64,
    output: Receiver<Result<Batch>>,
    cancel: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    fetch_task: tokio::task::JoinHandle<()>,
    next_index: u64,
    batches: u64,
    /// Set when the shuffle stage has assembled the pass's last window:
    /// fetching and decoding are over, only collation remains.
    assembled_all: Arc<AtomicBool>,
    /// Disconnected when this pass's collator has finished.
    collated: Receiver<()>,
}

impl Running {
    fn stop(mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.fetch_task.abort();
        // Unblock a collator waiting to hand over a batch.
        let output = std::mem::replace(&mut self.output, crossbeam_channel::never());
        drop(output);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Streams a dataset as batches: see the crate documentation.
pub struct Loader {
    config: Arc<Config>,
    manifest: Arc<Manifest>,
    fetch: Arc<FetchContext>,
    runtime: Arc<tokio::runtime::Runtime>,
    pool: Arc<Pool>,
    counters: Arc<Counters>,
    held: Arc<AtomicUsize>,
    epoch: u64,
    /// Rows of the current epoch yielded so far (or to start from).
    position: u64,
    running: Option<Running>,
    /// The next epoch's pass, started (from its beginning) once the current
    /// pass's last window is assembled, so the epoch boundary costs no wait.
    next_pass: Option<Running>,
    /// Row groups fetched or decoded but not yet collated, over every pass.
    permits: Arc<Semaphore>,
    started: Option<Instant>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// Start configuring a loader for the dataset at `url`.
    pub fn builder(url: &str) -> LoaderBuilder {
        LoaderBuilder::new(url)
    }

    /// The dataset's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// How the pool's slabs were allocated.
    pub fn pinning(&self) -> Pinning {
        self.pool.pinning()
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Move to `epoch`, from its start. Stops a pass in progress (a pass of
    /// `epoch` that has not yielded a batch yet, such as the one started ahead
    /// at the end of the previous epoch, is kept).
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch == self.epoch && self.position == 0 {
            return;
        }
        self.stop();
        self.epoch = epoch;
        self.position = 0;
    }

    fn plan(&self, epoch: u64) -> EpochPlan {
        let c = &self.config;
        EpochPlan::new(
            &self.manifest,
            PlanOptions {
                seed: c.seed,
                epoch,
                rank: c.rank,
                world_size: c.world_size,
                shuffle: c.shuffle,
                window: c.window,
                batch_size: c.batch_size,
                drop_last: c.drop_last,
            },
        )
    }

    /// Batches per epoch for this rank (the same on every rank).
    pub fn len(&self) -> u64 {
        self.plan(self.epoch).batches()
    }

    /// Whether an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the loader is now; pass it to [`Loader::resume`] to continue.
    pub fn state(&self) -> LoaderState {
        let c = &self.config;
        LoaderState {
            version: 1,
            seed: c.seed,
            epoch: self.epoch,
            position: self.position,
            rank: c.rank,
            world_size: c.world_size,
            batch_size: c.batch_size,
            shuffle: c.shuffle,
            window: c.window,
            dataset: fingerprint(&self.manifest),
        }
    }

    /// Continue exactly where `state` was taken: the next batch is the one
    /// that followed it. Nothing before the state's shuffle window is read.
    pub fn resume(&mut self, state: &LoaderState) -> Result<()> {
        let c = &self.config;
        let mismatch = |what: &str, a: String, b: String| {
            Err(LoaderError::BadState {
                reason: format!("the state has {what} {a} but this loader has {b}"),
            })
        };
        if state.version != 1 {
            return mismatch("version", state.version.to_string(), "1".into());
        }
        if state.dataset != fingerprint(&self.manifest) {
            return mismatch(
                "dataset",
                state.dataset.clone(),
                fingerprint(&self.manifest),
            );
        }
        for (what, a, b) in [
            ("seed", state.seed, c.seed),
            ("rank", state.rank, c.rank),
            ("world_size", state.world_size, c.world_size),
            ("batch_size", state.batch_size as u64, c.batch_size as u64),
            ("window", state.window as u64, c.window as u64),
            ("shuffle", state.shuffle as u64, c.shuffle as u64),
        ] {
            if a != b {
                return mismatch(what, a.to_string(), b.to_string());
            }
        }
        self.stop();
        self.epoch = state.epoch;
        self.position = state.position;
        Ok(())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.counters.snapshot();
        s.output_queue = self.running.as_ref().map_or(0, |r| r.output.len() as u64);
        s.pinning = self.pool.pinning().name().to_string();
        s.slabs = self.pool.size();
        s.slab_bytes = self.pool.slab_bytes();
        s
    }

    /// Stop the pass in progress: cancel I/O and join every thread.
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
        if let Some(r) = self.next_pass.take() {
            r.stop();
        }
    }

    fn start(&mut self) {
        let pass = self.launch(self.epoch, self.position, None);
        self.running = Some(pass);
    }

    /// Start the pass of `epoch` from row `position`; its collator begins
    /// once `after` disconnects (the previous pass's collator is done).
    fn launch(&self, epoch: u64, position: u64, after: Option<Receiver<()>>) -> Running {
        let plan = Arc::new(self.plan(epoch));
        let config = self.config.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let start_position = position.min(plan.positions());
        let start_window = if plan.window_count() == 0 || start_position >= plan.positions() {
            plan.window_count()
        } else {
            plan.window_of(start_position)
        };
        let first_seq = if start_window < plan.window_count() {
            plan.window(start_window).first_segment as u64
        } else {
            plan.segments().len() as u64
        };
        let segments: Vec<(u64, crate::plan::Segment)> = plan
            .segments()
            .iter()
            .enumerate()
            .skip(first_seq as usize)
            .map(|(i, s)| (i as u64, *s))
            .collect();

        let (fetched_tx, fetched_rx) = tokio::sync::mpsc::channel::<
            Result<(Fetched, OwnedSemaphorePermit)>,
        >(2 * config.decode_threads);
        let fetched_rx = Arc::new(Mutex::new(fetched_rx));
        let (decoded_tx, decoded_rx) = unbounded::<Decoded>();
        let (output_tx, output_rx) = bounded::<Result<Batch>>(config.prefetch_batches);

        let fetch = self.fetch.clone();
        let semaphore = self.permits.clone();
        let io_concurrency = config.io_concurrency;
        let counters = self.counters.clone();
        let fetch_task = self.runtime.spawn(async move {
            let mut results = futures::stream::iter(segments)
                .map(|(seq, segment)| {
                    let fetch = fetch.clone();
                    let semaphore = semaphore.clone();
                    async move {
                        let permit = semaphore.acquire_owned().await.expect("never closed");
                        fetch.fetch(seq, segment).await.map(|f| (f, permit))
                    }
                })
                .buffered(io_concurrency);
            while let Some(result) = results.next().await {
                let failed = result.is_err();
                Counters::add(&counters.decode_queue, 1);
                if fetched_tx.send(result).await.is_err() || failed {
                    return;
                }
            }
        });

        let mut threads = Vec::new();
        for i in 0..config.decode_threads {
            let rx = fetched_rx.clone();
            let tx = decoded_tx.clone();
            let manifest = self.manifest.clone();
            let roots = self.fetch.roots.clone();
            let counters = self.counters.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("shardfeed-decode-{i}"))
                    .spawn(move || decode_loop(rx, tx, manifest, roots, counters))
                    .expect("spawn a decode thread"),
            );
        }
        drop(decoded_tx);
        // One assembled window queued ahead of the collator: the shuffle stage
        // works up to two windows ahead, which absorbs a slow window (its
        // permuted windows hold their row groups' budget, so the byte budget
        // still bounds it).
        let (windows_tx, windows_rx) = bounded::<Result<LoadedWindow>>(1);
        let assembled_all = Arc::new(AtomicBool::new(false));
        {
            let assembled = assembled_all.clone();
            let mut shuffler = Shuffler {
                config: config.clone(),
                plan: plan.clone(),
                decoded: decoded_rx,
                waiting: BTreeMap::new(),
                counters: self.counters.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name("shardfeed-shuffle".into())
                    .spawn(move || shuffler.run(start_window, windows_tx, &assembled))
                    .expect("spawn the shuffle thread"),
            );
        }
        let collated;
        {
            let mut collator = Collator {
                config,
                plan: plan.clone(),
                windows_in: windows_rx,
                windows: Vec::new(),
                pool: self.pool.clone(),
                counters: self.counters.clone(),
                cancel: cancel.clone(),
                held: self.held.clone(),
            };
            let (collated_tx, collated_rx) = bounded::<()>(0);
            let cancel = cancel.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("shardfeed-collate".into())
                    .spawn(move || {
                        if let Some(after) = after {
                            // Slabs go to the previous pass's batches first.
                            while !cancel.load(Ordering::SeqCst)
                                && matches!(
                                    after.recv_timeout(Duration::from_millis(20)),
                                    Err(RecvTimeoutError::Timeout)
                                )
                            {}
                        }
                        collator.run(start_position, output_tx);
                        drop(collated_tx);
                    })
                    .expect("spawn the collate thread"),
            );
            collated = collated_rx;
        }
        let batch_size = self.config.batch_size as u64;
        Running {
            epoch,
            output: output_rx,
            cancel,
            threads,
            fetch_task,
            next_index: start_position / batch_size,
            batches: plan.batches(),
            assembled_all,
            collated,
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    /// The next batch of the current epoch; `None` at its end, after which
    /// the next call starts the following epoch.
    fn next(&mut self) -> Option<Result<Batch>> {
        self.next_interruptible(|| false)
    }
}

impl Loader {
    /// [`Iterator::next`] that calls `interrupted` about every 20 ms while it
    /// waits for a batch; when that returns `true` it gives up the wait with
    /// [`LoaderError::Interrupted`] and the pass goes on: the next call
    /// returns the batch that was awaited. Bindings use it to deliver Ctrl-C.
    pub fn next_interruptible(
        &mut self,
        mut interrupted: impl FnMut() -> bool,
    ) -> Option<Result<Batch>> {
        if self.running.is_none() {
            self.started.get_or_insert_with(Instant::now);
            self.start();
        }
        let waited = Instant::now();
        let running = self.running.as_mut().expect("started above");
        let mut exhausted_since: Option<Instant> = None;
        let result = loop {
            if running.next_index >= running.batches {
                break None;
            }
            match running.output.recv_timeout(Duration::from_millis(20)) {
                Ok(item) => break Some(item),
                Err(RecvTimeoutError::Disconnected) => break None,
                Err(RecvTimeoutError::Timeout) => {
                    if interrupted() {
                        break Some(Err(LoaderError::Interrupted));
                    }
                    if self.held.load(Ordering::SeqCst) < self.pool.size() {
                        exhausted_since = None;
                    } else if exhausted_since.get_or_insert_with(Instant::now).elapsed()
                        >= Duration::from_millis(100)
                    {
                        // Held for 100 ms: not a batch being dropped right now.
                        break Some(Err(LoaderError::PoolExhausted {
                            slabs: self.pool.size(),
                        }));
                    }
                }
            }
        };
        Counters::add_time(&self.counters.wait_ns, waited.elapsed());
        match result {
            Some(Ok(batch)) => {
                if self.next_pass.is_none()
                    && let Some(r) = &self.running
                    && r.assembled_all.load(Ordering::SeqCst)
                {
                    // Everything of this epoch is decoded: start fetching and
                    // decoding the next one while the last window is collated
                    // (within the same permits), so the boundary costs no wait.
                    let after = r.collated.clone();
                    self.next_pass = Some(self.launch(r.epoch + 1, 0, Some(after)));
                }
                let running = self.running.as_mut().expect("running");
                running.next_index += 1;
                self.position = (self.position + batch.rows() as u64)
                    .max(batch.index() * self.config.batch_size as u64 + batch.rows() as u64);
                if self.counters.first_batch_ns.load(Ordering::Relaxed) == 0
                    && let Some(t) = self.started
                {
                    Counters::add_time(&self.counters.first_batch_ns, t.elapsed());
                }
                Counters::add(&self.counters.batches, 1);
                Counters::add(&self.counters.rows, batch.rows() as u64);
                let bytes: usize = batch
                    .columns()
                    .iter()
                    .flat_map(|c| c.buffers())
                    .map(|(_, b)| b.bytes())
                    .sum();
                Counters::add(&self.counters.bytes, bytes as u64);
                Some(Ok(batch))
            }
            Some(Err(e)) => {
                if !matches!(
                    e,
                    LoaderError::PoolExhausted { .. } | LoaderError::Interrupted
                ) {
                    self.stop();
                }
                Some(Err(e))
            }
            None => {
                // The epoch is over: the next call continues with the
                // following one, already under way.
                if let Some(r) = self.running.take() {
                    r.stop();
                }
                self.epoch += 1;
                self.position = 0;
                self.running = self.next_pass.take().filter(|p| p.epoch == self.epoch);
                None
            }
        }
    }
}

/// A decoded segment, or the error that stopped the pipeline.
type Decoded = (u64, Result<Vec<RecordBatch>>, Option<OwnedSemaphorePermit>);

type FetchedRx = Arc<Mutex<tokio::sync::mpsc::Receiver<Result<(Fetched, OwnedSemaphorePermit)>>>>;

fn decode_loop(
    rx: FetchedRx,
    tx: Sender<Decoded>,
    manifest: Arc<Manifest>,
    roots: Vec<usize>,
    counters: Arc<Counters>,
) {
    loop {
        let next = rx.lock().expect("fetch receiver").blocking_recv();
        let Some(item) = next else { return };
        counters.decode_queue.fetch_sub(1, Ordering::Relaxed);
        let started = Instant::now();
        let (seq, result, permit) = match item {
            Ok((fetched, permit)) => {
                let seq = fetched.seq;
                let entry = &manifest.shards[fetched.segment.shard as usize];
                (seq, decode(fetched, entry, &roots), Some(permit))
            }
            Err(e) => (u64::MAX, Err(e), None),
        };
        Counters::add_time(&counters.decode_busy_ns, started.elapsed());
        let failed = result.is_err();
        if tx.send((seq, result, permit)).is_err() || failed {
            return;
        }
    }
}

/// A window's decoded rows, held while they are collated.
struct LoadedWindow {
    index: usize,
    batches: Vec<RecordBatch>,
    /// Cumulative rows before each batch.
    prefix: Vec<u64>,
    /// Whether `batches` is one batch already in the window's shuffled order.
    permuted: bool,
    _permits: Vec<OwnedSemaphorePermit>,
}

/// The shuffle stage: assembles each window from decoded segments (in plan
/// order) and, for fixed-width columns, materialises it in shuffled order,
/// one window ahead of the collator.
struct Shuffler {
    config: Arc<Config>,
    plan: Arc<EpochPlan>,
    decoded: Receiver<Decoded>,
    waiting: BTreeMap<u64, (Vec<RecordBatch>, Option<OwnedSemaphorePermit>)>,
    counters: Arc<Counters>,
}

impl Shuffler {
    fn run(
        &mut self,
        first_window: usize,
        output: Sender<Result<LoadedWindow>>,
        assembled_all: &AtomicBool,
    ) {
        let count = self.plan.window_count();
        if first_window >= count {
            assembled_all.store(true, Ordering::SeqCst);
        }
        for index in first_window..count {
            let result = self.load(index);
            if index + 1 == count && result.is_ok() {
                assembled_all.store(true, Ordering::SeqCst);
            }
            let failed = result.is_err();
            if output.send(result).is_err() || failed {
                return;
            }
        }
    }

    /// Receive decoded segments until every segment of window `index` is here.
    fn load(&mut self, index: usize) -> Result<LoadedWindow> {
        let window = self.plan.window(index);
        let first = window.first_segment as u64;
        let count = window.segments.len() as u64;
        let mut batches = Vec::with_capacity(count as usize);
        let mut permits = Vec::with_capacity(count as usize);
        let mut prefix = Vec::with_capacity(count as usize + 1);
        prefix.push(0);
        for seq in first..first + count {
            let (decoded, permit) = loop {
                if let Some(found) = self.waiting.remove(&seq) {
                    break found;
                }
                match self.decoded.recv() {
                    Ok((_, Err(e), _)) => return Err(e),
                    Ok((s, Ok(decoded), permit)) => {
                        self.waiting.insert(s, (decoded, permit));
                    }
                    Err(_) => return Err(LoaderError::Closed),
                }
            };
            for batch in decoded {
                prefix.push(prefix.last().expect("non-empty") + batch.num_rows() as u64);
                batches.push(batch);
            }
            permits.extend(permit);
        }
        if self.config.shuffle && self.config.fixed_width && window.rows > 0 {
            // Fixed-width columns only (variable-length rows are large contiguous
            // copies that gain nothing and would be copied twice):
            // materialise the window in shuffled order, one column at a time
            // (dictionary columns: their keys only): each column's random reads
            // stay within that column's data (cache-resident), where gathering
            // batch by batch would sweep every column of the whole window for
            // each batch. Batches are then contiguous slices.
            let started = Instant::now();
            let order = window.rows();
            let permuted = crate::collate::permute(&batches, &order, index)?;
            batches.clear();
            Counters::add_time(&self.counters.shuffle_busy_ns, started.elapsed());
            // The permuted window keeps its row groups' budget until the
            // collator is done with it: the budget bounds decoded and permuted
            // windows together.
            return Ok(LoadedWindow {
                index,
                prefix: vec![0, permuted.num_rows() as u64],
                batches: vec![permuted],
                permuted: true,
                _permits: permits,
            });
        }
        Ok(LoadedWindow {
            index,
            batches,
            prefix,
            permuted: false,
            _permits: permits,
        })
    }
}

/// The collate stage: gathers each batch's rows into a slab.
struct Collator {
    config: Arc<Config>,
    plan: Arc<EpochPlan>,
    windows_in: Receiver<Result<LoadedWindow>>,
    windows: Vec<LoadedWindow>,
    pool: Arc<Pool>,
    counters: Arc<Counters>,
    cancel: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
}

impl Collator {
    /// Make sure window `index` is loaded (windows arrive in order).
    fn load(&mut self, index: usize) -> Result<()> {
        while !self.windows.iter().any(|w| w.index == index) {
            match self.windows_in.recv() {
                Ok(window) => self.windows.push(window?),
                Err(_) => return Err(LoaderError::Closed),
            }
        }
        Ok(())
    }

    fn run(&mut self, start: u64, output: Sender<Result<Batch>>) {
        let positions = self.plan.positions();
        let batch_size = self.config.batch_size as u64;
        let mut position = start;
        while position < positions {
            let index = position / batch_size;
            let end = ((index + 1) * batch_size).min(positions);
            let result = self.collate(index, position, end);
            let failed = result.is_err();
            if let Err(LoaderError::Closed) = result {
                return;
            }
            if output.send(result).is_err() || failed {
                return;
            }
            position = end;
        }
    }

    fn collate(&mut self, index: u64, start: u64, end: u64) -> Result<Batch> {
        // Row references: (source batch among the loaded windows, row).
        let mut rows = Vec::with_capacity((end - start) as usize);
        let first_window = self.plan.window_of(start);
        // Windows before the batch's first one are done: release them.
        self.windows.retain(|w| w.index >= first_window);
        let mut position = start;
        while position < end {
            let w = self.plan.window_of(position);
            self.load(w)?;
            let window = self.plan.window(w);
            let run_end = end.min(window.start + window.rows);
            let loaded_at = self
                .windows
                .iter()
                .position(|l| l.index == w)
                .expect("loaded above");
            let base: usize = self.windows[..loaded_at]
                .iter()
                .map(|l| l.batches.len())
                .sum();
            let loaded = &self.windows[loaded_at];
            for p in position..run_end {
                let row = if loaded.permuted {
                    p - window.start
                } else {
                    window.row_at(p - window.start)
                };
                let segment = loaded.prefix.partition_point(|&x| x <= row) - 1;
                rows.push((
                    (base + segment) as u32,
                    (row - loaded.prefix[segment]) as u32,
                ));
            }
            position = run_end;
        }
        let started = Instant::now();
        let sources: Vec<&RecordBatch> =
            self.windows.iter().flat_map(|w| w.batches.iter()).collect();
        let collation = Collation::new(&self.config.plans, self.config.list_mode, &sources);
        let (columns, bytes) = collation.layout(&rows);
        let mut lease = if bytes <= self.pool.slab_bytes() {
            self.pool.acquire(&self.cancel).ok_or(LoaderError::Closed)?
        } else {
            Counters::add(&self.counters.oversize_batches, 1);
            self.pool.oversize(bytes)?
        };
        let truncated = collation.write(&rows, &columns, lease.slab_mut().as_mut_slice());
        Counters::add(&self.counters.truncated_rows, truncated);
        Counters::add_time(&self.counters.collate_busy_ns, started.elapsed());
        let held = (!lease.is_oversize()).then(|| {
            self.held.fetch_add(1, Ordering::SeqCst);
            self.held.clone()
        });
        Ok(Batch {
            lease: Arc::new(lease),
            rows: rows.len(),
            columns,
            index,
            held,
        })
    }
}
