//! One pass over an epoch: the threads and channels of
//! `fetch -> decode -> shuffle -> collate -> consumer`, cancellation, and
//! how failures travel.
//!
//! * **Every failure reaches `next()` as an error** naming the stage (and
//!   the shard and row group where one is known). A stage that fails sends
//!   its error downstream and stops; a panic in any stage is caught and sent
//!   the same way; a stage whose input closes before the plan says it should
//!   (its upstream stopped without a word) reports that upstream stage. Only
//!   a cancelled pass ends quietly.
//! * **The end of an epoch is a fact of the plan**: the consumer counts the
//!   plan's batches, and a channel that closes before the last one is an
//!   error, never an early end (see [`crate::Loader`]).
//! * Panics caught here print nothing (the message goes into the error):
//!   a process-wide panic hook, chained to the previous one, stays quiet
//!   only on threads that are inside a stage.

use crate::error::Stage;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use futures::{FutureExt, StreamExt};
use shardfeed_format::Manifest;
use shardfeed_format::failpoint::Action;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::batch::Batch;
use crate::collate::Collator;
use crate::config::{Config, OnError};
use crate::decode::{Fetched, decode};
use crate::fetch::FetchContext;
use crate::pinned::Pool;
use crate::plan::{EpochPlan, PlanOptions, Segment};
use crate::shuffle::{LoadedWindow, Shuffler};
use crate::stage::{Decoded, DecodedSegment, injected};
use crate::stats::Counters;
use crate::{LoaderError, Result};

type FetchedRx = Arc<Mutex<tokio::sync::mpsc::Receiver<Result<(Fetched, OwnedSemaphorePermit)>>>>;

use shardfeed_format::panic::{catch, message as panic_message, quietly};

/// A future polled with its panics kept quiet (they are caught around it).
struct Quiet<F>(F);

impl<F: Future + Unpin> Future for Quiet<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        quietly(|| Pin::new(&mut self.0).poll(cx))
    }
}

/// Whether `error` is about damaged bytes of one row group (what
/// [`OnError::Skip`] skips), rather than storage, options or a bug.
fn is_damage(error: &LoaderError) -> bool {
    matches!(
        error,
        LoaderError::Corrupt {
            row_group: Some(_),
            ..
        } | LoaderError::Decode {
            row_group: Some(_),
            ..
        }
    )
}

/// What the passes of one loader share.
pub(crate) struct Pipeline {
    pub config: Arc<Config>,
    pub manifest: Arc<Manifest>,
    pub fetch: Arc<FetchContext>,
    pub runtime: Arc<tokio::runtime::Runtime>,
    pub pool: Arc<Pool>,
    pub counters: Arc<Counters>,
    /// Batches yielded and still alive (holding a pooled slab).
    pub held: Arc<AtomicUsize>,
    /// The byte budget, in KiB permits, over every pass.
    pub permits: Arc<Semaphore>,
    /// The projected columns, as stored (placeholders of skipped segments).
    pub schema: SchemaRef,
    /// Epochs planned from pieces (after an elastic resume).
    pub overrides: Vec<(u64, Arc<EpochPlan>)>,
}

/// A running pass: the threads and channels of one epoch.
pub(crate) struct Pass {
    pub epoch: u64,
    pub output: Receiver<Result<Batch>>,
    cancel: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    fetch_task: tokio::task::JoinHandle<()>,
    /// The next batch the consumer will receive.
    pub next_index: u64,
    /// Batches of the pass, from the plan.
    pub batches: u64,
    /// Positions of the pass, from the plan.
    pub positions: u64,
    /// Set when the shuffle stage has assembled the pass's last window:
    /// fetching and decoding are over, only collation remains.
    pub assembled_all: Arc<AtomicBool>,
    /// Disconnected when this pass's collator has finished.
    pub collated: Receiver<()>,
}

impl Pass {
    /// Cancel the pass: stop I/O, unblock and join every thread.
    pub fn stop(mut self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.fetch_task.abort();
        // Unblock a collator waiting to hand over a batch.
        let output = std::mem::replace(&mut self.output, crossbeam_channel::never());
        drop(output);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Pipeline {
    /// The plan of `epoch` for this loader's rank.
    pub fn plan(&self, epoch: u64) -> Arc<EpochPlan> {
        if let Some((_, plan)) = self.overrides.iter().find(|(e, _)| *e == epoch) {
            return plan.clone();
        }
        Arc::new(self.plan_for(epoch, self.config.rank, self.config.world_size))
    }

    /// The plan of `epoch` for rank `rank` of `world_size`.
    pub fn plan_for(&self, epoch: u64, rank: u64, world_size: u64) -> EpochPlan {
        EpochPlan::new(&self.manifest, self.plan_options(epoch, rank, world_size))
    }

    /// The options of that plan.
    pub fn plan_options(&self, epoch: u64, rank: u64, world_size: u64) -> PlanOptions {
        let c = &self.config;
        PlanOptions {
            seed: c.seed,
            epoch,
            rank,
            world_size,
            shuffle: c.shuffle,
            window: c.window,
            batch_size: c.batch_size,
            drop_last: c.drop_last,
            // Slices of row groups are random samples only when the
            // dataset was shuffled at shard time; in a dataset written in
            // order a slice is one class or domain. A small epoch reads
            // its first window whole (slicing would cost it too much).
            first_slices: if self.manifest.options.shuffle_seed.is_some()
                && self.manifest.row_group_count() as u64 / world_size.max(1)
                    >= crate::config::MIN_WINDOWS_TO_SLICE * c.window as u64
            {
                crate::config::FIRST_SLICES
            } else {
                0
            },
            keep_partial: c.keep_partial,
        }
    }

    /// Start the pass of `epoch` from position `position`; its collator
    /// begins once `after` disconnects (the previous pass's collator is done).
    pub fn launch(&self, epoch: u64, position: u64, after: Option<Receiver<()>>) -> Pass {
        let plan = self.plan(epoch);
        let config = self.config.clone();
        let cancel = Arc::new(AtomicBool::new(false));
        let start_position = position.min(plan.positions());
        let start_window = if plan.window_count() == 0 || start_position >= plan.positions() {
            plan.window_count()
        } else {
            plan.window_of(start_position)
        };
        let first_seq = if start_window < plan.window_count() {
            plan.window(start_window).first_segment as u64
        } else {
            plan.segments().len() as u64
        };
        let segments: Vec<(u64, Segment)> = plan
            .segments()
            .iter()
            .enumerate()
            .skip(first_seq as usize)
            .map(|(i, s)| (i as u64, *s))
            .collect();
        let stash = Arc::new(Stash::new(&segments));
        let shares = shared_fetches(&segments, 2 * config.window.max(1));

        let (fetched_tx, fetched_rx) = tokio::sync::mpsc::channel::<
            Result<(Fetched, OwnedSemaphorePermit)>,
        >(2 * config.decode_threads);
        let fetched_rx: FetchedRx = Arc::new(Mutex::new(fetched_rx));
        let (decoded_tx, decoded_rx) = unbounded::<Decoded>();
        let (output_tx, output_rx) = bounded::<Result<Batch>>(config.prefetch_batches);

        // Set by the fetch stage once it has sent every segment of the pass
        // (or an error): a decode thread that finds the stage's channel
        // closed before then reports that the fetch stage stopped.
        let fetched_all = Arc::new(AtomicBool::new(false));
        let fetch_task = {
            let fetched_all_by_work = fetched_all.clone();
            let fetch = self.fetch.clone();
            let semaphore = self.permits.clone();
            let counters = self.counters.clone();
            let config = config.clone();
            let cancel = cancel.clone();
            // The most permits one row group takes: `needed_units` of them
            // always fit the budget, so a large row group cannot deadlock
            // a window waiting for its last member.
            let total = (config.in_flight_bytes >> 10).clamp(1, u32::MAX as u64) as u32;
            let max_unit = (total as u64 / config.needed_units.max(1)).max(1) as u32;
            let work = async move {
                // Admission is sequential, in plan order: each segment takes
                // its share of the budget before any later one can, so the
                // segments a window waits for are never starved by later ones.
                let admitted = futures::stream::iter(segments.into_iter().zip(shares)).then(
                    |((seq, segment), share)| {
                        let fetch = fetch.clone();
                        let semaphore = semaphore.clone();
                        let counters = counters.clone();
                        let config = config.clone();
                        let cancel = cancel.clone();
                        async move {
                            match config.failpoints.hit("fetch", seq) {
                                None => {}
                                Some(Action::Block) => std::future::pending::<()>().await,
                                Some(Action::Panic) => {
                                    panic!("injected panic in the fetch stage (failpoint)")
                                }
                                Some(Action::Stop) => return Err(LoaderError::Closed),
                                Some(action) => {
                                    return Err(injected(Stage::Fetch, action, &cancel));
                                }
                            }
                            let footer = fetch.footer(segment.shard).await?;
                            let cost = fetch.segment_cost(&footer, segment, max_unit);
                            let permit = semaphore
                                .clone()
                                .acquire_many_owned(cost)
                                .await
                                .map_err(|_| LoaderError::Closed)?;
                            if let Some(t) = &counters.trace {
                                let held = (total as u64)
                                    .saturating_sub(semaphore.available_permits() as u64);
                                t.counter("bytes_in_flight", held << 10);
                            }
                            Ok((seq, segment, footer, permit, share))
                        }
                    },
                );
                let mut results = std::pin::pin!(
                    admitted
                        .map(|admitted| {
                            let fetch = fetch.clone();
                            let config = config.clone();
                            let cancel = cancel.clone();
                            async move {
                                let (seq, segment, footer, permit, share) = admitted?;
                                let shared = match share.from {
                                    Some(from) => from.await.ok(),
                                    None => None,
                                };
                                let fetched = match shared {
                                    Some(chunks) => Ok(Fetched {
                                        seq,
                                        segment,
                                        footer,
                                        chunks,
                                    }),
                                    None => match config.failpoints.hit("read", seq) {
                                        // The segment's own read (not one it
                                        // was handed): `error`, or `slow`
                                        // (finishing after later reads).
                                        Some(Action::Error) => {
                                            Err(injected(Stage::Read, Action::Error, &cancel))
                                        }
                                        Some(Action::Slow(ms)) => {
                                            tokio::time::sleep(Duration::from_millis(ms)).await;
                                            fetch.fetch(seq, segment, footer).await
                                        }
                                        _ => fetch.fetch(seq, segment, footer).await,
                                    },
                                };
                                if let (Ok(f), Some(to)) = (&fetched, share.to) {
                                    let _ = to.send(f.chunks.clone());
                                }
                                fetched.map(|f| (f, permit))
                            }
                        })
                        // Reads finish in any order (a read that finished
                        // behind a slower one does not hold its slot: on
                        // images both of 2 slots were busy 88% of the time,
                        // not 80%), but are handed on in plan order below.
                        .buffer_unordered(config.io_concurrency)
                );
                // Finished reads wait here for the earlier ones: the decode
                // threads take a window's segments before the next one's
                // (handed on as they finished, later windows' segments went
                // first and a fresh process's first token batch came after
                // 70-130 ms, not 40-55). Their permits bound what waits.
                let mut next = first_seq;
                let mut finished: BTreeMap<u64, (Fetched, OwnedSemaphorePermit)> = BTreeMap::new();
                while let Some(result) = results.next().await {
                    let ready = match result {
                        // Cancelled, or a silent stop injected by a failpoint.
                        Err(LoaderError::Closed) => return,
                        // The error itself tells the rest of the pipeline, at once.
                        Err(e) => vec![Err(e)],
                        Ok((fetched, permit)) => {
                            finished.insert(fetched.seq, (fetched, permit));
                            let mut ready = Vec::new();
                            while let Some(item) = finished.remove(&next) {
                                ready.push(Ok(item));
                                next += 1;
                            }
                            ready
                        }
                    };
                    for result in ready {
                        let failed = result.is_err();
                        Counters::add(&counters.decode_queue, 1);
                        if failed {
                            fetched_all_by_work.store(true, Ordering::SeqCst);
                        }
                        let sending = Instant::now();
                        let sent = fetched_tx.send(result).await;
                        Counters::add_time(&counters.fetch_blocked_out_ns, sending.elapsed());
                        if sent.is_err() || failed {
                            return;
                        }
                    }
                }
                fetched_all_by_work.store(true, Ordering::SeqCst);
            };
            let decoded_tx = decoded_tx.clone();
            let panicked = fetched_all.clone();
            self.runtime.spawn(async move {
                if let Err(payload) = Quiet(AssertUnwindSafe(Box::pin(work)).catch_unwind()).await {
                    panicked.store(true, Ordering::SeqCst);
                    let _ = decoded_tx.send((
                        u64::MAX,
                        Err(LoaderError::stage(
                            Stage::Fetch,
                            None,
                            None,
                            format!("panic: {}", panic_message(payload.as_ref())),
                        )),
                        None,
                    ));
                }
            })
        };

        let mut threads = Vec::new();
        for i in 0..config.decode_threads {
            let decoder = Decoder {
                stash: stash.clone(),
                rx: fetched_rx.clone(),
                tx: decoded_tx.clone(),
                manifest: self.manifest.clone(),
                roots: self.fetch.roots.clone(),
                counters: self.counters.clone(),
                config: config.clone(),
                cancel: cancel.clone(),
                schema: self.schema.clone(),
                fetched_all: fetched_all.clone(),
                fetch: self.fetch.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("shardfeed-decode-{i}"))
                    .spawn(move || {
                        lower_priority(decoder.config.decode_niceness);
                        decoder.run()
                    })
                    .expect("spawn a decode thread"),
            );
        }
        drop(decoded_tx);
        // One assembled window queued ahead of the collator: the shuffle stage
        // works up to two windows ahead, which absorbs a slow window (its
        // permuted windows hold their row groups' budget, so the byte budget
        // still bounds it).
        let (windows_tx, windows_rx) = bounded::<Result<LoadedWindow>>(1);
        let assembled_all = Arc::new(AtomicBool::new(false));
        {
            let assembled = assembled_all.clone();
            let mut shuffler = Shuffler {
                config: config.clone(),
                plan: plan.clone(),
                decoded: decoded_rx,
                waiting: BTreeMap::new(),
                counters: self.counters.clone(),
                cancel: cancel.clone(),
                next_order: None,
            };
            let cancel = cancel.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("shardfeed-shuffle".into())
                    .spawn(move || {
                        let ran = catch(|| shuffler.run(start_window, &windows_tx, &assembled));
                        if let Err(message) = ran
                            && !cancel.load(Ordering::SeqCst)
                        {
                            let _ = windows_tx.send(Err(LoaderError::stage(
                                Stage::Shuffle,
                                None,
                                None,
                                format!("panic: {message}"),
                            )));
                        }
                    })
                    .expect("spawn the shuffle thread"),
            );
        }
        let collated;
        {
            let mut collator = Collator {
                config,
                plan: plan.clone(),
                windows_in: windows_rx,
                windows: Vec::new(),
                ahead: Default::default(),
                upgrades: Vec::new(),
                pool: self.pool.clone(),
                counters: self.counters.clone(),
                cancel: cancel.clone(),
                manifest: self.manifest.clone(),
                fetch: self.fetch.clone(),
                scratch: if self.config.images.is_some() {
                    (0..self.config.decode_threads.max(1))
                        .map(|_| Default::default())
                        .collect()
                } else {
                    Vec::new()
                },
            };
            let (collated_tx, collated_rx) = bounded::<()>(0);
            let cancel = cancel.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("shardfeed-collate".into())
                    .spawn(move || {
                        if let Some(after) = after {
                            // Slabs go to the previous pass's batches first.
                            while !cancel.load(Ordering::SeqCst)
                                && matches!(
                                    after.recv_timeout(Duration::from_millis(20)),
                                    Err(RecvTimeoutError::Timeout)
                                )
                            {}
                        }
                        let ran = catch(|| collator.run(start_position, &output_tx));
                        if let Err(message) = ran
                            && !cancel.load(Ordering::SeqCst)
                        {
                            let _ = output_tx.send(collator.fetch.check_mapped().and(Err(
                                LoaderError::stage(
                                    Stage::Collate,
                                    None,
                                    None,
                                    format!("panic: {message}"),
                                ),
                            )));
                        }
                        drop(collated_tx);
                    })
                    .expect("spawn the collate thread"),
            );
            collated = collated_rx;
        }
        let batch_size = self.config.batch_size as u64;
        Pass {
            epoch,
            output: output_rx,
            cancel,
            threads,
            fetch_task,
            next_index: start_position / batch_size,
            batches: plan.batches(),
            positions: plan.positions(),
            assembled_all,
            collated,
        }
    }
}

/// A fetched row group's column chunks, handed from one segment to a later
/// one of the same row group.
type SharedChunks = Vec<(usize, u64, bytes::Bytes, Option<shardfeed_format::ChunkSum>)>;

/// How one segment's fetch is shared: `to` hands its chunks on to a later
/// segment of the same row group, `from` receives them from an earlier one.
#[derive(Default)]
struct Share {
    to: Option<tokio::sync::oneshot::Sender<SharedChunks>>,
    from: Option<tokio::sync::oneshot::Receiver<SharedChunks>>,
}

/// The shares of a pass's segments, one each: a segment that starts where
/// an earlier segment of the same row group ends (the rest of a row group
/// whose first slice opened the epoch's first window, in the window right
/// after it) reuses that segment's fetched chunks instead of reading the
/// whole row group again. The chunks are passed as the earlier fetch
/// completes; admission is in plan order and the later segment is admitted
/// next to the earlier one's window, so the kept bytes are within the two
/// windows of read-ahead; segments more than `reach` apart are not paired.
/// Should the earlier fetch fail, the later segment reads its row group
/// itself.
fn shared_fetches(segments: &[(u64, Segment)], reach: usize) -> Vec<Share> {
    let mut shares: Vec<Share> = segments.iter().map(|_| Share::default()).collect();
    for (head, tail) in continuations(segments) {
        if tail - head <= reach {
            let (tx, rx) = tokio::sync::oneshot::channel();
            shares[head].to = Some(tx);
            shares[tail].from = Some(rx);
        }
    }
    shares
}

/// The segments that continue an earlier segment of their row group
/// (start where it ends), as `(earlier, later)` indices into `segments`:
/// each earlier segment continued once, by the first later one.
fn continuations(segments: &[(u64, Segment)]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    let mut open: HashMap<(u32, u32, u32), usize> = HashMap::new();
    for (i, (_, s)) in segments.iter().enumerate() {
        if s.start > 0
            && let Some(head) = open.remove(&(s.shard, s.row_group, s.start))
        {
            pairs.push((head, i));
        }
        open.insert((s.shard, s.row_group, s.end), i);
    }
    pairs
}

/// Rows decoded past a segment's end, kept for the later segment of the same
/// row group that starts there: an epoch's first window is the first slices
/// of its row groups and the rest of each is a later segment, and decoding a
/// slice usually decodes the whole page under it (often the whole chunk).
/// The rest is decoded once, not twice. Which decode thread gets there first
/// decides only whether the later segment finds its rows here or decodes
/// them itself: the same rows either way. At most the first window's rows
/// wait here.
struct Stash {
    /// `(shard, row group, first row)` of the segments that continue an
    /// earlier segment of their row group.
    wanted: HashSet<(u32, u32, u32)>,
    rows: Mutex<HashMap<(u32, u32, u32), Vec<RecordBatch>>>,
}

impl Stash {
    fn new(segments: &[(u64, Segment)]) -> Self {
        let wanted = continuations(segments)
            .into_iter()
            .map(|(_, later)| {
                let s = segments[later].1;
                (s.shard, s.row_group, s.start)
            })
            .collect();
        Stash {
            wanted,
            rows: Mutex::new(HashMap::new()),
        }
    }

    /// Keep `rows` (row group rows from `from` on, decoded for `segment`) if
    /// a later segment starts there.
    fn put(&self, segment: &Segment, from: u32, rows: Vec<RecordBatch>) {
        let key = (segment.shard, segment.row_group, from);
        if self.wanted.contains(&key) {
            self.rows.lock().expect("stash").insert(key, rows);
        }
    }

    /// `segment`'s rows, when an earlier segment decoded all of them.
    fn take(&self, segment: &Segment) -> Option<Vec<RecordBatch>> {
        let key = (segment.shard, segment.row_group, segment.start);
        if !self.wanted.contains(&key) {
            return None;
        }
        let batches = self.rows.lock().expect("stash").remove(&key)?;
        let want = segment.rows() as usize;
        let have: usize = batches.iter().map(|b| b.num_rows()).sum();
        if have < want {
            return None;
        }
        Some(crate::parquet::prefix(batches, want))
    }
}

/// A decode thread of one pass.
struct Decoder {
    stash: Arc<Stash>,
    rx: FetchedRx,
    tx: Sender<Decoded>,
    manifest: Arc<Manifest>,
    roots: Vec<usize>,
    counters: Arc<Counters>,
    config: Arc<Config>,
    cancel: Arc<AtomicBool>,
    schema: SchemaRef,
    fetched_all: Arc<AtomicBool>,
    /// Tells a mapped shard that changed under its decoder ([`crate::mapfile`]).
    fetch: Arc<FetchContext>,
}

/// Lowers the calling thread's scheduling priority by `niceness` (capped
/// at 19, the lowest). Linux only, where the nice value is the thread's own
/// (threads it starts inherit it); elsewhere, or when the call fails,
/// nothing changes.
pub(crate) fn lower_priority(niceness: u8) {
    #[cfg(target_os = "linux")]
    if niceness > 0 {
        // SAFETY: system calls on the calling thread's own id, and its own
        // errno.
        unsafe {
            let tid = libc::gettid() as libc::id_t;
            // -1 is a valid nice value as well as the error return.
            *libc::__errno_location() = 0;
            let current = libc::getpriority(libc::PRIO_PROCESS, tid);
            if current != -1 || *libc::__errno_location() == 0 {
                let lowered = current.saturating_add(i32::from(niceness)).min(19);
                libc::setpriority(libc::PRIO_PROCESS, tid, lowered);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = niceness;
}

impl Decoder {
    /// Decode until the pass ends; a thread that stops before then (without
    /// having sent an error) reports it, so that the segment it held is
    /// never silently missing.
    fn run(self) {
        if let Err(detail) = self.work()
            && !self.cancel.load(Ordering::SeqCst)
        {
            let _ = self.tx.send((
                u64::MAX,
                Err(LoaderError::stage(detail.0, None, None, detail.1)),
                None,
            ));
        }
    }

    /// The decode loop; `Err((stage, what))` when it ends before the pass
    /// does without having sent an error.
    fn work(&self) -> std::result::Result<(), (Stage, &'static str)> {
        loop {
            let waiting = Instant::now();
            let next = self.rx.lock().expect("fetch receiver").blocking_recv();
            Counters::add_time(&self.counters.decode_blocked_in_ns, waiting.elapsed());
            let Some(item) = next else {
                if self.fetched_all.load(Ordering::SeqCst) {
                    return Ok(());
                }
                return Err((
                    Stage::Fetch,
                    "stopped before every segment of the pass was fetched",
                ));
            };
            self.counters.decode_queue.fetch_sub(1, Ordering::Relaxed);
            let started = Instant::now();
            let mut args = crate::trace::Args::None;
            let (seq, result, permit) = match item {
                Ok((fetched, permit)) => {
                    let seq = fetched.seq;
                    args = crate::trace::Args::RowGroup {
                        shard: fetched.segment.shard,
                        row_group: fetched.segment.row_group,
                    };
                    (seq, self.decode(seq, fetched), Some(permit))
                }
                Err(e) => (u64::MAX, Err(e), None),
            };
            Counters::add_time(&self.counters.decode_busy_ns, started.elapsed());
            self.counters.span("decode", started, args);
            if let Some(t) = &self.counters.trace {
                t.counter(
                    "decode_queue",
                    self.counters.decode_queue.load(Ordering::Relaxed),
                );
            }
            let result = match result {
                Err(e) if self.config.on_error == OnError::Skip && is_damage(&e) => {
                    self.skip(e).map(|()| DecodedSegment::Skipped {
                        schema: self.schema.clone(),
                    })
                }
                Err(LoaderError::Closed) => {
                    return Err((
                        Stage::Decode,
                        "a decode thread stopped before the end of the pass",
                    ));
                }
                other => other,
            };
            let failed = result.is_err();
            let sending = Instant::now();
            let sent = self.tx.send((seq, result, permit));
            Counters::add_time(&self.counters.decode_blocked_out_ns, sending.elapsed());
            if sent.is_err() || failed {
                return Ok(());
            }
        }
    }

    /// Check and decode one fetched segment, as stage code.
    fn decode(&self, seq: u64, fetched: Fetched) -> Result<DecodedSegment> {
        let segment = fetched.segment;
        let entry = &self.manifest.shards[segment.shard as usize];
        let action = self.config.failpoints.hit("decode", seq);
        if let Some(Action::Slow(ms)) = action {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let decoded = catch(|| match action {
            None | Some(Action::Slow(_)) => {
                if let Some(rows) = self.stash.take(&segment) {
                    return Ok(rows);
                }
                let decoded = decode(
                    fetched,
                    entry,
                    &self.roots,
                    self.config.byte_budget,
                    &self.counters,
                )?;
                if let Some((from, rows)) = decoded.beyond {
                    self.stash.put(&segment, from, rows);
                }
                Ok(decoded.rows)
            }
            Some(Action::Stop) => Err(LoaderError::Closed),
            Some(action) => Err(injected(Stage::Decode, action, &self.cancel)),
        });
        let named = |detail: String| {
            LoaderError::stage(
                Stage::Decode,
                Some(entry.path.clone()),
                Some(segment.row_group as usize),
                detail,
            )
        };
        // Damage found (or a panic) in a mapped shard that was truncated or
        // rewritten after its chunks were checked (decoded zeros past its
        // new end, or new bytes): that is the error, not the damage, which
        // `on_error="skip"` would skip. (The collator checks again whatever
        // reaches it.)
        if !matches!(decoded, Ok(Ok(_)) | Ok(Err(LoaderError::Closed))) {
            self.fetch.check_mapped()?;
        }
        match decoded {
            Ok(Ok(batches)) => Ok(DecodedSegment::Rows(batches)),
            Ok(Err(LoaderError::Stage {
                stage: Stage::Decode,
                detail,
                ..
            })) => Err(named(detail)),
            Ok(Err(e)) => Err(e),
            Err(message) => Err(named(format!("panic: {message}"))),
        }
    }

    /// Record a skipped row group; an error once more than `max_skipped`
    /// distinct row groups were skipped over the loader's life.
    fn skip(&self, error: LoaderError) -> Result<()> {
        let (shard, row_group) = match &error {
            LoaderError::Corrupt {
                shard, row_group, ..
            }
            | LoaderError::Decode {
                shard, row_group, ..
            } => (shard.clone(), row_group.unwrap_or(0)),
            _ => unreachable!("only damage is skipped"),
        };
        let count = self
            .counters
            .record_skip(&shard, row_group, &error.to_string());
        if count as u64 > self.config.max_skipped {
            return Err(LoaderError::TooManySkipped {
                max: self.config.max_skipped,
                last: Box::new(error),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    /// The calling thread's nice value, as the kernel reports it.
    #[cfg(target_os = "linux")]
    fn nice() -> i32 {
        // SAFETY: a system call on the calling thread's own id.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    /// A thread lowers its own priority only, by the increment asked for,
    /// capped at 19.
    #[cfg(target_os = "linux")]
    #[test]
    fn lower_priority_lowers_the_calling_thread_only() {
        let before = nice();
        let (lowered, capped, unchanged) = std::thread::spawn(|| {
            let base = nice();
            super::lower_priority(0);
            let unchanged = nice() == base;
            super::lower_priority(3);
            let lowered = nice() - base;
            super::lower_priority(19);
            (lowered, nice(), unchanged)
        })
        .join()
        .unwrap();
        assert_eq!(lowered, 3.min(19 - before));
        assert_eq!(capped, 19);
        assert!(unchanged);
        assert_eq!(nice(), before, "the caller's thread is left as it was");
    }

    use arrow_array::{Array, Int64Array, RecordBatch};

    use super::Stash;
    use crate::plan::Segment;

    fn ids(from: i64, to: i64) -> RecordBatch {
        RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from_iter_values(from..to)) as Arc<dyn Array>,
        )])
        .unwrap()
    }

    fn seg(shard: u32, row_group: u32, start: u32, end: u32) -> Segment {
        Segment {
            shard,
            row_group,
            start,
            end,
        }
    }

    #[test]
    fn the_rest_of_a_row_group_reuses_its_slices_fetch_within_reach() {
        let segments: Vec<(u64, Segment)> = [
            seg(0, 1, 0, 4),
            seg(0, 2, 0, 3),
            seg(0, 1, 4, 30),
            seg(1, 0, 0, 30),
            seg(0, 2, 3, 30),
            seg(0, 3, 5, 30),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, s)| (i as u64, s))
        .collect();
        let pairs = |reach| {
            let shares = super::shared_fetches(&segments, reach);
            shares
                .iter()
                .map(|s| (s.to.is_some(), s.from.is_some()))
                .collect::<Vec<_>>()
        };
        // 0 hands on to 2 and 1 to 4; a segment starting mid-group with no
        // earlier part (5) reads itself.
        let (no, to, from) = ((false, false), (true, false), (false, true));
        assert_eq!(pairs(3), [to, to, from, no, from, no]);
        // 1 and 4 are 3 apart: out of reach 2.
        assert_eq!(pairs(2), [to, no, from, no, no, no]);
    }

    #[test]
    fn stash_serves_the_rest_of_a_row_group_once() {
        let head = seg(0, 1, 0, 4);
        let tail = seg(0, 1, 4, 30);
        let other = seg(0, 2, 0, 30);
        let stash = Stash::new(&[(0, head), (1, other), (2, tail)]);
        // Nothing kept for a segment no later one continues.
        stash.put(&other, 30, vec![ids(30, 31)]);
        assert!(stash.rows.lock().unwrap().is_empty());
        // Too few rows: the tail decodes itself.
        stash.put(&head, 4, vec![ids(4, 20)]);
        assert!(stash.take(&tail).is_none());
        // The whole rest, in two batches: served once, exactly the tail's rows.
        stash.put(&head, 4, vec![ids(4, 20), ids(20, 30)]);
        let rows = stash.take(&tail).expect("served");
        let got: Vec<i64> = rows
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(got, (4..30).collect::<Vec<_>>());
        assert!(stash.take(&tail).is_none(), "served twice");
        // A tail ending before the row group does keeps only its rows.
        let short = seg(0, 1, 4, 10);
        let stash = Stash::new(&[(0, head), (1, short)]);
        stash.put(&head, 4, vec![ids(4, 30)]);
        let rows = stash.take(&short).expect("served");
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 6);
    }
}
