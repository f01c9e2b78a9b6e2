//! Rows copied once, from the sources' batches straight into the mixture's
//! slab. The rows of a mixture batch are drawn first (each source keeps the
//! batches they lie in: [`Source::keep`]), the columns' sizes summed over
//! them, one slab leased, and each row copied where it goes. Staging the rows
//! in buffers first ([`Staged`]) copied every byte twice; it remains for the
//! layouts copied here row by row less simply (padded lists, lists of
//! strings) and for a batch drawing more rows from a source than it may keep
//! batches for.

use super::*;

/// Where a drawn row lies: its source, how many batches that source had
/// kept when it was drawn ([`Source::batch_at`]), and its row there.
#[derive(Clone, Copy, Debug)]
pub(super) struct RowAt {
    pub(super) source: usize,
    pub(super) kept: usize,
    pub(super) row: usize,
}

/// How a column's rows are copied.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `width` bytes a row.
    Fixed { width: usize },
    /// A span of values (of `size` bytes) a row, and offsets.
    Ragged { size: usize },
    /// A span of bytes a row, and offsets.
    Bytes { utf8: bool },
}

/// One column of the batch being laid out.
struct Plan {
    kind: Kind,
    dtype: DType,
    /// Dense columns: the shape of a row.
    inner: Vec<usize>,
    /// Bytes of values over the rows, and where they go.
    bytes: usize,
    values_at: usize,
    /// Ragged and bytes: where the `rows + 1` offsets go.
    offsets_at: usize,
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
    /// once from the batch it lies in; `None` when a column is collated in
    /// a layout this does not copy (then they are staged).
    pub(super) fn lay_out_direct(
        &self,
        at: &[RowAt],
        sources: &[i32],
    ) -> Result<Option<(SlabLease, Vec<Column>)>> {
        let streams = &self.streams;
        let batch_of = |r: &RowAt| streams.sources[r.source].batch_at(r.kept);
        let Some(first) = at.first() else {
            return Ok(None);
        };
        let rows = at.len();
        let mut end = 0usize;
        let mut place = |bytes: usize| {
            let offset = end;
            end = (end + bytes).next_multiple_of(64);
            offset
        };
        let mut plans = Vec::new();
        for (c, col) in batch_of(first).columns().iter().enumerate() {
            let (kind, dtype, inner) = match &col.layout {
                ColumnLayout::Dense { values } => {
                    let inner = values.shape[1..].to_vec();
                    let width = inner.iter().product::<usize>() * values.dtype.size();
                    (Kind::Fixed { width }, values.dtype, inner)
                }
                ColumnLayout::Ragged { values, .. } => (
                    Kind::Ragged {
                        size: values.dtype.size(),
                    },
                    values.dtype,
                    Vec::new(),
                ),
                ColumnLayout::Bytes { utf8, .. } => {
                    (Kind::Bytes { utf8: *utf8 }, DType::U8, Vec::new())
                }
                ColumnLayout::Padded { .. } | ColumnLayout::ListBytes { .. } => return Ok(None),
            };
            let mut bytes = 0usize;
            let mut valid = false;
            for r in at {
                let batch = batch_of(r);
                let (row, _) =
                    row_bytes(batch, c, kind, dtype, &inner, r.row).ok_or_else(|| {
                        source_error(
                            r.source,
                            &streams.sources[r.source].url,
                            staged::mismatch(&col.name),
                        )
                    })?;
                bytes += row.len();
                valid |= batch.columns()[c].validity.is_some();
            }
            let values_at = place(bytes);
            let offsets_at = match kind {
                Kind::Fixed { .. } => 0,
                _ => place((rows + 1) * 8),
            };
            let validity_at = valid.then(|| place(rows));
            plans.push(Plan {
                kind,
                dtype,
                inner,
                bytes,
                values_at,
                offsets_at,
                validity_at,
            });
        }
        let source_at = place(rows * 4);
        let mut lease = self.lease(end.max(64))?;
        let slab = lease.slab_mut().as_mut_slice();
        let mut columns = Vec::with_capacity(plans.len() + 1);
        for (c, plan) in plans.iter().enumerate() {
            let mut v = plan.values_at;
            let mut elements = 0i64;
            if !matches!(plan.kind, Kind::Fixed { .. }) {
                slab[plan.offsets_at..plan.offsets_at + 8].copy_from_slice(&0i64.to_ne_bytes());
            }
            for (i, r) in at.iter().enumerate() {
                let batch = batch_of(r);
                let (row, n) = row_bytes(batch, c, plan.kind, plan.dtype, &plan.inner, r.row)
                    .expect("checked when sized");
                slab[v..v + row.len()].copy_from_slice(row);
                v += row.len();
                if !matches!(plan.kind, Kind::Fixed { .. }) {
                    elements += n as i64;
                    let o = plan.offsets_at + (i + 1) * 8;
                    slab[o..o + 8].copy_from_slice(&elements.to_ne_bytes());
                }
                if let Some(at) = plan.validity_at {
                    let column = &batch.columns()[c];
                    slab[at + i] = column
                        .validity
                        .as_ref()
                        .map_or(1, |b| batch.typed::<u8>(b).expect("u8")[r.row]);
                }
            }
            let name = batch_of(first).columns()[c].name.clone();
            let values = |shape| Buffer {
                dtype: plan.dtype,
                shape,
                offset: plan.values_at,
            };
            let offsets = Buffer {
                dtype: DType::I64,
                shape: vec![rows + 1],
                offset: plan.offsets_at,
            };
            let layout = match plan.kind {
                Kind::Fixed { .. } => {
                    let mut shape = vec![rows];
                    shape.extend_from_slice(&plan.inner);
                    ColumnLayout::Dense {
                        values: values(shape),
                    }
                }
                Kind::Ragged { size } => ColumnLayout::Ragged {
                    values: values(vec![plan.bytes / size]),
                    offsets,
                },
                Kind::Bytes { utf8 } => ColumnLayout::Bytes {
                    values: values(vec![plan.bytes]),
                    offsets,
                    utf8,
                },
            };
            columns.push(Column {
                name,
                layout,
                validity: plan.validity_at.map(|offset| Buffer {
                    dtype: DType::U8,
                    shape: vec![rows],
                    offset,
                }),
            });
        }
        slab[source_at..source_at + rows * 4].copy_from_slice(as_bytes(sources));
        columns.push(source_column(rows, source_at));
        Ok(Some((lease, columns)))
    }
}

/// Row `row` of column `c` of `batch` as bytes, and its elements (values,
/// or bytes); `None` when the column is not laid out as `kind` of `dtype`.
fn row_bytes<'a>(
    batch: &'a Batch,
    c: usize,
    kind: Kind,
    dtype: DType,
    inner: &[usize],
    row: usize,
) -> Option<(&'a [u8], usize)> {
    let span = |values: &Buffer, offsets: &Buffer, size: usize| {
        let offsets = batch.typed::<i64>(offsets)?;
        let (a, z) = (offsets[row] as usize, offsets[row + 1] as usize);
        Some((&batch.bytes(values)[a * size..z * size], z - a))
    };
    match (kind, &batch.columns().get(c)?.layout) {
        (Kind::Fixed { width }, ColumnLayout::Dense { values })
            if values.dtype == dtype && values.shape[1..] == *inner =>
        {
            Some((&batch.bytes(values)[row * width..(row + 1) * width], 1))
        }
        (Kind::Ragged { size }, ColumnLayout::Ragged { values, offsets })
            if values.dtype == dtype =>
        {
            span(values, offsets, size)
        }
        (
            Kind::Bytes { .. },
            ColumnLayout::Bytes {
                values, offsets, ..
            },
        ) => span(values, offsets, 1),
        _ => None,
    }
}
