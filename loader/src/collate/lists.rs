//! Lists of binary or string items (`list<string>`, a list of structs'
//! fields), and lists of lists of fixed-width values (`list<list<float32>>`):
//! the items' values end to end, row boundaries in items, item boundaries in
//! values (bytes for binary and strings).

use arrow_schema::DataType;

use crate::batch::Buffer;
use crate::gather::RowRefs;
use crate::gather::kernels::{SourceColumn, row_valid, write_i64};

/// One source's list column as the collator reads it: the list, whether
/// its offsets are 64-bit, its items as a column of their own and whether
/// theirs are. Taken from the arrays themselves (a decoder may hand on
/// another width than the schema's).
struct Lists<'a> {
    list: &'a SourceColumn,
    large_list: bool,
    items: SourceColumn,
    /// Whether the items' offsets are 64-bit.
    large_items: bool,
    /// For lists of lists: the bytes of a value (0 for binary and string
    /// items).
    width: usize,
    /// For lists of fixed-size lists: the values of each.
    fixed: Option<usize>,
}

impl Lists<'_> {
    /// Null values of inner list `j` (of a list of lists), copied into
    /// `out`, made zeros: a reader leaves whatever it had in their slots.
    fn zero_nulls(&self, j: usize, out: &mut [u8]) {
        let Some(nulls) = self
            .items
            .data
            .child_data()
            .first()
            .and_then(|values| values.nulls())
            .filter(|n| n.null_count() > 0 && self.width > 0)
        else {
            return;
        };
        let (a, _) = self.values_of(j);
        for (k, slot) in out.chunks_exact_mut(self.width).enumerate() {
            if nulls.is_null(a + k) {
                slot.fill(0);
            }
        }
    }

    /// The values of inner list `j` (of a list of lists): their range in
    /// the inner lists' values; a null inner list's is empty.
    fn values_of(&self, j: usize) -> (usize, usize) {
        match self.fixed {
            None => self.items.span(self.large_items, j),
            Some(_) if !row_valid(&self.items, j) => (0, 0),
            Some(n) => {
                let at = (self.items.data.offset() + j) * n;
                (at, at + n)
            }
        }
    }

    /// The bytes of item `j`; `None` past the values the arrays hold.
    fn item(&self, j: usize) -> Option<&[u8]> {
        if self.width == 0 {
            return Some(self.items.value_bytes(self.large_items, j));
        }
        let (a, b) = self.values_of(j);
        let values = self.items.data.child_data().first()?;
        SourceColumn::fixed(values, self.width).get(a * self.width..b * self.width)
    }
}

/// Each source's list column of `cols`; an error for anything but a list
/// of binary or string items.
fn lists_of<'a>(cols: &[&'a SourceColumn], name: &str) -> Result<Vec<Lists<'a>>, String> {
    cols.iter()
        .map(|&list| {
            let large_list = match list.data.data_type() {
                DataType::List(_) => false,
                DataType::LargeList(_) => true,
                other => return Err(format!("`{name}` was decoded as {other}, not a list")),
            };
            let child = list
                .data
                .child_data()
                .first()
                .ok_or_else(|| format!("`{name}` was decoded without its items"))?;
            let (large_items, width, fixed) = match child.data_type() {
                DataType::Binary | DataType::Utf8 | DataType::BinaryView | DataType::Utf8View => {
                    (false, 0, None)
                }
                DataType::LargeBinary | DataType::LargeUtf8 => (true, 0, None),
                DataType::List(f) | DataType::LargeList(f)
                    if f.data_type().primitive_width().is_some_and(|w| w > 0) =>
                {
                    let width = f.data_type().primitive_width().unwrap_or(1);
                    (
                        matches!(child.data_type(), DataType::LargeList(_)),
                        width,
                        None,
                    )
                }
                DataType::FixedSizeList(f, n)
                    if f.data_type().primitive_width().is_some_and(|w| w > 0) && *n >= 0 =>
                {
                    let width = f.data_type().primitive_width().unwrap_or(1);
                    (false, width, Some(*n as usize))
                }
                other => {
                    return Err(format!(
                        "`{name}`'s items were decoded as {other}, not bytes or lists of values"
                    ));
                }
            };
            Ok(Lists {
                list,
                large_list,
                items: SourceColumn {
                    data: child.clone(),
                    key_bound: None,
                },
                large_items,
                width,
                fixed,
            })
        })
        .collect()
}

/// Items and bytes of the list column `name` (`cols`, one per source) over
/// `rows`.
pub(super) fn totals(
    name: &str,
    cols: &[&SourceColumn],
    rows: &RowRefs,
) -> Result<(usize, usize), String> {
    let lists = lists_of(cols, name)?;
    let (mut count, mut bytes) = (0usize, 0usize);
    for (s, r) in rows {
        let l = &lists[*s as usize];
        let (a, b) = l.list.span(l.large_list, *r as usize);
        for j in a..b.min(l.items.data.len()) {
            bytes += l.item(j).map_or(0, <[u8]>::len);
        }
        count += b.saturating_sub(a);
    }
    Ok((count, bytes))
}

/// Write `rows` of the list column `name` (`cols`, one per source) into
/// its `[values, offsets, value_offsets]` buffers of `slab`, laid out for
/// [`totals`]'s counts (other counts are an error).
pub(super) fn write(
    name: &str,
    cols: &[&SourceColumn],
    rows: &RowRefs,
    slab: &mut [u8],
    [values, offsets, value_offsets]: [&Buffer; 3],
) -> Result<(), String> {
    let lists = lists_of(cols, name)?;
    let region = slab
        .get_mut(values.offset..values.offset + values.bytes())
        .ok_or_else(|| format!("the bytes of `{name}` pass the slab"))?;
    // Item boundaries count values (bytes for binary and strings).
    let size = values.dtype.size();
    let mut row_offs: Vec<i64> = Vec::with_capacity(rows.len() + 1);
    let mut item_offs: Vec<i64> = Vec::with_capacity(value_offsets.len());
    row_offs.push(0);
    item_offs.push(0);
    let mut at = 0usize;
    for (s, r) in rows {
        let l = &lists[*s as usize];
        let (a, b) = l.list.span(l.large_list, *r as usize);
        if b > l.items.data.len() {
            return Err(format!(
                "a row of `{name}` has items up to {b} of {}",
                l.items.data.len()
            ));
        }
        for j in a..b {
            let value = l
                .item(j)
                .ok_or_else(|| format!("an item of `{name}` passes its values"))?;
            let out = region
                .get_mut(at..at + value.len())
                .ok_or_else(|| format!("the bytes of `{name}` pass their region"))?;
            out.copy_from_slice(value);
            l.zero_nulls(j, out);
            at += value.len();
            item_offs.push((at / size) as i64);
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
