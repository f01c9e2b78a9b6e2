//! Encoding row groups: Arrow batches to compressed Parquet column chunks, on
//! any thread, independent of the file they will be spliced into.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema, SchemaRef};
use bytes::Bytes;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowRowGroupWriterFactory, ArrowWriterOptions, compute_leaves,
};
use parquet::arrow::{ArrowSchemaConverter, ArrowWriter};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::writer::ColumnCloseResult;
use parquet::errors::ParquetError;
use parquet::file::properties::{
    EnabledStatistics, WriterProperties, WriterPropertiesPtr, WriterVersion,
};
use parquet::schema::types::{ColumnDescPtr, ColumnPath};

use crate::dictionary::{self, DictionaryChunk};
use crate::plain::{self, PlainChunk};
use crate::sums::ChunkSums;

/// A data page is stored compressed only if zstd makes it smaller than
/// this fraction of its size: decompressing a page zstd shrinks by a few
/// percent (random dictionary keys of high-cardinality columns) costs the
/// loader more than the bytes it saves (docs/FORMAT.md).
const UNCOMPRESSED_BELOW: f64 = 0.90;

/// The writer properties of every shard. Columns named in `stored` hold
/// data that is compressed already (JPEG, PNG, video files): they are
/// written uncompressed and without a dictionary, instead of zstd trying
/// every page (and the dictionary hashing every value of a row group's
/// first megabyte) to store it as it was anyway. Columns named in
/// `no_dictionary` (large, distinct values: [`BinaryColumns`]) keep zstd
/// but are written `PLAIN` from their first value.
pub(crate) fn writer_properties(
    zstd_level: i32,
    stored: &[ColumnPath],
    no_dictionary: &[ColumnPath],
) -> Result<WriterPropertiesPtr, ParquetError> {
    let mut builder = WriterProperties::builder();
    for path in stored {
        builder = builder
            .set_column_compression(path.clone(), Compression::UNCOMPRESSED)
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_data_page_size_limit(path.clone(), LARGE_VALUE_PAGE_BYTES);
    }
    for path in no_dictionary {
        builder = builder
            .set_column_dictionary_enabled(path.clone(), false)
            .set_column_data_page_size_limit(path.clone(), LARGE_VALUE_PAGE_BYTES);
    }
    Ok(Arc::new(
        builder
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(zstd_level)?))
            // Pages of at most 128 KiB: zstd-3 takes its smaller tables for
            // an input of 128 KiB or less and compresses it faster, at the
            // same ratio on this data (docs/FORMAT.md).
            .set_data_page_size_limit(PAGE_BYTES)
            // V2 data pages carry their own "compressed" flag: a page zstd
            // shrinks by less than 10% (random keys, image bytes, hashes) is
            // stored as it is, so readers skip decompressing it, and the
            // loader reads it in place (images: 1.9x the rows/s, half the CPU).
            .set_writer_version(WriterVersion::PARQUET_2_0)
            .set_data_page_v2_compression_ratio_threshold(UNCOMPRESSED_BELOW)
            // Dictionary first, PLAIN when a dictionary grows too large (as
            // with V1 pages; V2's default fallbacks are the DELTA encodings).
            .set_encoding(Encoding::PLAIN)
            // Chunk statistics only: no page index, so footers stay small and the
            // footer is exactly the Thrift metadata plus 8 bytes.
            .set_statistics_enabled(EnabledStatistics::Chunk)
            .set_offset_index_disabled(true)
            .build(),
    ))
}

/// Bytes of a data page (parquet's estimate, before compression): zstd at
/// levels 1 to 9 picks parameters by its input's size, and for 128 KiB or
/// less uses hash tables half as large (level 3: 384 KiB instead of 768 KiB),
/// which stay in a core's L2 cache along with the page. On the token
/// set of docs/performance-notes.md, `shard` spent half its CPU in zstd; pages of
/// 128 KiB instead of parquet's 1 MiB take 13% less CPU with output of the
/// same size, and the loader reads them as fast.
const PAGE_BYTES: usize = 128 << 10;

/// Bytes of a data page of the columns stored as they are (images) or
/// written without a dictionary (large distinct values): parquet's default,
/// as zstd's tables are not their cost (images are not compressed at all),
/// and a page per image or two cost the loader (on the image set, 128 KiB
/// pages gave a lower steady rate and 40 MiB more peak RSS).
const LARGE_VALUE_PAGE_BYTES: usize = 1 << 20;

/// Values sampled per binary or string column by [`BinaryColumns::of`].
const SAMPLE: usize = 16;

/// Mean sampled length from which distinct values are written without a
/// dictionary: a 1 MiB dictionary page holds at most 1,024 of them.
const NO_DICTIONARY_FROM: usize = 1024;

/// Whether `schema` has a binary or string column, at the top level or in
/// a struct (where [`BinaryColumns::of`] looks).
pub(crate) fn has_binary_leaf(schema: &Schema) -> bool {
    fn binary(t: &DataType) -> bool {
        match t {
            DataType::Binary | DataType::LargeBinary | DataType::Utf8 | DataType::LargeUtf8 => true,
            DataType::Struct(fields) => fields.iter().any(|f| binary(f.data_type())),
            _ => false,
        }
    }
    schema.fields().iter().any(|f| binary(f.data_type()))
}

/// The binary and string columns of a batch (at the top level, or in
/// structs, as Hugging Face datasets store an `image` as `{bytes, path}`)
/// that are written otherwise than the rest, judged on their first non-null
/// values (up to [`SAMPLE`]).
#[derive(Debug, Default, PartialEq)]
pub(crate) struct BinaryColumns {
    /// Binary columns whose sampled values are all images of a compressed
    /// format, told by their first bytes (JPEG, PNG, WebP or GIF), and
    /// columns of large distinct values that zstd cannot shrink by the
    /// [`UNCOMPRESSED_BELOW`] rule: stored as they are.
    pub stored: Vec<ColumnPath>,
    /// Other columns whose sampled values are all distinct and average at
    /// least [`NO_DICTIONARY_FROM`] bytes (documents, audio, serialised
    /// tensors): no dictionary. Parquet's writer would put each row
    /// group's first megabyte of them in a dictionary page (compressed,
    /// whatever zstd makes of it) before it falls back to `PLAIN`: a page
    /// the loader decompresses and looks up for nothing.
    pub no_dictionary: Vec<ColumnPath>,
}

impl BinaryColumns {
    /// Classify the binary and string columns of `batch`.
    pub(crate) fn of(batch: &RecordBatch) -> Self {
        fn sample<'a, I: Iterator<Item = Option<&'a [u8]>>>(values: I) -> Vec<&'a [u8]> {
            values.flatten().take(SAMPLE).collect()
        }
        fn texts<O: arrow_array::OffsetSizeTrait>(array: &ArrayRef) -> Vec<&[u8]> {
            sample(array.as_string::<O>().iter().map(|v| v.map(str::as_bytes)))
        }
        fn visit(path: Vec<String>, array: &ArrayRef, found: &mut BinaryColumns) {
            let (values, may_be_image) = match array.data_type() {
                DataType::Binary => (sample(array.as_binary::<i32>().iter()), true),
                DataType::LargeBinary => (sample(array.as_binary::<i64>().iter()), true),
                DataType::Utf8 => (texts::<i32>(array), false),
                DataType::LargeUtf8 => (texts::<i64>(array), false),
                DataType::Struct(_) => {
                    let parent = array.as_struct();
                    for (field, child) in parent.fields().iter().zip(parent.columns()) {
                        let mut child_path = path.clone();
                        child_path.push(field.name().clone());
                        visit(child_path, child, found);
                    }
                    return;
                }
                _ => return,
            };
            if values.is_empty() {
                return;
            }
            if may_be_image && values.iter().all(|v| compressed_image(v)) {
                found.stored.push(ColumnPath::new(path));
                return;
            }
            let total: usize = values.iter().map(|v| v.len()).sum();
            let distinct = values
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len();
            if distinct == values.len() && total / values.len() >= NO_DICTIONARY_FROM {
                if incompressible(&values) {
                    found.stored.push(ColumnPath::new(path));
                } else {
                    found.no_dictionary.push(ColumnPath::new(path));
                }
            }
        }
        let mut found = BinaryColumns::default();
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            visit(vec![field.name().clone()], column, &mut found);
        }
        found
    }
}

/// Bytes of sampled values [`incompressible`] tries zstd on.
const TRIAL_BYTES: usize = 256 << 10;

/// Whether zstd (level 1, on the first [`TRIAL_BYTES`] of `values`) saves
/// less than the [`UNCOMPRESSED_BELOW`] rule asks of a page: large distinct
/// values that are compressed or encrypted already, in a format not told by
/// its first bytes (audio, video, archives, random bytes). Each of their
/// pages would be compressed by zstd only to be stored as it was.
fn incompressible(values: &[&[u8]]) -> bool {
    let mut trial = Vec::with_capacity(TRIAL_BYTES);
    for v in values {
        let room = TRIAL_BYTES - trial.len();
        trial.extend_from_slice(&v[..v.len().min(room)]);
        if trial.len() == TRIAL_BYTES {
            break;
        }
    }
    match zstd::bulk::compress(&trial, 1) {
        Ok(packed) => packed.len() as f64 >= UNCOMPRESSED_BELOW * trial.len() as f64,
        Err(_) => false,
    }
}

/// Whether `value` starts as a JPEG, PNG, WebP or GIF file does.
fn compressed_image(value: &[u8]) -> bool {
    value.starts_with(&[0xFF, 0xD8, 0xFF])
        || value.starts_with(b"\x89PNG\r\n\x1a\n")
        || (value.len() >= 12 && value.starts_with(b"RIFF") && &value[8..12] == b"WEBP")
        || value.starts_with(b"GIF87a")
        || value.starts_with(b"GIF89a")
}

/// A column chunk encoded by parquet's writer, by [`dictionary`] or by
/// [`plain`].
pub(crate) enum EncodedChunk {
    Parquet(ArrowColumnChunk),
    Dictionary(DictionaryChunk),
    Plain(PlainChunk),
}

impl EncodedChunk {
    pub(crate) fn bytes_written(&self) -> u64 {
        match self {
            EncodedChunk::Parquet(c) => c.close().bytes_written,
            EncodedChunk::Dictionary(c) => c.bytes_written(),
            EncodedChunk::Plain(c) => c.bytes_written(),
        }
    }

    /// Append the chunk to `row_group` (its next column) through parquet's
    /// writer, as tests write files without the shard writer's splices.
    #[cfg(test)]
    pub(crate) fn append_to_row_group<W: std::io::Write + Send>(
        self,
        row_group: &mut parquet::file::writer::SerializedRowGroupWriter<'_, W>,
    ) -> Result<(), ParquetError> {
        match self.into_parts() {
            ChunkParts::Own { parts, close, .. } => {
                let bytes = match parts.as_slice() {
                    [one] => one.clone(),
                    _ => parts.concat().into(),
                };
                row_group.append_column(&bytes, close)
            }
            ChunkParts::Parquet(c) => c.append_to_row_group(row_group),
        }
    }

    /// The chunk as the shard writer appends it.
    pub(crate) fn into_parts(self) -> ChunkParts {
        let (parts, close, sums) = match self {
            EncodedChunk::Parquet(c) => return ChunkParts::Parquet(c),
            EncodedChunk::Dictionary(c) => c.into_parts(),
            EncodedChunk::Plain(c) => c.into_parts(),
        };
        ChunkParts::Own { parts, close, sums }
    }
}

/// An [`EncodedChunk`] as the shard writer appends it.
pub(crate) enum ChunkParts {
    /// Encoded here: its bytes, in order, what parquet's writer needs to
    /// splice them, and their sums.
    Own {
        parts: Vec<Bytes>,
        close: ColumnCloseResult,
        sums: ChunkSums,
    },
    /// Encoded by parquet's writer, which appends it.
    Parquet(ArrowColumnChunk),
}

/// A row group encoded and compressed, ready to be appended to a shard.
pub(crate) struct EncodedRowGroup {
    pub seq: u64,
    pub chunks: Vec<EncodedChunk>,
    pub rows: u64,
    /// Uncompressed Arrow bytes of the rows.
    pub raw_bytes: u64,
    /// Compressed bytes the chunks will occupy.
    pub encoded_bytes: u64,
}

/// Encodes row groups for a schema; shareable across threads.
pub(crate) struct Encoder {
    schema: SchemaRef,
    /// One factory a top-level field (a schema of that field alone, with the
    /// same properties): parquet's column writers are made only for the
    /// fields it writes. Made for every field each row group, each with its
    /// own zstd compression and decompression contexts, they were 2% of a
    /// 40-column table's CPU, for columns the encoders here write.
    factories: Vec<ArrowRowGroupWriterFactory>,
    props: WriterPropertiesPtr,
    /// The Parquet leaves of each top-level field, in order. A field with
    /// one (a primitive column, or a list of one) may be encoded by
    /// [`dictionary::encode`]; leaves of large values, at the top level or
    /// in a struct, by [`plain::encode`].
    leaves: Vec<Vec<ColumnDescPtr>>,
}

impl Encoder {
    pub(crate) fn new(schema: SchemaRef, props: WriterPropertiesPtr) -> Result<Self, ParquetError> {
        // A factory only needs a schema and the properties; the chunks of a
        // field's factory (its leaves' descriptors are those of the field in
        // the whole schema: the same path, type and levels, which the file
        // writer checks) can be spliced into any file with the same ones.
        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let factories = schema
            .fields()
            .iter()
            .map(|field| {
                let alone = Arc::new(Schema::new(vec![field.clone()]));
                let (_, factory) =
                    ArrowWriter::try_new_with_options(Vec::new(), alone, options.clone())?
                        .into_serialized_writer()?;
                Ok(factory)
            })
            .collect::<Result<Vec<_>, ParquetError>>()?;
        let parquet_schema = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)?;
        let mut leaves = vec![Vec::new(); schema.fields().len()];
        for (leaf, descr) in parquet_schema.columns().iter().enumerate() {
            let root = parquet_schema.get_column_root_idx(leaf);
            if let Some(of_root) = leaves.get_mut(root) {
                of_root.push(descr.clone());
            }
        }
        Ok(Encoder {
            schema,
            factories,
            props,
            leaves,
        })
    }

    /// Encode the rows of `batches` (in order) as one row group. A column
    /// the dictionary encoder may take is concatenated first; the others are
    /// written batch by batch into their column writers.
    pub(crate) fn encode(
        &self,
        seq: u64,
        batches: &[RecordBatch],
        raw_bytes: u64,
    ) -> Result<EncodedRowGroup, ParquetError> {
        let mut chunks = Vec::with_capacity(self.leaves.iter().map(Vec::len).sum());
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        for (i, (field, leaves)) in self.schema.fields().iter().zip(&self.leaves).enumerate() {
            // Parquet's writers for this field's leaves, in order, made
            // where one is needed.
            let writers = || -> Result<_, ParquetError> {
                let factory = self.factories.get(i).ok_or_else(|| {
                    ParquetError::General("a field without a column writer factory".into())
                })?;
                Ok(factory.create_column_writers(0)?.into_iter())
            };
            // A field with one leaf: a fixed-width column, or a list of one
            // ([`dictionary::encode`] checks the type and levels).
            let flat = match leaves.as_slice() {
                [one] => Some(one),
                _ => None,
            };
            let whole = match flat {
                Some(_) if dictionary::may_encode(field.data_type()) => {
                    let parts: Vec<&dyn arrow_array::Array> =
                        batches.iter().map(|b| b.column(i).as_ref()).collect();
                    Some(match parts.as_slice() {
                        [_] => batches[0].column(i).clone(),
                        _ => arrow_select::concat::concat(&parts)?,
                    })
                }
                _ => None,
            };
            if let (Some(descr), Some(column)) = (flat, &whole)
                && let Some(chunk) =
                    dictionary::encode(field, column, descr, &self.props, UNCOMPRESSED_BELOW)?
            {
                chunks.push(EncodedChunk::Dictionary(chunk));
                continue;
            }
            let mut own = match whole {
                None => self.plain_leaves(i, batches)?,
                Some(_) => Vec::new(),
            };
            if own.iter().any(Option::is_some) {
                // Some leaves encoded here, the others by their writers.
                let mut next = own.iter().any(Option::is_none).then(writers).transpose()?;
                let mut writers = Vec::with_capacity(own.len());
                for chunk in &own {
                    let writer = next
                        .as_mut()
                        .map(|next| {
                            next.next().ok_or_else(|| {
                                ParquetError::General("more leaves than column writers".into())
                            })
                        })
                        .transpose()?;
                    writers.push(writer.filter(|_| chunk.is_none()));
                }
                if writers.iter().any(Option::is_some) {
                    for batch in batches {
                        let computed = compute_leaves(field, batch.column(i))?;
                        for (writer, leaf) in writers.iter_mut().zip(computed) {
                            if let Some(writer) = writer {
                                writer.write(&leaf)?;
                            }
                        }
                    }
                }
                for (chunk, writer) in own.iter_mut().zip(writers) {
                    chunks.push(match (chunk.take(), writer) {
                        (Some(chunk), _) => EncodedChunk::Plain(chunk),
                        (None, Some(writer)) => EncodedChunk::Parquet(writer.close()?),
                        (None, None) => unreachable!("a writer for every leaf not encoded here"),
                    });
                }
                continue;
            }
            let columns: Vec<&ArrayRef> = match &whole {
                Some(column) => vec![column],
                None => batches.iter().map(|b| b.column(i)).collect(),
            };
            let mut next = writers()?;
            let mut leaves = Vec::new();
            for column in columns {
                for (k, leaf) in compute_leaves(field, column)?.into_iter().enumerate() {
                    if k == leaves.len() {
                        leaves.push(next.next().ok_or_else(|| {
                            ParquetError::General("more leaves than column writers".into())
                        })?);
                    }
                    leaves[k].write(&leaf)?;
                }
            }
            for writer in leaves {
                chunks.push(EncodedChunk::Parquet(writer.close()?));
            }
        }
        let encoded_bytes = chunks.iter().map(EncodedChunk::bytes_written).sum();
        Ok(EncodedRowGroup {
            seq,
            chunks,
            rows: rows as u64,
            raw_bytes,
            encoded_bytes,
        })
    }

    /// The chunks [`plain::encode`] makes of field `i`'s leaves, one entry
    /// a leaf (`None` where parquet's writer writes it): a top-level binary
    /// or string column, or the binary and string fields of a top-level
    /// struct whose every field is one leaf (Hugging Face's
    /// `image: {bytes, path}`); empty for other fields.
    fn plain_leaves(
        &self,
        i: usize,
        batches: &[RecordBatch],
    ) -> Result<Vec<Option<PlainChunk>>, ParquetError> {
        let field = self.schema.field(i);
        let descrs = &self.leaves[i];
        let large = |t: &DataType| {
            matches!(
                t,
                DataType::Binary | DataType::LargeBinary | DataType::Utf8 | DataType::LargeUtf8
            )
        };
        let encode = |leaves: Vec<plain::Leaf<'_>>, levels, descr| {
            plain::encode(&leaves, levels, descr, &self.props, UNCOMPRESSED_BELOW)
        };
        match (field.data_type(), descrs.as_slice()) {
            (t, [descr]) if large(t) => {
                let leaves = (batches.iter())
                    .map(|b| plain::Leaf {
                        values: b.column(i),
                        outer: None,
                    })
                    .collect();
                Ok(vec![encode(leaves, (false, field.is_nullable()), descr)?])
            }
            (DataType::Struct(children), _) if children.len() == descrs.len() => {
                let mut own = Vec::with_capacity(children.len());
                for (j, (child, descr)) in children.iter().zip(descrs).enumerate() {
                    if !large(child.data_type()) {
                        own.push(None);
                        continue;
                    }
                    let mut leaves = Vec::with_capacity(batches.len());
                    for batch in batches {
                        let Some(parent) = batch.column(i).as_struct_opt() else {
                            return Ok(Vec::new());
                        };
                        leaves.push(plain::Leaf {
                            values: parent.column(j),
                            outer: arrow_array::Array::nulls(parent).cloned(),
                        });
                    }
                    let levels = (field.is_nullable(), child.is_nullable());
                    own.push(encode(leaves, levels, descr)?);
                }
                Ok(own)
            }
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use arrow_array::{
        Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, RecordBatch,
        StringArray,
    };
    use bytes::Bytes;
    use parquet::arrow::ArrowWriter;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::arrow_writer::ArrowWriterOptions;
    use parquet::file::metadata::ParquetMetaData;

    use super::*;

    /// A seeded xorshift generator of test values.
    pub(crate) fn random() -> impl FnMut() -> u64 {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// A uniform float in [0, 1) from `next` ([`random`]).
    fn unit(next: &mut impl FnMut() -> u64) -> f64 {
        (next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `batch` written by parquet's writer alone, and through [`Encoder`]
    /// (which encodes flat fixed-width columns here), with the kind of each
    /// chunk the encoder made.
    fn both(batch: &RecordBatch) -> (Bytes, Bytes, Vec<bool>) {
        let props = writer_properties(3, &[], &[]).unwrap();
        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let mut theirs = Vec::new();
        let mut writer =
            ArrowWriter::try_new_with_options(&mut theirs, batch.schema(), options.clone())
                .unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        let (ours, ours_kind) = ours(std::slice::from_ref(batch));
        (theirs.into(), ours, ours_kind)
    }

    /// `parts` (one row group's batches) written through [`Encoder`], with
    /// the kind of each chunk it made.
    fn ours(parts: &[RecordBatch]) -> (Bytes, Vec<bool>) {
        ours_with(parts, writer_properties(3, &[], &[]).unwrap())
    }

    /// [`ours`] with the writer properties `props`.
    fn ours_with(parts: &[RecordBatch], props: WriterPropertiesPtr) -> (Bytes, Vec<bool>) {
        let schema = parts[0].schema();
        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let encoder = Encoder::new(schema.clone(), props).unwrap();
        let group = encoder.encode(0, parts, 0).unwrap();
        let kinds = group
            .chunks
            .iter()
            .map(|c| matches!(c, EncodedChunk::Dictionary(_) | EncodedChunk::Plain(_)))
            .collect();
        let mut ours = Vec::new();
        let (mut writer, _) = ArrowWriter::try_new_with_options(&mut ours, schema, options)
            .unwrap()
            .into_serialized_writer()
            .unwrap();
        let mut row_group = writer.next_row_group().unwrap();
        for chunk in group.chunks {
            chunk.append_to_row_group(&mut row_group).unwrap();
        }
        row_group.close().unwrap();
        writer.close().unwrap();
        (ours.into(), kinds)
    }

    /// A row group handed over as several batches (the producer no longer
    /// concatenates them) reads back as the rows in order, for flat
    /// numbers (dictionary-encoded), lists, strings, large binary values
    /// and a struct of two leaves (written batch by batch), with the same
    /// chunk kinds as the rows in one batch.
    #[test]
    fn a_row_group_of_several_batches_reads_back_in_order() {
        use arrow_array::builder::{BinaryBuilder, Int32Builder, ListBuilder};
        use arrow_array::{ArrayRef, StructArray};
        use arrow_schema::{DataType, Field, Fields};
        let rows = 2500usize;
        let mut next = random();
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows as i64));
        let mut lists = ListBuilder::new(Int32Builder::new());
        let mut blobs = BinaryBuilder::new();
        for i in 0..rows {
            if i % 7 == 3 {
                lists.append_null();
            } else {
                for _ in 0..(next() % 20) {
                    lists.values().append_value((next() % 1000) as i32);
                }
                lists.append(true);
            }
            let blob: Vec<u8> = (0..2000 + next() % 500).map(|_| next() as u8).collect();
            blobs.append_value(blob);
        }
        let names: ArrayRef = Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("row {i}")),
        ));
        let fields = Fields::from(vec![
            Field::new("a", DataType::Int32, false),
            Field::new("b", DataType::Utf8, false),
        ]);
        let pair: ArrayRef = Arc::new(StructArray::new(
            fields.clone(),
            vec![
                Arc::new(Int32Array::from_iter_values(
                    (0..rows as i32).map(|i| i * 3),
                )),
                names.clone(),
            ],
            None,
        ));
        let columns: Vec<ArrayRef> = vec![
            ids,
            Arc::new(lists.finish()),
            Arc::new(blobs.finish()),
            names,
            pair,
        ];
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .zip(["id", "tokens", "blob", "name", "pair"])
                .map(|(c, n)| Field::new(n, c.data_type().clone(), c.null_count() > 0))
                .collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(schema, columns).unwrap();
        let (whole, whole_kinds) = ours(std::slice::from_ref(&batch));
        let cuts = [0, 1, 700, 701, 2100, rows];
        let parts: Vec<RecordBatch> = (cuts.windows(2))
            .map(|w| batch.slice(w[0], w[1] - w[0]))
            .collect();
        let (split, split_kinds) = ours(&parts);
        assert_eq!(split_kinds, whole_kinds);
        assert!(split_kinds[0] && split_kinds[1], "{split_kinds:?}");
        assert_eq!(read(&split).0, batch);
        assert_eq!(read(&whole).0, batch);
    }

    fn read(file: &Bytes) -> (RecordBatch, Arc<ParquetMetaData>) {
        let builder = ParquetRecordBatchReaderBuilder::try_new(file.clone()).unwrap();
        let metadata = builder.metadata().clone();
        let batches: Vec<RecordBatch> = builder
            .with_batch_size(1 << 20)
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let batch = arrow_select::concat::concat_batches(&batches[0].schema(), &batches).unwrap();
        (batch, metadata)
    }

    /// Every column chunk of `ours` has the metadata parquet's writer gave
    /// the same column in `theirs` (statistics, encodings, page kinds,
    /// counts, codec, level histograms), at most 3% over its size; or, for
    /// the columns of `delta`, is `DELTA_BINARY_PACKED` (parquet's writer
    /// makes a dictionary), smaller than parquet's, with its statistics.
    fn assert_chunks_match(
        theirs: &ParquetMetaData,
        ours: &ParquetMetaData,
        batch: &RecordBatch,
        delta: &[&str],
    ) {
        use parquet::basic::Encoding;
        let (theirs, ours) = (theirs.row_group(0), ours.row_group(0));
        for (c, field) in batch.schema().fields().iter().enumerate() {
            let (t, o, name) = (theirs.column(c), ours.column(c), field.name());
            assert_eq!(o.statistics(), t.statistics(), "{name}");
            let deltas = o.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED);
            assert_eq!(deltas, delta.contains(&name.as_str()), "{name}");
            if deltas {
                assert!(
                    o.encodings()
                        .all(|e| matches!(e, Encoding::RLE | Encoding::DELTA_BINARY_PACKED))
                );
                assert!(o.dictionary_page_offset().is_none(), "{name}");
                assert!(o.compressed_size() < t.compressed_size(), "{name}");
                assert_eq!(o.num_values(), t.num_values(), "{name}");
                continue;
            }
            assert_eq!(o.encodings_mask(), t.encodings_mask(), "{name}");
            assert_eq!(o.page_encoding_stats(), t.page_encoding_stats(), "{name}");
            assert_eq!(o.num_values(), t.num_values(), "{name}");
            assert_eq!(o.compression(), t.compression(), "{name}");
            let levels = |m: &parquet::file::metadata::ColumnChunkMetaData| {
                (
                    m.definition_level_histogram().cloned(),
                    m.repetition_level_histogram().cloned(),
                )
            };
            assert_eq!(levels(o), levels(t), "{name}");
            let ratio = o.compressed_size() as f64 / t.compressed_size() as f64;
            assert!(
                (0.8..1.03).contains(&ratio),
                "{name}: {ratio} of parquet's size"
            );
        }
    }

    /// Random short and long values (empty ones, multi-byte and 4-byte
    /// characters and 0x7f / 0xff bytes around the statistics' 64-byte cut),
    /// random nulls, a nullable struct, random batch splits and small page
    /// limits, stored and compressed: the chunks made here read back as the
    /// values, with parquet's writer's statistics, value bytes and level
    /// histograms, in every case.
    #[test]
    fn random_values_read_back_as_parquets_own() {
        use arrow_array::{BinaryArray, LargeStringArray, StructArray};
        use arrow_buffer::NullBuffer;
        use arrow_schema::{Field, Fields};
        use parquet::file::properties::WriterVersion;
        let mut next = random();
        let pieces = ["a", "z", "\u{7f}", "é", "€", "\u{1F600}", "\u{10FFFF}"];
        for case in 0..40 {
            let rows = 1 + (next() % 300) as usize;
            let text = |next: &mut dyn FnMut() -> u64| -> String {
                let n = match next() % 4 {
                    0 => 0,
                    1 => (next() % 8) as usize,
                    _ => 55 + (next() % 20) as usize,
                };
                (0..n).map(|_| pieces[(next() % 7) as usize]).collect()
            };
            let valid = |next: &mut dyn FnMut() -> u64| !next().is_multiple_of(10);
            let bytes: Vec<Option<Vec<u8>>> = (0..rows)
                .map(|_| {
                    valid(&mut next).then(|| {
                        let n = (next() % 90) as usize;
                        (0..n)
                            .map(|_| [0u8, 1, 0x7f, 0xff][(next() % 4) as usize])
                            .collect()
                    })
                })
                .collect();
            let texts: Vec<Option<String>> = (0..rows)
                .map(|_| valid(&mut next).then(|| text(&mut next)))
                .collect();
            let inner: Vec<Option<String>> = (0..rows)
                .map(|_| valid(&mut next).then(|| text(&mut next)))
                .collect();
            let outer: Vec<bool> = (0..rows).map(|_| valid(&mut next)).collect();
            let columns: Vec<(&str, ArrayRef)> = vec![
                (
                    "b",
                    Arc::new(BinaryArray::from_iter(bytes.iter().map(|v| v.as_deref()))),
                ),
                ("t", Arc::new(LargeStringArray::from_iter(texts.iter()))),
                (
                    "s",
                    Arc::new(StructArray::new(
                        Fields::from(vec![Field::new("text", DataType::Utf8, true)]),
                        vec![Arc::new(StringArray::from_iter(inner.iter()))],
                        Some(NullBuffer::from(outer)),
                    )),
                ),
            ];
            let batch = RecordBatch::try_from_iter(columns).unwrap();
            let path = |p: &[&str]| ColumnPath::new(p.iter().map(|s| s.to_string()).collect());
            let props = Arc::new(
                WriterProperties::builder()
                    .set_writer_version(WriterVersion::PARQUET_2_0)
                    .set_compression(Compression::ZSTD(ZstdLevel::try_new(3).unwrap()))
                    .set_column_compression(path(&["b"]), Compression::UNCOMPRESSED)
                    .set_data_page_v2_compression_ratio_threshold(UNCOMPRESSED_BELOW)
                    .set_dictionary_enabled(false)
                    .set_encoding(Encoding::PLAIN)
                    .set_statistics_enabled(EnabledStatistics::Chunk)
                    .set_offset_index_disabled(true)
                    .set_data_page_size_limit(64 + (next() % 2000) as usize)
                    .set_data_page_row_count_limit(1 + (next() % 100) as usize)
                    .build(),
            );
            let mut cuts = vec![0, rows];
            for _ in 0..(next() % 4) {
                cuts.push((next() % (rows as u64 + 1)) as usize);
            }
            cuts.sort_unstable();
            let (kinds, theirs, ours) = plain_and_parquets(&batch, &cuts, props);
            assert_eq!(kinds, vec![true; 3], "case {case}");
            let (theirs, ours) = (theirs.row_group(0), ours.row_group(0));
            for c in 0..theirs.num_columns() {
                same_leaf_metadata(theirs.column(c), ours.column(c), &format!("case {case}"));
            }
        }
    }

    /// `batch` written by parquet's writer with `props`, and split at `cuts`
    /// through [`Encoder`] with the same properties: both read back as
    /// `batch`; the kind of each chunk the encoder made (own or parquet's),
    /// and the metadata of both files.
    fn plain_and_parquets(
        batch: &RecordBatch,
        cuts: &[usize],
        props: WriterPropertiesPtr,
    ) -> (Vec<bool>, Arc<ParquetMetaData>, Arc<ParquetMetaData>) {
        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let mut theirs = Vec::new();
        let mut writer =
            ArrowWriter::try_new_with_options(&mut theirs, batch.schema(), options).unwrap();
        writer.write(batch).unwrap();
        writer.close().unwrap();
        let parts: Vec<RecordBatch> = (cuts.windows(2))
            .map(|w| batch.slice(w[0], w[1] - w[0]))
            .collect();
        let (ours, kinds) = ours_with(&parts, props);
        let (their_batch, theirs) = read(&Bytes::from(theirs));
        let (our_batch, ours) = read(&ours);
        assert_eq!(&our_batch, batch);
        assert_eq!(&their_batch, batch);
        (kinds, theirs, ours)
    }

    /// A leaf column chunk made here has what parquet's writer gives the
    /// same column: statistics, value bytes, level histogram, values and
    /// codec (`what` names the case).
    fn same_leaf_metadata(
        theirs: &parquet::file::metadata::ColumnChunkMetaData,
        ours: &parquet::file::metadata::ColumnChunkMetaData,
        what: &str,
    ) {
        let (t, o) = (theirs, ours);
        let name = format!("{what}: {}", t.column_path().string());
        assert_eq!(o.statistics(), t.statistics(), "{name}");
        assert_eq!(
            o.unencoded_byte_array_data_bytes(),
            t.unencoded_byte_array_data_bytes(),
            "{name}"
        );
        assert_eq!(
            o.definition_level_histogram(),
            t.definition_level_histogram(),
            "{name}"
        );
        assert_eq!(o.num_values(), t.num_values(), "{name}");
        assert_eq!(o.compression(), t.compression(), "{name}");
    }

    /// Large binary and string values of every offset width, stored as they
    /// are (images, bytes zstd cannot shrink) or zstd-compressed without a
    /// dictionary, with and without nulls, an all-null column, multi-byte
    /// text and values past the statistics' truncation length, values larger
    /// than a page, over several pages and batches: the chunks are made
    /// here ([`plain`]), read back as the values, and carry the metadata
    /// parquet's writer gives the same columns (statistics, value bytes,
    /// encodings, page kinds, levels), within 3% of its size.
    #[test]
    fn large_values_read_back_as_parquets_own() {
        use arrow_array::{BinaryArray, LargeBinaryArray, LargeStringArray, StructArray};
        use arrow_buffer::NullBuffer;
        use arrow_schema::{Field, Fields};
        let rows = 400usize;
        let mut next = random();
        let mut bytes = |n: usize| (0..n).map(|_| next() as u8).collect::<Vec<u8>>();
        let images: Vec<Vec<u8>> = (0..rows)
            .map(|i| {
                let mut v = bytes(if i % 97 == 5 {
                    1_300_000
                } else {
                    2000 + i * 13
                });
                v[..4].copy_from_slice(b"\xff\xd8\xff\xe0");
                v
            })
            .collect();
        let raw: Vec<Option<Vec<u8>>> = (0..rows)
            .map(|i| (i % 5 != 1).then(|| bytes(1500 + i % 300)))
            .collect();
        let doc = |i: usize| format!("{i:05} été {}", "naïve café ".repeat(150 + i % 50));
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "image",
                Arc::new(BinaryArray::from_iter_values(images.iter())),
            ),
            (
                "doc",
                Arc::new(StringArray::from_iter(
                    (0..rows).map(|i| (i % 7 != 3).then(|| doc(i))),
                )),
            ),
            (
                "raw",
                Arc::new(LargeBinaryArray::from_iter(
                    raw.iter().map(|v| v.as_deref()),
                )),
            ),
            (
                "large_text",
                Arc::new(LargeStringArray::from_iter_values(
                    (0..rows).map(|i| doc(rows - i)),
                )),
            ),
            (
                "nothing",
                Arc::new(BinaryArray::from_iter((0..rows).map(|_| None::<&[u8]>))),
            ),
            (
                // As Hugging Face stores an image: a nullable struct of its
                // bytes (stored) and path (parquet's writer), both nullable.
                "pic",
                Arc::new(StructArray::new(
                    Fields::from(vec![
                        Field::new("bytes", DataType::Binary, true),
                        Field::new("path", DataType::Utf8, true),
                    ]),
                    vec![
                        Arc::new(BinaryArray::from_iter((0..rows).map(|i| {
                            (i % 13 != 6).then(|| images[(i * 7) % rows].as_slice())
                        }))),
                        Arc::new(StringArray::from_iter(
                            (0..rows).map(|i| (i % 17 != 2).then(|| format!("{i}.jpg"))),
                        )),
                    ],
                    Some(NullBuffer::from_iter((0..rows).map(|i| i % 11 != 4))),
                )),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let path = |name: &str| ColumnPath::new(vec![name.to_string()]);
        let props = writer_properties(
            3,
            &[
                path("image"),
                ColumnPath::new(vec!["pic".into(), "bytes".into()]),
            ],
            &[
                path("doc"),
                path("raw"),
                path("large_text"),
                path("nothing"),
            ],
        )
        .unwrap();
        let cuts = [0, 1, 150, 151, 390, rows];
        let (kinds, theirs, ours) = plain_and_parquets(&batch, &cuts, props);
        let mut all_but_path = vec![true; batch.num_columns() + 1];
        all_but_path[batch.num_columns()] = false;
        assert_eq!(kinds, all_but_path);
        let (theirs, ours) = (theirs.row_group(0), ours.row_group(0));
        let mut compressed_pages = 0;
        for c in 0..theirs.num_columns() {
            let (t, o) = (theirs.column(c), ours.column(c));
            let name = t.column_path().string();
            same_leaf_metadata(t, o, "");
            assert_eq!(o.encodings_mask(), t.encodings_mask(), "{name}");
            let kinds = |m: &parquet::file::metadata::ColumnChunkMetaData| {
                (m.page_encoding_stats()).map(|stats| {
                    (stats.iter())
                        .map(|s| (s.page_type, s.encoding))
                        .collect::<Vec<_>>()
                })
            };
            assert_eq!(kinds(o), kinds(t), "{name}");
            let ratio = o.compressed_size() as f64 / t.compressed_size() as f64;
            assert!((0.97..1.03).contains(&ratio), "{name}: {ratio}");
            if o.compressed_size() < o.uncompressed_size() * 9 / 10 {
                compressed_pages += 1;
            }
        }
        // The texts (and the paths) compress; the images and random bytes
        // are stored.
        assert_eq!(compressed_pages, 3);
    }

    /// Binary and string columns of every offset width, at the top level
    /// and in a struct: images (by signature) and large distinct values
    /// zstd cannot shrink are stored as they are; other large distinct
    /// values lose the dictionary; short values, repeated large values and
    /// all-null columns keep it; nulls are not sampled.
    #[test]
    fn binary_columns_are_classified_by_their_first_values() {
        use arrow_array::{BinaryArray, LargeBinaryArray, LargeStringArray, StructArray};
        use arrow_schema::Field;
        let n = 20;
        let long = |i: usize| format!("{i:04} {}", "text ".repeat(300));
        let jpeg = |i: usize| [&[0xFF, 0xD8, 0xFF, 0xE0][..], &[i as u8; 2000][..]].concat();
        let blob = |i: usize| vec![i as u8; 1500];
        // Distinct values zstd cannot shrink (xorshift bytes).
        let noise = |i: usize| {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
            (0..1500)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>()
        };
        let docs: ArrayRef = Arc::new(StringArray::from_iter_values((0..n).map(long)));
        let nested = StructArray::from(vec![
            (
                Arc::new(Field::new("bytes", DataType::Binary, false)),
                Arc::new(BinaryArray::from_iter_values((0..n).map(jpeg))) as ArrayRef,
            ),
            (
                Arc::new(Field::new("text", DataType::Utf8, false)),
                docs.clone(),
            ),
        ]);
        let batch = RecordBatch::try_from_iter([
            ("doc", docs),
            (
                "large_doc",
                Arc::new(LargeStringArray::from_iter_values((0..n).map(long))) as ArrayRef,
            ),
            (
                "large_blob",
                Arc::new(LargeBinaryArray::from_iter_values((0..n).map(blob))) as ArrayRef,
            ),
            (
                "photo",
                Arc::new(BinaryArray::from_iter_values((0..n).map(jpeg))) as ArrayRef,
            ),
            (
                "noise",
                Arc::new(BinaryArray::from_iter_values((0..n).map(noise))) as ArrayRef,
            ),
            ("image", Arc::new(nested) as ArrayRef),
            (
                "tag",
                Arc::new(StringArray::from_iter_values(
                    (0..n).map(|i| format!("t{i}")),
                )) as ArrayRef,
            ),
            (
                "repeated",
                Arc::new(StringArray::from_iter_values((0..n).map(|i| long(i % 3)))) as ArrayRef,
            ),
            (
                // Nulls first: the sample is the distinct long values after them.
                "sparse",
                Arc::new(StringArray::from_iter(
                    (0..n).map(|i| (i >= 5).then(|| long(i))),
                )) as ArrayRef,
            ),
            (
                "empty",
                Arc::new(StringArray::from_iter((0..n).map(|_| None::<String>))) as ArrayRef,
            ),
            (
                "number",
                Arc::new(Int64Array::from_iter_values(0..n as i64)) as ArrayRef,
            ),
        ])
        .unwrap();
        let found = BinaryColumns::of(&batch);
        let names =
            |paths: &[ColumnPath]| -> Vec<String> { paths.iter().map(|p| p.string()).collect() };
        assert_eq!(names(&found.stored), ["photo", "noise", "image.bytes"]);
        assert_eq!(
            names(&found.no_dictionary),
            ["doc", "large_doc", "large_blob", "image.text", "sparse"]
        );
    }

    /// Every fixed-width type, nullable or not, with NaNs, both zeros, one
    /// value, runs and many values, over several pages: the same values back,
    /// and the chunk metadata parquet's writer gives (statistics, encodings,
    /// page kinds, level histograms), at most 3% over its size.
    #[test]
    fn chunks_read_back_as_parquets_own() {
        let rows = 50_000usize;
        let mut next = random();
        let mix = |i: usize| (i * 7919 + i / 13) % 1000;
        let floats: Vec<f32> = (0..rows)
            .map(|i| match i % 97 {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                _ => mix(i) as f32 / 7.0 - 50.0,
            })
            .collect();
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "i8",
                Arc::new(Int8Array::from_iter_values((0..rows).map(|i| mix(i) as i8))),
            ),
            (
                "i16",
                Arc::new(Int16Array::from_iter_values(
                    (0..rows).map(|i| mix(i) as i16 - 300),
                )),
            ),
            (
                "i32_runs",
                Arc::new(Int32Array::from_iter_values(
                    (0..rows).map(|i| (i / 1000) as i32),
                )),
            ),
            (
                "i32_one",
                Arc::new(Int32Array::from_iter_values((0..rows).map(|_| -7))),
            ),
            (
                "i64",
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|i| (mix(i) as i64) << 40),
                )),
            ),
            (
                "i64_distinct",
                Arc::new(Int64Array::from_iter_values(
                    (0..rows as i64).map(|i| i * 3 - 5),
                )),
            ),
            (
                // Random over the whole range: 64-bit deltas that wrap.
                "i64_random",
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|_| next() as i64),
                )),
            ),
            (
                "i32_random",
                Arc::new(Int32Array::from_iter_values(
                    (0..rows).map(|_| (next() >> 32) as i32),
                )),
            ),
            (
                // ~5 x 10^4 distinct ids of up to 10^6: fewer bytes as deltas.
                "i64_ids",
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|_| (next() % 1_000_000) as i64 + 1),
                )),
            ),
            ("f32", Arc::new(Float32Array::from(floats.clone()))),
            (
                "f64_nulls",
                Arc::new(Float64Array::from_iter(
                    (0..rows).map(|i| (i % 5 != 0).then_some(mix(i) as f64 * 0.25)),
                )),
            ),
            (
                "i32_null_runs",
                Arc::new(Int32Array::from_iter(
                    (0..rows).map(|i| (i / 3000 % 2 == 0).then_some(i as i32 % 3)),
                )),
            ),
            (
                // Every slot valid, with a validity buffer (as `take` and
                // `interleave` may leave): a column without nulls all the same.
                "i64_all_valid",
                Arc::new(Int64Array::new(
                    (0..rows as i64).map(|i| i % 77).collect(),
                    Some(arrow_buffer::NullBuffer::new_valid(rows)),
                )),
            ),
            (
                "text",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("{}", mix(i))),
                )),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let (theirs, ours, kinds) = both(&batch);
        // Every fixed-width column here, not the string column.
        let fixed = batch.num_columns() - 1;
        assert_eq!(kinds[..fixed], vec![true; fixed]);
        assert!(!kinds[fixed]);
        let (their_batch, their_meta) = read(&theirs);
        let (our_batch, our_meta) = read(&ours);
        assert_eq!(our_batch, batch);
        assert_eq!(their_batch, batch);
        assert_chunks_match(
            &their_meta,
            &our_meta,
            &batch,
            &["i64_distinct", "i64_random", "i32_random", "i64_ids"],
        );
    }

    /// Row groups that hold the same few values, first seen in another order
    /// in each, get the same dictionary page, its values in the order of
    /// their bit patterns (a float's -0.0 after the positives, as its sign
    /// bit sets); a dictionary of more than 256 values keeps the order in
    /// which values came. Either way the values read back.
    #[test]
    fn small_dictionaries_are_written_sorted() {
        use parquet::column::page::Page;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let dictionary_page = |values: Vec<f32>| -> Vec<u8> {
            let batch = RecordBatch::try_from_iter([(
                "f",
                Arc::new(Float32Array::from(values)) as ArrayRef,
            )])
            .unwrap();
            let (_, ours, kinds) = both(&batch);
            assert_eq!(kinds, [true]);
            assert_eq!(read(&ours).0, batch);
            let reader = SerializedFileReader::new(ours).unwrap();
            let mut pages = reader
                .get_row_group(0)
                .unwrap()
                .get_column_page_reader(0)
                .unwrap();
            match pages.get_next_page().unwrap().unwrap() {
                Page::DictionaryPage { buf, .. } => buf.to_vec(),
                other => panic!("a dictionary page first, not {:?}", other.page_type()),
            }
        };
        let floats = |n: usize, seed: usize| -> Vec<f32> {
            (0..30_000)
                .map(|i| match (i * 7919 + seed * 104_729) % n {
                    0 => -0.0,
                    k => k as f32 * 0.5 - 20.0,
                })
                .collect()
        };
        let bits = |page: &[u8]| -> Vec<u32> {
            page.chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .collect()
        };
        let (a, b) = (
            dictionary_page(floats(100, 1)),
            dictionary_page(floats(100, 2)),
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 400);
        assert!(bits(&a).is_sorted());
        let (a, b) = (
            dictionary_page(floats(300, 1)),
            dictionary_page(floats(300, 2)),
        );
        assert_ne!(a, b);
        assert!(!bits(&a).is_sorted());
    }

    /// A dictionary of more than 256 values whose keys are skewed (Zipf-like
    /// ids) is written in order of use, most used first, ties in the order
    /// values came, and its chunk is smaller than parquet's; one that is not
    /// skewed keeps the order values came in, and a page written before the
    /// dictionary's last values came keeps the narrower width they need.
    /// Either way the values read back.
    #[test]
    fn skewed_dictionaries_are_ordered_by_use() {
        use parquet::column::page::Page;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let rows = 60_000usize;
        let mut next = random();
        let zipf: Vec<i64> = (0..rows)
            .map(|_| {
                let u = unit(&mut next);
                (3_000f64.powf(u * u) as i64) * 1_000_003
            })
            .collect();
        // 0..1,000 in the first page (10-bit keys), then 0..3,000 (12 bits).
        let widening: Vec<f64> = (0..rows)
            .map(|i| (next() % if i < 20_000 { 1_000 } else { 3_000 }) as f64)
            .collect();
        let batch = RecordBatch::try_from_iter([
            ("zipf", Arc::new(Int64Array::from(zipf.clone())) as ArrayRef),
            ("widening", Arc::new(Float64Array::from(widening.clone()))),
        ])
        .unwrap();
        let (theirs, ours, kinds) = both(&batch);
        assert_eq!(kinds, [true, true]);
        assert_eq!(read(&ours).0, batch);
        let (their_meta, our_meta) = (read(&theirs).1, read(&ours).1);
        let size = |m: &ParquetMetaData| m.row_group(0).column(0).compressed_size();
        assert!(size(&our_meta) < size(&their_meta));

        // The dictionary page's values and each data page's key width.
        let reader = SerializedFileReader::new(ours).unwrap();
        let row_group = reader.get_row_group(0).unwrap();
        let pages = |column: usize| -> (Vec<u64>, Vec<u8>) {
            let (mut dictionary, mut widths) = (Vec::new(), Vec::new());
            for page in row_group.get_column_page_reader(column).unwrap() {
                match page.unwrap() {
                    Page::DictionaryPage { buf, .. } => {
                        dictionary = (buf.chunks_exact(8))
                            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                            .collect()
                    }
                    Page::DataPageV2 {
                        buf,
                        def_levels_byte_len,
                        rep_levels_byte_len,
                        ..
                    } => widths.push(buf[(def_levels_byte_len + rep_levels_byte_len) as usize]),
                    other => panic!("{:?}", other.page_type()),
                }
            }
            (dictionary, widths)
        };
        // Bit patterns in order of first appearance, and counts.
        let expected = |bits: Vec<u64>, by_use: bool| -> Vec<u64> {
            let mut order: Vec<u64> = Vec::new();
            let mut uses = std::collections::HashMap::new();
            for b in bits {
                *uses.entry(b).or_insert(0usize) += 1;
                if uses[&b] == 1 {
                    order.push(b);
                }
            }
            if by_use {
                order.sort_by_key(|b| std::cmp::Reverse(uses[b]));
            }
            order
        };
        let (dictionary, _) = pages(0);
        assert_eq!(
            dictionary,
            expected(zipf.iter().map(|&v| v as u64).collect(), true)
        );
        let (dictionary, widths) = pages(1);
        assert_eq!(
            dictionary,
            expected(widening.iter().map(|v| v.to_bits()).collect(), false)
        );
        assert_eq!(widths, [10, 12, 12]);
    }

    /// Lists of fixed-width values (token ids): null rows, empty lists, null
    /// items, both offset widths, and lists long enough for several pages by
    /// size: the same values back and parquet's own chunk metadata.
    #[test]
    fn lists_read_back_as_parquets_own() {
        use arrow_array::builder::{Int32Builder, LargeListBuilder, ListBuilder};
        use arrow_array::types::Int64Type;
        let rows = 700usize;
        let mut tokens = ListBuilder::new(Int32Builder::new());
        let mut sparse = ListBuilder::new(Int32Builder::new());
        let mut wide = LargeListBuilder::new(arrow_array::builder::Int64Builder::new());
        for r in 0..rows {
            let len = 128 + (r * 7919) % 1900;
            for i in 0..len {
                tokens
                    .values()
                    .append_value(((r * 31 + i * i) % 30_000) as i32);
            }
            tokens.append(true);
            match r % 5 {
                0 => sparse.append(false),
                1 => sparse.append(true),
                _ => {
                    for i in 0..r % 11 {
                        sparse
                            .values()
                            .append_option((i % 3 != 0).then_some((i * r) as i32));
                    }
                    sparse.append(true);
                }
            }
            for i in 0..r % 4 {
                wide.values().append_value((i as i64) << 33);
            }
            wide.append(r % 9 != 0);
        }
        let batch = RecordBatch::try_from_iter([
            ("tokens", Arc::new(tokens.finish()) as ArrayRef),
            ("sparse", Arc::new(sparse.finish()) as ArrayRef),
            ("wide", Arc::new(wide.finish()) as ArrayRef),
        ])
        .unwrap();
        let (theirs, ours, kinds) = both(&batch);
        assert_eq!(kinds, [true, true, true]);
        let (their_batch, their_meta) = read(&theirs);
        let (our_batch, our_meta) = read(&ours);
        assert_eq!(our_batch, their_batch);
        assert_eq!(our_batch, batch);
        let wide = our_batch.column(2).as_list::<i64>();
        assert_eq!(
            wide.value(3).as_primitive::<Int64Type>().values(),
            &[0, 1 << 33, 2 << 33]
        );
        assert_chunks_match(&their_meta, &our_meta, &batch, &[]);
    }

    /// A flat integer column's dictionary is given up for deltas part way
    /// through its values only where the deltas are (nearly) as small: for
    /// uniform values over 10^4, 10^5 and 10^6 (deltas: 0.77, 0.55 and 0.52
    /// of parquet's dictionary), 3,000 random 64-bit ids and Zipf-skewed ids
    /// over 10^6 (a dictionary: far smaller; skewed keys that zstd shrinks),
    /// 5,000 and 9,000 values over 10^6 (a dictionary: 22% and 3.6% smaller
    /// than deltas; a probe that counted keys 20% too large gives the latter
    /// up) and 10,000 (a tie: deltas 1% smaller), every chunk is at most 3%
    /// over parquet's dictionary, and the kind written is the smaller one.
    #[test]
    fn a_dictionary_is_given_up_early_only_for_deltas_as_small() {
        let rows = 32_000usize;
        let mut next = random();
        let mut uniform =
            |n: u64| -> Vec<i64> { (0..rows).map(|_| (next() % n) as i64 + 1).collect() };
        let (c3, c4, c5) = (uniform(10_000), uniform(100_000), uniform(1_000_000));
        let few: Vec<i64> = uniform(5_000).iter().map(|&v| v * 200).collect();
        let close: Vec<i64> = uniform(9_000).iter().map(|&v| v * 111).collect();
        let tie: Vec<i64> = uniform(10_000).iter().map(|&v| v * 100).collect();
        let mut next = random();
        let pool: Vec<i64> = (0..3000).map(|_| next() as i64).collect();
        let ids: Vec<i64> = (0..rows).map(|_| pool[(next() % 3000) as usize]).collect();
        let zipf: Vec<i64> = (0..rows)
            .map(|_| {
                let u = unit(&mut next);
                (1_000_000f64.powf(u * u) as i64).wrapping_mul(2_654_435_761)
            })
            .collect();
        let columns = [
            ("c3", c3, Some(false)),
            ("c4", c4, Some(false)),
            ("c5", c5, Some(false)),
            ("ids", ids, Some(true)),
            ("zipf", zipf, Some(true)),
            ("few", few, Some(true)),
            ("close", close, Some(true)),
            ("tie", tie, None),
        ];
        let batch = RecordBatch::try_from_iter(
            columns
                .iter()
                .map(|(name, v, _)| (*name, Arc::new(Int64Array::from(v.clone())) as ArrayRef)),
        )
        .unwrap();
        let (theirs, ours, _) = both(&batch);
        let (read_back, our_meta) = read(&ours);
        assert_eq!(read_back, batch);
        let (_, their_meta) = read(&theirs);
        for (c, (name, _, dictionary)) in columns.iter().enumerate() {
            let (o, t) = (
                our_meta.row_group(0).column(c),
                their_meta.row_group(0).column(c),
            );
            let deltas = o
                .encodings()
                .any(|e| e == parquet::basic::Encoding::DELTA_BINARY_PACKED);
            if let Some(dictionary) = dictionary {
                assert_eq!(deltas, !dictionary, "{name}");
            }
            let ratio = o.compressed_size() as f64 / t.compressed_size() as f64;
            assert!(ratio < 1.03, "{name}: {ratio:.3} of parquet's dictionary");
        }
    }

    /// A chunk whose dictionary would pass the dictionary page limit is
    /// written as deltas when its values are integers, else left to
    /// parquet's writer (which falls back to PLAIN pages).
    #[test]
    fn a_dictionary_past_the_page_limit_is_left_to_parquet() {
        let rows = 200_000i64;
        let batch = RecordBatch::try_from_iter([
            (
                "v",
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i * 31))) as ArrayRef,
            ),
            (
                "f",
                Arc::new(arrow_array::Float64Array::from_iter_values(
                    (0..rows).map(|i| i as f64 / 3.0),
                )),
            ),
        ])
        .unwrap();
        let (_, ours, kinds) = both(&batch);
        assert_eq!(kinds, [true, false]);
        let (read_back, metadata) = read(&ours);
        assert_eq!(read_back, batch);
        let v = metadata.row_group(0).column(0);
        assert!(
            v.encodings()
                .any(|e| e == parquet::basic::Encoding::DELTA_BINARY_PACKED)
        );
        // A constant delta: a few bytes a block of 128 values.
        assert!(v.compressed_size() < rows / 10, "{}", v.compressed_size());
    }

    /// A data page is stored compressed only when zstd saves a tenth of its
    /// values' bytes, by both encoders: the keys of a log-uniform column of
    /// ~8,000 values (zstd saves 2-4% of parquet's keys, 6-9% of ours, its
    /// dictionary ordered by use) are stored as they are, skewed keys
    /// compressed.
    #[test]
    fn pages_zstd_shrinks_by_under_a_tenth_are_stored_as_they_are() {
        use parquet::column::page::Page;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let rows = 60_000usize;
        let mut next = random();
        // Log-uniform over 20..10^4, spread apart (so that its deltas are
        // wide and it stays a dictionary): skewed enough for its dictionary
        // to be ordered by use, not enough for zstd to save a tenth.
        let band: Vec<i64> = (0..rows)
            .map(|_| (20.0 * 500f64.powf(unit(&mut next))) as i64 * 1_000_000_007)
            .collect();
        let skewed: Vec<i64> = (0..rows)
            .map(|_| (next() % 40_000).trailing_zeros() as i64)
            .collect();
        let batch = RecordBatch::try_from_iter([
            ("band", Arc::new(Int64Array::from(band)) as ArrayRef),
            ("skewed", Arc::new(Int64Array::from(skewed)) as ArrayRef),
        ])
        .unwrap();
        let (theirs, ours, kinds) = both(&batch);
        assert_eq!(kinds, [true, true]);
        for file in [theirs, ours] {
            let reader = SerializedFileReader::new(file).unwrap();
            let row_group = reader.get_row_group(0).unwrap();
            let mut seen = [(0, 0); 2];
            for (column, seen) in seen.iter_mut().enumerate() {
                for page in row_group.get_column_page_reader(column).unwrap() {
                    let Page::DataPageV2 {
                        buf,
                        is_compressed,
                        def_levels_byte_len,
                        rep_levels_byte_len,
                        ..
                    } = page.unwrap()
                    else {
                        continue;
                    };
                    let values = &buf[(def_levels_byte_len + rep_levels_byte_len) as usize..];
                    let ratio =
                        zstd::bulk::compress(values, 3).unwrap().len() as f64 / values.len() as f64;
                    assert_eq!(
                        is_compressed,
                        ratio < UNCOMPRESSED_BELOW,
                        "column {column}: zstd makes a page {ratio:.3} of its size"
                    );
                    if is_compressed {
                        seen.0 += 1;
                    } else {
                        assert!(ratio < 0.99, "{ratio:.3}: a page zstd does shrink");
                        seen.1 += 1;
                    }
                }
            }
            // (compressed, stored) pages of each column.
            assert_eq!(seen, [(0, 3), (3, 0)]);
        }
    }
}
