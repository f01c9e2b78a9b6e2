//! Flat binary and string columns (images, text), required or nullable: a
//! view array over the decompressed pages, so each value is copied once,
//! from its page into the slab.

use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_buffer::{BooleanBufferBuilder, Buffer};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::basic::{Encoding, Type as PhysicalType};
use parquet::errors::Result;
use parquet::file::metadata::ColumnChunkMetaData;
use parquet::file::reader::ChunkReader;

use super::error::DecodeError;
use super::levels::{decoded_rows, finish_validity, page_present};
use super::page::{FlatPage, Pages, flat_page};
use super::rle::gather_dictionary;
use super::{Limits, single_leaf};

/// The leaf of root column `root` when it is a non-nested byte array
/// (required or nullable) read as binary or a string: `(leaf, utf8)`.
pub(super) fn bytes_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<(usize, bool)> {
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
    // Each value takes at least its 4-byte length: a count that cannot fit
    // fails before anything is reserved for it.
    if count > data.len() / 4 {
        return Err(format!(
            "{count} values cannot fit in a page of {} bytes",
            data.len()
        ));
    }
    views.reserve(count);
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
/// page into the slab). With `want < rows`, decoding stops after the page
/// that reaches `want` rows.
pub(super) fn decode_bytes<R: ChunkReader + 'static>(
    file: Arc<R>,
    chunk: &ColumnChunkMetaData,
    (rows, want): (usize, usize),
    utf8: bool,
    limits: &Limits,
) -> Result<ArrayRef> {
    let path = chunk.column_path().string();
    let err = |e: String| DecodeError::column(&path, e);
    limits.check(rows, 16, &path)?;
    let mut pages = Pages::open(file, chunk, rows, limits)?;
    let def_levels = chunk.column_descr().max_def_level() > 0;
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut views: Vec<u128> = Vec::with_capacity(rows);
    let mut dictionary: Option<Vec<u128>> = None;
    let mut validity: Option<BooleanBufferBuilder> = None;
    let mut decoded = 0usize;
    let mut data_seen = false;
    while let Some(page) = pages.next_page()? {
        let (buf, num_values, encoding, def) = match flat_page(page, def_levels).map_err(err)? {
            FlatPage::Dictionary { buf, num_values } => {
                if dictionary.is_some() || data_seen {
                    return Err(err(
                        "a dictionary page after the chunk's first page (a chunk has at most one, first)"
                            .into(),
                    ));
                }
                let mut dict = Vec::new();
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
        data_seen = true;
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
        if want < rows && decoded >= want {
            // A prefix was asked for: the pages after it are not decoded.
            break;
        }
    }
    let rows = decoded_rows(want, rows, decoded).map_err(err)?;
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
    // SAFETY: every view was made by `make_view` (in `plain_views`, above)
    // from a value read with a bounds-checked `get` inside the page that is
    // pushed as the buffer it names; null rows hold the empty inline view 0;
    // string values were checked to be UTF-8 there.
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
