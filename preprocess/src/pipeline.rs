//! The `shard` pipeline.
//!
//! ```text
//! reader threads ──(one bounded channel per input, consumed in input order)──▶ producer
//!   producer: [optional scatter/gather shuffle] ─▶ row groups (N rows or ~B bytes)
//!   ──(bounded, in-flight tokens)──▶ encoder threads (Parquet + zstd, any order)
//!   ──▶ writer thread: reorders, appends row groups to shards, closes a shard at
//!       the first row group boundary past the target size, publishes it.
//! ```
//! Every queue is bounded, so memory is set by the options (threads, row
//! group size, memory budget), never by the input size. Shard contents depend
//! only on the inputs and options: not on thread count or timing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parquet::schema::types::ColumnPath;
use serde::Serialize;
use shardfeed_format::{
    Location, Manifest, ShardEntry, TaskRecord, WriteOptions, shard_path, task_shard_path,
};

use crate::encode::{BinaryColumns, EncodedRowGroup, Encoder, has_binary_leaf, writer_properties};
use crate::input::{self, Inputs, SkippedInput, Source};
use crate::measure::{batch_bytes, peak_rss_bytes};
use crate::output;
use crate::tokenize::{TextTokenizer, check_texts};
use crate::writer::{OpenShard, Publish};
use crate::{LARGE_ROW_BYTES, PreprocessError, Progress, Result, ShardOptions, shuffle};

/// What a finished `shard` run did.
#[derive(Clone, Debug, Serialize)]
pub struct ShardSummary {
    /// The dataset written.
    pub dataset: String,
    /// Rows written.
    pub rows: u64,
    /// Shard files written.
    pub shards: usize,
    /// Row groups over all shards.
    pub row_groups: usize,
    /// Uncompressed Arrow bytes of the rows.
    pub input_bytes: u64,
    /// Bytes of all shards.
    pub output_bytes: u64,
    /// `input_bytes / output_bytes`.
    pub compression_ratio: f64,
    /// Wall time of the run.
    pub seconds: f64,
    /// Input MB (10^6 bytes) per second.
    pub input_mb_per_s: f64,
    /// Whether rows were globally shuffled.
    pub shuffled: bool,
    /// For a task of a split run: the tasks in the run.
    pub tasks: Option<usize>,
    /// Threads used.
    pub threads: usize,
    /// Peak resident memory of this process, when the OS tells it.
    pub peak_rss_bytes: Option<u64>,
    /// Files and folders of folder inputs that were left out (hidden
    /// files, side files, links back to a folder already walked).
    pub skipped_inputs: Vec<SkippedInput>,
    /// Token ids written, with `--tokenizer`.
    pub tokens: Option<u64>,
    /// Rows left out because their text was null, with `--tokenizer`
    /// (refused instead with `--strict`).
    pub null_texts_skipped: u64,
}

/// Shard resolved `inputs` into `location`: the manifest, or for a task of a
/// split run its record.
pub(crate) fn write_dataset(
    inputs: &Inputs,
    location: &Location,
    options: &ShardOptions,
    handle: &tokio::runtime::Handle,
    started: Instant,
) -> Result<ShardSummary> {
    if let Some(progress) = &options.progress {
        progress.start(inputs.estimated_bytes);
    }
    let publish = output::publisher(
        location,
        handle,
        options.temp_dir.as_deref(),
        &options.attempt,
    )?;
    let threads = options.effective_threads();
    // Loaded once by `shard` (a gather stage's inputs have the same schema).
    let tokenizer = options.text_tokenizer.as_deref();
    debug_assert_eq!(tokenizer.is_some(), options.tokenize.is_some());
    let Written {
        shards,
        input_bytes,
        tokens,
        null_texts,
    } = run(inputs, options, threads, publish.as_ref(), tokenizer)?;
    let tokens = tokenizer.is_some().then_some(tokens);
    let schema = tokenizer.map_or_else(|| inputs.schema.clone(), |t| t.schema());
    if options.task.is_none() {
        // This run holds the dataset's lock: files it does not list (of an
        // earlier, larger or killed run) are stale. Tasks leave that to
        // `commit`: another attempt of theirs may be writing.
        output::remove_stale(location, &shards, handle)?;
        if options.overwrite {
            output::remove_split_run(location, handle)?;
        }
    }
    let rows: u64 = shards.iter().map(|s| s.rows).sum();
    if rows == 0 && options.task.is_none() {
        return Err(PreprocessError::NoRows {
            inputs: inputs.given.join(", "),
        });
    }
    let write_options = WriteOptions {
        compression: "zstd".into(),
        zstd_level: options.zstd_level,
        shard_size: options.shard_size,
        row_group_rows: options.row_group_rows,
        row_group_bytes: options
            .row_group_rows
            .is_none()
            .then_some(options.effective_row_group_bytes()),
        large_row_group_bytes: options
            .row_group_rows
            .is_none()
            .then(|| options.effective_large_row_group_bytes())
            .flatten(),
        shuffle_seed: options.recorded_seed.or(options.shuffle_seed),
        tokenizer: tokenizer.map(|t| t.record()),
    };
    let mut manifest = Manifest::new((*schema).clone(), write_options, shards, input_bytes);
    manifest.total_tokens = tokens;
    match options.task {
        // A split run: this task's record; `commit` writes the manifest.
        Some(task) => handle.block_on(output::write_record(
            location,
            &TaskRecord {
                task_index: task.index,
                num_tasks: task.count,
                schema: manifest.schema.clone(),
                options: manifest.options.clone(),
                shards: manifest.shards.clone(),
                input_bytes,
                tool_version: manifest.tool_version.clone(),
                run_id: options.run.clone(),
                tokens,
            },
        ))?,
        None => {
            if options.failpoints.hit("manifest", 0).is_some() {
                return Err(PreprocessError::Cancelled);
            }
            handle.block_on(location.write_manifest(&manifest))?
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(ShardSummary {
        dataset: location.url().to_string(),
        rows,
        shards: manifest.shards.len(),
        row_groups: manifest.row_group_count(),
        input_bytes,
        output_bytes: manifest.total_bytes,
        compression_ratio: input_bytes as f64 / manifest.total_bytes.max(1) as f64,
        seconds,
        input_mb_per_s: input_bytes as f64 / 1e6 / seconds.max(1e-9),
        shuffled: options.shuffle_seed.is_some(),
        tasks: options.task.map(|t| t.count),
        threads,
        peak_rss_bytes: peak_rss_bytes(),
        skipped_inputs: inputs.skipped.clone(),
        tokens,
        null_texts_skipped: null_texts,
    })
}

/// What the pipeline wrote.
struct Written {
    shards: Vec<ShardEntry>,
    /// Uncompressed Arrow bytes of the input rows.
    input_bytes: u64,
    /// Token ids, with a tokenizer.
    tokens: u64,
    /// Rows skipped for a null text, with a tokenizer.
    null_texts: u64,
}

/// How the binary and string columns are written, judged on the first
/// batch of the first input (a file; a folder is judged by its files'
/// names). That batch (~2 MiB) is read here once more than the pipeline
/// reads it, and only when the schema has a binary or string column. An
/// input that fails to open or read is left to the pipeline, which names it.
fn binary_columns_of(inputs: &Inputs, schema: &SchemaRef, max_value: u64) -> BinaryColumns {
    match inputs.sources.first() {
        Some(source @ Source::File { .. }) if has_binary_leaf(schema) => {
            match input::open(source, schema, max_value, &[]).map(|mut batches| batches.next()) {
                Ok(Some(Ok(batch))) => BinaryColumns::of(&batch),
                _ => BinaryColumns::default(),
            }
        }
        _ => BinaryColumns::default(),
    }
}

/// Batches each reader may queue ahead while a shuffle scatters.
const SCATTER_READ_AHEAD: usize = 4;

enum ReadMsg {
    Batch(RecordBatch),
    End,
    Failed(PreprocessError),
}

/// Run the threads (tokenizing on the encoder threads with `tokenizer`).
fn run(
    inputs: &Inputs,
    options: &ShardOptions,
    threads: usize,
    publish: &dyn Publish,
    tokenizer: Option<&TextTokenizer>,
) -> Result<Written> {
    let schema = inputs.schema.clone();
    // The shards' schema: the input's, or with the text's ids.
    let out_schema = tokenizer.map_or_else(|| schema.clone(), |t| t.schema());
    // Images and other files compressed already keep their bytes as they
    // are (zstd tried on every page only to store it unchanged); large
    // distinct values get no dictionary.
    let binary = if tokenizer.is_some() {
        BinaryColumns::default()
    } else if inputs.files_compressed() {
        BinaryColumns {
            stored: vec![ColumnPath::from("bytes")],
            no_dictionary: Vec::new(),
        }
    } else {
        binary_columns_of(inputs, &schema, options.max_value_bytes())
    };
    // Their values are read as views of the input's pages, copied once.
    let large: Vec<ColumnPath> = (binary.stored.iter())
        .chain(&binary.no_dictionary)
        .cloned()
        .collect();
    let props = writer_properties(options.zstd_level, &binary.stored, &binary.no_dictionary)
        .map_err(|source| PreprocessError::Encode {
            shard: "(all)".into(),
            source,
        })?;
    let encoder = Encoder::new(out_schema.clone(), props.clone()).map_err(|source| {
        PreprocessError::Encode {
            shard: "(all)".into(),
            source,
        }
    })?;
    // Row groups in flight (queued, encoding, or waiting for their turn to be
    // written) are bounded by tokens; a quarter of the budget holds them.
    let group_bytes = options.effective_row_group_bytes();
    let tokens =
        (options.memory_budget / 4 / group_bytes.max(1)).clamp(2, 4 * threads as u64) as usize;
    let (job_tx, job_rx) = bounded::<(u64, Vec<RecordBatch>, u64)>(threads);
    let (done_tx, done_rx) = unbounded::<Result<EncodedRowGroup>>();
    let (token_tx, token_rx) = bounded::<()>(tokens);
    for _ in 0..tokens {
        token_tx.send(()).expect("capacity for every token");
    }
    // Batches a reader may send ahead. While a shuffle scatters, nothing but
    // the scatter consumes them (the encoders wait for the gather): a few more
    // keep that reader-to-scatter pipeline from stalling on every uneven batch
    // (the shuffled run 5% faster on tabular data, the same peak RSS).
    // Where the scatter holds an input's large rows in memory, the batches
    // read ahead are rows it keeps anyway: up to half the budget of them in
    // the channels (two readers fill at most four at a time) keeps both
    // readers busy while the scatter takes the sources in order (the blob
    // set's scatter phase 225 -> 175 ms).
    let ahead = if options.shuffle_seed.is_none() || options.files_permuted {
        1
    } else if !large.is_empty() && shuffle::holds(inputs.estimated_bytes, options.memory_budget) {
        let batches = options.memory_budget / shuffle::HOLD_DIVISOR / 4 / input::READ_BATCH_BYTES;
        (batches as usize).clamp(SCATTER_READ_AHEAD, 1024)
    } else {
        SCATTER_READ_AHEAD
    };
    let (read_tx, read_rx): (Vec<Sender<ReadMsg>>, Vec<Receiver<ReadMsg>>) =
        (0..inputs.sources.len()).map(|_| bounded(ahead)).unzip();
    let next_source = AtomicUsize::new(0);
    let cancelled = AtomicBool::new(false);
    let readers = threads.min(inputs.sources.len()).max(1);
    let tokens = AtomicU64::new(0);
    let null_texts = AtomicU64::new(0);
    let texts = options.tokenize.as_ref().map(|t| TextCheck {
        column: &t.text_column,
        strict: t.strict,
        max_bytes: options.memory_budget / 8,
        skipped: &null_texts,
    });

    let reading = Reading {
        schema: &schema,
        max_value: options.max_value_bytes(),
        large: &large,
        texts: texts.as_ref(),
    };

    std::thread::scope(|scope| {
        for _ in 0..readers {
            scope.spawn(|| {
                read_sources(
                    &inputs.sources,
                    &reading,
                    &read_tx,
                    &next_source,
                    &cancelled,
                )
            });
        }
        for _ in 0..threads {
            let jobs = job_rx.clone();
            let done = done_tx.clone();
            let encoder = &encoder;
            let tokens = &tokens;
            let tokenizer = tokenizer.cloned();
            let failpoints = &options.failpoints;
            scope.spawn(move || {
                for (seq, batches, raw) in jobs {
                    // The tokenizer is another library reading untrusted text:
                    // a panic in it is this row group's error, not a crash.
                    let tokenized =
                        tokenizer.as_ref().map(|t| {
                            shardfeed_format::panic::catch(|| {
                                let batch = concat_batches(&batches[0].schema(), &batches)
                                    .map_err(|e| PreprocessError::Encode {
                                        shard: format!("(row group {seq})"),
                                        source: e.into(),
                                    })?;
                                t.apply(seq, &batch)
                            })
                            .unwrap_or_else(|message| {
                                Err(PreprocessError::Tokenize {
                                    row_group: seq,
                                    reason: format!("the tokenizer panicked: {message}"),
                                })
                            })
                        });
                    let batches = match tokenized {
                        None => Ok(batches),
                        Some(Ok((batch, n))) => {
                            tokens.fetch_add(n, Ordering::Relaxed);
                            Ok(vec![batch])
                        }
                        Some(Err(e)) => Err(e),
                    };
                    // The encoders (parquet's writer, the dictionary encoder)
                    // as well: a panic is this row group's error.
                    let result = batches.and_then(|batches| {
                        shardfeed_format::panic::catch(|| {
                            encode_failpoint(failpoints, seq);
                            encoder.encode(seq, &batches, raw)
                        })
                        .unwrap_or_else(|message| {
                            Err(parquet::errors::ParquetError::General(format!(
                                "the encoder panicked: {message}"
                            )))
                        })
                        .map_err(|source| PreprocessError::Encode {
                            shard: format!("(row group {seq})"),
                            source,
                        })
                    });
                    if done.send(result).is_err() {
                        break;
                    }
                }
            });
        }
        drop(job_rx);
        drop(done_tx);
        let writer = scope.spawn(|| {
            write_shards(
                done_rx,
                token_tx,
                options.shard_size,
                options.task.map(|t| t.index),
                &out_schema,
                &props,
                publish,
                &cancelled,
                options.progress.as_deref(),
                &options.failpoints,
            )
        });
        let produced = produce(inputs, options, read_rx, job_tx, token_rx);
        if produced.is_err() {
            cancelled.store(true, Ordering::SeqCst);
        }
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(PreprocessError::Cancelled));
        match (produced, written) {
            (Err(e), _) if !matches!(e, PreprocessError::Cancelled) => Err(e),
            (_, Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e),
            (Ok(()), Ok((shards, input_bytes))) => Ok(Written {
                shards,
                input_bytes,
                tokens: tokens.load(Ordering::SeqCst),
                null_texts: null_texts.load(Ordering::SeqCst),
            }),
        }
    })
}

/// How readers check texts before they are tokenized.
struct TextCheck<'a> {
    column: &'a str,
    strict: bool,
    max_bytes: u64,
    /// Null texts skipped so far.
    skipped: &'a AtomicU64,
}

/// How readers open and check each source.
struct Reading<'a> {
    /// The dataset's schema.
    schema: &'a SchemaRef,
    /// Bytes one value may take.
    max_value: u64,
    /// Columns of large values, read as views (`view.rs`).
    large: &'a [ColumnPath],
    /// Texts' checks, when tokenizing.
    texts: Option<&'a TextCheck<'a>>,
}

/// Reader thread: take the next unread source, send its batches in order
/// (texts checked when tokenizing). A panic while reading a source is that
/// source's error: its consumer is never left waiting for a thread that died.
fn read_sources(
    sources: &[Source],
    reading: &Reading,
    senders: &[Sender<ReadMsg>],
    next: &AtomicUsize,
    cancelled: &AtomicBool,
) {
    loop {
        if cancelled.load(Ordering::Relaxed) {
            return;
        }
        let i = next.fetch_add(1, Ordering::SeqCst);
        let Some(source) = sources.get(i) else {
            return;
        };
        let tx = &senders[i];
        let go_on = shardfeed_format::panic::catch(|| read_source(source, reading, tx))
            .unwrap_or_else(|panic| {
                let _ = tx.send(ReadMsg::Failed(PreprocessError::read(
                    source.display_path(),
                    None,
                    format!("reading it failed: {panic}"),
                )));
                true
            });
        if !go_on {
            return;
        }
    }
}

/// Send `source`'s batches to `tx`, then its end (or its first error).
/// False when the consumer is gone.
fn read_source(source: &Source, reading: &Reading, tx: &Sender<ReadMsg>) -> bool {
    let batches = match input::open(source, reading.schema, reading.max_value, reading.large) {
        Ok(b) => b,
        Err(e) => {
            let _ = tx.send(ReadMsg::Failed(e));
            return true;
        }
    };
    let mut row = 0u64;
    for batch in batches {
        let batch = match (batch, reading.texts) {
            (Ok(b), Some(t)) => {
                let first = row;
                row += b.num_rows() as u64;
                check_texts(
                    b,
                    t.column,
                    t.strict,
                    t.max_bytes,
                    &source.display_path(),
                    first,
                )
                .map(|(b, skipped)| {
                    t.skipped.fetch_add(skipped, Ordering::Relaxed);
                    b
                })
            }
            (batch, _) => batch,
        };
        let msg = match batch {
            Ok(b) if b.num_rows() == 0 => continue,
            Ok(b) => ReadMsg::Batch(b),
            Err(e) => return tx.send(ReadMsg::Failed(e)).is_ok(),
        };
        if tx.send(msg).is_err() {
            return false;
        }
    }
    tx.send(ReadMsg::End).is_ok()
}

/// The batches of every source, in input order, in the dataset's schema.
struct OrderedBatches<'a> {
    sources: &'a [Source],
    receivers: std::vec::IntoIter<Receiver<ReadMsg>>,
    current: Option<(usize, Receiver<ReadMsg>)>,
    index: usize,
    schema: SchemaRef,
}

impl Iterator for OrderedBatches<'_> {
    type Item = Result<RecordBatch>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.current.is_none() {
                let rx = self.receivers.next()?;
                self.current = Some((self.index, rx));
                self.index += 1;
            }
            let (i, rx) = self.current.as_ref().expect("set above");
            match rx.recv() {
                Ok(ReadMsg::Batch(batch)) => {
                    let source = &self.sources[*i];
                    return Some(
                        RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())
                            .map_err(|e| PreprocessError::read(source.display_path(), None, e)),
                    );
                }
                Ok(ReadMsg::End) => self.current = None,
                Ok(ReadMsg::Failed(e)) => return Some(Err(e)),
                Err(_) => return Some(Err(PreprocessError::Cancelled)),
            }
        }
    }
}

/// Producer: read in order, optionally shuffle, cut row groups, queue them.
fn produce(
    inputs: &Inputs,
    options: &ShardOptions,
    receivers: Vec<Receiver<ReadMsg>>,
    jobs: Sender<(u64, Vec<RecordBatch>, u64)>,
    tokens: Receiver<()>,
) -> Result<()> {
    let batches = OrderedBatches {
        sources: &inputs.sources,
        receivers: receivers.into_iter(),
        current: None,
        index: 0,
        schema: inputs.schema.clone(),
    };
    let mut assembler = Assembler::new(options);
    let mut seq = 0u64;
    let mut emit = |batches: Vec<RecordBatch>, raw: u64| -> Result<()> {
        tokens.recv().map_err(|_| PreprocessError::Cancelled)?;
        jobs.send((seq, batches, raw))
            .map_err(|_| PreprocessError::Cancelled)?;
        seq += 1;
        Ok(())
    };
    match options.shuffle_seed.filter(|_| !options.files_permuted) {
        None => {
            for batch in batches {
                assembler.push(batch?, &mut emit)?;
            }
        }
        Some(seed) => {
            let count = shuffle::bucket_count(inputs.estimated_bytes, options.memory_budget);
            if let Some(p) = &options.progress {
                p.phase("scatter");
            }
            let spilled = shuffle::scatter(
                batches,
                &inputs.schema,
                seed,
                count,
                (options.memory_budget, inputs.estimated_bytes),
                options.temp_dir.as_deref(),
                false,
            )?;
            if let Some(p) = &options.progress {
                p.phase("gather");
            }
            let workers = options.effective_threads();
            for batch in spilled.gather(options.effective_row_group_bytes(), workers) {
                assembler.push(batch?, &mut emit)?;
            }
        }
    }
    assembler.finish(&mut emit)
}

/// Cuts the row stream into row groups of a fixed row count or a target size
/// (a smaller one once the rows seen average over [`LARGE_ROW_BYTES`]).
struct Assembler {
    rows_target: Option<u64>,
    bytes_target: u64,
    /// The target for large rows, where it differs.
    large_target: Option<u64>,
    /// Rows and bytes seen so far (the average decides the target).
    seen: (u64, u64),
    pending: Vec<RecordBatch>,
    rows: u64,
    bytes: u64,
}

impl Assembler {
    fn new(options: &ShardOptions) -> Self {
        Assembler {
            rows_target: options.row_group_rows,
            // Token ids take ~1.5-2x the bytes of their text (4 bytes per
            // id, 2-3 bytes of text per id): half the target of text gives
            // row groups of about the target once tokenized, and twice the
            // row groups to spread the tokenizing over the threads.
            bytes_target: if options.tokenize.is_some() {
                (options.effective_row_group_bytes() / 2).max(1)
            } else {
                options.effective_row_group_bytes()
            },
            large_target: options.effective_large_row_group_bytes(),
            seen: (0, 0),
            pending: Vec::new(),
            rows: 0,
            bytes: 0,
        }
    }

    /// The bytes a row group targets: the large-row target once the rows
    /// seen so far (in stream order: the same for the same inputs) average
    /// over [`LARGE_ROW_BYTES`].
    fn target(&self) -> u64 {
        let (rows, bytes) = self.seen;
        match self.large_target {
            Some(large) if bytes > rows.saturating_mul(LARGE_ROW_BYTES) => large,
            _ => self.bytes_target,
        }
    }

    fn is_full(&self) -> bool {
        match self.rows_target {
            Some(rows) => self.rows >= rows,
            None => self.bytes >= self.target(),
        }
    }

    fn push(
        &mut self,
        mut batch: RecordBatch,
        emit: &mut impl FnMut(Vec<RecordBatch>, u64) -> Result<()>,
    ) -> Result<()> {
        if self.rows_target.is_none() && self.large_target.is_some() {
            let (rows, bytes) = self.seen;
            self.seen = (
                rows + batch.num_rows() as u64,
                bytes.saturating_add(batch_bytes(&batch)),
            );
        }
        while batch.num_rows() > 0 {
            let n = batch.num_rows() as u64;
            let take = match self.rows_target {
                Some(target) => (target - self.rows).min(n),
                None => {
                    let per_row = batch_bytes(&batch).max(1) as f64 / n as f64;
                    let missing = self.target().saturating_sub(self.bytes) as f64;
                    ((missing / per_row).ceil() as u64).clamp(1, n)
                }
            };
            let head = batch.slice(0, take as usize);
            batch = batch.slice(take as usize, (n - take) as usize);
            self.bytes += batch_bytes(&head);
            self.rows += take;
            self.pending.push(head);
            if self.is_full() {
                self.flush(emit)?;
            }
        }
        Ok(())
    }

    /// Emit the pending batches as one row group. They are not concatenated
    /// here (on the one producer thread): the encoders write them column by
    /// column, concatenating only the columns that need it. A reader batch
    /// cut between two row groups stays held until both are encoded: one
    /// batch (a few MiB, bounded by the readers' batch size) per row group
    /// in flight.
    fn flush(&mut self, emit: &mut impl FnMut(Vec<RecordBatch>, u64) -> Result<()>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batches = std::mem::take(&mut self.pending);
        let bytes = std::mem::take(&mut self.bytes);
        self.rows = 0;
        emit(batches, bytes)
    }

    fn finish(mut self, emit: &mut impl FnMut(Vec<RecordBatch>, u64) -> Result<()>) -> Result<()> {
        self.flush(emit)
    }
}

/// Writer thread: append encoded row groups in sequence, rolling shards.
#[allow(clippy::too_many_arguments)]
fn write_shards(
    done: Receiver<Result<EncodedRowGroup>>,
    tokens: Sender<()>,
    shard_size: u64,
    task: Option<usize>,
    schema: &SchemaRef,
    props: &parquet::file::properties::WriterPropertiesPtr,
    publish: &dyn Publish,
    cancelled: &AtomicBool,
    progress: Option<&dyn Progress>,
    failpoints: &shardfeed_format::failpoint::Failpoints,
) -> Result<(Vec<ShardEntry>, u64)> {
    let mut waiting: BTreeMap<u64, EncodedRowGroup> = BTreeMap::new();
    let mut next_seq = 0u64;
    let mut open: Option<OpenShard> = None;
    let mut shards = Vec::new();
    let mut raw_bytes = 0u64;
    let result = (|| {
        for group in done.iter() {
            let group = group?;
            waiting.insert(group.seq, group);
            while let Some(group) = waiting.remove(&next_seq) {
                next_seq += 1;
                let (rows, raw) = (group.rows, group.raw_bytes);
                if open.is_none() {
                    let path = match task {
                        Some(t) => task_shard_path(t, shards.len()),
                        None => shard_path(shards.len()),
                    };
                    open = Some(OpenShard::create(path, publish, schema, props, shard_size)?);
                }
                let shard = open.as_mut().expect("opened above");
                shard.append(group)?;
                failpoint(failpoints, "shard-appended", next_seq - 1)?;
                raw_bytes += raw;
                let _ = tokens.send(());
                if let Some(p) = progress {
                    p.advance(rows, raw);
                }
                if shard.bytes() >= shard_size {
                    shards.push(open.take().expect("open").finish(publish)?);
                    failpoint(failpoints, "shard-published", shards.len() as u64 - 1)?;
                }
            }
        }
        if cancelled.load(Ordering::SeqCst) {
            return Err(PreprocessError::Cancelled);
        }
        if let Some(shard) = open.take() {
            shards.push(shard.finish(publish)?);
            failpoint(failpoints, "shard-published", shards.len() as u64 - 1)?;
        }
        Ok(())
    })();
    if let Err(e) = result {
        if let Some(shard) = open.take() {
            shard.abandon();
        }
        return Err(e);
    }
    Ok((shards, raw_bytes))
}

/// Failpoint `encode` at row group `seq`: `panic` panics inside the
/// encoder's thread (to show it becomes the row group's error).
fn encode_failpoint(failpoints: &shardfeed_format::failpoint::Failpoints, seq: u64) {
    if failpoints.hit("encode", seq) == Some(shardfeed_format::failpoint::Action::Panic) {
        panic!("failpoint encode at row group {seq}");
    }
}

/// Carry out failpoint `point` at `item`: `exit` ends the process (as a
/// kill would), `block` waits forever (until killed), others fail the run.
fn failpoint(
    failpoints: &shardfeed_format::failpoint::Failpoints,
    point: &str,
    item: u64,
) -> Result<()> {
    use shardfeed_format::failpoint::Action;
    match failpoints.hit(point, item) {
        None => Ok(()),
        Some(Action::Block) => loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
        },
        Some(_) => Err(PreprocessError::Cancelled),
    }
}
