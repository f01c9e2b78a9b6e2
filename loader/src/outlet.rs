//! The consumer's side of a pipeline, shared by [`crate::Loader`] and
//! [`crate::Mixture`]: the wait for the next batch on a bounded channel
//! (interruptible, and refused when every pooled slab is held by the
//! caller), the count of slabs the caller holds, the wait and first-batch
//! counters, and the slow-consumer warning's window.
//!
//! What arrives on the channel differs (a plain loader's batches, or a
//! mixture thread's batches with their states); what the consumer does with
//! the wait and the batch does not, and lives here once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use crate::batch::Batch;
use crate::stats::Counters;

/// How often a wait looks at its `interrupted` callback.
const POLL: Duration = Duration::from_millis(20);

/// What one wait on the channel gave.
pub(crate) enum Received<T> {
    /// The next item.
    Item(T),
    /// The sender is gone (its thread ended or failed).
    Closed,
    /// `interrupted` returned `true`; the item awaited stays in the channel.
    Interrupted,
    /// The channel is empty and the caller holds every pooled slab: no batch
    /// can be made until the caller drops one.
    Exhausted,
}

/// The consumer's side: see the module documentation.
pub(crate) struct Outlet {
    /// Where the consumer's counts go (rows, bytes, batches, waits, first
    /// batch); a plain loader's are the pipeline's, read by `stats()`.
    pub(crate) counters: Arc<Counters>,
    /// Pooled slabs held by batches the caller has.
    held: Arc<AtomicUsize>,
    /// Slabs in the pool.
    slabs: usize,
    /// The first `next()` (or an explicit start).
    started: Option<Instant>,
    /// The slow-consumer warning: (fraction of time waited, batches).
    slow_warning: Option<(f64, u64)>,
    /// Where the warning's window began: time, wait, batches.
    since: Instant,
    wait_ns: u64,
    batches: u64,
    /// The epoch last warned about.
    warned: Option<u64>,
}

impl Outlet {
    /// An outlet counting into `counters`, for a pool of `slabs` slabs.
    pub(crate) fn new(
        counters: Arc<Counters>,
        slabs: usize,
        slow_warning: Option<(f64, u64)>,
    ) -> Outlet {
        Outlet {
            counters,
            held: Arc::new(AtomicUsize::new(0)),
            slabs,
            started: None,
            slow_warning,
            since: Instant::now(),
            wait_ns: 0,
            batches: 0,
            warned: None,
        }
    }

    /// When the consumer first asked (now, if it had not).
    pub(crate) fn start(&mut self) -> Instant {
        *self.started.get_or_insert_with(Instant::now)
    }

    /// When the consumer first asked, if it has.
    pub(crate) fn started(&self) -> Option<Instant> {
        self.started
    }

    /// Wait for the next item of `rx`, calling `interrupted` about every
    /// 20 ms while none comes.
    pub(crate) fn receive<T>(
        &self,
        rx: &Receiver<T>,
        mut interrupted: impl FnMut() -> bool,
    ) -> Received<T> {
        loop {
            if rx.is_empty() && self.held.load(Ordering::SeqCst) >= self.slabs {
                return Received::Exhausted;
            }
            match rx.recv_timeout(POLL) {
                Ok(item) => return Received::Item(item),
                Err(RecvTimeoutError::Disconnected) => return Received::Closed,
                Err(RecvTimeoutError::Timeout) => {
                    if interrupted() {
                        return Received::Interrupted;
                    }
                }
            }
        }
    }

    /// Count the wait of one `next()` from `waited` to now; `answered` when
    /// it ended with a batch or an error (the end of an epoch is not a wait
    /// for a batch, and stays out of the waits' histograms).
    pub(crate) fn waited(&self, waited: Instant, answered: bool) {
        let wait = waited.elapsed();
        let counters = &self.counters;
        Counters::add_time(&counters.wait_ns, wait);
        if let Some(t) = &counters.trace {
            t.span("wait", waited, wait, crate::trace::Args::None);
        }
        if answered {
            counters.waits.record(wait);
            counters.epoch_waits.record(wait);
        }
    }

    /// Hand `batch` to the caller: a pooled slab it now holds is counted
    /// (here, not when collated: a batch in the channel is not held) until
    /// the batch is dropped, and the batch joins the counts.
    pub(crate) fn deliver(&self, batch: &mut Batch) {
        if !batch.lease.is_oversize() {
            self.held.fetch_add(1, Ordering::SeqCst);
            batch.held = Some(self.held.clone());
        }
        let counters = &self.counters;
        if counters.first_batch_ns.load(Ordering::Relaxed) == 0
            && let Some(t) = self.started
        {
            let since = t.elapsed().max(Duration::from_nanos(1));
            Counters::add_time(&counters.first_batch_ns, since);
        }
        Counters::add(&counters.batches, 1);
        Counters::add(&counters.rows, batch.rows() as u64);
        Counters::add(&counters.filtered_rows, batch.filtered);
        let bytes: usize = batch
            .columns()
            .iter()
            .flat_map(|c| c.buffers())
            .map(|(_, b)| b.bytes())
            .sum::<usize>()
            + batch.handoff.as_ref().map_or(0, |h| h.bytes());
        Counters::add(&counters.bytes, bytes as u64);
    }

    /// After a batch of `epoch`: the fraction of time the consumer waited
    /// over the warning's window of batches, and the window's length, when
    /// that is over the configured fraction and `epoch` was not warned about
    /// yet (then it is). The caller names the bottleneck in its warning.
    pub(crate) fn slow(&mut self, epoch: u64) -> Option<(f64, u64)> {
        let (fraction, every) = self.slow_warning?;
        let batches = self.counters.batches.load(Ordering::Relaxed);
        if batches < self.batches.saturating_add(every) {
            return None;
        }
        let wait_now = self.counters.wait_ns.load(Ordering::Relaxed);
        let wall = self.since.elapsed().as_nanos().max(1) as f64;
        let waited = wait_now.saturating_sub(self.wait_ns) as f64 / wall;
        self.since = Instant::now();
        self.wait_ns = wait_now;
        self.batches = batches;
        if waited > fraction && self.warned != Some(epoch) {
            self.warned = Some(epoch);
            return Some((waited, every));
        }
        None
    }
}
