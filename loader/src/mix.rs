//! Mixtures of datasets, sequence packing, and their one small state.
//!
//! A [`Mixture`] reads several datasets (sources), each through its own
//! [`Loader`] in its own seeded shuffled order (rank-partitioned as a plain
//! loader is, every row of a rank's block once per source epoch), and blends
//! their rows (documents) by weight. Blending is exact and deterministic in
//! every prefix: the next row comes from the source furthest below its
//! share, `w_i * (n + 1) - c_i` largest after `n` rows of which `c_i` came
//! from source `i`, ties broken by a seeded order of the sources. Shares are
//! compared in 2^-40 fixed point, so the same weights give the same sequence
//! on every machine.
//!
//! A source starts its next epoch when exhausted; [`MixStop`] says when the
//! mixture's epoch ends. With [`PackOptions`] the rows are token lists packed
//! into rows of exactly `pack_to` tokens ([`PackOptions`]); otherwise a batch
//! holds `batch_size` rows with the sources' columns plus `source` (`int32`,
//! the row's source index).
//!
//! The state ([`MixtureState`]) holds each source's epoch and position, the
//! blending counts and weights, and the packing carry-over: the document
//! being emitted (split mode) or where the current pack window began (fit
//! mode). It is versioned with every source's fingerprint.
//!
//! Blending and packing run on the mixture's own thread ([`Mixture`]), a
//! few batches ahead of the consumer, while the sources' pipelines fetch and
//! decode on theirs; each batch comes with the state after it.

use crate::error::Stage;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

mod batches;
mod blend;
mod direct;
mod source;
mod staged;
mod state;
mod thread;
use blend::Blend;
use direct::RowAt;
use source::Source;
use staged::Staged;
pub use state::{DrawState, MixtureState, SourceState};
pub use thread::Mixture;

use serde::{Deserialize, Serialize};
use shardfeed_format::permute::hash_words;

use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType};
use crate::config::LoaderBuilder;
use crate::error::{LoaderError, Result};
use crate::loader::Loader;
use crate::pack::{Carry, Docs, Out, PackMode, PackOptions, Packer, Tokens};
use crate::pinned::{Pool, SlabLease};
use crate::plan::{Piece, Stop, elastic_share};
use crate::state::{PLAN_VERSION, STATE_VERSION};
use crate::stats::Stats;

/// When a mixture's epoch ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MixStop {
    /// When a source runs out of rows (its next epoch starts with the
    /// mixture's next epoch; the other sources continue where they were).
    #[default]
    FirstExhausted,
    /// When every source (of positive weight) has run out at least once;
    /// sources that run out earlier start their next epoch at once.
    AllExhausted,
    /// Never: sources repeat, `next()` never ends an epoch (train by steps).
    Never,
}

impl std::str::FromStr for MixStop {
    type Err = LoaderError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "first_exhausted" => Ok(MixStop::FirstExhausted),
            "all_exhausted" => Ok(MixStop::AllExhausted),
            "never" => Ok(MixStop::Never),
            other => Err(LoaderError::BadOption {
                option: "mix_stop",
                reason: format!("{other:?} is not one of first_exhausted, all_exhausted, never"),
            }),
        }
    }
}

/// Default rows each source's loader collates per internal batch.
pub const DEFAULT_READ_BATCH: usize = 64;
/// Slabs of a mixture's own pool (the batches it yields); each source's
/// loader has its own small pool too.
pub const MIXTURE_SLABS: usize = 8;
/// Name of the column holding each row's (or segment's) source index.
pub const SOURCE_COLUMN: &str = "source";

/// Configures and builds a [`Mixture`]: see [`Loader::builder_mixture`].
#[derive(Clone)]
pub struct MixtureBuilder {
    sources: Vec<(String, f64)>,
    pub(crate) template: LoaderBuilder,
    pack: Option<PackOptions>,
    pack_column: Option<String>,
    mix_stop: MixStop,
    read_batch: usize,
    /// Each source's window and part rows, where a state's are adopted
    /// ([`crate::FeedBuilder::with_order_of`]).
    pub(crate) source_orders: Option<Vec<(usize, u64)>>,
}

/// `sources` (URL, weight) with passwords in URLs hidden, for messages.
pub(crate) fn redacted(sources: &[(String, f64)]) -> Vec<(String, f64)> {
    sources
        .iter()
        .map(|(url, w)| (shardfeed_format::redact::url(url), *w))
        .collect()
}

impl std::fmt::Debug for MixtureBuilder {
    /// Source URLs with passwords hidden; the template loader's options as
    /// its own `Debug` shows them (storage options by key only).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources = crate::mix::redacted(&self.sources);
        f.debug_struct("MixtureBuilder")
            .field("sources", &sources)
            .field("template", &self.template)
            .field("pack", &self.pack)
            .field("pack_column", &self.pack_column)
            .field("mix_stop", &self.mix_stop)
            .field("read_batch", &self.read_batch)
            .finish()
    }
}

impl Loader {
    /// Start configuring a loader over several datasets blended by weight
    /// (shares of rows), each `(url, weight)`; see [`crate::mix`].
    ///
    /// ```no_run
    /// use shardfeed_loader::Loader;
    /// let mut loader = Loader::builder_mixture([("/data/web", 0.7), ("/data/code", 0.3)])
    ///     .batch_size(8)
    ///     .pack_to(4096)
    ///     .eos_id(Some(2))
    ///     .build()?;
    /// for batch in &mut loader {
    ///     let batch = batch?;
    ///     let ids: &[i32] = batch.values("input_ids").unwrap();
    ///     assert_eq!(ids.len(), batch.rows() * 4096);
    /// }
    /// # Ok::<(), shardfeed_loader::LoaderError>(())
    /// ```
    pub fn builder_mixture<I, S>(sources: I) -> MixtureBuilder
    where
        I: IntoIterator<Item = (S, f64)>,
        S: Into<String>,
    {
        let sources: Vec<(String, f64)> = sources.into_iter().map(|(u, w)| (u.into(), w)).collect();
        let first = sources.first().map_or("", |s| s.0.as_str()).to_string();
        MixtureBuilder {
            template: LoaderBuilder::new(&first),
            sources,
            pack: None,
            pack_column: None,
            mix_stop: MixStop::default(),
            read_batch: DEFAULT_READ_BATCH,
            source_orders: None,
        }
    }
}

impl MixtureBuilder {
    /// Rows per batch (packed rows with `pack_to`; default 256).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.template.batch_size = rows;
        self
    }
    /// Seed of every shuffle and of the blending's tie-breaks (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.template.seed = seed;
        self
    }
    /// Shuffle each source (default true).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.template.shuffle = shuffle;
        self
    }
    /// This process's rank (default: `$RANK`, else 0).
    pub fn rank(mut self, rank: u64) -> Self {
        self.template.rank = Some(rank);
        self
    }
    /// Number of ranks (default: `$WORLD_SIZE`, else 1).
    pub fn world_size(mut self, world_size: u64) -> Self {
        self.template.world_size = Some(world_size);
        self
    }
    /// Drop the final partial batch of a mixture epoch (default true).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.template.drop_last = drop_last;
        self
    }
    /// Columns to read from every source (default: all; with packing, only
    /// the packed column is read).
    pub fn columns<I, S>(mut self, columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.template.columns = Some(columns.into_iter().map(Into::into).collect());
        self
    }
    /// When the mixture's epoch ends (default [`MixStop::FirstExhausted`]).
    pub fn mix_stop(mut self, stop: MixStop) -> Self {
        self.mix_stop = stop;
        self
    }
    /// Pack a token-list column into rows of exactly `length` tokens.
    pub fn pack_to(mut self, length: usize) -> Self {
        self.pack
            .get_or_insert_with(|| PackOptions::new(length))
            .length = length;
        self
    }
    /// Every packing option at once.
    pub fn pack(mut self, options: PackOptions) -> Self {
        self.pack = Some(options);
        self
    }
    /// Split (default) or fit; needs `pack_to`.
    pub fn pack_mode(mut self, mode: PackMode) -> Self {
        self.pack.get_or_insert_with(|| PackOptions::new(0)).mode = mode;
        self
    }
    /// The list column to pack (default: the only list column).
    pub fn pack_column(mut self, column: impl Into<String>) -> Self {
        self.pack_column = Some(column.into());
        self
    }
    /// Token appended after every packed document.
    pub fn eos_id(mut self, eos: Option<i32>) -> Self {
        self.pack.get_or_insert_with(|| PackOptions::new(0)).eos_id = eos;
        self
    }
    /// Padding token (default 0).
    pub fn pad_id(mut self, pad: i32) -> Self {
        self.pack.get_or_insert_with(|| PackOptions::new(0)).pad_id = pad;
        self
    }
    /// Documents per best-fit window in fit mode (default 1000).
    pub fn pack_window(mut self, documents: usize) -> Self {
        self.pack.get_or_insert_with(|| PackOptions::new(0)).window = documents;
        self
    }
    /// The most documents in a packed row in fit mode.
    pub fn max_segments(mut self, segments: Option<usize>) -> Self {
        self.pack
            .get_or_insert_with(|| PackOptions::new(0))
            .max_segments = segments;
        self
    }
    /// Rows each source's loader collates per internal batch (default 64).
    pub fn read_batch(mut self, rows: usize) -> Self {
        self.read_batch = rows;
        self
    }
    /// Every other option of the sources' loaders (threads, byte budget,
    /// storage options, cache, retries, ...): `f` gets the builder every
    /// source's loader is made from. The byte budget is shared: each source
    /// gets an equal part of it. A window left to the budget is each
    /// source's share of the default window where it was shuffled at shard
    /// time ([`LoaderBuilder::window`]); one given is every source's.
    pub fn configure(mut self, f: impl FnOnce(LoaderBuilder) -> LoaderBuilder) -> Self {
        self.template = f(self.template);
        self
    }

    /// Check the options, build every source's loader, and check that the
    /// sources share the columns read.
    pub fn build(self) -> Result<Mixture> {
        let bad =
            |option: &'static str, reason: String| Err(LoaderError::BadOption { option, reason });
        if self.sources.is_empty() {
            return bad("sources", "a mixture needs at least one source".into());
        }
        for (url, w) in &self.sources {
            if !w.is_finite() || *w < 0.0 {
                return bad(
                    "weights",
                    format!(
                        "the weight of {} is {w}: weights must be finite and not negative",
                        shardfeed_format::redact::url(url)
                    ),
                );
            }
        }
        let weights: Vec<f64> = self.sources.iter().map(|s| s.1).collect();
        Blend::shares(&weights)?;
        if self.template.batch_size == 0 {
            return bad("batch_size", "must be greater than 0".into());
        }
        if self.read_batch == 0 {
            return bad("read_batch", "must be greater than 0".into());
        }
        if let Some(p) = &self.pack {
            p.check()?;
            if !matches!(self.template.list_mode, crate::ListMode::Ragged) {
                return bad("pad_to", "cannot be combined with pack_to".into());
            }
        } else if self.pack_column.is_some() {
            return bad("pack_column", "needs pack_to".into());
        }
        let n = self.sources.len();
        let budget = (self.template.byte_budget / n as u64).max(16 << 20);
        let seed = self.template.seed;
        // One I/O runtime for every source (unless the template brings one;
        // 0 threads is refused by name when the sources are built).
        let runtime = match &self.template.runtime {
            Some(shared) => shared.clone(),
            None => Arc::new(crate::build::io_runtime(self.template.io_threads.max(1))?),
        };
        let source_builder = |i: usize, columns: Option<Vec<String>>| {
            let mut b = self.template.clone();
            // The user's steps run on the mixture's batches, not the sources'.
            b.steps = Default::default();
            b.transform_slabs = 0;
            b.shared_slabs = false;
            b.row_ids = false;
            // The mixture (or its packer) reads the rows where they were
            // decoded, where the source's one column is a list of numbers.
            b.handoff = true;
            b.runtime = Some(runtime.clone());
            b.url = self.sources[i].0.clone();
            b.batch_size = self.read_batch;
            b.seed = hash_words(&[seed, i as u64, 0x736f_7572_6365]);
            b.drop_last = true;
            b.keep_partial = true;
            b.byte_budget = budget;
            b.prefetch_batches = Some(b.prefetch_batches.unwrap_or(4).min(4));
            // The mixture watches its consumer's waits itself.
            b.slow_warning = None;
            // One trace per source: `<stem>.source<i>.json` beside `path`.
            b.trace = self.template.trace.as_ref().map(|path| {
                let stem = path
                    .file_stem()
                    .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
                path.with_file_name(format!("{stem}.source{i}.json"))
            });
            // Decode threads in proportion to the source's share (at least
            // one): every source gets all of them otherwise, and a mixture of
            // eight would run eight times as many threads as there are cores.
            let cores = if b.decode_threads == 0 {
                std::thread::available_parallelism().map_or(1, |n| n.get())
            } else {
                b.decode_threads
            };
            let total: f64 = self.sources.iter().map(|s| s.1).sum();
            let share = self.sources[i].1 / total.max(f64::MIN_POSITIVE);
            b.decode_threads = ((cores as f64 * share).ceil() as usize).clamp(1, cores);
            // Windows too (shuffled at shard time): the sources share one
            // loader's default window's row groups.
            b.window_share = Some(share);
            if columns.is_some() {
                b.columns = columns;
            }
            if let Some(&(window, part_rows)) = self.source_orders.as_ref().and_then(|o| o.get(i)) {
                b.window = Some(window);
                b.part_rows = Some(part_rows);
            }
            b
        };
        let build = |i: usize, columns: Option<Vec<String>>| -> Result<Source> {
            let url = &self.sources[i].0;
            let loader = source_builder(i, columns)
                .build()
                .map_err(|e| source_error(i, url, e))?;
            Ok(Source::new(url, loader))
        };
        // Source 0 names the columns (and, packing, the list column to pack).
        let mut first = build(0, self.pack_column.clone().map(|c| vec![c]))?;
        let pack_column = match &self.pack {
            None => None,
            Some(_) => {
                let schema = first.loader.projected_schema();
                let lists: Vec<&String> = schema
                    .fields()
                    .iter()
                    .filter(|f| list_of_ints(f.data_type()))
                    .map(|f| f.name())
                    .collect();
                match (&self.pack_column, lists.as_slice()) {
                    (Some(c), _) => Some(c.clone()),
                    (None, [one]) => {
                        let name = (*one).clone();
                        if schema.fields().len() > 1 {
                            // Read only the packed column.
                            first = build(0, Some(vec![name.clone()]))?;
                        }
                        Some(name)
                    }
                    (None, _) => {
                        return bad(
                            "pack_column",
                            format!(
                                "{} has {} list<int> columns ({lists:?}); name the one to pack",
                                shardfeed_format::redact::url(&self.sources[0].0),
                                lists.len()
                            ),
                        );
                    }
                }
            }
        };
        let columns: Vec<String> = first
            .loader
            .projected_schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let mut sources = Vec::with_capacity(n);
        sources.push(first);
        for i in 1..n {
            let projection = match (&pack_column, &self.template.columns) {
                (Some(c), _) => Some(vec![c.clone()]),
                // The columns source 0 was given, as given: its batches hold
                // them in that order (not its schema's), and every source's
                // batches must hold them in the same order.
                (None, Some(_)) => None,
                (None, None) => Some(columns.clone()),
            };
            sources.push(build(i, projection)?);
        }
        // Every source reads ahead at once: the first batch waits for the
        // slowest source's first rows, not for each source in turn.
        for s in &mut sources {
            s.loader.start();
        }
        let reference = sources[0].loader.projected_schema();
        for (i, s) in sources.iter().enumerate() {
            let schema = s.loader.projected_schema();
            for name in &columns {
                let field = schema.field_with_name(name).map_err(|_| {
                    source_error(
                        i,
                        &s.url,
                        LoaderError::BadOption {
                            option: "columns",
                            reason: format!("it has no column `{name}`, which source 0 has"),
                        },
                    )
                })?;
                if let Some(c) = &pack_column {
                    if !list_of_ints(field.data_type()) {
                        return Err(source_error(
                            i,
                            &s.url,
                            LoaderError::BadOption {
                                option: "pack_column",
                                reason: format!(
                                    "column `{c}` is {}, not a list of integers",
                                    field.data_type()
                                ),
                            },
                        ));
                    }
                } else {
                    let want = reference
                        .field_with_name(name)
                        .expect("source 0's own column");
                    if field.data_type() != want.data_type() {
                        return Err(source_error(
                            i,
                            &s.url,
                            LoaderError::BadOption {
                                option: "columns",
                                reason: format!(
                                    "column `{name}` is {} but source 0's is {}",
                                    field.data_type(),
                                    want.data_type()
                                ),
                            },
                        ));
                    }
                }
            }
            if pack_column.is_none() && schema.fields().len() != columns.len() {
                let extra: Vec<&String> = schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .filter(|n| !columns.contains(n))
                    .collect();
                return Err(source_error(
                    i,
                    &s.url,
                    LoaderError::BadOption {
                        option: "columns",
                        reason: format!(
                            "it has columns {extra:?} that source 0 lacks; pass columns=[...] to read the shared ones"
                        ),
                    },
                ));
            }
        }
        if pack_column.is_none() && columns.iter().any(|c| c == SOURCE_COLUMN) {
            return bad(
                "columns",
                format!(
                    "a mixture adds a `{SOURCE_COLUMN}` column; leave the sources' own `{SOURCE_COLUMN}` out with columns=[...]"
                ),
            );
        }

        let batch_size = self.template.batch_size;
        let (pool_slabs, slab_bytes) = match &self.pack {
            Some(p) => {
                // Offsets in a batch (`cu_seqlens`) are int32.
                let tokens = batch_size
                    .checked_mul(p.length)
                    .filter(|&t| t <= i32::MAX as usize)
                    .ok_or(LoaderError::BadOption {
                        option: "pack_to",
                        reason: format!(
                            "batch_size {batch_size} x pack_to {} tokens is more than a batch's int32 offsets hold",
                            p.length
                        ),
                    })?;
                (MIXTURE_SLABS, packed_slab_bytes(tokens)?)
            }
            None => {
                let per_row: usize = sources
                    .iter()
                    .map(|s| s.loader.pool_slab_bytes() / self.read_batch.max(1))
                    .max()
                    .unwrap_or(1);
                (
                    MIXTURE_SLABS,
                    per_row.saturating_mul(batch_size).max(64 << 10),
                )
            }
        };
        // The mixture's pool answers to the byte budget as a loader's does.
        if (slab_bytes as u64).saturating_mul(pool_slabs as u64)
            > self.template.byte_budget.saturating_mul(4)
        {
            return bad(
                if self.pack.is_some() {
                    "pack_to"
                } else {
                    "batch_size"
                },
                format!(
                    "{pool_slabs} slabs of {slab_bytes} bytes (batch_size {batch_size}{}) are more than 4x the byte budget ({} bytes); lower them, or raise byte_budget",
                    self.pack
                        .as_ref()
                        .map_or(String::new(), |p| format!(" x pack_to {}", p.length)),
                    self.template.byte_budget
                ),
            );
        }
        // Slabs for a Python transform's outputs, as a loader's pool holds
        // them.
        let pool_slabs = crate::budget::with_transform_slabs(
            pool_slabs,
            slab_bytes,
            self.template.transform_slabs,
            self.template.byte_budget,
        );
        let pool = Arc::new(
            Pool::new(
                pool_slabs,
                slab_bytes,
                self.template.pinning,
                self.template.shared_slabs,
            )?
            .with_large(self.template.transform_slabs, self.template.byte_budget)
            .with_growth(crate::budget::max_slab_bytes(
                pool_slabs,
                self.template.byte_budget,
            )),
        );
        let rank = sources[0].loader.rank();
        let world_size = sources[0].loader.world_size();
        let tie = Blend::tie_order(seed, n);
        let blend = Blend {
            shares: Blend::shares(&weights)?,
            weights: weights.clone(),
            tie,
            drawn: 0,
            counts: vec![0; n],
        };
        let slow_warning = self
            .template
            .slow_warning
            .filter(|&(f, n)| f > 0.0 && n > 0);
        let unshared_orders = sources.iter().map(|s| s.loader.unshared_order()).collect();
        let source_states = sources
            .iter()
            .zip(&weights)
            .map(|(s, &weight)| {
                let order = s.loader.state();
                SourceState {
                    url: shardfeed_format::redact::url(&s.url),
                    dataset: s.fingerprint.clone(),
                    weight,
                    window: Some(order.window),
                    part_rows: Some(order.part_rows),
                }
            })
            .collect();
        let core = Core {
            streams: Streams {
                sources,
                blend,
                stop: self.mix_stop,
                ended: false,
                pack_column: pack_column.clone(),
                anchor: None,
                previous_anchor: None,
                pending: None,
                applied: None,
                cancel: Arc::new(AtomicBool::new(false)),
            },
            packer: self.pack.clone().map(Packer::new),
            initial_weights: weights.clone(),
            batch_size,
            drop_last: self.template.drop_last,
            shuffle: self.template.shuffle,
            seed,
            rank,
            world_size,
            epoch: 0,
            index: 0,
            epoch_start: vec![(self.template.epoch, 0); n],
            pool,
            dropped_batches: 0,
            staged_batches: 0,
            source_states,
            unshared_orders,
            staging: Vec::new(),
            steps: self.template.steps.clone(),
        };
        Ok(Mixture::new(core, slow_warning))
    }
}

fn list_of_ints(t: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType as D;
    match t {
        D::List(f) | D::LargeList(f) => matches!(
            f.data_type(),
            D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32
        ),
        _ => false,
    }
}

fn source_error(index: usize, url: &str, e: LoaderError) -> LoaderError {
    LoaderError::MixtureSource {
        source_index: index,
        url: shardfeed_format::redact::url(url),
        error: Box::new(e),
    }
}

/// Bytes of a packed batch's slab: four `int32` buffers of `tokens` and
/// `cu_seqlens`, each region 64-byte aligned.
fn packed_slab_bytes(tokens: usize) -> Result<usize> {
    tokens
        .checked_mul(4)
        .and_then(|b| b.checked_add(64))
        .and_then(|b| b.checked_mul(5))
        .ok_or(LoaderError::BadOption {
            option: "pack_to",
            reason: "batch_size x pack_to is too large".into(),
        })
}

/// What a mixture epoch's length follows from: see [`LenInput::batches`].
#[derive(Clone, Debug)]
pub(crate) struct LenInput {
    /// Each source's rows left when the epoch began, and in a whole epoch.
    left: Vec<u64>,
    full: Vec<u64>,
    blend: Blend,
    stop: MixStop,
    batch_size: u64,
    drop_last: bool,
}

impl LenInput {
    /// Batches of the epoch: the blending simulated row by row (the same
    /// rule as the draws) until the epoch ends. O(rows of the epoch).
    pub(crate) fn batches(&self) -> Option<u64> {
        let mut blend = self.blend.clone();
        let mut left = self.left.clone();
        let mut exhausted = vec![false; left.len()];
        let mut rows = 0u64;
        loop {
            let s = blend.pick();
            if left[s] == 0 {
                exhausted[s] = true;
                let done = self.stop == MixStop::FirstExhausted
                    || exhausted
                        .iter()
                        .zip(&blend.shares)
                        .all(|(&e, &share)| e || share == 0);
                if done {
                    break;
                }
                left[s] = self.full[s];
                if left[s] == 0 {
                    return None;
                }
                continue;
            }
            left[s] -= 1;
            blend.count(s);
            rows += 1;
        }
        Some(if self.drop_last {
            rows / self.batch_size
        } else {
            rows.div_ceil(self.batch_size)
        })
    }
}

/// The sources and the blending: what the packer draws documents from.
struct Streams {
    sources: Vec<Source>,
    blend: Blend,
    stop: MixStop,
    /// The mixture's epoch is over (a source ran out).
    ended: bool,
    pack_column: Option<String>,
    /// Fit mode: the draw states where the current and the previous pack
    /// windows began.
    anchor: Option<DrawState>,
    previous_anchor: Option<DrawState>,
    /// Fit mode: weights set during the current window, applied when the
    /// next one is drawn; and those applied when the current one was.
    pending: Option<Vec<f64>>,
    applied: Option<Vec<f64>>,
    /// Set to stop the mixture's thread: waits give up.
    cancel: Arc<AtomicBool>,
}

impl Streams {
    fn draw_state(&self) -> DrawState {
        DrawState {
            sources: self
                .sources
                .iter()
                .map(|s| (s.epoch, s.position, s.exhausted))
                .collect(),
            drawn: self.blend.drawn,
            counts: self.blend.counts.clone(),
            ended: self.ended,
            weights: self.blend.weights.clone(),
        }
    }

    /// Draw the next row: its source; `None` at the end of the mixture epoch.
    fn next_row(&mut self) -> Result<Option<usize>> {
        if self.ended {
            return Ok(None);
        }
        let s = self.blend.pick();
        let mut empty_epochs = 0;
        loop {
            let drawn = self.sources[s].draw(&self.cancel).map_err(|e| match e {
                LoaderError::Interrupted => e,
                e => source_error(s, &self.sources[s].url, e),
            })?;
            if drawn {
                self.blend.count(s);
                return Ok(Some(s));
            }
            self.sources[s].exhausted = true;
            let done = match self.stop {
                MixStop::FirstExhausted => true,
                MixStop::AllExhausted => self
                    .sources
                    .iter()
                    .zip(&self.blend.shares)
                    .all(|(src, &share)| share == 0 || src.exhausted),
                MixStop::Never => false,
            };
            if done {
                self.ended = true;
                return Ok(None);
            }
            empty_epochs += 1;
            if empty_epochs > 1 {
                let src = &self.sources[s];
                return Err(source_error(
                    s,
                    &src.url,
                    LoaderError::BadOption {
                        option: "sources",
                        reason: format!(
                            "it has no rows for rank {} of {}",
                            src.loader.rank(),
                            src.loader.world_size()
                        ),
                    },
                ));
            }
        }
    }
}

impl Docs for Streams {
    fn draw(&mut self) -> Result<Option<usize>> {
        self.next_row()
    }

    fn skip(&self, source: usize) -> usize {
        self.sources[source].skip
    }

    fn window_start(&mut self) {
        self.applied = self.pending.take();
        if let Some(w) = &self.applied {
            self.blend.set(w).expect("checked by set_weights");
        }
        self.previous_anchor = self.anchor.take();
        self.anchor = Some(self.draw_state());
    }

    fn tokens(&self, source: usize) -> Result<Tokens<'_>> {
        // A source's batches hold only the packed column.
        let s = &self.sources[source];
        s.tokens(0).map_err(|e| source_error(source, &s.url, e))
    }

    fn bad_token(&self, source: usize, value: i64) -> LoaderError {
        let s = &self.sources[source];
        source_error(
            source,
            &s.url,
            LoaderError::stage(
                Stage::Pack,
                None,
                None,
                format!(
                    "token id {value} in column `{}` (epoch {}, row {} of the rank's order) does not fit int32",
                    self.pack_column.as_deref().unwrap_or("?"),
                    s.epoch,
                    s.position.saturating_sub(1)
                ),
            ),
        )
    }
}

/// What the mixture's thread had done when it made a batch: sent with it,
/// so the consumer's counters are of the batches it received.
#[derive(Clone, Debug, Default)]
struct Progress {
    /// Documents drawn from each source.
    documents: Vec<u64>,
    tokens: u64,
    padding_tokens: u64,
    dropped_batches: u64,
    staged_batches: u64,
}

/// The mixture proper: sources, blending, packing. [`Mixture`] runs it on
/// its own thread, a few batches ahead of the consumer.
pub(crate) struct Core {
    streams: Streams,
    packer: Option<Packer>,
    initial_weights: Vec<f64>,
    batch_size: usize,
    drop_last: bool,
    shuffle: bool,
    seed: u64,
    rank: u64,
    world_size: u64,
    /// The mixture epoch and batches yielded in it.
    epoch: u64,
    index: u64,
    /// Each source's (epoch, position) when the mixture epoch began.
    epoch_start: Vec<(u64, u64)>,
    pool: Arc<Pool>,
    /// Final partial batches dropped (`drop_last`).
    dropped_batches: u64,
    /// Unpacked batches whose rows were staged (see [`MixtureStats`]).
    staged_batches: u64,
    /// The sources as a state names them (made once: a state goes with
    /// every batch).
    source_states: Vec<SourceState>,
    /// Each source's window and part rows without its share of the default
    /// window ([`crate::budget::shared_window`]): what a state that did not
    /// record its sources' windows was read in.
    unshared_orders: Vec<(usize, u64)>,
    /// Unpacked batches: each column's rows, copied out of the sources'
    /// batches (buffers reused from batch to batch).
    staging: Vec<Staged>,
    /// The user's steps, on each batch made.
    steps: crate::map::Steps,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mixture")
            .field(
                "sources",
                &self
                    .streams
                    .sources
                    .iter()
                    .map(|s| shardfeed_format::redact::url(&s.url))
                    .collect::<Vec<_>>(),
            )
            .field("weights", &self.streams.blend.weights)
            .field("epoch", &self.epoch)
            .field("pack", &self.packer.as_ref().map(|p| &p.options))
            .finish_non_exhaustive()
    }
}

/// A mixture's counters, with each source loader's [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct MixtureStats {
    /// Batches yielded.
    pub batches: u64,
    /// Rows yielded (packed rows when packing).
    pub rows: u64,
    /// Bytes of the batches yielded.
    pub bytes: u64,
    /// Documents drawn from each source.
    pub documents: Vec<u64>,
    /// Packed tokens yielded, and padding among them.
    pub tokens: u64,
    /// Padding tokens yielded.
    pub padding_tokens: u64,
    /// Final partial batches dropped (`drop_last`).
    pub dropped_batches: u64,
    /// Unpacked batches whose rows were copied into buffers before the
    /// batch's slab (twice) instead of once from the sources' batches: a
    /// batch drawing from more of a source's batches than it may keep
    /// (`read_batch` small against `batch_size`, few batches prefetched).
    pub staged_batches: u64,
    /// Rows the user's filter dropped ([`crate::LoaderBuilder::filter`]).
    pub filtered_rows: u64,
    /// Seconds the consumer waited in `next()`.
    pub wait_s: f64,
    /// Seconds from the first `next()` to the first batch.
    pub first_batch_s: f64,
    /// Each source's loader.
    pub sources: Vec<Stats>,
}

impl Core {
    /// Change the weights from the next batch on (the counts restart, so the
    /// new shares hold exactly from there). Recorded in the state. In fit
    /// mode the current pack window was drawn already: the new weights apply
    /// from the next window.
    pub fn set_weights(&mut self, weights: &[f64]) -> Result<()> {
        let n = self.initial_weights.len();
        if weights.len() != n {
            return Err(LoaderError::BadOption {
                option: "weights",
                reason: format!("{} weights for {n} sources", weights.len()),
            });
        }
        Blend::shares(weights)?;
        if self
            .packer
            .as_ref()
            .is_some_and(|p| p.options.mode == PackMode::Fit)
        {
            self.streams.pending = Some(weights.to_vec());
        } else {
            self.streams.blend.set(weights)?;
        }
        Ok(())
    }

    /// The weights last set (pending until the next pack window in fit mode).
    pub fn weights(&self) -> &[f64] {
        self.streams
            .pending
            .as_deref()
            .unwrap_or(&self.streams.blend.weights)
    }

    /// What the core has done so far.
    fn progress(&self) -> Progress {
        let p = self.packer.as_ref();
        Progress {
            documents: self.streams.sources.iter().map(|s| s.drawn).collect(),
            tokens: p.map_or(0, |p| p.tokens),
            padding_tokens: p.map_or(0, |p| p.padding),
            dropped_batches: self.dropped_batches,
            staged_batches: self.staged_batches,
        }
    }

    /// Each source loader's statistics.
    fn source_stats(&self) -> Vec<crate::loader::StatsHandle> {
        self.streams
            .sources
            .iter()
            .map(|s| s.loader.stats_handle())
            .collect()
    }

    /// The sources' URLs, as given.
    pub fn source_urls(&self) -> Vec<String> {
        self.streams.sources.iter().map(|s| s.url.clone()).collect()
    }

    /// What the length of the current mixture epoch follows from (cheap:
    /// the simulation itself runs when [`Mixture::len`] is asked for); `None`
    /// when it is not known without reading data (packing, or `never`).
    pub(crate) fn len_input(&self) -> Option<LenInput> {
        if self.packer.is_some() || self.streams.stop == MixStop::Never {
            return None;
        }
        let mut blend = self.streams.blend.clone();
        blend.reset();
        let full: Vec<u64> = self
            .streams
            .sources
            .iter()
            .map(|s| s.loader.rows_per_epoch())
            .collect();
        Some(LenInput {
            left: full
                .iter()
                .zip(&self.epoch_start)
                .map(|(&rows, &(_, position))| rows.saturating_sub(position))
                .collect(),
            full,
            blend,
            stop: self.streams.stop,
            batch_size: self.batch_size as u64,
            drop_last: self.drop_last,
        })
    }

    /// After an elastic resume: rows of the row groups this rank reads for
    /// the rest of the epochs it took over (row groups are fetched whole), per
    /// source. Shows that each new rank reads about its share.
    pub fn elastic_rows(&self) -> Vec<u64> {
        self.streams
            .sources
            .iter()
            .map(|s| {
                s.pending
                    .iter()
                    .map(|(epoch, _)| s.loader.planned_rows(*epoch))
                    .sum()
            })
            .collect()
    }

    /// Stop every source's pipeline.
    pub fn stop(&mut self) {
        for s in &mut self.streams.sources {
            s.batch = None;
            s.release_kept();
            s.loader.stop();
        }
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The column of each row's source, at `offset` of the slab.
fn source_column(rows: usize, offset: usize) -> Column {
    Column {
        name: SOURCE_COLUMN.into(),
        layout: ColumnLayout::Dense {
            values: Buffer {
                dtype: DType::I32,
                shape: vec![rows],
                offset,
            },
        },
        validity: None,
    }
}

/// The first `n` `i32`s of a 64-byte aligned region of a slab.
fn as_i32(bytes: &mut [u8], n: usize) -> &mut [i32] {
    // SAFETY: `i32` is valid for any bytes; regions start 64-byte aligned
    // in a page-aligned slab, which `align_to_mut` checks (the prefix is
    // empty), and the slab was sized for `n` values (checked by the slice).
    let (pre, values, _) = unsafe { bytes.align_to_mut::<i32>() };
    assert!(pre.is_empty(), "slab regions are aligned");
    &mut values[..n]
}

fn as_bytes(values: &[i32]) -> &[u8] {
    // SAFETY: any `i32` is 4 initialised bytes; `u8` has alignment 1.
    unsafe { values.align_to::<u8>().1 }
}

#[cfg(test)]
mod tests;
