//! Encoding row groups: Arrow batches to compressed Parquet column chunks, on
//! any thread, independent of the file they will be spliced into.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
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
    stored: &[&str],
) -> Result<WriterPropertiesPtr, ParquetError> {
    let mut builder = WriterProperties::builder();
    for column in stored {
        let path = ColumnPath::from(*column);
        builder = builder
            .set_column_compression(path.clone(), Compression::UNCOMPRESSED)
            .set_column_dictionary_enabled(path, false);
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
