//! Your own steps on each batch, run on the collate thread right after a
//! batch is laid out in its slab and before it reaches the consumer:
//! [`crate::LoaderBuilder::filter`] (rows dropped, counted),
//! [`crate::LoaderBuilder::map_rows`] (each row in place, with a generator
//! seeded for that row) and [`crate::LoaderBuilder::map_batch`] (the whole
//! batch in place, with a generator seeded for that batch), in that order.
//! Batches keep their plan order (one collate thread), and the draws are the
//! same for any number of threads and after a resume; a row's draws are the
//! same after an elastic resume too (they follow the row, not the rank).

use std::sync::Arc;

use shardfeed_format::permute::{SplitMix64, hash_words};

use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType, Element};

/// What a closure's error is: any error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type MapFn = dyn Fn(&mut BatchMut<'_>, &mut BatchRng) -> Result<(), BoxError> + Send + Sync;
type RowFn = dyn Fn(&mut RowMut<'_>, &mut BatchRng) -> Result<(), BoxError> + Send + Sync;
type FilterFn = dyn Fn(&Row<'_>) -> bool + Send + Sync;

/// The closures given to [`crate::LoaderBuilder::filter`],
/// [`crate::LoaderBuilder::map_rows`] and
/// [`crate::LoaderBuilder::map_batch`].
#[derive(Clone, Default)]
pub(crate) struct Steps {
    pub(crate) filter: Option<Arc<FilterFn>>,
    pub(crate) rows: Option<Arc<RowFn>>,
    pub(crate) batch: Option<Arc<MapFn>>,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("filter", &self.filter.is_some())
            .field("map_rows", &self.rows.is_some())
            .field("map_batch", &self.batch.is_some())
            .finish()
    }
}

/// A step that failed: which, and on what row of the batch (for
/// `map_rows`), with the closure's message.
#[derive(Debug)]
pub(crate) struct StepError {
    pub(crate) step: &'static str,
    pub(crate) row: Option<usize>,
    pub(crate) detail: String,
}

impl Steps {
    /// No step is set.
    pub(crate) fn is_empty(&self) -> bool {
        self.filter.is_none() && self.rows.is_none() && self.batch.is_none()
    }

    /// Whether `map_rows` wants each row's identity for its generator.
    pub(crate) fn wants_row_keys(&self) -> bool {
        self.rows.is_some()
    }

    /// Run the steps on `batch` (seeded from `seed`, `epoch`, `rank` and the
    /// batch's index). `keys`: each row's identity, which seeds its
    /// generator (kept in step with the rows the filter keeps); without
    /// them a row's generator follows (rank, batch index, position).
    /// Returns the rows the filter dropped.
    pub(crate) fn apply(
        &self,
        batch: &mut Batch,
        seed: u64,
        epoch: u64,
        rank: u64,
        keys: &mut Vec<[u64; 3]>,
    ) -> Result<u64, StepError> {
        let mut dropped = 0;
        if let Some(filter) = &self.filter {
            let keep: Vec<bool> = (0..batch.rows())
                .map(|row| filter(&Row { batch, row }))
                .collect();
            dropped = keep.iter().filter(|k| !**k).count() as u64;
            if dropped > 0 {
                compact(batch, &keep).map_err(|detail| StepError {
                    step: "filter",
                    row: None,
                    detail,
                })?;
                if keys.len() == keep.len() {
                    let mut k = keep.iter();
                    keys.retain(|_| *k.next().expect("one per row"));
                }
            }
        }
        if let Some(map) = &self.rows {
            let index = batch.index();
            for row in 0..batch.rows() {
                let key = keys.get(row).copied().unwrap_or([rank, index, row as u64]);
                let mut rng = BatchRng::for_row(seed, epoch, key);
                map(&mut RowMut { batch, row }, &mut rng).map_err(|e| StepError {
                    step: "map_rows",
                    row: Some(row),
                    detail: e.to_string(),
                })?;
            }
        }
        if let Some(map) = &self.batch {
            let mut rng = BatchRng::new(seed, epoch, rank, batch.index());
            map(&mut BatchMut::new(batch), &mut rng).map_err(|e| StepError {
                step: "map_batch",
                row: None,
                detail: e.to_string(),
            })?;
        }
        Ok(dropped)
    }
}

/// `buffer` of `batch` as `&mut [T]`; `None` if the types differ or the
/// batch's slab is shared.
fn typed_mut<'b, T: Element>(batch: &'b mut Batch, buffer: &Buffer) -> Option<&'b mut [T]> {
    if buffer.dtype != T::DTYPE && !(buffer.dtype == DType::Bool && T::DTYPE == DType::U8) {
        return None;
    }
    let (offset, len, bytes) = (buffer.offset, buffer.len(), buffer.bytes());
    // The collator holds the only handle on a batch it has just made.
    let lease = Arc::get_mut(&mut batch.lease)?;
    let slab = lease.slab_mut().as_mut_slice();
    let region = slab.get_mut(offset..offset.checked_add(bytes)?)?;
    // SAFETY: regions are 64-byte aligned in a page-aligned slab and hold
    // `len` initialised elements of `T` (checked against the buffer's dtype
    // above); the borrow of `batch` keeps them unique.
    Some(unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<T>(), len) })
}

fn values_of(column: &Column) -> &Buffer {
    match &column.layout {
        ColumnLayout::Dense { values }
        | ColumnLayout::Ragged { values, .. }
        | ColumnLayout::Padded { values, .. }
        | ColumnLayout::Bytes { values, .. }
        | ColumnLayout::ListBytes { values, .. } => values,
    }
}

/// Elements of `column`'s values buffer that hold `row`: `start..end`.
fn row_span(batch: &Batch, column: &Column, row: usize) -> Option<(usize, usize)> {
    if row >= batch.rows() {
        return None;
    }
    let span = match &column.layout {
        ColumnLayout::Dense { values } => {
            let width: usize = values.shape.iter().skip(1).product();
            (row * width, (row + 1) * width)
        }
        ColumnLayout::Ragged {
            values, offsets, ..
        }
        | ColumnLayout::Bytes {
            values, offsets, ..
        } => {
            let offsets: &[i64] = batch.typed(offsets)?;
            let (start, end) = (*offsets.get(row)?, *offsets.get(row + 1)?);
            let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
            (start <= end && end <= values.len()).then_some((start, end))?
        }
        ColumnLayout::Padded { values, lengths } => {
            let width = values.shape.get(1).copied().unwrap_or(1);
            let length: &[i64] = batch.typed(lengths)?;
            let n = usize::try_from(*length.get(row)?).ok()?.min(width);
            (row * width, row * width + n)
        }
        // The bytes of the row's items, end to end.
        ColumnLayout::ListBytes {
            values,
            offsets,
            value_offsets,
            ..
        } => {
            let offsets: &[i64] = batch.typed(offsets)?;
            let items: &[i64] = batch.typed(value_offsets)?;
            let at = |i: &i64| usize::try_from(*items.get(usize::try_from(*i).ok()?)?).ok();
            let (start, end) = (at(offsets.get(row)?)?, at(offsets.get(row + 1)?)?);
            (start <= end && end <= values.len()).then_some((start, end))?
        }
    };
    Some(span)
}

/// One row of a batch as a [`crate::LoaderBuilder::filter`] closure sees
/// it: each column's values for the row.
pub struct Row<'a> {
    batch: &'a Batch,
    row: usize,
}

impl Row<'_> {
    /// The row's position in its batch.
    pub fn position(&self) -> usize {
        self.row
    }

    /// The row's values of column `name` as `T`: one element for a
    /// scalar, `n` for a fixed-size list, the row's elements of a list (the
    /// real ones of a padded list), its bytes of a binary column as `u8`.
    /// `None` for another type or no such column.
    pub fn values<T: Element>(&self, name: &str) -> Option<&[T]> {
        let column = self.batch.column(name)?;
        let (start, end) = row_span(self.batch, column, self.row)?;
        self.batch.typed::<T>(values_of(column))?.get(start..end)
    }

    /// The row's string in column `name` (`None`: not a UTF-8 column).
    pub fn str(&self, name: &str) -> Option<&str> {
        let column = self.batch.column(name)?;
        if !matches!(column.layout, ColumnLayout::Bytes { utf8: true, .. }) {
            return None;
        }
        std::str::from_utf8(self.values::<u8>(name)?).ok()
    }

    /// Whether the row holds a value in column `name` (`None`: no such
    /// column); a column that is not nullable always does.
    pub fn is_valid(&self, name: &str) -> Option<bool> {
        let column = self.batch.column(name)?;
        match &column.validity {
            None => Some(true),
            Some(v) => Some(*self.batch.typed::<u8>(v)?.get(self.row)? != 0),
        }
    }
}

/// One row of a batch as a [`crate::LoaderBuilder::map_rows`] closure sees
/// it: each column's values for the row, read and written in place.
pub struct RowMut<'a> {
    batch: &'a mut Batch,
    row: usize,
}

impl RowMut<'_> {
    /// The row, read only.
    pub fn as_row(&self) -> Row<'_> {
        Row {
            batch: self.batch,
            row: self.row,
        }
    }

    /// The row's values of column `name` as `&mut [T]` (see
    /// [`Row::values`]).
    pub fn values_mut<T: Element>(&mut self, name: &str) -> Option<&mut [T]> {
        let column = self.batch.column(name)?;
        let (start, end) = row_span(self.batch, column, self.row)?;
        let values = values_of(column).clone();
        typed_mut::<T>(self.batch, &values)?.get_mut(start..end)
    }

    /// Mark the row's value in nullable column `name` present or null;
    /// `None` when the column is not nullable (or not there).
    pub fn set_valid(&mut self, name: &str, valid: bool) -> Option<()> {
        let validity = self.batch.column(name)?.validity.clone()?;
        *typed_mut::<u8>(self.batch, &validity)?.get_mut(self.row)? = u8::from(valid);
        Some(())
    }
}

/// The `i64` offsets of `buffer`, each at most `max` and none below the one
/// before (they were written by the collator, and may have been changed by
/// a user's closure since).
fn read_offsets(slab: &[u8], buffer: &Buffer, max: usize) -> Result<Vec<usize>, String> {
    let mut out: Vec<usize> = Vec::with_capacity(buffer.len());
    for i in 0..buffer.len() {
        let at = buffer.offset + i * 8;
        let word: [u8; 8] = slab
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format!("offset {i} outside the slab"))?;
        let value = usize::try_from(i64::from_le_bytes(word))
            .ok()
            .filter(|&o| o <= max && out.last().is_none_or(|&last| last <= o))
            .ok_or_else(|| format!("offset {i} is outside its values or goes backwards"))?;
        out.push(value);
    }
    Ok(out)
}

/// Keep the rows of `batch` marked in `keep`, in order: each buffer's kept
/// rows move down in place in the slab and the buffers shrink.
fn compact(batch: &mut Batch, keep: &[bool]) -> Result<(), String> {
    let rows = batch.rows();
    if keep.len() != rows {
        return Err(format!("{} marks for {rows} rows", keep.len()));
    }
    let kept = keep.iter().filter(|k| **k).count();
    let mut columns = batch.columns.clone();
    let shared = || "the batch's slab is shared".to_string();
    let lease = Arc::get_mut(&mut batch.lease).ok_or_else(shared)?;
    let slab = lease.slab_mut().as_mut_slice();
    // Rows of `width` bytes each at `buffer`: kept ones moved down.
    let dense = |slab: &mut [u8], buffer: &mut Buffer| -> Result<(), String> {
        if buffer.shape.first() != Some(&rows) {
            return Err(format!(
                "a buffer of shape {:?} for {rows} rows",
                buffer.shape
            ));
        }
        let width = buffer.bytes() / rows.max(1);
        let mut to = buffer.offset;
        for (row, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
            let from = buffer.offset + row * width;
            slab.copy_within(from..from + width, to);
            to += width;
        }
        buffer.shape[0] = kept;
        Ok(())
    };
    for column in &mut columns {
        match &mut column.layout {
            ColumnLayout::Dense { values } => dense(slab, values)?,
            ColumnLayout::ListBytes {
                values,
                offsets,
                value_offsets,
                ..
            } => {
                if offsets.len() != rows + 1 || value_offsets.is_empty() {
                    return Err(format!("{} offsets for {rows} rows", offsets.len()));
                }
                let items = value_offsets.len() - 1;
                let row_items = read_offsets(slab, offsets, items)?;
                // Item boundaries in values (bytes for binary and strings).
                let item_at = read_offsets(slab, value_offsets, values.len())?;
                let size = values.dtype.size();
                let (mut kept_values, mut new_rows, mut new_items) =
                    (0usize, vec![0i64], vec![0i64]);
                for (row, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
                    let (a, b) = (row_items[row], row_items[row + 1]);
                    let (from, to) = (item_at[a], item_at[b]);
                    slab.copy_within(
                        values.offset + from * size..values.offset + to * size,
                        values.offset + kept_values * size,
                    );
                    for j in a..b {
                        new_items.push((kept_values + item_at[j + 1] - from) as i64);
                    }
                    kept_values += to - from;
                    new_rows.push(new_items.len() as i64 - 1);
                }
                crate::gather::kernels::write_i64(slab, offsets, &new_rows);
                crate::gather::kernels::write_i64(slab, value_offsets, &new_items);
                values.shape = vec![kept_values];
                offsets.shape = vec![kept + 1];
                value_offsets.shape = vec![new_items.len()];
            }
            ColumnLayout::Padded { values, lengths } => {
                dense(slab, values)?;
                dense(slab, lengths)?;
            }
            ColumnLayout::Ragged { values, offsets }
            | ColumnLayout::Bytes {
                values, offsets, ..
            } => {
                let size = values.dtype.size();
                if offsets.len() != rows + 1 {
                    return Err(format!("{} offsets for {rows} rows", offsets.len()));
                }
                let starts = read_offsets(slab, offsets, values.len())?;
                let mut total = 0usize;
                let mut new = Vec::with_capacity(kept + 1);
                new.push(0i64);
                for (row, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
                    let (start, end) = (starts[row], starts[row + 1]);
                    let from = values.offset + start * size;
                    slab.copy_within(
                        from..from + (end - start) * size,
                        values.offset + total * size,
                    );
                    total += end - start;
                    new.push(total as i64);
                }
                crate::gather::kernels::write_i64(slab, offsets, &new);
                values.shape = vec![total];
                offsets.shape = vec![kept + 1];
            }
        }
        if let Some(validity) = &mut column.validity {
            dense(slab, validity)?;
        }
    }
    batch.columns = columns;
    batch.rows = kept;
    Ok(())
}

/// A batch as a [`crate::LoaderBuilder::map_batch`] closure sees it: the
/// batch's columns, read and written in place in its slab.
pub struct BatchMut<'a> {
    batch: &'a mut Batch,
}

impl<'a> BatchMut<'a> {
    pub(crate) fn new(batch: &'a mut Batch) -> Self {
        BatchMut { batch }
    }

    /// The batch (read only).
    pub fn batch(&self) -> &Batch {
        self.batch
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.batch.rows()
    }

    /// The batch's index in its epoch (for this rank).
    pub fn index(&self) -> u64 {
        self.batch.index()
    }

    /// The values of column `name` as `&mut [T]` (fixed-width values, list
    /// elements, or bytes as `u8`); `None` for another type or no such column.
    pub fn values_mut<T: Element>(&mut self, name: &str) -> Option<&mut [T]> {
        let values = values_of(self.batch.column(name)?).clone();
        typed_mut(self.batch, &values)
    }

    /// The validity mask of nullable column `name`, writable (1: a value).
    pub fn validity_mut(&mut self, name: &str) -> Option<&mut [u8]> {
        let validity = self.batch.column(name)?.validity.clone()?;
        typed_mut(self.batch, &validity)
    }
}

/// The generator a step's closure gets: for
/// [`crate::LoaderBuilder::map_batch`] seeded from (seed, epoch, rank,
/// batch index); for [`crate::LoaderBuilder::map_rows`] from (seed, epoch,
/// the row's shard, row group and row).
#[derive(Clone, Debug)]
pub struct BatchRng(SplitMix64);

impl BatchRng {
    pub(crate) fn new(seed: u64, epoch: u64, rank: u64, batch: u64) -> Self {
        BatchRng(SplitMix64::new(hash_words(&[
            seed,
            epoch,
            rank,
            batch,
            0x6d61_705f_6261_7463,
        ])))
    }

    pub(crate) fn for_row(seed: u64, epoch: u64, key: [u64; 3]) -> Self {
        BatchRng(SplitMix64::new(hash_words(&[
            seed,
            epoch,
            key[0],
            key[1],
            key[2],
            0x6d61_705f_726f_7773,
        ])))
    }

    /// A uniform `u64`.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, bound)` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0.below(bound)
    }
}
