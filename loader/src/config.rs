//! The builder: every option, its default, and the checks that refuse a
//! configuration before anything runs (naming the option).

use shardfeed_format::failpoint::Failpoints;
use shardfeed_format::fault::FaultConfig;
use shardfeed_format::{Location, RetryPolicy};

use crate::columns::{ColumnPlan, ListMode};
use crate::error::{LoaderError, Result};
use crate::image::{Crop, ImageOptions};
use crate::pinned::PinningMode;

/// The most decode threads a loader starts (`threads`).
pub const MAX_THREADS: usize = 1024;

/// Default rows per batch.
pub const DEFAULT_BATCH_SIZE: usize = 256;
/// Default row groups per shuffle window of a dataset shuffled at shard time
/// (fewer, down to [`MIN_FITTED_WINDOW`], where the byte budget cannot hold
/// two windows of this many).
pub const DEFAULT_WINDOW: usize = 8;
/// The most row groups a window gets by default (a dataset written in input
/// order gets as many as a quarter of the byte budget holds, up to this).
pub const MAX_AUTO_WINDOW: usize = 256;
/// The smallest shuffle window chosen to fit a dataset shuffled at shard
/// time into the byte budget (see [`DEFAULT_WINDOW`]).
pub const MIN_FITTED_WINDOW: usize = 2;
/// A dataset written in input order whose windows mix fewer row groups than
/// this (or than it has) gets a warning.
pub const MIXED_ROW_GROUPS: u64 = 64;
/// Default concurrent storage requests.
pub const DEFAULT_IO_CONCURRENCY: usize = 8;
/// The most batches collated ahead of the consumer by default.
pub const DEFAULT_PREFETCH_BATCHES: usize = 16;
/// Bytes of batches collated ahead by default: as many batches as this
/// holds, 2 to [`DEFAULT_PREFETCH_BATCHES`] (16 batches of 256 images of
/// 100 KB would be 400 MB of slabs the first epoch pays for, page by page).
pub const DEFAULT_PREFETCH_BYTES: u64 = 128 << 20;
/// Default size limit of the local cache of remote shards: 64 GiB.
pub const DEFAULT_CACHE_LIMIT: u64 = 64 << 30;
/// Default bytes of fetched and decoded row groups held at once.
pub const DEFAULT_BYTE_BUDGET: u64 = 1 << 30;
/// An epoch's first window of a dataset shuffled at shard time (with more
/// row groups per rank than its heads take) is served as the first
/// `1/FIRST_SLICES` of a few of its row groups, then the rest. A slice's
/// decode usually decodes the whole first page of each column, which the
/// rest of its row group decodes again: only the few row groups sliced for
/// the first two batches. Measured on a 4.5-window token epoch (Intel Xeon,
/// 2 vCPUs): first batch 7-16 ms against 93-126, steady rows/s within 1%
/// (noise); on epochs of one window or less (4 and 12 row groups) 7-10 ms
/// against 34-104, and a three-source mixture's first batch 34-41 ms
/// against 211-259 (docs/performance-notes.md).
pub const FIRST_SLICES: u32 = 8;
/// Default of [`LoaderBuilder::decode_niceness`]. Measured on the 40-column
/// tabular set of docs/performance-notes.md with 2 decode threads on 2 cores: nice 0 /
/// 3 / 6 gave 1.76 / 1.86 / 1.90 cores busy and 6 epochs in 5.9 / 5.7 /
/// 5.3 s (mean of four runs); tokens and images within noise.
pub const DEFAULT_DECODE_NICENESS: u8 = 6;
/// Default row groups that may be skipped with [`OnError::Skip`].
pub const DEFAULT_MAX_SKIPPED: u64 = 10;
/// Default of [`LoaderBuilder::slow_warning`]: a warning when the consumer
/// waited for more than a quarter of the time over 500 batches.
pub const DEFAULT_SLOW_WARNING: (f64, u64) = (0.25, 500);

/// What the loader does with a row group whose bytes are damaged (a
/// checksum mismatch, or data the decoders refuse).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnError {
    /// Fail: `next()` returns the error (the default).
    #[default]
    Fail,
    /// Leave the row group's rows out (the batches that held them are
    /// shorter), name it in [`Stats::skipped`](crate::Stats::skipped) and a
    /// warning, and fail once more than `max_skipped` row groups were skipped.
    /// The same row groups are skipped on every rank and after a resume, and
    /// every other row is still yielded exactly once.
    Skip,
}

impl std::str::FromStr for OnError {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fail" => Ok(OnError::Fail),
            "skip" => Ok(OnError::Skip),
            other => Err(LoaderError::BadOption {
                option: "on_error",
                reason: format!("{other:?} is not one of fail, skip"),
            }),
        }
    }
}

/// Configures and builds a [`Loader`](crate::Loader). Every setter is optional.
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
#[derive(Clone)]
pub struct LoaderBuilder {
    pub(crate) url: String,
    pub(crate) location: Option<Location>,
    pub(crate) storage_options: Vec<(String, String)>,
    pub(crate) batch_size: usize,
    pub(crate) columns: Option<Vec<String>>,
    pub(crate) shuffle: bool,
    pub(crate) seed: u64,
    pub(crate) window: Option<usize>,
    /// An index's parts (rows), when taken from a state rather than from the
    /// budget ([`crate::FeedBuilder::with_order_of`]); `Some(0)`: whole row
    /// groups.
    pub(crate) part_rows: Option<u64>,
    pub(crate) epoch: u64,
    pub(crate) rank: Option<u64>,
    pub(crate) world_size: Option<u64>,
    pub(crate) drop_last: bool,
    pub(crate) decode_threads: usize,
    pub(crate) decode_niceness: u8,
    pub(crate) io_concurrency: Option<usize>,
    pub(crate) io_threads: usize,
    /// An I/O runtime shared with other loaders (a mixture's sources); else
    /// the loader starts its own with `io_threads` workers.
    pub(crate) runtime: Option<std::sync::Arc<tokio::runtime::Runtime>>,
    pub(crate) prefetch_batches: Option<usize>,
    pub(crate) transform_slabs: usize,
    /// [`LoaderBuilder::shared_slabs`].
    pub(crate) shared_slabs: bool,
    pub(crate) byte_budget: u64,
    pub(crate) pinning: PinningMode,
    pub(crate) list_mode: ListMode,
    pub(crate) slab_bytes: Option<usize>,
    pub(crate) retry: RetryPolicy,
    pub(crate) cache_dir: Option<std::path::PathBuf>,
    pub(crate) cache_limit: u64,
    pub(crate) mapped_reads: bool,
    pub(crate) faults: Option<FaultConfig>,
    pub(crate) on_error: OnError,
    pub(crate) max_skipped: u64,
    pub(crate) failpoints: Option<String>,
    pub(crate) trace: Option<std::path::PathBuf>,
    pub(crate) slow_warning: Option<(f64, u64)>,
    /// [`LoaderBuilder::filter`], [`LoaderBuilder::map_rows`],
    /// [`LoaderBuilder::map_batch`].
    pub(crate) steps: crate::map::Steps,
    /// [`LoaderBuilder::row_ids`].
    pub(crate) row_ids: bool,
    /// A mixture's source: keep the final partial batch (see
    /// [`crate::plan::PlanOptions::keep_partial`]).
    pub(crate) keep_partial: bool,
    pub(crate) images: ImageOptions,
    /// A packing mixture's source: hand its rows on uncollated where it can
    /// ([`crate::collate::Handoff`]).
    pub(crate) handoff: bool,
    /// A mixture's source: its share of the mixture's rows, which sizes its
    /// default window where it was shuffled at shard time
    /// ([`crate::budget::shared_window`]).
    pub(crate) window_share: Option<f64>,
}

impl std::fmt::Debug for LoaderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoaderBuilder")
            .field("url", &shardfeed_format::redact::url(&self.url))
            // Keys only: values may be secrets.
            .field(
                "storage_options",
                &self
                    .storage_options
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>(),
            )
            .field("batch_size", &self.batch_size)
            .field("columns", &self.columns)
            .field("shuffle", &self.shuffle)
            .field("seed", &self.seed)
            .field("window", &self.window)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("byte_budget", &self.byte_budget)
            .field("on_error", &self.on_error)
            .finish_non_exhaustive()
    }
}

pub(crate) fn env_u64(name: &str) -> Result<Option<u64>> {
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
    pub(crate) fn new(url: &str) -> Self {
        LoaderBuilder {
            url: url.to_string(),
            location: None,
            storage_options: Vec::new(),
            batch_size: DEFAULT_BATCH_SIZE,
            columns: None,
            shuffle: true,
            seed: 0,
            window: None,
            part_rows: None,
            epoch: 0,
            rank: None,
            world_size: None,
            drop_last: true,
            decode_threads: 0,
            decode_niceness: DEFAULT_DECODE_NICENESS,
            io_concurrency: None,
            io_threads: 2,
            runtime: None,
            prefetch_batches: None,
            transform_slabs: 0,
            shared_slabs: false,
            byte_budget: DEFAULT_BYTE_BUDGET,
            pinning: PinningMode::Auto,
            list_mode: ListMode::Ragged,
            slab_bytes: None,
            retry: RetryPolicy::default(),
            cache_dir: None,
            cache_limit: DEFAULT_CACHE_LIMIT,
            mapped_reads: true,
            faults: None,
            on_error: OnError::Fail,
            max_skipped: DEFAULT_MAX_SKIPPED,
            failpoints: None,
            trace: None,
            slow_warning: Some(DEFAULT_SLOW_WARNING),
            steps: Default::default(),
            row_ids: false,
            keep_partial: false,
            images: ImageOptions::default(),
            handoff: false,
            window_share: None,
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
    /// Failpoints of the pipeline stages, for tests (see
    /// [`shardfeed_format::failpoint`]); by default the `SHARDFEED_FAILPOINTS`
    /// environment variable's.
    #[doc(hidden)]
    pub fn failpoints(mut self, spec: impl Into<String>) -> Self {
        self.failpoints = Some(spec.into());
        self
    }
    /// An option for the object store's builder (credentials, endpoint, ...).
    pub fn storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage_options.push((key.into(), value.into()));
        self
    }
    /// Run `f` on every batch, on the collate thread, right after the batch
    /// is laid out in its slab and before the consumer gets it: in place
    /// ([`crate::BatchMut::values_mut`]), with a [`crate::BatchRng`] seeded
    /// from (seed, epoch, rank, batch index), so its draws are the same for
    /// any number of threads and after a resume. An error (or a panic) ends
    /// the epoch with an error from `next()` naming the batch. A mixture
    /// runs it on its own batches, after blending and packing.
    ///
    /// ```no_run
    /// # use shardfeed_loader::Loader;
    /// let loader = Loader::builder("/data/ds")
    ///     .batch_size(64)
    ///     .map_batch(|batch, rng| {
    ///         let noise = rng.next_f64() as f32;
    ///         for x in batch.values_mut::<f32>("x").ok_or("no f32 column x")? {
    ///             *x += noise;
    ///         }
    ///         Ok(())
    ///     })
    ///     .build()?;
    /// # Ok::<(), shardfeed_loader::LoaderError>(())
    /// ```
    pub fn map_batch<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut crate::BatchMut<'_>, &mut crate::BatchRng) -> Result<(), crate::MapError>
            + Send
            + Sync
            + 'static,
    {
        self.steps.batch = Some(std::sync::Arc::new(f));
        self
    }

    /// Run `f` on each row of each batch after the filter (if any) and
    /// before [`LoaderBuilder::map_batch`], on the collate thread, in
    /// place ([`crate::RowMut::values_mut`]), with a [`crate::BatchRng`]
    /// seeded from (seed, epoch, the row's shard, row group and row): a
    /// row's draws are the same for any number of threads, after a resume
    /// and after an elastic resume onto another number of ranks. An error
    /// (or a panic) ends the epoch with an error from `next()` naming the
    /// batch and the row. A mixture runs it on its own batches, each row's
    /// generator then seeded from (rank, batch index, position).
    ///
    /// ```no_run
    /// # use shardfeed_loader::Loader;
    /// let loader = Loader::builder("/data/ds")
    ///     .map_rows(|row, rng| {
    ///         // Mask one token in ten of each row, drawn for that row.
    ///         for id in row.values_mut::<i32>("input_ids").ok_or("no input_ids")? {
    ///             if rng.below(10) == 0 {
    ///                 *id = 0;
    ///             }
    ///         }
    ///         Ok(())
    ///     })
    ///     .build()?;
    /// # Ok::<(), shardfeed_loader::LoaderError>(())
    /// ```
    pub fn map_rows<F>(mut self, f: F) -> Self
    where
        F: Fn(&mut crate::RowMut<'_>, &mut crate::BatchRng) -> Result<(), crate::MapError>
            + Send
            + Sync
            + 'static,
    {
        self.steps.rows = Some(std::sync::Arc::new(f));
        self
    }

    /// Keep only the rows for which `f` is true, before
    /// [`LoaderBuilder::map_rows`] and [`LoaderBuilder::map_batch`], on the
    /// collate thread. Rows dropped leave their batch smaller: every rank
    /// keeps its number of batches per epoch (so ranks stay in step), no
    /// row is read twice, and the dropped rows are counted
    /// ([`crate::Stats::filtered_rows`]).
    ///
    /// ```no_run
    /// # use shardfeed_loader::Loader;
    /// let loader = Loader::builder("/data/ds")
    ///     .filter(|row| row.values::<i32>("input_ids").is_some_and(|ids| ids.len() >= 16))
    ///     .build()?;
    /// # Ok::<(), shardfeed_loader::LoaderError>(())
    /// ```
    pub fn filter<F>(mut self, f: F) -> Self
    where
        F: Fn(&crate::Row<'_>) -> bool + Send + Sync + 'static,
    {
        self.steps.filter = Some(std::sync::Arc::new(f));
        self
    }

    /// Give each batch its rows' origin ([`crate::Batch::row_ids`]: shard,
    /// row group, row), for provenance or per-row randomness that follows
    /// the row across ranks and resumes (the Python package seeds a
    /// `row_transform`'s generators from it). Off by default: it costs a
    /// lookup per row.
    pub fn row_ids(mut self, on: bool) -> Self {
        self.row_ids = on;
        self
    }

    /// Rows per batch (default 256).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = rows;
        self
    }
    /// Columns to read (default: all top-level columns). A field of a
    /// struct column is named by its path (`image.bytes`) and handed on as
    /// a column of its own, null where the struct is.
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
    /// Row groups per shuffle window: rows are permuted within a window, and
    /// a batch draws from its row groups. By default 8 for a dataset shuffled
    /// at shard time (its row groups are random samples already), and for a
    /// dataset written in input order as many as a quarter of the byte
    /// budget holds (at least 8, at most 256), so that sorted data (a
    /// class-sorted image folder, domains one after another) still gives
    /// batches that look random; raise `byte_budget` (or this) for more.
    /// A mixture's sources shuffled at shard time share the default's row
    /// groups by weight (sources weighted 0.6/0.3/0.1: 5, 2 and 2, at
    /// least 2; sources that hand their rows on uncollated, two thirds of
    /// them: one packed dataset reads windows of 5); given here, every
    /// source gets this window.
    pub fn window(mut self, row_groups: usize) -> Self {
        self.window = Some(row_groups);
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
    /// Drop the remainder rows (default true).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }
    /// Decode threads (default: all cores).
    pub fn decode_threads(mut self, threads: usize) -> Self {
        self.decode_threads = threads;
        self
    }
    /// How much lower the decode threads' scheduling priority is than that
    /// of the thread that starts each pass (a Linux nice increment, 0 to 19;
    /// default [`DEFAULT_DECODE_NICENESS`]; elsewhere ignored). The shuffle
    /// and collate stages are one thread each and every batch passes through
    /// them, while the decode threads work ahead in parallel: when cores are
    /// short, the single threads should get them first. Idle cores still run
    /// the decode threads at full speed; 0 schedules every stage alike.
    pub fn decode_niceness(mut self, niceness: u8) -> Self {
        self.decode_niceness = niceness;
        self
    }
    /// Storage requests in flight (default: 8 to object storage; reads of
    /// local files, twice as many as decode threads and at least 4, run by
    /// as many read threads as decode threads).
    pub fn io_concurrency(mut self, requests: usize) -> Self {
        self.io_concurrency = Some(requests);
        self
    }
    /// Worker threads of the I/O runtime (default 2).
    pub fn io_threads(mut self, threads: usize) -> Self {
        self.io_threads = threads;
        self
    }
    /// Batches collated ahead of the consumer (default: as many as
    /// [`DEFAULT_PREFETCH_BYTES`] hold, 2 to 16, and no more than a pool
    /// within 4x `byte_budget` holds).
    pub fn prefetch(mut self, batches: usize) -> Self {
        self.prefetch_batches = Some(batches);
        self
    }
    /// Slabs the pool holds beyond the pipeline's own, for batches made
    /// outside it ([`crate::Loader::spare_slab`]: a user transform's
    /// outputs); fewer when the pool would pass 4x the byte budget.
    pub fn transform_slabs(mut self, slabs: usize) -> Self {
        self.transform_slabs = slabs;
        self
    }
    /// Make the slab pool in memory other processes of the same user can
    /// map (a memfd per slab, Linux; [`crate::SlabLease::shared`]),
    /// so worker processes read a batch where it lies instead of from a
    /// copy (the Python package's `transform_processes`). Not with
    /// page-locked CUDA slabs, which stay as they are. Off by default.
    pub fn shared_slabs(mut self, on: bool) -> Self {
        self.shared_slabs = on;
        self
    }
    /// Bytes of fetched and decoded row groups held at once, counted over
    /// the projected columns only (default 1 GiB). No row group may decode
    /// to more, and no batch may need more.
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
    /// Read the byte-array and list column chunks (images, texts, token
    /// ids) of a local dataset's shards through a read-only mapping of each
    /// file (default), or copy them out with `pread` (`false`; other
    /// columns, remote shards and cached copies always are). A mapping saves
    /// a copy of every byte; a file truncated or rewritten while it is read
    /// is an error naming the shard either way. Mapped reads install a
    /// `SIGBUS` handler (once per process, chaining to the one there before)
    /// that turns a fault in a truncated shard into that error: turn them
    /// off where another component must own `SIGBUS`.
    pub fn mapped_reads(mut self, mapped: bool) -> Self {
        self.mapped_reads = mapped;
        self
    }
    /// How transient storage failures are retried (default: 8 retries within
    /// 30 s, exponential backoff from 50 ms with jitter). This is the only
    /// retry layer: the object store clients' own retries are turned off.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }
    /// Bytes per slab (default: estimated from the data and batch size).
    pub fn slab_bytes(mut self, bytes: usize) -> Self {
        self.slab_bytes = Some(bytes);
        self
    }
    /// Write a trace of the pipeline to `path` (Chrome trace-event JSON,
    /// for ui.perfetto.dev or chrome://tracing): a track per thread, spans
    /// of fetches, decodes (shard, row group), shuffled windows, collated
    /// batches and consumer waits. Streamed, bounded memory; complete once
    /// the loader is dropped.
    pub fn trace(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.trace = Some(path.into());
        self
    }
    /// Warn (through `tracing`, and Python's `logging`) when the consumer
    /// waited in `next()` for more than `fraction` of the time over the last
    /// `batches` batches, naming the bottleneck stage; at most once per
    /// epoch. `None` turns it off. Default [`DEFAULT_SLOW_WARNING`].
    pub fn slow_warning(mut self, warning: Option<(f64, u64)>) -> Self {
        self.slow_warning = warning;
        self
    }
    /// What to do with a damaged row group (default [`OnError::Fail`]).
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.on_error = policy;
        self
    }
    /// With [`OnError::Skip`], how many row groups may be skipped over the
    /// loader's life before it fails (default 10).
    pub fn max_skipped(mut self, row_groups: u64) -> Self {
        self.max_skipped = row_groups;
        self
    }

    /// Decode the images of these binary columns (JPEG, PNG, WebP) on the
    /// loader's threads: each becomes `uint8` `[batch, height, width, 3]`
    /// (see [`ImageOptions`] for the defaults: 224 x 224, `random_resized`).
    ///
    /// ```no_run
    /// use shardfeed_loader::{Crop, Loader};
    /// let mut loader = Loader::builder("/data/imagenet") // `shardfeed shard images/ -o ...`
    ///     .batch_size(256)
    ///     .columns(["bytes", "label_index"])
    ///     .decode_images(["bytes"])
    ///     .image_size(224, 224)
    ///     .crop(Crop::RandomResized)
    ///     .crop_range((0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0))
    ///     .flip(true)
    ///     .channels_first(true)
    ///     .build()?;
    /// for batch in &mut loader {
    ///     let batch = batch?;
    ///     let pixels: &[u8] = batch.values("bytes").unwrap(); // [256, 3, 224, 224]
    ///     assert_eq!(pixels.len(), batch.rows() * 3 * 224 * 224);
    /// }
    /// # Ok::<(), shardfeed_loader::LoaderError>(())
    /// ```
    pub fn decode_images<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.images.columns = columns.into_iter().map(Into::into).collect();
        self
    }

    /// Every image option at once.
    pub fn images(mut self, options: ImageOptions) -> Self {
        self.images = options;
        self
    }

    /// Output size of decoded images, in pixels.
    pub fn image_size(mut self, height: u32, width: u32) -> Self {
        self.images.height = height;
        self.images.width = width;
        self
    }

    /// How decoded images are cropped to the output size.
    pub fn crop(mut self, crop: Crop) -> Self {
        self.images.crop = crop;
        self
    }

    /// Flip decoded images horizontally with probability 1/2 (a function of
    /// seed, epoch and row).
    pub fn flip(mut self, flip: bool) -> Self {
        self.images.flip = flip;
        self
    }

    /// `Crop::RandomResized`: the range of a crop's share of the image's area
    /// (default 0.08 to 1) and of its aspect ratio (default 3/4 to 4/3).
    pub fn crop_range(mut self, scale: (f64, f64), ratio: (f64, f64)) -> Self {
        self.images.scale = scale;
        self.images.ratio = ratio;
        self
    }

    /// Decoded images as `[3, height, width]` per row instead of
    /// `[height, width, 3]`.
    pub fn channels_first(mut self, channels_first: bool) -> Self {
        self.images.channels_first = channels_first;
        self
    }

    /// Refuse images of more pixels than this (default
    /// [`DEFAULT_MAX_IMAGE_PIXELS`](crate::DEFAULT_MAX_IMAGE_PIXELS)).
    pub fn max_image_pixels(mut self, pixels: u64) -> Self {
        self.images.max_pixels = pixels;
        self
    }

    /// Check the options that need no dataset, naming the first bad one
    /// (`build` checks the rest against the manifest).
    pub(crate) fn check(&self) -> Result<()> {
        let bad =
            |option: &'static str, reason: String| Err(LoaderError::BadOption { option, reason });
        if self.batch_size == 0 {
            return bad("batch_size", "must be greater than 0".into());
        }
        if self.window == Some(0) {
            return bad("window", "must be greater than 0".into());
        }
        if self.decode_niceness > 19 {
            return bad(
                "decode_niceness",
                format!("{} is past 19, the lowest priority", self.decode_niceness),
            );
        }
        if self.io_concurrency == Some(0) || self.io_threads == 0 {
            return bad("io_concurrency", "must be greater than 0".into());
        }
        if let ListMode::Padded { to: 0, .. } = self.list_mode {
            return bad("pad_to", "must be greater than 0".into());
        }
        let images = (!self.images.columns.is_empty()).then_some(&self.images);
        if let Some(images) = images {
            images.check()?;
        }
        if self.byte_budget < 1 << 20 {
            return bad("byte_budget", "must be at least 1 MiB".into());
        }
        if self.decode_threads > MAX_THREADS {
            return bad(
                "threads",
                format!(
                    "{} decode threads is more than {MAX_THREADS} (0: one per core)",
                    self.decode_threads
                ),
            );
        }
        Ok(())
    }
}

impl Config {
    /// Threads (the stage's own included) the shuffle and collate stages
    /// share a window's or a batch's fixed-width columns among: a quarter of
    /// the decode threads. On tabular data the two stages together cost
    /// about as much CPU as decoding (`benches/thread_scaling.py`): one
    /// thread each caps a loader at about twice what one decode thread
    /// delivers, whatever its cores. Below 8 decode threads they stay one
    /// thread each: on 2 cores, helpers only competed for the same cores
    /// (20% slower on tabular data with `threads(4)`); the gain on many cores
    /// is not measured yet (no such machine here).
    pub fn stage_workers(&self) -> usize {
        (self.decode_threads / 4).max(1)
    }
}

/// The options every epoch of a loader shares.
#[derive(Debug)]
pub(crate) struct Config {
    pub batch_size: usize,
    pub shuffle: bool,
    pub seed: u64,
    pub window: usize,
    /// The window without a mixture source's share of the default
    /// ([`crate::budget::shared_window`]): `window` for a plain loader.
    pub unshared_window: usize,
    pub rank: u64,
    pub world_size: u64,
    pub drop_last: bool,
    pub keep_partial: bool,
    pub decode_threads: usize,
    /// See [`LoaderBuilder::decode_niceness`].
    pub decode_niceness: u8,
    pub io_concurrency: usize,
    pub prefetch_batches: usize,
    pub list_mode: ListMode,
    pub plans: Vec<ColumnPlan>,
    /// Every projected column is fixed width.
    pub fixed_width: bool,
    /// The byte budget: no row group's column decodes to more.
    pub byte_budget: u64,
    /// Bytes of projected row groups fetched or decoded but not yet
    /// collated, at most: the budget, or less when less is useful.
    pub in_flight_bytes: u64,
    /// Row groups that must fit the budget at once (two windows and a batch).
    pub needed_units: u64,
    /// Row groups of more rows are read in parts of at most this many (0:
    /// whole); see [`crate::plan::PlanOptions::part_rows`].
    pub part_rows: u64,
    /// Estimated bytes of one collated batch.
    pub batch_bytes: u64,
    pub on_error: OnError,
    pub max_skipped: u64,
    /// Warn when the consumer waited more than this fraction of the last so
    /// many batches.
    pub slow_warning: Option<(f64, u64)>,
    pub failpoints: Failpoints,
    /// Image decoding, when some columns hold images.
    pub images: Option<ImageOptions>,
    /// [`LoaderBuilder::filter`], [`LoaderBuilder::map_rows`],
    /// [`LoaderBuilder::map_batch`].
    pub steps: crate::map::Steps,
    /// [`LoaderBuilder::row_ids`].
    pub row_ids: bool,
    /// Batches are handed on uncollated ([`crate::collate::Handoff`]).
    pub handoff: bool,
}
