//! [`Feed`]: what a [`Loader`] and a [`Mixture`] both are to the code that
//! consumes them (a training loop, a binding, a benchmark), so that code is
//! written once for both.
//!
//! ```no_run
//! use shardfeed_loader::{Feed, FeedBuilder, Loader};
//! let builder = FeedBuilder::from(Loader::builder("/data/tokens").batch_size(32));
//! let mut feed: Box<dyn Feed> = builder.build()?;
//! while let Some(batch) = feed.next_batch(&mut || false) {
//!     let batch = batch?;
//!     // ... train on `batch`
//! }
//! let saved = feed.save().to_json();
//! let mut again = builder.build()?;
//! again.restore(&[again.parse_state(&saved)?], false)?;
//! # Ok::<(), shardfeed_loader::LoaderError>(())
//! ```

use serde::Serialize;

use crate::batch::Batch;
use crate::config::LoaderBuilder;
use crate::error::{LoaderError, Result};
use crate::loader::Loader;
use crate::mix::{Mixture, MixtureBuilder, MixtureState, MixtureStats, SourceState};
use crate::pinned::Pinning;
use crate::state::LoaderState;
use crate::stats::Stats;

/// A stream of batches over epochs, with a state to resume from: a
/// [`Loader`] or a [`Mixture`].
pub trait Feed: Send {
    /// The next batch of the current epoch, or `None` at its end (the next
    /// call starts the following epoch). While waiting it calls
    /// `interrupted` about every 20 ms; when that returns `true` the wait
    /// ends with [`LoaderError::Interrupted`] and the batch awaited is
    /// returned by the next call.
    fn next_batch(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Option<Result<Batch>>;

    /// Where the consumer is: the state after the last batch it received.
    fn save(&self) -> FeedState;

    /// Read a state of this kind of feed from its JSON text.
    fn parse_state(&self, json: &str) -> Result<FeedState>;

    /// Continue from `states`: one state (exactly where it was taken) or
    /// every rank's state of a job of another world size (an elastic
    /// resume). `allow_changed` lets a mixture start sources whose dataset
    /// or weight changed afresh instead of refusing the state.
    fn restore(&mut self, states: &[FeedState], allow_changed: bool) -> Result<()>;

    /// The current epoch.
    fn epoch(&self) -> u64;

    /// Move to `epoch`, from its start. A mixture accepts only its current
    /// epoch (its epochs follow from its sources').
    fn go_to_epoch(&mut self, epoch: u64) -> Result<()>;

    /// Batches of the current epoch, when known without reading data.
    fn batches_per_epoch(&self) -> Option<u64>;

    /// A snapshot of the counters.
    fn feed_stats(&self) -> FeedStats;

    /// The counters in Prometheus's text exposition format.
    fn metrics_text(&self) -> String;

    /// How the slabs were allocated.
    fn pinning(&self) -> Pinning;

    /// A free slab of the pool for a batch made outside the pipeline, if one
    /// is spare ([`Loader::spare_slab`], [`Mixture::spare_slab`]).
    fn spare_slab(&self) -> Result<Option<crate::SlabLease>>;

    /// A spare slab for a batch of `bytes` ([`Loader::spare_slab_for`],
    /// [`Mixture::spare_slab_for`]).
    fn spare_slab_for(&self, bytes: usize) -> Result<Option<crate::SlabLease>>;

    /// With a trace file: how its writing goes (see [`Loader::trace_outcome`]).
    fn trace_outcome(&self) -> Option<crate::trace::TraceOutcome> {
        None
    }

    /// Stop every thread; the next batch asked for continues where the
    /// consumer was.
    fn stop(&mut self);

    /// The mixture, for what only a mixture has (weights, sources).
    fn as_mixture(&mut self) -> Option<&mut Mixture> {
        None
    }
}

/// A [`Feed`]'s state: a plain loader's or a mixture's. Serialized as the
/// state itself (no tag), as `Loader::state` and `Mixture::state` are.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum FeedState {
    /// A plain loader's.
    Loader(LoaderState),
    /// A mixture's.
    Mixture(Box<MixtureState>),
}

impl FeedState {
    /// The shuffle window and an index's part rows the order was read in:
    /// the loader's, or each source's of a mixture (`None` where a mixture
    /// state from before they were recorded lacks them).
    pub fn orders(&self) -> Vec<Option<(usize, u64)>> {
        match self {
            FeedState::Loader(s) => vec![Some((s.window, s.part_rows))],
            FeedState::Mixture(m) => m.sources.iter().map(SourceState::order).collect(),
        }
    }

    /// The state as JSON text.
    pub fn to_json(&self) -> String {
        match self {
            FeedState::Loader(s) => s.to_json(),
            FeedState::Mixture(s) => s.to_json(),
        }
    }
}

/// A [`Feed`]'s counters: a plain loader's or a mixture's (each source's
/// loader's among them). Serialized as the counters themselves.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum FeedStats {
    /// A plain loader's.
    Loader(Box<Stats>),
    /// A mixture's.
    Mixture(Box<MixtureStats>),
}

impl FeedStats {
    /// Rows yielded.
    pub fn rows(&self) -> u64 {
        match self {
            FeedStats::Loader(s) => s.rows,
            FeedStats::Mixture(s) => s.rows,
        }
    }

    /// Batches yielded.
    pub fn batches(&self) -> u64 {
        match self {
            FeedStats::Loader(s) => s.batches,
            FeedStats::Mixture(s) => s.batches,
        }
    }

    /// Bytes of the batches yielded.
    pub fn bytes(&self) -> u64 {
        match self {
            FeedStats::Loader(s) => s.bytes,
            FeedStats::Mixture(s) => s.bytes,
        }
    }

    /// Milliseconds the consumer waited for batches.
    pub fn wait_ms(&self) -> f64 {
        match self {
            FeedStats::Loader(s) => s.wait_ms,
            FeedStats::Mixture(s) => s.wait_s * 1e3,
        }
    }

    /// Milliseconds from the first request to the first batch.
    pub fn first_batch_ms(&self) -> f64 {
        match self {
            FeedStats::Loader(s) => s.time_to_first_batch_ms,
            FeedStats::Mixture(s) => s.first_batch_s * 1e3,
        }
    }
}

/// What builds a [`Feed`] (again, for a rebuild or in a forked child).
#[derive(Clone, Debug)]
pub enum FeedBuilder {
    /// A plain loader.
    Loader(LoaderBuilder),
    /// A mixture (several datasets, or packing).
    Mixture(MixtureBuilder),
}

impl From<LoaderBuilder> for FeedBuilder {
    fn from(b: LoaderBuilder) -> Self {
        FeedBuilder::Loader(b)
    }
}

impl From<MixtureBuilder> for FeedBuilder {
    fn from(b: MixtureBuilder) -> Self {
        FeedBuilder::Mixture(b)
    }
}

impl FeedBuilder {
    /// Build the feed (reads the manifests).
    pub fn build(&self) -> Result<Box<dyn Feed>> {
        Ok(match self {
            FeedBuilder::Loader(b) => Box::new(b.clone().build()?),
            FeedBuilder::Mixture(b) => Box::new(b.clone().build()?),
        })
    }

    /// A builder whose shuffle window was left to the byte budget, set to
    /// the window (and an index's parts) `states` were saved with (the order
    /// follows them, and they follow the budget): so that a job resumes with
    /// another `byte_budget`, or on a machine that chose others. Each of a
    /// mixture's sources gets its own, on which every rank's state must
    /// agree. `None` when the window was given, when the states do not
    /// agree, and where one lacks them (a mixture's state parsed by
    /// [`Feed::parse_state`] has them).
    pub fn with_order_of(&self, states: &[FeedState]) -> Option<FeedBuilder> {
        let first = states.first()?.orders();
        let orders: Vec<(usize, u64)> = first.iter().copied().collect::<Option<_>>()?;
        if !states.iter().all(|s| s.orders() == first) {
            return None;
        }
        match self {
            FeedBuilder::Loader(b) if b.window.is_none() => {
                let [(window, part_rows)] = orders.as_slice() else {
                    return None;
                };
                let mut b = b.clone().window(*window);
                b.part_rows = Some(*part_rows);
                Some(FeedBuilder::Loader(b))
            }
            FeedBuilder::Mixture(m) if m.template.window.is_none() => {
                let mut m = m.clone();
                m.source_orders = Some(orders);
                Some(FeedBuilder::Mixture(m))
            }
            _ => None,
        }
    }
}

/// `states`, each a plain loader's, or an error naming the kind found.
fn loader_states(states: &[FeedState]) -> Result<Vec<LoaderState>> {
    states
        .iter()
        .map(|s| match s {
            FeedState::Loader(s) => Ok(s.clone()),
            FeedState::Mixture(_) => Err(LoaderError::BadState {
                reason: "a mixture's state given to a plain loader".into(),
            }),
        })
        .collect()
}

impl Feed for Loader {
    fn next_batch(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Option<Result<Batch>> {
        self.next_interruptible(interrupted)
    }

    fn save(&self) -> FeedState {
        FeedState::Loader(self.state())
    }

    fn parse_state(&self, json: &str) -> Result<FeedState> {
        LoaderState::from_json(json).map(FeedState::Loader)
    }

    fn restore(&mut self, states: &[FeedState], _allow_changed: bool) -> Result<()> {
        // One state of this world size is a plain resume; one of another
        // (a single-rank job resumed on several ranks) is every rank's.
        self.resume_elastic(&loader_states(states)?)
    }

    fn epoch(&self) -> u64 {
        Loader::epoch(self)
    }

    fn go_to_epoch(&mut self, epoch: u64) -> Result<()> {
        self.set_epoch(epoch);
        Ok(())
    }

    fn batches_per_epoch(&self) -> Option<u64> {
        Some(self.len())
    }

    fn feed_stats(&self) -> FeedStats {
        FeedStats::Loader(Box::new(self.stats()))
    }

    fn metrics_text(&self) -> String {
        Loader::metrics_text(self)
    }

    fn pinning(&self) -> Pinning {
        Loader::pinning(self)
    }

    fn spare_slab(&self) -> Result<Option<crate::SlabLease>> {
        Loader::spare_slab(self)
    }

    fn spare_slab_for(&self, bytes: usize) -> Result<Option<crate::SlabLease>> {
        Loader::spare_slab_for(self, bytes)
    }

    fn trace_outcome(&self) -> Option<crate::trace::TraceOutcome> {
        Loader::trace_outcome(self)
    }

    fn stop(&mut self) {
        Loader::stop(self)
    }
}

impl Feed for Mixture {
    fn spare_slab(&self) -> Result<Option<crate::SlabLease>> {
        Mixture::spare_slab(self)
    }

    fn spare_slab_for(&self, bytes: usize) -> Result<Option<crate::SlabLease>> {
        Mixture::spare_slab_for(self, bytes)
    }

    fn next_batch(&mut self, interrupted: &mut dyn FnMut() -> bool) -> Option<Result<Batch>> {
        self.next_interruptible(interrupted)
    }

    fn save(&self) -> FeedState {
        FeedState::Mixture(Box::new(self.state()))
    }

    fn parse_state(&self, json: &str) -> Result<FeedState> {
        MixtureState::from_json(json).map(|s| FeedState::Mixture(Box::new(self.with_orders(s))))
    }

    fn restore(&mut self, states: &[FeedState], allow_changed: bool) -> Result<()> {
        let states = states
            .iter()
            .map(|s| match s {
                FeedState::Mixture(s) => Ok((**s).clone()),
                FeedState::Loader(_) => Err(LoaderError::BadState {
                    reason: "a plain loader's state given to a mixture".into(),
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        match states.as_slice() {
            [one] if allow_changed => self.resume_changed(one),
            many => self.resume_elastic(many),
        }
    }

    fn epoch(&self) -> u64 {
        Mixture::epoch(self)
    }

    fn go_to_epoch(&mut self, epoch: u64) -> Result<()> {
        self.set_epoch(epoch)
    }

    fn batches_per_epoch(&self) -> Option<u64> {
        self.len()
    }

    fn feed_stats(&self) -> FeedStats {
        FeedStats::Mixture(Box::new(self.stats()))
    }

    fn metrics_text(&self) -> String {
        Mixture::metrics_text(self)
    }

    fn pinning(&self) -> Pinning {
        Mixture::pinning(self)
    }

    fn stop(&mut self) {
        Mixture::stop(self)
    }

    fn as_mixture(&mut self) -> Option<&mut Mixture> {
        Some(self)
    }
}
