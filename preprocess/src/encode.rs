//! Encoding row groups: Arrow batches to compressed Parquet column chunks, on
//! any thread, independent of the file they will be spliced into.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{
    ArrowColumnChunk, ArrowRowGroupWriterFactory, ArrowWriterOptions, compute_leaves,
};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::{
    EnabledStatistics, WriterProperties, WriterPropertiesPtr, WriterVersion,
};
use parquet::schema::types::ColumnPath;

/// A data page is stored compressed only if zstd makes it smaller than
/// this fraction of its size.
const UNCOMPRESSED_BELOW: f64 = 0.97;

/// The writer properties of every shard. Columns named in `stored` hold
/// data that is compressed already (JPEG, PNG, video files): they are
/// written uncompressed and without a dictionary, instead of zstd trying
/// every page (and the dictionary hashing every value of a row group's
/// first megabyte) to store it as it was anyway.
pub(crate) fn writer_properties(
    zstd_level: i32,
    stored: &[ColumnPath],
) -> Result<WriterPropertiesPtr, ParquetError> {
    let mut builder = WriterProperties::builder();
    for path in stored {
        builder = builder
            .set_column_compression(path.clone(), Compression::UNCOMPRESSED)
            .set_column_dictionary_enabled(path.clone(), false);
    }
    Ok(Arc::new(
        builder
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(zstd_level)?))
            // V2 data pages carry their own "compressed" flag: a page zstd
            // shrinks by less than 3% (random floats, image bytes, hashes) is
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

/// Values sampled per binary column by [`media_columns`].
const MEDIA_SAMPLE: usize = 16;

/// Whether `schema` has a binary column, at the top level or in a struct
/// (where [`media_columns`] looks).
pub(crate) fn has_binary_leaf(schema: &Schema) -> bool {
    fn binary(t: &DataType) -> bool {
        match t {
            DataType::Binary | DataType::LargeBinary => true,
            DataType::Struct(fields) => fields.iter().any(|f| binary(f.data_type())),
            _ => false,
        }
    }
    schema.fields().iter().any(|f| binary(f.data_type()))
}

/// The binary columns of `batch` (at the top level, or in structs, as
/// Hugging Face datasets store an `image` as `{bytes, path}`) whose first
/// non-null values (up to [`MEDIA_SAMPLE`]) are all images of a compressed
/// format, told by their first bytes: JPEG, PNG, WebP or GIF.
pub(crate) fn media_columns(batch: &RecordBatch) -> Vec<ColumnPath> {
    fn visit(path: Vec<String>, array: &ArrayRef, found: &mut Vec<ColumnPath>) {
        let sample: Vec<&[u8]> = match array.data_type() {
            DataType::Binary => array
                .as_binary::<i32>()
                .iter()
                .flatten()
                .take(MEDIA_SAMPLE)
                .collect(),
            DataType::LargeBinary => array
                .as_binary::<i64>()
                .iter()
                .flatten()
                .take(MEDIA_SAMPLE)
                .collect(),
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
        if !sample.is_empty() && sample.iter().all(|v| compressed_image(v)) {
            found.push(ColumnPath::new(path));
        }
    }
    let mut found = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        visit(vec![field.name().clone()], column, &mut found);
    }
    found
}

/// Whether `value` starts as a JPEG, PNG, WebP or GIF file does.
fn compressed_image(value: &[u8]) -> bool {
    value.starts_with(&[0xFF, 0xD8, 0xFF])
        || value.starts_with(b"\x89PNG\r\n\x1a\n")
        || (value.len() >= 12 && value.starts_with(b"RIFF") && &value[8..12] == b"WEBP")
        || value.starts_with(b"GIF87a")
        || value.starts_with(b"GIF89a")
}

/// A row group encoded and compressed, ready to be appended to a shard.
pub(crate) struct EncodedRowGroup {
    pub seq: u64,
    pub chunks: Vec<ArrowColumnChunk>,
    pub rows: u64,
    /// Uncompressed Arrow bytes of the rows.
    pub raw_bytes: u64,
    /// Compressed bytes the chunks will occupy.
    pub encoded_bytes: u64,
}

/// Encodes row groups for a schema; shareable across threads.
pub(crate) struct Encoder {
    schema: SchemaRef,
    factory: ArrowRowGroupWriterFactory,
}

impl Encoder {
    pub(crate) fn new(schema: SchemaRef, props: WriterPropertiesPtr) -> Result<Self, ParquetError> {
        // The factory only needs the file's schema and properties; chunks it
        // makes can be spliced into any file with the same ones.
        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let (_, factory) = ArrowWriter::try_new_with_options(Vec::new(), schema.clone(), options)?
            .into_serialized_writer()?;
        Ok(Encoder { schema, factory })
    }

    pub(crate) fn encode(
        &self,
        seq: u64,
        batch: &RecordBatch,
        raw_bytes: u64,
    ) -> Result<EncodedRowGroup, ParquetError> {
        let mut writers = self.factory.create_column_writers(0)?;
        let mut next = writers.iter_mut();
        for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
            for leaf in compute_leaves(field, column)? {
                next.next()
                    .ok_or_else(|| ParquetError::General("more leaves than column writers".into()))?
                    .write(&leaf)?;
            }
        }
        let chunks = writers
            .into_iter()
            .map(|w| w.close())
            .collect::<Result<Vec<_>, _>>()?;
        let encoded_bytes = chunks.iter().map(|c| c.close().bytes_written).sum();
        Ok(EncodedRowGroup {
            seq,
            chunks,
            rows: batch.num_rows() as u64,
            raw_bytes,
            encoded_bytes,
        })
    }
}
