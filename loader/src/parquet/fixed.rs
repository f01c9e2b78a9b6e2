//! Flat fixed-width columns (numeric features, categorical ids), required or
//! nullable. A dictionary-encoded column chunk stays a dictionary (null rows
//! get key 0 and a validity bitmap): its keys are decoded into a `u16` buffer
//! (dictionaries of at most 2^16 values) or an `i32` one, and its values are
//! the small dictionary page, as an Arrow `Dictionary(UInt16 | Int32, T)`
//! array. The shuffle stage then permutes keys instead of values, and the
//! collator looks each value up as it writes the slab. A chunk that falls
//! back to plain pages, or whose integers are `DELTA_BINARY_PACKED`, is
//! decoded to plain values.

use std::sync::Arc;

use arrow_array::types::{ArrowDictionaryKeyType, Int32Type, UInt16Type};
use arrow_array::{ArrayRef, DictionaryArray, PrimitiveArray, make_array};
use arrow_buffer::{ArrowNativeType, BooleanBufferBuilder, Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use bytes::Bytes;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::column::page::Page;
use parquet::errors::Result;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;

use super::delta::delta_values;
use super::error::DecodeError;
use super::levels::{decoded_rows, finish_validity, page_present};
use super::page::{FlatPage, Pages, flat_page};
use super::rle::{Key, Keys, dictionary_keys};
use super::{Limits, single_leaf};

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
    /// Stored as INT32 or INT64 (not FLOAT or DOUBLE).
    integer: bool,
}

impl FixedLeaf {
    /// Whether values are stored as INT32 or INT64 (`DELTA_BINARY_PACKED`
    /// is for those only).
    pub(super) fn integer(&self) -> bool {
        self.integer
    }
}

/// The leaf of root column `root` when it is a non-nested primitive
/// (required or nullable) whose Arrow type this decoder handles.
pub(super) fn fixed_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<FixedLeaf> {
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
        integer: matches!(
            column.physical_type(),
            PhysicalType::INT32 | PhysicalType::INT64
        ),
    })
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

/// The plain values of a chunk being decoded (Arrow width), made at its
/// first page that is not dictionary encoded from the values of the `keys`
/// decoded before it (their checks against `dictionary` already done).
fn plain_values<'a, K: Key>(
    plain: &'a mut Option<Vec<u8>>,
    keys: &[K],
    dictionary: Option<&[u8]>,
    rows: usize,
    leaf: &FixedLeaf,
) -> &'a mut Vec<u8> {
    plain.get_or_insert_with(|| {
        let mut values = Vec::with_capacity(rows * leaf.width);
        if let Some(dict) = dictionary {
            for &k in keys {
                let at = k.as_usize() * leaf.physical;
                narrow(&dict[at..at + leaf.physical], leaf, &mut values);
            }
        }
        values
    })
}

/// Decode `rows` values of the column chunk `chunk` (a [`FixedLeaf`]) of a
/// row group into an Arrow array of type `data_type`: a `Dictionary(Int32, _)`
/// when every data page is dictionary encoded, plain values otherwise. With
/// `want < rows`, decoding stops after the page that reaches `want` rows
/// (the array then holds at least `want`).
pub(super) fn decode_fixed<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    leaf: &FixedLeaf,
    rows: usize,
    want: usize,
    data_type: &DataType,
    limits: &Limits,
) -> Result<ArrayRef> {
    let mut pages = Pages::open(file, chunk, rows, limits)?;
    // Keys of dictionaries up to 2^16 values take 2 bytes, others 4.
    let first = pages.next_page()?;
    let small = matches!(&first, Some(Page::DictionaryPage { num_values, .. })
        if *num_values as usize <= 1 << 16);
    if small {
        decode_fixed_keys::<UInt16Type, R>(
            pages,
            first,
            chunk,
            leaf,
            (rows, want),
            data_type,
            limits,
        )
    } else {
        decode_fixed_keys::<Int32Type, R>(
            pages,
            first,
            chunk,
            leaf,
            (rows, want),
            data_type,
            limits,
        )
    }
}

/// [`decode_fixed`] with keys of type `K`; `first` is the chunk's first page.
fn decode_fixed_keys<K: ArrowDictionaryKeyType, R: ChunkReader + 'static>(
    mut pages: Pages<R>,
    first: Option<Page>,
    chunk: &ColumnChunkMetaData,
    leaf: &FixedLeaf,
    (rows, want): (usize, usize),
    data_type: &DataType,
    limits: &Limits,
) -> Result<ArrayRef>
where
    K::Native: Key,
{
    let path = chunk.column_path().string();
    let err = |e: String| DecodeError::column(&path, e);
    // Keys and values of every row (a count from the footer) must fit the
    // byte limit before anything is sized by it.
    limits.check(rows, leaf.width.max(K::Native::get_byte_width()), &path)?;
    let def_levels = chunk.column_descr().max_def_level() > 0;
    let mut validity: Option<BooleanBufferBuilder> = None;
    // Dictionary values at the stored width, and the keys decoded so far.
    let mut dictionary: Option<Bytes> = None;
    // (Sized at the first dictionary-encoded page: a chunk of delta or
    // plain pages has none.)
    let mut keys: Vec<K::Native> = Vec::new();
    // Once a plain page shows up, values (Arrow width) replace keys.
    let mut plain: Option<Vec<u8>> = None;
    let mut decoded = 0usize;
    let mut data_seen = false;
    let mut pending = first;
    while let Some(page) = match pending.take() {
        Some(page) => Some(page),
        None => pages.next_page()?,
    } {
        let (buf, num_values, encoding, def) = match flat_page(page, def_levels).map_err(err)? {
            FlatPage::Dictionary { buf, num_values } => {
                // One dictionary, before any data page: keys are checked
                // against it page by page, so a second one would leave keys
                // checked against the wrong dictionary.
                if dictionary.is_some() || data_seen {
                    return Err(err(
                        "a dictionary page after the chunk's first page (a chunk has at most one, first)"
                            .into(),
                    ));
                }
                let bytes = num_values
                    .checked_mul(leaf.physical)
                    .ok_or_else(|| err(format!("a dictionary of {num_values} values")))?;
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
        data_seen = true;
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
                let values = plain_values(&mut plain, &keys, dictionary.as_deref(), rows, leaf);
                narrow(&buf[..bytes], leaf, values);
            }
            Encoding::DELTA_BINARY_PACKED if leaf.integer => {
                let values = plain_values(&mut plain, &keys, dictionary.as_deref(), rows, leaf);
                delta_values(&buf, present, leaf.physical, leaf.width, values).map_err(err)?;
            }
            Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY => {
                let Some(dict) = &dictionary else {
                    return Err(err(
                        "a dictionary-encoded page without a dictionary page".into()
                    ));
                };
                let dict_len = dict.len() / leaf.physical;
                let start = keys.len();
                if keys.capacity() == 0 {
                    keys.reserve_exact(rows);
                }
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
        if want < rows && decoded >= want {
            // A prefix was asked for: the pages after it are not decoded.
            break;
        }
    }
    let rows = decoded_rows(want, rows, decoded).map_err(err)?;
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
    // SAFETY: every key is in 0..dict_len: each data page's keys were
    // checked against the chunk's only dictionary (a second dictionary page
    // is refused above) before they were kept, null rows hold key 0, and a
    // chunk with keys but an empty dictionary failed that check.
    let array = unsafe { DictionaryArray::<K>::new_unchecked(keys, dict_values) };
    Ok(Arc::new(array))
}
