//! The resume state: small, versioned, and tied to what shaped the order.
//!
//! A state names the dataset by a fingerprint of its manifest (every
//! shard's path, rows, row groups, size and checksums, and the schema), and
//! carries every option that shapes the order. Resuming from a state of
//! another dataset, or with an option that changes the order, fails with a
//! message naming what differs: silently skipping the first N rows of a
//! different dataset is the bug this prevents.
//!
//! [`PLAN_VERSION`] names the order algorithm itself (the loader's `plan` module);
//! golden tests pin it, and a change to the order must bump it so that old
//! states are refused rather than resumed at the wrong rows.

use serde::{Deserialize, Serialize};
use shardfeed_format::Manifest;
use shardfeed_format::permute::hash_words;

use crate::error::{LoaderError, Result};

/// The state format this build writes and reads.
pub const STATE_VERSION: u32 = 2;
/// The order algorithm (the loader's `plan` module) this build implements.
pub const PLAN_VERSION: u32 = 4;

/// Where a loader is: enough to continue exactly there in a new process.
/// Serialized as JSON it is well under 1 KB.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    /// State format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Order algorithm version ([`PLAN_VERSION`]).
    #[serde(default)]
    pub plan: u32,
    /// The shuffle seed.
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// Positions of this epoch already yielded to the consumer (rows of
    /// skipped row groups included).
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
    /// Row groups of more rows were read in parts of at most this many (0:
    /// whole; states saved before parts existed have none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub part_rows: u64,
    /// Whether remainders are dropped.
    #[serde(default = "default_true")]
    pub drop_last: bool,
    /// The dataset's fingerprint ([`dataset_fingerprint`]).
    pub dataset: String,
    /// After an elastic resume: epochs planned from pieces of the old
    /// ranks' sequences (see [`crate::Piece`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<(u64, Vec<crate::plan::Piece>)>,
}

fn default_true() -> bool {
    true
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl LoaderState {
    /// JSON text.
    pub fn to_json(&self) -> String {
        to_json(self)
    }

    /// Parse JSON written by [`LoaderState::to_json`].
    pub fn from_json(text: &str) -> Result<Self> {
        from_json(text)
    }

    /// Check that this state can resume a loader whose own state is
    /// `current`: same versions, dataset and order options. The error names
    /// what differs.
    pub(crate) fn check_compatible(&self, current: &LoaderState) -> Result<()> {
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        if self.version != STATE_VERSION {
            return refuse(format!(
                "the state has format version {}, this loader reads version {STATE_VERSION}",
                self.version
            ));
        }
        if self.plan != PLAN_VERSION {
            return refuse(format!(
                "the state was saved by a loader whose order algorithm (version {}) differs from this one's (version {PLAN_VERSION}): resuming would not continue with the rows that were not yet yielded",
                self.plan
            ));
        }
        if self.dataset != current.dataset {
            return refuse(format!(
                "the state belongs to another dataset (fingerprint {}, this loader's dataset is {}): a state only resumes the dataset it was saved from",
                self.dataset, current.dataset
            ));
        }
        same_order(&[
            ("seed", self.seed, current.seed),
            ("rank", self.rank, current.rank),
            ("world_size", self.world_size, current.world_size),
            (
                "batch_size",
                self.batch_size as u64,
                current.batch_size as u64,
            ),
            ("window", self.window as u64, current.window as u64),
            ("part_rows", self.part_rows, current.part_rows),
            ("shuffle", self.shuffle as u64, current.shuffle as u64),
            ("drop_last", self.drop_last as u64, current.drop_last as u64),
        ])?;
        Ok(())
    }
}

/// A state as JSON text.
pub(crate) fn to_json(state: &impl Serialize) -> String {
    serde_json::to_string(state).expect("a state always serializes")
}

/// A state from JSON text; a malformed one is [`LoaderError::BadState`].
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| LoaderError::BadState {
        reason: e.to_string(),
    })
}

/// Refuse a state whose order option `what` is `a` where the loader's is
/// `b`, for each `(what, a, b)`, naming the first that differs.
pub(crate) fn same_order(options: &[(&str, u64, u64)]) -> Result<()> {
    for &(what, a, b) in options {
        if a != b {
            // Unless given, the window follows the byte budget.
            let hint = if what == "window" {
                format!("; build the loader with window {a} to resume it")
            } else {
                String::new()
            };
            return Err(LoaderError::BadState {
                reason: format!(
                    "the state has {what} {a} but this loader has {b}: the order would differ{hint}"
                ),
            });
        }
    }
    Ok(())
}

/// A fingerprint of everything in a manifest that the order and the rows
/// depend on: the schema, and each shard's path, rows, row groups, size and
/// checksums. 16 hex digits.
pub fn dataset_fingerprint(manifest: &Manifest) -> String {
    let text = |s: &str| -> u64 {
        let words: Vec<u64> = s
            .as_bytes()
            .chunks(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .chain([s.len() as u64])
            .collect();
        hash_words(&words)
    };
    let schema = serde_json::to_string(&manifest.schema).expect("a schema serializes");
    let mut words = vec![
        text(&schema),
        manifest.total_rows,
        manifest.shards.len() as u64,
    ];
    for shard in &manifest.shards {
        words.extend([
            text(&shard.path),
            shard.rows,
            shard.bytes,
            u64::from(shard.crc32.map_or(0, |c| c.0)),
            u64::from(shard.footer_crc32.0),
            shard.footer_len,
            shard.row_groups.len() as u64,
        ]);
        words.extend(shard.row_groups.iter().copied());
        // An index's files (nothing added for a dataset's own shards, so
        // their fingerprints stay what older builds computed).
        if let Some(base) = shard.base {
            words.push(u64::from(base));
        }
        if let Some(f) = &shard.fingerprint {
            let etag = f.etag.as_deref().unwrap_or("");
            let version = f.version.as_deref().unwrap_or("");
            words.extend([text(etag), text(version), f.modified_ns.unwrap_or(0) as u64]);
        }
    }
    if let Some(index) = &manifest.index {
        words.extend(index.bases.iter().map(|b| text(b)));
    }
    format!("{:016x}", hash_words(&words))
}
