//! The shuffle stage: assembles each window from decoded segments (in plan
//! order) and, for fixed-width columns, materialises it in shuffled order,
//! one window ahead of the collator.
//!
//! A segment skipped under [`OnError::Skip`](crate::OnError::Skip) keeps its
//! place in the window's row numbering (so positions map to the same rows on
//! every rank and after a resume) but holds no rows; the collator leaves
//! its rows out.

use crate::error::Stage;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use crossbeam_channel::{Receiver, Sender};
use shardfeed_format::failpoint::Action;
use tokio::sync::OwnedSemaphorePermit;

use crate::config::Config;
use crate::error::{LoaderError, Result};
use crate::gather::{KeyBound, LOOK_UP_ABOVE, permute};
use crate::plan::EpochPlan;
use crate::stage::{Decoded, DecodedSegment, injected};
use crate::stats::Counters;

/// A window's decoded rows, held while they are collated.
pub(crate) struct LoadedWindow {
    pub index: usize,
    pub batches: Vec<RecordBatch>,
    /// Window rows before each batch (`batches.len() + 1` entries).
    pub prefix: Vec<u64>,
    /// Whether each batch stands for a skipped segment (no rows to yield).
    pub skipped: Vec<bool>,
    /// Whether `batches` is one batch already in the window's shuffled order.
    pub permuted: bool,
    /// A first window sent before it is permuted, so the first batches need
    /// not wait for the permutation: its permuted version follows and
    /// replaces it (and holds the budget).
    pub provisional: bool,
    pub _permits: Vec<OwnedSemaphorePermit>,
    /// A permuted window's bounds on its dictionary columns' keys (indexed
    /// by column; `None` for plain columns), from [`crate::gather::permute`]; empty for
    /// other windows.
    pub key_bounds: Vec<Option<KeyBound>>,
}

impl LoadedWindow {
    /// Whether any segment of the window was skipped.
    pub fn has_skipped(&self) -> bool {
        self.skipped.iter().any(|&s| s)
    }
}

/// The shuffle stage of one pass.
pub(crate) struct Shuffler {
    pub config: Arc<Config>,
    pub plan: Arc<EpochPlan>,
    pub decoded: Receiver<Decoded>,
    pub waiting: BTreeMap<u64, (DecodedSegment, Option<OwnedSemaphorePermit>)>,
    pub counters: Arc<Counters>,
    pub cancel: Arc<AtomicBool>,
    /// The order of the next window to be permuted, computed on a thread of
    /// its own while this one permutes (a window's order is a Feistel
    /// evaluation per row: a tenth of the shuffle stage's time on tabular
    /// data, which holds up every later stage).
    pub next_order: Option<(usize, std::thread::JoinHandle<Vec<u32>>)>,
}

impl Shuffler {
    /// Assemble windows `first_window..` in order into `output`; sets
    /// `assembled_all` once the last one is assembled. Stops at the first
    /// error (sent on), or quietly once cancelled.
    pub fn run(
        &mut self,
        first_window: usize,
        output: &Sender<Result<LoadedWindow>>,
        assembled_all: &AtomicBool,
    ) {
        let count = self.plan.window_count();
        if first_window >= count {
            assembled_all.store(true, Ordering::SeqCst);
        }
        for index in first_window..count {
            let early = (index == first_window).then_some(output);
            let result = match self.config.failpoints.hit("shuffle", index as u64) {
                None => self.load(index, early),
                Some(Action::Stop) => return,
                Some(action) => Err(injected(Stage::Shuffle, action, &self.cancel)),
            };
            if index + 1 == count && result.is_ok() {
                assembled_all.store(true, Ordering::SeqCst);
            }
            let failed = result.is_err();
            let sending = Instant::now();
            let sent = output.send(result);
            Counters::add_time(&self.counters.shuffle_blocked_out_ns, sending.elapsed());
            if sent.is_err() || failed {
                return;
            }
        }
    }

    /// Window `index`'s order (computed ahead, or here), and the next
    /// window's started on a thread of its own.
    fn order(&mut self, index: usize) -> Result<Vec<u32>> {
        let order = match self.next_order.take() {
            Some((i, handle)) if i == index => handle.join().map_err(|_| {
                LoaderError::stage(
                    Stage::Shuffle,
                    None,
                    None,
                    format!("window {index}: the thread computing its order panicked"),
                )
            })?,
            _ => self.plan.window(index).rows(),
        };
        let next = index + 1;
        if next < self.plan.window_count() {
            let plan = self.plan.clone();
            // Without a thread (none to be had), the order is computed here
            // when the window comes.
            self.next_order = std::thread::Builder::new()
                .name("shardfeed-order".into())
                .spawn(move || plan.window(next).rows())
                .ok()
                .map(|handle| (next, handle));
        }
        Ok(order)
    }

    /// Receive decoded segments until every segment of window `index` is here.
    /// With `early` (a pass's first window) a window to be permuted is sent
    /// there as it is first, so that the first batch waits for the decoding
    /// only.
    fn load(
        &mut self,
        index: usize,
        early: Option<&Sender<Result<LoadedWindow>>>,
    ) -> Result<LoadedWindow> {
        let window = self.plan.window(index);
        let first = window.first_segment as u64;
        let count = window.segments.len() as u64;
        let mut batches = Vec::with_capacity(count as usize);
        let mut skipped = Vec::with_capacity(count as usize);
        let mut permits = Vec::with_capacity(count as usize);
        let mut prefix = Vec::with_capacity(count as usize + 1);
        prefix.push(0);
        for (seq, segment) in (first..first + count).zip(window.segments) {
            let (decoded, permit) = loop {
                if let Some(found) = self.waiting.remove(&seq) {
                    break found;
                }
                let waiting = Instant::now();
                let received = self.decoded.recv();
                Counters::add_time(&self.counters.shuffle_blocked_in_ns, waiting.elapsed());
                match received {
                    Ok((_, Err(e), _)) => return Err(e),
                    Ok((s, Ok(decoded), permit)) => {
                        self.waiting.insert(s, (decoded, permit));
                    }
                    Err(_) => {
                        return Err(LoaderError::stage(
                            Stage::Decode,
                            None,
                            Some(segment.row_group as usize),
                            format!(
                                "stopped before delivering segment {seq} (shard index {}) of the epoch",
                                segment.shard
                            ),
                        ));
                    }
                }
            };
            let at = *prefix.last().expect("non-empty");
            match decoded {
                DecodedSegment::Rows(decoded) => {
                    let mut rows = 0;
                    for batch in decoded {
                        rows += batch.num_rows() as u64;
                        prefix.push(at + rows);
                        batches.push(batch);
                        skipped.push(false);
                    }
                    if rows != segment.rows() {
                        return Err(LoaderError::stage(
                            Stage::Decode,
                            None,
                            Some(segment.row_group as usize),
                            format!("delivered {rows} rows for a segment of {}", segment.rows()),
                        ));
                    }
                }
                DecodedSegment::Skipped { schema } => {
                    prefix.push(at + segment.rows());
                    batches.push(RecordBatch::new_empty(schema));
                    skipped.push(true);
                }
            }
            permits.extend(permit);
        }
        let any_skipped = skipped.iter().any(|&s| s);
        // A window of a plan made from pieces (an elastic resume) may read
        // only part of its segments' rows: the other rows belong to another
        // rank. Such a window is gathered batch by batch (below), not
        // permuted whole.
        let whole = prefix.last() == Some(&window.rows);
        if self.config.shuffle
            && self.config.fixed_width
            && window.rows > 0
            && !any_skipped
            && whole
        {
            // Fixed-width columns only (variable-length rows are large contiguous
            // copies that gain nothing and would be copied twice):
            // materialise the window in shuffled order, one column at a time
            // (dictionary columns: their keys, or their values looked up when
            // the dictionaries are large; one-byte keys four columns at a
            // time): each column's random reads stay within that column's
            // data (cache-resident), where gathering
            // batch by batch would sweep every column of the whole window for
            // each batch. Batches are then contiguous slices.
            if let Some(early) = early {
                // Its batches share the decoded buffers; the collator gathers
                // the first batches from it until the permuted one is here.
                let provisional = LoadedWindow {
                    index,
                    batches: batches.clone(),
                    prefix: prefix.clone(),
                    skipped: skipped.clone(),
                    permuted: false,
                    provisional: true,
                    _permits: Vec::new(),
                    key_bounds: Vec::new(),
                };
                if early.send(Ok(provisional)).is_err() {
                    return Err(LoaderError::Closed);
                }
            }
            let started = Instant::now();
            // A failpoint for the permutation, after a provisional window
            // was sent (the trust tests: its failure is the next batch's).
            match self.config.failpoints.hit("permute", index as u64) {
                None => {}
                Some(Action::Stop) => return Err(LoaderError::Closed),
                Some(action) => return Err(injected(Stage::Shuffle, action, &self.cancel)),
            }
            let order = self.order(index)?;
            let (permuted, key_bounds) = permute(
                std::mem::take(&mut batches),
                &order,
                index,
                self.config.stage_workers(),
                LOOK_UP_ABOVE,
            )?;
            Counters::add_time(&self.counters.shuffle_busy_ns, started.elapsed());
            self.counters.span(
                "shuffle window",
                started,
                crate::trace::Args::Index(index as u64),
            );
            // The permuted window keeps its row groups' budget until the
            // collator is done with it: the budget bounds decoded and permuted
            // windows together.
            return Ok(LoadedWindow {
                index,
                prefix: vec![0, permuted.num_rows() as u64],
                batches: vec![permuted],
                skipped: vec![false],
                permuted: true,
                provisional: false,
                _permits: permits,
                key_bounds,
            });
        }
        Ok(LoadedWindow {
            index,
            batches,
            prefix,
            skipped,
            permuted: false,
            provisional: false,
            _permits: permits,
            key_bounds: Vec::new(),
        })
    }
}
