//! A global row shuffle for inputs larger than memory.
//!
//! Scatter: every row goes to one of `B` buckets on disk, chosen by a seeded
//! hash of its position in the input, so each bucket is a uniform random
//! sample of all inputs. Gather: each bucket (sized to a quarter of the
//! memory budget) is loaded, permuted with a seeded Fisher-Yates shuffle and
//! emitted. The result is a uniformly random permutation of the whole input,
//! a pure function of the inputs, the seed and the bucket count.
//!
//! Memory: pending rows of all buckets share a quarter of the budget (at least
//! 32 KiB each, plus a 32 KiB write buffer), one bucket is loaded at a time.
//! Buckets are capped at 4096, so inputs up to ~1000x the budget keep every
//! bucket within a quarter of it; beyond that buckets grow past it.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::{Path, PathBuf};

use arrow_array::{RecordBatch, UInt32Array};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use arrow_select::take::take_record_batch;
use shardfeed_format::permute::{SplitMix64, hash_words};

use crate::measure::batch_bytes;
use crate::{PreprocessError, Result};

/// Rows per batch emitted by the gather phase.
const GATHER_BATCH_ROWS: usize = 8192;
/// At most this many buckets (open files) in the scatter phase.
const MAX_BUCKETS: u64 = 4096;

/// The number of buckets for `input_bytes` under `memory_budget`: each bucket
/// should fit in a quarter of the budget.
pub(crate) fn bucket_count(input_bytes: u64, memory_budget: u64) -> u64 {
    input_bytes
        .div_ceil((memory_budget / 4).max(1))
        .clamp(1, MAX_BUCKETS)
}

struct Bucket {
    path: PathBuf,
    writer: Option<StreamWriter<BufWriter<File>>>,
    pending: Vec<RecordBatch>,
    pending_bytes: u64,
}

/// Rows scattered to buckets on disk, waiting to be gathered.
pub(crate) struct Spilled {
    _dir: tempfile::TempDir,
    buckets: Vec<PathBuf>,
    schema: SchemaRef,
    seed: u64,
}

/// Scatter `batches` into `count` buckets under a new folder in `temp_dir`.
pub(crate) fn scatter(
    batches: impl Iterator<Item = Result<RecordBatch>>,
    schema: &SchemaRef,
    seed: u64,
    count: u64,
    memory_budget: u64,
    temp_dir: Option<&Path>,
) -> Result<Spilled> {
    let dir = crate::output::temp_folder("shardfeed-shuffle", temp_dir)?;
    // Rows wait in memory per bucket up to this many bytes before a write, so
    // the pending rows of all buckets together stay within a quarter of the budget.
    let flush_bytes = (memory_budget / 4 / count).max(32 << 10);
    let mut buckets: Vec<Bucket> = (0..count)
        .map(|i| Bucket {
            path: dir.path().join(format!("bucket-{i:05}.arrows")),
            writer: None,
            pending: Vec::new(),
            pending_bytes: 0,
        })
        .collect();
    let mut row = 0u64;
    let mut targets: Vec<Vec<u32>> = vec![Vec::new(); count as usize];
    for batch in batches {
        let batch = batch?;
        for t in &mut targets {
            t.clear();
        }
        for i in 0..batch.num_rows() {
            let h = hash_words(&[seed, row]);
            let b = ((h as u128 * count as u128) >> 64) as usize;
            targets[b].push(i as u32);
            row += 1;
        }
        for (b, indices) in targets.iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let part = take_record_batch(&batch, &UInt32Array::from(indices.clone()))
                .map_err(|e| PreprocessError::read(&buckets[b].path, None, e))?;
            let bucket = &mut buckets[b];
            bucket.pending_bytes += batch_bytes(&part);
            bucket.pending.push(part);
            if bucket.pending_bytes >= flush_bytes {
                flush(bucket, schema)?;
            }
        }
    }
    for bucket in &mut buckets {
        flush(bucket, schema)?;
        if let Some(mut w) = bucket.writer.take() {
            w.finish()
                .map_err(|e| PreprocessError::read(&bucket.path, None, e))?;
        }
    }
    Ok(Spilled {
        buckets: buckets.into_iter().map(|b| b.path).collect(),
        _dir: dir,
        schema: schema.clone(),
        seed,
    })
}

fn flush(bucket: &mut Bucket, schema: &SchemaRef) -> Result<()> {
    if bucket.pending.is_empty() {
        return Ok(());
    }
    let err = |e: arrow_schema::ArrowError| PreprocessError::read(&bucket.path, None, e);
    let batch = concat_batches(schema, &bucket.pending).map_err(err)?;
    bucket.pending.clear();
    bucket.pending_bytes = 0;
    if bucket.writer.is_none() {
        let file = File::create(&bucket.path)
            .map_err(|e| PreprocessError::io("create", &bucket.path, e))?;
        bucket.writer = Some(
            StreamWriter::try_new(BufWriter::with_capacity(32 << 10, file), schema).map_err(err)?,
        );
    }
    let writer = bucket.writer.as_mut().expect("created above");
    writer.write(&batch).map_err(err)
}

impl Spilled {
    /// The bucket files (a bucket that got no rows has no file) and the
    /// folder holding them (deleted when dropped).
    pub(crate) fn into_files(self) -> (tempfile::TempDir, Vec<PathBuf>) {
        (self._dir, self.buckets)
    }

    /// Each bucket in turn, loaded and permuted, as batches.
    pub(crate) fn gather(self) -> impl Iterator<Item = Result<RecordBatch>> {
        let Spilled {
            _dir,
            buckets,
            schema,
            seed,
        } = self;
        buckets.into_iter().enumerate().flat_map(move |(i, path)| {
            // Keep the folder alive until every bucket was read.
            let _keep = &_dir;
            match load_permuted(&path, &schema, hash_words(&[seed, i as u64, 0x6761_7468])) {
                Ok(batches) => batches.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            }
        })
    }
}

/// Load one bucket, permute its rows, and cut it into batches.
fn load_permuted(path: &Path, schema: &SchemaRef, seed: u64) -> Result<Vec<RecordBatch>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let err = |e: arrow_schema::ArrowError| PreprocessError::read(path, None, e);
    let file = File::open(path).map_err(|e| PreprocessError::io("open", path, e))?;
    let reader =
        StreamReader::try_new(BufReader::with_capacity(1 << 20, file), None).map_err(err)?;
    let parts = reader
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(err)?;
    let all = concat_batches(schema, &parts).map_err(err)?;
    drop(parts);
    let _ = std::fs::remove_file(path);
    let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    order
        .chunks(GATHER_BATCH_ROWS)
        .map(|chunk| take_record_batch(&all, &UInt32Array::from(chunk.to_vec())).map_err(err))
        .collect()
}
