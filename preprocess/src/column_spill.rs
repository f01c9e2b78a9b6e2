//! Shuffle buckets of fixed-width columns, kept as raw column bytes.
//!
//! A table whose every column is fixed-width (integers, floats, dates,
//! timestamps, decimals) or boolean, nullable or not, is scattered without Arrow batches
//! in between: each row's values are copied straight from the input batch
//! into its bucket's buffer for that column (one buffer a column, reused
//! after every flush), a full bucket is appended to its file as those bytes
//! as they are, and the gather takes each column in its permuted order
//! from the mapped file. Against bucket parts made with `take`, concatenated,
//! written as Arrow IPC (one more copy in its encoder), mapped back and
//! concatenated again: the scatter's two copies become one, the encoder's
//! goes, the gather's concatenation is made in one small buffer reused by
//! every column, and the parts take no fresh memory
//! (docs/performance-notes.md).
//!
//! A bucket file is its flushes one after another; a flush is, for each
//! column in schema order, the column's values (`rows * width` bytes; a
//! byte a boolean) and,
//! for a nullable column, one byte a row (1 valid, 0 null). The rows of each
//! flush are kept in memory, not in the file: the file is this process's own
//! and its length is checked against them before it is read.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch, make_array};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};
#[cfg(test)]
use std::sync::Arc;

use crate::{PreprocessError, Result};

/// The columns of a schema that can be spilled as raw bytes.
pub(crate) struct Layout {
    schema: SchemaRef,
    /// Bytes a value of each column.
    widths: Vec<usize>,
    /// Whether each column may hold nulls (then it has a validity byte a row).
    nullable: Vec<bool>,
    /// Whether each column is boolean (bits in Arrow, a byte a row here).
    boolean: Vec<bool>,
}

impl Layout {
    /// The layout of `schema`, where every column is fixed-width.
    pub(crate) fn of(schema: &SchemaRef) -> Option<Layout> {
        let mut widths = Vec::with_capacity(schema.fields().len());
        let mut nullable = Vec::with_capacity(schema.fields().len());
        let mut boolean = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            // Integers, floats, dates, times, decimals: one buffer of
            // values; booleans: a byte each. Strings, lists and the rest
            // take the Arrow path.
            let is_bool = field.data_type() == &DataType::Boolean;
            let width = if is_bool {
                1
            } else {
                field.data_type().primitive_width()?
            };
            widths.push(width);
            nullable.push(field.is_nullable());
            boolean.push(is_bool);
        }
        if widths.is_empty() {
            return None;
        }
        Some(Layout {
            schema: schema.clone(),
            widths,
            nullable,
            boolean,
        })
    }

    /// Bytes a row takes in a bucket (values and validity bytes).
    pub(crate) fn row_bytes(&self) -> u64 {
        let values: usize = self.widths.iter().sum();
        (values + self.nullable.iter().filter(|n| **n).count()) as u64
    }
}

/// One bucket's rows not yet written: a byte buffer a column.
#[derive(Default)]
pub(crate) struct Pending {
    values: Vec<Vec<u8>>,
    valid: Vec<Vec<u8>>,
    rows: usize,
    /// Rows its buffers are made for at once (they never grow by doubling:
    /// fresh memory costs more than the copy).
    capacity_rows: usize,
}

impl Pending {
    /// Buffers for about `rows` rows, allocated as they are first used.
    pub(crate) fn new(rows: usize) -> Pending {
        Pending {
            capacity_rows: rows,
            ..Pending::default()
        }
    }

    /// Rows held.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Empty it, keeping its buffers' capacity.
    pub(crate) fn clear(&mut self) {
        self.values.iter_mut().for_each(Vec::clear);
        self.valid.iter_mut().for_each(Vec::clear);
        self.rows = 0;
    }

    /// Append its bytes to the bucket file at `path` (small columns are
    /// gathered into larger writes; large ones are written as they are:
    /// one vectored write of the whole flush was slower). A new file gets
    /// `reserve` bytes of disk reserved ([`crate::writer::preallocate`]:
    /// ext4 then maps no blocks page by page as the flushes come; what is
    /// not used goes with the file).
    pub(crate) fn append_to(&self, path: &Path, reserve: u64) -> Result<()> {
        let io = |e: std::io::Error| PreprocessError::io("write", path, e);
        let file = open_append(path)?;
        if reserve > 0 && file.metadata().map_err(io)?.len() == 0 {
            crate::writer::preallocate(&file, reserve);
        }
        let mut out = BufWriter::with_capacity(64 << 10, file);
        for (c, values) in self.values.iter().enumerate() {
            out.write_all(values).map_err(io)?;
            if let Some(valid) = self.valid.get(c).filter(|v| !v.is_empty()) {
                out.write_all(valid).map_err(io)?;
            }
        }
        out.flush().map_err(io)
    }
}

/// Open a bucket file to append to, creating it if it is new.
pub(crate) fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| PreprocessError::io("write", path, e))
}

/// Copy the rows of `batch` listed in `targets[b]` to `buckets[b]`, column
/// by column (the input column stays in the caches while every bucket
/// takes its rows). A batch whose columns are not of the layout's types, or
/// has nulls where the layout keeps none, is an error (its bytes would be
/// read at the wrong width, its nulls lost).
pub(crate) fn scatter_batch(
    layout: &Layout,
    batch: &RecordBatch,
    targets: &[Vec<u32>],
    buckets: &mut [&mut Pending],
) -> Result<()> {
    let fields = layout.schema.fields();
    if batch.num_columns() != fields.len()
        || batch
            .columns()
            .iter()
            .zip(fields.iter())
            .any(|(column, field)| {
                column.data_type() != field.data_type()
                    || (!field.is_nullable() && column.null_count() > 0)
            })
    {
        return Err(PreprocessError::read(
            "(shuffle bucket)",
            None,
            format!(
                "a batch of schema {:?} scattered as {:?}",
                batch.schema(),
                layout.schema
            ),
        ));
    }
    for pending in buckets.iter_mut() {
        pending.values.resize_with(layout.widths.len(), Vec::new);
        pending.valid.resize_with(layout.widths.len(), Vec::new);
    }
    for (c, column) in batch.columns().iter().enumerate() {
        let data = column.to_data();
        let width = layout.widths[c];
        let bits = layout.boolean[c].then(|| column.as_boolean().values());
        let values = match bits {
            Some(_) => &[][..],
            None => &data.buffers()[0].as_slice()[data.offset() * width..],
        };
        let nulls = data.nulls();
        for (indices, pending) in targets.iter().zip(buckets.iter_mut()) {
            if indices.is_empty() {
                continue;
            }
            let wanted = pending.rows.max(pending.capacity_rows) + indices.len();
            let out = &mut pending.values[c];
            if out.capacity() < out.len() + indices.len() * width {
                out.reserve_exact(wanted * width - out.len());
            }
            match bits {
                Some(bits) => out.extend(indices.iter().map(|&i| u8::from(bits.value(i as usize)))),
                None => gather(values, indices, width, out),
            }
            if layout.nullable[c] {
                let valid = &mut pending.valid[c];
                if valid.capacity() < valid.len() + indices.len() {
                    valid.reserve_exact(wanted - valid.len());
                }
                match nulls {
                    Some(nulls) => valid.extend(
                        indices
                            .iter()
                            .map(|&i| u8::from(nulls.is_valid(i as usize))),
                    ),
                    None => valid.resize(valid.len() + indices.len(), 1),
                }
            }
        }
    }
    for (indices, pending) in targets.iter().zip(buckets.iter_mut()) {
        pending.rows += indices.len();
    }
    Ok(())
}

/// Append `src`'s values at `indices` (values of `width` bytes) to `out`.
fn gather(src: &[u8], indices: &[u32], width: usize, out: &mut Vec<u8>) {
    match width {
        1 => gather_into::<1>(src, indices, out),
        2 => gather_into::<2>(src, indices, out),
        4 => gather_into::<4>(src, indices, out),
        8 => gather_into::<8>(src, indices, out),
        16 => gather_into::<16>(src, indices, out),
        32 => gather_into::<32>(src, indices, out),
        w => {
            for &i in indices {
                let at = i as usize * w;
                out.extend_from_slice(&src[at..at + w]);
            }
        }
    }
}

/// Append `src`'s values at `indices` (values of `W` bytes) to `out`,
/// written once into its spare capacity (not zeroed first: the zeroing
/// was 3% of a shuffled table's CPU, every byte of it written again).
fn gather_into<const W: usize>(src: &[u8], indices: &[u32], out: &mut Vec<u8>) {
    let (src, _) = src.as_chunks::<W>();
    let bytes = indices.len() * W;
    out.reserve(bytes);
    let start = out.len();
    let (dst, _) = out.spare_capacity_mut()[..bytes].as_chunks_mut::<W>();
    // `dst` is exactly one chunk an index.
    for (d, &i) in dst.iter_mut().zip(indices) {
        *d = src[i as usize].map(std::mem::MaybeUninit::new);
    }
    // SAFETY: the loop wrote every one of the `bytes` bytes past `start`
    // (`dst` is `indices.len()` chunks of `W`, each assigned; an index out
    // of `src` panics before this line), and `reserve` made them capacity.
    unsafe { out.set_len(start + bytes) };
}

/// `parts` as one slice: the one part itself, or all of them copied into
/// `scratch`.
fn joined<'a>(parts: &[&'a [u8]], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    if let [one] = parts {
        return one;
    }
    scratch.clear();
    parts
        .iter()
        .for_each(|part| scratch.extend_from_slice(part));
    scratch
}

/// Where a bucket's bytes are.
pub(crate) enum Source<'a> {
    /// Never written: the one flush is still in memory.
    Memory(&'a Pending),
    /// A bucket file's bytes, the rows of each flush in it, and its path.
    File(&'a [u8], &'a [usize], &'a Path),
}

impl Source<'_> {
    /// Rows in the bucket.
    pub(crate) fn rows(&self) -> u64 {
        match self {
            Source::Memory(pending) => pending.rows as u64,
            Source::File(_, flushes, _) => flushes.iter().map(|&r| r as u64).sum(),
        }
    }
}

/// The bucket's rows in `order` (a permutation of them) as one batch, its
/// columns shared among `workers` threads (this one and `workers - 1`
/// helpers; a panic on one resumes here).
pub(crate) fn take(
    layout: &Layout,
    source: Source<'_>,
    order: &[u32],
    workers: usize,
) -> Result<RecordBatch> {
    let path = match source {
        Source::Memory(_) => Path::new("(shuffle bucket)"),
        Source::File(_, _, path) => path,
    };
    let corrupt = |what: String| PreprocessError::read(path, None, what);
    let n = order.len();
    // Per column, the byte ranges of its values and validity in each flush.
    let columns = layout.widths.len();
    let mut values: Vec<Vec<&[u8]>> = vec![Vec::new(); columns];
    let mut valid: Vec<Vec<&[u8]>> = vec![Vec::new(); columns];
    match source {
        Source::Memory(pending) => {
            for c in 0..columns {
                values[c].push(pending.values.get(c).map_or(&[][..], Vec::as_slice));
                valid[c].push(pending.valid.get(c).map_or(&[][..], Vec::as_slice));
            }
            if pending.rows != n {
                return Err(corrupt(format!(
                    "a bucket of {} rows permuted as {n}",
                    pending.rows
                )));
            }
        }
        Source::File(bytes, flushes, _) => {
            let mut at = 0usize;
            let mut total = 0usize;
            let mut cut = |len: usize| -> Result<&[u8]> {
                let end = at
                    .checked_add(len)
                    .filter(|&end| end <= bytes.len())
                    .ok_or_else(|| corrupt(format!("bucket file shorter than its {n} rows")))?;
                let slice = &bytes[at..end];
                at = end;
                Ok(slice)
            };
            for &rows in flushes {
                total = total
                    .checked_add(rows)
                    .ok_or_else(|| corrupt("bucket row count overflows".into()))?;
                for c in 0..columns {
                    let len = rows
                        .checked_mul(layout.widths[c])
                        .ok_or_else(|| corrupt("bucket size overflows".into()))?;
                    values[c].push(cut(len)?);
                    if layout.nullable[c] {
                        valid[c].push(cut(rows)?);
                    }
                }
            }
            if at != bytes.len() || total != n {
                return Err(corrupt(format!(
                    "bucket file of {} bytes, {total} rows, read as {at} bytes, {n} rows",
                    bytes.len()
                )));
            }
        }
    }
    // Every index below is a row of a column of exactly `n` values.
    for c in 0..columns {
        let sum = |parts: &[&[u8]]| parts.iter().map(|p| p.len()).sum::<usize>();
        let want_valid = if layout.nullable[c] { n } else { 0 };
        if Some(sum(&values[c])) != n.checked_mul(layout.widths[c]) || sum(&valid[c]) != want_valid
        {
            return Err(corrupt(format!(
                "column {c} of a bucket of {n} rows holds {} bytes",
                sum(&values[c])
            )));
        }
    }
    // A column of more than one flush is made one first, in scratch
    // buffers reused by every column a thread takes (hot in the caches),
    // then taken from.
    thread_local! {
        static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<u8>)> = Default::default();
    }
    let column = |c: usize| -> Result<ArrayRef> {
        SCRATCH.with_borrow_mut(|(scratch, scratch_valid)| {
            let width = layout.widths[c];
            let src = joined(&values[c], scratch);
            let buffer = if layout.boolean[c] {
                BooleanBuffer::collect_bool(n, |k| src[order[k] as usize] != 0).into_inner()
            } else {
                let mut out = Vec::with_capacity(n * width);
                gather(src, order, width, &mut out);
                Buffer::from_vec(out)
            };
            let nulls = if layout.nullable[c] {
                let v = joined(&valid[c], scratch_valid);
                let bits = BooleanBuffer::collect_bool(n, |k| v[order[k] as usize] != 0);
                Some(NullBuffer::new(bits)).filter(|nulls| nulls.null_count() > 0)
            } else {
                None
            };
            let data = ArrayData::builder(layout.schema.field(c).data_type().clone())
                .len(n)
                .add_buffer(buffer)
                .nulls(nulls)
                .build()
                .map_err(|e| PreprocessError::read(path, None, e))?;
            Ok(make_array(data))
        })
    };
    let arrays = shardfeed_format::share::share_out(
        (0..columns).collect(),
        workers,
        "shardfeed-gather",
        &column,
        &|| (),
    )
    .into_iter()
    .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(layout.schema.clone(), arrays)
        .map_err(|e| PreprocessError::read(path, None, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Int64Array;
    use arrow_schema::{Field, Schema};

    /// A bucket file whose length does not match its rows is an error
    /// naming it, never a read past its end.
    #[test]
    fn a_bucket_file_of_the_wrong_length_is_an_error() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let layout = Layout::of(&schema).unwrap();
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![Some(1), None, Some(3)]))],
        )
        .unwrap();
        let mut pending = Pending::new(3);
        scatter_batch(&layout, &batch, &[vec![2, 0, 1]], &mut [&mut pending]).unwrap();
        // A batch of another type is refused, not read at the wrong width.
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, true)])),
            vec![Arc::new(arrow_array::Int32Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let mut unused = Pending::new(3);
        assert!(scatter_batch(&layout, &other, &[vec![0]], &mut [&mut unused]).is_err());
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("bucket");
        pending.append_to(&path, 0).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 3 * layout.row_bytes());
        let got = take(&layout, Source::File(&bytes, &[3], &path), &[1, 2, 0], 1).unwrap();
        let want = Int64Array::from(vec![Some(1), None, Some(3)]);
        assert_eq!(got.column(0).as_ref(), &want as &dyn arrow_array::Array);
        for (len, flushes) in [
            (bytes.len() - 1, vec![3]),
            (bytes.len(), vec![2]),
            (0, vec![3]),
        ] {
            let err = take(
                &layout,
                Source::File(&bytes[..len], &flushes, &path),
                &[0],
                1,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("bucket"), "{err}");
        }
    }

    /// Disk reserved for a new bucket file changes neither its length nor
    /// where the next flush lands: the flushes follow one another from its
    /// start, and the length check above still holds.
    #[test]
    fn a_reserved_bucket_file_holds_its_flushes_and_only_them() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let layout = Layout::of(&schema).unwrap();
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("bucket");
        let reserve = 1u64 << 20;
        let mut flushes = Vec::new();
        for values in [vec![1i64, 2, 3], vec![4, 5]] {
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(values.clone()))],
            )
            .unwrap();
            let mut pending = Pending::new(values.len());
            let order: Vec<u32> = (0..values.len() as u32).collect();
            scatter_batch(&layout, &batch, &[order], &mut [&mut pending]).unwrap();
            pending.append_to(&path, reserve).unwrap();
            flushes.push(values.len());
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 5 * layout.row_bytes());
        let got = take(
            &layout,
            Source::File(&bytes, &flushes, &path),
            &[4, 0, 3, 1, 2],
            1,
        )
        .unwrap();
        let want = Int64Array::from(vec![5, 1, 4, 2, 3]);
        assert_eq!(got.column(0).as_ref(), &want as &dyn arrow_array::Array);
        // Where the file system reserves (a probe file says), the bucket's
        // blocks cover the reservation.
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::MetadataExt;
            let probe = std::fs::File::create(temp.path().join("probe")).unwrap();
            if crate::writer::preallocate(&probe, reserve) {
                let meta = std::fs::metadata(&path).unwrap();
                assert!(meta.blocks() * 512 >= reserve, "{} blocks", meta.blocks());
            }
        }
    }
}
