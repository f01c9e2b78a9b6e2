//! shardfeed's loader: stream a dataset's rows as shuffled, collated batches
//! in pinned host memory, so the trainer never waits.
//!
//! ```text
//! plan (pure) -> fetch (tokio + object_store) -> decode (threads) -> shuffle (thread) -> collate (thread) -> slab pool -> consumer
//! ```
//!
//! Where each part lives (`scripts/check-structure.sh` keeps these modules
//! free of import circles):
//!
//! | stage or part | file |
//! |---|---|
//! | options and their checks | `config.rs` ([`LoaderBuilder`]) |
//! | every option by its CLI and Python name, with defaults, once | `options.rs` ([`LoaderOptions`]) |
//! | assembly: manifest, first footer, pool | `build.rs` |
//! | the memory policy (window, row groups held, read-ahead, pool) | `budget.rs` (pure functions) |
//! | the column contract (types taken, batch layout) | `columns.rs` |
//! | the order (pure) | `plan.rs` |
//! | wiring a pass: channels, threads, cancellation | `pipeline.rs` |
//! | what stages hand each other | `stage.rs` (and `shuffle::LoadedWindow`) |
//! | fetch stage: admission, range reads, shared reads | `fetch/stage.rs`, with `fetch.rs` (footers, mapped reads, the shard cache `cache.rs`) and `fetch/local.rs` (local reads: read threads, pooled buffers) |
//! | decode threads: checksums, then the own Parquet reader | `decode.rs`, `parquet/` (depends on nothing else of the loader) |
//! | shuffle stage: windows assembled, then permuted | `shuffle.rs` |
//! | collate stage: batches laid out in slabs, images | `collate.rs`, `image.rs` |
//! | kernels: the window permutation, row gathers, dictionary lookups, streamed copies, and the key bound their unchecked reads trust | `gather/` |
//! | the slab pool (pinned when CUDA is there) | `pinned.rs`, `mapped.rs` |
//! | the consumer's side: waits, held slabs, counters, slow warning | `outlet.rs` (shared by [`Loader`] and [`Mixture`]) |
//! | the consumer: batches, epochs, resume | `loader.rs`, `state.rs`; [`Feed`] (`feed.rs`) drives a loader or a mixture alike |
//! | mixtures and packing | `mix.rs` (`mix/thread.rs`), `pack.rs` |
//! | counters, trace, reports | `stats.rs`, `trace.rs`, `inspect.rs`, `verify.rs` |
//!
//! * The order a rank sees is a pure function of (manifest, seed, epoch,
//!   rank, world size): see `plan.rs`.
//! * Fetching reads only the projected column chunks of each row group, with
//!   footers sized by the manifest; decode threads check every chunk's
//!   checksum before decoding; one collator gathers rows into slabs.
//! * Memory is bounded by configuration: row groups in flight (`byte_budget`,
//!   `window`), batches ahead (`prefetch`) and a capped pool of slabs (made
//!   on first need).
//!
//! ```no_run
//! use shardfeed_loader::Loader;
//! let mut loader = Loader::builder("/data/ds").batch_size(128).seed(1).build()?;
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for batch in &mut loader {
//!         let batch = batch?;
//!         let ids: &[i64] = batch.values("id").unwrap();
//!         assert_eq!(ids.len(), batch.rows());
//!     }
//! }
//! println!("{:?}", loader.stats());
//! # Ok::<(), shardfeed_loader::LoaderError>(())
//! ```

mod batch;
mod budget;
mod build;
mod cache;
mod collate;
mod columns;
mod config;
mod decode;
mod error;
mod feed;
mod fetch;
mod gather;
mod image;
mod inspect;
mod loader;
mod map;
mod mapfile;
mod mapped;
pub mod mix;
mod options;
mod outlet;
mod pack;
mod parquet;
mod pinned;
mod pipeline;
mod plan;
mod select;
mod shard;
mod shuffle;
mod stage;
mod state;
mod stats;
mod trace;
pub use trace::TraceOutcome;
mod verify;

pub use batch::{Batch, Buffer, Column, ColumnLayout, DType, Element};
pub use columns::ListMode;
pub use config::{
    DEFAULT_BATCH_SIZE, DEFAULT_BYTE_BUDGET, DEFAULT_CACHE_LIMIT, DEFAULT_DECODE_NICENESS,
    DEFAULT_IO_CONCURRENCY, DEFAULT_MAX_SKIPPED, DEFAULT_PREFETCH_BATCHES, DEFAULT_PREFETCH_BYTES,
    DEFAULT_SLOW_WARNING, DEFAULT_WINDOW, FIRST_SLICES, LoaderBuilder, MAX_AUTO_WINDOW,
    MIN_FITTED_WINDOW, MIXED_ROW_GROUPS, OnError,
};
pub use error::{LoaderError, Result, Stage};
pub use feed::{Feed, FeedBuilder, FeedState, FeedStats};
pub use image::RowId;
pub use image::{
    Crop, DEFAULT_MAX_IMAGE_PIXELS, ImageDecoder, ImageHeader, ImageOptions, probe as probe_image,
};
pub use inspect::{ImageColumnSummary, image_summary};
pub use loader::Loader;
pub use map::{BatchMut, BatchRng, BoxError as MapError, Row, RowMut};
pub use mix::{
    DrawState, MixStop, Mixture, MixtureBuilder, MixtureState, MixtureStats, SourceState,
};
pub use options::LoaderOptions;
pub use pack::{Carry, DEFAULT_PACK_WINDOW, FitState, PackMode, PackOptions};
pub use parquet::DecodePaths;
pub use pinned::{Pinning, PinningMode, SlabLease};
pub use plan::Piece;
pub use shardfeed_format::RetryPolicy;
pub use state::{LoaderState, PLAN_VERSION, STATE_VERSION, dataset_fingerprint};
pub use stats::{Mixing, SkippedImage, SkippedRowGroup, StageStats, Stats, WaitSummary};
pub use verify::{ShardProblem, VerifyReport, verify_dataset, verify_dataset_with};
