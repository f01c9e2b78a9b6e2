//! Shard files: row groups appended in order, column chunk checksums added to
//! the footer, then the file published under its final name.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow_schema::SchemaRef;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterPropertiesPtr;
use parquet::file::writer::SerializedFileWriter;
use shardfeed_format::{ChunkChecksums, ChunkHash, Crc32, ShardEntry};

use crate::encode::EncodedRowGroup;
use crate::{PreprocessError, Result};

/// A `Write` that keeps a running CRC-32 and length of everything written.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Where finished shards go.
pub(crate) trait Publish: Send + Sync {
    /// The local file to write shard `relative` into before publishing it.
    fn staging_path(&self, relative: &str) -> PathBuf;
    /// Make the staged file visible under `relative`.
    fn publish(&self, staged: &Path, relative: &str) -> Result<()>;
}

/// How shards' column chunks are checksummed (the loader checks every byte
/// it reads against them; see [`ChunkHash`]).
const CHUNK_HASH: ChunkHash = ChunkHash::Xxh3;

/// A shard being written.
pub(crate) struct OpenShard {
    relative: String,
    staged: PathBuf,
    writer: SerializedFileWriter<HashingWriter<BufWriter<File>>>,
    row_groups: Vec<u64>,
    bytes: u64,
}

impl OpenShard {
    pub(crate) fn create(
        relative: String,
        publish: &dyn Publish,
        schema: &SchemaRef,
        props: &WriterPropertiesPtr,
    ) -> Result<Self> {
        let staged = publish.staging_path(&relative);
        let file = File::create(&staged).map_err(|e| PreprocessError::io("create", &staged, e))?;
        let sink = HashingWriter {
            // parquet's writer hands on its 8 KiB buffer a write at a time:
            // gathered here, a shard is written in 1 MiB system calls.
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: crc32fast::Hasher::new(),
            len: 0,
        };
        let options = ArrowWriterOptions::new().with_properties((**props).clone());
        let encode_err = |source| PreprocessError::Encode {
            shard: relative.clone(),
            source,
        };
        let (writer, _) = ArrowWriter::try_new_with_options(sink, schema.clone(), options)
            .and_then(|w| w.into_serialized_writer())
            .map_err(encode_err)?;
        Ok(OpenShard {
            relative,
            staged,
            writer,
            row_groups: Vec::new(),
            bytes: 0,
        })
    }

    /// Compressed bytes appended so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn append(&mut self, group: EncodedRowGroup) -> Result<()> {
        let result = (|| {
            let mut row_group = self.writer.next_row_group()?;
            for chunk in group.chunks {
                chunk.append_to_row_group(&mut row_group)?;
            }
            row_group.close()?;
            Ok::<_, ParquetError>(())
        })();
        result.map_err(|source| PreprocessError::Encode {
            shard: self.relative.clone(),
            source,
        })?;
        self.row_groups.push(group.rows);
        self.bytes += group.encoded_bytes;
        Ok(())
    }

    /// Write the footer (with column chunk checksums), publish the file and
    /// describe it for the manifest.
    pub(crate) fn finish(mut self, publish: &dyn Publish) -> Result<ShardEntry> {
        let relative = self.relative.clone();
        let encode_err = |source| PreprocessError::Encode {
            shard: relative.clone(),
            source,
        };
        let io_err = |op, e| PreprocessError::io(op, &self.staged, e);
        // Everything before the footer is on disk once flushed; checksum each
        // column chunk from there (it is still in the page cache).
        self.writer.flush().map_err(|e| io_err("write", e))?;
        let reader = File::open(&self.staged).map_err(|e| io_err("open", e))?;
        let mut sums = Vec::with_capacity(self.writer.flushed_row_groups().len());
        let mut buf = Vec::new();
        for row_group in self.writer.flushed_row_groups() {
            let mut group = Vec::with_capacity(row_group.columns().len());
            for column in row_group.columns() {
                let (start, len) = column.byte_range();
                buf.resize(len as usize, 0);
                reader
                    .read_exact_at(&mut buf, start)
                    .map_err(|e| io_err("read", e))?;
                group.push(CHUNK_HASH.of(&buf).value);
            }
            sums.push(group);
        }
        let checksums = ChunkChecksums {
            hash: CHUNK_HASH,
            sums,
        };
        self.writer.append_key_value_metadata(KeyValue::new(
            CHUNK_HASH.key().to_string(),
            checksums.encode(),
        ));
        let mut sink = self.writer.into_inner().map_err(encode_err)?;
        sink.flush().map_err(|e| io_err("write", e))?;
        let bytes = sink.len;
        let crc32 = Crc32(sink.hasher.finalize());

        let mut tail = [0u8; 8];
        reader
            .read_exact_at(&mut tail, bytes - 8)
            .map_err(|e| io_err("read", e))?;
        let footer_len = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes")) as u64 + 8;
        let mut footer = vec![0u8; footer_len as usize];
        reader
            .read_exact_at(&mut footer, bytes - footer_len)
            .map_err(|e| io_err("read", e))?;
        publish.publish(&self.staged, &self.relative)?;
        Ok(ShardEntry {
            path: self.relative,
            rows: self.row_groups.iter().sum(),
            bytes,
            row_groups: self.row_groups,
            footer_len,
            footer_crc32: Crc32::of(&footer),
            crc32: Some(crc32),
            base: None,
            fingerprint: None,
            chunk_checksums: None,
            page_checksums: None,
        })
    }

    /// Remove the staged file of an abandoned shard.
    pub(crate) fn abandon(self) {
        let _ = std::fs::remove_file(&self.staged);
    }
}
