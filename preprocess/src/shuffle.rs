//! A global row shuffle for inputs larger than memory.
//!
//! Scatter: every row goes to one of `B` buckets, chosen by a seeded hash of
//! its position in the input, so each bucket is a uniform random sample of
//! all inputs. Gather: each bucket is loaded, permuted with a seeded
//! Fisher-Yates shuffle and emitted in chunks. The result is a uniformly
//! random permutation of the whole input, a pure function of the inputs, the
//! seed and the bucket count.
//!
//! Buckets are small, 1/32 of the memory budget each: rows are taken from a
//! bucket in random order, and a bucket whose columns fit in the CPU's caches
//! makes that a few nanoseconds a value instead of a cache miss each.
//!
//! A bucket is appended to its file on disk whenever its pending rows reach
//! its share of 1/16 of the budget (one that never does, as with a small
//! input, stays in memory), by a writer thread so the copy into the page
//! cache overlaps the scatter. While one bucket is
//! emitted, the next one is loaded, made one contiguous batch and permuted by
//! another thread.
//!
//! Large rows of an input estimated to fit in half the budget are not
//! written at all: each bucket holds them by index into the input batches,
//! and the gather copies them straight from those ([`HOLD_DIVISOR`]).
//!
//! A bucket's parts of small rows are concatenated before they are written
//! (fewer, larger IPC messages); parts of rows of 4 KiB or more are written as
//! they are (one copy fewer).
//!
//! A table of fixed-width and boolean columns only takes another path for the same
//! order: raw column bytes instead of Arrow batches ([`column_spill`]),
//! flushed at 1/64 of the budget.
//!
//! Memory: 1/16 of the budget for the pending rows of all buckets (at least
//! 32 KiB each); during gather, the bucket being emitted and the next one.
//! Holding more (a whole input that would fit in the budget, say) was tried
//! and was slower: every byte of memory is paged in (and zeroed) once, which
//! costs more than writing it to a bucket file and reading it back from the
//! page cache. Buckets are capped at 4096, so
//! inputs up to 128x the budget keep every bucket within 1/32 of it; beyond
//! that buckets grow (to a quarter of the budget at 1024x). A bucket file is
//! reopened for each write, so the number of buckets is not limited by the
//! open-file limit.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::{RecordBatch, UInt32Array};
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use arrow_select::interleave::interleave_record_batch;
use arrow_select::take::take_record_batch;
use crossbeam_channel::{Receiver, Sender, bounded};
use shardfeed_format::permute::{SplitMix64, hash_words};

use crate::column_spill::{self, Layout, Pending, Source};
use crate::measure::batch_bytes;
use crate::{PreprocessError, Result};

/// A bucket whose rows average fewer bytes is made one batch before its rows
/// are taken in random order (cheaper than gathering from many batches).
const CONTIGUOUS_BELOW_ROW_BYTES: u64 = 4096;
/// Large rows (as [`CONTIGUOUS_BELOW_ROW_BYTES`] counts them) of an input
/// estimated to fit in this fraction of the memory budget are held in
/// memory, by index into the input batches: no copy into bucket parts, and
/// no bucket files written and read back. Should the input be larger than
/// its estimate, the rows held go to bucket files once the batches held pass
/// that fraction, and every row after them.
pub(crate) const HOLD_DIVISOR: u64 = 2;
/// Buckets of raw columns ([`column_spill`]) are flushed at their share of
/// this fraction of the memory budget.
const COLUMN_FLUSH_DIVISOR: u64 = 64;
/// At most this many buckets in the scatter phase.
const MAX_BUCKETS: u64 = 4096;
/// A pending part at least this large is written as it is, not concatenated
/// with the other parts of its bucket first.
const WHOLE_PART_BYTES: u64 = 1 << 20;

/// The number of buckets for `input_bytes` under `memory_budget`: enough that
/// each bucket fits in 1/32 of it.
pub(crate) fn bucket_count(input_bytes: u64, memory_budget: u64) -> u64 {
    input_bytes
        .div_ceil((memory_budget / 32).max(1))
        .clamp(1, MAX_BUCKETS)
}

/// Rows a bucket holds in memory.
#[derive(Clone)]
enum Part {
    /// A batch of the bucket's own rows.
    Owned(RecordBatch),
    /// Rows of an input batch, by index: large rows held without a copy
    /// while the input batches held stay within [`HOLD_DIVISOR`].
    Rows(RecordBatch, Vec<u32>),
}

impl Part {
    fn num_rows(&self) -> usize {
        match self {
            Part::Owned(batch) => batch.num_rows(),
            Part::Rows(_, rows) => rows.len(),
        }
    }

    /// The batch its rows come from.
    fn batch(&self) -> &RecordBatch {
        match self {
            Part::Owned(batch) | Part::Rows(batch, _) => batch,
        }
    }

    /// Its rows as a batch of their own (a copy for rows held by index).
    fn into_owned(self) -> Result<RecordBatch> {
        match self {
            Part::Owned(batch) => Ok(batch),
            Part::Rows(batch, rows) => take_record_batch(&batch, &UInt32Array::from(rows))
                .map_err(|e| PreprocessError::read("(shuffle bucket)", None, e)),
        }
    }

    /// Row `i` of the part as a row of [`Part::batch`].
    fn source_row(&self, i: usize) -> usize {
        match self {
            Part::Owned(_) => i,
            Part::Rows(_, rows) => rows[i] as usize,
        }
    }
}

/// Whether the scatter holds large rows of an input estimated at
/// `estimated_bytes` in memory ([`HOLD_DIVISOR`]).
pub(crate) fn holds(estimated_bytes: u64, memory_budget: u64) -> bool {
    estimated_bytes <= memory_budget / HOLD_DIVISOR
}

/// Where one bucket's rows are.
enum Stored {
    /// Never written: every row is still in memory.
    Memory(Vec<Part>),
    /// Written to this file (one or more IPC streams, one after another).
    File(PathBuf),
    /// Raw columns never written ([`column_spill`]).
    Columns(Pending),
    /// Raw columns written to this file, and the rows of each flush.
    ColumnFile(PathBuf, Vec<usize>),
    /// Got no rows.
    Empty,
}

struct Bucket {
    path: PathBuf,
    written: bool,
    pending: Vec<Part>,
    pending_bytes: u64,
    pending_rows: u64,
    /// Rows of fixed-width columns ([`column_spill`]), and the rows of each
    /// flush of them written so far.
    columns: Pending,
    flushes: Vec<usize>,
}

/// What the spill writer thread writes.
enum Spill {
    Parts(PathBuf, Vec<Part>),
    Columns(PathBuf, Pending),
}

/// Rows scattered to buckets, waiting to be gathered.
pub(crate) struct Spilled {
    dir: tempfile::TempDir,
    buckets: Vec<Stored>,
    schema: SchemaRef,
    seed: u64,
    /// Where buckets are raw fixed-width columns ([`column_spill`]).
    layout: Option<Arc<Layout>>,
}

/// Scatter `batches` into `count` buckets: a bucket is appended to its file
/// under a new folder in `temp_dir` whenever its pending rows reach its share
/// of 1/16 of `memory_budget`; one that never does stays in memory. Large
/// rows of an input whose `estimated_bytes` fit in half the budget are held
/// in memory ([`HOLD_DIVISOR`]). A table of fixed-width columns is
/// scattered as raw columns ([`column_spill`]) unless the buckets are
/// wanted `as_files` ([`Spilled::into_files`], read by other processes).
pub(crate) fn scatter(
    batches: impl Iterator<Item = Result<RecordBatch>>,
    schema: &SchemaRef,
    seed: u64,
    count: u64,
    (memory_budget, estimated_bytes): (u64, u64),
    temp_dir: Option<&Path>,
    as_files: bool,
) -> Result<Spilled> {
    let dir = crate::output::temp_folder("shardfeed-shuffle", temp_dir)?;
    let layout = Layout::of(schema)
        .filter(|l| !as_files && l.row_bytes() < CONTIGUOUS_BELOW_ROW_BYTES)
        .map(Arc::new);
    // A bucket of raw columns is flushed at its share of 1/64 of the budget
    // (no IPC message to amortise; a quarter of the memory).
    let flush_rows = layout.as_ref().map_or(0, |l| {
        let bytes = (memory_budget / COLUMN_FLUSH_DIVISOR / count.max(1)).max(32 << 10);
        (bytes / l.row_bytes().max(1)).max(1) as usize
    });
    let flush_bytes = (memory_budget / 16 / count.max(1)).max(32 << 10);
    let hold_bytes = if holds(estimated_bytes, memory_budget) {
        memory_budget / HOLD_DIVISOR
    } else {
        0
    };
    // Bytes of the input batches held by index; `None` once rows are
    // written to bucket files.
    let mut held = Some(0u64);
    let mut buckets: Vec<Bucket> = (0..count)
        .map(|i| Bucket {
            path: dir.path().join(format!("bucket-{i:05}.arrows")),
            written: false,
            pending: Vec::new(),
            pending_bytes: 0,
            pending_rows: 0,
            columns: Pending::new(flush_rows),
            flushes: Vec::new(),
        })
        .collect();
    let (tx, rx) = bounded::<Spill>(1);
    // Column buffers come back from the writer to be filled again.
    let (back_tx, back_rx) = bounded::<Pending>(count as usize);
    let mut spill = SpillWriter::new(schema)?;
    // Disk reserved for a bucket file of raw columns when it is created: its
    // share of the input, at most the shard writer's cap (the table's
    // shuffle 2-4% faster; IPC buckets get none: see `SpillWriter::append`).
    let reserve = (estimated_bytes / count.max(1)).min(crate::writer::PREALLOCATE_MAX);
    let writer = std::thread::Builder::new()
        .name("shardfeed-spill".into())
        .spawn(move || -> Result<()> {
            for job in rx {
                match job {
                    Spill::Parts(path, parts) => spill.append(&path, &parts)?,
                    Spill::Columns(path, mut pending) => {
                        pending.append_to(&path, reserve)?;
                        pending.clear();
                        let _ = back_tx.try_send(pending);
                    }
                }
            }
            spill.finish()
        })
        .map_err(|e| PreprocessError::io("start a thread writing", dir.path(), e))?;
    let scattered = (|| -> Result<()> {
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
            if let Some(layout) = &layout {
                let mut pendings: Vec<&mut Pending> =
                    buckets.iter_mut().map(|b| &mut b.columns).collect();
                column_spill::scatter_batch(layout, &batch, &targets, &mut pendings)?;
                for bucket in &mut buckets {
                    if bucket.columns.rows() >= flush_rows {
                        flush_columns(bucket, flush_rows, &back_rx, &tx)?;
                    }
                }
                continue;
            }
            if let Some(so_far) = held {
                let bytes = batch_bytes(&batch);
                let rows = batch.num_rows().max(1) as u64;
                if bytes / rows >= CONTIGUOUS_BELOW_ROW_BYTES
                    && so_far.saturating_add(bytes) <= hold_bytes
                {
                    held = Some(so_far + bytes);
                    for (b, indices) in targets.iter_mut().enumerate() {
                        if !indices.is_empty() {
                            let share = bytes * indices.len() as u64 / rows;
                            buckets[b]
                                .push(Part::Rows(batch.clone(), std::mem::take(indices)), share);
                        }
                    }
                    continue;
                }
                // From here on rows go to bucket files: the rows held by
                // index go first (copied out on the writer thread).
                held = None;
                if so_far > 0 {
                    for bucket in &mut buckets {
                        flush(bucket, schema, &tx)?;
                    }
                }
            }
            for (b, indices) in targets.iter().enumerate() {
                if indices.is_empty() {
                    continue;
                }
                let bucket = &mut buckets[b];
                // A part owns its rows (a slice would keep its whole input
                // batch alive until the bucket flushes: memory the budget
                // does not see, with many small buckets).
                let part = if indices.len() == batch.num_rows() {
                    batch.clone()
                } else {
                    take_record_batch(&batch, &UInt32Array::from(indices.clone()))
                        .map_err(|e| PreprocessError::read(&bucket.path, None, e))?
                };
                let bytes = batch_bytes(&part);
                bucket.push(Part::Owned(part), bytes);
                if bucket.pending_bytes >= flush_bytes {
                    flush(bucket, schema, &tx)?;
                }
            }
        }
        for bucket in &mut buckets {
            if bucket.written {
                flush(bucket, schema, &tx)?;
                if bucket.columns.rows() > 0 {
                    flush_columns(bucket, flush_rows, &back_rx, &tx)?;
                }
            }
        }
        Ok(())
    })();
    drop(tx);
    let written = writer
        .join()
        .unwrap_or_else(|_| Err(PreprocessError::Cancelled));
    // A failed write closes the channel, which fails the scatter with a
    // vaguer error: report the write's own first.
    written?;
    scattered?;
    let buckets = buckets
        .into_iter()
        .map(|b| {
            if !b.flushes.is_empty() {
                Stored::ColumnFile(b.path, b.flushes)
            } else if b.written {
                Stored::File(b.path)
            } else if b.columns.rows() > 0 {
                Stored::Columns(b.columns)
            } else if b.pending.is_empty() {
                Stored::Empty
            } else {
                Stored::Memory(b.pending)
            }
        })
        .collect();
    Ok(Spilled {
        dir,
        buckets,
        schema: schema.clone(),
        seed,
        layout,
    })
}

impl Bucket {
    fn push(&mut self, part: Part, bytes: u64) {
        self.pending_bytes += bytes;
        self.pending_rows += part.num_rows() as u64;
        self.pending.push(part);
    }
}

/// Hand a bucket's fixed-width columns to the writer thread (taking back a
/// written one's buffers where there is one).
fn flush_columns(
    bucket: &mut Bucket,
    rows: usize,
    back: &Receiver<Pending>,
    tx: &Sender<Spill>,
) -> Result<()> {
    let spare = back.try_recv().unwrap_or_else(|_| Pending::new(rows));
    let pending = std::mem::replace(&mut bucket.columns, spare);
    bucket.flushes.push(pending.rows());
    bucket.written = true;
    tx.send(Spill::Columns(bucket.path.clone(), pending))
        .map_err(|_| PreprocessError::Cancelled)
}

/// Hand a bucket's pending rows to the writer thread.
fn flush(bucket: &mut Bucket, schema: &SchemaRef, tx: &Sender<Spill>) -> Result<()> {
    if bucket.pending.is_empty() {
        return Ok(());
    }
    let parts = std::mem::take(&mut bucket.pending);
    // Parts of large rows are written as they are: concatenating them first
    // would be one more copy of every byte, for nothing the gather needs.
    let whole = bucket.pending_bytes / parts.len() as u64 >= WHOLE_PART_BYTES
        || bucket.pending_bytes / bucket.pending_rows.max(1) >= CONTIGUOUS_BELOW_ROW_BYTES;
    bucket.pending_bytes = 0;
    bucket.pending_rows = 0;
    let parts = if whole || parts.len() == 1 {
        parts
    } else {
        let parts = parts
            .into_iter()
            .map(Part::into_owned)
            .collect::<Result<Vec<_>>>()?;
        vec![Part::Owned(
            concat_batches(schema, &parts)
                .map_err(|e| PreprocessError::read(&bucket.path, None, e))?,
        )]
    };
    bucket.written = true;
    tx.send(Spill::Parts(bucket.path.clone(), parts))
        .map_err(|_| PreprocessError::Cancelled)
}

/// Writes bucket files, each one Arrow IPC stream that grows by appends:
/// the file is reopened for each write (so any number of buckets can be
/// written without holding a file open each), and the schema message the
/// stream writer starts with is written only when the file is created.
struct SpillWriter {
    schema: SchemaRef,
    /// The schema message a stream writer writes first.
    header: Vec<u8>,
    /// The files created so far (they get their end-of-stream marker last).
    created: Vec<PathBuf>,
}

/// The end-of-stream marker of the Arrow IPC stream format.
const IPC_EOS: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

impl SpillWriter {
    fn new(schema: &SchemaRef) -> Result<Self> {
        // (`into_inner` would end the stream: the bytes so far are the header.)
        let header = StreamWriter::try_new(Vec::new(), schema)
            .map_err(|e| PreprocessError::read("(shuffle bucket)", None, e))?
            .get_ref()
            .clone();
        Ok(SpillWriter {
            schema: schema.clone(),
            header,
            created: Vec::new(),
        })
    }

    /// Append `parts` to the stream in `path` (no disk reserved for a new
    /// file, unlike raw columns' buckets: the generator's token lists were
    /// 3-4% slower with it, three alternating runs).
    fn append(&mut self, path: &Path, parts: &[Part]) -> Result<()> {
        let err = |e: arrow_schema::ArrowError| PreprocessError::read(path, None, e);
        let io = |e: std::io::Error| PreprocessError::io("write", path, e);
        let file = column_spill::open_append(path)?;
        let new = file.metadata().map_err(io)?.len() == 0;
        if new {
            self.created.push(path.to_path_buf());
        }
        let sink = SkipHeader {
            inner: BufWriter::with_capacity(64 << 10, file),
            header: &self.header,
            skipped: if new { self.header.len() } else { 0 },
        };
        let mut writer = StreamWriter::try_new(sink, &self.schema).map_err(err)?;
        for part in parts {
            writer.write(&part.clone().into_owned()?).map_err(err)?;
        }
        // Not `finish` nor `into_inner`: those end the stream.
        writer.get_mut().inner.flush().map_err(io)
    }

    /// End every stream written.
    fn finish(self) -> Result<()> {
        for path in &self.created {
            let io = |e: std::io::Error| PreprocessError::io("write", path, e);
            let mut file = OpenOptions::new().append(true).open(path).map_err(io)?;
            file.write_all(&IPC_EOS).map_err(io)?;
        }
        Ok(())
    }
}

/// A writer that drops the stream writer's schema message when appending to
/// an existing stream (checking that it is the expected one).
struct SkipHeader<'a, W> {
    inner: W,
    header: &'a [u8],
    /// Bytes of the header seen so far.
    skipped: usize,
}

impl<W: Write> Write for SkipHeader<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.skipped < self.header.len() {
            let n = buf.len().min(self.header.len() - self.skipped);
            if buf[..n] != self.header[self.skipped..self.skipped + n] {
                return Err(std::io::Error::other(
                    "the stream writer's schema message changed between appends",
                ));
            }
            self.skipped += n;
            return Ok(n);
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Map a bucket file into memory and delete it (its pages live until the
/// mapping is dropped).
fn map_bucket(path: &Path) -> Result<memmap2::Mmap> {
    let io = |e: std::io::Error| PreprocessError::io("read", path, e);
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Err(PreprocessError::read(path, None, "empty bucket file"));
    }
    // SAFETY: the file is this process's own, in its private temporary
    // folder, complete (the writer thread was joined) and never written
    // again; nothing else truncates it while it is mapped.
    let map = unsafe { memmap2::MmapOptions::new().populate().map(&file) }.map_err(io)?;
    let _ = std::fs::remove_file(path);
    Ok(map)
}

/// Read a bucket file: mapped into memory, the batches point into the page
/// cache (no copy, no fresh memory), and the file is deleted at once (its
/// pages live until the last batch is dropped).
fn read_bucket(path: &Path) -> Result<Vec<RecordBatch>> {
    let err = |e: arrow_schema::ArrowError| PreprocessError::read(path, None, e);
    let map = map_bucket(path)?;
    let len = map.len();
    let ptr = std::ptr::NonNull::new(map.as_ptr().cast_mut()).expect("a mapping is not null");
    // SAFETY: `ptr` points to `len` readable bytes owned by `map`, which the
    // buffer keeps alive.
    let mut bytes = unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(map)) };
    let mut decoder = StreamDecoder::new();
    let mut parts = Vec::new();
    while !bytes.is_empty() {
        if let Some(batch) = decoder.decode(&mut bytes).map_err(err)? {
            parts.push(batch);
        }
    }
    decoder.finish().map_err(err)?;
    Ok(parts)
}

impl Spilled {
    /// The bucket files (a bucket that got no rows has no file) and the
    /// folder holding them (deleted when dropped); buckets still in memory
    /// are written out first.
    pub(crate) fn into_files(self) -> Result<(tempfile::TempDir, Vec<PathBuf>)> {
        let mut files = Vec::with_capacity(self.buckets.len());
        for (i, stored) in self.buckets.into_iter().enumerate() {
            let path = self.dir.path().join(format!("bucket-{i:05}.arrows"));
            if matches!(stored, Stored::Columns(_) | Stored::ColumnFile(..)) {
                return Err(PreprocessError::read(
                    &path,
                    None,
                    "a bucket of raw columns asked for as an IPC file",
                ));
            }
            if let Stored::Memory(parts) = &stored {
                let mut writer = SpillWriter::new(&self.schema)?;
                writer.append(&path, parts)?;
                writer.finish()?;
            }
            files.push(path);
        }
        Ok((self.dir, files))
    }

    /// Each bucket in turn, loaded and permuted, in batches of about
    /// `chunk_bytes`; the first bucket's raw columns are taken by `workers`
    /// threads (nothing else runs until it is ready).
    pub(crate) fn gather(self, chunk_bytes: u64, workers: usize) -> Gather {
        Gather {
            first_workers: workers.max(1),
            buckets: self.buckets.into_iter().enumerate().collect(),
            loading: None,
            current: None,
            schema: self.schema,
            seed: self.seed,
            chunk_bytes: chunk_bytes.max(1),
            layout: self.layout,
            _dir: self.dir,
        }
    }
}

/// The gather phase: an iterator of permuted batches.
pub(crate) struct Gather {
    buckets: std::collections::VecDeque<(usize, Stored)>,
    /// The next bucket, being loaded and permuted by another thread.
    loading: Option<JoinHandle<Result<Permuted>>>,
    current: Option<Permuted>,
    schema: SchemaRef,
    seed: u64,
    chunk_bytes: u64,
    layout: Option<Arc<Layout>>,
    /// Threads that take the first bucket's raw columns: the encoders wait
    /// for it, so the cores are free (every later bucket is taken by one
    /// thread while the one before it is encoded).
    first_workers: usize,
    // Declared last: dropped after a loading thread was joined.
    _dir: tempfile::TempDir,
}

/// A loaded bucket's rows.
enum Rows {
    /// Parts not made one batch (large rows, rows held by index, or a column
    /// past 2 GiB of offsets), and the row index in their concatenation
    /// where each starts.
    Parts(Vec<Part>, Vec<u32>),
    /// The rows already in the order they go out in (taken from one batch
    /// on the loading thread, off the thread that feeds the encoders):
    /// chunks are slices.
    InOrder(RecordBatch),
}

/// One loaded bucket and the order its rows go out in.
struct Permuted {
    rows: Rows,
    /// The order rows go out in (empty once `rows` is `InOrder`).
    order: Vec<u32>,
    /// Rows in the bucket.
    len: usize,
    at: usize,
    chunk_rows: usize,
}

impl Gather {
    /// Start loading (and permuting) the next bucket on another thread.
    fn prefetch(&mut self) -> Result<()> {
        if self.loading.is_some() {
            return Ok(());
        }
        let Some((i, stored)) = self.buckets.pop_front() else {
            return Ok(());
        };
        let schema = self.schema.clone();
        let seed = hash_words(&[self.seed, i as u64, 0x6761_7468]);
        let chunk_bytes = self.chunk_bytes;
        let layout = self.layout.clone();
        let workers = std::mem::replace(&mut self.first_workers, 1);
        let handle = std::thread::Builder::new()
            .name("shardfeed-gather".into())
            .spawn(move || {
                let parts = match stored {
                    Stored::Memory(parts) => parts,
                    Stored::Empty => Vec::new(),
                    Stored::File(path) => {
                        read_bucket(&path)?.into_iter().map(Part::Owned).collect()
                    }
                    Stored::Columns(pending) => {
                        return permute_columns(
                            layout,
                            Source::Memory(&pending),
                            seed,
                            (chunk_bytes, workers),
                        );
                    }
                    Stored::ColumnFile(path, flushes) => {
                        let map = map_bucket(&path)?;
                        return permute_columns(
                            layout,
                            Source::File(&map, &flushes, &path),
                            seed,
                            (chunk_bytes, workers),
                        );
                    }
                };
                permute(&schema, parts, seed, chunk_bytes)
            })
            .map_err(|e| PreprocessError::io("start a thread reading", self._dir.path(), e))?;
        self.loading = Some(handle);
        Ok(())
    }

    fn load_next(&mut self) -> Option<Result<Permuted>> {
        if let Err(e) = self.prefetch() {
            return Some(Err(e));
        }
        let handle = self.loading.take()?;
        let permuted = match handle.join() {
            Ok(result) => result,
            Err(_) => Err(PreprocessError::Cancelled),
        };
        // Load the following bucket while this one is emitted.
        if let Err(e) = self.prefetch() {
            return Some(Err(e));
        }
        Some(permuted)
    }
}

/// A bucket of more rows than a `u32` indexes.
fn too_many_rows(rows: u64) -> PreprocessError {
    PreprocessError::BadOption {
        option: "--memory-budget",
        reason: format!(
            "a shuffle bucket would hold {rows} rows, more than the 2^32 a bucket can \
             hold; lower the budget (more, smaller buckets) or shard with --no-shuffle"
        ),
    }
}

/// A bucket of raw fixed-width columns ([`column_spill`]) in the order of a
/// seeded shuffle: the same order [`permute`] gives the same rows; its
/// columns taken by `workers` threads.
fn permute_columns(
    layout: Option<Arc<Layout>>,
    source: Source<'_>,
    seed: u64,
    (chunk_bytes, workers): (u64, usize),
) -> Result<Permuted> {
    let layout = layout.ok_or(PreprocessError::Cancelled)?;
    let rows = source.rows();
    let n = u32::try_from(rows).map_err(|_| too_many_rows(rows))?;
    let mut order: Vec<u32> = (0..n).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    let batch = column_spill::take(&layout, source, &order, workers)?;
    // Chunks sized by the rows' Arrow bytes, as [`permute`] sizes them.
    let per_row = batch_bytes(&batch) / u64::from(n).max(1);
    let chunk_rows = (chunk_bytes / per_row.max(1)).clamp(1, 1 << 16) as usize;
    Ok(Permuted {
        rows: Rows::InOrder(batch),
        order: Vec::new(),
        len: n as usize,
        at: 0,
        chunk_rows,
    })
}

/// Make a bucket's rows one batch where possible and order them by a
/// seeded shuffle.
fn permute(schema: &SchemaRef, parts: Vec<Part>, seed: u64, chunk_bytes: u64) -> Result<Permuted> {
    let mut starts = Vec::with_capacity(parts.len());
    let mut rows = 0u64;
    let mut bytes = 0u64;
    for part in &parts {
        starts.push(rows);
        rows += part.num_rows() as u64;
        let whole = part.batch().num_rows().max(1) as u64;
        bytes += batch_bytes(part.batch()) * part.num_rows() as u64 / whole;
    }
    let too_many = || too_many_rows(rows);
    let n = u32::try_from(rows).map_err(|_| too_many())?;
    let per_row = bytes / u64::from(n).max(1);
    let parts_of = |parts: Vec<Part>, starts: Vec<u64>| -> Result<Rows> {
        let starts = starts
            .into_iter()
            .map(|s| u32::try_from(s).map_err(|_| too_many()))
            .collect::<Result<Vec<u32>>>()?;
        Ok(Rows::Parts(parts, starts))
    };
    let mut order: Vec<u32> = (0..n).collect();
    SplitMix64::new(seed).shuffle(&mut order);
    // Small rows: the bucket made one batch and taken in order, here on the
    // loading thread (off the thread that feeds the encoders).
    let in_order = |one: &RecordBatch, order: &mut Vec<u32>| -> Result<Rows> {
        take_record_batch(one, &UInt32Array::from(std::mem::take(order)))
            .map(Rows::InOrder)
            .map_err(|e| PreprocessError::read("(shuffle bucket)", None, e))
    };
    let owned = parts.iter().all(|p| matches!(p, Part::Owned(_)));
    let rows = match parts.len() {
        // Large rows are copied once either way and gain nothing from being
        // contiguous first: emit from the parts (and rows held by index
        // from the input batches that hold them).
        _ if per_row >= CONTIGUOUS_BELOW_ROW_BYTES || !owned => parts_of(parts, starts)?,
        1 => in_order(parts[0].batch(), &mut order)?,
        _ => {
            let batches: Vec<&RecordBatch> = parts.iter().map(Part::batch).collect();
            match concat_batches(schema, batches) {
                Ok(one) => in_order(&one, &mut order)?,
                // Offsets past i32: emit from the parts instead (same rows, same order).
                Err(_) => parts_of(parts, starts)?,
            }
        }
    };
    // Rows per chunk so a chunk is about `chunk_bytes`.
    let chunk_rows = (chunk_bytes / per_row.max(1)).clamp(1, 1 << 16) as usize;
    Ok(Permuted {
        rows,
        order,
        len: n as usize,
        at: 0,
        chunk_rows,
    })
}

impl Permuted {
    fn next_chunk(&mut self) -> Option<Result<RecordBatch>> {
        if self.at >= self.len {
            return None;
        }
        let start = self.at;
        let end = (start + self.chunk_rows).min(self.len);
        self.at = end;
        let chunk = self.order.get(start..end).unwrap_or(&[]);
        let taken = match &self.rows {
            Rows::InOrder(batch) => Ok(batch.slice(start, end - start)),
            Rows::Parts(parts, starts) => {
                let pairs: Vec<(usize, usize)> = chunk
                    .iter()
                    .map(|&row| {
                        let part = starts.partition_point(|&s| s <= row) - 1;
                        (part, parts[part].source_row((row - starts[part]) as usize))
                    })
                    .collect();
                let parts: Vec<&RecordBatch> = parts.iter().map(Part::batch).collect();
                interleave_record_batch(&parts, &pairs)
            }
        };
        Some(taken.map_err(|e| PreprocessError::read("(shuffle bucket)", None, e)))
    }
}

impl Iterator for Gather {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(current) = &mut self.current {
                if let Some(chunk) = current.next_chunk() {
                    return Some(chunk);
                }
                self.current = None;
            }
            match self.load_next()? {
                Ok(permuted) => self.current = Some(permuted),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Drop for Gather {
    fn drop(&mut self) {
        // Finish a load in flight before the folder goes.
        if let Some(handle) = self.loading.take() {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    const ROWS: i64 = 20_000;

    fn input(rows: i64, per_batch: i64) -> (SchemaRef, Vec<RecordBatch>) {
        input_padded(rows, per_batch, 0)
    }

    /// Rows of `id` and a text of about `pad` bytes and more (some null).
    fn input_padded(rows: i64, per_batch: i64, pad: usize) -> (SchemaRef, Vec<RecordBatch>) {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, true),
        ]));
        let batches = (0..rows)
            .step_by(per_batch as usize)
            .map(|start| {
                let ids: Vec<i64> = (start..(start + per_batch).min(rows)).collect();
                let text: Vec<Option<String>> = ids
                    .iter()
                    .map(|i| {
                        (i % 7 != 0)
                            .then(|| format!("row {i} {}", "x".repeat(pad + (i % 200) as usize)))
                    })
                    .collect();
                RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int64Array::from(ids)),
                        Arc::new(StringArray::from(text)),
                    ],
                )
                .unwrap()
            })
            .collect();
        (schema, batches)
    }

    /// (id, text) of every row the shuffle emits, in order.
    fn shuffled(count: u64, budget: u64, chunk_bytes: u64) -> (Vec<(i64, Option<String>)>, usize) {
        shuffled_padded(count, (budget, 0), chunk_bytes, 0)
    }

    /// `budget`: the memory budget and the input's estimated size.
    fn shuffled_padded(
        count: u64,
        budget: (u64, u64),
        chunk_bytes: u64,
        pad: usize,
    ) -> (Vec<(i64, Option<String>)>, usize) {
        let (schema, batches) = input_padded(ROWS, 300, pad);
        let temp = tempfile::tempdir().unwrap();
        let spilled = scatter(
            batches.into_iter().map(Ok),
            &schema,
            42,
            count,
            budget,
            Some(temp.path()),
            false,
        )
        .unwrap();
        let files = spilled
            .buckets
            .iter()
            .filter(|b| matches!(b, Stored::File(_)))
            .count();
        let mut out = Vec::new();
        for batch in spilled.gather(chunk_bytes, 1) {
            let batch = batch.unwrap();
            let ids = batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            let text = batch
                .column(1)
                .as_any()
                .downcast_ref::<StringArray>()
                .unwrap();
            for i in 0..batch.num_rows() {
                out.push((
                    ids.value(i),
                    text.is_valid(i).then(|| text.value(i).to_string()),
                ));
            }
        }
        (out, files)
    }

    #[test]
    fn every_row_once_whatever_the_buckets_and_chunks() {
        let (_, batches) = input(ROWS, 300);
        let mut want: Vec<(i64, Option<String>)> = Vec::new();
        for b in &batches {
            let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let text = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..b.num_rows() {
                want.push((
                    ids.value(i),
                    text.is_valid(i).then(|| text.value(i).to_string()),
                ));
            }
        }
        // (buckets, budget, buckets written to disk): one bucket in memory;
        // one written to disk; buckets each appended to many times; many in
        // memory.
        for (count, budget, on_disk) in [
            (1, 1 << 30, 0),
            (1, 64 << 10, 1),
            (7, 256 << 10, 7),
            (300, 1 << 20, 0),
        ] {
            let (got, files) = shuffled(count, budget, 4096);
            assert_eq!(files, on_disk, "{count} buckets, budget {budget}");
            let mut sorted = got.clone();
            sorted.sort();
            assert_eq!(sorted, want, "{count} buckets, budget {budget}");
            assert_ne!(got, want, "{count} buckets: rows left in input order");
            // The same seed gives the same order, however it is chunked and
            // whether or not buckets went to disk.
            assert_eq!(shuffled(count, budget, 1 << 20).0, got);
            assert_eq!(shuffled(count, 1 << 40, 4096).0, got);
        }
    }

    /// Parts of rows of 5 KB and more are written without being
    /// concatenated: the same rows, in the same order as when every bucket
    /// stays in memory (rows held by index in the input batches), as when
    /// the input outgrows its estimate while held (the rows held written
    /// out), and as small rows at the same positions.
    #[test]
    fn large_rows_are_shuffled_like_small_ones() {
        let ids = |rows: &[(i64, Option<String>)]| -> Vec<i64> {
            let mut ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
            ids.sort();
            ids
        };
        // ~100 MB of rows, estimated too large to hold under 4 MiB.
        let (got, files) = shuffled_padded(7, (4 << 20, u64::MAX), 1 << 20, 5000);
        assert_eq!(
            files, 7,
            "every bucket went to disk, appended to many times"
        );
        // Estimated to fit: the first batch is held, the second passes
        // half the budget and everything goes to disk.
        let (outgrown, files) = shuffled_padded(7, (4 << 20, 0), 1 << 20, 5000);
        assert_eq!(files, 7);
        assert_eq!(outgrown, got);
        assert_eq!(ids(&got), (0..ROWS).collect::<Vec<_>>());
        assert!(got.iter().all(|(i, text)| {
            text.as_ref()
                .is_none_or(|t| t.len() >= 5000 && t.starts_with(&format!("row {i} ")))
        }));
        let (held, files) = shuffled_padded(7, (1 << 40, 0), 4096, 5000);
        assert_eq!(files, 0);
        assert_eq!(held, got);
        let small_order: Vec<i64> = shuffled(7, 4 << 20, 1 << 20)
            .0
            .iter()
            .map(|r| r.0)
            .collect();
        let large_order: Vec<i64> = got.iter().map(|r| r.0).collect();
        assert_eq!(
            large_order, small_order,
            "row order depends on positions, not sizes"
        );
    }

    /// A table of fixed-width and boolean columns (nullable or not, some with nulls,
    /// input batches that are slices) goes through raw column buckets: the
    /// same rows in the same order as through Arrow batches, whether buckets
    /// stay in memory or are appended to their files many times.
    #[test]
    fn fixed_width_columns_are_shuffled_like_arrow_batches() {
        use arrow_array::{BooleanArray, Decimal128Array, Float32Array, Int8Array, Int16Array};
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int8, true),
            Field::new("b", DataType::Int16, false),
            Field::new("c", DataType::Float32, true),
            Field::new("d", DataType::Int64, false),
            Field::new("e", DataType::Decimal128(20, 3), true),
            Field::new("f", DataType::Boolean, true),
        ]));
        let batches: Vec<RecordBatch> = (0..ROWS)
            .step_by(400)
            .map(|start| {
                let ids: Vec<i64> = (start..start + 400).collect();
                let batch = RecordBatch::try_new(
                    schema.clone(),
                    vec![
                        Arc::new(Int8Array::from_iter(
                            ids.iter().map(|i| (i % 5 != 0).then_some(*i as i8)),
                        )),
                        Arc::new(Int16Array::from_iter_values(ids.iter().map(|i| *i as i16))),
                        Arc::new(Float32Array::from_iter_values(
                            ids.iter().map(|i| *i as f32),
                        )),
                        Arc::new(Int64Array::from(ids.clone())),
                        Arc::new(
                            Decimal128Array::from_iter(
                                ids.iter()
                                    .map(|i| (i % 3 != 0).then_some(*i as i128 * 1001)),
                            )
                            .with_precision_and_scale(20, 3)
                            .unwrap(),
                        ),
                        Arc::new(BooleanArray::from_iter(
                            ids.iter().map(|i| (i % 7 != 0).then_some(i % 3 == 1)),
                        )),
                    ],
                )
                .unwrap();
                // Every other batch a slice (an offset into its buffers).
                if start % 800 == 0 {
                    batch.slice(100, 300)
                } else {
                    batch
                }
            })
            .collect();
        assert!(Layout::of(&schema).is_some());
        for (count, budget) in [(1, 1 << 30), (7, 256 << 10), (300, 1 << 20)] {
            let run = |as_files: bool| {
                let temp = tempfile::tempdir().unwrap();
                let spilled = scatter(
                    batches.clone().into_iter().map(Ok),
                    &schema,
                    9,
                    count,
                    (budget, u64::MAX),
                    Some(temp.path()),
                    as_files,
                )
                .unwrap();
                let column_files = spilled
                    .buckets
                    .iter()
                    .filter(|b| matches!(b, Stored::ColumnFile(..)))
                    .count();
                // The first bucket's columns taken by three threads.
                let out: Vec<RecordBatch> = spilled.gather(8192, 3).map(Result::unwrap).collect();
                (concat_batches(&schema, &out).unwrap(), column_files)
            };
            let (columns, files) = run(false);
            let (arrow, no_files) = run(true);
            assert_eq!(no_files, 0);
            assert_eq!(files, if budget < 1 << 20 { count as usize } else { 0 });
            let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
            assert_eq!(columns.num_rows(), rows);
            assert!(
                [0, 4, 5]
                    .iter()
                    .all(|&c| columns.column(c).null_count() > 0)
            );
            assert_eq!(columns, arrow, "{count} buckets, budget {budget}");
        }
    }

    #[test]
    fn bucket_counts() {
        assert_eq!(bucket_count(0, 1000), 1);
        assert_eq!(bucket_count(31, 1000), 1);
        assert_eq!(bucket_count(251, 1000), 9);
        assert_eq!(bucket_count(10_000, 1000), 323);
        assert_eq!(bucket_count(u64::MAX, 1000), MAX_BUCKETS);
    }

    /// Files handed to other tasks are plain IPC streams, whether the bucket
    /// stayed in memory or was appended to many times.
    #[test]
    fn bucket_files_are_plain_streams() {
        for (count, budget) in [(1, 1 << 30), (3, 256 << 10)] {
            let (schema, batches) = input(ROWS, 100);
            let temp = tempfile::tempdir().unwrap();
            let spilled = scatter(
                batches.into_iter().map(Ok),
                &schema,
                1,
                count,
                (budget, 0),
                Some(temp.path()),
                true,
            )
            .unwrap();
            let (_dir, files) = spilled.into_files().unwrap();
            let mut rows = 0;
            for file in &files {
                let reader = arrow_ipc::reader::StreamReader::try_new(
                    std::fs::File::open(file).unwrap(),
                    None,
                )
                .unwrap();
                for batch in reader {
                    rows += batch.unwrap().num_rows();
                }
            }
            assert_eq!(rows, ROWS as usize, "{count} buckets");
            assert_eq!(files.iter().filter(|f| f.exists()).count(), count as usize);
        }
    }

    /// A bucket that cannot be one batch is emitted from its parts: the
    /// same rows in the same order.
    #[test]
    fn parts_emit_like_one_batch() {
        let (schema, batches) = input(3000, 250);
        let owned = batches.iter().cloned().map(Part::Owned).collect();
        let one = permute(&schema, owned, 9, 10_000).unwrap();
        let mut starts = Vec::new();
        let mut rows = 0u32;
        for b in &batches {
            starts.push(rows);
            rows += b.num_rows() as u32;
        }
        // The order `permute` drew for seed 9.
        let mut order: Vec<u32> = (0..rows).collect();
        SplitMix64::new(9).shuffle(&mut order);
        let mut parts = Permuted {
            rows: Rows::Parts(batches.into_iter().map(Part::Owned).collect(), starts),
            order,
            len: rows as usize,
            at: 0,
            chunk_rows: 77,
        };
        let mut one = Permuted {
            chunk_rows: 1000,
            ..one
        };
        let collect = |p: &mut Permuted| {
            let mut all = Vec::new();
            while let Some(b) = p.next_chunk() {
                all.push(b.unwrap());
            }
            concat_batches(&schema, &all).unwrap()
        };
        assert!(matches!(one.rows, Rows::InOrder(_)));
        assert_eq!(collect(&mut one), collect(&mut parts));
    }
}
