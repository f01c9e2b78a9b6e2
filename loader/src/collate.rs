//! Collation: gather the rows of a batch, in order, straight into a slab.
//!
//! Fixed-width columns become contiguous `[batch]` or `[batch, n]` buffers;
//! variable-length lists become values + offsets, or are padded to a length
//! with the lengths alongside; binary and string columns become bytes +
//! offsets. Nullable columns get a `u8` validity mask (null rows hold zeros,
//! or empty lists and strings).

use crate::error::Stage;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use arrow_buffer::ArrowNativeType;
use arrow_buffer::NullBuffer;
use arrow_data::ArrayData;
use arrow_schema::DataType;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use shardfeed_format::failpoint::Action;

use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType};
use crate::columns::{ALIGN, ColumnPlan, Kind, ListMode};
use crate::config::Config;
use crate::image::{self, ImageOptions, RowId};
use crate::pinned::Pool;
use crate::plan::EpochPlan;
use crate::shuffle::{KeyBound, LoadedWindow};
use crate::stage::injected;
use crate::stats::Counters;
use crate::{LoaderError, Result};
use shardfeed_format::Manifest;

/// Where the rows of a batch come from: `(source batch, row)` per output row.
pub(crate) type RowRefs = [(u32, u32)];

struct Layout {
    buffers: Vec<Buffer>,
    total: usize,
}

impl Layout {
    fn push(&mut self, dtype: DType, shape: Vec<usize>) -> Buffer {
        let offset = self.total.next_multiple_of(ALIGN);
        let buffer = Buffer {
            dtype,
            shape,
            offset,
        };
        self.total = offset + buffer.bytes();
        self.buffers.push(buffer.clone());
        buffer
    }
}

/// A source column's data, for one source batch.
#[derive(Clone, Debug)]
pub(crate) struct SourceColumn {
    data: ArrayData,
    /// For a dictionary column: a bound on its keys already established
    /// (see [`crate::shuffle::permute`]), so batches need not find their
    /// largest key again.
    key_bound: Option<KeyBound>,
}

/// The projected columns of `batch` (in plan order) as the collator reads
/// them; `key_bounds` (indexed by the batch's columns, or empty): bounds on
/// dictionary keys that the shuffle stage established.
pub(crate) fn source_columns(
    plans: &[ColumnPlan],
    batch: &RecordBatch,
    key_bounds: &[Option<KeyBound>],
) -> Vec<SourceColumn> {
    plans
        .iter()
        .map(|p| SourceColumn {
            data: batch.column(p.source).to_data(),
            key_bound: key_bounds.get(p.source).copied().flatten(),
        })
        .collect()
}

impl SourceColumn {
    fn nulls(&self) -> Option<&NullBuffer> {
        self.data.nulls()
    }

    /// Bytes of a fixed-width buffer from the array's offset on.
    fn fixed(data: &ArrayData, width: usize) -> &[u8] {
        &data.buffers()[0].as_slice()[data.offset() * width..]
    }

    fn offsets(&self, large: bool, row: usize) -> (usize, usize) {
        let i = self.data.offset() + row;
        let raw = self.data.buffers()[0].as_slice();
        if large {
            let at = |k: usize| {
                i64::from_le_bytes(raw[k * 8..k * 8 + 8].try_into().expect("8 bytes")) as usize
            };
            (at(i), at(i + 1))
        } else {
            let at = |k: usize| {
                i32::from_le_bytes(raw[k * 4..k * 4 + 4].try_into().expect("4 bytes")) as usize
            };
            (at(i), at(i + 1))
        }
    }
}

fn row_valid(col: &SourceColumn, row: usize) -> bool {
    col.nulls().is_none_or(|n| n.is_valid(row))
}

impl SourceColumn {
    /// The bytes of row `row` of a binary or string column (offsets or
    /// views); empty for a null row.
    fn value_bytes(&self, large: bool, row: usize) -> &[u8] {
        if !row_valid(self, row) {
            return &[];
        }
        match self.data.data_type() {
            DataType::BinaryView | DataType::Utf8View => {
                let at = (self.data.offset() + row) * 16;
                let raw = &self.data.buffers()[0].as_slice()[at..at + 16];
                let view = u128::from_le_bytes(raw.try_into().expect("16 bytes"));
                let len = view as u32 as usize;
                if len <= 12 {
                    &raw[4..4 + len]
                } else {
                    let view = arrow_data::ByteView::from(view);
                    let data = self.data.buffers()[1 + view.buffer_index as usize].as_slice();
                    &data[view.offset as usize..view.offset as usize + len]
                }
            }
            _ => {
                let (a, b) = self.offsets(large, row);
                &self.data.buffers()[1].as_slice()[a..b]
            }
        }
    }

    /// The element range of a variable-length row; empty for a null row.
    fn span(&self, large: bool, row: usize) -> (usize, usize) {
        if row_valid(self, row) {
            self.offsets(large, row)
        } else {
            (0, 0)
        }
    }
}

/// Sizes of every buffer, computed before writing so the batch fits one slab.
pub(crate) struct Collation<'a> {
    plans: &'a [ColumnPlan],
    list_mode: ListMode,
    images: Option<&'a ImageOptions>,
    sources: Vec<std::borrow::Cow<'a, [SourceColumn]>>,
    /// Threads (this one included) fixed-width columns may be shared out
    /// among (see [`Collation::write`]).
    workers: usize,
}

impl<'a> Collation<'a> {
    /// Prepare to gather from `batches` (each holding the projected columns in plan order).
    #[cfg(test)]
    pub(crate) fn new(
        plans: &'a [ColumnPlan],
        list_mode: ListMode,
        images: Option<&'a ImageOptions>,
        batches: &[&RecordBatch],
    ) -> Self {
        let sources = batches
            .iter()
            .map(|b| std::borrow::Cow::Owned(source_columns(plans, b, &[])))
            .collect();
        Collation {
            plans,
            list_mode,
            images,
            sources,
            workers: 1,
        }
    }

    /// Prepare to gather from source batches already made [`source_columns`]
    /// (the collator keeps them per window: making them per batch was a
    /// tenth of its time with small batches).
    pub(crate) fn from_sources(
        plans: &'a [ColumnPlan],
        list_mode: ListMode,
        images: Option<&'a ImageOptions>,
        sources: impl IntoIterator<Item = &'a [SourceColumn]>,
    ) -> Self {
        Collation {
            plans,
            list_mode,
            images,
            sources: sources
                .into_iter()
                .map(std::borrow::Cow::Borrowed)
                .collect(),
            workers: 1,
        }
    }

    /// Share fixed-width columns out among up to `workers` threads.
    pub(crate) fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Elements (or bytes) of variable-length column `c` over `rows`.
    fn total_elements(&self, c: usize, large: bool, rows: &RowRefs) -> usize {
        rows.iter()
            .map(|(s, r)| {
                let (a, b) = self.sources[*s as usize][c].span(large, *r as usize);
                b - a
            })
            .sum()
    }

    /// Lay out the batch of `rows`; returns the columns and the bytes needed.
    pub(crate) fn layout(&self, rows: &RowRefs) -> (Vec<Column>, usize) {
        let n = rows.len();
        let mut layout = Layout {
            buffers: Vec::new(),
            total: 0,
        };
        let mut columns = Vec::with_capacity(self.plans.len());
        for (c, plan) in self.plans.iter().enumerate() {
            let column_layout = match plan.kind {
                Kind::Primitive(d) => ColumnLayout::Dense {
                    values: layout.push(d, vec![n]),
                },
                Kind::Bool => ColumnLayout::Dense {
                    values: layout.push(DType::Bool, vec![n]),
                },
                Kind::FixedList(d, k) => ColumnLayout::Dense {
                    values: layout.push(d, vec![n, k]),
                },
                Kind::List { dtype, large } => match self.list_mode {
                    ListMode::Ragged => {
                        let total = self.total_elements(c, large, rows);
                        ColumnLayout::Ragged {
                            values: layout.push(dtype, vec![total]),
                            offsets: layout.push(DType::I64, vec![n + 1]),
                        }
                    }
                    ListMode::Padded { to, .. } => ColumnLayout::Padded {
                        values: layout.push(dtype, vec![n, to]),
                        lengths: layout.push(DType::I64, vec![n]),
                    },
                },
                Kind::Image { .. } => {
                    let i = self.images.expect("image columns have image options");
                    let (h, w) = (i.height as usize, i.width as usize);
                    let shape = if i.channels_first {
                        vec![n, 3, h, w]
                    } else {
                        vec![n, h, w, 3]
                    };
                    ColumnLayout::Dense {
                        values: layout.push(DType::U8, shape),
                    }
                }
                Kind::Bytes { large, utf8 } => {
                    let total = rows
                        .iter()
                        .map(|(s, r)| {
                            self.sources[*s as usize][c]
                                .value_bytes(large, *r as usize)
                                .len()
                        })
                        .sum();
                    ColumnLayout::Bytes {
                        values: layout.push(DType::U8, vec![total]),
                        offsets: layout.push(DType::I64, vec![n + 1]),
                        utf8,
                    }
                }
            };
            let validity = plan.nullable.then(|| layout.push(DType::U8, vec![n]));
            columns.push(Column {
                name: plan.name.clone(),
                layout: column_layout,
                validity,
            });
        }
        (columns, layout.total)
    }

    /// Decode the image columns' rows into their buffers of `slab` (laid out
    /// by [`Collation::layout`]), on one thread per `scratch` (this one
    /// included). Null rows are left alone. Returns the rows whose image did
    /// not decode: (row index, column index, why), in row order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn images(
        &self,
        rows: &RowRefs,
        ids: &[RowId],
        columns: &[Column],
        slab: &mut [u8],
        seed: u64,
        epoch: u64,
        scratch: &mut [image::Scratch],
        cancel: &AtomicBool,
    ) -> Vec<(usize, usize, String)> {
        let Some(options) = self.images else {
            return Vec::new();
        };
        let per_image = options.image_bytes();
        // The image columns' buffers, split off the slab in offset order.
        let mut buffers: Vec<(usize, usize, bool, usize)> = Vec::new();
        for (c, (plan, column)) in self.plans.iter().zip(columns).enumerate() {
            if let (Kind::Image { large }, ColumnLayout::Dense { values }) =
                (plan.kind, &column.layout)
            {
                buffers.push((values.offset, values.bytes(), large, c));
            }
        }
        buffers.sort_unstable();
        let mut jobs = Vec::with_capacity(rows.len() * buffers.len());
        let mut rest = slab;
        let mut consumed = 0;
        for (offset, len, large, c) in buffers {
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(offset - consumed);
            let (buffer, tail) = tail.split_at_mut(len);
            rest = tail;
            consumed = offset + len;
            for (i, slot) in buffer.chunks_exact_mut(per_image).enumerate() {
                let (s, r) = rows[i];
                let source = &self.sources[s as usize][c];
                if row_valid(source, r as usize) {
                    jobs.push((i, c, source.value_bytes(large, r as usize), slot));
                }
            }
        }
        let queue = std::sync::Mutex::new(jobs.into_iter());
        let failures = std::sync::Mutex::new(Vec::new());
        let work = |scratch: &mut image::Scratch| {
            // A cancelled pass stops between images (the caller sees the
            // flag and drops the batch).
            while !cancel.load(Ordering::Relaxed) {
                let job = queue.lock().expect("image queue").next();
                let Some((i, c, bytes, slot)) = job else {
                    return;
                };
                // The decoders read untrusted bytes: a panic in one is that
                // image's error (named, or skipped), with fresh buffers after it.
                let decoded = shardfeed_format::panic::catch(|| {
                    let key = image::CropKey {
                        seed,
                        epoch,
                        id: ids[i],
                        column: c,
                    };
                    image::decode_into(options, key, bytes, scratch, slot)
                })
                .unwrap_or_else(|message| {
                    *scratch = image::Scratch::default();
                    Err(format!("the decoder panicked: {message}"))
                });
                if let Err(e) = decoded {
                    failures.lock().expect("image failures").push((i, c, e));
                }
            }
        };
        let work = &work;
        let (mine, others) = scratch
            .split_first_mut()
            .expect("at least one image scratch");
        std::thread::scope(|s| {
            for scratch in others {
                std::thread::Builder::new()
                    .name("shardfeed-image".into())
                    .spawn_scoped(s, move || work(scratch))
                    .expect("spawn an image thread");
            }
            work(mine);
        });
        let mut failures = failures.into_inner().expect("image failures");
        failures.sort_unstable_by_key(|f| (f.0, f.1));
        failures
    }

    /// Write `rows` into `slab` following `columns` (from [`Collation::layout`]).
    /// Returns the number of list rows truncated by padding.
    pub(crate) fn write(
        &self,
        rows: &RowRefs,
        columns: &[Column],
        slab: &mut [u8],
    ) -> std::result::Result<u64, String> {
        let mut truncated = 0;
        // Visit rows in source order (each output row still lands at its own
        // place): shuffled gathers then walk each source array forwards instead
        // of jumping around a window's worth of memory.
        let mut order: Vec<u32> = (0..rows.len() as u32).collect();
        let runs = runs_of(rows);
        if runs.is_none() {
            order.sort_unstable_by_key(|&i| rows[i as usize]);
        }
        let order = &order[..];
        let runs = runs.as_deref();
        let fixed: Vec<bool> = self
            .plans
            .iter()
            .zip(columns)
            .map(|(plan, column)| {
                plan.is_fixed_width() && matches!(column.layout, ColumnLayout::Dense { .. })
            })
            .collect();
        // Fixed-width columns are independent slab regions: with many values
        // to write, they are shared out among threads (the collate stage is
        // one thread, and would otherwise cap a loader given many cores).
        const MIN_SHARE: usize = 1 << 16;
        let fixed_count = fixed.iter().filter(|&&f| f).count();
        let workers = self
            .workers
            .min((rows.len() * fixed_count / MIN_SHARE).max(1));
        let regions = fixed_regions(slab, columns, &fixed)?;
        crate::share::share_out(
            regions,
            workers,
            "shardfeed-collate",
            &|r| self.write_fixed(r, rows, runs, order),
            // A helper's streamed stores, before the join.
            &fence_streamed,
        )
        .into_iter()
        .collect::<std::result::Result<(), String>>()?;
        for (c, (plan, column)) in self.plans.iter().zip(columns).enumerate() {
            if fixed[c] {
                continue;
            }
            let cols: Vec<&SourceColumn> = self.sources.iter().map(|s| &s[c]).collect();
            if let Some(validity) = &column.validity {
                let out = &mut slab[validity.offset..validity.offset + rows.len()];
                for (o, (s, r)) in out.iter_mut().zip(rows) {
                    *o = row_valid(cols[*s as usize], *r as usize) as u8;
                }
            }
            match (&plan.kind, &column.layout) {
                (Kind::List { dtype, large }, layout) => {
                    let w = dtype.size();
                    let children: Vec<ArrayData> = cols
                        .iter()
                        .map(|col| col.data.child_data()[0].clone())
                        .collect();
                    let span = |s: u32, r: u32| {
                        let col = cols[s as usize];
                        if row_valid(col, r as usize) {
                            col.offsets(*large, r as usize)
                        } else {
                            (0, 0)
                        }
                    };
                    match layout {
                        ColumnLayout::Ragged { values, offsets } => {
                            let mut offs = Vec::with_capacity(rows.len() + 1);
                            offs.push(0i64);
                            for (s, r) in rows {
                                let (a, b) = span(*s, *r);
                                offs.push(offs.last().expect("non-empty") + (b - a) as i64);
                            }
                            for &i in order {
                                let (s, r) = rows[i as usize];
                                let (a, b) = span(s, r);
                                let src = SourceColumn::fixed(&children[s as usize], w);
                                let dst = values.offset + offs[i as usize] as usize * w;
                                stream_copy(&mut slab[dst..dst + (b - a) * w], &src[a * w..b * w]);
                            }
                            write_i64(slab, offsets, &offs);
                        }
                        ColumnLayout::Padded { values, lengths } => {
                            let ListMode::Padded { to, value } = self.list_mode else {
                                unreachable!("padded layout only in padded mode")
                            };
                            let pad = pad_bytes(*dtype, value);
                            let mut lens = Vec::with_capacity(rows.len());
                            for (i, (s, r)) in rows.iter().enumerate() {
                                let (a, b) = span(*s, *r);
                                let len = (b - a).min(to);
                                if b - a > to {
                                    truncated += 1;
                                }
                                let src = SourceColumn::fixed(&children[*s as usize], w);
                                let row_start = values.offset + i * to * w;
                                slab[row_start..row_start + len * w]
                                    .copy_from_slice(&src[a * w..(a + len) * w]);
                                for p in slab[row_start + len * w..row_start + to * w]
                                    .chunks_exact_mut(w)
                                {
                                    p.copy_from_slice(&pad[..w]);
                                }
                                lens.push(len as i64);
                            }
                            write_i64(slab, lengths, &lens);
                        }
                        _ => unreachable!("list layouts are ragged or padded"),
                    }
                }
                (
                    Kind::Bytes { large, .. },
                    ColumnLayout::Bytes {
                        values, offsets, ..
                    },
                ) => {
                    let mut at = 0usize;
                    let mut offs = Vec::with_capacity(rows.len() + 1);
                    offs.push(0i64);
                    for (s, r) in rows {
                        let value = cols[*s as usize].value_bytes(*large, *r as usize);
                        let dst = values.offset + at;
                        stream_copy(&mut slab[dst..dst + value.len()], value);
                        at += value.len();
                        offs.push(at as i64);
                    }
                    write_i64(slab, offsets, &offs);
                }
                // Filled by the collator's image stage (see `Collation::images`).
                (Kind::Image { .. }, _) => {}
                _ => unreachable!("layout follows the plan"),
            }
            // Null rows of dense columns (decoded images) hold zeros, not
            // whatever the slot held (fixed-width columns: `write_fixed`).
            if let (Some(validity), ColumnLayout::Dense { values }) =
                (&column.validity, &column.layout)
            {
                let row_bytes = values.bytes() / rows.len().max(1);
                for i in 0..rows.len() {
                    if slab[validity.offset + i] == 0 {
                        let at = values.offset + i * row_bytes;
                        slab[at..at + row_bytes].fill(0);
                    }
                }
            }
        }
        fence_streamed();
        Ok(truncated)
    }

    /// Write fixed-width column `r.column` into its regions of the slab.
    fn write_fixed(
        &self,
        mut r: FixedRegions<'_>,
        rows: &RowRefs,
        runs: Option<&[Run]>,
        order: &[u32],
    ) -> std::result::Result<(), String> {
        let c = r.column;
        let cols: Vec<&SourceColumn> = self.sources.iter().map(|s| &s[c]).collect();
        let values = r.values;
        if let Some(out) = r.validity.as_deref_mut() {
            for (o, (s, row)) in out.iter_mut().zip(rows) {
                *o = row_valid(cols[*s as usize], *row as usize) as u8;
            }
        }
        match self.plans[c].kind {
            Kind::Primitive(d) => {
                gather_fixed(d.size(), &cols, rows, runs, order, values)?;
            }
            Kind::Bool => {
                for (o, (s, row)) in values.iter_mut().zip(rows) {
                    let data = &cols[*s as usize].data;
                    let bits = data.buffers()[0].as_slice();
                    let i = data.offset() + *row as usize;
                    *o = (bits[i / 8] >> (i % 8)) & 1;
                }
            }
            Kind::FixedList(d, k) => {
                let children: Vec<SourceColumn> = cols
                    .iter()
                    .map(|col| SourceColumn {
                        data: col.data.child_data()[0].clone(),
                        key_bound: None,
                    })
                    .collect();
                let width = d.size() * k;
                for &i in order {
                    let (s, row) = rows[i as usize];
                    let parent = &cols[s as usize].data;
                    let child = &children[s as usize].data;
                    let at_row = parent.offset() + row as usize;
                    let src = SourceColumn::fixed(child, d.size());
                    let at = i as usize * width;
                    values[at..at + width]
                        .copy_from_slice(&src[at_row * width..at_row * width + width]);
                }
            }
            _ => unreachable!("only fixed-width columns have fixed regions"),
        }
        // Null rows hold zeros, not whatever the decoder left in the value slot.
        if let Some(validity) = r.validity {
            let row_bytes = values.len() / rows.len().max(1);
            for (i, &valid) in validity.iter().enumerate() {
                if valid == 0 {
                    values[i * row_bytes..(i + 1) * row_bytes].fill(0);
                }
            }
        }
        Ok(())
    }
}

/// A fixed-width column's regions of a slab: its validity mask (if any) and
/// its values.
struct FixedRegions<'s> {
    column: usize,
    validity: Option<&'s mut [u8]>,
    values: &'s mut [u8],
}

/// The regions of the columns marked in `fixed`, cut out of `slab` (the
/// layout's buffers do not overlap; an error if they do).
fn fixed_regions<'s>(
    slab: &'s mut [u8],
    columns: &[Column],
    fixed: &[bool],
) -> std::result::Result<Vec<FixedRegions<'s>>, String> {
    // (offset, length, column, is validity)
    let mut spans: Vec<(usize, usize, usize, bool)> = Vec::new();
    for (c, column) in columns.iter().enumerate() {
        if !fixed[c] {
            continue;
        }
        let ColumnLayout::Dense { values } = &column.layout else {
            continue;
        };
        spans.push((values.offset, values.bytes(), c, false));
        if let Some(v) = &column.validity {
            let rows = v.bytes();
            spans.push((v.offset, rows, c, true));
        }
    }
    spans.sort_unstable();
    // Per column: its validity and values pieces.
    let mut validities: Vec<Option<&'s mut [u8]>> = (0..columns.len()).map(|_| None).collect();
    let mut values: Vec<Option<&'s mut [u8]>> = (0..columns.len()).map(|_| None).collect();
    let mut rest = slab;
    let mut at = 0usize;
    for (offset, len, c, validity) in spans {
        let skip = offset
            .checked_sub(at)
            .ok_or_else(|| format!("overlapping slab buffers at byte {offset}"))?;
        if skip.saturating_add(len) > rest.len() {
            return Err(format!(
                "a buffer of {len} bytes at byte {offset} past the slab"
            ));
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(skip);
        let (piece, tail) = tail.split_at_mut(len);
        if validity {
            validities[c] = Some(piece);
        } else {
            values[c] = Some(piece);
        }
        rest = tail;
        at = offset + len;
    }
    Ok(validities
        .into_iter()
        .zip(values)
        .enumerate()
        .filter_map(|(column, (validity, values))| {
            values.map(|values| FixedRegions {
                column,
                validity,
                values,
            })
        })
        .collect())
}

/// One batch in this many is measured for `Stats::mixing`.
const MIXING_SAMPLE: u64 = 8;

/// A window the collator holds: the shuffle stage's window, and each of
/// its batches' projected columns as the collator reads them (made once per
/// window, not per collated batch).
pub(crate) struct HeldWindow {
    window: LoadedWindow,
    sources: Vec<Vec<SourceColumn>>,
}

impl HeldWindow {
    fn new(window: LoadedWindow) -> Self {
        HeldWindow {
            window,
            sources: Vec::new(),
        }
    }
}

impl std::ops::Deref for HeldWindow {
    type Target = LoadedWindow;
    fn deref(&self) -> &LoadedWindow {
        &self.window
    }
}

/// The collate stage of one pass: gathers each batch's rows into a slab.
pub(crate) struct Collator {
    pub config: Arc<Config>,
    pub plan: Arc<EpochPlan>,
    pub windows_in: Receiver<Result<LoadedWindow>>,
    /// The windows being collated, with their columns as the collator reads them.
    pub windows: Vec<HeldWindow>,
    /// Windows (or a failure) received ahead while looking for the permuted
    /// version of a provisional window; `load` takes them first.
    pub ahead: std::collections::VecDeque<Result<LoadedWindow>>,
    /// Permuted versions received in the middle of a batch: they replace
    /// their provisional windows before the next one.
    pub upgrades: Vec<LoadedWindow>,
    pub pool: Arc<Pool>,
    pub counters: Arc<Counters>,
    pub cancel: Arc<AtomicBool>,
    /// Names shards in image errors.
    pub manifest: Arc<Manifest>,
    /// One per image decoding thread (kept from batch to batch); empty
    /// without image columns.
    pub scratch: Vec<image::Scratch>,
    /// Checks the mapped shards a batch's bytes came from before it is
    /// handed on ([`crate::mapfile`]).
    pub fetch: Arc<crate::fetch::FetchContext>,
}

impl Collator {
    /// Make sure window `index` is loaded (windows arrive in order).
    fn load(&mut self, index: usize) -> Result<()> {
        while !self.windows.iter().any(|w| w.index == index) {
            if let Some(ahead) = self.ahead.pop_front() {
                self.hold(ahead?);
                continue;
            }
            let waiting = Instant::now();
            if self.windows.is_empty() {
                // Waiting with no window held, first of all for a pass's
                // first window: the wait warms the pool's first slab as far
                // as a batch is expected to fill it (once per pool, so later
                // waits return at once).
                let (windows_in, cancel) = (&self.windows_in, &self.cancel);
                let bytes = usize::try_from(self.config.batch_bytes).unwrap_or(usize::MAX);
                self.pool.warm_first(bytes, || {
                    windows_in.is_empty() && !cancel.load(Ordering::Relaxed)
                });
            }
            let received = self.windows_in.recv();
            Counters::add_time(&self.counters.collate_blocked_in_ns, waiting.elapsed());
            match received {
                Ok(window) => self.hold(window?),
                Err(_) if self.cancel.load(Ordering::SeqCst) => return Err(LoaderError::Closed),
                Err(_) => {
                    return Err(LoaderError::stage(
                        Stage::Shuffle,
                        None,
                        None,
                        format!(
                            "stopped before delivering window {index} of {}",
                            self.plan.window_count()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Keep a received window; the permuted version of a window held
    /// provisionally waits for [`Collator::upgrade`] (rows of the batch being
    /// gathered may point into the provisional one).
    fn hold(&mut self, window: LoadedWindow) {
        if self.windows.iter().any(|w| w.index == window.index) {
            self.upgrades.push(window);
        } else {
            self.windows.push(HeldWindow::new(window));
        }
    }

    /// Between batches: replace provisional windows by their permuted
    /// versions, received already or arrived since.
    fn upgrade(&mut self) {
        for window in std::mem::take(&mut self.upgrades) {
            if let Some(held) = self.windows.iter_mut().find(|w| w.index == window.index) {
                *held = HeldWindow::new(window);
            }
        }
        while self.windows.iter().any(|w| w.provisional) {
            let Ok(received) = self.windows_in.try_recv() else {
                return;
            };
            match received {
                Ok(window) if self.windows.iter().any(|w| w.index == window.index) => {
                    let held = self
                        .windows
                        .iter_mut()
                        .find(|w| w.index == window.index)
                        .expect("found above");
                    *held = HeldWindow::new(window);
                }
                other => {
                    // A later window (or a failure): for `load`, in order.
                    self.ahead.push_back(other);
                    return;
                }
            }
        }
    }

    /// Collate every batch from position `start` on into `output`. Stops at
    /// the first error (sent on), or quietly once cancelled.
    pub fn run(&mut self, start: u64, output: &Sender<Result<Batch>>) {
        let positions = self.plan.positions();
        let batch_size = self.config.batch_size as u64;
        let mut position = start;
        while position < positions {
            let index = position / batch_size;
            let end = ((index + 1) * batch_size).min(positions);
            self.upgrade();
            let result = match self.config.failpoints.hit("collate", index) {
                // A mapped shard that changed under the batch (or under the
                // stages before: their errors arrive here) is the error,
                // whatever was made of its bytes.
                None => match self.collate(index, position, end) {
                    Err(LoaderError::Closed) => Err(LoaderError::Closed),
                    result => self.fetch.check_mapped().and(result),
                },
                Some(Action::Stop) => return,
                Some(action) => Err(injected(Stage::Collate, action, &self.cancel)),
            };
            if let Err(LoaderError::Closed) = result {
                return;
            }
            let failed = result.is_err();
            let sending = Instant::now();
            let sent = output.send(result);
            Counters::add_time(&self.counters.collate_blocked_out_ns, sending.elapsed());
            if sent.is_err() || failed {
                return;
            }
            position = end;
        }
    }

    fn collate(&mut self, index: u64, start: u64, end: u64) -> Result<Batch> {
        // Row references: (source batch among the loaded windows, row).
        let mut rows = Vec::with_capacity((end - start) as usize);
        // Every MIXING_SAMPLE-th batch, the (window, segment) of each row:
        // how many row groups the batch draws from.
        let measure = index.is_multiple_of(MIXING_SAMPLE);
        let mut sources: Vec<(usize, usize)> = Vec::new();
        // With image columns, where each row comes from (its crop is a
        // function of it, and errors name it).
        let images = self.config.images.is_some();
        let mut ids: Vec<RowId> = Vec::new();
        let first_window = self.plan.window_of(start);
        // Windows before the batch's first one are done: release them.
        self.windows.retain(|w| w.index >= first_window);
        let mut position = start;
        while position < end {
            let w = self.plan.window_of(position);
            self.load(w)?;
            let window = self.plan.window(w);
            let run_end = end.min(window.start + window.rows);
            let loaded_at = self
                .windows
                .iter()
                .position(|l| l.index == w)
                .expect("loaded above");
            let base: usize = self.windows[..loaded_at]
                .iter()
                .map(|l| l.batches.len())
                .sum();
            let loaded = &self.windows[loaded_at];
            // Window rows before each of the window's segments (plan order):
            // which segment a row comes from, for the mixing measure and
            // for image rows' identities.
            let mut segment_starts = Vec::new();
            if measure || images {
                segment_starts.reserve(window.segments.len() + 1);
                segment_starts.push(0u64);
                for seg in window.segments {
                    segment_starts.push(segment_starts.last().expect("non-empty") + seg.rows());
                }
            }
            if measure {
                for p in position..run_end {
                    let row = window.row_at(p - window.start);
                    sources.push((w, segment_starts.partition_point(|&x| x <= row) - 1));
                }
            }
            let skips = loaded.has_skipped();
            if loaded.permuted && !skips && !images {
                // One batch already in the window's order: the rows are the
                // positions (a search per row here cost 3.6% of the tabular
                // set's CPU time, 4,096-row batches).
                let (from, to) = (position - window.start, run_end - window.start);
                rows.extend((from..to).map(|row| (base as u32, row as u32)));
                position = run_end;
                continue;
            }
            for p in position..run_end {
                let row = if loaded.permuted {
                    p - window.start
                } else {
                    window.row_at(p - window.start)
                };
                let segment = loaded.prefix.partition_point(|&x| x <= row) - 1;
                if skips && loaded.skipped[segment] {
                    // A skipped row group's rows are left out of the batch.
                    continue;
                }
                rows.push((
                    (base + segment) as u32,
                    (row - loaded.prefix[segment]) as u32,
                ));
                if images {
                    let at = window.row_at(p - window.start);
                    let k = segment_starts.partition_point(|&x| x <= at) - 1;
                    let seg = &window.segments[k];
                    ids.push(RowId {
                        shard: seg.shard,
                        row_group: seg.row_group,
                        row: seg.start + (at - segment_starts[k]) as u32,
                    });
                }
            }
            position = run_end;
        }
        if measure && !sources.is_empty() {
            sources.sort_unstable();
            sources.dedup();
            Counters::add(&self.counters.mixing_batches, 1);
            Counters::add(&self.counters.mixing_sources, sources.len() as u64);
        }
        let started = Instant::now();
        for held in &mut self.windows {
            // Once per window (a permuted version replaces its provisional
            // window with its sources still to make).
            let w = &held.window;
            if held.sources.len() != w.batches.len() {
                held.sources = w
                    .batches
                    .iter()
                    .map(|b| {
                        // Bounds hold for the one permuted batch they were
                        // made with, never for a window's decoded batches.
                        let bounds: &[_] = if w.permuted { &w.key_bounds } else { &[] };
                        source_columns(&self.config.plans, b, bounds)
                    })
                    .collect();
            }
        }
        let collation = Collation::from_sources(
            &self.config.plans,
            self.config.list_mode,
            self.config.images.as_ref(),
            self.windows
                .iter()
                .flat_map(|w| w.sources.iter().map(Vec::as_slice)),
        )
        .with_workers(self.config.stage_workers());
        let (mut columns, bytes) = collation.layout(&rows);
        let mut blocked = std::time::Duration::ZERO;
        let mut lease = if bytes <= self.pool.slab_bytes() {
            // Waiting for a slab is waiting for the consumer to drop one.
            let waiting = Instant::now();
            let lease = self.pool.acquire(&self.cancel)?;
            blocked = waiting.elapsed();
            Counters::add_time(&self.counters.collate_blocked_out_ns, blocked);
            lease.ok_or(LoaderError::Closed)?
        } else {
            Counters::add(&self.counters.oversize_batches, 1);
            self.pool.oversize(bytes)?
        };
        if images {
            let failures = collation.images(
                &rows,
                &ids,
                &columns,
                lease.slab_mut().as_mut_slice(),
                self.config.seed,
                self.plan.options().epoch,
                &mut self.scratch,
                &self.cancel,
            );
            if self.cancel.load(Ordering::SeqCst) {
                return Err(LoaderError::Closed);
            }
            if !failures.is_empty() {
                columns = self.leave_out(&collation, &mut rows, &ids, failures, &mut lease)?;
            }
        }
        let truncated = collation
            .write(&rows, &columns, lease.slab_mut().as_mut_slice())
            .map_err(|detail| {
                LoaderError::stage(
                    Stage::Collate,
                    None,
                    None,
                    format!("batch {index}: {detail}"),
                )
            })?;
        Counters::add(&self.counters.truncated_rows, truncated);
        Counters::add_time(
            &self.counters.collate_busy_ns,
            started.elapsed().saturating_sub(blocked),
        );
        self.counters
            .span("collate batch", started, crate::trace::Args::Index(index));
        // Counted as held once the consumer receives it (see `Loader`).
        let held = None;
        Ok(Batch {
            lease: Arc::new(lease),
            rows: rows.len(),
            columns,
            index,
            held,
        })
    }
}

impl Collator {
    /// Images of a batch that did not decode: the first one's error, or
    /// under `OnError::Skip` their rows left out (counted, named in a
    /// warning and in the stats): the batch is laid out again without them
    /// and the decoded images move to their new places. Returns the new
    /// layout.
    fn leave_out(
        &self,
        collation: &Collation<'_>,
        rows: &mut Vec<(u32, u32)>,
        ids: &[RowId],
        failures: Vec<(usize, usize, String)>,
        lease: &mut crate::pinned::SlabLease,
    ) -> Result<Vec<Column>> {
        let error = |(i, c, detail): &(usize, usize, String)| {
            let id = ids[*i];
            LoaderError::Image {
                shard: self.manifest.shards[id.shard as usize].path.clone(),
                row_group: id.row_group as usize,
                row: id.row as u64,
                column: self.config.plans[*c].name.clone(),
                detail: detail.clone(),
            }
        };
        if self.config.on_error != crate::OnError::Skip {
            return Err(error(&failures[0]));
        }
        for failure in &failures {
            let e = error(failure);
            let LoaderError::Image {
                shard,
                row_group,
                row,
                column,
                detail,
            } = &e
            else {
                unreachable!("made above")
            };
            let count = self
                .counters
                .record_image_skip(shard, *row_group, *row, column, detail);
            if count as u64 > self.config.max_skipped {
                return Err(LoaderError::TooManySkipped {
                    max: self.config.max_skipped,
                    last: Box::new(e),
                });
            }
        }
        let (old, _) = collation.layout(rows);
        let slab = lease.slab_mut().as_mut_slice();
        let per_image = self.config.images.as_ref().map_or(0, |i| i.image_bytes());
        let bad: Vec<usize> = failures.iter().map(|f| f.0).collect();
        let keep: Vec<usize> = (0..rows.len()).filter(|i| !bad.contains(i)).collect();
        // The decoded images of the rows kept, per image column.
        let mut saved: Vec<Vec<u8>> = Vec::new();
        for (plan, column) in self.config.plans.iter().zip(&old) {
            if let (true, ColumnLayout::Dense { values }) = (plan.is_image(), &column.layout) {
                let mut v = Vec::with_capacity(keep.len() * per_image);
                for &i in &keep {
                    let at = values.offset + i * per_image;
                    v.extend_from_slice(&slab[at..at + per_image]);
                }
                saved.push(v);
            }
        }
        *rows = keep.iter().map(|&i| rows[i]).collect();
        let (columns, _) = collation.layout(rows);
        let mut saved = saved.into_iter();
        for (plan, column) in self.config.plans.iter().zip(&columns) {
            if let (true, ColumnLayout::Dense { values }) = (plan.is_image(), &column.layout) {
                let v = saved.next().expect("one per image column");
                slab[values.offset..values.offset + v.len()].copy_from_slice(&v);
            }
        }
        Ok(columns)
    }
}

/// Make the calling thread's streamed (non-temporal) stores visible before
/// what follows: [`lookup`] and [`stream_copy`] write slabs past the caches
/// and leave fencing to their callers, once per batch (and once per helper
/// thread's share) instead of once per column or per row: a fence waits for
/// every pending streamed line, and one per call cost more than the
/// streaming saved on small batches.
fn fence_streamed() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of x86_64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Copy `src` into `dst` (a slab), streaming copies of 256 bytes or more
/// past the caches (see [`lookup`]).
fn stream_copy(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= 256 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        assert_eq!(dst.len(), src.len());
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (dst.len() - head) / 16 * 16;
        // SAFETY: `dst[head..head + body]` is 16-byte aligned and both ranges
        // lie inside their slices; unaligned loads read `src` within bounds.
        unsafe {
            let d = dst.as_mut_ptr().add(head) as *mut __m128i;
            let s = src.as_ptr().add(head) as *const __m128i;
            for i in 0..body / 16 {
                _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
            }
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
        return;
    }
    dst.copy_from_slice(src);
}

fn write_i64(slab: &mut [u8], buffer: &Buffer, values: &[i64]) {
    let out = &mut slab[buffer.offset..buffer.offset + values.len() * 8];
    for (o, v) in out.chunks_exact_mut(8).zip(values) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

fn pad_bytes(dtype: DType, value: f64) -> [u8; 8] {
    let mut out = [0u8; 8];
    let bytes: Vec<u8> = match dtype {
        DType::Bool => vec![(value != 0.0) as u8],
        DType::I8 => (value as i8).to_le_bytes().to_vec(),
        DType::I16 => (value as i16).to_le_bytes().to_vec(),
        DType::I32 => (value as i32).to_le_bytes().to_vec(),
        DType::I64 => (value as i64).to_le_bytes().to_vec(),
        DType::U8 => (value as u8).to_le_bytes().to_vec(),
        DType::U16 | DType::F16 => (value as u16).to_le_bytes().to_vec(),
        DType::U32 => (value as u32).to_le_bytes().to_vec(),
        DType::U64 => (value as u64).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
    };
    out[..bytes.len()].copy_from_slice(&bytes);
    out
}

/// A dictionary's keys.
#[derive(Clone, Copy)]
enum KeySlice<'a> {
    U8(&'a [u8]),
    U16(&'a [u16]),
    I32(&'a [i32]),
}

impl KeySlice<'_> {
    /// The largest of the keys in `range`, reading an `i32` key as its
    /// `u32` bit pattern (a negative key is larger than any valid one): what
    /// [`lookup`] needs. One vectorised pass.
    fn max_index(&self, range: std::ops::Range<usize>) -> Option<usize> {
        match self {
            KeySlice::U8(k) => k[range].iter().copied().max().map(usize::from),
            KeySlice::U16(k) => k[range].iter().copied().max().map(usize::from),
            KeySlice::I32(k) => k[range].iter().map(|&k| k as u32).max().map(|m| m as usize),
        }
    }

    #[inline(always)]
    fn get(&self, row: usize) -> usize {
        match self {
            KeySlice::U8(k) => k[row] as usize,
            KeySlice::U16(k) => k[row] as usize,
            KeySlice::I32(k) => k[row] as usize,
        }
    }
}

/// A fixed-width source array: its values, or a dictionary's keys and values.
#[derive(Clone, Copy)]
enum Fixed<'a> {
    Plain(&'a [u8]),
    Dictionary {
        keys: KeySlice<'a>,
        values: &'a [u8],
        /// At least the largest key, where already known.
        bound: Option<usize>,
    },
}

impl<'a> Fixed<'a> {
    fn of(data: &'a ArrayData, width: usize, key_bound: Option<KeyBound>) -> Self {
        if let DataType::Dictionary(key, _) = data.data_type() {
            let raw = &data.buffers()[0];
            let keys = match key.as_ref() {
                // A permuted window's merged dictionaries (the shuffle stage's).
                DataType::UInt8 => KeySlice::U8(&raw.typed_data::<u8>()[data.offset()..]),
                DataType::UInt16 => KeySlice::U16(&raw.typed_data::<u16>()[data.offset()..]),
                DataType::Int32 => KeySlice::I32(&raw.typed_data::<i32>()[data.offset()..]),
                other => unreachable!("the loader makes u8, u16 or i32 keys, not {other}"),
            };
            Fixed::Dictionary {
                keys,
                values: SourceColumn::fixed(&data.child_data()[0], width),
                bound: key_bound.map(KeyBound::get),
            }
        } else {
            Fixed::Plain(SourceColumn::fixed(data, width))
        }
    }
}

/// A run of consecutive rows of one source: output rows `at..at + len` are
/// rows `first..first + len` of source `source`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    at: usize,
    source: u32,
    first: u32,
    len: usize,
}

/// The rows as a few runs of consecutive rows of one source each (slices of
/// permuted windows: one run, two where a batch crosses a window boundary),
/// or `None` when they are scattered (more than [`MAX_RUNS`] runs).
fn runs_of(rows: &RowRefs) -> Option<Vec<Run>> {
    const MAX_RUNS: usize = 4;
    let mut runs: Vec<Run> = Vec::new();
    for (i, &(source, row)) in rows.iter().enumerate() {
        if let Some(run) = runs.last_mut()
            && run.source == source
            && run.first as usize + run.len == row as usize
        {
            run.len += 1;
            continue;
        }
        if runs.len() == MAX_RUNS {
            return None;
        }
        runs.push(Run {
            at: i,
            source,
            first: row,
            len: 1,
        });
    }
    Some(runs)
}

/// Copy one `width`-byte value per row, visiting rows in `order`; values of
/// dictionary sources are looked up as they are written. `runs`: the rows
/// as runs of consecutive rows (see [`runs_of`]), each copied or looked up
/// in one sweep.
fn gather_fixed(
    width: usize,
    cols: &[&SourceColumn],
    rows: &RowRefs,
    runs: Option<&[Run]>,
    order: &[u32],
    out: &mut [u8],
) -> std::result::Result<(), String> {
    // Inlined with constant widths below, so common element sizes get
    // fixed-size copies; other widths take the same loop with a runtime width.
    #[inline(always)]
    fn copy(
        w: usize,
        cols: &[&SourceColumn],
        rows: &RowRefs,
        runs: Option<&[Run]>,
        order: &[u32],
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        let srcs: Vec<Fixed> = cols
            .iter()
            .map(|c| Fixed::of(&c.data, w, c.key_bound))
            .collect();
        if let Some(runs) = runs {
            for run in runs {
                let range = run.first as usize..run.first as usize + run.len;
                let out = &mut out[run.at * w..(run.at + run.len) * w];
                match srcs[run.source as usize] {
                    Fixed::Plain(values) => {
                        stream_copy(out, &values[range.start * w..range.end * w]);
                    }
                    Fixed::Dictionary {
                        keys,
                        values,
                        bound,
                    } => {
                        // A bound the shuffle stage established holds for
                        // every key of its window; one at or past the
                        // dictionary's end (never for a valid window) is not
                        // used, so such a batch fails exactly as before.
                        let max = match bound {
                            Some(b) if b < values.len() / w => Some(b),
                            _ => keys.max_index(range.clone()),
                        };
                        // SAFETY: `max` is at least the largest of these
                        // keys, as `lookup` needs it.
                        let done = match keys {
                            KeySlice::U8(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                            KeySlice::U16(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                            // SAFETY: as for the two above.
                            KeySlice::I32(k) => unsafe {
                                lookup_width(w, &k[range.clone()], max, values, out)?
                            },
                        };
                        if !done {
                            for (o, row) in out.chunks_exact_mut(w).zip(range) {
                                let at = keys.get(row) * w;
                                o.copy_from_slice(&values[at..at + w]);
                            }
                        }
                    }
                }
            }
            return Ok(());
        }
        for &i in order {
            let (s, r) = rows[i as usize];
            let to = i as usize * w;
            let from = match srcs[s as usize] {
                Fixed::Plain(values) => &values[r as usize * w..r as usize * w + w],
                Fixed::Dictionary { keys, values, .. } => {
                    let at = keys.get(r as usize) * w;
                    &values[at..at + w]
                }
            };
            out[to..to + w].copy_from_slice(from);
        }
        Ok(())
    }
    match width {
        1 => copy(1, cols, rows, runs, order, out),
        2 => copy(2, cols, rows, runs, order, out),
        4 => copy(4, cols, rows, runs, order, out),
        8 => copy(8, cols, rows, runs, order, out),
        w => copy(w, cols, rows, runs, order, out),
    }
}

/// [`lookup`] for values of `w` bytes; false (nothing written) for other
/// widths or unaligned buffers.
///
/// # Safety
///
/// As [`lookup`]'s.
#[inline(always)]
unsafe fn lookup_width<K: ArrowNativeType>(
    w: usize,
    keys: &[K],
    max: Option<usize>,
    values: &[u8],
    out: &mut [u8],
) -> std::result::Result<bool, String> {
    // SAFETY: the caller's promise about `max` is passed on.
    unsafe {
        match w {
            1 => lookup::<u8, K>(keys, max, values, out),
            2 => lookup::<u16, K>(keys, max, values, out),
            4 => lookup::<u32, K>(keys, max, values, out),
            8 => lookup::<u64, K>(keys, max, values, out),
            _ => Ok(false),
        }
    }
}

/// `out[i] = values[keys[i]]` with `T`-sized values, given `max`, at least
/// the largest of `keys` as an index (`None` when there are none); false
/// (nothing written) when the buffers are not aligned for `T`, an error when
/// `max` is outside `values`.
///
/// # Safety
///
/// `max` must be at least the largest of `keys`, reading an `i32` key as its
/// `u32` bit pattern (so a negative key is larger than any valid one), and
/// `None` only when `keys` is empty: once it is below `values`' length, the
/// reads are unchecked.
unsafe fn lookup<T: Copy, K: ArrowNativeType>(
    keys: &[K],
    max: Option<usize>,
    values: &[u8],
    out: &mut [u8],
) -> std::result::Result<bool, String> {
    // SAFETY: `T` is a plain integer type, valid for any bytes; `align_to`
    // only yields whole, aligned `T`s in the middle slices.
    let (pre, values, _) = unsafe { values.align_to::<T>() };
    let (pre_out, out, _) = unsafe { out.align_to_mut::<T>() };
    if !pre.is_empty() || !pre_out.is_empty() || out.len() < keys.len() {
        return Ok(false);
    }
    // The unchecked reads below rely on every key indexing `values`: checked
    // here, beside them (`max` is computed over the keys by the caller,
    // where their type is known and the scan vectorises, or is a bound the
    // shuffle stage established for the whole window).
    debug_assert!(
        max.is_none_or(|m| m >= values.len()) || keys.iter().all(|k| k.as_usize() < values.len())
    );
    if let Some(max) = max
        && max >= values.len()
    {
        return Err(format!(
            "dictionary key {max} is outside its dictionary of {} values",
            values.len()
        ));
    }
    // A slab is written once and read later by a copy to the device (or by
    // the trainer), long after the caches have moved on: 4- and 8-byte values
    // are streamed past the caches instead of having each line of the slab
    // read in first (tabular data: -5% CPU time in side-by-side runs).
    #[cfg(target_arch = "x86_64")]
    if matches!(std::mem::size_of::<T>(), 4 | 8) {
        use std::arch::x86_64::{_mm_stream_si32, _mm_stream_si64};
        if std::arch::is_x86_feature_detected!("avx2") {
            let (n, o) = (values.len(), out.len());
            // SAFETY: AVX2 is present; `T` is a 4- or 8-byte plain integer
            // (`u32` or `u64`), so its slices are slices of that integer;
            // every key is below `values.len()` (checked above) and `out`
            // holds at least `keys.len()` values.
            unsafe {
                if std::mem::size_of::<T>() == 4 {
                    let values = std::slice::from_raw_parts(values.as_ptr() as *const u32, n);
                    let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u32, o);
                    stream_lookup_u32(keys, values, out);
                } else {
                    let values = std::slice::from_raw_parts(values.as_ptr() as *const u64, n);
                    let out = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u64, o);
                    stream_lookup_u64(keys, values, out);
                }
            }
            return Ok(true);
        }
        for (o, &k) in out.iter_mut().zip(keys) {
            // SAFETY: `k < values.len()` (checked above); `o` is aligned for
            // `T`, which is 4 or 8 bytes, so it is a valid i32 or i64 target.
            unsafe {
                let v = values.get_unchecked(k.as_usize()) as *const T;
                if std::mem::size_of::<T>() == 8 {
                    _mm_stream_si64(o as *mut T as *mut i64, *(v as *const i64));
                } else {
                    _mm_stream_si32(o as *mut T as *mut i32, *(v as *const i32));
                }
            }
        }
        // (Ordered before the batch is handed over by `fence_streamed`.)
        return Ok(true);
    }
    for (o, &k) in out.iter_mut().zip(keys) {
        // SAFETY: `k < values.len()` (checked above).
        *o = unsafe { *values.get_unchecked(k.as_usize()) };
    }
    Ok(true)
}

/// [`lookup`]'s streamed stores for 4-byte values, eight at a time in one
/// 32-byte store (a third less time than a store per value, on tabular
/// dictionaries), single stores up to the first 32-byte boundary and after
/// the last.
///
/// # Safety
///
/// AVX2 must be present; every key must be below `values.len()` and
/// `out.len()` at least `keys.len()`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_lookup_u32<K: ArrowNativeType>(keys: &[K], values: &[u32], out: &mut [u32]) {
    use std::arch::x86_64::{__m256i, _mm_stream_si32, _mm256_set_epi32, _mm256_stream_si256};
    let n = keys.len();
    // SAFETY (all below): `i < n <= out.len()` and keys index `values`, as
    // the caller promises.
    let get = |i: usize| unsafe { *values.get_unchecked(keys.get_unchecked(i).as_usize()) as i32 };
    let head = out.as_ptr().align_offset(32).min(n);
    let p = out.as_mut_ptr();
    for i in 0..head {
        unsafe { _mm_stream_si32(p.add(i) as *mut i32, get(i)) };
    }
    let mut i = head;
    while i + 8 <= n {
        let v = _mm256_set_epi32(
            get(i + 7),
            get(i + 6),
            get(i + 5),
            get(i + 4),
            get(i + 3),
            get(i + 2),
            get(i + 1),
            get(i),
        );
        // SAFETY: `i + 8 <= n`; `p + i` is 32-byte aligned: `head` aligned
        // it, and steps are 32 bytes.
        unsafe { _mm256_stream_si256(p.add(i) as *mut __m256i, v) };
        i += 8;
    }
    for i in i..n {
        // SAFETY: `i < n <= out.len()`.
        unsafe { _mm_stream_si32(p.add(i) as *mut i32, get(i)) };
    }
}

/// [`stream_lookup_u32`] for 8-byte values, four at a time.
///
/// # Safety
///
/// As [`stream_lookup_u32`]'s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_lookup_u64<K: ArrowNativeType>(keys: &[K], values: &[u64], out: &mut [u64]) {
    use std::arch::x86_64::{__m256i, _mm_stream_si64, _mm256_set_epi64x, _mm256_stream_si256};
    let n = keys.len();
    // SAFETY (all below): as in `stream_lookup_u32`.
    let get = |i: usize| unsafe { *values.get_unchecked(keys.get_unchecked(i).as_usize()) as i64 };
    let head = out.as_ptr().align_offset(32).min(n);
    let p = out.as_mut_ptr();
    for i in 0..head {
        unsafe { _mm_stream_si64(p.add(i) as *mut i64, get(i)) };
    }
    let mut i = head;
    while i + 4 <= n {
        let v = _mm256_set_epi64x(get(i + 3), get(i + 2), get(i + 1), get(i));
        // SAFETY: `i + 4 <= n`; `p + i` is 32-byte aligned as above.
        unsafe { _mm256_stream_si256(p.add(i) as *mut __m256i, v) };
        i += 4;
    }
    for i in i..n {
        // SAFETY: `i < n <= out.len()`.
        unsafe { _mm_stream_si64(p.add(i) as *mut i64, get(i)) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, DictionaryArray};

    use arrow_schema::Schema;

    use crate::columns::plan_columns;
    use crate::shuffle::permute;

    use arrow_array::types::{Int32Type, UInt16Type};
    use arrow_array::{Float64Array, Int32Array, Int64Array};
    use arrow_schema::Field;

    use super::*;

    /// `i64` ids and `f64` values as a batch; `dictionary` stores both as
    /// dictionaries whose values are in reverse order (keys reversed too).
    /// `kind`: 0 plain, 1 dictionary with i32 keys, 2 with u16 keys.
    fn batch(ids: &[i64], kind: u8) -> RecordBatch {
        let columns: Vec<ArrayRef> = if kind > 0 {
            let n = ids.len() as i32;
            let keys = Int32Array::from_iter_values((0..n).map(|i| n - 1 - i));
            let rev: Vec<i64> = ids.iter().rev().copied().collect();
            let id_values: ArrayRef = Arc::new(Int64Array::from(rev.clone()));
            let f_values: ArrayRef = Arc::new(Float64Array::from_iter_values(
                rev.iter().map(|&v| v as f64 * 0.5),
            ));
            if kind == 1 {
                vec![
                    Arc::new(
                        DictionaryArray::<Int32Type>::try_new(keys.clone(), id_values).unwrap(),
                    ),
                    Arc::new(DictionaryArray::<Int32Type>::try_new(keys, f_values).unwrap()),
                ]
            } else {
                let keys = arrow_array::UInt16Array::from_iter_values(
                    keys.values().iter().map(|&k| k as u16),
                );
                vec![
                    Arc::new(
                        DictionaryArray::<UInt16Type>::try_new(keys.clone(), id_values).unwrap(),
                    ),
                    Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, f_values).unwrap()),
                ]
            }
        } else {
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(Float64Array::from_iter_values(
                    ids.iter().map(|&v| v as f64 * 0.5),
                )),
            ]
        };
        let fields: Vec<Field> = ["id", "f"]
            .iter()
            .zip(&columns)
            .map(|(n, c)| Field::new(*n, c.data_type().clone(), false))
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
    }

    /// Collate every row of `sources` given by `rows` and read back the
    /// `id` and `f` columns.
    fn collate(sources: &[&RecordBatch], rows: &RowRefs) -> (Vec<i64>, Vec<f64>) {
        collate_bounded(sources, rows, &[])
    }

    /// [`collate`], with `key_bounds` given for every source (as the
    /// collator gives a permuted window's).
    fn collate_bounded(
        sources: &[&RecordBatch],
        rows: &RowRefs,
        key_bounds: &[Option<KeyBound>],
    ) -> (Vec<i64>, Vec<f64>) {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("f", DataType::Float64, false),
        ]);
        let plans = plan_columns(&schema, &["id".into(), "f".into()], None).unwrap();
        let made: Vec<Vec<SourceColumn>> = sources
            .iter()
            .map(|b| source_columns(&plans, b, key_bounds))
            .collect();
        let collation = Collation::from_sources(
            &plans,
            ListMode::Ragged,
            None,
            made.iter().map(Vec::as_slice),
        );
        let (columns, bytes) = collation.layout(rows);
        // u64 storage keeps the slab 8-byte aligned, like real slabs.
        let mut storage = vec![0u64; bytes.div_ceil(8)];
        // SAFETY: plain integers reinterpreted as bytes.
        let slab = unsafe { storage.align_to_mut::<u8>().1 };
        collation.write(rows, &columns, slab).unwrap();
        let read = |c: usize| -> Vec<u8> {
            let ColumnLayout::Dense { values } = &columns[c].layout else {
                panic!("dense")
            };
            slab[values.offset..values.offset + values.bytes()].to_vec()
        };
        let ids = read(0)
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let fs = read(1)
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        (ids, fs)
    }

    /// Fixed-width columns shared out among threads (nullable, bool, fixed
    /// lists, dictionaries, plain values, scattered and in runs) give the
    /// same slab bytes as one thread writing them, and leave the other
    /// columns' bytes to the serial loop.
    #[test]
    fn fixed_columns_written_on_several_threads_match_one_thread() {
        use arrow_array::{BooleanArray, FixedSizeListArray, StringArray};
        let n = 30_000usize;
        let part = |from: usize| -> RecordBatch {
            let ids = (from..from + n).map(|i| i as i64);
            let dict = Arc::new(Int64Array::from_iter_values(0..100));
            let keys: Vec<u16> = (from..from + n).map(|i| (i % 100) as u16).collect();
            let nullable: Int32Array = (from..from + n)
                .map(|i| (i % 7 != 0).then_some(i as i32))
                .collect();
            let flags = BooleanArray::from_iter((from..from + n).map(|i| Some(i % 3 == 0)));
            let pairs = FixedSizeListArray::new(
                Arc::new(Field::new("item", DataType::Float32, false)),
                2,
                Arc::new(arrow_array::Float32Array::from_iter_values(
                    (from..from + n).flat_map(|i| [i as f32, -(i as f32)]),
                )),
                None,
            );
            let names = StringArray::from_iter_values((from..from + n).map(|i| format!("r{i}")));
            RecordBatch::try_from_iter_with_nullable([
                (
                    "id",
                    Arc::new(Int64Array::from_iter_values(ids)) as ArrayRef,
                    false,
                ),
                (
                    "cat",
                    Arc::new(DictionaryArray::<UInt16Type>::try_new(keys.into(), dict).unwrap()),
                    false,
                ),
                ("maybe", Arc::new(nullable), true),
                ("flag", Arc::new(flags), false),
                ("pair", Arc::new(pairs), false),
                ("name", Arc::new(names), false),
            ])
            .unwrap()
        };
        let sources = [part(0), part(n)];
        let refs: Vec<&RecordBatch> = sources.iter().collect();
        let schema = Schema::new(
            sources[0]
                .schema()
                .fields()
                .iter()
                .map(|f| {
                    let t = match f.data_type() {
                        DataType::Dictionary(_, v) => v.as_ref().clone(),
                        t => t.clone(),
                    };
                    f.as_ref().clone().with_data_type(t)
                })
                .collect::<Vec<_>>(),
        );
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        let plans = plan_columns(&schema, &names, None).unwrap();
        let scattered: Vec<(u32, u32)> = (0..2 * n as u32)
            .map(|i| {
                let g = (i as u64 * 7919 % (2 * n) as u64) as u32;
                ((g / n as u32), g % n as u32)
            })
            .collect();
        let in_runs: Vec<(u32, u32)> = (100..n as u32)
            .map(|r| (0, r))
            .chain((0..n as u32 / 2).map(|r| (1, r)))
            .collect();
        for rows in [scattered, in_runs] {
            let write = |workers: usize| -> Vec<u8> {
                let collation =
                    Collation::new(&plans, ListMode::Ragged, None, &refs).with_workers(workers);
                let (columns, bytes) = collation.layout(&rows);
                let mut storage = vec![0xabu64; bytes.div_ceil(8)];
                // SAFETY: plain integers reinterpreted as bytes.
                let slab = unsafe { storage.align_to_mut::<u8>().1 };
                collation.write(&rows, &columns, slab).unwrap();
                slab.to_vec()
            };
            let one = write(1);
            assert_eq!(write(3), one);
            // The values are the rows' (spot check: id and the nullable column).
            let collation = Collation::new(&plans, ListMode::Ragged, None, &refs);
            let (columns, _) = collation.layout(&rows);
            let ColumnLayout::Dense { values } = &columns[0].layout else {
                panic!("dense")
            };
            let (s, r) = rows[5];
            let id = i64::from_le_bytes(
                one[values.offset + 40..values.offset + 48]
                    .try_into()
                    .unwrap(),
            );
            assert_eq!(id, (s as usize * n + r as usize) as i64);
            let validity = columns[2].validity.as_ref().unwrap();
            let valid = one[validity.offset + 5];
            assert_eq!(valid == 1, !(s as usize * n + r as usize).is_multiple_of(7));
        }
    }

    #[test]
    fn dictionary_and_plain_sources_collate_and_permute_to_the_same_values() {
        let parts = [
            (0..40).collect::<Vec<i64>>(),
            (40..70).collect(),
            (70..100).collect(),
        ];
        // Mixed: dictionary, plain, dictionary; all dictionaries (i32 keys,
        // u16 keys, both); all plain.
        for kinds in [[1, 0, 2], [1, 1, 1], [2, 2, 2], [2, 1, 2], [0, 0, 0]] {
            let batches: Vec<RecordBatch> = parts
                .iter()
                .zip(kinds)
                .map(|(ids, d)| batch(ids, d))
                .collect();
            let order: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 100).collect();
            let expected_ids: Vec<i64> = order.iter().map(|&o| o as i64).collect();
            let expected_fs: Vec<f64> = expected_ids.iter().map(|&v| v as f64 * 0.5).collect();

            // Gathered straight from the three sources.
            let refs: Vec<&RecordBatch> = batches.iter().collect();
            let rows: Vec<(u32, u32)> = order
                .iter()
                .map(|&o| match o {
                    0..40 => (0, o),
                    40..70 => (1, o - 40),
                    _ => (2, o - 70),
                })
                .collect();
            assert_eq!(
                collate(&refs, &rows),
                (expected_ids.clone(), expected_fs.clone())
            );

            // Permuted into one batch first (the shuffle stage), then collated.
            let (permuted, bounds) = permute(
                batches.to_vec(),
                &order,
                0,
                1,
                crate::shuffle::LOOK_UP_ABOVE,
            )
            .unwrap();
            let all_dictionary = kinds.iter().all(|&k| k > 0);
            assert_eq!(
                matches!(permuted.column(0).data_type(), DataType::Dictionary(..)),
                all_dictionary
            );
            assert_eq!(bounds.iter().all(Option::is_some), all_dictionary);
            let rows: Vec<(u32, u32)> = (0..100).map(|i| (0, i)).collect();
            let expected = (expected_ids, expected_fs);
            assert_eq!(collate(&[&permuted], &rows), expected);
            // With the shuffle stage's key bounds (the largest key not
            // searched for), and with a bound past the dictionary (not
            // used): the same values.
            assert_eq!(collate_bounded(&[&permuted], &rows, &bounds), expected);
            let past = [
                Some(KeyBound::assumed(usize::MAX >> 1)),
                Some(KeyBound::assumed(100)),
            ];
            assert_eq!(collate_bounded(&[&permuted], &rows, &past), expected);

            // Runs of consecutive rows across sources (a batch crossing
            // window boundaries): swept run by run, as row by row.
            let runs: Vec<(u32, u32)> = (35..40)
                .map(|r| (0, r))
                .chain((0..30).map(|r| (1, r)))
                .chain((0..3).map(|r| (2, r)))
                .collect();
            assert_eq!(runs_of(&runs).map(|r| r.len()), Some(3));
            let expected_ids: Vec<i64> = (35..73).collect();
            let expected_fs: Vec<f64> = expected_ids.iter().map(|&v| v as f64 * 0.5).collect();
            assert_eq!(collate(&refs, &runs), (expected_ids, expected_fs));
        }
    }

    #[test]
    fn runs_are_consecutive_rows_of_one_source_and_at_most_four() {
        let run = |at, source, first, len| Run {
            at,
            source,
            first,
            len,
        };
        assert_eq!(
            runs_of(&[(0, 5), (0, 6), (0, 7)]),
            Some(vec![run(0, 0, 5, 3)])
        );
        assert_eq!(
            runs_of(&[(0, 5), (0, 7), (1, 8), (1, 9)]),
            Some(vec![run(0, 0, 5, 1), run(1, 0, 7, 1), run(2, 1, 8, 2)])
        );
        assert_eq!(runs_of(&[(0, 4), (0, 3), (0, 2), (0, 1), (0, 0)]), None);
        assert_eq!(runs_of(&[]), Some(vec![]));
    }

    /// Dictionary columns with null rows (key 0 there, as decoded) keep
    /// their nulls through the shuffle stage and collate to a validity mask
    /// with zeros in null rows.
    #[test]
    fn dictionary_nulls_survive_permutation_and_collation() {
        let part = |ids: std::ops::Range<i64>| -> RecordBatch {
            let n = ids.end - ids.start;
            let valid = arrow_buffer::NullBuffer::from_iter(ids.clone().map(|i| i % 3 != 0));
            let keys: Vec<u16> = ids
                .clone()
                .map(|i| {
                    if i % 3 != 0 {
                        (i - ids.start) as u16
                    } else {
                        0
                    }
                })
                .collect();
            let keys = arrow_array::UInt16Array::new(keys.into(), Some(valid));
            let values: ArrayRef = Arc::new(Int64Array::from_iter_values(ids.clone()));
            assert_eq!(values.len() as i64, n);
            let array: ArrayRef =
                Arc::new(DictionaryArray::<UInt16Type>::try_new(keys, values).unwrap());
            RecordBatch::try_from_iter_with_nullable([("id", array, true)]).unwrap()
        };
        let batches = [part(0..40), part(40..100)];
        let order: Vec<u32> = (0..100u32).map(|i| (i * 37 + 11) % 100).collect();
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let plans = plan_columns(&schema, &["id".into()], None).unwrap();
        let read = |sources: &[&RecordBatch], rows: &[(u32, u32)]| -> (Vec<i64>, Vec<u8>) {
            let collation = Collation::new(&plans, ListMode::Ragged, None, sources);
            let (columns, bytes) = collation.layout(rows);
            let mut storage = vec![0xffu64; bytes.div_ceil(8)];
            // SAFETY: plain integers reinterpreted as bytes.
            let slab = unsafe { storage.align_to_mut::<u8>().1 };
            collation.write(rows, &columns, slab).unwrap();
            let ColumnLayout::Dense { values } = &columns[0].layout else {
                panic!("dense")
            };
            let validity = columns[0].validity.as_ref().unwrap();
            (
                slab[values.offset..values.offset + values.bytes()]
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                slab[validity.offset..validity.offset + rows.len()].to_vec(),
            )
        };
        let expected: (Vec<i64>, Vec<u8>) = (
            order
                .iter()
                .map(|&o| if o % 3 != 0 { o as i64 } else { 0 })
                .collect(),
            order.iter().map(|&o| (o % 3 != 0) as u8).collect(),
        );
        let rows: Vec<(u32, u32)> = order
            .iter()
            .map(|&o| if o < 40 { (0, o) } else { (1, o - 40) })
            .collect();
        assert_eq!(read(&[&batches[0], &batches[1]], &rows), expected);
        let (permuted, _) = permute(
            batches.to_vec(),
            &order,
            0,
            1,
            crate::shuffle::LOOK_UP_ABOVE,
        )
        .unwrap();
        let rows: Vec<(u32, u32)> = (0..100).map(|i| (0, i)).collect();
        assert_eq!(read(&[&permuted], &rows), expected);
    }

    /// Dictionary lookups into a slab give `values[key]` for every key, at
    /// any alignment of the output and any length, for 4- and 8-byte values
    /// and both key types (the 32-byte streamed stores included), and touch
    /// nothing around the output.
    #[test]
    fn lookups_write_every_value_at_any_alignment() {
        fn check<T: Copy + PartialEq + std::fmt::Debug + Default, K: ArrowNativeType>(
            values: &[T],
            keys: &[K],
        ) {
            let bytes = std::mem::size_of::<T>();
            // SAFETY: plain integers viewed as bytes.
            let raw = unsafe {
                std::slice::from_raw_parts(
                    values.as_ptr() as *const u8,
                    std::mem::size_of_val(values),
                )
            };
            let max = keys.iter().map(|k| k.as_usize()).max();
            for len in [0, 1, 3, 7, 8, 9, 31, 64, 100] {
                for shift in 0..9 {
                    let mut out = vec![T::default(); len + 20];
                    // SAFETY: as above; `max` is the largest of these keys.
                    let done = unsafe {
                        let o = std::slice::from_raw_parts_mut(
                            out.as_mut_ptr().add(shift) as *mut u8,
                            len * bytes,
                        );
                        lookup::<T, K>(&keys[..len], max, raw, o).unwrap()
                    };
                    fence_streamed();
                    assert!(done);
                    for i in 0..len {
                        assert_eq!(out[shift + i], values[keys[i].as_usize()], "len {len}");
                    }
                    assert!(out[..shift].iter().all(|v| *v == T::default()));
                    assert!(out[shift + len..].iter().all(|v| *v == T::default()));
                }
            }
        }
        let keys16: Vec<u16> = (0..100u16).map(|i| (i * 37 + 5) % 50).collect();
        let keys32: Vec<i32> = keys16.iter().map(|&k| k as i32).collect();
        let v32: Vec<u32> = (0..50u32).map(|i| i.wrapping_mul(2654435761) | 1).collect();
        let v64: Vec<u64> = (0..50u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
            .collect();
        check(&v32, &keys16);
        check(&v32, &keys32);
        check(&v64, &keys16);
        check(&v64, &keys32);
    }

    #[test]
    fn stream_copy_copies_every_byte_at_any_alignment() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 31 % 251) as u8).collect();
        for len in [0, 1, 15, 255, 256, 257, 1000, 4096, 4099] {
            for dst_shift in 0..17 {
                for src_shift in [0, 1, 7] {
                    let mut dst = vec![0xeeu8; len + 40];
                    let from = &src[src_shift..src_shift + len];
                    stream_copy(&mut dst[dst_shift..dst_shift + len], from);
                    assert_eq!(&dst[dst_shift..dst_shift + len], from, "len {len}");
                    assert!(dst[..dst_shift].iter().all(|&b| b == 0xee));
                    assert!(dst[dst_shift + len..].iter().all(|&b| b == 0xee));
                }
            }
        }
    }

    #[test]
    fn view_sources_collate_like_offset_sources() {
        use arrow_array::{StringArray, StringViewArray};
        let words: Vec<String> = (0..50)
            .map(|i| format!("{i}{}", "-long-".repeat(i % 5)))
            .collect();
        let schema = Schema::new(vec![Field::new("w", DataType::Utf8, false)]);
        let plans = plan_columns(&schema, &["w".into()], None).unwrap();
        let rows: Vec<(u32, u32)> = (0..50u32).map(|i| (i % 2, (i * 7) % 50)).collect();
        let read = |sources: &[&RecordBatch]| -> Vec<String> {
            let collation = Collation::new(&plans, ListMode::Ragged, None, sources);
            let (columns, bytes) = collation.layout(&rows);
            let mut storage = vec![0u64; bytes.div_ceil(8)];
            // SAFETY: plain integers reinterpreted as bytes.
            let slab = unsafe { storage.align_to_mut::<u8>().1 };
            collation.write(&rows, &columns, slab).unwrap();
            let ColumnLayout::Bytes {
                values, offsets, ..
            } = &columns[0].layout
            else {
                panic!("bytes")
            };
            let offs: Vec<usize> = slab[offsets.offset..offsets.offset + offsets.bytes()]
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as usize)
                .collect();
            offs.windows(2)
                .map(|w| {
                    String::from_utf8(slab[values.offset + w[0]..values.offset + w[1]].to_vec())
                        .unwrap()
                })
                .collect()
        };
        let batch_of = |array: ArrayRef| {
            RecordBatch::try_from_iter_with_nullable([("w", array, false)]).unwrap()
        };
        let views = batch_of(Arc::new(StringViewArray::from_iter_values(&words)));
        let plain = batch_of(Arc::new(StringArray::from(words.clone())));
        let expected: Vec<String> = rows
            .iter()
            .map(|(_, r)| words[*r as usize].clone())
            .collect();
        assert_eq!(read(&[&views, &plain]), expected);
        assert_eq!(read(&[&plain, &views]), expected);
    }

    /// The key check of a slab write: the largest key (a negative i32 one
    /// counting as larger than any valid key) decides, and a key outside the
    /// dictionary is an error, never a read past it. (Forged arrays cannot be
    /// built here: arrow's `force_validate` refuses them.)
    #[test]
    fn keys_outside_their_dictionary_are_refused_when_gathered() {
        let values: Vec<u64> = vec![10, 11, 12];
        // SAFETY (test): u64 is plain bytes.
        let values = unsafe { values.as_slice().align_to::<u8>().1 };
        let mut out = vec![0u64; 3];
        let mut gather = |keys: KeySlice| {
            let max = keys.max_index(0..3);
            // SAFETY: `max` comes from `max_index` of the same keys.
            let bytes = unsafe { out.as_mut_slice().align_to_mut::<u8>().1 };
            match keys {
                KeySlice::U8(k) => unsafe { lookup_width(8, k, max, values, bytes) },
                KeySlice::U16(k) => unsafe { lookup_width(8, k, max, values, bytes) },
                KeySlice::I32(k) => unsafe { lookup_width(8, k, max, values, bytes) },
            }
        };
        for keys in [
            KeySlice::U8(&[3, 1, 0]),
            KeySlice::U16(&[0, 1, 7]),
            KeySlice::I32(&[0, -1, 2]),
        ] {
            let err = gather(keys).unwrap_err();
            assert!(err.contains("outside its dictionary"), "{err}");
        }
        assert_eq!(gather(KeySlice::U8(&[1, 2, 0])), Ok(true));
        assert_eq!(gather(KeySlice::U16(&[2, 1, 0])), Ok(true));
        assert_eq!(out, vec![12, 11, 10]);
        assert_eq!(
            KeySlice::I32(&[0, -1]).max_index(0..2),
            Some(u32::MAX as usize)
        );
        assert_eq!(KeySlice::U16(&[]).max_index(0..0), None);
    }
}
