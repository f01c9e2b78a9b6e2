//! Lists of integers (token ids): `list` or `large_list` of int8..uint64
//! items (Parquet INT32 or INT64), repetition levels of at most 1. A required
//! list of required items (definition levels of at most 1, the project's own
//! shards): row starts come from the repetition levels eight at a time and
//! values go straight into one buffer. Nullable lists and nullable items
//! (definition levels up to 3, as pyarrow, polars, Hugging Face datasets and
//! most exports write them): a page whose levels are all at the maximum (no
//! null, no empty list) takes the same path; other pages are walked level by
//! level, with the lists' and the items' validity.
//!
//! Counts are checked before anything grows: a page's levels against the
//! byte limit, row starts against the row group's rows as they are found
//! (so a few forged bytes cannot push millions of offsets first), and the
//! values against `i32` offsets (a `large_list` row group too: one of more
//! than 2^31 values would pass any byte budget).

use std::sync::Arc;

use arrow_array::{ArrayRef, Int32Array};
use arrow_buffer::{BooleanBufferBuilder, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
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
use super::rle::{Bits, KeySink, decode_hybrid_into, gather_dictionary, low_bits, walk_bits};
use super::{Limits, single_leaf};

/// The leaf of root column `root` when it is a list of int32 (token ids),
/// nullable or not, of items nullable or not: one leaf, repetition level at
/// most 1, and definition levels that are the list's, the repeated group's
/// and the item's ([`Shape`]).
pub(super) fn list_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<usize> {
    let leaf = single_leaf(arrow, root)?;
    let column = arrow.metadata().file_metadata().schema_descr().column(leaf);
    let field = arrow.schema().fields().get(root)?;
    let item = match field.data_type() {
        DataType::List(item) | DataType::LargeList(item) => item,
        _ => return None,
    };
    let item_nullable = item.is_nullable();
    let physical = match item.data_type() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => parquet::basic::Type::INT32,
        DataType::Int64 | DataType::UInt64 => parquet::basic::Type::INT64,
        _ => return None,
    };
    let shape = Shape::of(column.max_def_level(), column.self_type().is_optional())?;
    (column.physical_type() == physical
        && column.max_rep_level() == 1
        && shape.item_nullable == item_nullable)
        .then_some(leaf)
}

/// What a list column's definition levels mean: below `list` the list is
/// null (only when the list is nullable, `list` = 1); at `list` it is empty;
/// above it an item, null at `max - 1` when items are nullable, a value at
/// `max`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Shape {
    max: u8,
    list: u8,
    item_nullable: bool,
}

impl Shape {
    /// The shape of a leaf with `max_def` definition levels whose item is
    /// `optional`; `None` for shapes of other nesting.
    fn of(max_def: i16, optional: bool) -> Option<Shape> {
        let list = max_def.checked_sub(1 + optional as i16)?;
        (0..=1).contains(&list).then_some(Shape {
            max: max_def as u8,
            list: list as u8,
            item_nullable: optional,
        })
    }

    /// Bits per definition level.
    fn bit_width(self) -> u8 {
        8 - self.max.leading_zeros() as u8
    }
}

/// Decode the list column chunk `chunk` of a row group with `rows` rows
/// straight into its offsets and values. With `want < rows`, decoding stops
/// after the page in which row `want` starts (rows `0..want` are then
/// complete) and the array holds exactly `want` rows.
pub(super) fn decode_list<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    rows: (usize, usize),
    data_type: &DataType,
    limits: &Limits,
) -> Result<ArrayRef> {
    let (item, large) = match data_type {
        DataType::List(item) => (item, false),
        DataType::LargeList(item) => (item, true),
        _ => {
            return Err(DecodeError::Unsupported {
                column: chunk.column_path().string(),
                what: format!("{data_type} (not a list)"),
            }
            .into());
        }
    };
    let list = ListType { item, large };
    match chunk.column_descr().physical_type() {
        parquet::basic::Type::INT32 => decode_list_of::<R, i32>(file, chunk, rows, list, limits),
        parquet::basic::Type::INT64 => decode_list_of::<R, i64>(file, chunk, rows, list, limits),
        other => Err(DecodeError::Unsupported {
            column: chunk.column_path().string(),
            what: format!("list items of physical type {other}"),
        }
        .into()),
    }
}

/// The list type being decoded: its item field, and whether its offsets
/// are 64-bit (`large_list`).
#[derive(Clone, Copy)]
struct ListType<'a> {
    item: &'a arrow_schema::FieldRef,
    large: bool,
}

/// [`decode_list`] with items of physical type `P`.
fn decode_list_of<R: ChunkReader + 'static, P: Physical>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    (rows, want): (usize, usize),
    list: ListType<'_>,
    limits: &Limits,
) -> Result<ArrayRef> {
    let path = chunk.column_path().string();
    let err = |e: String| DecodeError::column(&path, e);
    let descr = chunk.column_descr();
    let shape = Shape::of(descr.max_def_level(), descr.self_type().is_optional())
        .ok_or_else(|| err(format!("{} definition levels", descr.max_def_level())))?;
    if shape.max != 1 {
        return decode_nullable::<R, P>(file, chunk, (rows, want), list, shape, limits);
    }
    limits.check(rows.saturating_add(1), 4, &path)?;
    let mut pages = Pages::open(file, chunk, rows, limits)?;
    let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
    // The footer's value count is a claim: reserve no more than the limit.
    let claimed = usize::try_from(chunk.num_values()).unwrap_or(0);
    let mut values: Vec<P> = Vec::with_capacity(claimed.min(limits.max_bytes / P::WIDTH));
    let mut dictionary: Option<Vec<P>> = None;
    let mut data_seen = false;
    let mut def_expanded: Vec<u8> = Vec::new();
    let mut levels_seen = 0usize;
    while let Some(page) = next_level_page(&mut pages, &mut dictionary, &mut data_seen, &err)? {
        let n = page.num_levels;
        // Every level is a value or an empty row: at most one 4-byte value
        // or offset each, so the levels of a row group are bounded by the
        // byte limit, checked before any is expanded.
        levels_seen = levels_seen
            .checked_add(n)
            .ok_or_else(|| err("too many levels".into()))?;
        limits.check(levels_seen, P::WIDTH, &path)?;
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
        starts.walk(&page.rep, n).map_err(err)?;
        let extra_rows = starts.extra;
        if extra_rows > 0 && !prefix {
            return Err(err(format!(
                "pages hold more than the row group's {rows} rows"
            )));
        }
        page_values(&page, present, dictionary.as_deref(), &mut values).map_err(err)?;
        if want < rows && offsets.len() > want {
            // Rows 0..want are complete: the pages after are not decoded.
            break;
        }
    }
    if want < rows && offsets.len() > want {
        offsets.truncate(want + 1);
        let end = offsets[want] as usize;
        values.truncate(end);
        return list_array(list, offsets, values, None, None);
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
    list_array(list, offsets, values, None, None)
}

/// [`decode_list_of`] of a column with nullable lists or items (`shape`).
fn decode_nullable<R: ChunkReader + 'static, P: Physical>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    (rows, want): (usize, usize),
    list: ListType<'_>,
    shape: Shape,
    limits: &Limits,
) -> Result<ArrayRef> {
    let path = chunk.column_path().string();
    let err = |e: String| DecodeError::column(&path, e);
    limits.check(rows.saturating_add(1), 4, &path)?;
    let mut pages = Pages::open(file, chunk, rows, limits)?;
    let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
    let claimed = usize::try_from(chunk.num_values()).unwrap_or(0);
    let mut values: Vec<P> = Vec::with_capacity(claimed.min(limits.max_bytes / P::WIDTH));
    // Validity of lists and of items, made at the first null (earlier
    // entries valid).
    let mut lists_valid: Option<BooleanBufferBuilder> = None;
    let mut items_valid: Option<BooleanBufferBuilder> = None;
    let mut dictionary: Option<Vec<P>> = None;
    let mut data_seen = false;
    let (mut defs, mut reps, mut present_values) = (Vec::new(), Vec::new(), Vec::new());
    let mut levels_seen = 0usize;
    // Rows stored: the row group's, or one past a prefix (its last row's end).
    let cap = if want < rows { want + 1 } else { rows };
    let mut extra_rows = 0usize;
    while let Some(page) = next_level_page(&mut pages, &mut dictionary, &mut data_seen, &err)? {
        let n = page.num_levels;
        present_values.clear();
        // At most one 4-byte value or offset a level.
        levels_seen = levels_seen
            .checked_add(n)
            .ok_or_else(|| err("too many levels".into()))?;
        limits.check(levels_seen, P::WIDTH, &path)?;
        let base = values.len();
        if base.saturating_add(n) > i32::MAX as usize {
            return Err(err("more than 2^31 values in one row group".into()));
        }
        defs.clear();
        let mut sink = Levels(&mut defs);
        decode_hybrid_into(&page.def, shape.bit_width(), n, &mut sink).map_err(err)?;
        if let Some(&bad) = defs.iter().find(|&&d| d > shape.max) {
            return Err(err(format!(
                "definition level {bad} over the column's {}",
                shape.max
            )));
        }
        let rows_before = offsets.len();
        let present = if defs.iter().all(|&d| d == shape.max) {
            // No null and no empty list: every level is a value.
            let mut starts = RowStarts {
                offsets: &mut offsets,
                rows: cap,
                base,
                dense: true,
                defs: &[],
                level_at: 0,
                values_at: 0,
                extra: 0,
            };
            starts.walk(&page.rep, n).map_err(err)?;
            extra_rows += starts.extra;
            if let Some(v) = &mut lists_valid {
                v.append_n(offsets.len() - rows_before, true);
            }
            if let Some(v) = &mut items_valid {
                v.append_n(n, true);
            }
            n
        } else {
            reps.clear();
            walk_bits(&page.rep, n, |bits| match bits {
                Bits::Run { len, value, .. } => reps.extend(std::iter::repeat_n(value, len)),
                Bits::Byte { byte, valid, .. } => reps.extend((0..valid).map(|i| (byte >> i) & 1)),
            })
            .map_err(err)?;
            // Slots: `u32::MAX` for a null item, else a value's index in the page.
            let mut items = 0usize;
            let mut present = 0usize;
            for (&rep, &def) in reps.iter().zip(&defs) {
                if rep == 0 {
                    if offsets.len() < cap {
                        let valid = def >= shape.list;
                        if !valid && lists_valid.is_none() {
                            let mut v = BooleanBufferBuilder::new(rows);
                            v.append_n(offsets.len(), true);
                            lists_valid = Some(v);
                        }
                        if let Some(v) = &mut lists_valid {
                            v.append(valid);
                        }
                        offsets.push((base + items) as i32);
                    } else {
                        extra_rows += 1;
                    }
                }
                if def > shape.list {
                    let valid = def == shape.max;
                    if !valid && items_valid.is_none() {
                        let mut v = BooleanBufferBuilder::new(claimed.min(limits.max_bytes / 4));
                        v.append_n(base + items, true);
                        items_valid = Some(v);
                    }
                    if let Some(v) = &mut items_valid {
                        v.append(valid);
                    }
                    present_values.push(if valid { present as u32 } else { u32::MAX });
                    present += valid as usize;
                    items += 1;
                }
            }
            present
        };
        if extra_rows > 0 && want >= rows {
            return Err(err(format!(
                "pages hold more than the row group's {rows} rows"
            )));
        }
        let before = values.len();
        page_values(&page, present, dictionary.as_deref(), &mut values).map_err(err)?;
        if present_values.len() > present {
            // Spread the page's values over its item slots in place, nulls
            // as 0: from the last slot down, as a value's index in the page
            // is never above its slot's, nothing is overwritten before it
            // is read.
            values.resize(before + present_values.len(), P::default());
            for (slot, &k) in present_values.iter().enumerate().rev() {
                values[before + slot] = if k == u32::MAX {
                    P::default()
                } else {
                    values[before + k as usize]
                };
            }
            present_values.clear();
        }
        if want < rows && offsets.len() > want {
            break;
        }
    }
    let mut rows_out = rows;
    if want < rows && offsets.len() > want {
        offsets.truncate(want + 1);
        values.truncate(offsets[want] as usize);
        rows_out = want;
    } else if offsets.len() != rows {
        return Err(err(format!(
            "holds {} rows; the footer says {rows}",
            offsets.len()
        )));
    } else {
        offsets.push(values.len() as i32);
    }
    if offsets.first().is_some_and(|&first| first != 0) {
        return Err(err(
            "the first level continues a row (repetition level 1)".into()
        ));
    }
    let finish = |v: Option<BooleanBufferBuilder>, len: usize| {
        v.map(|mut v| {
            v.truncate(len);
            let missing = len.saturating_sub(v.len());
            v.append_n(missing, true);
            NullBuffer::new(v.finish())
        })
    };
    let list_nulls = finish(lists_valid, rows_out);
    let item_nulls = finish(items_valid, values.len());
    list_array(list, offsets, values, list_nulls, item_nulls)
}

/// Append the `present` values of a data page (plain, or looked up in
/// `dictionary`) to `values`.
fn page_values<P: Physical>(
    page: &LevelPage,
    present: usize,
    dictionary: Option<&[P]>,
    values: &mut Vec<P>,
) -> std::result::Result<(), String> {
    match page.encoding {
        Encoding::PLAIN => {
            let bytes = present
                .checked_mul(P::WIDTH)
                .and_then(|b| page.values.get(..b))
                .ok_or_else(|| format!("a plain page too short for {present} values"))?;
            values.extend(bytes.chunks_exact(P::WIDTH).map(P::from_le));
            Ok(())
        }
        Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
            gather_dictionary(&page.values, present, dictionary, values)
        }
        other => Err(format!("encoding {other} is not supported")),
    }
}

/// Definition levels, decoded.
struct Levels<'a>(&'a mut Vec<u8>);

impl KeySink for Levels<'_> {
    fn run(&mut self, key: i32, len: usize) {
        self.0.extend(std::iter::repeat_n(key as u8, len));
    }

    fn keys(&mut self, keys: &[i32]) {
        self.0.extend(keys.iter().map(|&k| k as u8));
    }
}

/// The chunk's next data page as levels and values, reading a dictionary
/// page (at most one, first) into `dictionary` on the way; `None` after the
/// last page.
fn next_level_page<R: ChunkReader + 'static, P: Physical>(
    pages: &mut Pages<R>,
    dictionary: &mut Option<Vec<P>>,
    data_seen: &mut bool,
    err: &dyn Fn(String) -> parquet::errors::ParquetError,
) -> Result<Option<LevelPage>> {
    while let Some(page) = pages.next_page()? {
        let page = match page {
            Page::DictionaryPage {
                buf, num_values, ..
            } => {
                // One dictionary, first: values are looked up as pages come.
                if dictionary.is_some() || *data_seen {
                    return Err(err(
                        "a dictionary page after the chunk's first page (a chunk has at most one, first)"
                            .into(),
                    ));
                }
                let n = num_values as usize;
                let bytes = n
                    .checked_mul(P::WIDTH)
                    .and_then(|b| buf.get(..b))
                    .ok_or_else(|| err(format!("a dictionary page too short for {n} values")))?;
                *dictionary = Some(bytes.chunks_exact(P::WIDTH).map(P::from_le).collect());
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
        *data_seen = true;
        return Ok(Some(page));
    }
    Ok(None)
}

/// The list array of `offsets` (one more than its rows) and `values`, with
/// the lists' and the items' validity.
fn list_array<P: Physical>(
    list: ListType<'_>,
    offsets: Vec<i32>,
    values: Vec<P>,
    list_nulls: Option<NullBuffer>,
    item_nulls: Option<NullBuffer>,
) -> Result<ArrayRef> {
    let items = P::items(list.item.data_type(), values, item_nulls).ok_or_else(|| {
        DecodeError::Unsupported {
            column: list.item.name().clone(),
            what: format!("list items of type {}", list.item.data_type()),
        }
    })?;
    let item = list.item.clone();
    Ok(if list.large {
        let offsets: Vec<i64> = offsets.into_iter().map(i64::from).collect();
        Arc::new(arrow_array::LargeListArray::try_new(
            item,
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            items,
            list_nulls,
        )?)
    } else {
        Arc::new(arrow_array::ListArray::try_new(
            item,
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            items,
            list_nulls,
        )?)
    })
}

/// A list item's Parquet physical type, as decoded: `INT32` or `INT64`.
trait Physical: Copy + Default + Send + 'static {
    /// Bytes a value.
    const WIDTH: usize;
    /// A value from its `WIDTH` little-endian bytes.
    fn from_le(bytes: &[u8]) -> Self;
    /// The item array of Arrow type `data_type` holding `values` (the
    /// physical values: narrower integer types are stored widened, unsigned
    /// ones as their bits), or `None` for a type not stored this way.
    fn items(
        data_type: &DataType,
        values: Vec<Self>,
        nulls: Option<NullBuffer>,
    ) -> Option<ArrayRef>;
}

impl Physical for i32 {
    const WIDTH: usize = 4;

    fn from_le(bytes: &[u8]) -> Self {
        i32::from_le_bytes(bytes.try_into().expect("4 bytes"))
    }

    fn items(
        data_type: &DataType,
        values: Vec<i32>,
        nulls: Option<NullBuffer>,
    ) -> Option<ArrayRef> {
        use arrow_array::{Int8Array, Int16Array, UInt8Array, UInt16Array, UInt32Array};
        let len = values.len();
        Some(match data_type {
            DataType::Int32 => Arc::new(Int32Array::new(values.into(), nulls)),
            DataType::UInt32 => Arc::new(UInt32Array::new(
                ScalarBuffer::new(Buffer::from_vec(values), 0, len),
                nulls,
            )),
            DataType::Int16 => Arc::new(Int16Array::new(
                values.iter().map(|&v| v as i16).collect(),
                nulls,
            )),
            DataType::UInt16 => Arc::new(UInt16Array::new(
                values.iter().map(|&v| v as u16).collect(),
                nulls,
            )),
            DataType::Int8 => Arc::new(Int8Array::new(
                values.iter().map(|&v| v as i8).collect(),
                nulls,
            )),
            DataType::UInt8 => Arc::new(UInt8Array::new(
                values.iter().map(|&v| v as u8).collect(),
                nulls,
            )),
            _ => return None,
        })
    }
}

impl Physical for i64 {
    const WIDTH: usize = 8;

    fn from_le(bytes: &[u8]) -> Self {
        i64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }

    fn items(
        data_type: &DataType,
        values: Vec<i64>,
        nulls: Option<NullBuffer>,
    ) -> Option<ArrayRef> {
        use arrow_array::{Int64Array, UInt64Array};
        let len = values.len();
        Some(match data_type {
            DataType::Int64 => Arc::new(Int64Array::new(values.into(), nulls)),
            DataType::UInt64 => Arc::new(UInt64Array::new(
                ScalarBuffer::new(Buffer::from_vec(values), 0, len),
                nulls,
            )),
            _ => return None,
        })
    }
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

    /// The row starts (repetition level 0) of the `n` levels (bit width 1)
    /// in `rep`: a run of starts visits only as many as rows remain.
    fn walk(&mut self, rep: &[u8], n: usize) -> std::result::Result<(), String> {
        walk_bits(rep, n, |bits| match bits {
            Bits::Run {
                first,
                len,
                value: 0,
            } => {
                let room = self.room().min(len);
                (first..first + room).for_each(|level| self.push(level));
                self.extra += len - room;
            }
            Bits::Run { .. } => {}
            Bits::Byte { first, byte, valid } => {
                let mut zeros = !byte & low_bits(valid);
                while zeros != 0 {
                    self.push(first + zeros.trailing_zeros() as usize);
                    zeros &= zeros - 1;
                }
            }
        })
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
