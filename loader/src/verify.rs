//! `verify`: re-read every shard of a dataset and check it against the manifest.

use std::sync::atomic::{AtomicUsize, Ordering};

use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use serde::Serialize;
use shardfeed_format::{Location, Manifest, ShardEntry};

use crate::error::{LoaderError, Result};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use parquet::file::reader::ChunkReader;
use shardfeed_format::Crc32;

use crate::parquet::SparseFile;
use crate::shard::{check_chunk, check_pages, check_schema, decode_footer};

/// One shard that failed verification.
#[derive(Clone, Debug, Serialize)]
pub struct ShardProblem {
    /// The shard's relative path.
    pub shard: String,
    /// What is wrong, with the row group when known.
    pub problem: String,
}

/// The outcome of [`verify_dataset`].
#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    /// The dataset.
    pub dataset: String,
    /// Shards checked.
    pub shards: usize,
    /// Rows decoded.
    pub rows: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Shards that failed, in manifest order.
    pub problems: Vec<ShardProblem>,
}

impl VerifyReport {
    /// Whether every shard verified.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Read every shard of the dataset at `url` fully: check its size, whole-file,
/// footer and column chunk checksums against the manifest, decode every row
/// and compare row counts. Uses `threads` threads (0: all cores). Each file
/// is read once, in order, holding one row group's bytes at a time.
pub fn verify_dataset(location: &Location, threads: usize) -> Result<VerifyReport> {
    verify_dataset_with(location, &[], threads)
}

/// [`verify_dataset`], with `storage_options` for an index's bases on object
/// stores (an index's files are also checked against their fingerprints).
pub fn verify_dataset_with(
    location: &Location,
    storage_options: &[(String, String)],
    threads: usize,
) -> Result<VerifyReport> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| LoaderError::Io {
            op: "start I/O runtime".into(),
            source,
        })?;
    let manifest = runtime.block_on(location.read_manifest())?;
    let places = crate::build::index_places(&manifest, storage_options, None)?;
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let next = AtomicUsize::new(0);
    let results: Vec<(usize, Result<u64>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.min(manifest.shards.len()).max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(entry) = manifest.shards.get(i) else {
                            break;
                        };
                        let place = match entry.base {
                            Some(b) => &places[b as usize],
                            None => location,
                        };
                        out.push((i, verify_shard(place, &manifest, entry, runtime.handle())));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("verify worker panicked"))
            .collect()
    });
    let mut results = results;
    results.sort_by_key(|(i, _)| *i);
    let mut report = VerifyReport {
        dataset: location.url().to_string(),
        shards: manifest.shards.len(),
        rows: 0,
        bytes: 0,
        problems: Vec::new(),
    };
    for (i, result) in results {
        let entry = &manifest.shards[i];
        match result {
            Ok(rows) => {
                report.rows += rows;
                report.bytes += entry.bytes;
            }
            Err(e) => report.problems.push(ShardProblem {
                shard: entry.path.clone(),
                problem: e.to_string(),
            }),
        }
    }
    Ok(report)
}

/// Check an index's file against the fingerprint it was indexed with: its
/// ETag and version as the store reports them, or a local file's
/// modification time.
fn check_fingerprint(
    location: &Location,
    entry: &ShardEntry,
    expected: &shardfeed_format::Fingerprint,
    meta: &object_store::ObjectMeta,
) -> Result<()> {
    let changed = |what: &str| LoaderError::Corrupt {
        shard: location.url_of(&entry.path),
        row_group: None,
        detail: format!(
            "the file changed since it was indexed ({what} differs): index it again (`shardfeed index`)"
        ),
    };
    if let Some(root) = location.local_root() {
        if let Some(ns) = expected.modified_ns {
            let found = std::fs::metadata(root.join(&entry.path))
                .ok()
                .and_then(|m| shardfeed_format::modified_ns(&m));
            if found != Some(ns) {
                return Err(changed("its modification time"));
            }
        }
        return Ok(());
    }
    if expected.etag.is_some() && meta.e_tag != expected.etag {
        return Err(changed("its ETag"));
    }
    if expected.version.is_some() && meta.version != expected.version {
        return Err(changed("its version"));
    }
    Ok(())
}

/// Check one file: its footer (one range read), then every byte once as a
/// stream, in order: the file's CRC-32 (when the manifest has one), each
/// column chunk's checksum, and each row group decoded as soon as its bytes
/// have passed, holding at most one row group's bytes (whatever the file's
/// size). Returns its rows.
fn verify_shard(
    location: &Location,
    manifest: &Manifest,
    entry: &ShardEntry,
    runtime: &tokio::runtime::Handle,
) -> Result<u64> {
    let url = location.url_of(&entry.path);
    let path = location.child(&entry.path);
    let store = location.store().clone();
    let store_error = |source: object_store::Error| match source {
        object_store::Error::NotFound { .. } => LoaderError::MissingShard {
            url: url.clone(),
            error: source.into(),
        },
        source => LoaderError::Store {
            url: url.clone(),
            error: source.into(),
        },
    };
    // Transient failures (5xx, resets, a body cut short) are retried: the
    // GET and the footer's read again, the stream from where it broke.
    let retry = location.retry();
    let got = (runtime.block_on(retry.run(|| store.get(&path), || {}))).map_err(store_error)?;
    let meta = got.meta.clone();
    if let Some(expected) = &entry.fingerprint {
        check_fingerprint(location, entry, expected, &meta)?;
    }
    let corrupt = |row_group: Option<usize>, detail: String| LoaderError::Corrupt {
        shard: entry.path.clone(),
        row_group,
        detail,
    };
    if meta.size != entry.bytes {
        return Err(corrupt(
            None,
            format!(
                "file is {} bytes, the manifest says {}",
                meta.size, entry.bytes
            ),
        ));
    }
    let footer_start = entry
        .bytes
        .checked_sub(entry.footer_len)
        .ok_or_else(|| corrupt(None, "the footer is longer than the file".into()))?;
    let footer = || store.get_range(&path, footer_start..entry.bytes);
    let footer_bytes = (runtime.block_on(retry.run(footer, || {}))).map_err(store_error)?;
    let footer = decode_footer(entry, &footer_bytes)?;
    let decode_err = |row_group, source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group,
        source,
    };
    let metadata =
        ArrowReaderMetadata::try_new(Arc::new(footer.metadata.clone()), Default::default())
            .map_err(|e| decode_err(None, e))?;
    check_schema(entry, &manifest.schema, metadata.schema())?;
    // Each row group's bytes (from its first column chunk to the end of its
    // last), in file order; row groups whose bytes overlap read as one span.
    let mut groups = Vec::with_capacity(footer.metadata.num_row_groups());
    for (i, rg) in footer.metadata.row_groups().iter().enumerate() {
        let (mut start, mut end) = (u64::MAX, 0u64);
        for (j, column) in rg.columns().iter().enumerate() {
            let (at, len) = column.byte_range();
            let to = at
                .checked_add(len)
                .filter(|&to| to <= footer_start)
                .ok_or_else(|| corrupt(Some(i), format!("column {j} lies outside the file")))?;
            start = start.min(at);
            end = end.max(to);
        }
        if start <= end {
            groups.push((start, end, i));
        }
    }
    groups.sort_unstable();
    let mut spans: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for (start, end, i) in groups {
        match spans.last_mut() {
            Some(last) if start < last.1 => {
                last.1 = last.1.max(end);
                last.2.push(i);
            }
            _ => spans.push((start, end, vec![i])),
        }
    }
    let mut source = Source::new(location, entry, got, runtime)?;
    let mut rows = 0u64;
    for (start, end, members) in spans {
        source.skip(start - source.position)?;
        let span = SparseFile::new(entry.bytes, vec![(start, source.take(end - start)?)]);
        for i in members {
            for (j, column) in footer.metadata.row_group(i).columns().iter().enumerate() {
                let (at, len) = column.byte_range();
                let chunk = usize::try_from(len)
                    .map_err(|e| e.to_string())
                    .and_then(|len| span.get_bytes(at, len).map_err(|e| e.to_string()))
                    .map_err(|e| corrupt(Some(i), format!("column {j}: {e}")))?;
                check_chunk(entry, &footer, i, j, &chunk)?;
                // An index's page checksums too (they must tile the chunk).
                check_pages(entry, &footer, i, j, at, &chunk)?;
            }
            rows += decode_group(entry, &span, &metadata, i)?;
        }
    }
    source.skip(entry.bytes - source.position)?;
    let position = source.position + source.rest()?;
    if position != entry.bytes {
        return Err(corrupt(
            None,
            format!("read {position} bytes, the manifest says {}", entry.bytes),
        ));
    }
    let found = Crc32(source.crc.finalize());
    if let Some(expected) = entry.crc32
        && found != expected
    {
        return Err(corrupt(
            None,
            format!("file checksum {found} does not match the manifest's {expected}"),
        ));
    }
    if rows != entry.rows {
        return Err(corrupt(
            None,
            format!("decoded {rows} rows, the manifest says {}", entry.rows),
        ));
    }
    Ok(rows)
}

/// A file's bytes in order, each passed once, with their CRC-32: a local
/// file read straight into buffers of the sizes asked for, else the GET's
/// stream.
struct Source<'a> {
    position: u64,
    crc: crc32fast::Hasher,
    shard: String,
    url: String,
    kind: SourceKind<'a>,
}

enum SourceKind<'a> {
    Local(std::fs::File),
    Remote {
        stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
        pending: Bytes,
        runtime: &'a tokio::runtime::Handle,
        resume: Resume,
    },
}

/// Where a remote file's stream starts again after a transient failure:
/// a range read from the bytes received on, of the object with the same
/// ETag (a file replaced meanwhile fails the precondition, not mixed in).
struct Resume {
    store: Arc<dyn object_store::ObjectStore>,
    path: object_store::path::Path,
    etag: Option<String>,
    size: u64,
    received: u64,
    retry: shardfeed_format::RetryPolicy,
    retries: u32,
}

/// The most bytes passed at once when skipping.
const SKIP_PIECE: u64 = 8 << 20;

impl<'a> Source<'a> {
    fn new(
        location: &Location,
        entry: &ShardEntry,
        got: object_store::GetResult,
        runtime: &'a tokio::runtime::Handle,
    ) -> Result<Self> {
        let url = location.url_of(&entry.path);
        let kind =
            match location.local_root().map(|root| root.join(&entry.path)) {
                Some(file) => SourceKind::Local(std::fs::File::open(&file).map_err(|source| {
                    LoaderError::Io {
                        op: format!("open {}", file.display()),
                        source,
                    }
                })?),
                None => SourceKind::Remote {
                    resume: Resume {
                        store: location.store().clone(),
                        path: location.child(&entry.path),
                        etag: got.meta.e_tag.clone(),
                        size: got.meta.size,
                        received: 0,
                        retry: location.retry().clone(),
                        retries: 0,
                    },
                    stream: got.into_stream(),
                    pending: Bytes::new(),
                    runtime,
                },
            };
        Ok(Source {
            position: 0,
            crc: crc32fast::Hasher::new(),
            shard: entry.path.clone(),
            url,
            kind,
        })
    }

    fn ended(&self, wanted: u64) -> LoaderError {
        LoaderError::Corrupt {
            shard: self.shard.clone(),
            row_group: None,
            detail: format!(
                "the file ends before byte {}: it changed while being read",
                self.position + wanted
            ),
        }
    }

    /// The next piece of a remote file's stream (`None` at its end).
    fn pull(&mut self) -> Result<Option<Bytes>> {
        let SourceKind::Remote {
            stream,
            runtime,
            resume,
            ..
        } = &mut self.kind
        else {
            return Ok(None);
        };
        let failed = |e: object_store::Error| LoaderError::Store {
            url: self.url.clone(),
            error: e.into(),
        };
        loop {
            match runtime.block_on(stream.next()) {
                Some(Ok(bytes)) => {
                    resume.received += bytes.len() as u64;
                    return Ok(Some(bytes));
                }
                None => return Ok(None),
                Some(Err(e))
                    if shardfeed_format::retry::is_transient(&e)
                        && resume.retries < resume.retry.max_retries
                        && resume.received < resume.size =>
                {
                    resume.retries += 1;
                    tracing::info!(
                        url = %self.url,
                        at = resume.received,
                        error = %shardfeed_format::redact::text(&e.to_string()),
                        "reading the file again from where its stream broke"
                    );
                    let rest = object_store::GetOptions {
                        range: Some(object_store::GetRange::Offset(resume.received)),
                        if_match: resume.etag.clone(),
                        ..Default::default()
                    };
                    let get = || resume.store.get_opts(&resume.path, rest.clone());
                    let got = runtime.block_on(resume.retry.run(get, || {}));
                    *stream = got.map_err(failed)?.into_stream();
                }
                Some(Err(e)) => return Err(failed(e)),
            }
        }
    }

    /// The next `n` bytes.
    fn take(&mut self, n: u64) -> Result<Bytes> {
        let wanted = usize::try_from(n).map_err(|_| self.ended(n))?;
        let bytes = match &mut self.kind {
            SourceKind::Local(file) => {
                let mut buffer = vec![0u8; wanted];
                std::io::Read::read_exact(file, &mut buffer).map_err(|source| {
                    match source.kind() {
                        std::io::ErrorKind::UnexpectedEof => self.ended(n),
                        _ => LoaderError::Io {
                            op: format!("read {}", self.url),
                            source,
                        },
                    }
                })?;
                Bytes::from(buffer)
            }
            SourceKind::Remote { pending, .. } if pending.len() >= wanted => {
                pending.split_to(wanted)
            }
            SourceKind::Remote { pending, .. } => {
                let mut out = bytes::BytesMut::with_capacity(wanted);
                out.extend_from_slice(&std::mem::take(pending));
                while out.len() < wanted {
                    let Some(mut piece) = self.pull()? else {
                        return Err(self.ended(n));
                    };
                    let used = piece.split_to((wanted - out.len()).min(piece.len()));
                    out.extend_from_slice(&used);
                    if let SourceKind::Remote { pending, .. } = &mut self.kind {
                        *pending = piece;
                    }
                }
                out.freeze()
            }
        };
        self.crc.update(&bytes);
        self.position += n;
        Ok(bytes)
    }

    /// Pass the next `n` bytes (checksummed, not kept).
    fn skip(&mut self, mut n: u64) -> Result<()> {
        while n > 0 {
            let piece = n.min(SKIP_PIECE);
            self.take(piece)?;
            n -= piece;
        }
        Ok(())
    }

    /// Bytes the file still has past what was read (0 for a file that ends
    /// where the manifest says).
    fn rest(&mut self) -> Result<u64> {
        let mut extra = 0u64;
        match &mut self.kind {
            SourceKind::Local(file) => {
                let mut buffer = [0u8; 4096];
                loop {
                    let n = std::io::Read::read(file, &mut buffer).map_err(|source| {
                        LoaderError::Io {
                            op: format!("read {}", self.url),
                            source,
                        }
                    })?;
                    if n == 0 {
                        break;
                    }
                    extra += n as u64;
                }
            }
            SourceKind::Remote { pending, .. } => {
                extra += std::mem::take(pending).len() as u64;
                while let Some(piece) = self.pull()? {
                    extra += piece.len() as u64;
                }
            }
        }
        Ok(extra)
    }
}

/// Decode row group `i` from `span` (the bytes read of its file), checking
/// its rows against the manifest's count.
fn decode_group(
    entry: &ShardEntry,
    span: &SparseFile,
    metadata: &ArrowReaderMetadata,
    i: usize,
) -> Result<u64> {
    let decode_err = |source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group: Some(i),
        source,
    };
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(span.clone(), metadata.clone())
        .with_row_groups(vec![i])
        .with_batch_size(8192)
        .build()
        .map_err(decode_err)?;
    let mut rows = 0u64;
    for batch in reader {
        rows += batch.map_err(|e| decode_err(e.into()))?.num_rows() as u64;
    }
    let expected = entry.row_groups.get(i).copied();
    if Some(rows) != expected {
        return Err(LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: Some(i),
            detail: format!(
                "decoded {rows} rows, the manifest says {}",
                expected.map_or("none".into(), |e| e.to_string())
            ),
        });
    }
    Ok(rows)
}
