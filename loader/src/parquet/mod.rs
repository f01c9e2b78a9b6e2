//! The loader's own Parquet reader, for the column shapes training data is
//! made of; every other column goes through parquet's Arrow reader.
//!
//! This module depends on `parquet` and the arrow crates only, never on the
//! rest of the loader. It is laid out by layer:
//!
//! | module | layer |
//! |---|---|
//! | `shardfeed_format::thrift` | page headers (Thrift compact protocol) |
//! | [`page`] | a chunk's pages: headers, bodies, zstd, level/value split |
//! | [`rle`], [`bitpack`] | RLE / bit-packed hybrid keys and levels; bit unpacking |
//! | [`delta`] | `DELTA_BINARY_PACKED` integers |
//! | [`levels`] | definition levels of flat nullable columns |
//! | [`fixed`], [`list`], [`binary`] | value decoders into Arrow arrays |
//! | [`sparse`] | the fetched byte ranges of a shard, as parquet's `ChunkReader` |
//! | [`pagemap`] | where a chunk's pages start and which rows they hold, to read a part of a large row group |
//! | [`error`] | what was wrong and where ([`error::DecodeError`]) |
//!
//! [`decode_row_group_at_least`] is the entry point for row groups read
//! whole, [`decode_part`] for parts of large ones (tests also use
//! [`decode_row_group`], which keeps exactly the rows asked). Which path decodes a column
//! chunk is decided by [`column_path`] from this table alone:
//!
//! | column (Arrow type, Parquet levels) | chunk's encodings | path |
//! |---|---|---|
//! | `list` or `large_list` of int8..uint64 items stored as INT32/INT64, the list and its items required or nullable (rep 1, def 1 to 3) | PLAIN, RLE, (PLAIN\|RLE)_DICTIONARY | [`ColumnPath::List`] |
//! | int8..uint64, float32/64 stored as INT32/INT64/FLOAT/DOUBLE, flat, required or nullable | same, and DELTA_BINARY_PACKED for INT32/INT64 | [`ColumnPath::Fixed`] |
//! | binary, string (also large), flat BYTE_ARRAY, required or nullable | same | [`ColumnPath::Bytes`] |
//! | anything else (nested, structs, decimals, booleans, ...), or other encodings (other DELTA_*, BYTE_STREAM_SPLIT, BIT_PACKED levels) | any | [`ColumnPath::Arrow`] |
//!
//! Pages of zstd and uncompressed chunks are read here ([`page`]); chunks
//! of other codecs keep the own value decoders over parquet's page reader.
//!
//! Every count, size and offset in a footer or page is untrusted: checked
//! arithmetic before it sizes an allocation or a slice, no output larger than
//! [`Limits::max_bytes`], and each `unsafe` block states its invariant where
//! it is checked, in the same module.

mod binary;
mod bitpack;
mod delta;
mod fixed;
mod levels;
mod list;
mod page;
pub(crate) mod pagemap;
mod rle;
mod sparse;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use parquet::basic::Encoding;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{ColumnChunkMetaData, RowGroupMetaData};
use parquet::file::reader::ChunkReader;
use serde::{Deserialize, Serialize};

pub(crate) use sparse::SparseFile;

mod error;
use error::DecodeError;

/// Bounds on what decoding one row group may produce.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// No column of a row group decodes to more bytes than this (the
    /// loader's byte budget), and no page decompresses to more.
    pub max_bytes: usize,
}

impl Limits {
    /// The limits of a loader whose byte budget is `byte_budget`.
    pub(crate) fn of_budget(byte_budget: u64) -> Self {
        Limits {
            max_bytes: usize::try_from(byte_budget).unwrap_or(usize::MAX),
        }
    }

    /// Check that `count` items of `width` bytes fit [`Limits::max_bytes`].
    fn check(&self, count: usize, width: usize, column: &str) -> Result<()> {
        match count.checked_mul(width) {
            Some(bytes) if bytes <= self.max_bytes => Ok(()),
            _ => Err(DecodeError::OverBudget {
                column: column.to_string(),
                count,
                width,
                limit: self.max_bytes,
            }
            .into()),
        }
    }
}

/// The only leaf column under root column `root`, if it has exactly one.
fn single_leaf(arrow: &ArrowReaderMetadata, root: usize) -> Option<usize> {
    let descr = arrow.metadata().file_metadata().schema_descr();
    let mut leaves = (0..descr.num_columns()).filter(|&i| descr.get_column_root_idx(i) == root);
    let leaf = leaves.next()?;
    leaves.next().is_none().then_some(leaf)
}

/// Whether the own decoders read every encoding of `chunk`.
fn own_encodings(chunk: &ColumnChunkMetaData) -> bool {
    own_fixed_encodings(chunk, false)
}

/// Whether the own fixed-width decoder reads every encoding of `chunk`:
/// those of [`own_encodings`], and `DELTA_BINARY_PACKED` for `integer`
/// columns.
fn own_fixed_encodings(chunk: &ColumnChunkMetaData, integer: bool) -> bool {
    chunk.encodings().all(|e| {
        matches!(
            e,
            Encoding::PLAIN | Encoding::RLE | Encoding::RLE_DICTIONARY | Encoding::PLAIN_DICTIONARY
        ) || (integer && e == Encoding::DELTA_BINARY_PACKED)
    })
}

/// How one column chunk is decoded (see the table in the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ColumnPath {
    /// Own list decoder, leaf column index.
    List(usize),
    /// Own fixed-width decoder.
    Fixed(fixed::FixedLeaf),
    /// Own binary/string decoder: leaf column index, and whether UTF-8.
    Bytes(usize, bool),
    /// parquet's Arrow reader.
    Arrow,
}

/// The path of root column `root` in row group `meta`: the module's table.
pub(crate) fn column_path(
    arrow: &ArrowReaderMetadata,
    meta: &RowGroupMetaData,
    root: usize,
) -> ColumnPath {
    let own = |leaf: usize| own_encodings(meta.column(leaf));
    if let Some(leaf) = list::list_leaf(arrow, root) {
        return if own(leaf) {
            ColumnPath::List(leaf)
        } else {
            ColumnPath::Arrow
        };
    }
    if let Some((leaf, utf8)) = binary::bytes_leaf(arrow, root) {
        return if own(leaf) {
            ColumnPath::Bytes(leaf, utf8)
        } else {
            ColumnPath::Arrow
        };
    }
    match fixed::fixed_leaf(arrow, root) {
        Some(f) if own_fixed_encodings(meta.column(f.leaf), f.integer()) => ColumnPath::Fixed(f),
        _ => ColumnPath::Arrow,
    }
}

/// Column chunks decoded by each path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodePaths {
    /// List chunks (`list` or `large_list` of integers) decoded by the own list decoder.
    pub own_list: u64,
    /// Fixed-width chunks decoded by the own decoder.
    pub own_fixed: u64,
    /// Binary and string chunks decoded by the own decoder.
    pub own_bytes: u64,
    /// Chunks decoded by parquet's Arrow reader.
    pub parquet: u64,
}

impl DecodePaths {
    /// Add `other`'s counts.
    pub fn add(&mut self, other: &DecodePaths) {
        self.own_list += other.own_list;
        self.own_fixed += other.own_fixed;
        self.own_bytes += other.own_bytes;
        self.parquet += other.parquet;
    }

    /// Chunks decoded by the own decoders.
    pub fn own(&self) -> u64 {
        self.own_list + self.own_fixed + self.own_bytes
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

/// Uncompressed bytes per batch that parquet's Arrow reader decodes at once:
/// large enough to amortise per-batch work, small enough that its growing
/// buffers stay in the allocator's reusable sizes.
const ARROW_BATCH_BYTES: u64 = 1 << 20;

/// Decode the projected `roots` (top-level columns, sorted) of row group
/// `rg` of `file`, each column by the path [`column_path`] gives: one or
/// more batches holding the row group's first `want` rows (all of them when
/// `want` is `None` or not less; the own decoders then skip the pages after
/// them), and the paths taken. Columns whose own decoder keeps a dictionary
/// come back with a dictionary type instead of the file's type.
#[cfg(test)]
pub(crate) fn decode_row_group<R: ChunkReader + 'static>(
    file: Arc<R>,
    arrow: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    want: Option<usize>,
    limits: &Limits,
) -> Result<(Vec<RecordBatch>, DecodePaths)> {
    let (batches, paths) = decode_row_group_at_least(file, arrow, rg, roots, want, limits)?;
    let rows = arrow.metadata().row_group(rg).num_rows() as usize;
    Ok((prefix(batches, want.map_or(rows, |w| w.min(rows))), paths))
}

/// [`decode_row_group`], except that the batches hold every row decoded on
/// the way to the first `want`: the rows of the pages that cover them, as far
/// as every column got (at least `want`, at most the row group's).
pub(crate) fn decode_row_group_at_least<R: ChunkReader + 'static>(
    file: Arc<R>,
    arrow: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    want: Option<usize>,
    limits: &Limits,
) -> Result<(Vec<RecordBatch>, DecodePaths)> {
    let metadata = arrow.metadata();
    if rg >= metadata.num_row_groups() {
        return Err(DecodeError::RowGroup {
            row_group: rg,
            what: format!("the file has {}", metadata.num_row_groups()),
        }
        .into());
    }
    let meta = metadata.row_group(rg);
    let rows = usize::try_from(meta.num_rows()).map_err(|_| DecodeError::RowGroup {
        row_group: rg,
        what: format!("{} rows", meta.num_rows()),
    })?;
    let want = want.map_or(rows, |w| w.min(rows));
    let mut paths = DecodePaths::default();
    let chosen: Vec<(usize, ColumnPath)> = roots
        .iter()
        .map(|&root| (root, column_path(arrow, meta, root)))
        .collect();
    let (_, mask) = projection(arrow, roots);
    if chosen.iter().all(|(_, p)| *p == ColumnPath::Arrow) {
        paths.parquet += chosen.len() as u64;
        let (leaves, _) = projection(arrow, roots);
        let projected: u64 = leaves
            .iter()
            .map(|&leaf| meta.column(leaf).uncompressed_size().max(0) as u64)
            .sum();
        let batch_rows = ((rows as u64).saturating_mul(ARROW_BATCH_BYTES) / projected.max(1))
            .clamp(1, rows.max(1) as u64) as usize;
        let batches = arrow_batches(file, arrow, mask, roots, rg, batch_rows)?;
        let decoded: usize = batches.iter().map(|b| b.num_rows()).sum();
        if decoded != rows {
            return Err(DecodeError::Rows {
                column: None,
                decoded,
                footer: rows,
            }
            .into());
        }
        return Ok((batches, paths));
    }
    let mut chosen = chosen;
    let mut columns: Vec<Option<ArrayRef>> = vec![None; roots.len()];
    for i in 0..chosen.len() {
        let (root, path) = chosen[i];
        let data_type = arrow.schema().field(root).data_type();
        let decoded = match path {
            ColumnPath::List(leaf) => {
                paths.own_list += 1;
                list::decode_list(
                    file.clone(),
                    meta.column(leaf),
                    (rows, want),
                    data_type,
                    limits,
                )
            }
            ColumnPath::Bytes(leaf, utf8) => {
                paths.own_bytes += 1;
                binary::decode_bytes(file.clone(), meta.column(leaf), (rows, want), utf8, limits)
            }
            ColumnPath::Fixed(leaf) => {
                paths.own_fixed += 1;
                fixed::decode_fixed(
                    file.clone(),
                    meta.column(leaf.leaf),
                    &leaf,
                    rows,
                    want,
                    data_type,
                    limits,
                )
            }
            ColumnPath::Arrow => continue,
        };
        let array = match decoded {
            Ok(array) => array,
            // Pages the own decoders do not read (an old writer's
            // BIT_PACKED levels that the chunk's metadata did not list):
            // this column goes to parquet's reader with the others.
            Err(e) if error::is_unsupported(&e) => {
                match path {
                    ColumnPath::List(_) => paths.own_list -= 1,
                    ColumnPath::Bytes(..) => paths.own_bytes -= 1,
                    ColumnPath::Fixed(_) => paths.own_fixed -= 1,
                    ColumnPath::Arrow => {}
                }
                chosen[i].1 = ColumnPath::Arrow;
                continue;
            }
            Err(e) => return Err(e),
        };
        if array.len() < want || (want == rows && array.len() != rows) {
            return Err(DecodeError::Rows {
                column: Some(arrow.schema().field(root).name().clone()),
                decoded: array.len(),
                footer: rows,
            }
            .into());
        }
        columns[i] = Some(array);
    }
    // Rows every own-decoded column holds (columns decoded by parquet's
    // reader hold them all).
    let have = columns
        .iter()
        .flatten()
        .map(|c| c.len())
        .min()
        .unwrap_or(rows)
        .min(rows);
    for column in columns.iter_mut().flatten() {
        if column.len() != have {
            *column = column.slice(0, have);
        }
    }
    let others: Vec<usize> = chosen
        .iter()
        .filter(|(_, p)| *p == ColumnPath::Arrow)
        .map(|(root, _)| *root)
        .collect();
    if !others.is_empty() {
        paths.parquet += others.len() as u64;
        let descr = metadata.file_metadata().schema_descr();
        let mask = ProjectionMask::roots(descr, others.iter().copied());
        let batches = arrow_batches(file, arrow, mask, &others, rg, rows.max(1))?;
        let other_schema = Arc::new(arrow.schema().project(&others)?);
        let batch = arrow_select::concat::concat_batches(&other_schema, &batches)?;
        if batch.num_rows() != rows {
            return Err(DecodeError::Rows {
                column: None,
                decoded: batch.num_rows(),
                footer: rows,
            }
            .into());
        }
        for (k, root) in others.iter().enumerate() {
            let i = roots
                .iter()
                .position(|r| r == root)
                .expect("a projected root");
            columns[i] = Some(batch.column(k).slice(0, have));
        }
    }
    let columns: Vec<ArrayRef> = columns
        .into_iter()
        .map(|c| c.expect("every column decoded"))
        .collect();
    Ok((vec![batch_of(arrow, roots, columns, have)?], paths))
}

/// One leaf column chunk of a part of a large row group, as the part's
/// fetched bytes present it: `chunk` is the chunk's metadata with its
/// dictionary page where it was and the data pages that cover the part
/// right after it (or the chunk itself, fetched whole), holding the row
/// group's rows `first..first + rows`.
pub(crate) struct LeafPart {
    /// The leaf column.
    pub leaf: usize,
    /// Its chunk, as fetched.
    pub chunk: ColumnChunkMetaData,
    /// The row group row of the first row its pages hold.
    pub first: usize,
    /// The rows its pages hold.
    pub rows: usize,
    /// The file offset its data pages were read from (they lie at the
    /// chunk's `data_page_offset` in the fetched bytes).
    pub data_origin: u64,
}

/// Rows `want` of row group `rg` from the pages `parts` describe (one per
/// projected leaf): each column decoded by the path [`column_path`] gives,
/// from the rows its pages hold, then cut to `want`.
pub(crate) fn decode_part<R: ChunkReader + 'static>(
    file: Arc<R>,
    arrow: &ArrowReaderMetadata,
    rg: usize,
    roots: &[usize],
    parts: &[LeafPart],
    want: std::ops::Range<usize>,
    limits: &Limits,
) -> Result<(RecordBatch, DecodePaths)> {
    let metadata = arrow.metadata();
    let meta = metadata.row_group(rg);
    let mut paths = DecodePaths::default();
    let mut columns = Vec::with_capacity(roots.len());
    for &root in roots {
        let (leaves, mask) = projection(arrow, &[root]);
        let mine: Vec<&LeafPart> = parts.iter().filter(|p| leaves.contains(&p.leaf)).collect();
        if mine.len() != leaves.len() {
            return Err(DecodeError::RowGroup {
                row_group: rg,
                what: format!(
                    "{} of the {} leaves of a column fetched",
                    mine.len(),
                    leaves.len()
                ),
            }
            .into());
        }
        let first = mine[0].first;
        let rows = mine[0].rows;
        if mine.iter().any(|p| p.first != first || p.rows != rows)
            || want.start < first
            || want.end > first.saturating_add(rows)
        {
            return Err(DecodeError::RowGroup {
                row_group: rg,
                what: format!("pages of rows {first}+{rows} for rows {want:?}"),
            }
            .into());
        }
        let data_type = arrow.schema().field(root).data_type();
        let path = column_path(arrow, meta, root);
        let own = match path {
            ColumnPath::List(_) => list::decode_list(
                file.clone(),
                &mine[0].chunk,
                (rows, rows),
                data_type,
                limits,
            )
            .map(|a| (a, &mut paths.own_list)),
            ColumnPath::Bytes(_, utf8) => {
                binary::decode_bytes(file.clone(), &mine[0].chunk, (rows, rows), utf8, limits)
                    .map(|a| (a, &mut paths.own_bytes))
            }
            ColumnPath::Fixed(leaf) => fixed::decode_fixed(
                file.clone(),
                &mine[0].chunk,
                &leaf,
                rows,
                rows,
                data_type,
                limits,
            )
            .map(|a| (a, &mut paths.own_fixed)),
            ColumnPath::Arrow => Err(DecodeError::Unsupported {
                column: arrow.schema().field(root).name().clone(),
                what: "this shape".into(),
            }
            .into()),
        };
        let array = match own {
            Ok((array, count)) => {
                *count += 1;
                array
            }
            Err(e) if error::is_unsupported(&e) => {
                paths.parquet += 1;
                // The row group as the part's pages present it: this root's
                // chunks as fetched, `rows` rows.
                let mut chunks = meta.columns().to_vec();
                for p in &mine {
                    chunks[p.leaf] = p.chunk.clone();
                }
                let part_rg = meta
                    .clone()
                    .into_builder()
                    .set_num_rows(rows as i64)
                    .set_column_metadata(chunks)
                    .build()?;
                let part_meta = parquet::file::metadata::ParquetMetaData::new(
                    metadata.file_metadata().clone(),
                    vec![part_rg],
                );
                let part_arrow = ArrowReaderMetadata::try_new(
                    Arc::new(part_meta),
                    parquet::arrow::arrow_reader::ArrowReaderOptions::new(),
                )?;
                let batches =
                    arrow_batches(file.clone(), &part_arrow, mask, &[root], 0, rows.max(1))?;
                let schema = Arc::new(arrow.schema().project(&[root])?);
                arrow_select::concat::concat_batches(&schema, &batches)?
                    .column(0)
                    .clone()
            }
            Err(e) => return Err(e),
        };
        if array.len() != rows {
            return Err(DecodeError::Rows {
                column: Some(arrow.schema().field(root).name().clone()),
                decoded: array.len(),
                footer: rows,
            }
            .into());
        }
        columns.push(array.slice(want.start - first, want.len()));
    }
    Ok((batch_of(arrow, roots, columns, want.len())?, paths))
}

/// A batch of `rows` rows of `columns`, decoded from `roots`: fields named
/// as in the file's schema, typed as decoded (columns whose own decoder
/// kept a dictionary differ in type from the file's schema).
fn batch_of(
    arrow: &ArrowReaderMetadata,
    roots: &[usize],
    columns: Vec<ArrayRef>,
    rows: usize,
) -> Result<RecordBatch> {
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
    let options = arrow_array::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema, columns, &options,
    )?)
}

/// The first `want` rows of `batches` (all of them when they hold fewer).
pub(crate) fn prefix(batches: Vec<RecordBatch>, want: usize) -> Vec<RecordBatch> {
    let mut left = want;
    let mut out = Vec::with_capacity(batches.len());
    for batch in batches {
        if left == 0 {
            break;
        }
        let n = batch.num_rows().min(left);
        out.push(if n == batch.num_rows() {
            batch
        } else {
            batch.slice(0, n)
        });
        left -= n;
    }
    out
}

/// Row group `rg`'s `mask` columns (the roots `roots`) through parquet's
/// Arrow reader, in batches of `batch_rows` rows. Its errors name the
/// columns. Its decoders can panic on malformed bytes (an overflow in the
/// DELTA_BYTE_ARRAY decoder, found by the mutation test): a panic becomes
/// an error.
fn arrow_batches<R: ChunkReader + 'static>(
    file: Arc<R>,
    arrow: &ArrowReaderMetadata,
    mask: ProjectionMask,
    roots: &[usize],
    rg: usize,
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let columns = || -> Vec<String> {
        let fields = arrow.schema().fields();
        roots
            .iter()
            .map(|&r| {
                fields
                    .get(r)
                    .map_or_else(|| format!("#{r}"), |f| f.name().clone())
            })
            .collect()
    };
    let read = || -> Result<Vec<RecordBatch>> {
        ParquetRecordBatchReaderBuilder::new_with_metadata(ArcReader(file), arrow.clone())
            .with_projection(mask)
            .with_row_groups(vec![rg])
            .with_batch_size(batch_rows.max(1))
            .build()?
            .map(|b| b.map_err(ParquetError::from))
            .collect()
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)) {
        Ok(Ok(batches)) => Ok(batches),
        Ok(Err(e)) => Err(DecodeError::Reader {
            columns: columns(),
            detail: e.to_string(),
        }
        .into()),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(DecodeError::Panicked {
                columns: columns(),
                message,
            }
            .into())
        }
    }
}

/// An `Arc` of a chunk reader, as a chunk reader.
struct ArcReader<R>(Arc<R>);

impl<R: ChunkReader> parquet::file::reader::Length for ArcReader<R> {
    fn len(&self) -> u64 {
        self.0.len()
    }
}

impl<R: ChunkReader> ChunkReader for ArcReader<R> {
    type T = R::T;
    fn get_read(&self, start: u64) -> Result<Self::T> {
        self.0.get_read(start)
    }
    fn get_bytes(&self, start: u64, length: usize) -> Result<bytes::Bytes> {
        self.0.get_bytes(start, length)
    }
}
