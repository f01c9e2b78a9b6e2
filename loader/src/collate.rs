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
use arrow_data::ArrayData;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use shardfeed_format::failpoint::Action;

use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType};
use crate::columns::{ALIGN, ColumnPlan, Kind, ListMode};
use crate::config::Config;
use crate::error::{LoaderError, Result};
use crate::gather::kernels::*;
use crate::gather::{KeyBound, RowRefs};
use crate::image::{self, ImageOptions, RowId};
use crate::pinned::Pool;
use crate::plan::EpochPlan;
use crate::shuffle::LoadedWindow;
use crate::stage::injected;
use crate::stats::Counters;

mod handoff;
mod lists;
mod provisional;
use handoff::HandoffValues;
use shardfeed_format::Manifest;

struct Layout {
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
        buffer
    }
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

/// Sizes of every buffer, computed before writing so the batch fits one slab.
pub(crate) struct Collation<'a> {
    plans: &'a [ColumnPlan],
    list_mode: ListMode,
    images: Option<&'a ImageOptions>,
    sources: Vec<std::borrow::Cow<'a, [SourceColumn]>>,
    /// Threads (this one included) fixed-width columns may be shared out
    /// among (see [`Collation::write`]).
    workers: usize,
    /// Threads (this one included) a large binary column's bytes may be
    /// copied by (see [`Collation::write`]).
    copy_workers: usize,
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
            copy_workers: 1,
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
            copy_workers: 1,
        }
    }

    /// Share fixed-width columns out among up to `workers` threads.
    pub(crate) fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Copy a binary column's bytes with up to `workers` threads when a
    /// batch holds many of them (images, audio: the copy into the slab is
    /// then the collator's whole work, and one thread's copy its limit).
    pub(crate) fn with_copy_workers(mut self, workers: usize) -> Self {
        self.copy_workers = workers.max(1);
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
        let mut layout = Layout { total: 0 };
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
                Kind::ListBytes { utf8, dtype } => {
                    let cols: Vec<&SourceColumn> = self.sources.iter().map(|s| &s[c]).collect();
                    // An error here is met again, and reported, when the
                    // rows are written: lay out nothing.
                    let (items, bytes) = lists::totals(&plan.name, &cols, rows).unwrap_or((0, 0));
                    ColumnLayout::ListBytes {
                        values: layout.push(dtype, vec![bytes / dtype.size()]),
                        offsets: layout.push(DType::I64, vec![n + 1]),
                        value_offsets: layout.push(DType::I64, vec![items + 1]),
                        utf8,
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
        // A thread copies at least this many bytes of a binary column.
        const MIN_COPY_SHARE: usize = 1 << 20;
        // Fixed-width columns are independent slab regions: with many values
        // to write, they are shared out among threads (the collate stage is
        // one thread, and would otherwise cap a loader given many cores).
        const MIN_SHARE: usize = 1 << 16;
        let fixed_count = fixed.iter().filter(|&&f| f).count();
        let workers = self
            .workers
            .min((rows.len() * fixed_count / MIN_SHARE).max(1));
        let regions = fixed_regions(slab, columns, &fixed)?;
        shardfeed_format::share::share_out(
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
                    // Row boundaries as the slab holds them (never negative).
                    let mut offs: Vec<i64> = Vec::with_capacity(rows.len() + 1);
                    offs.push(0);
                    for (s, r) in rows {
                        let value = cols[*s as usize].value_bytes(*large, *r as usize);
                        offs.push(offs.last().expect("non-empty") + value.len() as i64);
                    }
                    let at = |i: usize| offs[i] as usize;
                    let total = at(rows.len());
                    let region = slab
                        .get_mut(values.offset..values.offset + total)
                        .filter(|_| total <= values.len())
                        .ok_or_else(|| {
                            format!("{total} bytes of `{}` pass their region", plan.name)
                        })?;
                    // Rows in runs of about equal bytes, one per thread.
                    let workers = self.copy_workers.min(total / MIN_COPY_SHARE).max(1);
                    let mut runs: Vec<(std::ops::Range<usize>, &mut [u8])> = Vec::new();
                    let (mut rest, mut first) = (region, 0usize);
                    for w in 1..=workers {
                        let last = match w == workers {
                            true => rows.len(),
                            false => offs
                                .partition_point(|&o| (o as usize) < total * w / workers)
                                .clamp(first, rows.len()),
                        };
                        let (run, tail) = rest.split_at_mut(at(last) - at(first));
                        runs.push((first..last, run));
                        (rest, first) = (tail, last);
                    }
                    shardfeed_format::share::share_out(
                        runs,
                        workers,
                        "shardfeed-collate",
                        &|(range, out): (std::ops::Range<usize>, &mut [u8])| {
                            let base = at(range.start);
                            for i in range {
                                let (s, r) = rows[i];
                                let value = cols[s as usize].value_bytes(*large, r as usize);
                                stream_copy(&mut out[at(i) - base..at(i + 1) - base], value);
                            }
                        },
                        &fence_streamed,
                    );
                    write_i64(slab, offsets, &offs);
                }
                (
                    Kind::ListBytes { .. },
                    ColumnLayout::ListBytes {
                        values,
                        offsets,
                        value_offsets,
                        ..
                    },
                ) => lists::write(
                    &plan.name,
                    &cols,
                    rows,
                    slab,
                    [values, offsets, value_offsets],
                )?,
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
                let width = d.size() * k;
                // Per source column, its values' bytes and the first row's
                // index in them: a fixed-size list's child values, or the
                // values themselves of fixed-size binary and decimals.
                let sources: Vec<(&[u8], usize)> = cols
                    .iter()
                    .map(|col| match col.data.data_type() {
                        arrow_schema::DataType::FixedSizeList(..) => (
                            SourceColumn::fixed(&col.data.child_data()[0], d.size()),
                            col.data.offset(),
                        ),
                        _ => (col.data.buffers()[0].as_slice(), col.data.offset()),
                    })
                    .collect();
                for &i in order {
                    let (s, row) = rows[i as usize];
                    let (src, first) = sources[s as usize];
                    let at_row = first + row as usize;
                    let from =
                        src.get(at_row * width..at_row * width + width)
                            .ok_or_else(|| {
                                format!("row {at_row} lies past its column's {} bytes", src.len())
                            })?;
                    let at = i as usize * width;
                    values[at..at + width].copy_from_slice(from);
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
    /// Shared with the batches handed on uncollated (module `handoff`).
    window: Arc<LoadedWindow>,
    sources: Vec<Vec<SourceColumn>>,
    /// Each batch's list values, where they may be handed on as they lie.
    handoff: Option<Vec<Option<HandoffValues>>>,
}

impl HeldWindow {
    fn new(window: LoadedWindow) -> Self {
        HeldWindow {
            window: Arc::new(window),
            sources: Vec::new(),
            handoff: None,
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
    pub mapped: crate::fetch::MappedCheck,
    /// The last batch's rows (shard, row group, row), when `map_rows` seeds
    /// each row's generator from them.
    pub row_ids: Vec<RowId>,
    /// Batches collated while a provisional window was held: past
    /// [`provisional::PROVISIONAL_BATCHES`], the collator waits for its
    /// permuted version.
    pub provisional_batches: usize,
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

    /// Collate every batch from position `start` on into `output`. Stops at
    /// the first error (sent on), or quietly once cancelled.
    pub fn run(&mut self, start: u64, output: &Sender<Result<Batch>>) {
        let positions = self.plan.positions();
        let batch_size = self.config.batch_size as u64;
        let mut position = start;
        while position < positions {
            let index = position / batch_size;
            let end = ((index + 1) * batch_size).min(positions);
            let upgraded = self.upgrade();
            let result = match self.config.failpoints.hit("collate", index) {
                // The permutation of the window held provisionally failed.
                None if let Err(e) = upgraded => Err(e),
                // A mapped shard that changed under the batch (or under the
                // stages before: their errors arrive here) is the error,
                // whatever was made of its bytes.
                None => match self.collate(index, position, end) {
                    Err(LoaderError::Closed) => Err(LoaderError::Closed),
                    result => self
                        .mapped
                        .check()
                        .and(result)
                        .and_then(|batch| self.map(batch)),
                },
                Some(Action::Stop) => return,
                Some(action) => Err(injected(Stage::Collate, action, &self.cancel)),
            };
            if let Err(LoaderError::Closed) = result {
                return;
            }
            if self.windows.iter().any(|w| w.provisional) {
                self.provisional_batches += 1;
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

    /// Whether each batch's row identities are kept: for `map_rows`'s
    /// generators, or asked for ([`crate::LoaderBuilder::row_ids`]).
    fn wants_row_ids(&self) -> bool {
        self.config.row_ids || self.config.steps.wants_row_keys()
    }

    /// The batch through the user's steps ([`crate::LoaderBuilder::filter`],
    /// `map_rows`, `map_batch`), if any.
    fn map(&mut self, mut batch: Batch) -> Result<Batch> {
        let steps = &self.config.steps;
        let ids = std::mem::take(&mut self.row_ids);
        if steps.is_empty() {
            if self.config.row_ids {
                batch.row_ids = Some(ids);
            }
            return Ok(batch);
        }
        let index = batch.index();
        let mut keys: Vec<[u64; 3]> = ids
            .iter()
            .map(|id| [id.shard as u64, id.row_group as u64, id.row as u64])
            .collect();
        let (seed, epoch, rank) = (self.config.seed, self.plan.epoch(), self.config.rank);
        let dropped = steps
            .apply(&mut batch, seed, epoch, rank, &mut keys)
            .map_err(|e| {
                let row = match e.row {
                    None => String::new(),
                    Some(r) => match keys.get(r) {
                        Some(&[shard, row_group, row]) => format!(
                            ", row {r} ({}, row group {row_group}, row {row})",
                            self.manifest
                                .shards
                                .get(shard as usize)
                                .map_or("?", |s| s.path.as_str())
                        ),
                        None => format!(", row {r}"),
                    },
                };
                LoaderError::stage(
                    Stage::Collate,
                    None,
                    None,
                    format!("{} failed on batch {index}{row}: {}", e.step, e.detail),
                )
            })?;
        batch.filtered = dropped;
        if self.config.row_ids {
            batch.row_ids = Some(
                keys.iter()
                    .map(|&[shard, row_group, row]| RowId {
                        shard: shard as u32,
                        row_group: row_group as u32,
                        row: row as u32,
                    })
                    .collect(),
            );
        }
        Ok(batch)
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
        // With `map_rows` too: each row's generator is seeded from it.
        let need_ids = images || self.wants_row_ids();
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
            if measure || need_ids {
                segment_starts.reserve(window.segments.len() + 1);
                segment_starts.push(0u64);
                for seg in window.segments {
                    segment_starts.push(segment_starts.last().expect("non-empty") + seg.rows());
                }
            }
            // The run's window rows (segment order), where they are needed.
            let at_rows = if measure || need_ids || !loaded.permuted {
                window.rows_at(position - window.start, run_end - window.start)
            } else {
                Vec::new()
            };
            if measure {
                for &row in &at_rows {
                    sources.push((w, segment_starts.partition_point(|&x| x <= row) - 1));
                }
            }
            let skips = loaded.has_skipped();
            if loaded.permuted && !skips && !need_ids {
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
                    at_rows[(p - position) as usize]
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
                if need_ids {
                    let at = at_rows[(p - position) as usize];
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
        if self.config.handoff
            && let Some(batch) = self.handoff(index, &rows, started)?
        {
            return Ok(batch);
        }
        let collation = Collation::from_sources(
            &self.config.plans,
            self.config.list_mode,
            self.config.images.as_ref(),
            self.windows
                .iter()
                .flat_map(|w| w.sources.iter().map(Vec::as_slice)),
        )
        .with_workers(self.config.stage_workers())
        .with_copy_workers(self.config.decode_threads);
        let (mut columns, bytes) = collation.layout(&rows);
        let mut blocked = std::time::Duration::ZERO;
        // A batch past the estimate grows the pool's slabs (within the
        // budget) rather than go outside it.
        let mut lease = if self.pool.grow_for(bytes) {
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
                columns = self.leave_out(&collation, &mut rows, &mut ids, failures, &mut lease)?;
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
        if self.wants_row_ids() {
            self.row_ids = ids;
        }
        // Counted as held once the consumer receives it (see `Loader`).
        let held = None;
        Ok(Batch {
            lease: Arc::new(lease),
            rows: rows.len(),
            columns,
            index,
            held,
            filtered: 0,
            row_ids: None,
            handoff: None,
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
        ids: &mut Vec<RowId>,
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
        *ids = keep.iter().map(|&i| ids[i]).collect();
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

#[cfg(test)]
mod tests;
