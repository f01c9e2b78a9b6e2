use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = FormatError> = std::result::Result<T, E>;

/// Everything that can go wrong reading or validating a dataset's contract.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The manifest is not valid JSON or misses a required field.
    #[error("manifest {url} is not valid: {source}")]
    ManifestParse {
        /// Where the manifest was read from.
        url: String,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The manifest parsed but breaks an invariant.
    #[error("manifest {url} is not valid: {reason}")]
    ManifestInvalid {
        /// Where the manifest was read from.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The manifest was written by a newer, incompatible version.
    #[error(
        "manifest {url} has format {format} version {version}; this build reads {expected} version {expected_version}"
    )]
    UnsupportedVersion {
        /// Where the manifest was read from.
        url: String,
        /// The format name found.
        format: String,
        /// The version found.
        version: u32,
        /// The format name this build reads.
        expected: &'static str,
        /// The version this build reads.
        expected_version: u32,
    },
    /// A shard path in a manifest is absolute, escapes the dataset or is malformed.
    #[error("shard path {path:?} is not allowed: {reason}")]
    BadShardPath {
        /// The offending path.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A dataset URL could not be understood.
    #[error("dataset location {url:?} is not valid: {reason}")]
    BadLocation {
        /// The URL or path given.
        url: String,
        /// Why it is refused.
        reason: String,
    },
    /// A local path could not be prepared.
    #[error("cannot use local path {path}: {source}")]
    LocalPath {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The object store failed.
    #[error("{op} {url}: {error}")]
    Store {
        /// What was being done (`read`, `write`, ...).
        op: &'static str,
        /// The object's URL.
        url: String,
        /// The store's error.
        error: StoreError,
    },
    /// A size string such as `128MiB` could not be parsed.
    #[error("invalid size {input:?}: {reason}")]
    BadSize {
        /// What was given.
        input: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A checksum string in a manifest or footer is malformed.
    #[error("invalid checksum {input:?}: {reason}")]
    BadChecksum {
        /// What was found.
        input: String,
        /// Why it is refused.
        reason: &'static str,
    },
}

/// An object store error whose message is shown with secrets redacted
/// (store clients quote request URLs, which can carry SAS tokens or
/// presigned signatures). It is not exposed as an error source, so no error
/// chain prints the raw message either; [`StoreError::inner`] gives it to code.
pub struct StoreError(pub object_store::Error);

impl StoreError {
    /// The store's error.
    pub fn inner(&self) -> &object_store::Error {
        &self.0
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::redact::text(&self.0.to_string()))
    }
}

impl std::fmt::Debug for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreError({self})")
    }
}

impl std::error::Error for StoreError {}

impl From<object_store::Error> for StoreError {
    fn from(error: object_store::Error) -> Self {
        StoreError(error)
    }
}
