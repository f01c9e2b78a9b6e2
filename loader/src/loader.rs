//! The loader: iteration over epochs, the consumer's side of the pipeline,
//! state and resume.

use crate::error::Stage;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use shardfeed_format::Manifest;
use tokio::sync::Semaphore;

use crate::batch::Batch;
use crate::config::{Config, LoaderBuilder};
use crate::error::{LoaderError, Result};
use crate::fetch::FetchContext;
use crate::outlet::{Outlet, Received};
use crate::pinned::{Pinning, Pool};
use crate::pipeline::{Pass, Pipeline};
use crate::plan::{EpochPlan, Piece};
use crate::state::{LoaderState, PLAN_VERSION, STATE_VERSION, dataset_fingerprint};
use crate::stats::{Counters, Stats};

/// The most epochs a state may plan from pieces (an elastic resume makes one
/// per epoch its old ranks were spread over).
const MAX_PENDING_EPOCHS: usize = 64;
/// The most pieces a state may hold over those epochs.
const MAX_PIECES: usize = 4096;

/// Streams a dataset as batches: see the crate documentation.
pub struct Loader {
    pipeline: Pipeline,
    /// The manifest's fingerprint, for states.
    dataset: String,
    epoch: u64,
    /// Positions of the current epoch yielded so far (or to start from).
    position: u64,
    pass: Option<Pass>,
    /// The next epoch's pass, started (from its beginning) once the current
    /// pass's last window is assembled, so the epoch boundary costs no wait.
    next_pass: Option<Pass>,
    /// The consumer's side: waits, held slabs, counts, the slow warning.
    outlet: Outlet,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("dataset", &self.pipeline.fetch.location.url())
            .field("epoch", &self.epoch)
            .field("position", &self.position)
            .field("config", &self.pipeline.config)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// Start configuring a loader for the dataset at `url`.
    pub fn builder(url: &str) -> LoaderBuilder {
        LoaderBuilder::new(url)
    }

    pub(crate) fn from_parts(
        config: Config,
        manifest: Arc<Manifest>,
        fetch: Arc<FetchContext>,
        runtime: Arc<tokio::runtime::Runtime>,
        pool: Arc<Pool>,
        counters: Arc<Counters>,
        epoch: u64,
    ) -> Loader {
        let permits =
            (config.in_flight_bytes >> 10).clamp(1, Semaphore::MAX_PERMITS as u64) as usize;
        let schema = fetch.columns.schema.clone();
        let outlet = Outlet::new(counters.clone(), pool.size(), config.slow_warning);
        Loader {
            outlet,
            dataset: dataset_fingerprint(&manifest),
            pipeline: Pipeline {
                config: Arc::new(config),
                manifest,
                fetch,
                runtime,
                pool,
                counters,
                permits: Arc::new(Semaphore::new(permits)),
                schema,
                overrides: Vec::new(),
            },
            epoch,
            position: 0,
            pass: None,
            next_pass: None,
        }
    }

    /// The projected columns (in the dataset's order).
    pub(crate) fn projected_schema(&self) -> &arrow_schema::Schema {
        &self.pipeline.schema
    }

    /// The dataset's fingerprint ([`dataset_fingerprint`]).
    pub(crate) fn fingerprint(&self) -> &str {
        &self.dataset
    }

    /// A handle that reads this loader's [`Stats`] (derived fractions
    /// included) from another thread, without the loader.
    pub(crate) fn stats_handle(&self) -> StatsHandle {
        let config = &self.pipeline.config;
        StatsHandle {
            counters: self.pipeline.counters.clone(),
            since: self.outlet.started().unwrap_or_else(Instant::now),
            decode_threads: config.decode_threads,
            io_concurrency: config.io_concurrency,
        }
    }

    /// Bytes per slab of the pool.
    pub(crate) fn pool_slab_bytes(&self) -> usize {
        self.pipeline.pool.slab_bytes()
    }

    /// Slabs of this loader's pool.
    pub(crate) fn pool_size(&self) -> usize {
        self.pipeline.pool.size()
    }

    /// This loader's rank and number of ranks.
    /// The window and part rows this loader would read in without a
    /// mixture source's share of the default window: what a mixture state
    /// that did not record its sources' windows was read in.
    pub(crate) fn unshared_order(&self) -> (usize, u64) {
        let c = &self.pipeline.config;
        (c.unshared_window, c.part_rows)
    }

    pub(crate) fn rank(&self) -> u64 {
        self.pipeline.config.rank
    }

    pub(crate) fn world_size(&self) -> u64 {
        self.pipeline.config.world_size
    }

    /// Rows this rank yields per epoch.
    pub(crate) fn rows_per_epoch(&self) -> u64 {
        self.pipeline.plan(self.epoch).positions()
    }

    /// Rows of the row groups `epoch`'s plan reads (each row group once,
    /// whole: a row group is fetched whole however few of its rows a plan
    /// takes).
    pub(crate) fn planned_rows(&self, epoch: u64) -> u64 {
        let plan = self.pipeline.plan(epoch);
        let mut units: Vec<(u32, u32)> = plan
            .segments()
            .iter()
            .map(|s| (s.shard, s.row_group))
            .collect();
        units.sort_unstable();
        units.dedup();
        let shards = &self.pipeline.manifest.shards;
        units
            .iter()
            .map(|&(s, g)| shards[s as usize].row_groups[g as usize])
            .sum()
    }

    /// Rows rank `rank` of `world` yields in `epoch` (without pieces).
    pub(crate) fn rows_of_rank(&self, epoch: u64, rank: u64, world: u64) -> u64 {
        self.pipeline.plan_for(epoch, rank, world).positions()
    }

    /// Plan these epochs from pieces of old ranks' sequences (an elastic
    /// resume); other epochs keep the usual plan. Stops a pass in progress.
    /// The pieces come from a state file: each must be a range of an old
    /// rank's sequence, and there may be no more of them than a resume makes.
    pub(crate) fn set_pending(&mut self, pending: &[(u64, Vec<Piece>)]) -> Result<()> {
        let overrides = self.plans_of_pieces(pending)?;
        self.stop();
        self.pipeline.overrides = overrides;
        Ok(())
    }

    /// The plans of epochs made from pieces, each piece checked first: a
    /// range of an old rank's sequence, no two overlapping (every row would
    /// be read twice), each epoch once, and no more than a resume makes.
    fn plans_of_pieces(&self, pending: &[(u64, Vec<Piece>)]) -> Result<Vec<(u64, Arc<EpochPlan>)>> {
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        if pending.len() > MAX_PENDING_EPOCHS {
            return refuse(format!(
                "the state plans {} epochs from pieces; a resume makes at most {MAX_PENDING_EPOCHS}",
                pending.len()
            ));
        }
        let pieces: usize = pending.iter().map(|(_, p)| p.len()).sum();
        if pieces > MAX_PIECES {
            return refuse(format!(
                "the state holds {pieces} pieces; a resume makes at most {MAX_PIECES}"
            ));
        }
        for (i, (epoch, pieces)) in pending.iter().enumerate() {
            if pending[..i].iter().any(|(e, _)| e == epoch) {
                return refuse(format!(
                    "the state plans epoch {epoch} from pieces twice (field pending)"
                ));
            }
            for p in pieces {
                let valid = p.world >= 1
                    && p.rank < p.world
                    && p.start <= p.end
                    && p.end <= self.rows_of_rank(*epoch, p.rank, p.world);
                if !valid {
                    return refuse(format!(
                        "piece {p:?} of epoch {epoch} is not a range of rank {} of {}'s sequence",
                        p.rank, p.world
                    ));
                }
            }
            let mut sorted: Vec<&Piece> = pieces.iter().filter(|p| p.rows() > 0).collect();
            sorted.sort_by_key(|p| (p.world, p.rank, p.start));
            if let Some(pair) = sorted.windows(2).find(|w| {
                (w[0].world, w[0].rank) == (w[1].world, w[1].rank) && w[0].end > w[1].start
            }) {
                return refuse(format!(
                    "pieces {:?} and {:?} of epoch {epoch} overlap: their rows would be read twice",
                    pair[0], pair[1]
                ));
            }
        }
        Ok(pending
            .iter()
            .map(|(epoch, pieces)| {
                let options = self.pipeline.plan_options(*epoch, 0, 1);
                let plan = EpochPlan::from_pieces(options, pieces, |rank, world| {
                    self.pipeline.plan_for(*epoch, rank, world)
                });
                (*epoch, Arc::new(plan))
            })
            .collect())
    }

    /// Refuse a state's `epoch` and `position` that no loader reaches: the
    /// last epoch a loader can count past, or a position past the end of
    /// the epoch's sequence (`positions` positions).
    fn check_stop(epoch: u64, position: u64, positions: u64) -> std::result::Result<(), String> {
        if epoch == u64::MAX {
            return Err(format!(
                "epoch {epoch} is past the last epoch a loader counts (2^64 - 2)"
            ));
        }
        if position > positions {
            return Err(format!(
                "position {position} is past the end of epoch {epoch}, which holds {positions} positions for this rank"
            ));
        }
        Ok(())
    }

    /// With a trace file: how its writing goes. Read it after the loader
    /// is dropped, when the file is finished: a write error is there.
    pub fn trace_outcome(&self) -> Option<crate::trace::TraceOutcome> {
        self.pipeline.counters.trace.as_ref().map(|t| t.outcome())
    }

    /// The dataset's manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.pipeline.manifest
    }

    /// A slab of the pool for a batch made outside the pipeline (see
    /// [`Batch::from_buffers`]), if one is free without taking the
    /// pipeline's last: `None` otherwise (never waits).
    pub fn spare_slab(&self) -> Result<Option<crate::SlabLease>> {
        self.pipeline.pool.try_spare()
    }

    /// [`Loader::spare_slab`] for a batch of `bytes`: a slab of the pool
    /// when its slabs hold them; otherwise, for a loader built with
    /// [`crate::LoaderBuilder::transform_slabs`], a slab of a second pool of
    /// larger slabs (pinned alike), up to that many at once and the byte
    /// budget in all; `None` when none is spare (never waits).
    pub fn spare_slab_for(&self, bytes: usize) -> Result<Option<crate::SlabLease>> {
        self.pipeline.pool.try_spare_for(bytes)
    }

    /// How the pool's slabs were allocated.
    pub fn pinning(&self) -> Pinning {
        self.pipeline.pool.pinning()
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Move to `epoch`, from its start. Stops a pass in progress (a pass of
    /// `epoch` that has not yielded a batch yet, such as the one started ahead
    /// at the end of the previous epoch, is kept).
    pub fn set_epoch(&mut self, epoch: u64) {
        if epoch == self.epoch && self.position == 0 {
            return;
        }
        self.stop();
        self.epoch = epoch;
        self.position = 0;
    }

    /// Batches per epoch for this rank (the same on every rank).
    pub fn len(&self) -> u64 {
        self.pipeline.plan(self.epoch).batches()
    }

    /// Whether an epoch yields no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the loader is now; pass it to [`Loader::resume`] to continue.
    pub fn state(&self) -> LoaderState {
        let c = &self.pipeline.config;
        LoaderState {
            version: STATE_VERSION,
            plan: PLAN_VERSION,
            seed: c.seed,
            epoch: self.epoch,
            position: self.position,
            rank: c.rank,
            world_size: c.world_size,
            batch_size: c.batch_size,
            shuffle: c.shuffle,
            window: c.window,
            part_rows: c.part_rows,
            drop_last: c.drop_last,
            dataset: self.dataset.clone(),
            pending: self
                .pipeline
                .overrides
                .iter()
                .filter(|(e, _)| *e >= self.epoch)
                .map(|(e, plan)| (*e, plan.pieces().unwrap_or_default().to_vec()))
                .collect(),
        }
    }

    /// Continue exactly where `state` was taken: the next batch is the one
    /// that followed it. Nothing before the state's shuffle window is read.
    /// A state of another dataset, another order algorithm, or with options
    /// that change the order is refused, naming what differs.
    pub fn resume(&mut self, state: &LoaderState) -> Result<()> {
        state.check_compatible(&self.state())?;
        let overrides = self.plans_of_pieces(&state.pending)?;
        let positions = match overrides.iter().find(|(e, _)| *e == state.epoch) {
            Some((_, plan)) => plan.positions(),
            None => self.rows_of_rank(
                state.epoch,
                self.pipeline.config.rank,
                self.pipeline.config.world_size,
            ),
        };
        Self::check_stop(state.epoch, state.position, positions)
            .map_err(|reason| LoaderError::BadState { reason })?;
        self.stop();
        self.pipeline.overrides = overrides;
        self.epoch = state.epoch;
        self.position = state.position;
        Ok(())
    }

    /// Continue from the states of every rank of a job, whatever its world
    /// size was (an elastic resume). One state of this world size is a plain
    /// [`Loader::resume`]; so are all the states of a job of this world size
    /// (this rank's is used). Otherwise what the old ranks had not yet
    /// yielded of their epoch (as position ranges of their sequences, read
    /// with their windows' order) is split evenly over the new ranks, each
    /// taking a contiguous share, so that across the two runs every row is
    /// read once, except fewer than `world_size` rows that do not divide
    /// evenly and, with `drop_last`, each new rank's last partial batch.
    pub fn resume_elastic(&mut self, states: &[LoaderState]) -> Result<()> {
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        let Some(first) = states.first() else {
            return refuse("no state to resume from".into());
        };
        let old_world = first.world_size;
        let (rank, world) = (self.pipeline.config.rank, self.pipeline.config.world_size);
        if states.len() == 1 && old_world == world {
            return self.resume(first);
        }
        let mut ranks: Vec<u64> = states.iter().map(|s| s.rank).collect();
        ranks.sort_unstable();
        // The count first: a forged world size must not size anything.
        if states.len() as u64 != old_world
            || states.iter().any(|s| s.world_size != old_world)
            || ranks.iter().enumerate().any(|(i, &r)| r != i as u64)
        {
            return refuse(format!(
                "an elastic resume needs the states of all ranks of the saved job, once each, of one world size; got ranks {ranks:?}"
            ));
        }
        if old_world == world {
            let mine = states.iter().find(|s| s.rank == rank).expect("every rank");
            return self.resume(mine);
        }
        let current = self.state();
        for st in states {
            let mut mine = st.clone();
            mine.rank = rank;
            mine.world_size = world;
            mine.check_compatible(&current)?;
        }
        let mut states: Vec<&LoaderState> = states.iter().collect();
        states.sort_by_key(|s| s.rank);
        for st in &states {
            let overrides = self.plans_of_pieces(&st.pending)?;
            let positions = match overrides.iter().find(|(e, _)| *e == st.epoch) {
                Some((_, plan)) => plan.positions(),
                None => self.rows_of_rank(st.epoch, st.rank, old_world),
            };
            Self::check_stop(st.epoch, st.position, positions).map_err(|reason| {
                LoaderError::BadState {
                    reason: format!("the state of rank {}: {reason}", st.rank),
                }
            })?;
        }
        let stops: Vec<crate::plan::Stop> = states
            .iter()
            .map(|st| crate::plan::Stop {
                epoch: st.epoch,
                position: st.position,
                tokens: 0,
                pending: &st.pending,
            })
            .collect();
        let lo = states.iter().map(|s| s.epoch).min().expect("states");
        let pending: Vec<(u64, Vec<Piece>)> =
            crate::plan::elastic_share(&stops, old_world, rank, world, |e, r, w| {
                self.rows_of_rank(e, r, w)
            })
            .into_iter()
            .map(|(epoch, pieces, _)| (epoch, pieces))
            .collect();
        self.set_pending(&pending)?;
        self.epoch = lo;
        self.position = 0;
        Ok(())
    }

    /// This loader's counters in Prometheus's text exposition format
    /// (`shardfeed_*`, labelled with this rank): see [`Stats::to_prometheus`].
    pub fn metrics_text(&self) -> String {
        self.stats()
            .to_prometheus(self.pipeline.config.rank as usize)
    }

    /// A snapshot of the counters since the loader was built.
    pub fn stats(&self) -> Stats {
        let mut s = self.pipeline.counters.snapshot();
        s.output_queue = self.pass.as_ref().map_or(0, |r| r.output.len() as u64);
        s.pinning = self.pipeline.pool.pinning().name().to_string();
        s.slabs = self.pipeline.pool.size();
        s.slabs_made = self.pipeline.pool.made();
        s.slab_bytes = self.pipeline.pool.slab_bytes();
        (s.read_buffers_made, s.read_buffer_bytes) = self.pipeline.fetch.read_buffers();
        let manifest = &self.pipeline.manifest;
        let window = self.pipeline.config.window;
        s.mixing.window_row_groups = window;
        s.mixing.window_rows = manifest.total_rows as f64
            / manifest.row_group_count().max(1) as f64
            * window.min(manifest.row_group_count().max(1)) as f64;
        s.mixing.shuffled_at_shard_time = manifest.options.shuffle_seed.is_some();
        if let Some(started) = self.outlet.started() {
            let config = &self.pipeline.config;
            s.derive(
                started.elapsed(),
                config.decode_threads,
                config.io_concurrency,
            );
        }
        s
    }

    /// Stop the pass in progress: cancel I/O and join every thread.
    pub fn stop(&mut self) {
        if let Some(r) = self.pass.take() {
            r.stop();
        }
        if let Some(r) = self.next_pass.take() {
            r.stop();
        }
    }

    /// Start the pass of the current epoch (fetching and decoding ahead)
    /// without waiting for a batch; `next()` does it when needed.
    pub(crate) fn start(&mut self) {
        if self.pass.is_none() {
            self.outlet.start();
            self.pass = Some(self.pipeline.launch(self.epoch, self.position, None));
        }
    }

    /// [`Iterator::next`] that calls `interrupted` about every 20 ms while it
    /// waits for a batch; when that returns `true` it gives up the wait with
    /// [`LoaderError::Interrupted`] and the pass goes on: the next call
    /// returns the batch that was awaited. Bindings use it to deliver Ctrl-C.
    pub fn next_interruptible(
        &mut self,
        interrupted: impl FnMut() -> bool,
    ) -> Option<Result<Batch>> {
        self.start();
        let waited = Instant::now();
        let pass = self.pass.as_ref().expect("started above");
        // The end of an epoch is the plan's last batch, never a closed
        // channel.
        let result = if pass.next_index >= pass.batches {
            None
        } else {
            match self.outlet.receive(&pass.output, interrupted) {
                Received::Item(item) => Some(item),
                Received::Exhausted => Some(Err(LoaderError::PoolExhausted {
                    slabs: self.pipeline.pool.size(),
                })),
                Received::Interrupted => Some(Err(LoaderError::Interrupted)),
                Received::Closed => Some(Err(LoaderError::stage(
                    Stage::Collate,
                    None,
                    None,
                    format!(
                        "stopped before delivering batch {} of the {} of epoch {}",
                        pass.next_index, pass.batches, pass.epoch
                    ),
                ))),
            }
        };
        self.outlet.waited(waited, result.is_some());
        match result {
            Some(Ok(mut batch)) => {
                self.outlet.deliver(&mut batch);
                if self.next_pass.is_none()
                    && let Some(r) = &self.pass
                    && r.assembled_all.load(Ordering::SeqCst)
                {
                    // Everything of this epoch is decoded: start fetching and
                    // decoding the next one while the last window is collated
                    // (within the same budget), so the boundary costs no wait.
                    let after = r.collated.clone();
                    self.next_pass = Some(self.pipeline.launch(r.epoch + 1, 0, Some(after)));
                }
                let pass = self.pass.as_mut().expect("running");
                pass.next_index += 1;
                let batch_size = self.pipeline.config.batch_size as u64;
                self.position = ((batch.index() + 1) * batch_size).min(pass.positions);
                self.watch_waits();
                Some(Ok(batch))
            }
            Some(Err(e)) => {
                if !matches!(
                    e,
                    LoaderError::PoolExhausted { .. } | LoaderError::Interrupted
                ) {
                    self.stop();
                }
                Some(Err(e))
            }
            None => {
                // The epoch is over: the next call continues with the
                // following one, already under way.
                if let Some(r) = self.pass.take() {
                    r.stop();
                }
                self.epoch += 1;
                self.position = 0;
                self.pipeline.counters.epoch_waits.reset();
                self.pass = self.next_pass.take().filter(|p| p.epoch == self.epoch);
                None
            }
        }
    }
}

impl Loader {
    /// Warn once per epoch when the consumer waited for more than the
    /// configured fraction over the last window of batches.
    fn watch_waits(&mut self) {
        if let Some((waited, every)) = self.outlet.slow(self.epoch) {
            let stage = self.stats().limiting_stage();
            tracing::warn!(
                epoch = self.epoch,
                bottleneck = stage.as_str(),
                "the trainer waited for data {:.0}% of the time over the last {every} batches; the {} stage is the bottleneck (stats().stages has each stage's busy and blocked time)",
                100.0 * waited,
                stage
            );
        }
    }
}

/// Reads a loader's [`Stats`] without the loader: see
/// [`Loader::stats_handle`].
pub(crate) struct StatsHandle {
    counters: Arc<Counters>,
    since: Instant,
    decode_threads: usize,
    io_concurrency: usize,
}

impl StatsHandle {
    /// The counters, and the fractions derived from them since the loader
    /// started.
    pub(crate) fn stats(&self) -> Stats {
        let mut s = self.counters.snapshot();
        s.derive(
            self.since.elapsed(),
            self.decode_threads,
            self.io_concurrency,
        );
        s
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    /// The next batch of the current epoch; `None` at its end, after which
    /// the next call starts the following epoch.
    fn next(&mut self) -> Option<Result<Batch>> {
        self.next_interruptible(|| false)
    }
}
