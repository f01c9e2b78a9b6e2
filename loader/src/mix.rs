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
//! into rows of exactly `pack_to` tokens ([`crate::pack`]); otherwise a batch
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

mod thread;
pub use thread::Mixture;

use serde::{Deserialize, Serialize};
use shardfeed_format::permute::hash_words;

use crate::batch::{Batch, Buffer, Column, ColumnLayout, DType};
use crate::config::LoaderBuilder;
use crate::loader::Loader;
use crate::pack::{Carry, Docs, Out, PackMode, PackOptions, Packer, Tokens};
use crate::pinned::{Pool, SlabLease};
use crate::plan::{Piece, Stop, elastic_share};
use crate::state::{PLAN_VERSION, STATE_VERSION};
use crate::stats::Stats;
use crate::{LoaderError, Result};

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
#[derive(Clone, Debug)]
pub struct MixtureBuilder {
    sources: Vec<(String, f64)>,
    template: LoaderBuilder,
    pack: Option<PackOptions>,
    pack_column: Option<String>,
    mix_stop: MixStop,
    read_batch: usize,
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
    /// gets an equal part of it.
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
        let source_builder = |i: usize, columns: Option<Vec<String>>| {
            let mut b = self.template.clone();
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
            if columns.is_some() {
                b.columns = columns;
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
            let projection = match &pack_column {
                Some(c) => Some(vec![c.clone()]),
                None => Some(columns.clone()),
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
        let pool = Arc::new(Pool::new(pool_slabs, slab_bytes, self.template.pinning)?);
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
        let source_states = sources
            .iter()
            .zip(&weights)
            .map(|(s, &weight)| SourceState {
                url: shardfeed_format::redact::url(&s.url),
                dataset: s.fingerprint.clone(),
                weight,
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
            source_states,
            staging: Vec::new(),
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

/// Exact blending: see the module documentation.
#[derive(Clone, Debug)]
struct Blend {
    /// The weights as given, and each source's share in 2^-40 units.
    weights: Vec<f64>,
    shares: Vec<u64>,
    /// Tie-break rank of each source (lower wins).
    tie: Vec<u64>,
    /// Rows drawn since the counts were last reset.
    drawn: u64,
    counts: Vec<u64>,
}

const ONE: i128 = 1 << 40;

impl Blend {
    /// Each weight's share in 2^-40 units; weights must be finite, not
    /// negative, and one at least positive.
    fn shares(weights: &[f64]) -> Result<Vec<u64>> {
        if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return Err(LoaderError::BadOption {
                option: "weights",
                reason: format!("weight {w}: weights must be finite and not negative"),
            });
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            return Err(LoaderError::BadOption {
                option: "weights",
                reason: "at least one weight must be positive".into(),
            });
        }
        Ok(weights
            .iter()
            .map(|w| (w / total * ONE as f64).round() as u64)
            .collect())
    }

    /// Whether `counts` of `drawn` rows are what blending by `shares`
    /// leaves: they add up to `drawn`, a source of no share has none, and
    /// every other stays within `n + 1` rows of its share of `drawn` (the
    /// largest-deficit rule keeps each within a row or two). Counts forged
    /// past that would starve a source for as long as they are off.
    fn check_counts(shares: &[u64], drawn: u64, counts: &[u64]) -> std::result::Result<(), String> {
        let sum = counts
            .iter()
            .try_fold(0u64, |acc, &c| acc.checked_add(c))
            .ok_or("they overflow")?;
        if sum != drawn {
            return Err(format!("they add up to {sum}, not the {drawn} rows drawn"));
        }
        let total: i128 = shares.iter().map(|&s| i128::from(s)).sum();
        let slack = (shares.len() as i128 + 1) * total;
        for (i, (&share, &count)) in shares.iter().zip(counts).enumerate() {
            let off = i128::from(count) * total - i128::from(share) * i128::from(drawn);
            if (share == 0 && count > 0) || off.abs() > slack {
                return Err(format!(
                    "source {i} has {count} of {drawn} rows drawn, far from its share"
                ));
            }
        }
        Ok(())
    }

    fn tie_order(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64)
            .map(|i| hash_words(&[seed, i, 0x7469_6573]))
            .collect()
    }

    /// The source furthest below its share.
    fn pick(&self) -> usize {
        let next = i128::from(self.drawn) + 1;
        let mut best = usize::MAX;
        let mut best_key = (i128::MIN, 0u64);
        for (i, (&share, &count)) in self.shares.iter().zip(&self.counts).enumerate() {
            if share == 0 {
                continue;
            }
            let deficit = i128::from(share) * next - i128::from(count) * ONE;
            // Higher deficit first; then the lower tie rank.
            let key = (deficit, u64::MAX - self.tie[i]);
            if best == usize::MAX || key > best_key {
                best = i;
                best_key = key;
            }
        }
        best
    }

    fn count(&mut self, source: usize) {
        // Saturating: counts may come from a state file.
        self.drawn = self.drawn.saturating_add(1);
        self.counts[source] = self.counts[source].saturating_add(1);
    }

    /// New weights; the counts restart.
    fn set(&mut self, weights: &[f64]) -> Result<()> {
        self.shares = Blend::shares(weights)?;
        self.weights = weights.to_vec();
        self.reset();
        Ok(())
    }

    fn reset(&mut self) {
        self.drawn = 0;
        self.counts.iter_mut().for_each(|c| *c = 0);
    }
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

/// One source: its loader and the batch the current row lies in.
struct Source {
    url: String,
    loader: Loader,
    batch: Option<Batch>,
    /// The row drawn last, in `batch`.
    row: usize,
    /// The next row of `batch` to draw.
    next_row: usize,
    /// The source epoch, and rows drawn from it in this epoch.
    epoch: u64,
    position: u64,
    /// Ran out in the current mixture epoch.
    exhausted: bool,
    /// Rows drawn over the mixture's life.
    drawn: u64,
    fingerprint: String,
    /// After an elastic resume: epochs planned from pieces of the old ranks'
    /// sequences, and documents whose first tokens were emitted before it
    /// (epoch, position, tokens).
    pending: Vec<(u64, Vec<Piece>)>,
    skips: Vec<(u64, u64, usize)>,
    /// Tokens of the document drawn last to leave out (a skip).
    skip: usize,
}

impl Source {
    fn new(url: &str, loader: Loader) -> Self {
        Source {
            url: url.to_string(),
            epoch: loader.epoch(),
            fingerprint: loader.fingerprint().to_string(),
            loader,
            batch: None,
            row: 0,
            next_row: 0,
            position: 0,
            exhausted: false,
            drawn: 0,
            pending: Vec::new(),
            skips: Vec::new(),
            skip: 0,
        }
    }

    /// Make the next row current; `false` when the source epoch is over (the
    /// loader has moved to the next one). A wait for the source's next batch
    /// gives up with [`LoaderError::Interrupted`] once `cancel` is set.
    fn draw(&mut self, cancel: &AtomicBool) -> Result<bool> {
        loop {
            if let Some(b) = &self.batch
                && self.next_row < b.rows()
            {
                self.row = self.next_row;
                self.next_row += 1;
                self.position += 1;
                self.drawn += 1;
                self.skip = if self.skips.is_empty() {
                    0
                } else {
                    let at = (self.epoch, self.position - 1);
                    self.skips
                        .iter()
                        .find(|k| (k.0, k.1) == at)
                        .map_or(0, |k| k.2)
                };
                return Ok(true);
            }
            // Give the slab back before waiting for the next batch.
            self.batch = None;
            match self
                .loader
                .next_interruptible(|| cancel.load(Ordering::Relaxed))
            {
                Some(Ok(b)) => {
                    self.batch = Some(b);
                    self.next_row = 0;
                }
                Some(Err(e)) => return Err(e),
                None => {
                    self.epoch = self.loader.epoch();
                    self.position = 0;
                    return Ok(false);
                }
            }
        }
    }

    /// Continue at `position` of source epoch `epoch` (planned from
    /// `pending` where it names the epoch).
    fn seek(&mut self, epoch: u64, position: u64) -> Result<()> {
        self.loader.set_pending(&self.pending)?;
        let mut state = self.loader.state();
        state.epoch = epoch;
        state.position = position;
        self.loader.resume(&state)?;
        self.loader.start();
        self.batch = None;
        self.next_row = 0;
        self.epoch = epoch;
        self.position = position;
        Ok(())
    }

    fn tokens(&self, column: usize) -> Result<Tokens<'_>> {
        let batch = self.batch.as_ref().expect("a row was drawn");
        let col = &batch.columns()[column];
        let ColumnLayout::Ragged { values, offsets } = &col.layout else {
            return Err(LoaderError::BadOption {
                option: "pack_column",
                reason: format!("column `{}` is not a list column", col.name),
            });
        };
        let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
        let (a, z) = (offsets[self.row], offsets[self.row + 1]);
        let range = usize::try_from(a).unwrap_or(usize::MAX)..usize::try_from(z).unwrap_or(0);
        let bad = || {
            LoaderError::stage(
                Stage::Pack,
                None,
                None,
                format!("row {} has list offsets {a}..{z}", self.row),
            )
        };
        if range.start > range.end || range.end > values.len() {
            return Err(bad());
        }
        Ok(match values.dtype {
            DType::I32 => Tokens::I32(&batch.typed::<i32>(values).expect("i32")[range]),
            DType::U32 => Tokens::U32(&batch.typed::<u32>(values).expect("u32")[range]),
            DType::I64 => Tokens::I64(&batch.typed::<i64>(values).expect("i64")[range]),
            DType::U16 => Tokens::U16(&batch.typed::<u16>(values).expect("u16")[range]),
            DType::I16 => Tokens::I16(&batch.typed::<i16>(values).expect("i16")[range]),
            DType::U8 => Tokens::U8(&batch.typed::<u8>(values).expect("u8")[range]),
            DType::I8 => {
                return Err(LoaderError::BadOption {
                    option: "pack_column",
                    reason: "int8 token ids are not supported".into(),
                });
            }
            other => {
                return Err(LoaderError::BadOption {
                    option: "pack_column",
                    reason: format!("{other:?} values are not token ids"),
                });
            }
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
    /// The sources as a state names them (made once: a state goes with
    /// every batch).
    source_states: Vec<SourceState>,
    /// Unpacked batches: each column's rows, copied out of the sources'
    /// batches (buffers reused from batch to batch).
    staging: Vec<Staged>,
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

/// Where the blending is: every source's epoch and position, the counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DrawState {
    /// Per source: (epoch, position, exhausted in this mixture epoch).
    pub sources: Vec<(u64, u64, bool)>,
    /// Rows drawn since the counts were reset.
    pub drawn: u64,
    /// Rows drawn from each source since then.
    pub counts: Vec<u64>,
    /// The mixture epoch's end was reached.
    pub ended: bool,
    /// The weights the draws follow.
    pub weights: Vec<f64>,
}

/// One source in a [`MixtureState`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceState {
    /// The source's URL (credentials redacted).
    pub url: String,
    /// Its dataset's fingerprint.
    pub dataset: String,
    /// Its weight when the mixture was built.
    pub weight: f64,
}

/// The state of a [`Mixture`]: small (well under 4 KB for 8 sources),
/// versioned, tied to the sources' datasets and the options that shape the
/// order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MixtureState {
    /// State format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Order algorithm version ([`PLAN_VERSION`]).
    pub plan: u32,
    /// Always `"mixture"`: tells it from a [`crate::LoaderState`].
    pub kind: String,
    /// The seed.
    pub seed: u64,
    /// The rank.
    pub rank: u64,
    /// The number of ranks.
    pub world_size: u64,
    /// Rows per batch.
    pub batch_size: usize,
    /// Whether sources are shuffled.
    pub shuffle: bool,
    /// Whether the final partial batch is dropped.
    pub drop_last: bool,
    /// When the mixture epoch ends.
    pub mix_stop: MixStop,
    /// The packing options, if packing.
    pub pack: Option<PackOptions>,
    /// The sources as built.
    pub sources: Vec<SourceState>,
    /// The weights last set (in force, or pending in fit mode).
    pub weights: Vec<f64>,
    /// Fit mode: weights set during the current pack window, applied with
    /// the next.
    pub pending_weights: Option<Vec<f64>>,
    /// The mixture epoch.
    pub epoch: u64,
    /// Batches yielded in it.
    pub batch: u64,
    /// The blending.
    pub draw: DrawState,
    /// Split mode: the document being emitted (its source's position is
    /// one past it).
    pub carry: Option<Carry>,
    /// Fit mode: the pack windows to draw again from `draw` (the previous
    /// one's deferred documents, then the current one) and the rows
    /// already emitted.
    pub window: Option<crate::pack::FitState>,
    /// Fit mode: weights applied when the current window was drawn.
    pub window_weights: Option<Vec<f64>>,
    /// Each source's (epoch, position) when the mixture epoch began (for
    /// `len()`).
    #[serde(default)]
    pub epoch_start: Vec<(u64, u64)>,
    /// Per source, after an elastic resume: the epochs planned from pieces
    /// of the old ranks' sequences (see [`crate::plan::Piece`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Vec<(u64, Vec<Piece>)>>,
    /// Per source, after an elastic resume: documents (epoch, position)
    /// whose first tokens were emitted before it, and how many.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skips: Vec<Vec<(u64, u64, usize)>>,
}

impl MixtureState {
    /// JSON text.
    pub fn to_json(&self) -> String {
        crate::state::to_json(self)
    }

    /// Parse JSON written by [`MixtureState::to_json`].
    pub fn from_json(text: &str) -> Result<Self> {
        crate::state::from_json(text)
    }
}

/// A mixture's counters, with each source loader's [`Stats`].
#[derive(Clone, Debug, Serialize)]
pub struct MixtureStats {
    /// Batches yielded.
    pub batches: u64,
    /// Rows yielded (packed rows when packing).
    pub rows: u64,
    /// Documents drawn from each source.
    pub documents: Vec<u64>,
    /// Packed tokens yielded, and padding among them.
    pub tokens: u64,
    /// Padding tokens yielded.
    pub padding_tokens: u64,
    /// Final partial batches dropped (`drop_last`).
    pub dropped_batches: u64,
    /// Seconds the consumer waited in `next()`.
    pub wait_s: f64,
    /// Seconds from the first `next()` to the first batch.
    pub first_batch_s: f64,
    /// Each source's loader.
    pub sources: Vec<Stats>,
}

impl Core {
    /// Put every source at `draw`'s position; the source of `carry` one row
    /// before, so that its document is drawn again.
    fn restore(&mut self, draw: &DrawState, carry: Option<Carry>) -> Result<()> {
        for (i, (s, &(epoch, position, exhausted))) in self
            .streams
            .sources
            .iter_mut()
            .zip(&draw.sources)
            .enumerate()
        {
            let back = u64::from(carry.is_some_and(|c| c.source == i));
            if position < back {
                return Err(LoaderError::BadState {
                    reason: format!("source {i}'s position cannot hold the carried document"),
                });
            }
            s.seek(epoch, position - back)
                .map_err(|e| source_error(i, &s.url, e))?;
            s.exhausted = exhausted;
        }
        if let Some(c) = carry {
            let s = &mut self.streams.sources[c.source];
            if !s.draw(&self.streams.cancel)? {
                return Err(LoaderError::BadState {
                    reason: format!(
                        "source {} has no row at the carried document's position",
                        c.source
                    ),
                });
            }
            s.drawn -= 1;
        }
        self.streams.blend.set(&draw.weights)?;
        self.streams.blend.drawn = draw.drawn;
        self.streams.blend.counts = draw.counts.clone();
        self.streams.ended = draw.ended;
        Ok(())
    }

    /// `f` of every source; empty when every list is (as states leave
    /// elastic fields out when unused).
    fn per_source<T>(&self, f: impl Fn(&Source) -> Vec<T>) -> Vec<Vec<T>> {
        let lists: Vec<Vec<T>> = self.streams.sources.iter().map(f).collect();
        if lists.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            lists
        }
    }

    /// Where the mixture is; [`Mixture::resume`] continues from it.
    pub fn state(&self) -> MixtureState {
        let packing = self.packer.as_ref();
        // Fit mode with rows of the pack window still to emit: the state is
        // where the window was drawn from, and the rows emitted of it.
        let fit = packing
            .filter(|p| p.options.mode == PackMode::Fit && p.window_pending())
            .map(Packer::fit_state);
        MixtureState {
            version: STATE_VERSION,
            plan: PLAN_VERSION,
            kind: "mixture".into(),
            seed: self.seed,
            rank: self.rank,
            world_size: self.world_size,
            batch_size: self.batch_size,
            shuffle: self.shuffle,
            drop_last: self.drop_last,
            mix_stop: self.streams.stop,
            pack: packing.map(|p| p.options.clone()),
            sources: self.source_states.clone(),
            weights: self.weights().to_vec(),
            pending_weights: self.streams.pending.clone(),
            epoch: self.epoch,
            batch: self.index,
            draw: match (&fit, &self.streams.previous_anchor, &self.streams.anchor) {
                (Some(f), Some(a), _) if f.previous > 0 => a.clone(),
                (Some(_), _, Some(a)) => a.clone(),
                _ => self.streams.draw_state(),
            },
            carry: packing.and_then(|p| p.carry),
            window_weights: fit.as_ref().and(self.streams.applied.clone()),
            window: fit,
            epoch_start: self.epoch_start.clone(),
            pending: self.per_source(|s| {
                s.pending
                    .iter()
                    .filter(|(e, _)| *e >= s.epoch.saturating_sub(1))
                    .cloned()
                    .collect()
            }),
            skips: self.per_source(|s| {
                s.skips
                    .iter()
                    .filter(|k| (k.0, k.1 + 1) >= (s.epoch, s.position))
                    .copied()
                    .collect()
            }),
        }
    }

    /// Continue exactly where `state` was taken. A state of other datasets,
    /// weights or order options is refused, naming what changed; see
    /// [`Mixture::resume_changed`] to accept changed sources.
    pub fn resume(&mut self, state: &MixtureState) -> Result<()> {
        self.resume_with(state, false)
    }

    /// [`Mixture::resume`], but sources whose dataset changed (or that are
    /// new) start afresh (source epoch 0, position 0) and changed weights
    /// take the loader's own; unchanged sources continue where they were.
    /// The packing carry-over is dropped if its source changed.
    pub fn resume_changed(&mut self, state: &MixtureState) -> Result<()> {
        self.resume_with(state, true)
    }

    /// The checks of a state that no option can waive: versions, the order
    /// options, packing.
    fn check_state(&self, state: &MixtureState) -> Result<()> {
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        if state.kind != "mixture" {
            return refuse("the state is not a mixture's".into());
        }
        if state.version != STATE_VERSION || state.plan != PLAN_VERSION {
            return refuse(format!(
                "the state has format {} and order algorithm {}, this loader {STATE_VERSION} and {PLAN_VERSION}",
                state.version, state.plan
            ));
        }
        crate::state::same_order(&[
            ("seed", state.seed, self.seed),
            ("rank", state.rank, self.rank),
            ("world_size", state.world_size, self.world_size),
            (
                "batch_size",
                state.batch_size as u64,
                self.batch_size as u64,
            ),
            ("shuffle", state.shuffle as u64, self.shuffle as u64),
            ("drop_last", state.drop_last as u64, self.drop_last as u64),
        ])?;
        if state.mix_stop != self.streams.stop {
            return refuse(format!(
                "the state has mix_stop {:?} but this loader has {:?}",
                state.mix_stop, self.streams.stop
            ));
        }
        let mine = self.packer.as_ref().map(|p| &p.options);
        if state.pack.as_ref() != mine {
            return refuse(format!(
                "the state packs with {:?} but this loader with {mine:?}",
                state.pack
            ));
        }
        Ok(())
    }

    fn resume_with(&mut self, state: &MixtureState, allow_changed: bool) -> Result<()> {
        self.check_state(state)?;
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        let n = self.streams.sources.len();
        let shapes_ok = state.sources.len() == state.draw.sources.len()
            && state.draw.counts.len() == state.sources.len()
            && state.draw.weights.len() == state.sources.len()
            && state
                .pending_weights
                .iter()
                .chain(&state.window_weights)
                .all(|w| w.len() == state.sources.len())
            && state.carry.is_none_or(|c| c.source < state.sources.len());
        if !shapes_ok {
            return refuse("the state's lists of sources have different lengths".into());
        }
        for weights in std::iter::once(&state.draw.weights)
            .chain(&state.pending_weights)
            .chain(&state.window_weights)
        {
            if let Err(e) = Blend::shares(weights) {
                return refuse(format!("the state's weights {weights:?} are refused: {e}"));
            }
        }
        if let Err(reason) = Blend::check_counts(
            &Blend::shares(&state.draw.weights)?,
            state.draw.drawn,
            &state.draw.counts,
        ) {
            return refuse(format!("the state's draw counts are refused: {reason}"));
        }
        if let (Some(fit), Some(pack)) = (&state.window, &state.pack) {
            // A window draws at most `window` documents and defers some of them.
            if fit.previous > pack.window || fit.deferred.len() > fit.previous {
                return refuse(format!(
                    "the state's pack window ({} documents, {} deferred) does not fit pack_window {}",
                    fit.previous,
                    fit.deferred.len(),
                    pack.window
                ));
            }
        }
        // Which saved source each of ours continues (None: starts afresh).
        let mut from: Vec<Option<usize>> = vec![None; n];
        let mut changed = Vec::new();
        for (i, s) in self.streams.sources.iter().enumerate() {
            let url = shardfeed_format::redact::url(&s.url);
            let saved = state.sources.get(i);
            match saved {
                Some(saved) if saved.dataset == s.fingerprint => {
                    if saved.weight != self.initial_weights[i] {
                        changed.push(format!(
                            "source {i} ({url}) has weight {} in the state but {} here",
                            saved.weight, self.initial_weights[i]
                        ));
                    }
                    from[i] = Some(i);
                }
                Some(saved) => changed.push(format!(
                    "source {i} ({url}) is dataset {} but the state's source {i} ({}) is dataset {}",
                    s.fingerprint, saved.url, saved.dataset
                )),
                None => changed.push(format!("source {i} ({url}) is not in the state")),
            }
        }
        if state.sources.len() > n {
            changed.push(format!(
                "the state has {} sources, this loader {n}",
                state.sources.len()
            ));
        }
        if !changed.is_empty() && !allow_changed {
            return refuse(format!(
                "the mixture changed since the state was saved: {}; pass allow_changed=True to start the changed sources afresh",
                changed.join("; ")
            ));
        }
        let exact = changed.is_empty();
        let draw = DrawState {
            sources: (0..n)
                .map(|i| from[i].map_or((0, 0, false), |j| state.draw.sources[j]))
                .collect(),
            drawn: if exact { state.draw.drawn } else { 0 },
            counts: if exact {
                state.draw.counts.clone()
            } else {
                vec![0; n]
            },
            ended: state.draw.ended,
            weights: if exact {
                state.draw.weights.clone()
            } else {
                self.initial_weights.clone()
            },
        };
        let carry = state.carry.filter(|c| from[c.source] == Some(c.source));
        for (i, s) in self.streams.sources.iter_mut().enumerate() {
            let j = from[i];
            s.pending = j
                .and_then(|j| state.pending.get(j).cloned())
                .unwrap_or_default();
            s.skips = j
                .and_then(|j| state.skips.get(j).cloned())
                .unwrap_or_default();
        }
        self.restore(&draw, carry)?;
        self.epoch = state.epoch;
        self.index = state.batch;
        self.epoch_start = (0..n)
            .map(|i| {
                from[i]
                    .and_then(|j| state.epoch_start.get(j).copied())
                    .unwrap_or((draw.sources[i].0, 0))
            })
            .collect();
        self.streams.anchor = None;
        self.streams.previous_anchor = None;
        self.streams.pending = None;
        self.streams.applied = None;
        if let Some(p) = &mut self.packer {
            p.reset();
            p.carry = carry;
            if let Some(fit) = state.window.as_ref().filter(|_| exact) {
                // The previous window is drawn from `draw`; the current one
                // applied `window_weights` (if any) when it was drawn.
                p.redraw_previous(&mut self.streams, fit)?;
                self.streams.pending = state.window_weights.clone();
                p.redraw_current(&mut self.streams, fit)?;
            }
        }
        if exact {
            self.streams.pending = state.pending_weights.clone();
        }
        Ok(())
    }

    /// Continue from the states of every rank of a job, whatever its world
    /// size was (an elastic resume). One state of this world size is a plain
    /// [`Mixture::resume`]; so are `world_size` states of this world size
    /// (this rank's is used). Otherwise the states must be those of every
    /// old rank: what they had not yet yielded of each source's epoch (and,
    /// packing in split mode, the rest of each document they were emitting)
    /// is split evenly over the new ranks, each taking a contiguous share of
    /// it, so that across the two runs every row (and every token) is read
    /// exactly once, except fewer than `world_size` rows per source and epoch
    /// that do not divide evenly. The blending counts restart (shares hold
    /// exactly from here). Fit-mode packing cannot be resumed elastically.
    pub fn resume_elastic(&mut self, states: &[MixtureState]) -> Result<()> {
        let refuse = |reason: String| Err(LoaderError::BadState { reason });
        let Some(first) = states.first() else {
            return refuse("no state to resume from".into());
        };
        let old_world = first.world_size;
        if states.len() == 1 && old_world == self.world_size {
            return self.resume(first);
        }
        if states.iter().any(|s| s.world_size != old_world) {
            return refuse("the states were saved with different world sizes".into());
        }
        let mut ranks: Vec<u64> = states.iter().map(|s| s.rank).collect();
        ranks.sort_unstable();
        if ranks != (0..old_world).collect::<Vec<_>>() || states.len() as u64 != old_world {
            return refuse(format!(
                "an elastic resume needs the states of all {old_world} ranks of the saved job, once each; got ranks {ranks:?}"
            ));
        }
        if old_world == self.world_size {
            let mine = states
                .iter()
                .find(|s| s.rank == self.rank)
                .expect("every rank is there");
            return self.resume(mine);
        }
        if self
            .packer
            .as_ref()
            .is_some_and(|p| p.options.mode == PackMode::Fit)
        {
            return refuse(
                "pack_mode=\"fit\" cannot be resumed with another world size (its pack windows span ranks' documents); resume with the same world size, or use pack_mode=\"split\"".into(),
            );
        }
        // Everything but rank and world size must match: check each state
        // against this loader as if it were that rank.
        for st in states {
            let mut mine = st.clone();
            mine.rank = self.rank;
            mine.world_size = self.world_size;
            self.check_state(&mine)?;
            let same_sources = st.sources.len() == self.streams.sources.len()
                && st
                    .sources
                    .iter()
                    .zip(&self.streams.sources)
                    .zip(&self.initial_weights)
                    .all(|((a, b), w)| a.dataset == b.fingerprint && a.weight == *w);
            let shapes_ok = st.draw.sources.len() == st.sources.len()
                && st.carry.is_none_or(|c| c.source < st.sources.len());
            if !same_sources || !shapes_ok {
                return refuse(format!(
                    "rank {}'s state is of other sources or weights than this mixture's (an elastic resume cannot start sources afresh)",
                    st.rank
                ));
            }
            if st.window.is_some() {
                return refuse("a state holds a fit-mode pack window".into());
            }
        }
        let mut states: Vec<&MixtureState> = states.iter().collect();
        states.sort_by_key(|s| s.rank);
        let new_world = self.world_size;
        let me = self.rank;
        for (i, src) in self.streams.sources.iter_mut().enumerate() {
            // Each old rank's place in this source: epoch, position of the
            // first row not wholly yielded, tokens of it yielded.
            let places: Vec<(u64, u64, usize)> = states
                .iter()
                .map(|st| {
                    let (epoch, position, _) = st.draw.sources[i];
                    match st.carry.filter(|c| c.source == i) {
                        Some(c) => (epoch, position.saturating_sub(1), c.offset),
                        None => (epoch, position, 0),
                    }
                })
                .collect();
            let stops: Vec<Stop> = states
                .iter()
                .zip(&places)
                .map(|(st, &(epoch, position, tokens))| Stop {
                    epoch,
                    position,
                    tokens,
                    pending: st.pending.get(i).map_or(&[], |p| p.as_slice()),
                })
                .collect();
            let mut pending = Vec::new();
            let mut skips = Vec::new();
            for (epoch, pieces, marks) in
                elastic_share(&stops, old_world, me, new_world, |e, r, w| {
                    src.loader.rows_of_rank(e, r, w)
                })
            {
                pending.push((epoch, pieces));
                skips.extend(marks.into_iter().map(|(at, t)| (epoch, at, t)));
            }
            src.pending = pending;
            src.skips = skips;
        }
        let draw = DrawState {
            sources: self
                .streams
                .sources
                .iter()
                .map(|s| (s.pending.first().map_or(0, |p| p.0), 0, false))
                .collect(),
            drawn: 0,
            counts: vec![0; self.streams.sources.len()],
            ended: false,
            weights: states[0].draw.weights.clone(),
        };
        self.restore(&draw, None)?;
        if let Some(p) = &mut self.packer {
            p.reset();
        }
        self.streams.anchor = None;
        self.streams.previous_anchor = None;
        self.streams.pending = None;
        self.streams.applied = None;
        self.epoch = states.iter().map(|s| s.epoch).min().expect("states");
        self.index = 0;
        self.epoch_start = draw.sources.iter().map(|s| (s.0, 0)).collect();
        Ok(())
    }

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
            s.loader.stop();
        }
    }

    /// A slab for `bytes`: waits while every slab is in the queue or held
    /// by the consumer (the consumer names that case), until cancelled.
    fn lease(&self, bytes: usize) -> Result<SlabLease> {
        if bytes > self.pool.slab_bytes() {
            return self.pool.oversize(bytes);
        }
        self.pool
            .acquire(&self.streams.cancel)?
            .ok_or(LoaderError::Interrupted)
    }

    /// The next batch, or `None` at the end of the mixture epoch (the next
    /// call starts the following one).
    fn next_batch(&mut self) -> Option<Result<Batch>> {
        let result = if self.packer.is_some() {
            self.next_packed()
        } else {
            self.next_rows()
        };
        match result {
            Ok(Some(batch)) => {
                self.index += 1;
                Some(Ok(batch))
            }
            Ok(None) => {
                // The mixture epoch is over: counts restart with the next.
                self.epoch += 1;
                self.index = 0;
                self.streams.ended = false;
                self.streams.blend.reset();
                for s in &mut self.streams.sources {
                    s.exhausted = false;
                }
                self.epoch_start = self
                    .streams
                    .sources
                    .iter()
                    .map(|s| (s.epoch, s.position))
                    .collect();
                if let Some(p) = &mut self.packer {
                    p.reset();
                }
                self.streams.anchor = None;
                self.streams.previous_anchor = None;
                None
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// A partial batch at the epoch's end: kept, or dropped with `drop_last`.
    fn partial(&mut self, rows: usize) -> bool {
        if rows == 0 {
            return false;
        }
        if rows < self.batch_size && self.drop_last {
            self.dropped_batches += 1;
            return false;
        }
        true
    }

    fn next_packed(&mut self) -> Result<Option<Batch>> {
        let packer = self.packer.as_mut().expect("packing");
        let l = packer.options.length;
        let b = self.batch_size;
        // At most i32::MAX: checked when the mixture was built.
        let tokens = b * l;
        let mut lease = self.lease(packed_slab_bytes(tokens)?)?;
        let region = (tokens * 4).next_multiple_of(64);
        let cu_region = ((tokens + 1) * 4).next_multiple_of(64);
        let slab = lease.slab_mut().as_mut_slice();
        let (ids, rest) = slab.split_at_mut(region);
        let (pos, rest) = rest.split_at_mut(region);
        let (seg, rest) = rest.split_at_mut(region);
        let (cu, rest) = rest.split_at_mut(cu_region);
        let (src, _) = rest.split_at_mut(region);
        let mut out = Out {
            input_ids: as_i32(ids, tokens),
            position_ids: as_i32(pos, tokens),
            segment_ids: as_i32(seg, tokens),
            cu_seqlens: as_i32(cu, tokens + 1),
            source: as_i32(src, tokens),
            segments: 0,
        };
        let packer = self.packer.as_mut().expect("packing");
        let rows = packer.fill(&mut self.streams, b, &mut out)?;
        let segments = out.segments;
        if !self.partial(rows) {
            return Ok(None);
        }
        let int32 = |shape: Vec<usize>, offset: usize| Buffer {
            dtype: DType::I32,
            shape,
            offset,
        };
        let dense = |name: &str, values: Buffer| Column {
            name: name.into(),
            layout: ColumnLayout::Dense { values },
            validity: None,
        };
        let columns = vec![
            dense("input_ids", int32(vec![rows, l], 0)),
            dense("position_ids", int32(vec![rows, l], region)),
            dense("segment_ids", int32(vec![rows, l], 2 * region)),
            dense("cu_seqlens", int32(vec![segments + 1], 3 * region)),
            dense(SOURCE_COLUMN, int32(vec![segments], 3 * region + cu_region)),
        ];
        Ok(Some(self.batch(lease, rows, columns)))
    }

    /// A batch of this mixture's epoch over `lease`.
    fn batch(&self, lease: SlabLease, rows: usize, columns: Vec<Column>) -> Batch {
        Batch {
            lease: Arc::new(lease),
            rows,
            columns,
            index: self.index,
            held: None,
        }
    }

    fn next_rows(&mut self) -> Result<Option<Batch>> {
        let b = self.batch_size;
        let mut staging = std::mem::take(&mut self.staging);
        staging.iter_mut().for_each(Staged::clear);
        let mut sources: Vec<i32> = Vec::with_capacity(b);
        while sources.len() < b {
            let Some(s) = self.streams.next_row()? else {
                break;
            };
            let src = &self.streams.sources[s];
            let batch = src.batch.as_ref().expect("a row was drawn");
            if staging.is_empty() {
                staging = batch.columns().iter().map(Staged::new).collect();
            }
            for (st, col) in staging.iter_mut().zip(batch.columns()) {
                st.push(batch, col, src.row, sources.len())
                    .map_err(|e| source_error(s, &src.url, e))?;
            }
            sources.push(s as i32);
        }
        let rows = sources.len();
        if !self.partial(rows) {
            return Ok(None);
        }
        // Lay the buffers out, 64-byte aligned, then copy.
        let mut at = 0usize;
        let mut place = |bytes: usize| {
            let offset = at;
            at = (at + bytes).next_multiple_of(64);
            offset
        };
        let mut columns = Vec::with_capacity(staging.len() + 1);
        let mut copies: Vec<(usize, &[u8])> = Vec::new();
        for st in &staging {
            let (column, mut c) = st.layout(rows, &mut place);
            columns.push(column);
            copies.append(&mut c);
        }
        let source_bytes: &[u8] = as_bytes(&sources);
        let src_offset = place(source_bytes.len());
        copies.push((src_offset, source_bytes));
        columns.push(Column {
            name: SOURCE_COLUMN.into(),
            layout: ColumnLayout::Dense {
                values: Buffer {
                    dtype: DType::I32,
                    shape: vec![rows],
                    offset: src_offset,
                },
            },
            validity: None,
        });
        let mut lease = self.lease(at.max(64))?;
        let slab = lease.slab_mut().as_mut_slice();
        for (offset, bytes) in copies {
            slab[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
        let batch = self.batch(lease, rows, columns);
        self.staging = staging;
        Ok(Some(batch))
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        self.stop();
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

/// One column's rows copied out of the sources' batches.
struct Staged {
    name: String,
    kind: StagedKind,
    values: Vec<u8>,
    /// Ragged and bytes: row boundaries (elements); padded: lengths.
    offsets: Vec<i64>,
    validity: Option<Vec<u8>>,
}

enum StagedKind {
    Dense { dtype: DType, inner: Vec<usize> },
    Ragged { dtype: DType },
    Padded { dtype: DType, to: usize },
    Bytes { utf8: bool },
}

impl Staged {
    fn new(column: &Column) -> Self {
        let kind = match &column.layout {
            ColumnLayout::Dense { values } => StagedKind::Dense {
                dtype: values.dtype,
                inner: values.shape[1..].to_vec(),
            },
            ColumnLayout::Ragged { values, .. } => StagedKind::Ragged {
                dtype: values.dtype,
            },
            ColumnLayout::Padded { values, .. } => StagedKind::Padded {
                dtype: values.dtype,
                to: values.shape.get(1).copied().unwrap_or(0),
            },
            ColumnLayout::Bytes { utf8, .. } => StagedKind::Bytes { utf8: *utf8 },
        };
        Staged {
            name: column.name.clone(),
            kind,
            values: Vec::new(),
            offsets: vec![0],
            validity: column.validity.as_ref().map(|_| Vec::new()),
        }
    }

    /// Empty, keeping the buffers.
    fn clear(&mut self) {
        self.values.clear();
        self.offsets.clear();
        self.offsets.push(0);
        // Validity comes back with the first row that has it (`push`).
        self.validity = None;
    }

    /// Append row `row` of `column` (of `batch`); `before` rows came first.
    fn push(&mut self, batch: &Batch, column: &Column, row: usize, before: usize) -> Result<()> {
        let mismatch = || {
            LoaderError::stage(
                Stage::Mix,
                None,
                None,
                format!(
                    "column `{}` is collated differently by two sources",
                    self.name
                ),
            )
        };
        match (&self.kind, &column.layout) {
            (StagedKind::Dense { dtype, inner }, ColumnLayout::Dense { values })
                if values.dtype == *dtype && values.shape[1..] == inner[..] =>
            {
                let width = inner.iter().product::<usize>() * dtype.size();
                let bytes = batch.bytes(values);
                self.values
                    .extend_from_slice(&bytes[row * width..(row + 1) * width]);
            }
            (StagedKind::Padded { dtype, to }, ColumnLayout::Padded { values, lengths })
                if values.dtype == *dtype && values.shape.get(1) == Some(to) =>
            {
                let width = to * dtype.size();
                let bytes = batch.bytes(values);
                self.values
                    .extend_from_slice(&bytes[row * width..(row + 1) * width]);
                let lengths = batch.typed::<i64>(lengths).expect("lengths are i64");
                self.offsets.push(lengths[row]);
            }
            (StagedKind::Ragged { dtype }, ColumnLayout::Ragged { values, offsets })
                if values.dtype == *dtype =>
            {
                let size = dtype.size();
                let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
                let (a, z) = (offsets[row] as usize, offsets[row + 1] as usize);
                self.values
                    .extend_from_slice(&batch.bytes(values)[a * size..z * size]);
                let last = *self.offsets.last().expect("starts with 0");
                self.offsets.push(last + (z - a) as i64);
            }
            (
                StagedKind::Bytes { .. },
                ColumnLayout::Bytes {
                    values, offsets, ..
                },
            ) => {
                let offsets = batch.typed::<i64>(offsets).expect("offsets are i64");
                let (a, z) = (offsets[row] as usize, offsets[row + 1] as usize);
                self.values.extend_from_slice(&batch.bytes(values)[a..z]);
                let last = *self.offsets.last().expect("starts with 0");
                self.offsets.push(last + (z - a) as i64);
            }
            _ => return Err(mismatch()),
        }
        match (&mut self.validity, &column.validity) {
            (Some(v), Some(valid)) => v.push(batch.typed::<u8>(valid).expect("u8")[row]),
            (Some(v), None) => v.push(1),
            (None, Some(valid)) => {
                // The first rows had no validity: they were all valid.
                let mut v = vec![1u8; before];
                v.push(batch.typed::<u8>(valid).expect("u8")[row]);
                self.validity = Some(v);
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The column's layout for `rows` rows, placing each buffer with
    /// `place`, and the bytes to copy where.
    fn layout<'a>(
        &'a self,
        rows: usize,
        place: &mut impl FnMut(usize) -> usize,
    ) -> (Column, Vec<(usize, &'a [u8])>) {
        let mut copies = Vec::new();
        let mut buffer = |dtype: DType, shape: Vec<usize>, bytes: &'a [u8]| {
            let offset = place(bytes.len());
            copies.push((offset, bytes));
            Buffer {
                dtype,
                shape,
                offset,
            }
        };
        let offsets_bytes = || -> &'a [u8] {
            // SAFETY: any `i64` is 8 initialised bytes; `u8` has alignment 1.
            unsafe { self.offsets.align_to::<u8>().1 }
        };
        let layout = match &self.kind {
            StagedKind::Dense { dtype, inner } => {
                let mut shape = vec![rows];
                shape.extend_from_slice(inner);
                ColumnLayout::Dense {
                    values: buffer(*dtype, shape, &self.values),
                }
            }
            StagedKind::Padded { dtype, to } => ColumnLayout::Padded {
                values: buffer(*dtype, vec![rows, *to], &self.values),
                lengths: buffer(DType::I64, vec![rows], &offsets_bytes()[8..]),
            },
            StagedKind::Ragged { dtype } => ColumnLayout::Ragged {
                values: buffer(*dtype, vec![self.values.len() / dtype.size()], &self.values),
                offsets: buffer(DType::I64, vec![rows + 1], offsets_bytes()),
            },
            StagedKind::Bytes { utf8 } => ColumnLayout::Bytes {
                values: buffer(DType::U8, vec![self.values.len()], &self.values),
                offsets: buffer(DType::I64, vec![rows + 1], offsets_bytes()),
                utf8: *utf8,
            },
        };
        let validity = self
            .validity
            .as_ref()
            .map(|v| buffer(DType::U8, vec![rows], v));
        (
            Column {
                name: self.name.clone(),
                layout,
                validity,
            },
            copies,
        )
    }
}

#[cfg(test)]
mod tests;
