//! A mixture's state: what it holds, and resuming from it (exactly,
//! with changed sources, or elastically).

use super::*;

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
    /// Its shuffle window (row groups) and, for an index read in parts, the
    /// rows of a part: its order follows them, and they follow the byte
    /// budget the sources share, so a resume checks them. Absent in states
    /// saved before they were recorded (then unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<usize>,
    /// See `window`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part_rows: Option<u64>,
}

impl SourceState {
    /// The shuffle window and part rows the source was read in, where the
    /// state recorded them.
    pub fn order(&self) -> Option<(usize, u64)> {
        self.window.zip(self.part_rows)
    }
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
    /// of the old ranks' sequences (see [`crate::Piece`]).
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

impl Core {
    /// Put every source at `draw`'s position; the source of `carry` one row
    /// before, so that its document is drawn again.
    pub(super) fn restore(&mut self, draw: &DrawState, carry: Option<Carry>) -> Result<()> {
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
    pub(super) fn per_source<T>(&self, f: impl Fn(&Source) -> Vec<T>) -> Vec<Vec<T>> {
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
    pub(super) fn check_state(&self, state: &MixtureState) -> Result<()> {
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

    pub(super) fn resume_with(&mut self, state: &MixtureState, allow_changed: bool) -> Result<()> {
        let state = &recorded(state.clone(), &self.unshared_orders);
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
        // Reported after what changed (new weights give new windows).
        let mut other_windows = None;
        for (i, s) in self.streams.sources.iter().enumerate() {
            let url = shardfeed_format::redact::url(&s.url);
            let saved = state.sources.get(i);
            match saved {
                Some(saved) if saved.dataset == s.fingerprint => {
                    if other_windows.is_none() {
                        other_windows = same_windows(i, &url, saved, &self.source_states[i]).err();
                    }
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
        if let Some(e) = other_windows {
            return Err(e);
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
        let states: Vec<MixtureState> = states
            .iter()
            .map(|s| recorded(s.clone(), &self.unshared_orders))
            .collect();
        let states = states.as_slice();
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
            for (i, (saved, mine)) in st.sources.iter().zip(&self.source_states).enumerate() {
                // Named by this mixture's (redacted) URL, not the state's text.
                same_windows(i, &mine.url, saved, mine)?;
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
}

/// Refuse to continue source `i` from `saved` when it was read in other
/// shuffle windows (or parts) than `mine`: its order follows them, so the
/// rows after the state would not be the ones the saved mixture was to
/// read (some twice, some not at all, in that source's epoch).
fn same_windows(i: usize, url: &str, saved: &SourceState, mine: &SourceState) -> Result<()> {
    let (Some(was), Some(is)) = (saved.order(), mine.order()) else {
        return Ok(());
    };
    if was == is {
        return Ok(());
    }
    let parts = |rows: u64| match rows {
        0 => String::new(),
        rows => format!(" (parts of {rows} rows)"),
    };
    Err(LoaderError::BadState {
        reason: format!(
            "source {i} ({url}) was read in shuffle windows of {} row groups{} when the state was saved but {}{} here: the order would differ. A source's default window follows its weight and the byte_budget the sources share; build the mixture with the weights and byte_budget it was saved with, or with the state's windows (FeedBuilder::with_order_of; the Python Loader adopts them itself; window {} where every source was read in it)",
            was.0,
            parts(was.1),
            is.0,
            parts(is.1),
            was.0
        ),
    })
}

/// `state` with the windows (and part rows) of the sources it did not
/// record, saved by a build that did not record them: `unshared`, one
/// loader's default windows for each source (sources did not yet share
/// the default window), which those sources were read in.
pub(super) fn recorded(mut state: MixtureState, unshared: &[(usize, u64)]) -> MixtureState {
    for (saved, &(window, part_rows)) in state.sources.iter_mut().zip(unshared) {
        if saved.window.is_none() {
            saved.window = Some(window);
            saved.part_rows = Some(part_rows);
        }
    }
    state
}
