//! `verify`: re-read every shard of a dataset and check it against the manifest.

use std::sync::atomic::{AtomicUsize, Ordering};

use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ParquetRecordBatchReaderBuilder};
use serde::Serialize;
use shardfeed_format::{Location, Manifest, ShardEntry};

use crate::error::{LoaderError, Result};
use crate::shard::{check_file, check_schema};

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
/// and compare row counts. Uses `threads` threads (0: all cores).
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

fn verify_shard(
    location: &Location,
    manifest: &Manifest,
    entry: &ShardEntry,
    runtime: &tokio::runtime::Handle,
) -> Result<u64> {
    let url = location.url_of(&entry.path);
    let path = location.child(&entry.path);
    let store = location.store().clone();
    let (meta, bytes) = runtime
        .block_on(async move {
            let got = store.get(&path).await?;
            let meta = got.meta.clone();
            Ok((meta, got.bytes().await?))
        })
        .map_err(|source| match source {
            object_store::Error::NotFound { .. } => LoaderError::MissingShard {
                url: url.clone(),
                error: source.into(),
            },
            source => LoaderError::Store {
                url: url.clone(),
                error: source.into(),
            },
        })?;
    if let Some(expected) = &entry.fingerprint {
        check_fingerprint(location, entry, expected, &meta)?;
    }
    check_file(entry, &bytes)?;
    let decode_err = |row_group, source| LoaderError::Decode {
        shard: entry.path.clone(),
        row_group,
        source,
    };
    let metadata =
        ArrowReaderMetadata::load(&bytes, Default::default()).map_err(|e| decode_err(None, e))?;
    check_schema(entry, &manifest.schema, metadata.schema())?;
    let mut rows = 0u64;
    for (i, &expected) in entry.row_groups.iter().enumerate() {
        let reader =
            ParquetRecordBatchReaderBuilder::new_with_metadata(bytes.clone(), metadata.clone())
                .with_row_groups(vec![i])
                .with_batch_size(8192)
                .build()
                .map_err(|e| decode_err(Some(i), e))?;
        let mut group_rows = 0u64;
        for batch in reader {
            group_rows += batch.map_err(|e| decode_err(Some(i), e.into()))?.num_rows() as u64;
        }
        if group_rows != expected {
            return Err(LoaderError::Corrupt {
                shard: entry.path.clone(),
                row_group: Some(i),
                detail: format!("decoded {group_rows} rows, the manifest says {expected}"),
            });
        }
        rows += group_rows;
    }
    if rows != entry.rows {
        return Err(LoaderError::Corrupt {
            shard: entry.path.clone(),
            row_group: None,
            detail: format!("decoded {rows} rows, the manifest says {}", entry.rows),
        });
    }
    Ok(rows)
}
