//! Lists of binary or string items (`list<string>`, a list of structs'
//! fields): the items' bytes end to end, row boundaries in items, item
//! boundaries in bytes.

use crate::batch::Buffer;
use crate::gather::RowRefs;
use crate::gather::kernels::{SourceColumn, write_i64};

/// The items of each source's list column, as columns of their own.
fn items_of(cols: &[&SourceColumn]) -> Vec<SourceColumn> {
    cols.iter()
        .map(|col| SourceColumn {
            data: col.data.child_data()[0].clone(),
            key_bound: None,
        })
        .collect()
}

/// Items and bytes of the list column `cols` (one per source) over `rows`;
/// `large`: 64-bit list offsets, 64-bit item offsets.
pub(super) fn totals(
    cols: &[&SourceColumn],
    large: (bool, bool),
    rows: &RowRefs,
) -> (usize, usize) {
    let items = items_of(cols);
    let (mut count, mut bytes) = (0usize, 0usize);
    for (s, r) in rows {
        let (a, b) = cols[*s as usize].span(large.0, *r as usize);
        let items = &items[*s as usize];
        for j in a..b.min(items.data.len()) {
            bytes += items.value_bytes(large.1, j).len();
        }
        count += b - a;
    }
    (count, bytes)
}

/// Write `rows` of the list column `name` (`cols`, one per source) into
/// its `[values, offsets, value_offsets]` buffers of `slab`, laid out for
/// [`totals`]'s counts.
pub(super) fn write(
    name: &str,
    cols: &[&SourceColumn],
    large: (bool, bool),
    rows: &RowRefs,
    slab: &mut [u8],
    [values, offsets, value_offsets]: [&Buffer; 3],
) -> Result<(), String> {
    let items = items_of(cols);
    let region = slab
        .get_mut(values.offset..values.offset + values.len())
        .ok_or_else(|| format!("the bytes of `{name}` pass the slab"))?;
    let mut row_offs: Vec<i64> = Vec::with_capacity(rows.len() + 1);
    let mut item_offs: Vec<i64> = Vec::with_capacity(value_offsets.len());
    row_offs.push(0);
    item_offs.push(0);
    let mut at = 0usize;
    for (s, r) in rows {
        let (a, b) = cols[*s as usize].span(large.0, *r as usize);
        let items = &items[*s as usize];
        if b > items.data.len() {
            return Err(format!(
                "a row of `{name}` has items up to {b} of {}",
                items.data.len()
            ));
        }
        for j in a..b {
            let value = items.value_bytes(large.1, j);
            region
                .get_mut(at..at + value.len())
                .ok_or_else(|| format!("the bytes of `{name}` pass their region"))?
                .copy_from_slice(value);
            at += value.len();
            item_offs.push(at as i64);
        }
        row_offs.push(item_offs.len() as i64 - 1);
    }
    if item_offs.len() != value_offsets.len() {
        return Err(format!(
            "{} items of `{name}` laid out for {}",
            item_offs.len() - 1,
            value_offsets.len().saturating_sub(1)
        ));
    }
    write_i64(slab, offsets, &row_offs);
    write_i64(slab, value_offsets, &item_offs);
    Ok(())
}
