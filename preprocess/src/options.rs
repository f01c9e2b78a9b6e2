use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::SchemaRef;

use crate::input_format::InputFormat;
use crate::tokenize::{TextTokenizer, TokenizeOptions};
use crate::{PreprocessError, Result};

/// Default target compressed bytes per shard: 128 MiB.
pub const DEFAULT_SHARD_SIZE: u64 = 128 << 20;
/// Default target uncompressed (Arrow) bytes per row group: 8 MiB, a few MiB
/// once compressed, small enough for fine-grained shuffles in the loader.
pub const DEFAULT_ROW_GROUP_BYTES: u64 = 8 << 20;
/// Rows averaging more than this many bytes (images, audio, documents) are
/// "large": see [`LARGE_ROW_GROUP_BYTES`].
pub const LARGE_ROW_BYTES: u64 = 64 << 10;
/// Default target bytes per row group of large rows: 2 MiB. The loader holds
/// such values as stored (they do not compress), two shuffle windows of
/// row groups at once, so smaller row groups keep a window's memory near
/// other datasets' for the same number of row groups mixed per batch: on
/// 115 KB images, 4 MiB against 8 MiB gave peak RSS 301-315 MB instead of
/// 377-381, a fresh process's first epoch 2-4x faster, the same steady
/// rate; once such columns lost their dictionary pages (a dictionary page
/// per chunk had made 2 MiB slower), 2 MiB against 4 MiB gave a 9% higher
/// steady rate, a 17% faster first epoch and a third less peak RSS (~100
/// MB): two windows then fit the CPU's last-level cache (docs/performance-notes.md).
pub const LARGE_ROW_GROUP_BYTES: u64 = 2 << 20;
/// Default seed of the global row shuffle `shard` does unless asked not to.
pub const DEFAULT_SHUFFLE_SEED: u64 = 0;
/// Default zstd level.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
/// Default memory budget for the whole run: 1 GiB.
pub const DEFAULT_MEMORY_BUDGET: u64 = 1 << 30;
/// Rows per batch read from CSV and JSON Lines inputs.
pub const READ_BATCH_ROWS: usize = 8192;

/// What one column costs while shards are written, whatever its rows: the
/// column writer's buffers and encoders, and the readers' per-column state
/// (about 37 KB measured on 10,000 columns; charged with room to spare).
pub const COLUMN_BYTES: u64 = 64 << 10;

/// The most threads `shard` starts (`--threads`): each holds buffers of its
/// own, and thread creation fails far below what a `usize` can ask for.
pub const MAX_THREADS: usize = 1024;

/// Told about progress while a dataset is written. Called from pipeline threads.
pub trait Progress: Send + Sync {
    /// Work is starting; `input_bytes` estimates the total input size.
    fn start(&self, input_bytes: u64);
    /// `rows` more rows, `bytes` more estimated input bytes were written.
    fn advance(&self, rows: u64, bytes: u64);
    /// A phase changed, e.g. `"scatter"` then `"gather"` for a shuffle.
    fn phase(&self, _name: &str) {}
}

/// Options of a `shard` run. Build with [`ShardOptions::default`] and the `with_*` setters.
///
/// ```
/// use shardfeed_preprocess::ShardOptions;
/// let opts = ShardOptions::default().with_shard_size(64 << 20).with_shuffle(7).with_threads(2);
/// assert_eq!(opts.shard_size, 64 << 20);
/// assert!(opts.validate().is_ok());
/// ```
#[derive(Clone)]
pub struct ShardOptions {
    /// Target compressed bytes per shard; a shard closes at the first row
    /// group boundary at or past it.
    pub shard_size: u64,
    /// Fixed rows per row group; when `None`, row groups target `row_group_bytes`.
    pub row_group_rows: Option<u64>,
    /// Target uncompressed bytes per row group.
    pub row_group_bytes: u64,
    /// Target for row groups of large rows (averaging over
    /// [`LARGE_ROW_BYTES`]), when it differs from `row_group_bytes`: by
    /// default [`LARGE_ROW_GROUP_BYTES`]; `None` once a row group size is set.
    pub large_row_group_bytes: Option<u64>,
    /// zstd level (1 to 22).
    pub zstd_level: i32,
    /// Seed of the global row shuffle (by default 0: every dataset is a
    /// permutation of its inputs); `None` keeps input order. A split run
    /// shuffles across its tasks only when asked ([`ShardOptions::with_shuffle`]):
    /// that needs every task to run at once, or two rounds (`--stage`).
    pub shuffle_seed: Option<u64>,
    /// Bytes of memory the run may use for in-flight data.
    pub memory_budget: u64,
    /// Threads for reading, encoding and compressing; 0 means all cores.
    pub threads: usize,
    /// Replace an existing dataset.
    pub overwrite: bool,
    /// Force the input format instead of detecting it from extensions.
    pub format: Option<InputFormat>,
    /// Schema for JSON Lines and CSV inputs instead of inferring one.
    pub schema: Option<SchemaRef>,
    /// Folder for shuffle spill files; the system temporary folder by default.
    pub temp_dir: Option<PathBuf>,
    /// Progress reporting.
    pub progress: Option<Arc<dyn Progress>>,
    /// Options for the output's object store (credentials, endpoint, region, ...).
    pub storage_options: Vec<(String, String)>,
    /// Run as task `index` of `count` (`--task-index`, `--num-tasks`): read a
    /// deterministic part of the inputs, write this task's shards and a task
    /// record, and leave the manifest to [`commit`](crate::commit).
    pub task: Option<TaskSplit>,
    /// Which stages a shuffled task runs (`--stage`).
    pub stage: TaskStage,
    /// How long the gather stage waits for every task's scatter (`--wait-timeout`).
    pub wait_timeout: std::time::Duration,
    /// The identity of a split run (`--run-id`): every task of one run must
    /// share it. By default a fingerprint of the inputs (names and sizes)
    /// and the options that shape the output.
    pub run_id: Option<String>,
    /// The seed recorded in the manifest when it differs from the one the
    /// pipeline shuffles with (a gather stage's own seed).
    pub(crate) recorded_seed: Option<u64>,
    /// This process's attempt: names its staging files.
    pub(crate) attempt: String,
    /// Whether the shuffle was chosen (`with_shuffle`, `without_shuffle`)
    /// rather than left at its default.
    pub(crate) shuffle_chosen: bool,
    /// The most columns (Parquet leaf columns) a dataset may have; `None`:
    /// what the memory budget allows ([`ShardOptions::effective_max_columns`]).
    pub max_columns: Option<u64>,
    /// Follow symbolic links of a folder input that lead outside it (by
    /// default they are skipped and listed in `skipped_inputs`).
    pub follow_links: bool,
    /// Failure injection for tests (`SHARDFEED_FAILPOINTS`).
    pub(crate) failpoints: shardfeed_format::failpoint::Failpoints,
    /// The split run's identity, resolved (`run_id` or the fingerprint).
    pub(crate) run: String,
    /// Tokenize a text column while sharding (`--tokenizer`).
    pub tokenize: Option<TokenizeOptions>,
    /// `tokenize`'s tokenizer, loaded and checked against the inputs once
    /// per run (by [`shard`](crate::shard), before any output is touched).
    pub(crate) text_tokenizer: Option<Arc<TextTokenizer>>,
    /// The shuffle was done by permuting the files of a folder input (one
    /// row each) before reading: the rows need no external shuffle.
    pub(crate) files_permuted: bool,
}

/// The stages of a task of a split run with `--shuffle`: every task scatters
/// its rows to all tasks through the output store, then gathers and shuffles
/// what was sent to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TaskStage {
    /// Scatter, then wait for every task's scatter, then gather (all tasks
    /// must be able to run at once).
    #[default]
    Both,
    /// Only scatter (a first round of tasks).
    Scatter,
    /// Only gather; every task's scatter must have finished (a second round).
    Gather,
}

impl std::str::FromStr for TaskStage {
    type Err = PreprocessError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "both" => Ok(TaskStage::Both),
            "scatter" => Ok(TaskStage::Scatter),
            "gather" => Ok(TaskStage::Gather),
            other => Err(PreprocessError::BadOption {
                option: "--stage",
                reason: format!("unknown stage {other:?}; use both, scatter or gather"),
            }),
        }
    }
}

/// One task of a split run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskSplit {
    /// This task, from 0.
    pub index: usize,
    /// Tasks in the run.
    pub count: usize,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            shard_size: DEFAULT_SHARD_SIZE,
            row_group_rows: None,
            row_group_bytes: DEFAULT_ROW_GROUP_BYTES,
            large_row_group_bytes: Some(LARGE_ROW_GROUP_BYTES),
            zstd_level: DEFAULT_ZSTD_LEVEL,
            shuffle_seed: Some(DEFAULT_SHUFFLE_SEED),
            memory_budget: DEFAULT_MEMORY_BUDGET,
            threads: 0,
            overwrite: false,
            format: None,
            schema: None,
            temp_dir: None,
            progress: None,
            storage_options: Vec::new(),
            task: None,
            stage: TaskStage::Both,
            wait_timeout: std::time::Duration::from_secs(3600),
            run_id: None,
            recorded_seed: None,
            attempt: String::new(),
            shuffle_chosen: false,
            follow_links: false,
            max_columns: None,
            failpoints: Default::default(),
            run: String::new(),
            tokenize: None,
            text_tokenizer: None,
            files_permuted: false,
        }
    }
}

impl std::fmt::Debug for ShardOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardOptions")
            .field("shard_size", &self.shard_size)
            .field("row_group_rows", &self.row_group_rows)
            .field("row_group_bytes", &self.row_group_bytes)
            .field("zstd_level", &self.zstd_level)
            .field("shuffle_seed", &self.shuffle_seed)
            .field("memory_budget", &self.memory_budget)
            .field("threads", &self.threads)
            .field("overwrite", &self.overwrite)
            .field("follow_links", &self.follow_links)
            .field("max_columns", &self.max_columns)
            .field("format", &self.format)
            .field("task", &self.task)
            .field("tokenize", &self.tokenize)
            // Keys only: values may be secrets.
            .field(
                "storage_options",
                &self
                    .storage_options
                    .iter()
                    .map(|(k, _)| k)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl ShardOptions {
    /// Set the target compressed shard size in bytes.
    pub fn with_shard_size(mut self, bytes: u64) -> Self {
        self.shard_size = bytes;
        self
    }
    /// Fix the rows per row group.
    pub fn with_row_group_rows(mut self, rows: u64) -> Self {
        self.row_group_rows = Some(rows);
        self
    }
    /// Set the target uncompressed bytes per row group (for rows of every
    /// size: large rows no longer get [`LARGE_ROW_GROUP_BYTES`]).
    pub fn with_row_group_bytes(mut self, bytes: u64) -> Self {
        self.row_group_bytes = bytes;
        self.large_row_group_bytes = None;
        self
    }
    /// Set the zstd level.
    pub fn with_zstd_level(mut self, level: i32) -> Self {
        self.zstd_level = level;
        self
    }
    /// Shuffle all rows globally with `seed` (the default, with seed 0; for
    /// a split run, across every task).
    pub fn with_shuffle(mut self, seed: u64) -> Self {
        self.shuffle_seed = Some(seed);
        self.shuffle_chosen = true;
        self
    }
    /// Keep the input order (`--no-shuffle`), for data that must stay ordered.
    pub fn without_shuffle(mut self) -> Self {
        self.shuffle_seed = None;
        self.shuffle_chosen = true;
        self
    }
    /// Set the memory budget in bytes.
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }
    /// Set the number of threads (0: all cores).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }
    /// Replace an existing dataset.
    pub fn with_overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }
    /// Force the input format.
    pub fn with_format(mut self, format: InputFormat) -> Self {
        self.format = Some(format);
        self
    }
    /// Use `schema` for JSON Lines and CSV inputs.
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }
    /// Spill shuffle buckets under `dir`.
    pub fn with_temp_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.temp_dir = Some(dir.into());
        self
    }
    /// Pass `key = value` to the output's object store builder.
    pub fn with_storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage_options.push((key.into(), value.into()));
        self
    }
    /// Run as task `index` of `count`.
    pub fn with_task(mut self, index: usize, count: usize) -> Self {
        self.task = Some(TaskSplit { index, count });
        self
    }
    /// Allow up to `columns` columns whatever the memory budget (each costs
    /// about [`COLUMN_BYTES`] while shards are written).
    pub fn with_max_columns(mut self, columns: u64) -> Self {
        self.max_columns = Some(columns);
        self
    }
    /// Read files that a folder input's symbolic links lead to outside the
    /// folder (by default they are skipped and listed).
    pub fn with_follow_links(mut self, follow: bool) -> Self {
        self.follow_links = follow;
        self
    }
    /// Run only `stage` of a shuffled task.
    pub fn with_stage(mut self, stage: TaskStage) -> Self {
        self.stage = stage;
        self
    }
    /// Wait at most `timeout` for the other tasks' scatter.
    pub fn with_wait_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.wait_timeout = timeout;
        self
    }
    /// Name the split run this task belongs to (`--run-id`), e.g. the
    /// engine's job id; every task of the run must pass the same.
    pub fn with_run_id(mut self, run_id: impl Into<String>) -> Self {
        self.run_id = Some(run_id.into());
        self
    }
    /// Tokenize a text column into token ids while sharding.
    pub fn with_tokenizer(mut self, tokenize: TokenizeOptions) -> Self {
        self.tokenize = Some(tokenize);
        self
    }
    /// Report progress to `progress`.
    pub fn with_progress(mut self, progress: Arc<dyn Progress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Check every option, naming the bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |option, reason: &str| {
            Err(PreprocessError::BadOption {
                option,
                reason: reason.to_string(),
            })
        };
        if self.shard_size == 0 {
            return bad("--shard-size", "must be greater than 0");
        }
        if self.row_group_rows == Some(0) {
            return bad("--row-group-rows", "must be greater than 0");
        }
        if self.row_group_bytes == 0 {
            return bad("--row-group-bytes", "must be greater than 0");
        }
        if !(1..=22).contains(&self.zstd_level) {
            return bad("--zstd-level", "must be between 1 and 22");
        }
        if let Some(t) = self.task {
            if t.count == 0 {
                return bad("--num-tasks", "must be greater than 0");
            }
            // A split run shuffles across its tasks only when asked.
            if self.shuffle_seed.is_some() && self.shuffle_chosen && t.count > 4096 {
                return bad("--num-tasks", "at most 4096 tasks with --shuffle");
            }
            if t.index >= t.count {
                return Err(PreprocessError::BadOption {
                    option: "--task-index",
                    reason: format!("{} is not below --num-tasks {}", t.index, t.count),
                });
            }
        }
        if self.memory_budget < 16 << 20 {
            return bad("--memory-budget", "must be at least 16MiB");
        }
        if self.max_columns == Some(0) {
            return bad("--max-columns", "must be greater than 0");
        }
        if self.threads > MAX_THREADS {
            return Err(PreprocessError::BadOption {
                option: "--threads",
                reason: format!(
                    "{} is more than {MAX_THREADS} threads (0: one per core)",
                    self.threads
                ),
            });
        }
        Ok(())
    }

    /// The most columns a dataset may have: `--max-columns`, or as many as
    /// half the memory budget holds at [`COLUMN_BYTES`] each.
    pub fn effective_max_columns(&self) -> u64 {
        self.max_columns
            .unwrap_or(self.memory_budget / 2 / COLUMN_BYTES)
    }

    /// The most bytes one value (a line of a text input, a file of a
    /// folder, a document to tokenize) may hold: an eighth of the budget,
    /// since a value is held a few times over on its way to a shard.
    pub fn max_value_bytes(&self) -> u64 {
        self.memory_budget / 8
    }

    /// Target bytes per row group actually used: `row_group_bytes`, capped to
    /// an eighth of the memory budget so that the row groups in flight fit it.
    pub fn effective_row_group_bytes(&self) -> u64 {
        self.row_group_bytes.min(self.memory_budget / 8)
    }

    /// Target bytes per row group of large rows actually used (capped as
    /// [`ShardOptions::effective_row_group_bytes`]), where it differs.
    pub fn effective_large_row_group_bytes(&self) -> Option<u64> {
        self.large_row_group_bytes
            .map(|b| b.min(self.memory_budget / 8))
    }

    /// Threads to use: the option, or all cores.
    pub fn effective_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }
}
