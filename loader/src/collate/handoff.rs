//! Rows handed on uncollated: a mixture reads each row straight from the
//! decoded row groups, where a collated batch would have it copied twice
//! (into the source's slab, then into the mixture's, or the packer's).
//!
//! A mixture's source whose one projected column is a list of numbers
//! (token ids, most often) hands on, instead of a slab of the rows' values,
//! the decoded arrays they lie in and each row's range of them
//! ([`Handoff`]), holding the windows those arrays belong to: their row
//! groups, and the share of the byte budget they took, are given back when
//! the last batch naming them goes. The loader's build reserves room in the
//! budget for the windows such batches hold (`loader/src/build.rs`), so
//! holding them never stalls the decoders that the next batch waits for;
//! where the budget has no room, the source collates as before. To the
//! mixture such a batch has the column a collated one has (name, ragged
//! layout, a validity mask where the column is nullable), read through
//! [`crate::Batch`]'s row accessors.
//!
//! Only values the process owns are handed on: a values buffer inside a
//! mapping of a shard ([`crate::mapfile`]) is collated as before (a file
//! changed after the batch's check must not change what it holds), and so
//! are lists with null items (the slab reads them as zeros), dictionary
//! values and values of another type than the column's plan. The failpoint
//! `handoff` with the action `stop` collates a batch that could have been
//! handed on (tests compare the two paths).

use std::sync::Arc;
use std::time::Instant;

use arrow_buffer::Buffer as Bytes;
use arrow_data::ArrayData;
use arrow_schema::DataType;

use shardfeed_format::failpoint::Action;

use super::Collator;
use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType, HandedOn};
use crate::columns::{ColumnPlan, Kind, primitive};
use crate::error::{LoaderError, Result, Stage};
use crate::gather::RowRefs;
use crate::gather::kernels::SourceColumn;
use crate::pack::Tokens;
use crate::shuffle::LoadedWindow;
use crate::stage::injected;
use crate::stats::Counters;

/// One decoded batch's list column, as a handoff reads it.
#[derive(Clone)]
pub(crate) struct HandoffValues {
    /// The list's values, from the first (the child's offset applied).
    values: Bytes,
    /// Values in `values`.
    len: usize,
    /// The list itself (offsets and row validity).
    list: ArrayData,
}

impl HandoffValues {
    /// The values of row `row` as a range of elements of
    /// [`HandoffValues::values`] (empty for a null row), and whether the
    /// row is valid; `None` for a row past the list.
    fn range(&self, row: usize) -> Option<(usize, usize, bool)> {
        if row >= self.list.len() {
            return None;
        }
        if self.list.nulls().is_some_and(|n| n.is_null(row)) {
            return Some((0, 0, false));
        }
        let at = self.list.offset().checked_add(row)?;
        let offsets = &self.list.buffers()[0];
        let (a, z) = match self.list.data_type() {
            DataType::List(_) => {
                let o: &[i32] = offsets.typed_data();
                (
                    usize::try_from(*o.get(at)?).ok()?,
                    usize::try_from(*o.get(at + 1)?).ok()?,
                )
            }
            DataType::LargeList(_) => {
                let o: &[i64] = offsets.typed_data();
                (
                    usize::try_from(*o.get(at)?).ok()?,
                    usize::try_from(*o.get(at + 1)?).ok()?,
                )
            }
            _ => return None,
        };
        (a <= z && z <= self.len).then_some((a, z, true))
    }
}

/// The list column of a decoded batch (the only column of `columns`,
/// planned as `plan`) when its values may be handed on as they lie (see the
/// module's documentation); `None` otherwise.
pub(crate) fn handoff_values(plan: &ColumnPlan, columns: &[SourceColumn]) -> Option<HandoffValues> {
    let ([column], Kind::List { dtype, .. }) = (columns, plan.kind) else {
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
    if primitive(child.data_type()) != Some(dtype)
        || dtype == DType::Bool
        || child.null_count() > 0
        || child.buffers().len() != 1
    {
        return None;
    }
    let size = dtype.size();
    let from = child.offset().checked_mul(size)?;
    let bytes = child.len().checked_mul(size)?;
    let buffer = &child.buffers()[0];
    if from.checked_add(bytes)? > buffer.len() {
        return None;
    }
    let values = buffer.slice_with_length(from, bytes);
    let at = values.as_ptr() as usize;
    if crate::mapfile::overlaps_mapping(at..at + values.len()) {
        return None;
    }
    Some(HandoffValues {
        values,
        len: child.len(),
        list: list.clone(),
    })
}

/// A batch's rows as they lie in the decoded row groups.
pub(crate) struct Handoff {
    /// The windows the rows lie in: they, and the budget their row groups
    /// took, stay until the batch goes.
    _windows: Vec<Arc<LoadedWindow>>,
    /// The column as a collated batch has it, its buffers empty.
    column: Column,
    dtype: DType,
    /// The values of each source batch the rows come from.
    values: Vec<Bytes>,
    /// Each row: its source batch (in `values`), its range of values (in
    /// elements) and whether it is valid.
    rows: Vec<(u32, usize, usize, bool)>,
}

impl Handoff {
    /// The handoff of `rows` (source batch, row) of the column `plan`, the
    /// source batches being those of `sources` in order; `None` where one
    /// of them may not be handed on (the batch is collated).
    pub(crate) fn of(
        windows: Vec<Arc<LoadedWindow>>,
        plan: &ColumnPlan,
        sources: &[Option<&HandoffValues>],
        rows: &RowRefs,
    ) -> Option<Handoff> {
        let Kind::List { dtype, .. } = plan.kind else {
            return None;
        };
        let mut used: Vec<Option<u32>> = vec![None; sources.len()];
        let mut values: Vec<Bytes> = Vec::new();
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
            let (a, z, valid) = source.range(r as usize)?;
            out.push((at, a, z, valid));
        }
        let empty = |dtype| Buffer {
            dtype,
            shape: vec![0],
            offset: 0,
        };
        let column = Column {
            name: plan.name.clone(),
            layout: ColumnLayout::Ragged {
                values: empty(dtype),
                offsets: empty(DType::I64),
            },
            validity: plan.nullable.then(|| empty(DType::U8)),
        };
        Some(Handoff {
            _windows: windows,
            column,
            dtype,
            values,
            rows: out,
        })
    }

    /// Rows handed on.
    pub(crate) fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The column, as a collated batch has it (its buffers empty: rows are
    /// read with [`Handoff::row`]).
    pub(crate) fn column(&self) -> &Column {
        &self.column
    }
}

impl HandedOn for Handoff {
    /// Bytes the rows would take collated: their values, the offsets and
    /// the validity.
    fn bytes(&self) -> usize {
        let values: usize = self.rows.iter().map(|&(_, a, z, _)| z - a).sum();
        let validity = if self.column.validity.is_some() {
            self.rows.len()
        } else {
            0
        };
        values * self.dtype.size() + 8 * (self.rows.len() + 1) + validity
    }

    /// Row `row`'s values as bytes, their count, and its validity (1 or 0).
    fn row(&self, row: usize) -> Option<(&[u8], usize, u8)> {
        let &(at, a, z, valid) = self.rows.get(row)?;
        let size = self.dtype.size();
        // Checked here too, though `range` bounds z by the values' length.
        let bytes = self
            .values
            .get(at as usize)?
            .get(a.checked_mul(size)?..z.checked_mul(size)?)?;
        Some((bytes, z - a, u8::from(valid)))
    }

    /// The tokens of row `row` (lists of integers).
    fn tokens(&self, row: usize) -> Option<Tokens<'_>> {
        let &(at, a, z, _) = self.rows.get(row)?;
        let values = self.values.get(at as usize)?;
        Some(match self.dtype {
            DType::I32 => Tokens::I32(values.typed_data::<i32>().get(a..z)?),
            DType::U32 => Tokens::U32(values.typed_data::<u32>().get(a..z)?),
            DType::I64 => Tokens::I64(values.typed_data::<i64>().get(a..z)?),
            DType::U16 => Tokens::U16(values.typed_data::<u16>().get(a..z)?),
            DType::I16 => Tokens::I16(values.typed_data::<i16>().get(a..z)?),
            DType::U8 => Tokens::U8(values.typed_data::<u8>().get(a..z)?),
            _ => return None,
        })
    }
}

impl Collator {
    /// The batch of `rows` handed on uncollated ([`Handoff`]) when every
    /// source batch they come from allows it; `None`: collate it.
    pub(super) fn handoff(
        &mut self,
        index: u64,
        rows: &RowRefs,
        started: Instant,
    ) -> Result<Option<Batch>> {
        match self.config.failpoints.hit("handoff", index) {
            None => {}
            // The batch collated as when its rows cannot be handed on.
            Some(Action::Stop) => return Ok(None),
            Some(action) => return Err(injected(Stage::Collate, action, &self.cancel)),
        }
        let [plan] = &self.config.plans[..] else {
            return Ok(None);
        };
        for held in &mut self.windows {
            if held.handoff.is_none() {
                let values = held.sources.iter().map(|c| handoff_values(plan, c));
                held.handoff = Some(values.collect());
            }
        }
        let sources: Vec<Option<&HandoffValues>> = (self.windows.iter())
            .flat_map(|w| w.handoff.iter().flatten().map(Option::as_ref))
            .collect();
        let windows = self.windows.iter().map(|w| w.window.clone()).collect();
        let Some(handoff) = Handoff::of(windows, plan, &sources, rows) else {
            return Ok(None);
        };
        // A slab still, so that a consumer holds no more of these batches
        // than of collated ones (the budget reserves room for their windows).
        let waiting = Instant::now();
        let lease = self.pool.acquire(&self.cancel)?;
        let blocked = waiting.elapsed();
        Counters::add_time(&self.counters.collate_blocked_out_ns, blocked);
        let lease = lease.ok_or(LoaderError::Closed)?;
        Counters::add(&self.counters.handoff_batches, 1);
        Counters::add_time(
            &self.counters.collate_busy_ns,
            started.elapsed().saturating_sub(blocked),
        );
        self.counters
            .span("collate batch", started, crate::trace::Args::Index(index));
        Ok(Some(Batch {
            lease: Arc::new(lease),
            rows: handoff.rows(),
            columns: vec![handoff.column().clone()],
            index,
            held: None,
            filtered: 0,
            row_ids: None,
            handoff: Some(Box::new(handoff)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;
    use arrow_array::builder::{Int32Builder, ListBuilder};

    fn plan(nullable: bool) -> ColumnPlan {
        ColumnPlan {
            name: "ids".into(),
            source: 0,
            kind: Kind::List {
                dtype: DType::I32,
                large: false,
            },
            nullable,
        }
    }

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
    /// collator would have laid them out (a null row empty and invalid), in
    /// any order; sliced arrays included.
    #[test]
    fn rows_are_read_where_they_lie() {
        let p = plan(true);
        let a = column(&[Some(vec![Some(1), Some(2)]), None, Some(vec![Some(3)])]);
        let b = column(&[
            Some(vec![Some(5)]),
            Some(vec![]),
            Some(vec![Some(7), Some(8), Some(9)]),
        ]);
        let b = SourceColumn {
            data: arrow_array::make_array(b.data).slice(1, 2).into_data(),
            key_bound: None,
        };
        let sources = [handoff_values(&p, &[a]), handoff_values(&p, &[b])];
        let refs: Vec<Option<&HandoffValues>> = sources.iter().map(Option::as_ref).collect();
        let rows = [(1, 1), (0, 2), (0, 1), (1, 0), (0, 0)];
        let h = Handoff::of(Vec::new(), &p, &refs, &rows).unwrap();
        assert_eq!(h.rows(), 5);
        let got: Vec<Vec<i32>> = (0..5).map(|r| ids(h.tokens(r).unwrap())).collect();
        assert_eq!(got, [vec![7, 8, 9], vec![3], vec![], vec![], vec![1, 2]]);
        let valid: Vec<u8> = (0..5).map(|r| h.row(r).unwrap().2).collect();
        assert_eq!(valid, [1, 1, 0, 1, 1]);
        let (bytes, count, _) = h.row(4).unwrap();
        assert_eq!((bytes, count), (&[1, 0, 0, 0, 2, 0, 0, 0][..], 2));
        assert!(h.tokens(5).is_none() && h.row(5).is_none());
        assert_eq!(h.bytes(), 6 * 4 + 8 * 6 + 5);
        assert_eq!(h.column().name, "ids");
        assert!(h.column().validity.is_some());
    }

    /// Null items (the slab reads them as zeros), another value type than
    /// the plan's, another column count, or a row past the list: collated
    /// instead.
    #[test]
    fn what_a_slab_would_change_is_not_handed_on() {
        let p = plan(false);
        assert!(handoff_values(&p, &[column(&[Some(vec![Some(1), None])])]).is_none());
        let wide = ColumnPlan {
            kind: Kind::List {
                dtype: DType::I64,
                large: false,
            },
            ..plan(false)
        };
        let one = column(&[Some(vec![Some(1)])]);
        assert!(handoff_values(&wide, std::slice::from_ref(&one)).is_none());
        assert!(handoff_values(&p, &[one.clone(), one.clone()]).is_none());
        assert!(handoff_values(&p, &[]).is_none());
        let sources = [handoff_values(&p, &[one])];
        let refs: Vec<Option<&HandoffValues>> = sources.iter().map(Option::as_ref).collect();
        assert!(Handoff::of(Vec::new(), &p, &refs, &[(0, 1)]).is_none());
        assert!(Handoff::of(Vec::new(), &p, &refs, &[(1, 0)]).is_none());
        assert!(Handoff::of(Vec::new(), &p, &[None], &[(0, 0)]).is_none());
    }
}
