//! Decoding on threads: check each fetched column chunk against its checksum,
//! then decode the row group's projected columns (Parquet + zstd to Arrow).

use std::sync::Arc;

use arrow_array::RecordBatch;
use bytes::{Buf, Bytes};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::errors::ParquetError;
use parquet::file::metadata::RowGroupMetaData;
use parquet::file::reader::{ChunkReader, Length};
use shardfeed_format::ShardEntry;

use crate::pages::{self, FixedLeaf, fixed_leaf};
use crate::plan::Segment;
use crate::shard::{ShardFooter, check_chunk};
use crate::{LoaderError, Result};

/// A shard's checked footer, ready for decoding.
pub(crate) struct FooterInfo {
    pub footer: ShardFooter,
    pub arrow: ArrowReaderMetadata,
}

/// The fetched column chunks of one segment's row group.
pub(crate) struct Fetched {
    pub seq: u64,
    pub segment: Segment,
    pub footer: Arc<FooterInfo>,
    /// `(leaf column, file offset, bytes)`, one per projected column chunk.
    pub chunks: Vec<(usize, u64, Bytes)>,
    /// Whether the chunks are slices of a memory-mapped local file.
    pub mapped: bool,
}

/// A range of a memory-mapped shard whose pages leave this process's
/// resident set (they stay in the page cache) once nothing refers to it:
/// when a row group is decoded, or, where decoded arrays point into
/// uncompressed pages, when those arrays are dropped. RSS then follows the
/// configured budget rather than the dataset size.
struct MappedRun {
    start: usize,
    end: usize,
    /// Keeps the mapping alive until the range is released.
    _mapping: Bytes,
}

impl Drop for MappedRun {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        {
            let page = 4096usize;
            let aligned = self.start & !(page - 1);
            let len = self.end.next_multiple_of(page) - aligned;
            // SAFETY: the range lies within a read-only private file mapping
            // that `_mapping` keeps alive (a run spans chunks of one mapping:
            // their addresses are as far apart as their file offsets);
            // MADV_DONTNEED on it only drops page table entries, and later
            // reads fault the same file contents back in.
            unsafe {
                libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_DONTNEED);
            }
        }
    }
}

/// A chunk of a [`MappedRun`]: its bytes, and a share of the run.
struct MappedChunk {
    bytes: Bytes,
    _run: Arc<MappedRun>,
}

impl AsRef<[u8]> for MappedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Memory-mapped `chunks` (sorted by file offset) as bytes that release
/// their pages once the last reference to them is dropped (see
/// [`MappedRun`]). Chunks lying end to end in one mapping share one release:
/// each `madvise` call interrupts the other cores running this process (TLB
/// shootdown), and a row group's column chunks usually lie end to end.
fn release_when_dropped(chunks: Vec<(u64, Bytes)>) -> Vec<(u64, Bytes)> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut i = 0;
    while i < chunks.len() {
        let (run_offset, first) = &chunks[i];
        let run_start = first.as_ptr() as usize;
        let mut run_end = run_start + first.len();
        let mut j = i + 1;
        while j < chunks.len() {
            let (offset, bytes) = &chunks[j];
            let start = bytes.as_ptr() as usize;
            if start < run_end || (start - run_start) as u64 != offset - run_offset {
                break;
            }
            run_end = start + bytes.len();
            j += 1;
        }
        let run = Arc::new(MappedRun {
            start: run_start,
            end: run_end,
            _mapping: first.clone(),
        });
        for (offset, bytes) in chunks[i..j].iter().cloned() {
            let chunk = MappedChunk {
                bytes,
                _run: run.clone(),
            };
            out.push((offset, Bytes::from_owner(chunk)));
        }
        i = j;
    }
    out
}

/// The byte ranges of a file that were fetched; reads outside them are errors.
#[derive(Clone)]
struct SparseFile {
    len: u64,
    chunks: Vec<(u64, Bytes)>,
}

impl SparseFile {
    fn find(&self, start: u64, length: u64) -> parquet::errors::Result<Bytes> {
        let i = self.chunks.partition_point(|(s, _)| *s <= start);
        if i > 0 {
            let (s, bytes) = &self.chunks[i - 1];
            let offset = (start - s) as usize;
            if offset as u64 + length <= bytes.len() as u64 {
                return Ok(bytes.slice(offset..offset + length as usize));
            }
        }
        Err(ParquetError::General(format!(
            "bytes {start}..{} were not fetched",
            start + length
        )))
    }
}

impl Length for SparseFile {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for SparseFile {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let i = self.chunks.partition_point(|(s, _)| *s <= start);
        if i == 0 {
            return Err(ParquetError::General(format!(
                "byte {start} was not fetched"
            )));
        }
        let (s, bytes) = &self.chunks[i - 1];
        let offset = (start - s) as usize;
        if offset >= bytes.len() {
            return Err(ParquetError::General(format!(
                "byte {start} was not fetched"
            )));
        }
        Ok(bytes.slice(offset..).reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.find(start, length as u64)
    }
}

/// Leaf columns under the projected top-level `roots`, and the mask.
pub(crate) fn projection(
    arrow: &ArrowReaderMetadata,
    roots: &[usize],
) -> (Vec<usize>, ProjectionMask) {
    let descr = arrow.metadata().file_metadata().schema_descr();
    let leaves = (0..descr.num_columns())
        .filter(|&i| roots.contains(&descr.get_column_root_idx(i)))
        .collect();
    (leaves, ProjectionMask::roots(descr, roots.iter().copied()))
}

/// Check and decode one fetched segment into a batch of its rows.
/// Uncompressed bytes per decoded batch: large enough to amortise per-batch
/// work, small enough that the decoder's growing buffers stay in the
/// allocator's reusable sizes (a whole row group in one batch made it grow
/// buffers by doubling, copying and page-faulting fresh memory each time).
const DECODE_BATCH_BYTES: u64 = 1 << 20;

/// Check and decode a fetched segment: its rows, as one or more batches.
pub(crate) fn decode(
    fetched: Fetched,
    entry: &ShardEntry,
    roots: &[usize],
) -> Result<Vec<RecordBatch>> {
    let Fetched {
        segment,
        footer,
        chunks,
        mapped,
        ..
    } = fetched;
    let rg = segment.row_group as usize;
    for (leaf, _, bytes) in &chunks {
        check_chunk(entry, &footer.footer, rg, *leaf, bytes)?;
    }
    let decode_err = |source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group: Some(rg),
        source,
    };
    let (_, mask) = projection(&footer.arrow, roots);
    let meta = footer.footer.metadata.row_group(rg);
    let projected_bytes: u64 = chunks
        .iter()
        .map(|(leaf, _, _)| meta.column(*leaf).uncompressed_size().max(0) as u64)
        .sum();
    let mut sorted: Vec<(u64, Bytes)> =
        chunks.into_iter().map(|(_, start, b)| (start, b)).collect();
    sorted.sort_by_key(|(s, _)| *s);
    if mapped {
        sorted = release_when_dropped(sorted);
    }
    let file = SparseFile {
        len: entry.bytes,
        chunks: sorted,
    };
    let rows = meta.num_rows() as usize;
    let custom: Vec<(usize, Custom)> = roots
        .iter()
        .filter_map(|&root| custom_leaf(&footer.arrow, meta, root).map(|c| (root, c)))
        .collect();
    let decoded = if custom.is_empty() {
        let batch_rows = ((rows as u64 * DECODE_BATCH_BYTES) / projected_bytes.max(1))
            .clamp(1, rows.max(1) as u64) as usize;
        arrow_batches(file, &footer.arrow, mask, rg, batch_rows).map_err(decode_err)?
    } else {
        vec![decode_custom(
            Arc::new(file),
            &footer.arrow,
            rg,
            roots,
            &custom,
            &decode_err,
        )?]
    };
    // Keep the segment's rows [start, end) of the row group.
    let (start, end) = (segment.start as usize, segment.end as usize);
    let mut out = Vec::new();
    let mut at = 0usize;
    for batch in decoded {
        let n = batch.num_rows();
        let (lo, hi) = (start.max(at), end.min(at + n));
        if lo < hi {
            out.push(if lo == at && hi == at + n {
                batch
            } else {
                batch.slice(lo - at, hi - lo)
            });
        }
        at += n;
    }
    if at != rows {
        return Err(LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: Some(rg),
            detail: format!("decoded {at} rows, the footer says {rows}"),
        });
    }
    Ok(out)
}

/// Row group `rg`'s `mask` columns through parquet's Arrow reader, in
/// batches of `batch_rows` rows.
fn arrow_batches(
    file: SparseFile,
    arrow: &ArrowReaderMetadata,
    mask: ProjectionMask,
    rg: usize,
    batch_rows: usize,
) -> parquet::errors::Result<Vec<RecordBatch>> {
    ParquetRecordBatchReaderBuilder::new_with_metadata(file, arrow.clone())
        .with_projection(mask)
        .with_row_groups(vec![rg])
        .with_batch_size(batch_rows.max(1))
        .build()?
        .map(|b| b.map_err(ParquetError::from))
        .collect()
}

/// A column decoded by this crate's own page decoders instead of parquet's
/// Arrow reader.
#[derive(Clone, Copy)]
enum Custom {
    /// A required list of required int32 (leaf column), from its levels.
    List(usize),
    /// A flat fixed-width column (required or nullable), dictionary kept.
    Fixed(FixedLeaf),
    /// A flat binary or string column (leaf, utf8), as views of its pages.
    Bytes(usize, bool),
}

/// How root column `root` of row group `meta` is decoded, when not by the
/// Arrow reader.
fn custom_leaf(
    arrow: &ArrowReaderMetadata,
    meta: &RowGroupMetaData,
    root: usize,
) -> Option<Custom> {
    if let Some(leaf) = level_list_leaf(arrow, root) {
        return Some(Custom::List(leaf));
    }
    if let Some((leaf, utf8)) = pages::bytes_leaf(arrow, root) {
        return pages::supported(meta.column(leaf)).then_some(Custom::Bytes(leaf, utf8));
    }
    fixed_leaf(arrow, root)
        .filter(|f| pages::supported(meta.column(f.leaf)))
        .map(Custom::Fixed)
}

/// The leaf of root column `root` when it is a required list of required
/// int32 (token ids): one leaf, repetition and definition levels at most 1.
/// Such columns are decoded by [`decode_list`].
fn level_list_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<usize> {
    let leaf = pages::single_leaf(arrow, root)?;
    let column = arrow.metadata().file_metadata().schema_descr().column(leaf);
    let field = arrow.schema().fields().get(root)?;
    let list_of_i32 = matches!(
        field.data_type(),
        arrow_schema::DataType::List(item) if item.data_type() == &arrow_schema::DataType::Int32
    );
    (list_of_i32
        && column.physical_type() == parquet::basic::Type::INT32
        && column.max_rep_level() == 1
        && column.max_def_level() == 1)
        .then_some(leaf)
}

/// Decode row group `rg` with the `custom` columns (root, how) read by this
/// crate's page decoders; the other projected columns go through the Arrow
/// reader.
fn decode_custom(
    file: Arc<SparseFile>,
    arrow: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    custom: &[(usize, Custom)],
    decode_err: &dyn Fn(ParquetError) -> LoaderError,
) -> Result<RecordBatch> {
    let metadata = arrow.metadata();
    let meta = metadata.row_group(rg);
    let descr = metadata.file_metadata().schema_descr();
    let rows = meta.num_rows() as usize;
    let position = |root: usize| {
        roots
            .iter()
            .position(|&r| r == root)
            .expect("a projected root")
    };
    let mut columns: Vec<Option<arrow_array::ArrayRef>> = vec![None; roots.len()];
    for &(root, how) in custom {
        let data_type = arrow.schema().field(root).data_type();
        let array = match how {
            Custom::List(leaf) if pages::supported(meta.column(leaf)) => {
                pages::decode_list_i32(file.clone(), meta.column(leaf), rows, data_type)
            }
            Custom::List(leaf) => decode_list(file.clone(), arrow, rg, leaf, data_type),
            Custom::Bytes(leaf, utf8) => {
                pages::decode_bytes(file.clone(), meta.column(leaf), rows, utf8)
            }
            Custom::Fixed(fixed) => pages::decode_fixed(
                file.clone(),
                meta.column(fixed.leaf),
                &fixed,
                rows,
                data_type,
            ),
        }
        .map_err(decode_err)?;
        columns[position(root)] = Some(array);
    }
    let others: Vec<usize> = roots
        .iter()
        .copied()
        .filter(|r| !custom.iter().any(|(root, _)| root == r))
        .collect();
    if !others.is_empty() {
        let mask = ProjectionMask::roots(descr, others.iter().copied());
        let batches = arrow_batches((*file).clone(), arrow, mask, rg, rows).map_err(decode_err)?;
        let other_schema = Arc::new(
            arrow
                .schema()
                .project(&others)
                .map_err(|e| decode_err(e.into()))?,
        );
        let batch = arrow_select::concat::concat_batches(&other_schema, &batches)
            .map_err(|e| decode_err(e.into()))?;
        for (i, root) in others.iter().enumerate() {
            columns[position(*root)] = Some(batch.column(i).clone());
        }
    }
    let columns: Vec<_> = columns
        .into_iter()
        .map(|c| c.expect("every column decoded"))
        .collect();
    // Dictionary-kept columns differ in type from the dataset's schema.
    let fields: Vec<arrow_schema::Field> = roots
        .iter()
        .zip(&columns)
        .map(|(&root, c)| {
            arrow
                .schema()
                .field(root)
                .clone()
                .with_data_type(c.data_type().clone())
        })
        .collect();
    let schema = Arc::new(arrow_schema::Schema::new(fields));
    RecordBatch::try_new(schema, columns).map_err(|e| decode_err(e.into()))
}

/// Decode list column `leaf` of row group `rg` straight from its levels and
/// values into one exactly-sized buffer (parquet's generic list reader grows
/// buffers and walks levels per value several times).
fn decode_list(
    file: Arc<SparseFile>,
    arrow: &ArrowReaderMetadata,
    rg: usize,
    leaf: usize,
    data_type: &arrow_schema::DataType,
) -> parquet::errors::Result<arrow_array::ArrayRef> {
    use parquet::column::reader::ColumnReaderImpl;
    use parquet::data_type::Int32Type;
    use parquet::file::serialized_reader::SerializedPageReader;

    let metadata = arrow.metadata();
    let meta = metadata.row_group(rg);
    let descr = metadata.file_metadata().schema_descr();
    let rows = meta.num_rows() as usize;
    let chunk = meta.column(leaf);
    let pages = SerializedPageReader::new(file, chunk, rows, None)?;
    let mut reader = ColumnReaderImpl::<Int32Type>::new(descr.column(leaf), Box::new(pages));
    let levels = chunk.num_values().max(0) as usize;
    let mut def: Vec<i16> = Vec::with_capacity(levels);
    let mut rep: Vec<i16> = Vec::with_capacity(levels);
    let mut values: Vec<i32> = Vec::with_capacity(levels);
    let mut records = 0;
    while records < rows {
        let (read, _, levels_read) =
            reader.read_records(rows - records, Some(&mut def), Some(&mut rep), &mut values)?;
        if read == 0 && levels_read == 0 {
            break;
        }
        records += read;
    }
    let mut offsets: Vec<i32> = Vec::with_capacity(rows + 1);
    let mut count = 0i32;
    for (&d, &r) in def.iter().zip(&rep) {
        if r == 0 {
            offsets.push(count);
        }
        count += i32::from(d == 1);
    }
    offsets.push(count);
    if offsets.len() != rows + 1 || count as usize != values.len() {
        return Err(ParquetError::General(format!(
            "column {} holds {} rows and {} values for {} levels; the footer says {rows} rows",
            descr.column(leaf).path(),
            offsets.len() - 1,
            values.len(),
            def.len()
        )));
    }
    let arrow_schema::DataType::List(item) = data_type.clone() else {
        unreachable!("checked by level_list_leaf");
    };
    let list = arrow_array::ListArray::try_new(
        item,
        arrow_buffer::OffsetBuffer::new(arrow_buffer::ScalarBuffer::from(offsets)),
        Arc::new(arrow_array::Int32Array::from(values)),
        None,
    )?;
    Ok(Arc::new(list))
}
