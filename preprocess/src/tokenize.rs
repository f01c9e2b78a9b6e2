//! `shard --tokenizer`: a text column to token ids while sharding.
//!
//! Every row group's text column is encoded with a Hugging Face tokenizer
//! file (the `tokenizers` crate: the Rust core of the Python package, so the
//! ids are the same as its `encode_batch`) on the encoder threads. Tokenizing
//! then scales with `--threads`, stays inside the row groups' memory bound,
//! and gives the same shards whatever the thread count. Rows are checked as
//! they are read ([`check_texts`]), where the file and row are known: a null
//! text is skipped and counted, or refused with `--strict`; a document past
//! an eighth of the memory budget is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, Int32Array, ListArray, RecordBatch, UInt32Array};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema, SchemaRef};
use sha2::{Digest, Sha256};
use shardfeed_format::TokenizerRecord;
use tokenizers::Tokenizer;

use crate::{PreprocessError, Result};

/// End-of-text tokens recognised when `--eos-token` is not given, in order.
const EOS_NAMES: &[&str] = &[
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
    "[EOS]",
];

/// Tokenizer files larger than this are refused (real ones are a few MB,
/// the largest published ones tens of MB).
pub(crate) const MAX_TOKENIZER_FILE: u64 = 256 << 20;

/// What `shard --tokenizer` does. Build with [`TokenizeOptions::new`] and the
/// `with_*` setters.
///
/// ```
/// use shardfeed_preprocess::TokenizeOptions;
/// let t = TokenizeOptions::new("tokenizer.json").with_text_column("body").with_add_eos(true);
/// assert_eq!(t.tokens_column, "input_ids");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeOptions {
    /// The tokenizer file (`tokenizer.json`).
    pub tokenizer: PathBuf,
    /// The string column to tokenize (`--text-column`, default `text`).
    pub text_column: String,
    /// The list column the ids go to (`--tokens-column`, default `input_ids`).
    pub tokens_column: String,
    /// Append the end-of-text id to every document (`--add-eos`).
    pub add_eos: bool,
    /// The end-of-text token, when the tokenizer marks none (`--eos-token`).
    pub eos_token: Option<String>,
    /// Keep the text column beside the ids (`--keep-text`).
    pub keep_text: bool,
    /// Refuse a null text instead of skipping and counting it (`--strict`).
    pub strict: bool,
}

impl TokenizeOptions {
    /// Tokenize column `text` with `tokenizer` into `input_ids`.
    pub fn new(tokenizer: impl Into<PathBuf>) -> Self {
        TokenizeOptions {
            tokenizer: tokenizer.into(),
            text_column: "text".into(),
            tokens_column: "input_ids".into(),
            add_eos: false,
            eos_token: None,
            keep_text: false,
            strict: false,
        }
    }
    /// Tokenize `column`.
    pub fn with_text_column(mut self, column: impl Into<String>) -> Self {
        self.text_column = column.into();
        self
    }
    /// Write the ids to `column`.
    pub fn with_tokens_column(mut self, column: impl Into<String>) -> Self {
        self.tokens_column = column.into();
        self
    }
    /// Append the end-of-text id to every document.
    pub fn with_add_eos(mut self, add_eos: bool) -> Self {
        self.add_eos = add_eos;
        self
    }
    /// Use `token` as the end-of-text token.
    pub fn with_eos_token(mut self, token: impl Into<String>) -> Self {
        self.eos_token = Some(token.into());
        self
    }
    /// Keep the text column.
    pub fn with_keep_text(mut self, keep: bool) -> Self {
        self.keep_text = keep;
        self
    }
    /// Refuse null texts.
    pub fn with_strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }
}

/// A loaded tokenizer and where its ids go. Each encoder thread works with
/// its own copy ([`TextTokenizer::clone`]): threads sharing one contend on
/// its regex's scratch pool (1.19M vs 1.51M tokens/s on 2 threads here).
#[derive(Clone)]
pub(crate) struct TextTokenizer {
    tokenizer: Tokenizer,
    /// Index of the text column in the input schema.
    text: usize,
    keep_text: bool,
    eos: Option<u32>,
    /// The ids' list item: `int32`, or `uint32` when ids past `i32::MAX` exist.
    item: FieldRef,
    schema: SchemaRef,
    record: TokenizerRecord,
    /// The memory that texts being tokenized at once may take.
    room: std::sync::Arc<Room>,
}

/// What tokenizing a text costs in memory, per byte of the text: the
/// tokenizer's encoding holds each token's string, offsets, word index and
/// masks (measured: 66 bytes a byte for a 16 MB document with a byte-level
/// BPE tokenizer; charged with room to spare).
pub(crate) const TOKENIZE_BYTES_PER_BYTE: u64 = 128;

/// Texts shorter than this are tokenized without taking room: what they
/// cost (at most 8 MiB each) is part of an encoder thread's own share.
const SMALL_TEXT: u64 = 64 << 10;

/// Memory shared by the encoder threads for long texts being tokenized:
/// each takes its cost before it is encoded and gives it back after, so
/// that texts tokenized at once stay within it whatever their count.
struct Room {
    limit: u64,
    used: std::sync::Mutex<u64>,
    freed: std::sync::Condvar,
}

impl Room {
    fn new(limit: u64) -> Self {
        Room {
            limit,
            used: std::sync::Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Wait until `cost` fits beside what others hold, then hold it until
    /// the returned guard is dropped (also when the tokenizer panics: the
    /// room is never lost to a failed text).
    fn take(&self, cost: u64) -> Taken<'_> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        while *used + cost > self.limit && *used > 0 {
            used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += cost;
        Taken { room: self, cost }
    }
}

/// Room held for one text being tokenized.
struct Taken<'a> {
    room: &'a Room,
    cost: u64,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        *self.room.used.lock().unwrap_or_else(|e| e.into_inner()) -= self.cost;
        self.room.freed.notify_all();
    }
}

fn tokenizer_error(path: &Path, reason: impl Into<String>) -> PreprocessError {
    PreprocessError::Tokenizer {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl TextTokenizer {
    /// Load `options.tokenizer` and check it against the input schema; long
    /// texts tokenized at once share `room` bytes.
    pub(crate) fn new(options: &TokenizeOptions, input: &Schema, room: u64) -> Result<Self> {
        let path = options.tokenizer.as_path();
        let (text, field) = input
            .column_with_name(&options.text_column)
            .ok_or_else(|| PreprocessError::BadOption {
                option: "--text-column",
                reason: format!(
                    "the inputs have no column {:?}; their columns: {}",
                    options.text_column,
                    input
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        if !matches!(
            field.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        ) {
            return Err(PreprocessError::BadOption {
                option: "--text-column",
                reason: format!(
                    "column {:?} holds {}, not strings",
                    options.text_column,
                    field.data_type()
                ),
            });
        }
        let clash = input.column_with_name(&options.tokens_column).is_some()
            && (options.keep_text || options.tokens_column != options.text_column);
        if clash || input.column_with_name("num_tokens").is_some() {
            return Err(PreprocessError::BadOption {
                option: "--tokens-column",
                reason: format!(
                    "the inputs already have a column {:?} or \"num_tokens\"; name the ids' column with --tokens-column",
                    options.tokens_column
                ),
            });
        }
        let meta = std::fs::metadata(path)
            .map_err(|e| tokenizer_error(path, format!("cannot read it: {e}")))?;
        if !meta.is_file() {
            return Err(tokenizer_error(
                path,
                "not a regular file (a tokenizer is a tokenizer.json file)",
            ));
        }
        let len = meta.len();
        if len > MAX_TOKENIZER_FILE {
            return Err(tokenizer_error(
                path,
                format!("{len} bytes is too large for a tokenizer file"),
            ));
        }
        // The size seen above may not be the size read (a device, a file
        // that grows): read at most one byte past the limit.
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| {
                use std::io::Read;
                f.take(MAX_TOKENIZER_FILE + 1).read_to_end(&mut bytes)
            })
            .map_err(|e| tokenizer_error(path, format!("cannot read it: {e}")))?;
        if bytes.len() as u64 > MAX_TOKENIZER_FILE {
            return Err(tokenizer_error(
                path,
                format!(
                    "it holds more than {MAX_TOKENIZER_FILE} bytes: too large for a tokenizer file"
                ),
            ));
        }
        let tokenizer = Tokenizer::from_bytes(&bytes)
            .map_err(|e| tokenizer_error(path, format!("not a valid tokenizer file: {e}")))?;
        let vocab_size = tokenizer.get_vocab_size(true) as u64;
        let eos = match &options.eos_token {
            Some(name) => Some(tokenizer.token_to_id(name).ok_or_else(|| {
                tokenizer_error(
                    path,
                    format!("--eos-token {name:?} is not in its vocabulary"),
                )
            })?),
            None => marked_eos(&tokenizer),
        };
        if options.add_eos && eos.is_none() {
            return Err(tokenizer_error(
                path,
                format!(
                    "--add-eos: it marks no end-of-text token (none of {}); name one with --eos-token",
                    EOS_NAMES.join(" ")
                ),
            ));
        }
        // The ids' type follows the largest id the tokenizer can produce
        // (its vocabulary's and added tokens' ids, which need not be below
        // the vocabulary's size), not the size.
        let max_id = tokenizer
            .get_vocab(true)
            .values()
            .copied()
            .chain(eos)
            .max()
            .unwrap_or(0);
        let item_type = if max_id > i32::MAX as u32 {
            DataType::UInt32
        } else {
            DataType::Int32
        };
        let item = Arc::new(Field::new("item", item_type, false));
        let mut fields: Vec<FieldRef> = input.fields().iter().cloned().collect();
        fields.splice(
            spliced(text, options.keep_text),
            [
                Arc::new(Field::new(
                    &options.tokens_column,
                    DataType::List(item.clone()),
                    false,
                )),
                Arc::new(Field::new("num_tokens", DataType::Int32, false)),
            ],
        );
        let schema = Arc::new(Schema::new_with_metadata(fields, input.metadata().clone()));
        if let Some(name) = shardfeed_format::duplicate_column(&schema) {
            return Err(PreprocessError::BadOption {
                option: "--tokens-column",
                reason: format!(
                    "the shards would have two columns named {name:?}; choose another name"
                ),
            });
        }
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let record = TokenizerRecord {
            file,
            sha256: hex(&Sha256::digest(&bytes)),
            vocab_size,
            eos_id: eos,
            add_eos: options.add_eos,
            text_column: options.text_column.clone(),
            tokens_column: options.tokens_column.clone(),
        };
        Ok(TextTokenizer {
            tokenizer,
            text,
            keep_text: options.keep_text,
            eos: eos.filter(|_| options.add_eos),
            item,
            schema,
            record,
            room: std::sync::Arc::new(Room::new(room)),
        })
    }

    /// The schema of the shards: the text column replaced by the ids and
    /// `num_tokens` (or followed by them with `--keep-text`).
    pub(crate) fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// What the manifest records.
    pub(crate) fn record(&self) -> TokenizerRecord {
        self.record.clone()
    }

    /// Tokenize `batch` (in the input schema, no null texts: see
    /// [`check_texts`]), row group `seq` of the run; the batch in the shards'
    /// schema and its token count.
    pub(crate) fn apply(&self, seq: u64, batch: &RecordBatch) -> Result<(RecordBatch, u64)> {
        let column = batch.column(self.text);
        let rows = batch.num_rows();
        let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
        offsets.push(0);
        let mut ids: Vec<u32> = Vec::new();
        let mut counts: Vec<i32> = Vec::with_capacity(rows);
        let too_many = || PreprocessError::Tokenize {
            row_group: seq,
            reason: "a row group holds more than 2^31 token ids; lower --row-group-size".into(),
        };
        for row in 0..rows {
            let text = text_at(column, row).ok_or_else(|| PreprocessError::Tokenize {
                row_group: seq,
                reason: format!("row {row} of a row group has a null text"),
            })?;
            let long = text.len() as u64 >= SMALL_TEXT;
            let cost = (text.len() as u64).saturating_mul(TOKENIZE_BYTES_PER_BYTE);
            if long && cost > self.room.limit {
                return Err(PreprocessError::Tokenize {
                    row_group: seq,
                    reason: format!(
                        "row {row} of a row group has a text of {} bytes: tokenizing it takes about {} ({TOKENIZE_BYTES_PER_BYTE} bytes a byte), more than the half of --memory-budget that texts being tokenized share ({}); raise --memory-budget to at least {}",
                        text.len(),
                        shardfeed_format::size::format_size(cost),
                        shardfeed_format::size::format_size(self.room.limit),
                        shardfeed_format::size::format_size(cost.saturating_mul(2)),
                    ),
                });
            }
            let taken = long.then(|| self.room.take(cost));
            let encoding = self.tokenizer.encode_fast(text, true);
            drop(taken);
            let encoding = encoding.map_err(|e| PreprocessError::Tokenize {
                row_group: seq,
                reason: format!("cannot encode a text: {e}"),
            })?;
            let start = ids.len();
            ids.extend_from_slice(encoding.get_ids());
            if let Some(eos) = self.eos {
                ids.push(eos);
            }
            let n = ids.len() - start;
            counts.push(i32::try_from(n).map_err(|_| too_many())?);
            offsets.push(i32::try_from(ids.len()).map_err(|_| too_many())?);
        }
        if self.item.data_type() == &DataType::Int32
            && let Some(id) = ids.iter().copied().find(|&id| id > i32::MAX as u32)
        {
            return Err(PreprocessError::Tokenize {
                row_group: seq,
                reason: format!(
                    "the tokenizer produced id {id}, past the largest id of its vocabulary: it would not fit the shards' int32 ids"
                ),
            });
        }
        let tokens = ids.len() as u64;
        let ids = Buffer::from_vec(ids);
        let len = ids.len() / 4;
        let values: ArrayRef = if self.item.data_type() == &DataType::UInt32 {
            Arc::new(UInt32Array::new(ScalarBuffer::new(ids, 0, len), None))
        } else {
            // The vocabulary is at most 2^31 ids: each one's bits are the same
            // non-negative i32 (the buffer is reinterpreted, not copied).
            Arc::new(Int32Array::new(ScalarBuffer::new(ids, 0, len), None))
        };
        let list = ListArray::try_new(
            self.item.clone(),
            OffsetBuffer::new(offsets.into()),
            values,
            None,
        )
        .map_err(|e| PreprocessError::Tokenize {
            row_group: seq,
            reason: e.to_string(),
        })?;
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns.splice(
            spliced(self.text, self.keep_text),
            [
                Arc::new(list) as ArrayRef,
                Arc::new(Int32Array::from(counts)),
            ],
        );
        let out = RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| {
            PreprocessError::Tokenize {
                row_group: seq,
                reason: e.to_string(),
            }
        })?;
        Ok((out, tokens))
    }
}

/// Where the ids and `num_tokens` go among the columns: in place of the
/// text column at `text`, or after it when it is kept.
fn spliced(text: usize, keep_text: bool) -> std::ops::Range<usize> {
    if keep_text {
        text + 1..text + 1
    } else {
        text..text + 1
    }
}

/// The text of `row`, or `None` when it is null.
fn text_at(column: &ArrayRef, row: usize) -> Option<&str> {
    if column.is_null(row) {
        return None;
    }
    match column.data_type() {
        DataType::Utf8 => Some(column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Some(column.as_string::<i64>().value(row)),
        DataType::Utf8View => Some(column.as_string_view().value(row)),
        _ => None,
    }
}

/// The end-of-text token a tokenizer marks: a special added token with one
/// of the usual names.
fn marked_eos(tokenizer: &Tokenizer) -> Option<u32> {
    let added = tokenizer.get_added_tokens_decoder();
    EOS_NAMES.iter().find_map(|name| {
        added
            .iter()
            .find(|(_, t)| t.special && t.content == *name)
            .map(|(id, _)| *id)
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rows of one input batch checked before tokenizing: null texts removed
/// (counted), or refused with `strict`; a text longer than `max_text` bytes
/// refused. `first_row` is the batch's first row within `path`.
pub(crate) fn check_texts(
    batch: RecordBatch,
    column: &str,
    strict: bool,
    max_text: u64,
    path: &Path,
    first_row: u64,
) -> Result<(RecordBatch, u64)> {
    let Some(index) = batch.schema().index_of(column).ok() else {
        return Ok((batch, 0));
    };
    let texts = batch.column(index).clone();
    let at = |row: usize| Some(format!("row {} (from 0)", first_row + row as u64));
    for row in 0..texts.len() {
        if let Some(text) = text_at(&texts, row)
            && text.len() as u64 > max_text
        {
            return Err(PreprocessError::read(
                path,
                at(row),
                format!(
                    "a text of {} bytes in column {column:?} is larger than an eighth of --memory-budget ({max_text} bytes); raise the budget or split the document",
                    text.len()
                ),
            ));
        }
    }
    let nulls = texts.null_count();
    if nulls == 0 {
        return Ok((batch, 0));
    }
    if strict {
        let row = (0..texts.len()).find(|&r| texts.is_null(r)).unwrap_or(0);
        return Err(PreprocessError::read(
            path,
            at(row),
            format!("null text in column {column:?} (--strict)"),
        ));
    }
    let keep = BooleanArray::from_iter((0..texts.len()).map(|r| Some(texts.is_valid(r))));
    let kept = arrow_select::filter::filter_record_batch(&batch, &keep)
        .map_err(|e| PreprocessError::read(path, None, e))?;
    Ok((kept, nulls as u64))
}
