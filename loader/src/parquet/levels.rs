//! Definition levels of flat nullable columns (bit width 1): whether a page
//! has nulls, and the validity bitmap of a chunk.

use arrow_buffer::{BooleanBufferBuilder, NullBuffer};

use super::rle::{Bits, low_bits, walk_bits};

/// Whether the `count` definition levels (bit width 1) in `levels` are all
/// 1: no nulls.
pub(super) fn all_defined(levels: &[u8], count: usize) -> std::result::Result<bool, String> {
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
pub(super) fn page_present(
    def: Option<&[u8]>,
    count: usize,
    before: usize,
    rows: usize,
    validity: &mut Option<BooleanBufferBuilder>,
) -> std::result::Result<usize, String> {
    if before.checked_add(count).is_none_or(|end| end > rows) {
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

/// The rows a chunk's decode gives: `decoded` when a prefix of `want` rows
/// was asked for (`want < rows`) and reached, else exactly the `rows` the
/// footer says (any other count is an error).
pub(super) fn decoded_rows(want: usize, rows: usize, decoded: usize) -> Result<usize, String> {
    if want < rows && decoded >= want {
        Ok(decoded)
    } else if decoded != rows {
        Err(format!(
            "holds {decoded} values; the footer says {rows} rows"
        ))
    } else {
        Ok(rows)
    }
}

/// The null buffer of a chunk of `rows` rows from its `validity` (none: no
/// nulls), padded with valid rows after its last null.
pub(super) fn finish_validity(
    validity: Option<BooleanBufferBuilder>,
    rows: usize,
) -> Option<NullBuffer> {
    validity.map(|mut v| {
        let missing = rows.saturating_sub(v.len());
        v.append_n(missing, true);
        NullBuffer::new(v.finish())
    })
}
