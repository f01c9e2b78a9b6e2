/// Result alias for this crate.
pub type Result<T, E = LoaderError> = std::result::Result<T, E>;

/// Everything that can go wrong loading a dataset. Each variant names the
/// shard (and row group) or option involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoaderError {
    /// The manifest or dataset location is unusable.
    #[error(transparent)]
    Format(#[from] shardfeed_format::FormatError),
    /// A shard listed in the manifest is missing.
    #[error("shard {url} is missing: {error}")]
    MissingShard {
        /// The shard's URL.
        url: String,
        /// The store's error.
        error: shardfeed_format::StoreError,
    },
    /// Reading from the store failed.
    #[error("reading {url}: {error}")]
    Store {
        /// The object's URL.
        url: String,
        /// The store's error.
        error: shardfeed_format::StoreError,
    },
    /// Bytes of a shard do not match their checksum or the manifest.
    #[error("shard {shard}{}: corrupted: {detail}", row_group.map(|r| format!(" row group {r}")).unwrap_or_default())]
    Corrupt {
        /// The shard's relative path.
        shard: String,
        /// The row group, when the damage is inside one.
        row_group: Option<usize>,
        /// What does not match.
        detail: String,
    },
    /// Parquet decoding failed.
    #[error("shard {shard}{}: {source}", row_group.map(|r| format!(" row group {r}")).unwrap_or_default())]
    Decode {
        /// The shard's relative path.
        shard: String,
        /// The row group, when known.
        row_group: Option<usize>,
        /// The Parquet error.
        source: parquet::errors::ParquetError,
    },
    /// A pipeline stage failed, panicked, or stopped before the epoch was
    /// complete.
    #[error("the {stage} stage failed{}{}: {detail}",
        shard.as_ref().map(|s| format!(" on shard {s}")).unwrap_or_default(),
        row_group.map(|r| format!(" row group {r}")).unwrap_or_default())]
    Stage {
        /// The stage.
        stage: Stage,
        /// The shard's relative path, when known.
        shard: Option<String>,
        /// The row group, when known.
        row_group: Option<usize>,
        /// What happened.
        detail: String,
    },
    /// An image could not be decoded (or is larger than `max_image_pixels`).
    #[error(
        "image in column `{column}` of shard {shard} row group {row_group} row {row}: {detail}"
    )]
    Image {
        /// The shard's relative path.
        shard: String,
        /// The row group.
        row_group: usize,
        /// The row within the row group.
        row: u64,
        /// The image column.
        column: String,
        /// What the decoder said.
        detail: String,
    },
    /// More row groups were damaged than `max_skipped` allows.
    #[error(
        "more than max_skipped ({max}) row groups (or images) are damaged; the last one: {last}"
    )]
    TooManySkipped {
        /// The configured limit.
        max: u64,
        /// The damage that passed it.
        last: Box<LoaderError>,
    },
    /// A loader option is invalid.
    #[error("invalid option {option}: {reason}")]
    BadOption {
        /// The option's name.
        option: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// A source of a mixture failed or does not fit the others.
    #[error("mixture source {source_index} ({url}): {error}")]
    MixtureSource {
        /// The source's index in the mixture.
        source_index: usize,
        /// Its URL (credentials redacted).
        url: String,
        /// What went wrong.
        error: Box<LoaderError>,
    },
    /// A resume state does not belong to this loader.
    #[error("cannot resume: {reason}")]
    BadState {
        /// Why the state is refused.
        reason: String,
    },
    /// Local I/O failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Every slab of the pool is held by batches the caller keeps alive.
    #[error(
        "all {slabs} slabs of the pool are held by batches still alive; drop batches you no longer need (or build with a larger prefetch)"
    )]
    PoolExhausted {
        /// Slabs in the pool.
        slabs: usize,
    },
    /// A wait for the next batch was interrupted by the caller (Ctrl-C in
    /// Python); the pass goes on and the next call continues it.
    #[error("interrupted while waiting for the next batch")]
    Interrupted,
    /// The loader was shut down while a call waited.
    #[error("the loader was closed")]
    Closed,
}

/// A stage of the pipeline (or of a mixture), as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Range reads of shards.
    Fetch,
    /// Local reads (a failpoint's name for the fetch stage's file reads).
    Read,
    /// Parquet decoding.
    Decode,
    /// The window permutation.
    Shuffle,
    /// Collation into slabs.
    Collate,
    /// A mixture's blending.
    Mix,
    /// Sequence packing.
    Pack,
}

impl Stage {
    /// The stage's name in messages, metrics and failpoints.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Fetch => "fetch",
            Stage::Read => "read",
            Stage::Decode => "decode",
            Stage::Shuffle => "shuffle",
            Stage::Collate => "collate",
            Stage::Mix => "mix",
            Stage::Pack => "pack",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq<&str> for Stage {
    fn eq(&self, name: &&str) -> bool {
        self.name() == *name
    }
}

impl LoaderError {
    /// A failure of `stage`, on `shard`'s `row_group` where known.
    pub(crate) fn stage(
        stage: Stage,
        shard: Option<String>,
        row_group: Option<usize>,
        detail: impl Into<String>,
    ) -> Self {
        LoaderError::Stage {
            stage,
            shard,
            row_group,
            detail: detail.into(),
        }
    }
}
