//! Rows copied once, from the sources' batches straight into the mixture's
//! slab. The rows of a mixture batch are drawn first (each source keeps the
//! batches they lie in: [`Source::keep`]), the columns' sizes summed over
//! them, one slab leased, and each row copied where it goes. Staging the rows
//! in buffers first ([`Staged`]) copied every byte twice; it remains for a
//! batch drawing more rows from a source than it may keep batches for.

use super::*;

/// Where a drawn row lies: its source, how many batches that source had
/// kept when it was drawn ([`Source::batch_at`]), and its row there.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowAt {
    pub(super) source: usize,
    pub(super) kept: usize,
    pub(super) row: usize,
}

/// How a column's rows are laid out (the first row's batch's layout, which
/// every other row's must match; staging keeps the same).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Kind {
    /// Rows of `inner` values.
    Dense { dtype: DType, inner: Vec<usize> },
    /// A span of values a row, and row offsets.
    Ragged { dtype: DType },
    /// Rows of `to` values, and lengths.
    Padded { dtype: DType, to: usize },
    /// A span of bytes a row, and row offsets.
    Bytes { utf8: bool },
    /// A span of items a row (row offsets), each a span of values (item
    /// offsets; bytes for binary and strings).
    ListBytes { utf8: bool, dtype: DType },
}

impl Kind {
    pub(super) fn of(layout: &ColumnLayout) -> Self {
        match layout {
            ColumnLayout::Dense { values } => Kind::Dense {
                dtype: values.dtype,
                inner: values.shape[1..].to_vec(),
            },
            ColumnLayout::Ragged { values, .. } => Kind::Ragged {
                dtype: values.dtype,
            },
            ColumnLayout::Padded { values, .. } => Kind::Padded {
                dtype: values.dtype,
                to: values.shape.get(1).copied().unwrap_or(0),
            },
            ColumnLayout::Bytes { utf8, .. } => Kind::Bytes { utf8: *utf8 },
            ColumnLayout::ListBytes { utf8, values, .. } => Kind::ListBytes {
                utf8: *utf8,
                dtype: values.dtype,
            },
        }
    }

    /// The values' element type.
    fn dtype(&self) -> DType {
        match self {
            Kind::Dense { dtype, .. }
            | Kind::Ragged { dtype }
            | Kind::Padded { dtype, .. }
            | Kind::ListBytes { dtype, .. } => *dtype,
            Kind::Bytes { .. } => DType::U8,
        }
    }

    /// Whether a batch's layout is this kind (utf8 aside, as staging has it).
    fn matches(&self, layout: &ColumnLayout) -> bool {
        match (self, Kind::of(layout)) {
            (Kind::Bytes { .. }, Kind::Bytes { .. }) => true,
            (Kind::ListBytes { dtype, .. }, Kind::ListBytes { dtype: d, .. }) => *dtype == d,
            (a, b) => *a == b,
        }
    }
}

/// One row of a column as its batch holds it.
struct Row<'a> {
    /// Its values' bytes.
    bytes: &'a [u8],
    /// Ragged and bytes: its elements; padded: its length; lists of bytes:
    /// its items.
    count: i64,
    /// Lists of bytes: its items' offsets into the batch's values (`count +
    /// 1` of them).
    items: &'a [i64],
}

/// Row `row` of column `c` of `batch`, when it is laid out as `kind`.
fn row_of<'a>(batch: &'a Batch, c: usize, kind: &Kind, row: usize) -> Option<Row<'a>> {
    let column = batch.columns().get(c)?;
    if !kind.matches(&column.layout) {
        return None;
    }
    let size = kind.dtype().size();
    let span = |offsets: &Buffer| {
        let offsets = batch.typed::<i64>(offsets)?;
        Some((offsets[row] as usize, offsets[row + 1] as usize))
    };
    Some(match &column.layout {
        ColumnLayout::Dense { values } => {
            let width = values.shape[1..].iter().product::<usize>() * size;
            Row {
                bytes: &batch.bytes(values)[row * width..(row + 1) * width],
                count: 1,
                items: &[],
            }
        }
        ColumnLayout::Padded { values, lengths } => {
            let width = values.shape.get(1).copied().unwrap_or(0) * size;
            Row {
                bytes: &batch.bytes(values)[row * width..(row + 1) * width],
                count: batch.typed::<i64>(lengths)?[row],
                items: &[],
            }
        }
        ColumnLayout::Ragged { values, offsets } => {
            let (bytes, count) = batch.ragged_row(values, offsets, row)?;
            Row {
                bytes,
                count: count as i64,
                items: &[],
            }
        }
        ColumnLayout::Bytes {
            values, offsets, ..
        } => {
            let (a, z) = span(offsets)?;
            Row {
                bytes: &batch.bytes(values)[a * size..z * size],
                count: (z - a) as i64,
                items: &[],
            }
        }
        ColumnLayout::ListBytes {
            values,
            offsets,
            value_offsets,
            ..
        } => {
            let (a, z) = span(offsets)?;
            let items = &batch.typed::<i64>(value_offsets)?[a..=z];
            let (from, to) = (items[0] as usize * size, items[z - a] as usize * size);
            Row {
                bytes: &batch.bytes(values)[from..to],
                count: (z - a) as i64,
                items,
            }
        }
    })
}

/// One column of the batch being laid out: its kind, and where its buffers
/// go.
struct Plan {
    kind: Kind,
    /// Bytes of values over the rows, and where they go.
    bytes: usize,
    values_at: usize,
    /// Where the `rows + 1` row offsets (or the `rows` lengths) go.
    offsets_at: usize,
    /// Lists of bytes: the items over the rows, and where their offsets go.
    items: usize,
    items_at: usize,
    /// Where the validity goes, when a row's batch has one.
    validity_at: Option<usize>,
}

impl Core {
    /// The sources that may keep batches ([`Source::keep_limit`]): all of
    /// them, or rows are staged.
    pub(super) fn may_keep(&self) -> bool {
        self.streams.sources.iter().all(|s| s.keep_limit() > 0)
    }

    /// Rows `at` (and their `sources`) laid out in one slab, each copied
    /// once from the batch it lies in.
    pub(super) fn lay_out_direct(
        &self,
        at: &[RowAt],
        sources: &[i32],
    ) -> Result<(SlabLease, Vec<Column>)> {
        let streams = &self.streams;
        let batch_of = |r: &RowAt| streams.sources[r.source].batch_at(r.kept);
        let first = batch_of(at.first().expect("a batch has rows"));
        let rows = at.len();
        let mut end = 0usize;
        let mut place = |bytes: usize| {
            let offset = end;
            end = (end + bytes).next_multiple_of(64);
            offset
        };
        let mut plans = Vec::new();
        for (c, col) in first.columns().iter().enumerate() {
            let kind = Kind::of(&col.layout);
            let (mut bytes, mut items, mut valid) = (0usize, 0usize, false);
            for r in at {
                let batch = batch_of(r);
                let row = row_of(batch, c, &kind, r.row).ok_or_else(|| {
                    source_error(
                        r.source,
                        &streams.sources[r.source].url,
                        staged::mismatch(&col.name),
                    )
                })?;
                bytes += row.bytes.len();
                if let Kind::ListBytes { .. } = kind {
                    items += row.count as usize;
                }
                valid |= batch.columns()[c].validity.is_some();
            }
            let values_at = place(bytes);
            let offsets_at = match kind {
                Kind::Dense { .. } => 0,
                Kind::Padded { .. } => place(rows * 8),
                _ => place((rows + 1) * 8),
            };
            let items_at = match kind {
                Kind::ListBytes { .. } => place((items + 1) * 8),
                _ => 0,
            };
            let validity_at = valid.then(|| place(rows));
            plans.push(Plan {
                kind,
                bytes,
                values_at,
                offsets_at,
                items,
                items_at,
                validity_at,
            });
        }
        let source_at = place(rows * 4);
        let mut lease = self.lease(end.max(64))?;
        let slab = lease.slab_mut().as_mut_slice();
        let put = |slab: &mut [u8], at: usize, value: i64| {
            slab[at..at + 8].copy_from_slice(&value.to_ne_bytes());
        };
        let mut columns = Vec::with_capacity(plans.len() + 1);
        for (c, plan) in plans.iter().enumerate() {
            let (mut v, mut count, mut item) = (plan.values_at, 0i64, 0usize);
            let ragged = !matches!(plan.kind, Kind::Dense { .. } | Kind::Padded { .. });
            if ragged {
                put(slab, plan.offsets_at, 0);
            }
            if let Kind::ListBytes { .. } = plan.kind {
                put(slab, plan.items_at, 0);
            }
            for (i, r) in at.iter().enumerate() {
                let batch = batch_of(r);
                let row = row_of(batch, c, &plan.kind, r.row).expect("checked when sized");
                slab[v..v + row.bytes.len()].copy_from_slice(row.bytes);
                if let Some((&base, ends)) = row.items.split_first() {
                    // Item offsets moved to where the row's values went.
                    let size = plan.kind.dtype().size();
                    let moved = ((v - plan.values_at) / size) as i64 - base;
                    for &o in ends {
                        item += 1;
                        put(slab, plan.items_at + item * 8, o + moved);
                    }
                }
                v += row.bytes.len();
                match plan.kind {
                    Kind::Dense { .. } => {}
                    Kind::Padded { .. } => put(slab, plan.offsets_at + i * 8, row.count),
                    _ => {
                        count += row.count;
                        put(slab, plan.offsets_at + (i + 1) * 8, count);
                    }
                }
                if let Some(at) = plan.validity_at {
                    slab[at + i] = batch.valid_byte(&batch.columns()[c], r.row);
                }
            }
            let buffer = |dtype: DType, shape: Vec<usize>, offset: usize| Buffer {
                dtype,
                shape,
                offset,
            };
            let offsets = buffer(DType::I64, vec![rows + 1], plan.offsets_at);
            let layout = match &plan.kind {
                Kind::Dense { dtype, inner } => {
                    let mut shape = vec![rows];
                    shape.extend_from_slice(inner);
                    ColumnLayout::Dense {
                        values: buffer(*dtype, shape, plan.values_at),
                    }
                }
                Kind::Padded { dtype, to } => ColumnLayout::Padded {
                    values: buffer(*dtype, vec![rows, *to], plan.values_at),
                    lengths: buffer(DType::I64, vec![rows], plan.offsets_at),
                },
                Kind::Ragged { dtype } => ColumnLayout::Ragged {
                    values: buffer(*dtype, vec![plan.bytes / dtype.size()], plan.values_at),
                    offsets,
                },
                Kind::Bytes { utf8 } => ColumnLayout::Bytes {
                    values: buffer(DType::U8, vec![plan.bytes], plan.values_at),
                    offsets,
                    utf8: *utf8,
                },
                Kind::ListBytes { utf8, dtype } => ColumnLayout::ListBytes {
                    values: buffer(*dtype, vec![plan.bytes / dtype.size()], plan.values_at),
                    offsets,
                    value_offsets: buffer(DType::I64, vec![plan.items + 1], plan.items_at),
                    utf8: *utf8,
                },
            };
            columns.push(Column {
                name: first.columns()[c].name.clone(),
                layout,
                validity: plan
                    .validity_at
                    .map(|offset| buffer(DType::U8, vec![rows], offset)),
            });
        }
        slab[source_at..source_at + rows * 4].copy_from_slice(as_bytes(sources));
        columns.push(source_column(rows, source_at));
        Ok((lease, columns))
    }
}
