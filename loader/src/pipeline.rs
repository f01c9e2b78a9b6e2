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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use arrow_schema::SchemaRef;
use crossbeam_channel::{Receiver, RecvTimeoutError, bounded, unbounded};
use shardfeed_format::Manifest;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::batch::Batch;
use crate::collate::Collator;
use crate::config::Config;
use crate::decode::{Decoder, FetchedRx, Stash, lower_priority};
use crate::error::Stage;
use crate::error::{LoaderError, Result};
use crate::fetch::FetchContext;
use crate::fetch::stage::shared_fetches;
use crate::pinned::Pool;
use crate::plan::{EpochPlan, PlanOptions, Segment};
use crate::shuffle::{LoadedWindow, Shuffler};
use crate::stage::{Decoded, Fetched};
use crate::stats::Counters;
use shardfeed_format::panic::catch;

/// What the passes of one loader share.
pub(crate) struct Pipeline {
    pub config: Arc<Config>,
    pub manifest: Arc<Manifest>,
    pub fetch: Arc<FetchContext>,
    pub runtime: Arc<tokio::runtime::Runtime>,
    pub pool: Arc<Pool>,
    pub counters: Arc<Counters>,
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
            first_slices: if crate::plan::slices_first_window(
                self.manifest.options.shuffle_seed.is_some(),
                self.manifest.row_group_count() as u64,
                world_size,
            ) {
                crate::config::FIRST_SLICES
            } else {
                0
            },
            keep_partial: c.keep_partial,
            part_rows: c.part_rows,
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
        // Parts of large row groups are read as their own pages: nothing
        // of one serves the next.
        let (stash, shares) = if config.part_rows > 0 {
            let none: Vec<_> = segments.iter().map(|_| Default::default()).collect();
            (Arc::new(Stash::new(&[])), none)
        } else {
            (
                Arc::new(Stash::new(&segments)),
                shared_fetches(&segments, 2 * config.window.max(1)),
            )
        };

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
        let fetch_task = crate::fetch::stage::FetchStage {
            fetch: self.fetch.clone(),
            permits: self.permits.clone(),
            counters: self.counters.clone(),
            config: config.clone(),
            cancel: cancel.clone(),
            segments,
            shares,
            first_seq,
            fetched_tx,
            fetched_all: fetched_all.clone(),
            decoded_tx: decoded_tx.clone(),
        }
        .spawn(&self.runtime);

        let mut threads = Vec::new();
        // Each decode thread says when its priority is lowered: the pass
        // starts with every one at its niceness, not whenever the system
        // first runs it.
        let (lowered_tx, lowered_rx) = bounded::<()>(config.decode_threads);
        for i in 0..config.decode_threads {
            let lowered = lowered_tx.clone();
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
                columns: self.fetch.columns.clone(),
                fetched_all: fetched_all.clone(),
                mapped: self.fetch.mapped_check(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("shardfeed-decode-{i}"))
                    .spawn(move || {
                        lower_priority(decoder.config.decode_niceness);
                        let _ = lowered.send(());
                        drop(lowered);
                        decoder.run()
                    })
                    .expect("spawn a decode thread"),
            );
        }
        drop(lowered_tx);
        // Ends early only where a thread is gone before it said so.
        for _ in 0..config.decode_threads {
            if lowered_rx.recv().is_err() {
                break;
            }
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
                mapped: self.fetch.mapped_check(),
                row_ids: Vec::new(),
                provisional_batches: 0,
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
                            let _ = output_tx.send(collator.mapped.check().and(Err(
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
