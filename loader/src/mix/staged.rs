//! Rows copied out of the sources' batches, column by column, then laid
//! out in the mixture's slab.

use super::*;
use direct::Kind;

/// The error for column `name` collated one way by a source and another
/// way by another.
pub(super) fn mismatch(name: &str) -> LoaderError {
    LoaderError::stage(
        Stage::Mix,
        None,
        None,
        format!("column `{name}` is collated differently by two sources"),
    )
}

/// One column's rows copied out of the sources' batches.
pub(super) struct Staged {
    pub(super) name: String,
    pub(super) kind: Kind,
    pub(super) values: Vec<u8>,
    /// Ragged and bytes: row boundaries (elements); padded: lengths; lists
    /// of bytes: row boundaries in items.
    pub(super) offsets: Vec<i64>,
    /// Lists of bytes: item boundaries (values); empty for the others.
    pub(super) items: Vec<i64>,
    pub(super) validity: Option<Vec<u8>>,
}

impl Staged {
    pub(super) fn new(column: &Column) -> Self {
        let kind = Kind::of(&column.layout);
        Staged {
            name: column.name.clone(),
            kind,
            values: Vec::new(),
            offsets: vec![0],
            items: vec![0],
            validity: column.validity.as_ref().map(|_| Vec::new()),
        }
    }

    /// Empty, keeping the buffers.
    pub(super) fn clear(&mut self) {
        self.values.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.items.clear();
        self.items.push(0);
        // Validity comes back with the first row that has it (`push`).
        self.validity = None;
    }

    /// Append row `row` of `column` (of `batch`); `before` rows came first.
    pub(super) fn push(
        &mut self,
        batch: &Batch,
        column: &Column,
        row: usize,
        before: usize,
    ) -> Result<()> {
        let mismatch = || mismatch(&self.name);
        match (&self.kind, &column.layout) {
            (Kind::Dense { dtype, inner }, ColumnLayout::Dense { values })
                if values.dtype == *dtype && values.shape[1..] == inner[..] =>
            {
                let width = inner.iter().product::<usize>() * dtype.size();
                let bytes = batch.bytes(values);
                self.values
                    .extend_from_slice(&bytes[row * width..(row + 1) * width]);
            }
            (Kind::Padded { dtype, to }, ColumnLayout::Padded { values, lengths })
                if values.dtype == *dtype && values.shape.get(1) == Some(to) =>
            {
                let width = to * dtype.size();
                let bytes = batch.bytes(values);
                self.values
                    .extend_from_slice(&bytes[row * width..(row + 1) * width]);
                let lengths = batch.typed::<i64>(lengths).expect("lengths are i64");
                self.offsets.push(lengths[row]);
            }
            (Kind::Ragged { dtype }, ColumnLayout::Ragged { values, offsets })
                if values.dtype == *dtype =>
            {
                let (bytes, count) = batch
                    .ragged_row(values, offsets, row)
                    .ok_or_else(mismatch)?;
                self.values.extend_from_slice(bytes);
                let last = *self.offsets.last().expect("starts with 0");
                self.offsets.push(last + count as i64);
            }
            (
                Kind::Bytes { .. },
                ColumnLayout::Bytes {
                    values, offsets, ..
                },
            ) => {
                let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
                let (a, z) = (offsets[row] as usize, offsets[row + 1] as usize);
                self.values.extend_from_slice(&batch.bytes(values)[a..z]);
                let last = *self.offsets.last().expect("starts with 0");
                self.offsets.push(last + (z - a) as i64);
            }
            (
                Kind::ListBytes { dtype, .. },
                ColumnLayout::ListBytes {
                    values,
                    offsets,
                    value_offsets,
                    ..
                },
            ) if values.dtype == *dtype => {
                let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
                let items = batch.typed::<i64>(value_offsets).expect("offsets are i64");
                let (a, z) = (offsets[row] as usize, offsets[row + 1] as usize);
                let size = dtype.size();
                let (from, to) = (items[a] as usize * size, items[z] as usize * size);
                let base = *self.items.last().expect("starts with 0") - items[a];
                self.values
                    .extend_from_slice(&batch.bytes(values)[from..to]);
                self.items
                    .extend(items[a + 1..=z].iter().map(|&o| base + o));
                self.offsets.push(self.items.len() as i64 - 1);
            }
            _ => return Err(mismatch()),
        }
        match (&mut self.validity, &column.validity) {
            (Some(v), Some(_)) => v.push(batch.valid_byte(column, row)),
            (Some(v), None) => v.push(1),
            (None, Some(_)) => {
                // The first rows had no validity: they were all valid.
                let mut v = vec![1u8; before];
                v.push(batch.valid_byte(column, row));
                self.validity = Some(v);
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The column's layout for `rows` rows, placing each buffer with
    /// `place`, and the bytes to copy where.
    pub(super) fn layout<'a>(
        &'a self,
        rows: usize,
        place: &mut impl FnMut(usize) -> usize,
    ) -> (Column, Vec<(usize, &'a [u8])>) {
        let mut copies = Vec::new();
        let mut buffer = |dtype: DType, shape: Vec<usize>, bytes: &'a [u8]| {
            let offset = place(bytes.len());
            copies.push((offset, bytes));
            Buffer {
                dtype,
                shape,
                offset,
            }
        };
        let offsets_bytes = || -> &'a [u8] {
            // SAFETY: any `i64` is 8 initialised bytes; `u8` has alignment 1.
            unsafe { self.offsets.align_to::<u8>().1 }
        };
        let layout = match &self.kind {
            Kind::Dense { dtype, inner } => {
                let mut shape = vec![rows];
                shape.extend_from_slice(inner);
                ColumnLayout::Dense {
                    values: buffer(*dtype, shape, &self.values),
                }
            }
            Kind::Padded { dtype, to } => ColumnLayout::Padded {
                values: buffer(*dtype, vec![rows, *to], &self.values),
                lengths: buffer(DType::I64, vec![rows], &offsets_bytes()[8..]),
            },
            Kind::Ragged { dtype } => ColumnLayout::Ragged {
                values: buffer(*dtype, vec![self.values.len() / dtype.size()], &self.values),
                offsets: buffer(DType::I64, vec![rows + 1], offsets_bytes()),
            },
            Kind::Bytes { utf8 } => ColumnLayout::Bytes {
                values: buffer(DType::U8, vec![self.values.len()], &self.values),
                offsets: buffer(DType::I64, vec![rows + 1], offsets_bytes()),
                utf8: *utf8,
            },
            Kind::ListBytes { utf8, dtype } => ColumnLayout::ListBytes {
                values: buffer(*dtype, vec![self.values.len() / dtype.size()], &self.values),
                offsets: buffer(DType::I64, vec![rows + 1], offsets_bytes()),
                // SAFETY: any `i64` is 8 initialised bytes; `u8` has alignment 1.
                value_offsets: buffer(DType::I64, vec![self.items.len()], unsafe {
                    self.items.align_to::<u8>().1
                }),
                utf8: *utf8,
            },
        };
        let validity = self
            .validity
            .as_ref()
            .map(|v| buffer(DType::U8, vec![rows], v));
        (
            Column {
                name: self.name.clone(),
                layout,
                validity,
            },
            copies,
        )
    }
}
