//! Shard files: row groups appended in order, column chunk checksums added to
//! the footer, then the file published under its final name.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow_schema::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterPropertiesPtr;
use parquet::file::writer::SerializedFileWriter;
use shardfeed_format::{ChunkChecksums, ChunkHasher, Crc32, ShardEntry};

use crate::encode::{ChunkParts, EncodedRowGroup};
use crate::sums::CHUNK_HASH;
use crate::{PreprocessError, Result};

/// A `Write` that keeps a running CRC-32 of everything written, and hands
/// it to [`ChunkTally`] (which counts it and checksums the column chunks it
/// is told of).
///
/// Column chunks encoded here ([`EncodedChunk::into_parts`](crate::encode::EncodedChunk::into_parts)) are spliced in
/// whole: parquet's `append_column` copies a chunk through `io::copy`'s
/// 8 KiB buffer and then into the file's buffer, two copies of every byte
/// (on image rows, a tenth of `shard`'s CPU). [`OpenShard::append`] queues
/// such a chunk's bytes with the position they take in what this writer is
/// handed, and appends it through parquet's writer as placeholders of the
/// same length ([`Placeholder`]); when the placeholders reach that position
/// the chunk's own bytes are written in their place, each buffer as it is.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: crc32fast::Hasher,
    tally: Arc<Mutex<ChunkTally>>,
    /// Chunks to splice in, in order: where their placeholders start, and
    /// their bytes.
    splices: Arc<Mutex<VecDeque<Splice>>>,
    /// Bytes handed to this writer so far (placeholders included).
    handed: u64,
}

/// A chunk to write in place of its placeholders.
struct Splice {
    at: u64,
    len: u64,
    /// Its bytes, `None` once written.
    parts: Option<Vec<Bytes>>,
    /// The file's CRC-32 over its bytes, taken by its encoder.
    crc: crc32fast::Hasher,
}

impl<W: Write> HashingWriter<W> {
    /// Write a spliced chunk's bytes, whose sums its encoder took: the
    /// file's CRC-32 is combined with theirs, the tally passes them over.
    fn pass_on(&mut self, parts: &[Bytes], crc: &crc32fast::Hasher) -> std::io::Result<()> {
        for part in parts {
            self.inner.write_all(part)?;
            lock(&self.tally).pass(part);
        }
        self.hasher.combine(crc);
        Ok(())
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        loop {
            let (at, end, parts) = match lock(&self.splices).front_mut() {
                Some(s) if s.at <= self.handed => (
                    s.at,
                    s.at + s.len,
                    s.parts.take().map(|p| (p, s.crc.clone())),
                ),
                Some(s) => (s.at, s.at + s.len, None),
                None => (u64::MAX, u64::MAX, None),
            };
            // A chunk's placeholders: its bytes go in their place, all of
            // them at its first placeholder.
            if at <= self.handed {
                if let Some((parts, crc)) = parts {
                    self.pass_on(&parts, &crc)?;
                }
                let n = (buf.len() as u64).min(end - self.handed);
                self.handed += n;
                if self.handed == end {
                    lock(&self.splices).pop_front();
                    if n == 0 && !buf.is_empty() {
                        // An empty chunk: on to what follows it.
                        continue;
                    }
                }
                return Ok(n as usize);
            }
            // Bytes of parquet's writer, up to the next chunk's placeholders.
            let n = (buf.len() as u64).min(at - self.handed) as usize;
            let n = self.inner.write(&buf[..n])?;
            self.hasher.update(&buf[..n]);
            lock(&self.tally).pass(&buf[..n]);
            self.handed += n as u64;
            return Ok(n);
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A spliced chunk's stand-in for parquet's `append_column`: as many bytes
/// as the chunk has, their values unwritten (the [`HashingWriter`] writes
/// the chunk's own bytes in their place).
struct Placeholder(u64);

/// Reads the placeholders from one position on.
struct PlaceholderRead(u64);

impl std::io::Read for PlaceholderRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.0);
        self.0 -= n;
        Ok(n as usize)
    }
}

impl parquet::file::reader::Length for Placeholder {
    fn len(&self) -> u64 {
        self.0
    }
}

impl parquet::file::reader::ChunkReader for Placeholder {
    type T = PlaceholderRead;

    fn get_read(&self, start: u64) -> parquet::errors::Result<PlaceholderRead> {
        Ok(PlaceholderRead(self.0.saturating_sub(start)))
    }

    fn get_bytes(&self, _start: u64, _length: usize) -> parquet::errors::Result<Bytes> {
        Err(ParquetError::General(
            "a spliced chunk's placeholders hold no bytes".into(),
        ))
    }
}

/// The column chunks' checksums, taken as their bytes pass on to the file
/// (so a shard's chunks are not read back from disk to be summed).
///
/// parquet's writer buffers what it writes, so a chunk's bytes pass some
/// time after it is appended: [`OpenShard::append`] registers where each
/// chunk will lie, and the bytes are summed when they pass there.
#[derive(Default)]
pub(crate) struct ChunkTally {
    /// Bytes passed on to the file so far.
    passed: u64,
    /// Chunks registered whose bytes have not all passed, in file order:
    /// offset, length and the checksum of what has passed (or the whole
    /// chunk's, where its encoder took it).
    pending: VecDeque<(u64, u64, Sum)>,
    /// Each chunk summed: its offset, length and checksum, in file order.
    done: Vec<(u64, u64, u64)>,
}

/// A chunk's checksum: taken as its bytes pass, or taken already.
enum Sum {
    Passing(ChunkHasher),
    Taken(u64),
}

impl ChunkTally {
    /// Sum the chunk at `start` of `len` bytes as its bytes pass, or take
    /// `sum` for it (its bytes' checksum, taken by its encoder) when they
    /// have passed. A chunk registered where bytes already passed is left
    /// out (the footer's ranges are then read back: see
    /// [`OpenShard::finish`]).
    fn register(&mut self, start: u64, len: u64, sum: Option<u64>) {
        let after = self.pending.back().map_or(self.passed, |&(s, l, _)| s + l);
        if start >= after {
            let sum = sum.map_or_else(|| Sum::Passing(CHUNK_HASH.hasher()), Sum::Taken);
            self.pending.push_back((start, len, sum));
            self.pass(&[]);
        }
    }

    /// `bytes` passed on to the file (after those passed before).
    fn pass(&mut self, bytes: &[u8]) {
        let at = self.passed;
        let end = at + bytes.len() as u64;
        self.passed = end;
        while let Some((start, len, hasher)) = self.pending.front_mut() {
            let stop = *start + *len;
            if *start > end || (*start == end && stop > end) {
                break;
            }
            let from = (*start).max(at);
            let to = stop.min(end);
            if let Sum::Passing(hasher) = hasher {
                hasher.update(&bytes[(from - at) as usize..(to - at) as usize]);
            }
            if to < stop {
                break;
            }
            let (start, len, sum) = self.pending.pop_front().expect("a chunk pending");
            let value = match sum {
                Sum::Passing(hasher) => hasher.finish().value,
                Sum::Taken(value) => value,
            };
            self.done.push((start, len, value));
        }
    }
}

fn lock<T>(shared: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where finished shards go.
pub(crate) trait Publish: Send + Sync {
    /// The local file to write shard `relative` into before publishing it.
    fn staging_path(&self, relative: &str) -> PathBuf;
    /// Make the staged file visible under `relative`.
    fn publish(&self, staged: &Path, relative: &str) -> Result<()>;
}

/// Disk reserved for a shard when it is created: its target size, at most
/// this much (past it, the file system allocates as the bytes come).
pub(crate) const PREALLOCATE_MAX: u64 = 256 << 20;

/// Reserve `len` bytes of disk for `file` without changing its size
/// (`fallocate` with `FALLOC_FL_KEEP_SIZE`): written into blocks already
/// allocated, ext4 no longer reserves and maps every page as it comes (its
/// delayed allocation was a third of the shard writer's system time; blobs'
/// `shard --no-shuffle` 9% less CPU). Whether it was done: a file system
/// without it, or without the space, writes as before.
pub(crate) fn preallocate(file: &File, len: u64) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(len) = libc::off_t::try_from(len) else {
            return false;
        };
        // SAFETY: an open file's descriptor; no memory is passed.
        unsafe { libc::fallocate(file.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, len) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, len);
        false
    }
}

/// A shard being written.
pub(crate) struct OpenShard {
    relative: String,
    staged: PathBuf,
    writer: SerializedFileWriter<HashingWriter<BufWriter<File>>>,
    tally: Arc<Mutex<ChunkTally>>,
    /// Chunks encoded here, to be spliced in by the [`HashingWriter`].
    splices: Arc<Mutex<VecDeque<Splice>>>,
    row_groups: Vec<u64>,
    bytes: u64,
    /// Disk was reserved past what is written ([`preallocate`]): given back
    /// when the shard is finished.
    preallocated: bool,
}

impl OpenShard {
    /// A new shard staged for `relative`, about `target` bytes long.
    pub(crate) fn create(
        relative: String,
        publish: &dyn Publish,
        schema: &SchemaRef,
        props: &WriterPropertiesPtr,
        target: u64,
    ) -> Result<Self> {
        let staged = publish.staging_path(&relative);
        let file = File::create(&staged).map_err(|e| PreprocessError::io("create", &staged, e))?;
        let preallocated = preallocate(&file, target.min(PREALLOCATE_MAX));
        let tally = Arc::new(Mutex::new(ChunkTally::default()));
        let splices = Arc::new(Mutex::new(VecDeque::new()));
        let sink = HashingWriter {
            // parquet's writer hands on its 8 KiB buffer a write at a time:
            // gathered here, a shard is written in 1 MiB system calls.
            inner: BufWriter::with_capacity(1 << 20, file),
            hasher: crc32fast::Hasher::new(),
            tally: tally.clone(),
            splices: splices.clone(),
            handed: 0,
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
            tally,
            splices,
            row_groups: Vec::new(),
            bytes: 0,
            preallocated,
        })
    }

    /// Compressed bytes appended so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn append(&mut self, group: EncodedRowGroup) -> Result<()> {
        let result = (|| {
            let mut at = self.writer.bytes_written() as u64;
            let mut row_group = self.writer.next_row_group()?;
            for chunk in group.chunks {
                let len = chunk.bytes_written();
                match chunk.into_parts() {
                    ChunkParts::Own { parts, close, sums } => {
                        lock(&self.tally).register(at, len, Some(sums.chunk));
                        lock(&self.splices).push_back(Splice {
                            at,
                            len,
                            parts: Some(parts),
                            crc: sums.crc,
                        });
                        row_group.append_column(&Placeholder(len), close)?;
                    }
                    ChunkParts::Parquet(chunk) => {
                        lock(&self.tally).register(at, len, None);
                        chunk.append_to_row_group(&mut row_group)?
                    }
                }
                at += len;
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
        // Each chunk was checksummed as it was written, where the footer
        // says it lies; should a chunk lie elsewhere (parquet's writer
        // adding bytes around it), the chunks are read back from the file
        // and checksummed there.
        self.writer.flush().map_err(|e| io_err("write", e))?;
        if !lock(&self.splices).is_empty() {
            return Err(encode_err(ParquetError::General(
                "a column chunk was not written where its placeholders were".into(),
            )));
        }
        let reader = File::open(&self.staged).map_err(|e| io_err("open", e))?;
        let done = std::mem::take(&mut lock(&self.tally).done);
        let mut taken = done.iter();
        let mut sums: Vec<Vec<u64>> = self
            .writer
            .flushed_row_groups()
            .iter()
            .map(|row_group| {
                (row_group.columns().iter())
                    .map_while(|column| {
                        let (start, len) = column.byte_range();
                        taken
                            .next()
                            .filter(|&&(at, n, _)| (at, n) == (start, len))
                            .map(|&(_, _, sum)| sum)
                    })
                    .collect()
            })
            .collect();
        let whole = taken.next().is_none()
            && (sums.iter().zip(self.writer.flushed_row_groups()))
                .all(|(s, g)| s.len() == g.columns().len());
        debug_assert!(whole, "column chunks written where the footer says");
        if !whole {
            sums.clear();
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
        let bytes = lock(&self.tally).passed;
        if self.preallocated {
            // Truncated to its own length, the file gives back the blocks
            // reserved past its end.
            let file = sink.inner.get_ref();
            let len = file.metadata().map_err(|e| io_err("write", e))?.len();
            file.set_len(len).map_err(|e| io_err("write", e))?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks registered ahead of their bytes are summed exactly, however
    /// the bytes are split into writes (parquet's buffered writer hands on
    /// 8 KiB pieces and larger writes whole), and bytes between chunks (the
    /// file's magic, a page index) are left out.
    #[test]
    fn chunks_are_summed_as_their_bytes_pass_in_any_split() {
        let file: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        // (start, len): a gap before the first, adjacent chunks, an empty
        // one, a gap between, one to the end.
        let chunks = [
            (4, 9_000),
            (9_004, 1),
            (9_005, 0),
            (9_005, 20_000),
            (29_100, 20_900),
        ];
        let mut state = 12345u64;
        for round in 0..200 {
            let mut tally = ChunkTally::default();
            // Some registered before any byte passes, the rest as the
            // bytes before them pass, as `append` registers a row group's.
            let early = round % chunks.len();
            // Odd rounds: the chunks' sums taken already (by their
            // encoders), passed over as their bytes pass.
            let taken = |s: u64, l: u64| {
                (round % 2 == 1).then(|| CHUNK_HASH.of(&file[s as usize..(s + l) as usize]).value)
            };
            for &(s, l) in &chunks[..early] {
                tally.register(s, l, taken(s, l));
            }
            let mut late = chunks[early..].iter().peekable();
            let mut at = 0usize;
            while at < file.len() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let end = (at + 1 + (state >> 33) as usize % 12_000).min(file.len());
                // Registered just before the write that reaches it.
                while let Some(&&(s, l)) = late.peek()
                    && s < end as u64
                {
                    tally.register(s, l, taken(s, l));
                    late.next();
                }
                tally.pass(&file[at..end]);
                at = end;
            }
            let want: Vec<_> = (chunks.iter())
                .map(|&(s, l)| {
                    (
                        s,
                        l,
                        CHUNK_HASH.of(&file[s as usize..(s + l) as usize]).value,
                    )
                })
                .collect();
            assert_eq!(tally.done, want, "round {round}");
            assert!(tally.pending.is_empty());
        }
    }

    /// A shard whose chunks encoded here (`PLAIN` large values stored and
    /// compressed, a dictionary) are spliced in between parquet's own holds,
    /// up to its footer, the bytes of the same chunks appended through
    /// parquet's writer; its checksum and its chunks' are those of its bytes.
    #[test]
    fn spliced_chunks_are_written_where_parquet_would_write_them() {
        use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
        use parquet::file::reader::{FileReader, SerializedFileReader};
        use parquet::schema::types::ColumnPath;

        use crate::encode::{EncodedChunk, Encoder, writer_properties};
        let rows = 600;
        let mut state = 7u64;
        let mut blob = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect()
        };
        let columns: Vec<(&str, ArrayRef)> = vec![
            (
                "id",
                Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i % 50))),
            ),
            (
                "image",
                Arc::new(BinaryArray::from_iter_values(
                    (0..rows).map(|i| blob(3000 + i as usize * 7)),
                )),
            ),
            (
                "name",
                Arc::new(StringArray::from_iter_values(
                    (0..rows).map(|i| format!("n{i}")),
                )),
            ),
            (
                "doc",
                Arc::new(StringArray::from_iter((0..rows).map(|i| {
                    (i % 9 != 2).then(|| format!("{i} {}", "words ".repeat(300)))
                }))),
            ),
        ];
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let schema = batch.schema();
        let path = |name: &str| ColumnPath::new(vec![name.to_string()]);
        let props = writer_properties(3, &[path("image")], &[path("doc")]).unwrap();
        let encoder = Encoder::new(schema.clone(), props.clone()).unwrap();
        let groups = [
            vec![batch.slice(0, 250)],
            vec![batch.slice(250, 100), batch.slice(350, 250)],
        ];
        let encode = |seq: usize| encoder.encode(seq as u64, &groups[seq], 0).unwrap();
        let kinds: Vec<_> = (encode(0).chunks.iter())
            .map(|c| match c {
                EncodedChunk::Parquet(_) => "parquet",
                EncodedChunk::Dictionary(_) => "dictionary",
                EncodedChunk::Plain(_) => "plain",
            })
            .collect();
        assert_eq!(kinds, ["dictionary", "plain", "parquet", "plain"]);

        /// Shards staged and published in a folder.
        struct Folder(std::path::PathBuf);
        impl Publish for Folder {
            fn staging_path(&self, relative: &str) -> PathBuf {
                self.0.join(format!("{relative}.tmp"))
            }
            fn publish(&self, staged: &Path, relative: &str) -> Result<()> {
                std::fs::rename(staged, self.0.join(relative)).unwrap();
                Ok(())
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let publish = Folder(dir.path().to_path_buf());
        let relative = "a.parquet".to_string();
        let mut shard =
            OpenShard::create(relative.clone(), &publish, &schema, &props, 64 << 20).unwrap();
        for seq in 0..groups.len() {
            shard.append(encode(seq)).unwrap();
        }
        let entry = shard.finish(&publish).unwrap();
        let file = std::fs::read(dir.path().join(&relative)).unwrap();
        // The 64 MiB reserved when it was created were given back.
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(dir.path().join(&relative)).unwrap();
            assert!(
                meta.blocks() * 512 < meta.len() + (1 << 20),
                "{} bytes allocated for {}",
                meta.blocks() * 512,
                meta.len()
            );
        }

        let options = ArrowWriterOptions::new().with_properties((*props).clone());
        let mut appended = Vec::new();
        let (mut writer, _) = ArrowWriter::try_new_with_options(&mut appended, schema, options)
            .unwrap()
            .into_serialized_writer()
            .unwrap();
        for seq in 0..groups.len() {
            let mut row_group = writer.next_row_group().unwrap();
            for chunk in encode(seq).chunks {
                chunk.append_to_row_group(&mut row_group).unwrap();
            }
            row_group.close().unwrap();
        }
        writer.close().unwrap();

        let footer_start = |f: &[u8]| {
            let n = f.len();
            n - 8 - u32::from_le_bytes(f[n - 8..n - 4].try_into().unwrap()) as usize
        };
        assert_eq!(
            file[..footer_start(&file)],
            appended[..footer_start(&appended)]
        );
        assert_eq!(entry.bytes, file.len() as u64);
        assert_eq!(entry.crc32, Some(Crc32::of(&file)));
        let reader = SerializedFileReader::new(Bytes::from(file.clone())).unwrap();
        let metadata = reader.metadata();
        let kv = (metadata
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter())
        .find(|kv| kv.key == CHUNK_HASH.key())
        .and_then(|kv| kv.value.clone())
        .unwrap();
        let sums = ChunkChecksums::decode(CHUNK_HASH, &kv).unwrap().sums;
        for (group, sums) in metadata.row_groups().iter().zip(&sums) {
            assert_eq!(group.columns().len(), sums.len());
            for (column, &sum) in group.columns().iter().zip(sums) {
                let (start, len) = column.byte_range();
                let bytes = &file[start as usize..(start + len) as usize];
                assert_eq!(CHUNK_HASH.of(bytes).value, sum);
            }
        }
    }

    /// A chunk registered where bytes already passed is left out, not summed
    /// from its middle.
    #[test]
    fn a_chunk_registered_behind_the_bytes_is_left_out() {
        let mut tally = ChunkTally::default();
        tally.pass(&[1; 100]);
        tally.register(50, 100, None);
        tally.pass(&[2; 100]);
        assert!(tally.done.is_empty() && tally.pending.is_empty());
    }
}
