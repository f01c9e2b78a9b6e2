//! shardfeed's offline half: turn a dataset into zstd-compressed Parquet
//! shards plus one manifest.
//!
//! Inputs are Parquet (any codec), Arrow IPC (file or stream), JSON Lines,
//! CSV with a header row, or a folder of files (one row per file, labelled by
//! its parent folder). All inputs must share one schema. Reading, encoding and
//! compression run on all cores; memory is bounded by the options. Shards and
//! manifest are byte-identical for the same inputs and options, whatever the
//! thread count.
//!
//! ```no_run
//! use shardfeed_preprocess::{ShardOptions, shard};
//! let summary = shard(
//!     &["raw/*.parquet".to_string()],
//!     "/data/ds",
//!     &ShardOptions::default().with_shard_size(64 << 20).with_shuffle(7),
//! )?;
//! println!("{} rows in {} shards", summary.rows, summary.shards);
//! # Ok::<(), shardfeed_preprocess::PreprocessError>(())
//! ```

mod column_spill;
mod delta;
mod dictionary;
mod encode;
mod error;
mod index;
mod input;
mod input_format;
mod lock;
mod measure;
mod options;
mod output;
mod pages;
mod parquet_file;
mod pipeline;
mod plain;
mod remote;
mod run;
mod shuffle;
mod sums;
mod task;
mod tokenize;
mod view;
mod writer;

pub use error::{BoxError, PreprocessError, Result};
pub use index::{FOOTER_GUESS, IndexOptions, IndexSummary, MAX_FOOTER, index};
pub use input::{SkippedInput, files_schema};
pub use input_format::InputFormat;
pub use lock::LOCK_FILE;
pub use measure::{huge_page_bytes, peak_rss_bytes};
pub use options::{
    COLUMN_BYTES, DEFAULT_MEMORY_BUDGET, DEFAULT_ROW_GROUP_BYTES, DEFAULT_SHARD_SIZE,
    DEFAULT_SHUFFLE_SEED, DEFAULT_ZSTD_LEVEL, LARGE_ROW_BYTES, LARGE_ROW_GROUP_BYTES, MAX_THREADS,
    Progress, READ_BATCH_ROWS, ShardOptions, TaskSplit, TaskStage,
};
pub use pipeline::ShardSummary;
pub use run::shard;
pub use task::{CommitSummary, commit};
pub use tokenize::TokenizeOptions;
