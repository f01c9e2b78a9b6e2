//! [`DecodeError`]: what the own reader found wrong, and where. It reaches
//! callers as parquet's `ParquetError::External`, so the loader's
//! `LoaderError::Decode` keeps one source type for both readers, and a
//! caller can downcast it.

use parquet::errors::ParquetError;

/// What the own Parquet reader found wrong, and where.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    /// A column chunk's pages contradict themselves, their chunk or the
    /// footer (levels, lengths, dictionary keys, compressed sizes).
    #[error("column {column}{}: {what}", offset.map(|o| format!(" (page at byte {o} of its chunk)")).unwrap_or_default())]
    Column {
        /// The column's path.
        column: String,
        /// Where the page starts in its column chunk, when known.
        offset: Option<usize>,
        /// What was wrong.
        what: String,
    },
    /// An encoding or type the own decoders do not read.
    #[error("column {column}: {what} is not supported")]
    Unsupported {
        /// The column's path.
        column: String,
        /// The encoding or type.
        what: String,
    },
    /// Decoding a column would pass the loader's byte budget.
    #[error(
        "column {column}: {count} values of {width} bytes would exceed the loader's byte budget ({limit} bytes)"
    )]
    OverBudget {
        /// The column's path.
        column: String,
        /// Values claimed.
        count: usize,
        /// Bytes per value.
        width: usize,
        /// The budget.
        limit: usize,
    },
    /// A row group the footer does not have, or of more rows than memory
    /// can index.
    #[error("row group {row_group}: {what}")]
    RowGroup {
        /// The row group.
        row_group: usize,
        /// What was wrong.
        what: String,
    },
    /// A column (or parquet's reader) decoded another number of rows than
    /// the footer gives.
    #[error("{} decoded {decoded} rows, the footer says {footer}", column.as_ref().map_or("parquet's reader".to_string(), |c| format!("column {c}")))]
    Rows {
        /// The column, or `None` for parquet's reader over several.
        column: Option<String>,
        /// Rows decoded.
        decoded: usize,
        /// Rows in the footer.
        footer: usize,
    },
    /// Bytes outside the ranges fetched.
    #[error("bytes {start}..{end} were not fetched")]
    NotFetched {
        /// The first byte asked for.
        start: u64,
        /// The byte after the last.
        end: u64,
    },
    /// Parquet's reader failed on the columns the own decoders leave to it.
    #[error("{} (parquet's reader): {detail}", columns_named(columns))]
    Reader {
        /// The columns it was reading.
        columns: Vec<String>,
        /// Its error.
        detail: String,
    },
    /// Parquet's reader panicked on malformed data.
    #[error(
        "{} (parquet's reader): failed on malformed data: {message}",
        columns_named(columns)
    )]
    Panicked {
        /// The columns it was reading.
        columns: Vec<String>,
        /// The panic's message.
        message: String,
    },
}

/// `column a` or `columns a, b`.
fn columns_named(columns: &[String]) -> String {
    match columns {
        [one] => format!("column {one}"),
        many => format!("columns {}", many.join(", ")),
    }
}

impl DecodeError {
    /// A [`DecodeError::Column`] without a page offset.
    pub(crate) fn column(column: &str, what: String) -> ParquetError {
        DecodeError::Column {
            column: column.to_string(),
            offset: None,
            what,
        }
        .into()
    }
}

/// Whether `error` is the own decoders meeting valid Parquet they do not
/// read (an encoding, a type): the column is then decoded by parquet's
/// reader instead.
pub(crate) fn is_unsupported(error: &ParquetError) -> bool {
    matches!(
        error,
        ParquetError::External(e)
            if matches!(e.downcast_ref::<DecodeError>(), Some(DecodeError::Unsupported { .. }))
    )
}

impl From<DecodeError> for ParquetError {
    fn from(e: DecodeError) -> Self {
        ParquetError::External(Box::new(e))
    }
}
