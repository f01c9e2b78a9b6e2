//! Required `list<int32>` of required items (token ids): repetition and
//! definition levels of at most 1. Row starts come from the repetition
//! levels eight at a time and values go straight into one buffer.
//!
//! Counts are checked before anything grows: a page's levels against the
//! byte limit, row starts against the row group's rows as they are found
//! (so a few forged bytes cannot push millions of offsets first), and the
//! values against `i32` offsets.

use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::Encoding;
use parquet::column::page::Page;
use parquet::errors::Result;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;

use super::error::DecodeError;
use super::levels::all_defined;
use super::page::{LevelPage, Pages, v1_levels};
use super::rle::{Bits, gather_dictionary, low_bits, walk_bits};
use super::{Limits, single_leaf};

/// The leaf of root column `root` when it is a required list of required
/// int32 (token ids): one leaf, repetition and definition levels at most 1.
pub(super) fn list_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<usize> {
    let leaf = single_leaf(arrow, root)?;
    let column = arrow.metadata().file_metadata().schema_descr().column(leaf);
    let field = arrow.schema().fields().get(root)?;
    let list_of_i32 = matches!(
        field.data_type(),
        DataType::List(item) if item.data_type() == &DataType::Int32
    );
    (list_of_i32
        && column.physical_type() == parquet::basic::Type::INT32
        && column.max_rep_level() == 1
        && column.max_def_level() == 1)
        .then_some(leaf)
}

/// Decode the list column chunk `chunk` of a row group with `rows` rows
/// straight into its offsets and values. With `want < rows`, decoding stops
/// after the page in which row `want` starts (rows `0..want` are then
/// complete) and the array holds exactly `want` rows.
pub(super) fn decode_list_i32<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    (rows, want): (usize, usize),
    data_type: &DataType,
    limits: &Limits,
) -> Result<ArrayRef> {
    let DataType::List(item) = data_type else {
        return Err(DecodeError::Unsupported {
            column: chunk.column_path().string(),
            what: format!("{data_type} (not a list)"),
        }
        .into());
    };
    let path = chunk.column_path().string();
    let err = |e: String| DecodeError::column(&path, e);
    limits.check(rows.saturating_add(1), 4, &path)?;
    let mut pages = Pages::open(file, chunk, rows, limits)?;
    let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
    // The footer's value count is a claim: reserve no more than the limit.
    let claimed = usize::try_from(chunk.num_values()).unwrap_or(0);
    let mut values: Vec<i32> = Vec::with_capacity(claimed.min(limits.max_bytes / 4));
    let mut dictionary: Option<Vec<i32>> = None;
    let mut data_seen = false;
    let mut def_expanded: Vec<u8> = Vec::new();
    let mut levels_seen = 0usize;
    while let Some(page) = pages.next_page()? {
        let page = match page {
            Page::DictionaryPage {
                buf, num_values, ..
            } => {
                // One dictionary, first: values are looked up as pages come.
                if dictionary.is_some() || data_seen {
                    return Err(err(
                        "a dictionary page after the chunk's first page (a chunk has at most one, first)"
                            .into(),
                    ));
                }
                let n = num_values as usize;
                let bytes = n
                    .checked_mul(4)
                    .and_then(|b| buf.get(..b))
                    .ok_or_else(|| err(format!("a dictionary page too short for {n} values")))?;
                dictionary = Some(
                    bytes
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")))
                        .collect(),
                );
                continue;
            }
            Page::DataPage {
                buf,
                num_values,
                encoding,
                def_level_encoding,
                rep_level_encoding,
                ..
            } => {
                if def_level_encoding != Encoding::RLE || rep_level_encoding != Encoding::RLE {
                    return Err(err(format!(
                        "level encodings {rep_level_encoding}/{def_level_encoding} are not supported"
                    )));
                }
                let (rep, def, values) = v1_levels(&buf).map_err(err)?;
                LevelPage {
                    rep,
                    def,
                    values,
                    num_levels: num_values as usize,
                    encoding,
                }
            }
            Page::DataPageV2 {
                buf,
                num_values,
                encoding,
                def_levels_byte_len,
                rep_levels_byte_len,
                ..
            } => {
                let (r, d) = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                let end = r
                    .checked_add(d)
                    .filter(|&end| end <= buf.len())
                    .ok_or_else(|| err("levels overrun the page".into()))?;
                LevelPage {
                    rep: buf.slice(..r),
                    def: buf.slice(r..end),
                    values: buf.slice(end..),
                    num_levels: num_values as usize,
                    encoding,
                }
            }
        };
        data_seen = true;
        let n = page.num_levels;
        // Every level is a value or an empty row: at most one 4-byte value
        // or offset each, so the levels of a row group are bounded by the
        // byte limit, checked before any is expanded.
        levels_seen = levels_seen
            .checked_add(n)
            .ok_or_else(|| err("too many levels".into()))?;
        limits.check(levels_seen, 4, &path)?;
        let base = values.len();
        if base.saturating_add(n) > i32::MAX as usize {
            return Err(err("more than 2^31 values in one row group".into()));
        }
        // Definition levels: all 1 (no empty lists) is the common case, where
        // value index = level index; otherwise expand them.
        let dense = all_defined(&page.def, n).map_err(err)?;
        let present = if dense {
            n
        } else {
            def_expanded.clear();
            walk_bits(&page.def, n, |bits| match bits {
                Bits::Run { len, value, .. } => {
                    def_expanded.extend(std::iter::repeat_n(value, len));
                }
                Bits::Byte { byte, valid, .. } => {
                    def_expanded.extend((0..valid).map(|i| (byte >> i) & 1));
                }
            })
            .map_err(err)?;
            def_expanded.iter().map(|&d| d as usize).sum()
        };
        // Row starts (repetition level 0), as value indices: the level index
        // when every level holds a value, else the values before the level.
        // Starts past the row group's rows are counted, not stored.
        // With a prefix asked for, one start past it marks its last row's end.
        let prefix = want < rows;
        let mut starts = RowStarts {
            offsets: &mut offsets,
            rows: if prefix { want + 1 } else { rows },
            base,
            dense,
            defs: &def_expanded,
            level_at: 0,
            values_at: 0,
            extra: 0,
        };
        walk_bits(&page.rep, n, |bits| match bits {
            Bits::Run {
                first,
                len,
                value: 0,
            } => {
                // A run of row starts: only as many as rows remain are visited.
                let room = starts.room().min(len);
                (first..first + room).for_each(|level| starts.push(level));
                starts.extra += len - room;
            }
            Bits::Run { .. } => {}
            Bits::Byte { first, byte, valid } => {
                let mut zeros = !byte & low_bits(valid);
                while zeros != 0 {
                    starts.push(first + zeros.trailing_zeros() as usize);
                    zeros &= zeros - 1;
                }
            }
        })
        .map_err(err)?;
        let extra_rows = starts.extra;
        if extra_rows > 0 && !prefix {
            return Err(err(format!(
                "pages hold more than the row group's {rows} rows"
            )));
        }
        match page.encoding {
            Encoding::PLAIN => {
                let bytes = present
                    .checked_mul(4)
                    .and_then(|b| page.values.get(..b))
                    .ok_or_else(|| err(format!("a plain page too short for {present} values")))?;
                values.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes"))),
                );
            }
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                gather_dictionary(&page.values, present, dictionary.as_deref(), &mut values)
                    .map_err(err)?;
            }
            other => return Err(err(format!("encoding {other} is not supported"))),
        }
        if want < rows && offsets.len() > want {
            // Rows 0..want are complete: the pages after are not decoded.
            break;
        }
    }
    if want < rows && offsets.len() > want {
        offsets.truncate(want + 1);
        let end = offsets[want] as usize;
        values.truncate(end);
        return list_array(item, offsets, values);
    }
    if offsets.len() != rows {
        return Err(err(format!(
            "holds {} rows; the footer says {rows}",
            offsets.len()
        )));
    }
    if offsets.first().is_some_and(|&first| first != 0) {
        return Err(err(
            "the first level continues a row (repetition level 1)".into()
        ));
    }
    offsets.push(values.len() as i32);
    list_array(item, offsets, values)
}

/// The list array of `offsets` (one more than its rows) and `values`.
fn list_array(
    item: &arrow_schema::FieldRef,
    offsets: Vec<i32>,
    values: Vec<i32>,
) -> Result<ArrayRef> {
    let list = arrow_array::ListArray::try_new(
        item.clone(),
        arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
        Arc::new(Int32Array::from(values)),
        None,
    )?;
    Ok(Arc::new(list))
}

/// Row starts of one page being appended to a chunk's offsets.
struct RowStarts<'a> {
    offsets: &'a mut Vec<i32>,
    /// Rows of the row group: no more starts are stored.
    rows: usize,
    /// Values before the page.
    base: usize,
    /// Every level of the page holds a value.
    dense: bool,
    /// The page's definition levels, expanded (when not dense).
    defs: &'a [u8],
    level_at: usize,
    values_at: usize,
    /// Starts past `rows`, counted.
    extra: usize,
}

impl RowStarts<'_> {
    /// Starts that still fit the row group.
    fn room(&self) -> usize {
        self.rows - self.offsets.len().min(self.rows)
    }

    /// A row starts at `level` of the page.
    fn push(&mut self, level: usize) {
        if self.offsets.len() >= self.rows {
            self.extra += 1;
            return;
        }
        let index = if self.dense {
            level
        } else {
            self.values_at += self.defs[self.level_at..level]
                .iter()
                .map(|&d| d as usize)
                .sum::<usize>();
            self.level_at = level;
            self.values_at
        };
        // Fits: base + index <= base + levels <= i32::MAX (checked by the caller).
        self.offsets.push((self.base + index) as i32);
    }
}
