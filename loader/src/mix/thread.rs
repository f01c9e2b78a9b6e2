//! [`Mixture`]: the mixture's [`Core`] on its own thread, a few batches ahead
//! of the consumer.
//!
//! The thread blends, packs and collates into the mixture's slabs while the
//! trainer works on the previous batch; each batch comes with the state after
//! it, so [`Mixture::state`] is where the consumer is, not where the thread
//! is. Changing course (resume, new weights, stop) stops the thread, takes the
//! core back, and rewinds it to the consumer's state before it goes on:
//! batches made ahead are discarded, never skipped.

use crate::error::Stage;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, SendTimeoutError, bounded};

use super::{Core, LenInput, MixtureState, MixtureStats, Progress};
use crate::batch::Batch;
use crate::error::{LoaderError, Result};
use crate::outlet::{Outlet, Received};
use crate::pinned::{Pinning, Pool};
use crate::stats::Counters;

/// Batches the mixture's thread makes ahead of the consumer.
pub const MIXTURE_PREFETCH: usize = 4;

/// What the thread sends: a batch and the state after it; the end of a
/// mixture epoch, the state after it and the next epoch's length; a failure.
enum Item {
    Batch(Batch, Box<(MixtureState, Progress)>),
    End(Box<(MixtureState, Progress)>, Option<LenInput>),
    Failed(LoaderError),
}

/// The running thread.
struct Running {
    rx: Receiver<Item>,
    cancel: Arc<AtomicBool>,
    handle: JoinHandle<Box<Core>>,
}

/// A loader over several datasets blended by weight, optionally packing a
/// token column: see [`crate::mix`] and [`crate::Loader::builder_mixture`].
/// It yields [`Batch`]es like a [`crate::Loader`], made on its own thread a
/// few batches ahead.
pub struct Mixture {
    /// The core, when no thread runs it.
    core: Option<Box<Core>>,
    /// The core ran past `state` (a thread was stopped): rewind before use.
    stale: bool,
    running: Option<Running>,
    /// The state after the last batch (or epoch end) the consumer received.
    state: MixtureState,
    /// What the current mixture epoch's length follows from, and the
    /// length once asked for (the simulation runs on the caller's thread).
    len_input: Option<LenInput>,
    len: std::cell::OnceCell<Option<u64>>,
    urls: Vec<String>,
    pool: Arc<Pool>,
    /// Each source loader's statistics.
    sources: Vec<crate::loader::StatsHandle>,
    /// The thread's progress when it made the last batch received.
    progress: Progress,
    /// The consumer's side: waits, held slabs, counts, the slow warning.
    outlet: Outlet,
    /// Each source's window and part rows without its share of the default
    /// window: what a state that did not record its sources' was read in.
    unshared_orders: Vec<(usize, u64)>,
}

impl std::fmt::Debug for Mixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mixture")
            .field("sources", &self.state.sources)
            .field("weights", &self.state.weights)
            .field("epoch", &self.state.epoch)
            .field("pack", &self.state.pack)
            .finish_non_exhaustive()
    }
}

impl Mixture {
    pub(crate) fn new(core: Core, slow_warning: Option<(f64, u64)>) -> Self {
        let counters = Arc::new(Counters::default());
        Mixture {
            outlet: Outlet::new(counters, core.pool.size(), slow_warning),
            state: core.state(),
            len_input: core.len_input(),
            len: Default::default(),
            urls: core.source_urls(),
            pool: core.pool.clone(),
            sources: core.source_stats(),
            progress: core.progress(),
            unshared_orders: core.unshared_orders.clone(),
            core: Some(Box::new(core)),
            stale: false,
            running: None,
        }
    }

    /// Stop the thread (discarding the batches it made ahead) and take the
    /// core back.
    fn halt(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        running.cancel.store(true, Ordering::SeqCst);
        // Free the queue's slabs: a thread waiting for a slab or for room
        // in the queue sees the cancel within 20 ms.
        while running.rx.try_recv().is_ok() {}
        match running.handle.join() {
            Ok(core) => {
                core.streams.cancel.store(false, Ordering::SeqCst);
                self.core = Some(core);
            }
            Err(_) => self.core = None,
        }
        self.stale = true;
    }

    /// The core, rewound to the consumer's state.
    fn core(&mut self) -> Result<&mut Core> {
        self.halt();
        let stale = std::mem::replace(&mut self.stale, false);
        let state = self.state.clone();
        let core = self.core.as_mut().ok_or_else(|| {
            LoaderError::stage(
                Stage::Mix,
                None,
                None,
                "the mixture's thread panicked outside a batch; build the loader again",
            )
        })?;
        if stale && let Err(e) = core.resume(&state) {
            self.stale = true;
            return Err(e);
        }
        Ok(core)
    }

    /// Start the thread if none runs.
    fn run(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        self.core()?;
        let mut core = self.core.take().expect("checked by core()");
        let cancel = core.streams.cancel.clone();
        let stop = cancel.clone();
        let (tx, rx) = bounded::<Item>(MIXTURE_PREFETCH);
        let handle = std::thread::Builder::new()
            .name("shardfeed-mix".into())
            .spawn(move || {
                loop {
                    if stop.load(Ordering::SeqCst) {
                        return core;
                    }
                    // A panic (the core's, or a tokenizer's) is this batch's
                    // error, kept quiet like the pipeline's.
                    let made = shardfeed_format::panic::catch(|| core.next_batch());
                    let mut item = match made {
                        Ok(Some(Ok(batch))) => {
                            Item::Batch(batch, Box::new((core.state(), core.progress())))
                        }
                        Ok(None) => {
                            Item::End(Box::new((core.state(), core.progress())), core.len_input())
                        }
                        Ok(Some(Err(LoaderError::Interrupted))) if stop.load(Ordering::SeqCst) => {
                            return core;
                        }
                        Ok(Some(Err(e))) => Item::Failed(e),
                        Err(message) => Item::Failed(LoaderError::stage(
                            Stage::Mix,
                            None,
                            None,
                            format!("panic: {message}"),
                        )),
                    };
                    let failed = matches!(item, Item::Failed(_));
                    loop {
                        match tx.send_timeout(item, Duration::from_millis(20)) {
                            Ok(()) => break,
                            Err(SendTimeoutError::Timeout(back)) => {
                                if stop.load(Ordering::SeqCst) {
                                    return core;
                                }
                                item = back;
                            }
                            Err(SendTimeoutError::Disconnected(_)) => return core,
                        }
                    }
                    if failed {
                        return core;
                    }
                }
            })
            .map_err(|source| LoaderError::Io {
                op: "start the mixture's thread".into(),
                source,
            })?;
        self.running = Some(Running { rx, cancel, handle });
        Ok(())
    }

    /// Where the consumer is: pass it to [`Mixture::resume`] to continue.
    pub fn state(&self) -> MixtureState {
        self.state.clone()
    }

    /// Apply `f` to the core (rewound), then take its state as the
    /// consumer's; on failure the core is rewound before its next use.
    fn change(&mut self, f: impl FnOnce(&mut Core) -> Result<()>) -> Result<()> {
        let core = self.core()?;
        let result = f(core);
        if result.is_err() {
            self.stale = true;
            return result;
        }
        let core = self.core.as_ref().expect("present");
        self.state = core.state();
        self.len_input = core.len_input();
        self.len = Default::default();
        self.progress = core.progress();
        Ok(())
    }

    /// `state` with the windows (and part rows) of its sources that it did
    /// not record, saved by a build that did not record them: one loader's
    /// default windows, which those sources were read in. A loader rebuilt
    /// with a state's windows ([`crate::FeedBuilder::with_order_of`]) then
    /// reads them in these.
    pub(crate) fn with_orders(&self, state: MixtureState) -> MixtureState {
        super::state::recorded(state, &self.unshared_orders)
    }

    /// Continue exactly where `state` was taken. A state of other datasets,
    /// weights or order options is refused, naming what changed; see
    /// [`Mixture::resume_changed`] to accept changed sources.
    pub fn resume(&mut self, state: &MixtureState) -> Result<()> {
        self.change(|core| core.resume(state))
    }

    /// [`Mixture::resume`], but sources whose dataset changed (or that are
    /// new) start afresh (source epoch 0, position 0) and changed weights
    /// take the loader's own; unchanged sources continue where they were.
    pub fn resume_changed(&mut self, state: &MixtureState) -> Result<()> {
        self.change(|core| core.resume_changed(state))
    }

    /// Continue from every rank's state of a job of any world size (an
    /// elastic resume). One state of this world size is a plain resume; so are
    /// all the states of a job of this world size (this rank's is used).
    /// Otherwise what the old ranks had not yet yielded of each source's
    /// epoch (and, packing in split mode, the rest of each document they were
    /// emitting) is split evenly over the new ranks, each taking a
    /// contiguous share, so that across the two runs every row (and token)
    /// is read exactly once, except fewer than `world_size` rows per source
    /// and epoch that do not divide evenly. The blending counts restart.
    /// Fit-mode packing cannot be resumed with another world size.
    pub fn resume_elastic(&mut self, states: &[MixtureState]) -> Result<()> {
        self.change(|core| core.resume_elastic(states))
    }

    /// Change the weights from the next batch on (the counts restart, so the
    /// new shares hold exactly from there); batches made ahead with the old
    /// weights are discarded. Recorded in the state. In fit mode the current
    /// pack window was drawn already: the new weights apply from the next.
    pub fn set_weights(&mut self, weights: &[f64]) -> Result<()> {
        self.change(|core| core.set_weights(weights))
    }

    /// The weights last set (pending until the next pack window in fit mode).
    pub fn weights(&self) -> &[f64] {
        &self.state.weights
    }

    /// The sources' URLs, as given.
    pub fn source_urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// The mixture epoch.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// Only a no-op for the current epoch (so a training loop that calls
    /// `set_epoch(e)` before each epoch works): a mixture's epochs follow
    /// from its sources, which run their own. Another epoch is refused.
    pub fn set_epoch(&mut self, epoch: u64) -> Result<()> {
        if epoch == self.state.epoch {
            return Ok(());
        }
        Err(LoaderError::BadOption {
            option: "epoch",
            reason: format!(
                "a mixture's epochs follow from its sources; it is at epoch {}, and cannot jump to {epoch} (resume from a state instead)",
                self.state.epoch
            ),
        })
    }

    /// Batches of the current mixture epoch, when known without reading
    /// data: without packing and with `mix_stop` other than `never`, a
    /// simulation of the blending from where the sources were when the epoch
    /// began (with the weights now in force).
    /// It is simulated when first asked for in an epoch, in time
    /// proportional to the epoch's rows (about 10 ns each).
    pub fn len(&self) -> Option<u64> {
        *self
            .len
            .get_or_init(|| self.len_input.as_ref().and_then(LenInput::batches))
    }

    /// Whether the current mixture epoch is known to yield no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// After an elastic resume: rows of the row groups this rank reads for
    /// the rest of the epochs it took over (row groups are fetched whole), per
    /// source. Shows that each new rank reads about its share.
    pub fn elastic_rows(&mut self) -> Result<Vec<u64>> {
        Ok(self.core()?.elastic_rows())
    }

    /// How the slabs were allocated.
    pub fn pinning(&self) -> Pinning {
        self.pool.pinning()
    }

    /// A slab of the mixture's pool for a batch made outside it (see
    /// [`crate::Batch::from_buffers`]), if one is free without taking the
    /// mixture's last: `None` otherwise (never waits).
    pub fn spare_slab(&self) -> Result<Option<crate::SlabLease>> {
        self.pool.try_spare()
    }

    /// [`Mixture::spare_slab`] for a batch of `bytes`, as
    /// [`crate::Loader::spare_slab_for`].
    pub fn spare_slab_for(&self, bytes: usize) -> Result<Option<crate::SlabLease>> {
        self.pool.try_spare_for(bytes)
    }

    /// Counters, with each source loader's.
    pub fn stats(&self) -> MixtureStats {
        let p = &self.progress;
        let c = &self.outlet.counters;
        let ns = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed) as f64 / 1e9;
        MixtureStats {
            batches: c.batches.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            documents: p.documents.clone(),
            tokens: p.tokens,
            padding_tokens: p.padding_tokens,
            dropped_batches: p.dropped_batches,
            staged_batches: p.staged_batches,
            filtered_rows: c.filtered_rows.load(Ordering::Relaxed),
            wait_s: ns(&c.wait_ns),
            first_batch_s: ns(&c.first_batch_ns),
            sources: self.sources.iter().map(|h| h.stats()).collect(),
        }
    }

    /// Each source loader's counters in Prometheus's text format: the
    /// families of [`crate::Stats::to_prometheus`], each sample labelled with
    /// the rank and the source's index (`source="0"`, ...), every family once.
    pub fn metrics_text(&self) -> String {
        let rank = self.state.rank as usize;
        // Families in order, each its header lines and its samples.
        let mut families: Vec<(Vec<String>, Vec<String>)> = Vec::new();
        for (i, counters) in self.sources.iter().enumerate() {
            let text = counters.stats().to_prometheus(rank);
            let mut family = 0usize;
            let mut seen_header = false;
            let mut index = 0usize;
            for line in text.lines() {
                if line.starts_with('#') {
                    if !seen_header {
                        // A new family starts with its first header line.
                        family = index;
                        index += 1;
                        seen_header = true;
                    }
                    if i == 0 {
                        if families.len() <= family {
                            families.push((Vec::new(), Vec::new()));
                        }
                        families[family].0.push(line.to_string());
                    }
                    continue;
                }
                seen_header = false;
                let labelled = line.replacen(
                    &format!("{{rank=\"{rank}\""),
                    &format!("{{rank=\"{rank}\",source=\"{i}\""),
                    1,
                );
                if let Some(f) = families.get_mut(family) {
                    f.1.push(labelled);
                }
            }
        }
        let mut out = String::new();
        for (header, samples) in families {
            for line in header.iter().chain(&samples) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Stop the mixture's thread and every source's pipeline; the next
    /// `next()` continues where the consumer was.
    pub fn stop(&mut self) {
        self.halt();
        if let Some(core) = &mut self.core {
            core.stop();
            self.stale = true;
        }
    }

    /// Warn once per epoch when the consumer waited for more than the
    /// configured fraction of the time over the last window of batches (as a
    /// plain loader does), naming the sources' slowest stage.
    fn watch_waits(&mut self) {
        let epoch = self.state.epoch;
        if let Some((waited, every)) = self.outlet.slow(epoch) {
            let stages: Vec<String> = self
                .sources
                .iter()
                .enumerate()
                .map(|(i, h)| format!("source {i}: {}", h.stats().limiting_stage()))
                .collect();
            tracing::warn!(
                epoch,
                "the trainer waited for data {:.0}% of the time over the last {every} batches of the mixture; limiting stages: {} (stats()[\"sources\"] has each source's)",
                100.0 * waited,
                stages.join(", ")
            );
        }
    }

    /// [`Iterator::next`] that calls `interrupted` about every 20 ms while it
    /// waits; when that returns `true` it gives up the wait with
    /// [`LoaderError::Interrupted`] and the thread goes on: the next call
    /// returns the batch that was awaited.
    pub fn next_interruptible(
        &mut self,
        interrupted: impl FnMut() -> bool,
    ) -> Option<Result<Batch>> {
        self.outlet.start();
        if let Err(e) = self.run() {
            return Some(Err(e));
        }
        let waited = Instant::now();
        let running = self.running.as_ref().expect("started above");
        let result = match self.outlet.receive(&running.rx, interrupted) {
            Received::Item(Item::Batch(mut batch, after)) => {
                (self.state, self.progress) = *after;
                self.outlet.waited(waited, true);
                self.outlet.deliver(&mut batch);
                self.watch_waits();
                return Some(Ok(batch));
            }
            Received::Item(Item::End(after, len)) => {
                (self.state, self.progress) = *after;
                self.len_input = len;
                self.len = Default::default();
                None
            }
            Received::Item(Item::Failed(e)) => {
                // The thread has stopped; the next call rewinds to the
                // last batch received and tries again.
                self.halt();
                Some(Err(e))
            }
            Received::Exhausted => Some(Err(LoaderError::PoolExhausted {
                slabs: self.pool.size(),
            })),
            Received::Interrupted => Some(Err(LoaderError::Interrupted)),
            Received::Closed => {
                self.halt();
                Some(Err(LoaderError::stage(
                    Stage::Mix,
                    None,
                    None,
                    "the mixture's thread stopped before the epoch's end",
                )))
            }
        };
        self.outlet.waited(waited, result.is_some());
        result
    }
}

impl Iterator for Mixture {
    type Item = Result<Batch>;

    /// The next batch, or `None` at the end of the mixture epoch (the next
    /// call starts the following one).
    fn next(&mut self) -> Option<Result<Batch>> {
        self.next_interruptible(|| false)
    }
}

impl Drop for Mixture {
    fn drop(&mut self) {
        self.stop();
    }
}
