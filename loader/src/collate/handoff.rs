//! Rows handed on uncollated: a mixture that packs reads each document's
//! tokens straight from the decoded row groups, where a collated batch would
//! have them copied twice (into the source's slab, then into the packed
//! one).
//!
//! A source of a packing mixture has one projected column, a list of
//! integers. Its collator then hands on, instead of a slab of the rows'
//! values, the decoded arrays they lie in and each row's range of them
//! ([`Handoff`]), holding the windows those arrays belong to: their row
//! groups, and the share of the byte budget they took, are given back when
//! the last batch naming them goes. The loader's build reserves room in the
//! budget for the windows such batches hold ([`crate::budget`]), so holding
//! them never stalls the decoders that the next batch waits for.
//!
//! Only values the process owns are handed on: a values buffer inside a
//! mapping of a shard ([`crate::mapfile`]) is collated as before (a file
//! changed after the batch's check must not change what it holds), and so
//! are lists with null items (the slab reads them as zeros), dictionary
//! values and value types a packer does not take. The failpoint `handoff`
//! with the action `stop` collates a batch that could have been handed on
//! (tests compare the two paths).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type};
use arrow_array::{Array, ArrayRef, make_array};
use arrow_schema::DataType;

use crate::gather::RowRefs;
use crate::gather::kernels::SourceColumn;
use crate::pack::Tokens;
use crate::shuffle::LoadedWindow;

/// One decoded batch's list column, as a handoff reads it.
#[derive(Clone)]
pub(crate) struct HandoffValues {
    /// The list's values: a primitive array of a token type without nulls.
    values: ArrayRef,
    /// The list itself (offsets and row validity).
    list: arrow_data::ArrayData,
}

impl HandoffValues {
    /// The values of row `row` as a range of [`HandoffValues::values`]
    /// (empty for a null row); `None` for a row past the list.
    fn range(&self, row: usize) -> Option<(usize, usize)> {
        if row >= self.list.len() {
            return None;
        }
        if self.list.nulls().is_some_and(|n| n.is_null(row)) {
            return Some((0, 0));
        }
        let at = self.list.offset().checked_add(row)?;
        let (a, z) = match self.list.data_type() {
            DataType::List(_) => {
                let o = self.list.buffers()[0].typed_data::<i32>();
                (
                    usize::try_from(*o.get(at)?).ok()?,
                    usize::try_from(*o.get(at + 1)?).ok()?,
                )
            }
            DataType::LargeList(_) => {
                let o = self.list.buffers()[0].typed_data::<i64>();
                (
                    usize::try_from(*o.get(at)?).ok()?,
                    usize::try_from(*o.get(at + 1)?).ok()?,
                )
            }
            _ => return None,
        };
        (a <= z && z <= self.values.len()).then_some((a, z))
    }
}

/// The list column of a decoded batch when its values may be handed on as
/// they lie (see the module's documentation); `None` otherwise.
pub(crate) fn handoff_values(columns: &[SourceColumn]) -> Option<HandoffValues> {
    let [column] = columns else {
        return None;
    };
    let list = &column.data;
    if !matches!(list.data_type(), DataType::List(_) | DataType::LargeList(_))
        || list.buffers().len() != 1
        || list.child_data().len() != 1
    {
        return None;
    }
    let child = &list.child_data()[0];
    let supported = matches!(
        child.data_type(),
        DataType::Int32
            | DataType::UInt32
            | DataType::Int64
            | DataType::UInt16
            | DataType::Int16
            | DataType::UInt8
    );
    if !supported || child.null_count() > 0 {
        return None;
    }
    let values = make_array(child.clone());
    let bytes = child
        .buffers()
        .first()
        .map(|b| b.as_ptr() as usize..b.as_ptr() as usize + b.len())?;
    if crate::mapfile::overlaps_mapping(bytes) {
        return None;
    }
    Some(HandoffValues {
        values,
        list: list.clone(),
    })
}

/// A batch's rows as they lie in the decoded row groups.
pub(crate) struct Handoff {
    /// The windows the rows lie in: they, and the budget their row groups
    /// took, stay until the batch goes.
    _windows: Vec<Arc<LoadedWindow>>,
    /// The values of each source batch the rows come from.
    values: Vec<ArrayRef>,
    /// Each row: its source batch (in `values`) and its range of values.
    rows: Vec<(u32, usize, usize)>,
}

impl Handoff {
    /// The handoff of `rows` (source batch, row), the source batches being
    /// those of `sources` in order; `None` where one of them may not be
    /// handed on (the batch is collated).
    pub(crate) fn of(
        windows: Vec<Arc<LoadedWindow>>,
        sources: &[Option<&HandoffValues>],
        rows: &RowRefs,
    ) -> Option<Handoff> {
        let mut used: Vec<Option<u32>> = vec![None; sources.len()];
        let mut values: Vec<ArrayRef> = Vec::new();
        let mut out = Vec::with_capacity(rows.len());
        for &(b, r) in rows {
            let source = (*sources.get(b as usize)?)?;
            let at = match used[b as usize] {
                Some(at) => at,
                None => {
                    values.push(source.values.clone());
                    let at = u32::try_from(values.len() - 1).ok()?;
                    used[b as usize] = Some(at);
                    at
                }
            };
            let (a, z) = source.range(r as usize)?;
            out.push((at, a, z));
        }
        Some(Handoff {
            _windows: windows,
            values,
            rows: out,
        })
    }

    /// Rows handed on.
    pub(crate) fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Bytes the rows would take collated: their values, and the offsets.
    pub(crate) fn bytes(&self) -> usize {
        let values: usize = (self.rows.iter())
            .map(|&(at, a, z)| {
                let width = self.values[at as usize]
                    .data_type()
                    .primitive_width()
                    .unwrap_or(0);
                (z - a) * width
            })
            .sum();
        values + 8 * (self.rows.len() + 1)
    }

    /// The tokens of row `row`.
    pub(crate) fn tokens(&self, row: usize) -> Option<Tokens<'_>> {
        let &(at, a, z) = self.rows.get(row)?;
        let values = self.values.get(at as usize)?;
        Some(match values.data_type() {
            DataType::Int32 => Tokens::I32(&values.as_primitive::<Int32Type>().values()[a..z]),
            DataType::UInt32 => Tokens::U32(&values.as_primitive::<UInt32Type>().values()[a..z]),
            DataType::Int64 => Tokens::I64(&values.as_primitive::<Int64Type>().values()[a..z]),
            DataType::UInt16 => Tokens::U16(&values.as_primitive::<UInt16Type>().values()[a..z]),
            DataType::Int16 => Tokens::I16(&values.as_primitive::<Int16Type>().values()[a..z]),
            DataType::UInt8 => Tokens::U8(&values.as_primitive::<UInt8Type>().values()[a..z]),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{Int32Builder, ListBuilder};

    fn column(rows: &[Option<Vec<Option<i32>>>]) -> SourceColumn {
        let mut b = ListBuilder::new(Int32Builder::new());
        for row in rows {
            match row {
                Some(values) => {
                    for v in values {
                        b.values().append_option(*v);
                    }
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        SourceColumn {
            data: b.finish().into_data(),
            key_bound: None,
        }
    }

    fn ids(t: Tokens<'_>) -> Vec<i32> {
        let mut out = vec![0; t.len()];
        t.copy_to(0, &mut out).unwrap();
        out
    }

    /// Rows of two batches, a null list among them, read back as the
    /// collator would have laid them out (a null row empty), in any order.
    #[test]
    fn rows_are_read_where_they_lie() {
        let a = column(&[Some(vec![Some(1), Some(2)]), None, Some(vec![Some(3)])]);
        let b = column(&[Some(vec![]), Some(vec![Some(7), Some(8), Some(9)])]);
        let sources = [handoff_values(&[a]), handoff_values(&[b])];
        let refs: Vec<Option<&HandoffValues>> = sources.iter().map(Option::as_ref).collect();
        let rows = [(1, 1), (0, 2), (0, 1), (1, 0), (0, 0)];
        let h = Handoff::of(Vec::new(), &refs, &rows).unwrap();
        assert_eq!(h.rows(), 5);
        let got: Vec<Vec<i32>> = (0..5).map(|r| ids(h.tokens(r).unwrap())).collect();
        assert_eq!(got, [vec![7, 8, 9], vec![3], vec![], vec![], vec![1, 2]]);
        assert!(h.tokens(5).is_none());
        assert_eq!(h.bytes(), 6 * 4 + 8 * 6);
    }

    /// Null items (the slab reads them as zeros), another column count, or
    /// a row past the list: collated instead.
    #[test]
    fn what_a_slab_would_change_is_not_handed_on() {
        assert!(handoff_values(&[column(&[Some(vec![Some(1), None])])]).is_none());
        let one = column(&[Some(vec![Some(1)])]);
        assert!(handoff_values(&[one.clone(), one.clone()]).is_none());
        assert!(handoff_values(&[]).is_none());
        let sources = [handoff_values(&[one])];
        let refs: Vec<Option<&HandoffValues>> = sources.iter().map(Option::as_ref).collect();
        assert!(Handoff::of(Vec::new(), &refs, &[(0, 1)]).is_none());
        assert!(Handoff::of(Vec::new(), &refs, &[(1, 0)]).is_none());
        assert!(Handoff::of(Vec::new(), &[None], &[(0, 0)]).is_none());
    }
}
