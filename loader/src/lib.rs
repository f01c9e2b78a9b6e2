//! shardfeed's loader: stream a dataset's rows as shuffled, collated batches.
//!
//! (The streaming pipeline lands in its own issue; this crate currently holds
//! the read side of the dataset contract: checked footers and column chunks,
//! and `verify`.)

mod error;
pub mod plan;
pub mod shard;
mod verify;

pub use error::{LoaderError, Result};
pub use verify::{ShardProblem, VerifyReport, verify_dataset};
