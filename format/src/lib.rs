//! The shardfeed dataset contract.
//!
//! A dataset is a URL prefix holding zstd-compressed Parquet shards and one
//! `manifest.json`, written last: a dataset exists only once its manifest does.
//! This crate owns everything both halves of shardfeed must agree on:
//!
//! * [`Manifest`]: the versioned JSON document listing shards, their row
//!   counts, sizes, row groups, footer lengths and checksums;
//! * [`checksum`]: CRC-32 checksums for whole shards, footers and each column
//!   chunk, so a reader detects corruption in exactly the ranges it fetches;
//! * [`Location`]: a dataset URL (`/local/path`, `file://`, `memory://`, ...)
//!   resolved to an [`object_store::ObjectStore`] and a path prefix.
//!
//! ```
//! use shardfeed_format::{Manifest, ShardEntry, shard_path};
//! let shard = ShardEntry {
//!     path: shard_path(0),
//!     rows: 10,
//!     bytes: 1234,
//!     row_groups: vec![6, 4],
//!     footer_len: 300,
//!     footer_crc32: shardfeed_format::Crc32(7),
//!     crc32: Some(shardfeed_format::Crc32(9)),
//!     base: None,
//!     fingerprint: None,
//!     chunk_checksums: None,
//!     page_checksums: None,
//! };
//! assert_eq!(shard.path, "shards/part-000000.parquet");
//! assert!(shardfeed_format::validate_shard_path(&shard.path).is_ok());
//! ```

mod allocator;
pub mod checksum;
mod error;
pub mod failpoint;
pub mod fault;
pub mod location;
mod manifest;
#[cfg(unix)]
pub mod mapping;
pub mod panic;
pub mod permute;
pub mod redact;
pub mod retry;
pub mod share;
pub mod size;
pub mod thrift;

pub use checksum::{ChunkChecksums, ChunkHash, ChunkHasher, ChunkSum, Crc32, PageChecksums, Pages};
pub use error::{FormatError, Result, StoreError};
pub use location::{Hub, HubRepo, Location};
pub use manifest::{
    FORMAT_NAME, FORMAT_VERSION, Fingerprint, IndexRecord, MANIFEST_FILE, Manifest, PRETTY_SHARDS,
    ShardEntry, Summary, TASKS_DIR, TaskRecord, TokenizerRecord, WriteOptions, duplicate_column,
    modified_ns, shard_path, task_record_path, task_shard_path, validate_base, validate_index_path,
    validate_shard_path, widens_to, widest,
};
pub use retry::RetryPolicy;
