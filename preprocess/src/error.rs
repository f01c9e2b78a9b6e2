use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = PreprocessError> = std::result::Result<T, E>;

/// A boxed error from a reader (Arrow, Parquet, JSON, CSV, I/O).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong turning inputs into a dataset.
///
/// Each variant names the file, option or location involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreprocessError {
    /// No inputs were given.
    #[error("no inputs given")]
    NoInputs,
    /// An input path does not exist.
    #[error("input {path} does not exist")]
    InputNotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// A glob matched nothing.
    #[error("input pattern {pattern:?} matches no files")]
    NoMatch {
        /// The pattern.
        pattern: String,
    },
    /// The format of an input could not be told from its name.
    #[error("cannot tell the format of {path} from its extension; pass --format")]
    UnknownFormat {
        /// The input.
        path: PathBuf,
    },
    /// Reading an input failed; `location` names the line, row or batch when known.
    #[error("{path}{}: {source}", location.as_deref().map(|l| format!(": {l}")).unwrap_or_default())]
    Read {
        /// The input file.
        path: PathBuf,
        /// Where in the file, e.g. `line 17`.
        location: Option<String>,
        /// What went wrong.
        source: BoxError,
    },
    /// An input file is empty (zero bytes).
    #[error("input {path} is empty (0 bytes)")]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// Two inputs have different schemas.
    #[error("schema of {other} differs from {first}: {detail}")]
    SchemaMismatch {
        /// The input whose schema the dataset takes.
        first: PathBuf,
        /// The input that differs.
        other: PathBuf,
        /// The first differing field.
        detail: String,
    },
    /// All inputs together hold no rows.
    #[error("the inputs hold no rows: {inputs}")]
    NoRows {
        /// The inputs, comma separated.
        inputs: String,
    },
    /// An option has an invalid value.
    #[error("invalid option {option}: {reason}")]
    BadOption {
        /// The option, as spelled on the command line.
        option: &'static str,
        /// Why it is refused.
        reason: String,
    },
    /// The output already holds a dataset.
    #[error(
        "a dataset already exists at {url} (it has a manifest.json); pass --overwrite to replace it"
    )]
    DatasetExists {
        /// The dataset URL.
        url: String,
    },
    /// Local file I/O failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Encoding a row group or finishing a shard failed.
    #[error("writing shard {shard}: {source}")]
    Encode {
        /// The shard's relative path.
        shard: String,
        /// The Parquet error.
        source: parquet::errors::ParquetError,
    },
    /// `index` could not take a file (not Parquet, changed while read, a
    /// schema that differs, unreadable).
    #[error("cannot index {file}: {reason}")]
    Index {
        /// The file's URL or path.
        file: String,
        /// Why.
        reason: String,
    },
    /// The dataset store failed (manifest, uploads).
    #[error(transparent)]
    Format(#[from] shardfeed_format::FormatError),
    /// `commit` found the split run unfinished or inconsistent.
    #[error("cannot commit {url}: {reason}")]
    Commit {
        /// The dataset URL.
        url: String,
        /// What is missing or inconsistent.
        reason: String,
    },
    /// A shuffled task's gather found tasks that have not scattered their
    /// rows (at once with `--stage gather`, else after `--wait-timeout`).
    #[error("cannot gather task {task}'s rows into {url}: {reason}")]
    Gather {
        /// The dataset URL.
        url: String,
        /// The task gathering.
        task: usize,
        /// Which tasks have not scattered.
        reason: String,
    },
    /// Another writer holds the dataset's lock.
    #[error(
        "{url} is being written by {holder}; a second writer would replace or remove its shards. Wait for it to finish; if that run died on another machine, delete {url}/_shardfeed.lock"
    )]
    Locked {
        /// The dataset.
        url: String,
        /// Who holds the lock.
        holder: String,
    },
    /// The output holds task records of another split run.
    #[error("{url} holds task records of another run: {detail}")]
    OtherRun {
        /// The dataset.
        url: String,
        /// Which records, and what to do.
        detail: String,
    },
    /// The tokenizer file cannot be used (`--tokenizer`).
    #[error("tokenizer {path}: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Tokenizing a row group's texts failed.
    #[error("tokenizing row group {row_group}: {reason}")]
    Tokenize {
        /// The row group, counted over the run from 0.
        row_group: u64,
        /// What went wrong.
        reason: String,
    },
    /// A pipeline thread stopped because another one failed first (that
    /// error is the one reported), or a failpoint stopped the run.
    #[error("cancelled")]
    Cancelled,
}

impl PreprocessError {
    pub(crate) fn read(
        path: impl Into<PathBuf>,
        location: Option<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        PreprocessError::Read {
            path: path.into(),
            location,
            source: source.into(),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PreprocessError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
