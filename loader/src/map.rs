//! Your own step on each batch ([`crate::LoaderBuilder::map_batch`]): a
//! closure run on the collate thread right after a batch is laid out in its
//! slab, before it reaches the consumer, with in-place access to the batch's
//! buffers and a generator seeded for that batch. Batches keep their plan
//! order (one collate thread), and a closure's draws are the same for any
//! number of threads and after a resume.

use std::sync::Arc;

use shardfeed_format::permute::{SplitMix64, hash_words};

use crate::batch::{Batch, Buffer, ColumnLayout, DType, Element};

/// What a closure's error is: any error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type MapFn = dyn Fn(&mut BatchMut<'_>, &mut BatchRng) -> Result<(), BoxError> + Send + Sync;

/// A closure given to [`crate::LoaderBuilder::map_batch`].
#[derive(Clone)]
pub(crate) struct MapBatch(pub(crate) Arc<MapFn>);

impl std::fmt::Debug for MapBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MapBatch(<closure>)")
    }
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

    /// `buffer` of the batch as `&mut [T]`; `None` if the types differ.
    fn typed_mut<T: Element>(&mut self, buffer: &Buffer) -> Option<&mut [T]> {
        if buffer.dtype != T::DTYPE && !(buffer.dtype == DType::Bool && T::DTYPE == DType::U8) {
            return None;
        }
        let (offset, len, bytes) = (buffer.offset, buffer.len(), buffer.bytes());
        // The collator holds the only handle on a batch it has just made.
        let lease = Arc::get_mut(&mut self.batch.lease)?;
        let slab = lease.slab_mut().as_mut_slice();
        let region = slab.get_mut(offset..offset.checked_add(bytes)?)?;
        // SAFETY: regions are 64-byte aligned in a page-aligned slab and
        // hold `len` initialised elements of `T` (checked against the
        // buffer's dtype above); the borrow of `self` keeps them unique.
        Some(unsafe { std::slice::from_raw_parts_mut(region.as_mut_ptr().cast::<T>(), len) })
    }

    /// The values of column `name` as `&mut [T]` (fixed-width values, list
    /// elements, or bytes as `u8`); `None` for another type or no such column.
    pub fn values_mut<T: Element>(&mut self, name: &str) -> Option<&mut [T]> {
        let values = match &self.batch.column(name)?.layout {
            ColumnLayout::Dense { values }
            | ColumnLayout::Ragged { values, .. }
            | ColumnLayout::Padded { values, .. }
            | ColumnLayout::Bytes { values, .. } => values.clone(),
        };
        self.typed_mut(&values)
    }

    /// The validity mask of nullable column `name`, writable (1: a value).
    pub fn validity_mut(&mut self, name: &str) -> Option<&mut [u8]> {
        let validity = self.batch.column(name)?.validity.clone()?;
        self.typed_mut(&validity)
    }
}

/// The generator a [`crate::LoaderBuilder::map_batch`] closure gets: seeded
/// from (seed, epoch, rank, batch index).
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
