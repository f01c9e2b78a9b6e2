//! shardfeed's loader: stream a dataset's rows as shuffled, collated batches
//! in pinned host memory, so the trainer never waits.
//!
//! ```text
//! plan (pure) -> fetch (tokio + object_store) -> decode (threads) -> shuffle (thread) -> collate (thread) -> slab pool -> consumer
//! ```
//!
//! Modules follow the pipeline: [`config`](LoaderBuilder) (options and
//! checks), [`plan`] (the pure order), `pipeline` (threads, channels,
//! cancellation, failures), `fetch`, `decode` (checksums, then `parquet`: the
//! own Parquet reader, which depends on nothing else of the loader),
//! `shuffle`, `collate` (with `image`: images decoded, cropped and resized
//! into the slab), `pinned` (the slab pool), `state` (resume) and
//! `stats`.
//!
//! * The order a rank sees is a pure function of (manifest, seed, epoch,
//!   rank, world size): see [`plan`].
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
mod build;
mod cache;
mod collate;
mod columns;
mod config;
mod decode;
mod error;
mod fetch;
mod image;
mod inspect;
mod loader;
mod mapfile;
mod mapped;
pub mod mix;
pub mod pack;
mod parquet;
mod pinned;
mod pipeline;
pub mod plan;
pub mod shard;
mod share;
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
pub use image::{
    Crop, DEFAULT_MAX_IMAGE_PIXELS, ImageDecoder, ImageHeader, ImageOptions, probe as probe_image,
};
pub use inspect::{ImageColumnSummary, image_summary};
pub use loader::Loader;
pub use mix::{MixStop, Mixture, MixtureBuilder, MixtureState, MixtureStats};
pub use pack::{PackMode, PackOptions};
pub use parquet::DecodePaths;
pub use pinned::{Pinning, PinningMode, SlabLease};
pub use shardfeed_format::RetryPolicy;
pub use state::{LoaderState, PLAN_VERSION, STATE_VERSION, dataset_fingerprint};
pub use stats::{Mixing, SkippedImage, SkippedRowGroup, StageStats, Stats, WaitSummary};
pub use verify::{ShardProblem, VerifyReport, verify_dataset};
