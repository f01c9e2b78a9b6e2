//! This crate's own page decoders, for the column shapes training data is
//! made of; other columns go through parquet's Arrow reader.
//!
//! * Flat fixed-width columns (numeric features, categorical ids), required
//!   or nullable: a dictionary-encoded column chunk stays a dictionary (null
//!   rows get key 0 and a validity bitmap). Its keys are
//!   decoded into a `u16` buffer (dictionaries of at most 2^16 values) or an
//!   `i32` one, and its values are the small dictionary page, as an Arrow
//!   `Dictionary(UInt16 | Int32, T)` array. The shuffle stage then permutes
//!   keys instead of values, and the collator looks each value up as it
//!   writes the slab: one pass over the output instead of decoding every
//!   value, copying the window and permuting it. A chunk that falls back to
//!   plain pages is decoded to plain values.
//! * Required `list<int32>` (token ids): row starts come from the repetition
//!   levels eight at a time and values go straight into one buffer.
//! * Binary and strings (images, text): views over the decompressed pages,
//!   so each value is copied once, from its page into the slab.
//!
//! Keys are unpacked eight at a time with constant bit widths.

use std::sync::Arc;

use arrow_array::types::{ArrowDictionaryKeyType, Int32Type, UInt16Type};
use arrow_array::{ArrayRef, DictionaryArray, Int32Array, PrimitiveArray, make_array};
use arrow_buffer::Buffer;
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::Page;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;

use crate::page_reader::Pages;

/// How a flat fixed-width column is stored and decoded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FixedLeaf {
    /// The leaf column index.
    pub leaf: usize,
    /// Bytes per stored (physical) value: 4 or 8.
    physical: usize,
    /// Bytes per Arrow value: 1, 2, 4 or 8 (narrower than `physical` for
    /// small integers stored as INT32).
    width: usize,
}

/// The only leaf column under root column `root`, if it has exactly one.
pub(crate) fn single_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<usize> {
    let descr = arrow.metadata().file_metadata().schema_descr();
    let mut leaves = (0..descr.num_columns()).filter(|&i| descr.get_column_root_idx(i) == root);
    let leaf = leaves.next()?;
    leaves.next().is_none().then_some(leaf)
}

/// The leaf of root column `root` when it is a non-nested primitive
/// (required or nullable) whose Arrow type this decoder handles.
pub(crate) fn fixed_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<FixedLeaf> {
    let leaf = single_leaf(arrow, root)?;
    let column = arrow.metadata().file_metadata().schema_descr().column(leaf);
    if column.max_def_level() > 1 || column.max_rep_level() != 0 {
        return None;
    }
    let field = arrow.schema().fields().get(root)?;
    let (physical, width) = match (column.physical_type(), field.data_type()) {
        (PhysicalType::INT32, DataType::Int8 | DataType::UInt8) => (4, 1),
        (PhysicalType::INT32, DataType::Int16 | DataType::UInt16) => (4, 2),
        (PhysicalType::INT32, DataType::Int32 | DataType::UInt32)
        | (PhysicalType::FLOAT, DataType::Float32) => (4, 4),
        (PhysicalType::INT64, DataType::Int64 | DataType::UInt64)
        | (PhysicalType::DOUBLE, DataType::Float64) => (8, 8),
        _ => return None,
    };
    Some(FixedLeaf {
        leaf,
        physical,
        width,
    })
}

/// Whether this decoder reads every encoding of `chunk`.
pub(crate) fn supported(chunk: &ColumnChunkMetaData) -> bool {
    chunk.encodings().all(|e| {
        matches!(
            e,
            Encoding::PLAIN | Encoding::RLE | Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY
        )
    })
}

fn general(message: String) -> ParquetError {
    ParquetError::General(message)
}

/// A page of a flat required column (no levels to read).
enum FlatPage {
    /// The dictionary: `num_values` plain values.
    Dictionary { buf: Bytes, num_values: usize },
    /// Values, plain or dictionary keys, of `num_values` rows; `def`: the
    /// definition levels (bit width 1) of a nullable column, whose values are
    /// those of the non-null rows only.
    Data {
        buf: Bytes,
        num_values: usize,
        encoding: Encoding,
        def: Option<Bytes>,
    },
}

/// Whether the `count` definition levels (bit width 1) in `levels` are all
/// 1: no nulls.
fn all_defined(levels: &[u8], count: usize) -> std::result::Result<bool, String> {
    let mut dense = true;
    walk_bits(levels, count, |bits| {
        dense &= match bits {
            Bits::Run { value, .. } => value == 1,
            Bits::Byte { byte, valid, .. } => byte | !low_bits(valid) == 0xff,
        }
    })?;
    Ok(dense)
}

/// Append the `count` definition levels (bit width 1) in `levels` to
/// `validity`; returns how many are 1 (rows with a value).
fn append_defined(
    levels: &[u8],
    count: usize,
    validity: &mut BooleanBufferBuilder,
) -> std::result::Result<usize, String> {
    let mut present = 0;
    walk_bits(levels, count, |bits| match bits {
        Bits::Run { len, value, .. } => {
            validity.append_n(len, value == 1);
            present += if value == 1 { len } else { 0 };
        }
        Bits::Byte { byte, valid, .. } => {
            for i in 0..valid {
                validity.append((byte >> i) & 1 == 1);
            }
            present += (byte & low_bits(valid)).count_ones() as usize;
        }
    })?;
    Ok(present)
}

/// How many of a page's `count` rows (the rows after the first `before` of
/// a chunk of `rows`; an error if they pass `rows`) hold a value: all, for a
/// required column (`def` none) or a page without nulls; otherwise its
/// definition levels are appended to `validity`, made at the chunk's first
/// null.
fn page_present(
    def: Option<&[u8]>,
    count: usize,
    before: usize,
    rows: usize,
    validity: &mut Option<BooleanBufferBuilder>,
) -> std::result::Result<usize, String> {
    if before + count > rows {
        return Err(format!("pages hold more than the row group's {rows} rows"));
    }
    let Some(def) = def else {
        return Ok(count);
    };
    if validity.is_none() && all_defined(def, count)? {
        return Ok(count);
    }
    let bits = validity.get_or_insert_with(|| {
        let mut bits = BooleanBufferBuilder::new(rows);
        bits.append_n(before, true);
        bits
    });
    if bits.len() != before {
        // Earlier pages without nulls, after the first null.
        let missing = before - bits.len();
        bits.append_n(missing, true);
    }
    append_defined(def, count, bits)
}

/// The null buffer of a chunk of `rows` rows from its `validity` (none: no
/// nulls), padded with valid rows after its last null.
fn finish_validity(validity: Option<BooleanBufferBuilder>, rows: usize) -> Option<NullBuffer> {
    validity.map(|mut v| {
        let missing = rows.saturating_sub(v.len());
        v.append_n(missing, true);
        NullBuffer::new(v.finish())
    })
}

/// The values part of `page`, a page of a flat column, and its definition
/// levels when the column is nullable (`def_levels`).
fn flat_page(page: Page, def_levels: bool) -> std::result::Result<FlatPage, String> {
    Ok(match page {
        Page::DictionaryPage {
            buf,
            num_values,
            encoding,
            ..
        } => {
            if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
                return Err(format!(
                    "dictionary page encoding {encoding} is not supported"
                ));
            }
            FlatPage::Dictionary {
                buf,
                num_values: num_values as usize,
            }
        }
        Page::DataPage {
            buf,
            num_values,
            encoding,
            ..
        } => {
            let (buf, def) = if def_levels {
                // Length-prefixed RLE definition levels, then the values.
                let len = buf
                    .get(..4)
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
                    .filter(|&len| 4 + len <= buf.len())
                    .ok_or_else(|| "levels overrun the page".to_string())?;
                (buf.slice(4 + len..), Some(buf.slice(4..4 + len)))
            } else {
                (buf, None)
            };
            FlatPage::Data {
                buf,
                num_values: num_values as usize,
                encoding,
                def,
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
            let skip = (def_levels_byte_len + rep_levels_byte_len) as usize;
            if skip > buf.len() {
                return Err("levels overrun the page".into());
            }
            FlatPage::Data {
                def: def_levels.then(|| buf.slice(rep_levels_byte_len as usize..skip)),
                buf: buf.slice(skip..),
                num_values: num_values as usize,
                encoding,
            }
        }
    })
}

/// Decode the `count` keys of a dictionary-encoded page's values (a bit
/// width byte, then RLE / bit-packed hybrid keys) into `sink`.
fn dictionary_keys(
    values: &[u8],
    count: usize,
    sink: &mut impl KeySink,
) -> std::result::Result<(), String> {
    let (&bit_width, data) = values
        .split_first()
        .ok_or_else(|| "an empty data page".to_string())?;
    decode_hybrid_into(data, bit_width, count, sink)
}

/// Look the `count` keys of a dictionary-encoded page's values up in
/// `dictionary` (none yet: an error), appending the values to `out`.
fn gather_dictionary<T: Copy + Default>(
    values: &[u8],
    count: usize,
    dictionary: Option<&[T]>,
    out: &mut Vec<T>,
) -> std::result::Result<(), String> {
    let dictionary = dictionary
        .ok_or_else(|| "a dictionary-encoded page without a dictionary page".to_string())?;
    let mut sink = Gather {
        dictionary,
        out,
        bad: None,
    };
    dictionary_keys(values, count, &mut sink)?;
    match sink.bad {
        Some(key) => Err(format!(
            "key {key} is outside the dictionary of {} values",
            dictionary.len()
        )),
        None => Ok(()),
    }
}

/// Stored values narrowed (or copied) to the Arrow width.
fn narrow(stored: &[u8], leaf: &FixedLeaf, out: &mut Vec<u8>) {
    if leaf.physical == leaf.width {
        out.extend_from_slice(stored);
        return;
    }
    for v in stored.chunks_exact(leaf.physical) {
        // Small integers are stored as INT32: keep the low bytes (little endian),
        // as a cast of the value that fits the column's type.
        out.extend_from_slice(&v[..leaf.width]);
    }
}

/// Decode `rows` values of the column chunk `chunk` (a [`FixedLeaf`]) of a
/// row group into an Arrow array of type `data_type`: a `Dictionary(Int32, _)`
/// when every data page is dictionary encoded, plain values otherwise.
pub(crate) fn decode_fixed<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    leaf: &FixedLeaf,
    rows: usize,
    data_type: &DataType,
) -> Result<ArrayRef> {
    let mut pages = Pages::open(file, chunk, rows)?;
    // Keys of dictionaries up to 2^16 values take 2 bytes, others 4.
    let first = pages.next_page()?;
    let small = matches!(&first, Some(Page::DictionaryPage { num_values, .. })
        if *num_values as usize <= 1 << 16);
    if small {
        decode_fixed_keys::<UInt16Type, R>(pages, first, chunk, leaf, rows, data_type)
    } else {
        decode_fixed_keys::<Int32Type, R>(pages, first, chunk, leaf, rows, data_type)
    }
}

/// [`decode_fixed`] with keys of type `K`; `first` is the chunk's first page.
fn decode_fixed_keys<K: ArrowDictionaryKeyType, R: ChunkReader + 'static>(
    mut pages: Pages<R>,
    first: Option<Page>,
    chunk: &ColumnChunkMetaData,
    leaf: &FixedLeaf,
    rows: usize,
    data_type: &DataType,
) -> Result<ArrayRef>
where
    K::Native: Key,
{
    let path = chunk.column_path().string();
    let err = |e: String| general(format!("column {path}: {e}"));
    let def_levels = chunk.column_descr().max_def_level() > 0;
    let mut validity: Option<BooleanBufferBuilder> = None;
    // Dictionary values at the stored width, and the keys decoded so far.
    let mut dictionary: Option<Bytes> = None;
    let mut keys: Vec<K::Native> = Vec::with_capacity(rows);
    // Once a plain page shows up, values (Arrow width) replace keys.
    let mut plain: Option<Vec<u8>> = None;
    let mut decoded = 0usize;
    let mut pending = first;
    while let Some(page) = match pending.take() {
        Some(page) => Some(page),
        None => pages.next_page()?,
    } {
        let (buf, num_values, encoding, def) = match flat_page(page, def_levels).map_err(err)? {
            FlatPage::Dictionary { buf, num_values } => {
                let bytes = num_values * leaf.physical;
                if buf.len() < bytes {
                    return Err(err(format!(
                        "dictionary page holds {} bytes for {num_values} values",
                        buf.len()
                    )));
                }
                dictionary = Some(buf.slice(..bytes));
                continue;
            }
            FlatPage::Data {
                buf,
                num_values,
                encoding,
                def,
            } => (buf, num_values, encoding, def),
        };
        // Rows of this page holding a value; nulls are marked in `validity`
        // (made at the first null) and their values filled in at the end.
        let present =
            page_present(def.as_deref(), num_values, decoded, rows, &mut validity).map_err(err)?;
        match encoding {
            Encoding::PLAIN => {
                let bytes = present * leaf.physical;
                if buf.len() < bytes {
                    return Err(err(format!(
                        "a plain page holds {} bytes for {present} values",
                        buf.len()
                    )));
                }
                let values = plain.get_or_insert_with(|| {
                    // Earlier dictionary pages become plain values.
                    let mut values = Vec::with_capacity(rows * leaf.width);
                    if let Some(dict) = &dictionary {
                        for &k in &keys {
                            let at = k.as_usize() * leaf.physical;
                            narrow(&dict[at..at + leaf.physical], leaf, &mut values);
                        }
                    }
                    values
                });
                narrow(&buf[..bytes], leaf, values);
            }
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                let Some(dict) = &dictionary else {
                    return Err(err(
                        "a dictionary-encoded page without a dictionary page".into()
                    ));
                };
                let dict_len = dict.len() / leaf.physical;
                let start = keys.len();
                keys.reserve(present);
                let mut sink = Keys {
                    out: &mut keys,
                    max: 0,
                };
                dictionary_keys(&buf, present, &mut sink).map_err(err)?;
                let max = sink.max;
                if max as usize >= dict_len && present > 0 {
                    return Err(err(format!(
                        "key {max} is outside the dictionary of {dict_len} values"
                    )));
                }
                if let Some(values) = &mut plain {
                    for &k in &keys[start..] {
                        let at = k.as_usize() * leaf.physical;
                        narrow(&dict[at..at + leaf.physical], leaf, values);
                    }
                    keys.truncate(start);
                }
            }
            other => return Err(err(format!("encoding {other} is not supported"))),
        }
        decoded += num_values;
    }
    if decoded != rows {
        return Err(err(format!(
            "holds {decoded} values; the footer says {rows} rows"
        )));
    }
    let nulls = finish_validity(validity, rows);
    let values = |bytes: Vec<u8>, len: usize, nulls: Option<NullBuffer>| -> Result<ArrayRef> {
        let data = ArrayData::builder(data_type.clone())
            .len(len)
            .add_buffer(Buffer::from_vec(bytes))
            .nulls(nulls)
            .build()
            .map_err(|e| err(e.to_string()))?;
        Ok(make_array(data))
    };
    let dict = dictionary.unwrap_or_default();
    let dict_len = dict.len() / leaf.physical;
    if plain.is_none() && dict_len == 0 && keys.is_empty() {
        // No values at all (every row null, or none): zeros.
        plain = Some(Vec::new());
    }
    if let Some(plain) = plain {
        let plain = match &nulls {
            // Values of the non-null rows, spread over every row.
            Some(n) => {
                let w = leaf.width;
                let mut full = vec![0u8; rows * w];
                for (row, v) in n.valid_indices().zip(plain.chunks_exact(w)) {
                    full[row * w..row * w + w].copy_from_slice(v);
                }
                full
            }
            None if plain.is_empty() => vec![0u8; rows * leaf.width],
            None => plain,
        };
        return values(plain, rows, nulls);
    }
    let mut narrowed = Vec::with_capacity(dict_len * leaf.width);
    narrow(&dict, leaf, &mut narrowed);
    let dict_values = values(narrowed, dict_len, None)?;
    let keys = match &nulls {
        // Keys of the non-null rows, spread over every row (null rows get key
        // 0, which indexes the non-empty dictionary).
        Some(n) => {
            let mut full = vec![K::Native::default(); rows];
            for (row, &k) in n.valid_indices().zip(&keys) {
                full[row] = k;
            }
            full
        }
        None => keys,
    };
    let keys = PrimitiveArray::<K>::new(keys.into(), nulls);
    // SAFETY: every key is in 0..dict_len (checked page by page above; null
    // rows hold 0 and the dictionary is not empty).
    let array = unsafe { DictionaryArray::<K>::new_unchecked(keys, dict_values) };
    Ok(Arc::new(array))
}

/// Repetition and definition levels of one data page, and its values.
struct LevelPage {
    rep: Bytes,
    def: Bytes,
    values: Bytes,
    num_levels: usize,
    encoding: Encoding,
}

/// A byte with its `valid` (1 to 8) low bits set.
fn low_bits(valid: usize) -> u8 {
    ((1u16 << valid) - 1) as u8
}

/// Split a V1 data page's buffer into its length-prefixed RLE levels and values.
fn v1_levels(buf: &Bytes) -> std::result::Result<(Bytes, Bytes, Bytes), String> {
    let mut at = 0usize;
    let mut next = || -> std::result::Result<Bytes, String> {
        let len = buf
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| "levels overrun the page".to_string())?;
        let part = buf
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| "levels overrun the page".to_string())?;
        let part = buf.slice_ref(part);
        at += 4 + len;
        Ok(part)
    };
    let rep = next()?;
    let def = next()?;
    Ok((rep, def, buf.slice(at..)))
}

/// A stretch of a bit width 1 level stream.
#[derive(Clone, Copy)]
enum Bits {
    /// `len` levels of `value` from level `first` on.
    Run { first: usize, len: usize, value: u8 },
    /// Levels `first..first + valid` packed in `byte`, least significant bit first.
    Byte {
        first: usize,
        byte: u8,
        valid: usize,
    },
}

/// Visit the stretches of a bit width 1 RLE / bit-packed hybrid level stream
/// of `count` levels.
fn walk_bits(
    data: &[u8],
    count: usize,
    mut visit: impl FnMut(Bits),
) -> std::result::Result<(), String> {
    let mut at = 0usize;
    let mut level = 0usize;
    while level < count {
        let header = uleb128(data, &mut at)?;
        if header & 1 == 0 {
            let run = ((header >> 1) as usize).min(count - level);
            let value = *data
                .get(at)
                .ok_or_else(|| "a run value overruns the page".to_string())?;
            at += 1;
            if run == 0 || value > 1 {
                return Err(format!("a level run of {run} levels of value {value}"));
            }
            visit(Bits::Run {
                first: level,
                len: run,
                value,
            });
            level += run;
        } else {
            let bytes = (header >> 1) as usize;
            let packed_bytes = data
                .get(at..at + bytes)
                .ok_or_else(|| "bit-packed levels overrun the page".to_string())?;
            at += bytes;
            for &b in packed_bytes {
                if level >= count {
                    break;
                }
                let valid = (count - level).min(8);
                visit(Bits::Byte {
                    first: level,
                    byte: b,
                    valid,
                });
                level += valid;
            }
        }
    }
    Ok(())
}

/// Decode a required `list<int32>` of required items (repetition and
/// definition levels of at most 1) of a row group with `rows` rows straight
/// into its offsets and values: row starts come from the repetition levels
/// eight at a time, and values from dictionary keys (or plain pages) into one
/// buffer sized by the chunk's value count.
pub(crate) fn decode_list_i32<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    rows: usize,
    data_type: &DataType,
) -> Result<ArrayRef> {
    let DataType::List(item) = data_type else {
        return Err(general(format!("{data_type} is not a list")));
    };
    let path = chunk.column_path().string();
    let err = |e: String| general(format!("column {path}: {e}"));
    let mut pages = Pages::open(file, chunk, rows)?;
    let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
    let mut values: Vec<i32> = Vec::with_capacity(chunk.num_values().max(0) as usize);
    let mut dictionary: Option<Vec<i32>> = None;
    let mut def_expanded: Vec<u8> = Vec::new();
    while let Some(page) = pages.next_page()? {
        let page = match page {
            Page::DictionaryPage {
                buf, num_values, ..
            } => {
                let n = num_values as usize;
                let bytes = buf
                    .get(..n * 4)
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
                if r + d > buf.len() {
                    return Err(err("levels overrun the page".into()));
                }
                LevelPage {
                    rep: buf.slice(..r),
                    def: buf.slice(r..r + d),
                    values: buf.slice(r + d..),
                    num_levels: num_values as usize,
                    encoding,
                }
            }
        };
        let n = page.num_levels;
        let base = values.len();
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
        let (mut level_at, mut values_at) = (0usize, 0usize);
        let mut start_at = |level: usize| {
            let index = if dense {
                level
            } else {
                values_at += def_expanded[level_at..level]
                    .iter()
                    .map(|&d| d as usize)
                    .sum::<usize>();
                level_at = level;
                values_at
            };
            offsets.push((base + index) as i32);
        };
        walk_bits(&page.rep, n, |bits| match bits {
            Bits::Run {
                first,
                len,
                value: 0,
            } => (first..first + len).for_each(&mut start_at),
            Bits::Run { .. } => {}
            Bits::Byte { first, byte, valid } => {
                let mut zeros = !byte & low_bits(valid);
                while zeros != 0 {
                    start_at(first + zeros.trailing_zeros() as usize);
                    zeros &= zeros - 1;
                }
            }
        })
        .map_err(err)?;
        if offsets.len() > rows {
            return Err(err(format!(
                "pages hold more than the row group's {rows} rows"
            )));
        }
        if base + present > i32::MAX as usize {
            return Err(err("more than 2^31 values in one row group".into()));
        }
        match page.encoding {
            Encoding::PLAIN => {
                let bytes = page
                    .values
                    .get(..present * 4)
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
    }
    if offsets.len() != rows {
        return Err(err(format!(
            "holds {} rows; the footer says {rows}",
            offsets.len()
        )));
    }
    offsets.push(values.len() as i32);
    let list = arrow_array::ListArray::try_new(
        item.clone(),
        arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
        Arc::new(Int32Array::from(values)),
        None,
    )?;
    Ok(Arc::new(list))
}

/// The leaf of root column `root` when it is a non-nested byte array
/// (required or nullable) read as binary or a string: `(leaf, utf8)`.
pub(crate) fn bytes_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<(usize, bool)> {
    let leaf = single_leaf(arrow, root)?;
    let column = arrow.metadata().file_metadata().schema_descr().column(leaf);
    if column.max_def_level() > 1
        || column.max_rep_level() != 0
        || column.physical_type() != PhysicalType::BYTE_ARRAY
    {
        return None;
    }
    match arrow.schema().fields().get(root)?.data_type() {
        DataType::Binary | DataType::LargeBinary => Some((leaf, false)),
        DataType::Utf8 | DataType::LargeUtf8 => Some((leaf, true)),
        _ => None,
    }
}

/// Views of the `count` PLAIN-encoded byte arrays (4-byte length, bytes) at
/// the start of `data`, which is buffer `index` of the array being built.
fn plain_views(
    data: &[u8],
    count: usize,
    index: u32,
    utf8: bool,
    views: &mut Vec<u128>,
) -> std::result::Result<(), String> {
    let mut at = 0usize;
    for _ in 0..count {
        let len = data
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| "a value's length overruns the page".to_string())?;
        let value = data
            .get(at + 4..at + 4 + len)
            .ok_or_else(|| format!("a value of {len} bytes overruns the page"))?;
        if utf8 && std::str::from_utf8(value).is_err() {
            return Err("a value is not valid UTF-8".into());
        }
        let offset = u32::try_from(at + 4).map_err(|_| "a page over 4 GiB".to_string())?;
        views.push(arrow_array::builder::make_view(value, index, offset));
        at += 4 + len;
    }
    Ok(())
}

/// Decode the required binary (or string) column chunk `chunk` of a row
/// group with `rows` rows as a view array over the decompressed pages: the
/// values are not copied again (the collator copies each straight from its
/// page into the slab).
pub(crate) fn decode_bytes<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    rows: usize,
    utf8: bool,
) -> Result<ArrayRef> {
    let path = chunk.column_path().string();
    let err = |e: String| general(format!("column {path}: {e}"));
    let mut pages = Pages::open(file, chunk, rows)?;
    let def_levels = chunk.column_descr().max_def_level() > 0;
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut views: Vec<u128> = Vec::with_capacity(rows);
    let mut dictionary: Option<Vec<u128>> = None;
    let mut validity: Option<BooleanBufferBuilder> = None;
    let mut decoded = 0usize;
    while let Some(page) = pages.next_page()? {
        let (buf, num_values, encoding, def) = match flat_page(page, def_levels).map_err(err)? {
            FlatPage::Dictionary { buf, num_values } => {
                let mut dict = Vec::with_capacity(num_values);
                plain_views(&buf, num_values, buffers.len() as u32, utf8, &mut dict)
                    .map_err(err)?;
                buffers.push(Buffer::from(buf));
                dictionary = Some(dict);
                continue;
            }
            FlatPage::Data {
                buf,
                num_values,
                encoding,
                def,
            } => (buf, num_values, encoding, def),
        };
        let present =
            page_present(def.as_deref(), num_values, decoded, rows, &mut validity).map_err(err)?;
        decoded += num_values;
        match encoding {
            Encoding::PLAIN => {
                plain_views(&buf, present, buffers.len() as u32, utf8, &mut views).map_err(err)?;
                buffers.push(Buffer::from(buf));
            }
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                gather_dictionary(&buf, present, dictionary.as_deref(), &mut views).map_err(err)?;
            }
            other => return Err(err(format!("encoding {other} is not supported"))),
        }
    }
    if decoded != rows {
        return Err(err(format!(
            "holds {decoded} values; the footer says {rows} rows"
        )));
    }
    let nulls = finish_validity(validity, rows);
    if let Some(n) = &nulls {
        // Views of the non-null rows, spread over the rows (null rows: empty).
        let mut full = vec![0u128; rows];
        for (row, &v) in n.valid_indices().zip(&views) {
            full[row] = v;
        }
        views = full;
    }
    let views = arrow_buffer::ScalarBuffer::from(views);
    // SAFETY: every view was made by `make_view` from a value inside the
    // buffer it names (strings checked to be UTF-8).
    Ok(unsafe {
        if utf8 {
            Arc::new(arrow_array::StringViewArray::new_unchecked(
                views,
                buffers.into(),
                nulls,
            ))
        } else {
            Arc::new(arrow_array::BinaryViewArray::new_unchecked(
                views,
                buffers.into(),
                nulls,
            ))
        }
    })
}

/// Read an unsigned LEB128 varint from `data` at `*at`.
fn uleb128(data: &[u8], at: &mut usize) -> std::result::Result<u64, String> {
    let mut value = 0u64;
    let mut shift = 0;
    loop {
        let byte = *data
            .get(*at)
            .ok_or_else(|| "a run header overruns the page".to_string())?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
        if shift > 63 {
            return Err("a run header is too long".into());
        }
    }
}

/// Where decoded keys go.
pub(crate) trait KeySink {
    /// `len` copies of `key`.
    fn run(&mut self, key: i32, len: usize);
    /// Keys in order.
    fn keys(&mut self, keys: &[i32]);
}

/// A dictionary key type: `i32`, or `u16` for dictionaries of at most 2^16
/// values (the caller checks every key against the dictionary's length).
pub(crate) trait Key: ArrowNativeType {
    /// The key `k` (checked to fit by the caller).
    fn of(k: i32) -> Self;
}

impl Key for i32 {
    fn of(k: i32) -> Self {
        k
    }
}

impl Key for u16 {
    fn of(k: i32) -> Self {
        k as u16
    }
}

/// Collects keys, remembering the largest (as unsigned: a key over 2^31 - 1
/// is out of any dictionary's range too).
struct Keys<'a, K> {
    out: &'a mut Vec<K>,
    max: u32,
}

impl<K: Key> KeySink for Keys<'_, K> {
    fn run(&mut self, key: i32, len: usize) {
        self.max = self.max.max(key as u32);
        self.out.extend(std::iter::repeat_n(K::of(key), len));
    }
    fn keys(&mut self, keys: &[i32]) {
        self.max = keys.iter().fold(self.max, |m, &k| m.max(k as u32));
        self.out.extend(keys.iter().map(|&k| K::of(k)));
    }
}

/// Looks keys up in a dictionary; a key outside it is remembered (and a
/// default value written).
struct Gather<'a, T> {
    dictionary: &'a [T],
    out: &'a mut Vec<T>,
    bad: Option<i32>,
}

impl<T: Copy + Default> KeySink for Gather<'_, T> {
    fn run(&mut self, key: i32, len: usize) {
        let value = match self.dictionary.get(key as usize) {
            Some(v) => *v,
            None => {
                self.bad = Some(key);
                T::default()
            }
        };
        self.out.extend(std::iter::repeat_n(value, len));
    }
    fn keys(&mut self, keys: &[i32]) {
        let dictionary = self.dictionary;
        let mut bad = false;
        self.out
            .extend(keys.iter().map(|&k| match dictionary.get(k as usize) {
                Some(v) => *v,
                None => {
                    bad = true;
                    T::default()
                }
            }));
        if bad {
            self.bad = keys
                .iter()
                .copied()
                .find(|&k| k as usize >= dictionary.len());
        }
    }
}

/// Decode `count` values of the RLE / bit-packed hybrid encoding into `sink`.
fn decode_hybrid_into(
    data: &[u8],
    bit_width: u8,
    count: usize,
    sink: &mut impl KeySink,
) -> std::result::Result<(), String> {
    if bit_width > 32 {
        return Err(format!("bit width {bit_width} is over 32"));
    }
    let width = bit_width as usize;
    let mut done = 0usize;
    let mut at = 0usize;
    while done < count {
        let header = uleb128(data, &mut at)?;
        let remaining = count - done;
        if header & 1 == 0 {
            // A run of one repeated value, stored in ceil(width / 8) bytes.
            let run = (header >> 1) as usize;
            let bytes = width.div_ceil(8);
            let raw = data
                .get(at..at + bytes)
                .ok_or_else(|| "a run value overruns the page".to_string())?;
            at += bytes;
            let mut value = 0u32;
            for (i, b) in raw.iter().enumerate() {
                value |= u32::from(*b) << (8 * i);
            }
            if run == 0 {
                return Err("an empty run".into());
            }
            let n = run.min(remaining);
            sink.run(value as i32, n);
            done += n;
        } else {
            // Groups of 8 bit-packed values, least significant bits first.
            let groups = (header >> 1) as usize;
            let bytes = groups * width;
            let packed = data
                .get(at..at + bytes)
                .ok_or_else(|| "bit-packed values overrun the page".to_string())?;
            at += bytes;
            let n = (groups * 8).min(remaining);
            unpack(packed, width, n, sink);
            done += n;
        }
    }
    Ok(())
}

/// Unpack 8 values of `W` bits from `src` (which holds at least `W + 8`
/// bytes, so every 8-byte load stays inside it).
#[inline(always)]
fn unpack8<const W: usize>(src: &[u8], out: &mut [i32; 8]) {
    let mask = if W == 32 {
        u64::from(u32::MAX)
    } else {
        (1u64 << W) - 1
    };
    if W <= 8 {
        // The 8 values fit in one 8-byte load.
        let word = u64::from_le_bytes(src[..8].try_into().expect("8 bytes"));
        for (i, o) in out.iter_mut().enumerate() {
            *o = ((word >> (i * W)) & mask) as i32;
        }
    } else if W <= 16 {
        // ... in one 16-byte load.
        let word = u128::from_le_bytes(src[..16].try_into().expect("16 bytes"));
        for (i, o) in out.iter_mut().enumerate() {
            *o = ((word >> (i * W)) as u64 & mask) as i32;
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            let bit = i * W;
            let word = u64::from_le_bytes(src[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
            *o = ((word >> (bit % 8)) & mask) as i32;
        }
    }
}

/// Unpack `n` values of `W` bits packed in `packed` into `sink`, 8 at a time
/// with constant shifts; the last groups through a zero-padded copy.
fn unpack_width<const W: usize>(packed: &[u8], n: usize, sink: &mut impl KeySink) {
    const CHUNK: usize = 64;
    let mut buf = [0i32; CHUNK];
    let groups = n.div_ceil(8);
    // Groups whose 8-byte loads stay inside `packed`.
    let direct = if packed.len() >= W + 8 {
        ((packed.len() - W - 8) / W + 1).min(groups)
    } else {
        0
    };
    let mut g = 0;
    #[cfg(target_arch = "x86_64")]
    if W <= 16 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        g = unsafe { simd::unpack_groups::<W>(packed, n, sink) };
    }
    let mut left = n - (g * 8).min(n);
    while g < direct {
        let take = (direct - g).min(CHUNK / 8);
        for k in 0..take {
            let out: &mut [i32; 8] = (&mut buf[k * 8..k * 8 + 8]).try_into().expect("8");
            unpack8::<W>(&packed[(g + k) * W..], out);
        }
        let values = (take * 8).min(left);
        sink.keys(&buf[..values]);
        left -= values;
        g += take;
    }
    while g < groups {
        let mut tail = [0u8; 48];
        let rest = &packed[(g * W).min(packed.len())..];
        let len = rest.len().min(W);
        tail[..len].copy_from_slice(&rest[..len]);
        let out: &mut [i32; 8] = (&mut buf[..8]).try_into().expect("8");
        unpack8::<W>(&tail, out);
        let values = 8.min(left);
        sink.keys(&buf[..values]);
        left -= values;
        g += 1;
    }
}

/// Bit unpacking with AVX2: 8 values of up to 16 bits from one 16-byte load,
/// one byte shuffle, one variable shift and one mask (a third of the scalar
/// instructions per key).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm256_and_si256, _mm256_broadcastsi128_si256,
        _mm256_loadu_si256, _mm256_set1_epi32, _mm256_shuffle_epi8, _mm256_srlv_epi32,
        _mm256_storeu_si256,
    };

    use super::KeySink;

    /// For 8 values of `W` bits (`W` <= 16) packed LSB first in 16 bytes: the
    /// byte shuffle that puts value `i`'s three bytes in 32-bit lane `i` (of a
    /// register holding the 16 bytes in both halves), and each lane's shift.
    const fn spread<const W: usize>() -> ([i8; 32], [i32; 8]) {
        let mut control = [-128i8; 32];
        let mut shifts = [0i32; 8];
        let mut i = 0;
        while i < 8 {
            let bit = i * W;
            let lane = (i % 4) * 4 + (i / 4) * 16;
            let mut j = 0;
            while j < 3 {
                if bit / 8 + j < 16 {
                    control[lane + j] = (bit / 8 + j) as i8;
                }
                j += 1;
            }
            shifts[i] = (bit % 8) as i32;
            i += 1;
        }
        (control, shifts)
    }

    /// Unpack the leading groups of 8 values of `W` bits whose 16-byte loads
    /// stay inside `packed`, of the `n` values packed there, into `sink`;
    /// returns how many groups (none for widths over 16).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn unpack_groups<const W: usize>(
        packed: &[u8],
        n: usize,
        sink: &mut impl KeySink,
    ) -> usize {
        if W == 0 || W > 16 {
            return 0;
        }
        let (control, shifts) = const { spread::<W>() };
        let direct = if packed.len() >= 16 {
            ((packed.len() - 16) / W + 1).min(n.div_ceil(8))
        } else {
            0
        };
        let mut buf = [0i32; 64];
        // SAFETY (loads below): `control` and `shifts` are 32 bytes each.
        let (control, shifts, mask) = unsafe {
            (
                _mm256_loadu_si256(control.as_ptr() as *const __m256i),
                _mm256_loadu_si256(shifts.as_ptr() as *const __m256i),
                _mm256_set1_epi32((u32::MAX >> (32 - W)) as i32),
            )
        };
        let mut g = 0;
        while g < direct {
            let take = (direct - g).min(8);
            for k in 0..take {
                let at = (g + k) * W;
                debug_assert!(at + 16 <= packed.len());
                // SAFETY: group `g + k` < `direct`, so its 16 bytes are inside
                // `packed`; `buf` has room for 8 lanes at `k * 8`.
                unsafe {
                    let bytes = _mm_loadu_si128(packed.as_ptr().add(at) as *const __m128i);
                    let lanes = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(bytes), control);
                    let values = _mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), mask);
                    _mm256_storeu_si256(buf.as_mut_ptr().add(k * 8) as *mut __m256i, values);
                }
            }
            sink.keys(&buf[..(take * 8).min(n - g * 8)]);
            g += take;
        }
        direct
    }
}

/// Unpack `n` values of `width` bits packed in `packed` (LSB first) into `sink`.
fn unpack(packed: &[u8], width: usize, n: usize, sink: &mut impl KeySink) {
    macro_rules! widths {
        ($($w:literal)*) => {
            match width {
                0 => sink.run(0, n),
                $($w => unpack_width::<$w>(packed, n, sink),)*
                _ => unreachable!("bit widths are checked to be at most 32"),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::cast::AsArray;

    #[test]
    fn unpacking_every_width_and_length_gives_the_packed_values() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for width in 1..=32usize {
            for n in [1usize, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 200, 1000] {
                let values: Vec<i32> = (0..n)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((state >> 20) & (u64::MAX >> (64 - width))) as i32
                    })
                    .collect();
                // Pack LSB first into exactly the bytes the values need.
                let mut packed = vec![0u8; (n * width).div_ceil(8)];
                for (i, &v) in values.iter().enumerate() {
                    for b in 0..width {
                        if (v as u32 >> b) & 1 == 1 {
                            let bit = i * width + b;
                            packed[bit / 8] |= 1 << (bit % 8);
                        }
                    }
                }
                let mut out: Vec<i32> = Vec::new();
                let mut sink = Keys {
                    out: &mut out,
                    max: 0,
                };
                unpack(&packed, width, n, &mut sink);
                let max = sink.max;
                assert_eq!(out, values, "width {width}, {n} values");
                assert_eq!(max, values.iter().map(|&v| v as u32).max().unwrap());
            }
        }
    }

    /// `batch` written by parquet's Arrow writer with `props`, and its metadata.
    fn write_parquet(
        batch: &arrow_array::RecordBatch,
        props: Option<parquet::file::properties::WriterProperties>,
    ) -> (Bytes, ArrowReaderMetadata) {
        let mut file = Vec::new();
        let mut writer =
            parquet::arrow::ArrowWriter::try_new(&mut file, batch.schema(), props).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        let file = Bytes::from(file);
        let arrow = ArrowReaderMetadata::load(
            &file,
            parquet::arrow::arrow_reader::ArrowReaderOptions::default(),
        )
        .unwrap();
        (file, arrow)
    }

    /// Every row of `file`, as parquet's Arrow reader reads it.
    fn read_with_parquet(file: &Bytes) -> arrow_array::RecordBatch {
        let batches: Vec<_> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file.clone())
                .unwrap()
                .build()
                .unwrap()
                .collect::<std::result::Result<_, _>>()
                .unwrap();
        arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap()
    }

    /// Decode `count` hybrid-encoded values of `bit_width` bits into `out`.
    fn decode_hybrid(
        data: &[u8],
        bit_width: u8,
        count: usize,
        out: &mut Vec<i32>,
    ) -> std::result::Result<(), String> {
        let mut sink = Keys { out, max: 0 };
        decode_hybrid_into(data, bit_width, count, &mut sink)
    }

    /// Pack `values` LSB first with `width` bits each (groups of 8, zero padded).
    fn pack(values: &[u32], width: usize) -> Vec<u8> {
        let groups = values.len().div_ceil(8);
        let mut out = vec![0u8; groups * width];
        for (i, &v) in values.iter().enumerate() {
            for b in 0..width {
                if (v >> b) & 1 == 1 {
                    let bit = i * width + b;
                    out[bit / 8] |= 1 << (bit % 8);
                }
            }
        }
        out
    }

    #[test]
    fn hybrid_runs_and_bit_packed_groups_decode_for_every_width() {
        for width in 0..=32usize {
            let max = if width == 32 {
                u32::MAX
            } else {
                (1u32 << width).wrapping_sub(1)
            };
            let packed_values: Vec<u32> = (0..205u32)
                .map(|i| i.wrapping_mul(2_654_435_761) & max)
                .collect();
            let mut data = Vec::new();
            // A run of 5 copies of `max`, then 26 groups of bit-packed values
            // (208 slots, 205 used).
            data.push(5 << 1);
            data.extend_from_slice(&max.to_le_bytes()[..width.div_ceil(8)]);
            data.push((26 << 1) | 1);
            data.extend(pack(&packed_values, width));
            let mut out = vec![-1];
            decode_hybrid(&data, width as u8, 210, &mut out).unwrap();
            let mut expected = vec![
                -1, max as i32, max as i32, max as i32, max as i32, max as i32,
            ];
            expected.extend(packed_values.iter().map(|&v| v as i32));
            assert_eq!(out, expected, "width {width}");
        }
    }

    #[test]
    fn keys_outside_the_dictionary_are_caught() {
        let dictionary = [10, 20, 30];
        // Bit-packed keys 0..8 (width 4): keys 3..7 are outside.
        let data = [(1 << 1) | 1, 0x10, 0x32, 0x54, 0x76];
        let mut out = Vec::new();
        let mut sink = Gather {
            dictionary: &dictionary,
            out: &mut out,
            bad: None,
        };
        decode_hybrid_into(&data, 4, 8, &mut sink).unwrap();
        assert_eq!(sink.bad, Some(3));
        // A run of key 2^31 (negative as i32) is outside too, for both sinks.
        let data = [2 << 1, 0, 0, 0, 0x80];
        let mut out = Vec::new();
        let mut sink = Gather {
            dictionary: &dictionary,
            out: &mut out,
            bad: None,
        };
        decode_hybrid_into(&data, 32, 2, &mut sink).unwrap();
        assert_eq!(sink.bad, Some(i32::MIN));
        let mut keys: Vec<i32> = Vec::new();
        let mut sink = Keys {
            out: &mut keys,
            max: 0,
        };
        decode_hybrid_into(&data, 32, 2, &mut sink).unwrap();
        assert_eq!(sink.max, 1 << 31);
    }

    /// Dictionaries over 2^16 values keep 4-byte keys, through decoding and
    /// the shuffle stage's permutation; smaller ones get 2-byte keys.
    #[test]
    fn large_dictionaries_keep_i32_keys() {
        use arrow_array::{Array, Int64Array, RecordBatch};
        use parquet::file::properties::WriterProperties;

        for (distinct, key) in [(70_000i64, DataType::Int32), (1000, DataType::UInt16)] {
            let rows = 140_000usize;
            let values: Vec<i64> = (0..rows as i64).map(|i| (i * 7919) % distinct).collect();
            let batch = RecordBatch::try_from_iter([(
                "v",
                Arc::new(Int64Array::from(values.clone())) as ArrayRef,
            )])
            .unwrap();
            let props = WriterProperties::builder()
                .set_dictionary_page_size_limit(4 << 20)
                .build();
            let (file, arrow) = write_parquet(&batch, Some(props));
            let leaf = fixed_leaf(&arrow, 0).unwrap();
            let meta = arrow.metadata().row_group(0);
            assert_eq!(meta.num_rows() as usize, rows);
            let array = decode_fixed(
                Arc::new(file.clone()),
                meta.column(0),
                &leaf,
                rows,
                &DataType::Int64,
            )
            .unwrap();
            assert_eq!(
                array.data_type(),
                &DataType::Dictionary(Box::new(key.clone()), Box::new(DataType::Int64))
            );
            // Two halves as two decoded batches, permuted as one window.
            let half = |a: usize| {
                let schema = Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
                    "v",
                    array.data_type().clone(),
                    false,
                )]));
                RecordBatch::try_new(schema, vec![array.slice(a, rows / 2)]).unwrap()
            };
            let order: Vec<u32> = (0..rows as u32)
                .map(|i| (i * 7 + 3) % rows as u32)
                .collect();
            let permuted = crate::collate::permute(&[half(0), half(rows / 2)], &order, 0).unwrap();
            let column = permuted.column(0);
            // The window's dictionary is both halves' (shared) dictionary twice.
            let expected_key = if 2 * distinct > 1 << 16 {
                DataType::Int32
            } else {
                DataType::UInt16
            };
            assert_eq!(
                column.data_type(),
                &DataType::Dictionary(Box::new(expected_key), Box::new(DataType::Int64))
            );
            let d = column.as_any_dictionary();
            let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
            let plain = plain.as_primitive::<arrow_array::types::Int64Type>();
            for (i, &o) in order.iter().enumerate() {
                assert_eq!(plain.value(i), values[o as usize]);
            }
        }
    }

    /// Nullable chunks, with and without nulls, decode with their validity.
    #[test]
    fn nullable_chunks_decode_with_their_validity() {
        use arrow_array::{Int64Array, RecordBatch, StringArray};

        let with_nulls = Int64Array::from_iter((0..1000).map(|i| (i % 7 != 0).then_some(i)));
        let without = Int64Array::from_iter((0..1000).map(Some));
        let text = StringArray::from_iter((0..1000).map(|i| (i % 5 != 0).then(|| i.to_string())));
        let batch = RecordBatch::try_from_iter([
            ("with_nulls", Arc::new(with_nulls) as ArrayRef),
            ("without", Arc::new(without) as ArrayRef),
            ("text", Arc::new(text) as ArrayRef),
        ])
        .unwrap();
        let (file, arrow) = write_parquet(&batch, None);
        let meta = arrow.metadata().row_group(0);
        assert!(fixed_leaf(&arrow, 0).is_some() && fixed_leaf(&arrow, 1).is_some());
        assert!(supported(meta.column(0)) && supported(meta.column(1)));
        assert_eq!(bytes_leaf(&arrow, 2), Some((2, true)));
        assert!(supported(meta.column(2)));
        let leaf = fixed_leaf(&arrow, 1).unwrap();
        let array = decode_fixed(
            Arc::new(file.clone()),
            meta.column(1),
            &leaf,
            1000,
            &DataType::Int64,
        )
        .unwrap();
        let d = array.as_any_dictionary();
        let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
        assert_eq!(
            plain
                .as_primitive::<arrow_array::types::Int64Type>()
                .values(),
            &(0..1000).collect::<Vec<i64>>()[..]
        );
        // Fixed-width chunks with nulls decode with a validity bitmap.
        let leaf0 = fixed_leaf(&arrow, 0).unwrap();
        let array = decode_fixed(
            Arc::new(file.clone()),
            meta.column(0),
            &leaf0,
            1000,
            &DataType::Int64,
        )
        .unwrap();
        let d = array.as_any_dictionary();
        let plain = arrow_select::take::take(d.values(), d.keys(), None).unwrap();
        assert_eq!(plain.to_data(), batch.column(0).to_data());
        // String chunks with nulls decode with a validity bitmap too.
        let array = decode_bytes(Arc::new(file), meta.column(2), 1000, true).unwrap();
        let strings = array.as_string_view();
        let want = batch.column(2).as_string::<i32>();
        assert_eq!(strings.nulls(), want.nulls());
        for r in 0..1000 {
            assert_eq!(strings.is_valid(r), want.is_valid(r));
            if want.is_valid(r) {
                assert_eq!(strings.value(r), want.value(r));
            }
        }
    }

    /// Truncated or scrambled column chunk bytes give errors, never a panic.
    #[test]
    fn damaged_page_headers_are_errors() {
        use arrow_array::{Int64Array, RecordBatch};

        let batch = RecordBatch::try_from_iter([(
            "v",
            Arc::new(Int64Array::from_iter_values(0..5000)) as ArrayRef,
        )])
        .unwrap();
        let (file, arrow) = write_parquet(&batch, None);
        let chunk = arrow.metadata().row_group(0).column(0).clone();
        let (start, len) = chunk.byte_range();
        let (start, len) = (start as usize, len as usize);
        let leaf = fixed_leaf(&arrow, 0).unwrap();
        let decode = |bytes: Vec<u8>| {
            decode_fixed(
                Arc::new(Bytes::from(bytes)),
                &chunk,
                &leaf,
                5000,
                &DataType::Int64,
            )
        };
        assert!(decode(file.to_vec()).is_ok());
        let mut failures = 0;
        // Every byte of the chunk's first 64 (page headers) scrambled in turn,
        // and the chunk cut short at several places.
        for at in start..start + 64.min(len) {
            let mut bytes = file.to_vec();
            bytes[at] ^= 0x5a;
            failures += decode(bytes).is_err() as usize;
        }
        assert!(failures > 0);
        // The page reader alone, over a chunk cut short at several places.
        for cut in [1, 7, len / 2, len - 1] {
            let mut pages = crate::page_reader::ChunkPages::new(
                file.slice(start..start + cut),
                true,
                "v".into(),
            );
            let outcome = std::iter::from_fn(|| pages.next_page().transpose()).find(|p| p.is_err());
            assert!(outcome.is_some(), "cut at {cut}");
        }
    }

    #[test]
    fn truncated_hybrid_data_is_an_error() {
        let mut out = Vec::new();
        assert!(decode_hybrid(&[(2 << 1) | 1, 0xff], 3, 16, &mut out).is_err());
        assert!(decode_hybrid(&[4 << 1], 8, 4, &mut out).is_err());
        assert!(decode_hybrid(&[], 8, 1, &mut out).is_err());
    }

    /// Every supported type, written by parquet's Arrow writer with
    /// dictionaries on and off, tiny dictionary pages (so chunks fall back
    /// from dictionary to plain pages mid-chunk), V1 and V2 data pages and
    /// zstd: decoding a row group gives the values parquet's reader gives.
    #[test]
    fn decoded_row_groups_equal_parquets_reader() {
        use arrow_array::{
            Array, Float32Array, Float64Array, Int8Array, Int16Array, Int64Array, RecordBatch,
            UInt8Array, UInt16Array, UInt32Array, UInt64Array,
        };
        use arrow_schema::{Field, Schema};
        use parquet::basic::{Compression, ZstdLevel};
        use parquet::file::properties::{WriterProperties, WriterVersion};

        let rows = 5000usize;
        // Low-cardinality values for the first half, then distinct ones: the
        // dictionary fills up and later pages are plain.
        let v = |i: usize| if i < rows / 2 { i % 37 } else { i * 7919 };
        let columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(Int8Array::from_iter_values((0..rows).map(|i| v(i) as i8))),
            Arc::new(Int16Array::from_iter_values((0..rows).map(|i| v(i) as i16))),
            Arc::new(UInt8Array::from_iter_values((0..rows).map(|i| v(i) as u8))),
            Arc::new(UInt16Array::from_iter_values(
                (0..rows).map(|i| v(i) as u16),
            )),
            Arc::new(Int32Array::from_iter_values(
                (0..rows).map(|i| v(i) as i32 - 100),
            )),
            Arc::new(UInt32Array::from_iter_values(
                (0..rows).map(|i| u32::MAX - v(i) as u32),
            )),
            Arc::new(Int64Array::from_iter_values(
                (0..rows).map(|i| -(v(i) as i64) << 20),
            )),
            Arc::new(UInt64Array::from_iter_values(
                (0..rows).map(|i| u64::MAX - v(i) as u64),
            )),
            Arc::new(Float32Array::from_iter_values(
                (0..rows).map(|i| v(i) as f32 * 0.5),
            )),
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| v(i) as f64 / 3.0),
            )),
        ];
        // Columns 1 and 5: nullable without nulls, as pandas writes them.
        // Columns 3, 7 and 9: nulls every 13th row and rows 3000..3200;
        // column 9 also the whole second row group (2500..5000).
        let columns: Vec<Arc<dyn Array>> = columns
            .into_iter()
            .enumerate()
            .map(|(c, array)| {
                if ![3, 7, 9].contains(&c) {
                    return array;
                }
                let valid =
                    arrow_buffer::NullBuffer::from_iter((0..rows).map(|i| {
                        i % 13 != 0 && !(3000..3200).contains(&i) && !(c == 9 && i >= 2500)
                    }));
                let data = array
                    .to_data()
                    .into_builder()
                    .nulls(Some(valid))
                    .build()
                    .unwrap();
                make_array(data)
            })
            .collect();
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), i % 2 == 1))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        // zstd and uncompressed chunks are read by this crate's page reader,
        // snappy ones by parquet's.
        for (dictionary, version, codec) in [
            (
                true,
                WriterVersion::PARQUET_1_0,
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (
                true,
                WriterVersion::PARQUET_2_0,
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (
                false,
                WriterVersion::PARQUET_1_0,
                Compression::ZSTD(ZstdLevel::default()),
            ),
            (true, WriterVersion::PARQUET_1_0, Compression::UNCOMPRESSED),
            (true, WriterVersion::PARQUET_2_0, Compression::SNAPPY),
        ] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(dictionary)
                .set_dictionary_page_size_limit(256)
                .set_data_page_row_count_limit(300)
                .set_write_batch_size(100)
                .set_writer_version(version)
                .set_compression(codec)
                .set_max_row_group_row_count(Some(2500))
                .build();
            let (file, arrow) = write_parquet(&batch, Some(props));
            let metadata = arrow.metadata().clone();
            let expected = read_with_parquet(&file);
            let mut kinds = Vec::new();
            for root in 0..batch.num_columns() {
                let leaf = fixed_leaf(&arrow, root).expect("a fixed-width leaf");
                let mut at = 0;
                for rg in 0..metadata.num_row_groups() {
                    let meta = metadata.row_group(rg);
                    let chunk = meta.column(leaf.leaf);
                    if !supported(chunk) {
                        // V2 falls back to delta encodings: the Arrow reader's job.
                        assert_eq!(version, WriterVersion::PARQUET_2_0);
                        at += meta.num_rows() as usize;
                        continue;
                    }
                    let n = meta.num_rows() as usize;
                    let array = decode_fixed(
                        Arc::new(file.clone()),
                        chunk,
                        &leaf,
                        n,
                        batch.column(root).data_type(),
                    )
                    .unwrap();
                    kinds.push(matches!(array.data_type(), DataType::Dictionary(..)));
                    let plain = match array.as_any_dictionary_opt() {
                        Some(d) => arrow_select::take::take(d.values(), d.keys(), None).unwrap(),
                        None => array.clone(),
                    };
                    assert_eq!(
                        plain.to_data(),
                        expected.column(root).slice(at, n).to_data(),
                        "column {root}, row group {rg}, dictionary {dictionary}, {version:?}, {codec}"
                    );
                    at += n;
                }
                assert_eq!(at, rows);
            }
            // Dictionary row groups (the first) stay dictionaries; fallen
            // back or plain ones do not.
            assert_eq!(kinds.iter().any(|&k| k), dictionary);
            assert!(!kinds.iter().all(|&k| k));
        }
    }

    /// Lists with empty rows, long rows spanning pages, and dictionary,
    /// fallback-to-plain and plain pages, V1 and V2: the own list decoder
    /// gives parquet's reader's values and offsets.
    #[test]
    fn decoded_lists_equal_parquets_reader() {
        use arrow_array::{Array, ListArray, RecordBatch};
        use arrow_schema::{Field, Schema};
        use parquet::basic::{Compression, ZstdLevel};
        use parquet::file::properties::{WriterProperties, WriterVersion};

        let rows = 3000usize;
        let item = Arc::new(Field::new("item", DataType::Int32, false));
        let lists: Vec<Vec<i32>> = (0..rows)
            .map(|r| {
                // Empty rows, short rows, and now and then a 700-id row.
                let len = match r % 11 {
                    0 => 0,
                    5 => 700,
                    k => k * 3,
                };
                (0..len)
                    .map(|i| {
                        let v = (r * 31 + i * 7) as i32;
                        // Few distinct ids in the first half (dictionary), many after.
                        if r < rows / 2 { v % 50 } else { v * 7919 }
                    })
                    .collect()
            })
            .collect();
        let mut offsets = vec![0i32];
        for l in &lists {
            offsets.push(offsets.last().unwrap() + l.len() as i32);
        }
        let list = ListArray::try_new(
            item.clone(),
            arrow_buffer::OffsetBuffer::new(offsets.into()),
            Arc::new(Int32Array::from(lists.concat())),
            None,
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ids",
            DataType::List(item),
            false,
        )]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(list)]).unwrap();
        for (dictionary, version) in [
            (true, WriterVersion::PARQUET_1_0),
            (true, WriterVersion::PARQUET_2_0),
            (false, WriterVersion::PARQUET_1_0),
        ] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(dictionary)
                .set_dictionary_page_size_limit(1024)
                .set_data_page_size_limit(2048)
                .set_write_batch_size(64)
                .set_writer_version(version)
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_max_row_group_row_count(Some(1000))
                .build();
            let (file, arrow) = write_parquet(&batch, Some(props));
            let metadata = arrow.metadata().clone();
            let descr = metadata.file_metadata().schema_descr();
            assert_eq!(
                (
                    descr.column(0).max_def_level(),
                    descr.column(0).max_rep_level()
                ),
                (1, 1)
            );
            let expected = read_with_parquet(&file);
            let mut at = 0;
            let mut decoded = 0;
            for rg in 0..metadata.num_row_groups() {
                let meta = metadata.row_group(rg);
                let n = meta.num_rows() as usize;
                let chunk = meta.column(0);
                if supported(chunk) {
                    assert!(chunk.data_page_offset() > 0);
                    let array = decode_list_i32(
                        Arc::new(file.clone()),
                        chunk,
                        n,
                        batch.column(0).data_type(),
                    )
                    .unwrap();
                    let want = expected.column(0).slice(at, n);
                    let (got, want) = (array.as_list::<i32>(), want.as_list::<i32>());
                    assert_eq!(got.len(), want.len());
                    for r in 0..n {
                        assert_eq!(
                            got.value(r).to_data(),
                            want.value(r).to_data(),
                            "row {r} of row group {rg}, dictionary {dictionary}, {version:?}"
                        );
                    }
                    decoded += 1;
                } else {
                    assert_eq!(version, WriterVersion::PARQUET_2_0);
                }
                at += n;
            }
            assert_eq!(at, rows);
            if version == WriterVersion::PARQUET_1_0 {
                assert_eq!(decoded, metadata.num_row_groups());
            }
        }
    }

    /// Binary and string values, inline (up to 12 bytes) and not, from
    /// dictionary, fallback-to-plain and plain pages, V1 and V2: the views
    /// over decoded pages hold parquet's reader's values.
    #[test]
    fn decoded_bytes_equal_parquets_reader() {
        use arrow_array::{Array, BinaryArray, RecordBatch, StringArray};
        use arrow_schema::{Field, Schema};
        use parquet::basic::{Compression, ZstdLevel};
        use parquet::file::properties::{WriterProperties, WriterVersion};

        let rows = 2000usize;
        let text: Vec<String> = (0..rows)
            .map(|r| {
                // Few distinct short strings first (dictionary), then distinct
                // ones of up to 60 bytes, some of them not ASCII.
                if r < rows / 2 {
                    format!("s{}", r % 9)
                } else {
                    format!("{r}-é-{}", "x".repeat(r % 50))
                }
            })
            .collect();
        let blobs: Vec<Vec<u8>> = text.iter().map(|t| t.as_bytes().repeat(2)).collect();
        let columns: Vec<Arc<dyn Array>> = vec![
            Arc::new(StringArray::from(text.clone())),
            // Nulls every 7th row and rows 1200..1500.
            Arc::new(BinaryArray::from_iter(blobs.iter().enumerate().map(
                |(i, b)| (i % 7 != 0 && !(1200..1500).contains(&i)).then_some(b.as_slice()),
            ))),
        ];
        let fields = vec![
            Field::new("text", DataType::Utf8, false),
            Field::new("blob", DataType::Binary, true),
        ];
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
        for (dictionary, version) in [
            (true, WriterVersion::PARQUET_1_0),
            (true, WriterVersion::PARQUET_2_0),
            (false, WriterVersion::PARQUET_1_0),
        ] {
            let props = WriterProperties::builder()
                .set_dictionary_enabled(dictionary)
                .set_dictionary_page_size_limit(512)
                .set_data_page_size_limit(1024)
                .set_write_batch_size(50)
                .set_writer_version(version)
                .set_compression(Compression::ZSTD(ZstdLevel::default()))
                .set_max_row_group_row_count(Some(700))
                .build();
            let (file, arrow) = write_parquet(&batch, Some(props));
            let metadata = arrow.metadata().clone();
            let mut decoded = 0;
            for root in 0..2 {
                let (leaf, utf8) = bytes_leaf(&arrow, root).expect("a byte array leaf");
                assert_eq!(utf8, root == 0);
                let mut at = 0;
                for rg in 0..metadata.num_row_groups() {
                    let meta = metadata.row_group(rg);
                    let n = meta.num_rows() as usize;
                    let chunk = meta.column(leaf);
                    if supported(chunk) {
                        let array = decode_bytes(Arc::new(file.clone()), chunk, n, utf8).unwrap();
                        assert_eq!(array.len(), n);
                        for r in 0..n {
                            let i = at + r;
                            let null = !utf8 && (i % 7 == 0 || (1200..1500).contains(&i));
                            assert_eq!(array.is_null(r), null, "row {i} of column {root}");
                            if null {
                                continue;
                            }
                            let got: &[u8] = if utf8 {
                                array.as_string_view().value(r).as_bytes()
                            } else {
                                array.as_binary_view().value(r)
                            };
                            let want: &[u8] = if utf8 {
                                text[at + r].as_bytes()
                            } else {
                                &blobs[at + r]
                            };
                            assert_eq!(got, want, "row {} of column {root}", at + r);
                        }
                        decoded += 1;
                    } else {
                        assert_eq!(version, WriterVersion::PARQUET_2_0);
                    }
                    at += n;
                }
                assert_eq!(at, rows);
            }
            if version == WriterVersion::PARQUET_1_0 {
                assert_eq!(decoded, 2 * metadata.num_row_groups());
            }
            // The reader agrees with the source data (the comparison above is
            // against the values written).
            let read = read_with_parquet(&file);
            assert_eq!(read, batch);
        }
    }
}
