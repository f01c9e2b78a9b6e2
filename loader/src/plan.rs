//! The plan: which rows a rank sees in an epoch, and in which order.
//!
//! A pure function of (manifest, seed, epoch, rank, world size, options):
//!
//! 1. The epoch's units, one per (shard, row group), are permuted with a
//!    seeded bijection (or kept in order without shuffling). Concatenating their
//!    rows gives the epoch sequence of `N` rows.
//! 2. Rank `r` of `W` takes the contiguous block `[r*q, (r+1)*q)` of that
//!    sequence. With `drop_last`, `q = N / W` and the last `N mod W` rows of the
//!    sequence are dropped; without it, `q = ceil(N / W)` and positions past `N`
//!    wrap around to the start (those rows appear twice), as PyTorch's
//!    `DistributedSampler` pads. Every rank therefore sees exactly `q` rows.
//! 3. The block is a list of segments (row ranges of units, clipped at the
//!    block's ends), cut into windows of `window` segments; rows are permuted
//!    inside each window with a seeded bijection. So that an epoch's first
//!    batch needs neither a whole window fetched and decoded nor a window of
//!    one row group, the first window is split in two: the first
//!    `1/first_slices` of some of its segments (the fewest, at least
//!    [`MIN_FIRST_HEADS`], whose slices hold [`FIRST_HEAD_BATCHES`]
//!    batches; all of them when even that is too few rows), then the rest
//!    of those and the other segments whole. The decoders stop after the
//!    pages that cover a slice. Without shuffling, rows come in order and
//!    nothing is split; the loader splits only datasets shuffled at shard
//!    time, whose slices are random samples.
//! 4. Batches are consecutive runs of `batch_size` positions; with `drop_last`
//!    the final partial batch is dropped.
//!
//! Position `k` of a rank's epoch maps to a row with arithmetic only, so a
//! resume state is just `k`, and resuming decodes nothing before `k`'s window.
//!
//! **Elastic resume.** What is left of an epoch after ranks stopped is a list
//! of [`Piece`]s: position ranges of the sequences of the ranks of the old
//! world. [`EpochPlan::from_pieces`] plans a new rank's share of them: each
//! piece's windows keep their old permutation (a window cut by a piece
//! boundary keeps only its offsets inside the piece), so the rows a piece
//! yields are exactly the old rank's rows at those positions. A plan from
//! pieces has [`EpochPlan::remaining`] pieces too, so resumes compose.

use shardfeed_format::Manifest;
use shardfeed_format::permute::{Permutation, Tabulated, hash_words};

/// A row range of one row group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index of the shard in the manifest.
    pub shard: u32,
    /// Row group within the shard.
    pub row_group: u32,
    /// First row (within the row group).
    pub start: u32,
    /// One past the last row.
    pub end: u32,
}

impl Segment {
    /// Rows in the segment.
    pub fn rows(&self) -> u64 {
        (self.end - self.start) as u64
    }
}

/// What a plan is computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PlanOptions {
    /// Seed of every shuffle.
    pub seed: u64,
    /// Epoch number (changes the order).
    pub epoch: u64,
    /// This rank.
    pub rank: u64,
    /// Number of ranks.
    pub world_size: u64,
    /// Permute units and rows.
    pub shuffle: bool,
    /// Segments per shuffle window.
    pub window: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// Drop the cross-rank remainder and the final partial batch.
    pub drop_last: bool,
    /// The first window is served in two: the first `1/first_slices` of
    /// the rows of some of its segments, then the rest (0 or 1: not split;
    /// see the module's documentation).
    pub first_slices: u32,
    /// With `drop_last`, still yield the final partial batch (only the
    /// cross-rank remainder is dropped): a mixture's sources read every row
    /// of their rank's block this way.
    pub keep_partial: bool,
    /// Row groups of more rows than this are cut into parts of at most
    /// this many rows, each a unit of its own (read as the page ranges that
    /// cover it); 0: row groups are units whole.
    pub part_rows: u64,
}

/// A position range `[start, end)` of the sequence rank `rank` of
/// `world` ranks yields in an epoch: a part of what is left of the epoch at
/// an elastic resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Piece {
    /// The old rank.
    pub rank: u64,
    /// The old number of ranks.
    pub world: u64,
    /// First position.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

impl Piece {
    /// Positions in the piece (0 for a reversed range).
    pub fn rows(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// The parts `[start, end)` a row group of `rows` rows is cut into: near
/// equal, of at most `part_rows` rows each (the whole row group when
/// `part_rows` is 0 or not less than `rows`).
pub(crate) fn parts(rows: u64, part_rows: u64) -> impl Iterator<Item = (u32, u64)> {
    let count = if part_rows == 0 {
        1
    } else {
        rows.div_ceil(part_rows).max(1)
    };
    // In u128: `rows` comes from a manifest (a plan's rows are u32).
    let at = move |i: u64| (rows as u128 * i as u128 / count as u128) as u64;
    (0..count).map(move |i| (at(i) as u32, at(i + 1)))
}

/// Fewest segments of a first window whose first slices serve an epoch's
/// first batches: below this the heads would be a one-row-group window.
pub(crate) const MIN_FIRST_HEADS: usize = 2;

/// Whether an epoch's first window is sliced (see the module's
/// documentation): for a dataset shuffled at shard time (its slices are
/// random samples; in a dataset written in order a slice is one class or
/// domain), when a rank's epoch holds more row groups than the heads take,
/// so that there is a rest to serve after them. Without slicing, the first
/// batch waits for the whole first window: in a mixture, for every
/// source's, on cores the sources share. Part of the order: a change here
/// bumps [`crate::PLAN_VERSION`].
pub(crate) fn slices_first_window(
    shuffled_at_shard: bool,
    row_groups: u64,
    world_size: u64,
) -> bool {
    shuffled_at_shard && row_groups / world_size.max(1) > MIN_FIRST_HEADS as u64
}

/// Batches the first slices must hold (unless every segment of the first
/// window is sliced): a batch that straddles the heads and the rest waits
/// for the whole rest.
pub(crate) const FIRST_HEAD_BATCHES: u64 = 2;

/// How many of a first window's segments (whose first slices hold
/// `slices` rows each, in order) are sliced: the fewest, at least
/// [`MIN_FIRST_HEADS`], whose slices hold [`FIRST_HEAD_BATCHES`] batches of
/// `batch_size`, or all of them. The first batch waits for the sliced
/// segments' row groups to be fetched whole (their chunks' checksums cover
/// whole chunks), so fewer of them bring it sooner: on a 1.5 GB token set
/// (row groups of ~1,000 rows, 4.4 MB) with batches of 64, slicing 2 of 8
/// instead of all 8 brought the first batch in 38 ms instead of 81 (medians
/// of six fresh processes, docs/performance-notes.md). The rest of the window is the
/// next window.
fn first_heads(slices: impl Iterator<Item = u64>, batch_size: u64) -> usize {
    let want = FIRST_HEAD_BATCHES.saturating_mul(batch_size);
    let mut rows = 0u64;
    let mut count = 0usize;
    for slice in slices {
        if count >= MIN_FIRST_HEADS && rows >= want {
            break;
        }
        rows = rows.saturating_add(slice);
        count += 1;
    }
    count
}

/// Positions `[from, to)` of the sequence `pieces` make, as pieces.
pub(crate) fn slice(pieces: &[Piece], from: u64, to: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in pieces {
        let (lo, hi) = (at, at + p.rows());
        at = hi;
        let (a, b) = (from.max(lo), to.min(hi));
        if a < b {
            out.push(Piece {
                start: p.start + (a - lo),
                end: p.start + (b - lo),
                ..*p
            });
        }
    }
    out
}

/// Where an old rank stopped, for an elastic resume: its epoch, the first
/// position it had not wholly yielded, and how many tokens of that row it
/// had (packing: the rest of a document), and the pieces its epochs were
/// planned from (after an earlier elastic resume).
#[derive(Clone, Debug)]
pub(crate) struct Stop<'a> {
    /// The epoch.
    pub epoch: u64,
    /// The position in the rank's sequence of that epoch.
    pub position: u64,
    /// Tokens of the row at `position` already yielded.
    pub tokens: usize,
    /// Epochs of this rank planned from pieces.
    pub pending: &'a [(u64, Vec<Piece>)],
}

/// One epoch of an elastic share: the epoch, its pieces, and the rows in
/// them whose first tokens were yielded before (position, tokens).
pub(crate) type EpochShare = (u64, Vec<Piece>, Vec<(u64, usize)>);

/// New rank `rank` of `world`'s share of what the old ranks (`stops`, in
/// rank order, of `old_world`) had left: for each epoch from the earliest
/// old rank's to the latest's, the old ranks' remaining sequences are
/// concatenated in rank order and cut into `world` equal contiguous shares
/// (the last `total mod world` rows are dropped). Returns per epoch the
/// share's pieces and the rows in it whose first tokens were yielded
/// (position in the share, tokens). `rows_of(epoch, rank, world)` is a
/// rank's positions in an epoch planned as usual.
pub(crate) fn elastic_share(
    stops: &[Stop],
    old_world: u64,
    rank: u64,
    world: u64,
    rows_of: impl Fn(u64, u64, u64) -> u64,
) -> Vec<EpochShare> {
    let Some(lo) = stops.iter().map(|s| s.epoch).min() else {
        return Vec::new();
    };
    let hi = stops.iter().map(|s| s.epoch).max().unwrap_or(lo);
    let mut out = Vec::new();
    for epoch in lo..=hi {
        let mut rest: Vec<Piece> = Vec::new();
        let mut marks: Vec<(u64, usize)> = Vec::new();
        for (r, stop) in stops.iter().enumerate() {
            if stop.epoch > epoch {
                continue;
            }
            let sequence = stop
                .pending
                .iter()
                .find(|(e, _)| *e == epoch)
                .map(|(_, pieces)| pieces.clone())
                .unwrap_or_else(|| {
                    vec![Piece {
                        rank: r as u64,
                        world: old_world,
                        start: 0,
                        end: rows_of(epoch, r as u64, old_world),
                    }]
                });
            let from = if stop.epoch == epoch {
                stop.position
            } else {
                0
            };
            if stop.epoch == epoch && stop.tokens > 0 {
                marks.push((rest.iter().map(Piece::rows).sum(), stop.tokens));
            }
            rest.extend(slice(&sequence, from, u64::MAX));
        }
        let share = rest.iter().map(Piece::rows).sum::<u64>() / world;
        let (a, b) = (rank * share, (rank + 1) * share);
        let marks = marks
            .into_iter()
            .filter(|(at, _)| (a..b).contains(at))
            .map(|(at, tokens)| (at - a, tokens))
            .collect();
        out.push((epoch, slice(&rest, a, b), marks));
    }
    out
}

/// The permutation of a window: its seed (none: rows in order), the size of
/// the permuted range (the rows of its segments) and the first offset used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowOrder {
    key: Option<u64>,
    domain: u64,
    base: u64,
}

/// One rank's epoch.
#[derive(Clone, Debug)]
pub(crate) struct EpochPlan {
    options: PlanOptions,
    segments: Vec<Segment>,
    /// Plans made from pieces: each window's order, and the pieces.
    orders: Option<Vec<WindowOrder>>,
    pieces: Option<Vec<Piece>>,
    /// Start position of each window, plus the total.
    window_starts: Vec<u64>,
    /// First segment of each window, plus the segment count.
    window_segments: Vec<usize>,
    /// Positions this rank yields (rows in batches).
    positions: u64,
}

/// A window: its segments and where its rows start in the rank's sequence.
#[derive(Clone, Debug)]
pub(crate) struct Window<'a> {
    /// Index of the window (read by the plan's tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub index: usize,
    /// Index of its first segment in the plan.
    pub first_segment: usize,
    /// Its segments, in order.
    pub segments: &'a [Segment],
    /// Position of its first row in the rank's sequence.
    pub start: u64,
    /// Rows in the window.
    pub rows: u64,
    permutation: Option<Permutation>,
    /// The window's offsets start here in the permutation's range (a window
    /// of a piece may start inside an old window).
    base: u64,
}

impl Window<'_> {
    /// The window-local rows (in segment order) emitted at window offsets
    /// `from..to`, in offset order: eight positions' rounds side by side
    /// (see [`Permutation::apply_range`]), where one at a time each waits on
    /// its own chain.
    pub fn rows_at(&self, from: u64, to: u64) -> Vec<u64> {
        let Some(p) = &self.permutation else {
            return (self.base + from..self.base + to).collect();
        };
        let mut rows = Vec::with_capacity(to.saturating_sub(from) as usize);
        self.each_chunk(p, None, from, to, |chunk| rows.extend_from_slice(chunk));
        rows
    }

    /// [`Window::rows_at`] of every offset of the window (as `u32`).
    pub fn rows(&self) -> Vec<u32> {
        let Some(p) = &self.permutation else {
            return (self.base as u32..(self.base + self.rows) as u32).collect();
        };
        let mut rows = Vec::with_capacity(self.rows as usize);
        // The rounds as tables when the window is long enough to pay for
        // them (see `Tabulated`).
        let tabulated = (self.rows >= p.len().isqrt())
            .then(|| p.tabulated())
            .flatten();
        self.each_chunk(p, tabulated.as_ref(), 0, self.rows, |chunk| {
            rows.extend(chunk.iter().map(|&r| r as u32))
        });
        rows
    }

    /// The rows at offsets `from..to` by `p` (or its `tabulated` rounds),
    /// handed to `each` up to 1,024 at a time.
    fn each_chunk(
        &self,
        p: &Permutation,
        tabulated: Option<&Tabulated>,
        from: u64,
        to: u64,
        mut each: impl FnMut(&[u64]),
    ) {
        let mut chunk = [0u64; 1024];
        let mut at = from;
        while at < to {
            let n = (to - at).min(chunk.len() as u64) as usize;
            match tabulated {
                Some(t) => t.apply_range(self.base + at, &mut chunk[..n]),
                None => p.apply_range(self.base + at, &mut chunk[..n]),
            }
            each(&chunk[..n]);
            at += n as u64;
        }
    }
}

impl EpochPlan {
    /// The epoch planned.
    pub(crate) fn epoch(&self) -> u64 {
        self.options.epoch
    }

    /// Plan rank `options.rank`'s epoch over `manifest`.
    pub fn new(manifest: &Manifest, options: PlanOptions) -> Self {
        let part_rows = options.part_rows;
        let units: Vec<(u32, u32, u32, u64)> = manifest
            .shards
            .iter()
            .enumerate()
            .flat_map(|(s, shard)| {
                shard
                    .row_groups
                    .iter()
                    .enumerate()
                    .filter(|(_, rows)| **rows > 0)
                    .flat_map(move |(g, &rows)| {
                        parts(rows, part_rows).map(move |(start, end)| {
                            (s as u32, g as u32, start, end - start as u64)
                        })
                    })
            })
            .collect();
        let n_units = units.len() as u64;
        let order = options.shuffle.then(|| {
            Permutation::new(
                n_units,
                hash_words(&[options.seed, options.epoch, 0x756e_6974]),
            )
        });
        let unit_at = |i: u64| units[order.as_ref().map_or(i, |p| p.apply(i)) as usize];
        let total: u64 = units.iter().map(|u| u.3).sum();
        let world = options.world_size.max(1);
        let per_rank = if options.drop_last {
            total / world
        } else {
            total.div_ceil(world)
        };
        let start = options.rank * per_rank;
        let end = start + per_rank;

        // Walk the epoch sequence (wrapping past `total`) from `start` to `end`.
        let mut segments: Vec<Segment> = Vec::new();
        if total > 0 && per_rank > 0 {
            let mut pos = 0u64;
            let mut i = 0u64;
            // Skip whole units before the block; cycles when wrapping.
            let mut remaining_start = start;
            while pos < end {
                let (shard, row_group, first, rows) = unit_at(i % n_units);
                let (lo, hi) = (pos, pos + rows);
                if hi > remaining_start {
                    let a = remaining_start.max(lo) - lo;
                    let b = end.min(hi) - lo;
                    segments.push(Segment {
                        shard,
                        row_group,
                        start: first + a as u32,
                        end: first + b as u32,
                    });
                    remaining_start = hi;
                }
                pos = hi;
                i += 1;
            }
        }
        let window = options.window.max(1);
        if options.shuffle && options.first_slices > 1 && !segments.is_empty() {
            // The first window's segments, split: the first slices of as
            // many of them as `first_heads` says (the heads), then what is
            // left of those and the others whole (the rest).
            let whole = window.min(segments.len());
            let slice_of = |s: &Segment| (s.end - s.start).div_ceil(options.first_slices);
            let sliced = first_heads(
                segments[..whole].iter().map(|s| slice_of(s) as u64),
                options.batch_size as u64,
            );
            let mut heads = Vec::with_capacity(sliced);
            let mut rest = Vec::with_capacity(whole);
            for s in &segments[..sliced] {
                let slice = slice_of(s);
                heads.push(Segment {
                    end: s.start + slice,
                    ..*s
                });
                if s.start + slice < s.end {
                    rest.push(Segment {
                        start: s.start + slice,
                        ..*s
                    });
                }
            }
            rest.extend_from_slice(&segments[sliced..whole]);
            let first = heads.len();
            let split_at = first + rest.len();
            heads.extend(rest);
            heads.extend_from_slice(&segments[whole..]);
            segments = heads;
            // Windows: the heads, the rest, then `window` segments each.
            let mut window_starts = Vec::with_capacity(segments.len().div_ceil(window) + 3);
            let mut window_segments = Vec::with_capacity(segments.len().div_ceil(window) + 3);
            let mut acc = 0u64;
            let mut bounds = vec![0, first, split_at];
            let mut at = split_at;
            while at < segments.len() {
                at = (at + window).min(segments.len());
                bounds.push(at);
            }
            bounds.dedup();
            for pair in bounds.windows(2) {
                window_starts.push(acc);
                window_segments.push(pair[0]);
                acc += segments[pair[0]..pair[1]]
                    .iter()
                    .map(Segment::rows)
                    .sum::<u64>();
            }
            window_starts.push(acc);
            window_segments.push(segments.len());
            debug_assert_eq!(acc, per_rank);
            return Self::finish(options, segments, window_starts, window_segments, per_rank);
        }
        let mut window_starts = Vec::with_capacity(segments.len().div_ceil(window) + 1);
        let mut window_segments = Vec::with_capacity(segments.len().div_ceil(window) + 1);
        let mut acc = 0u64;
        let mut first = 0usize;
        while first < segments.len() {
            let end = (first + window).min(segments.len());
            window_starts.push(acc);
            window_segments.push(first);
            acc += segments[first..end].iter().map(Segment::rows).sum::<u64>();
            first = end;
        }
        window_starts.push(acc);
        window_segments.push(segments.len());
        debug_assert_eq!(acc, per_rank);
        Self::finish(options, segments, window_starts, window_segments, per_rank)
    }

    fn finish(
        options: PlanOptions,
        segments: Vec<Segment>,
        window_starts: Vec<u64>,
        window_segments: Vec<usize>,
        per_rank: u64,
    ) -> Self {
        let positions = if options.drop_last && !options.keep_partial {
            per_rank / options.batch_size as u64 * options.batch_size as u64
        } else {
            per_rank
        };
        EpochPlan {
            options,
            segments,
            orders: None,
            pieces: None,
            window_starts,
            window_segments,
            positions,
        }
    }

    /// The options the plan was made with.
    pub fn options(&self) -> &PlanOptions {
        &self.options
    }

    /// Positions (rows) this rank yields in the epoch.
    pub fn positions(&self) -> u64 {
        self.positions
    }

    /// Batches this rank yields in the epoch.
    pub fn batches(&self) -> u64 {
        self.positions.div_ceil(self.options.batch_size as u64)
    }

    /// Number of windows.
    pub fn window_count(&self) -> usize {
        self.window_starts.len() - 1
    }

    /// All segments, in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The order of window `index`.
    fn order(&self, index: usize) -> WindowOrder {
        if let Some(orders) = &self.orders {
            return orders[index];
        }
        let rows = self.window_starts[index + 1] - self.window_starts[index];
        WindowOrder {
            key: self.options.shuffle.then(|| {
                hash_words(&[
                    self.options.seed,
                    self.options.epoch,
                    self.options.rank,
                    index as u64,
                    0x726f_7773,
                ])
            }),
            domain: rows,
            base: 0,
        }
    }

    /// Window `index`.
    pub fn window(&self, index: usize) -> Window<'_> {
        let (lo, hi) = (self.window_segments[index], self.window_segments[index + 1]);
        let start = self.window_starts[index];
        let rows = self.window_starts[index + 1] - start;
        let order = self.order(index);
        Window {
            index,
            first_segment: lo,
            segments: &self.segments[lo..hi],
            start,
            rows,
            permutation: order.key.map(|k| Permutation::new(order.domain, k)),
            base: order.base,
        }
    }

    /// The plan of a rank whose epoch is `pieces` (see [`Piece`]), in
    /// order; `plan_of(rank, world)` gives the old ranks' plans of the same
    /// epoch. `options` supplies the batch size and `drop_last`.
    pub fn from_pieces(
        options: PlanOptions,
        pieces: &[Piece],
        mut plan_of: impl FnMut(u64, u64) -> EpochPlan,
    ) -> Self {
        let mut plans: Vec<((u64, u64), EpochPlan)> = Vec::new();
        let mut segments = Vec::new();
        let mut window_starts = Vec::new();
        let mut window_segments = Vec::new();
        let mut orders = Vec::new();
        let mut acc = 0u64;
        for piece in pieces {
            let key = (piece.rank, piece.world);
            let at = match plans.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    plans.push((key, plan_of(piece.rank, piece.world)));
                    plans.len() - 1
                }
            };
            let plan = &plans[at].1;
            let end = piece.end.min(plan.positions());
            let mut pos = piece.start;
            while pos < end {
                let w = plan.window_of(pos);
                let window = plan.window(w);
                let order = plan.order(w);
                let stop = end.min(window.start + window.rows);
                window_starts.push(acc);
                window_segments.push(segments.len());
                segments.extend_from_slice(window.segments);
                orders.push(WindowOrder {
                    base: order.base + (pos - window.start),
                    ..order
                });
                acc += stop - pos;
                pos = stop;
            }
        }
        window_starts.push(acc);
        window_segments.push(segments.len());
        let mut plan = Self::finish(options, segments, window_starts, window_segments, acc);
        plan.orders = Some(orders);
        plan.pieces = Some(pieces.to_vec());
        plan
    }

    /// The pieces the plan was made from, if any.
    pub fn pieces(&self) -> Option<&[Piece]> {
        self.pieces.as_deref()
    }

    /// What is left of this plan from position `from`, as pieces.
    #[cfg(test)]
    pub fn remaining(&self, from: u64) -> Vec<Piece> {
        let Some(pieces) = &self.pieces else {
            return if from < self.positions {
                vec![Piece {
                    rank: self.options.rank,
                    world: self.options.world_size,
                    start: from,
                    end: self.positions,
                }]
            } else {
                Vec::new()
            };
        };
        slice(pieces, from, u64::MAX)
    }

    /// The window holding position `position`.
    pub fn window_of(&self, position: u64) -> usize {
        self.window_starts.partition_point(|&s| s <= position) - 1
    }

    /// The (segment index, row within the segment's row group) of position `position`.
    #[cfg(test)]
    pub fn locate(&self, position: u64) -> (usize, u32) {
        let w = self.window_of(position);
        let window = self.window(w);
        let offset = position - window.start;
        let mut row = window.rows_at(offset, offset + 1)[0];
        let first = window.first_segment;
        for (i, seg) in window.segments.iter().enumerate() {
            if row < seg.rows() {
                return (first + i, seg.start + row as u32);
            }
            row -= seg.rows();
        }
        unreachable!("position {position} lies in window {w}")
    }
}

/// A segment, for tests.
#[cfg(test)]
pub(crate) fn test_segment(shard: u32, row_group: u32, start: u32, end: u32) -> Segment {
    Segment {
        shard,
        row_group,
        start,
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shardfeed_format::{Crc32, ShardEntry, WriteOptions};

    fn manifest(layout: &[Vec<u64>]) -> Manifest {
        let shards = layout
            .iter()
            .enumerate()
            .map(|(i, groups)| ShardEntry {
                path: shardfeed_format::shard_path(i),
                rows: groups.iter().sum(),
                bytes: 1000,
                row_groups: groups.clone(),
                footer_len: 100,
                footer_crc32: Crc32(0),
                crc32: Some(Crc32(0)),
                base: None,
                fingerprint: None,
                chunk_checksums: None,
                page_checksums: None,
            })
            .collect();
        Manifest::new(
            arrow_schema::Schema::empty(),
            WriteOptions {
                compression: "zstd".into(),
                zstd_level: 3,
                shard_size: 1,
                row_group_rows: None,
                row_group_bytes: None,
                large_row_group_bytes: None,
                shuffle_seed: None,
                tokenizer: None,
            },
            shards,
            0,
        )
    }

    /// Global row ids (shard, row group, row) -> a single number.
    fn row_ids(m: &Manifest, plan: &EpochPlan) -> Vec<u64> {
        let mut base = vec![];
        let mut acc = 0;
        for s in &m.shards {
            let mut groups = vec![];
            for g in &s.row_groups {
                groups.push(acc);
                acc += g;
            }
            base.push(groups);
        }
        (0..plan.positions())
            .map(|p| {
                let (seg, row) = plan.locate(p);
                let s = plan.segments()[seg];
                base[s.shard as usize][s.row_group as usize] + row as u64
            })
            .collect()
    }

    #[test]
    fn row_groups_are_cut_into_near_equal_parts() {
        let cut = |rows, part| super::parts(rows, part).collect::<Vec<_>>();
        assert_eq!(cut(10, 0), [(0, 10)]);
        assert_eq!(cut(10, 10), [(0, 10)]);
        assert_eq!(cut(10, 4), [(0, 3), (3, 6), (6, 10)]);
        assert_eq!(cut(7, 1).len(), 7);
    }

    proptest! {
        #[test]
        fn ranks_partition_each_epoch_exactly(
            layout in prop::collection::vec(prop::collection::vec(0u64..40, 1..4), 1..6),
            world in 1u64..9,
            batch in 1usize..17,
            window in 1usize..5,
            shuffle: bool,
            drop_last: bool,
            seed in 0u64..1000,
            first_slices in 0u32..10,
            part_rows in 0u64..12,
        ) {
            let m = manifest(&layout);
            let total = m.total_rows;
            let mut seen = vec![0u32; total as usize];
            let mut batches = None;
            for rank in 0..world {
                let plan = EpochPlan::new(&m, PlanOptions { seed, epoch: 1, rank, world_size: world, shuffle, window, batch_size: batch, drop_last, first_slices, keep_partial: false, part_rows });
                // Every rank yields the same number of batches.
                prop_assert_eq!(*batches.get_or_insert(plan.batches()), plan.batches());
                for id in row_ids(&m, &plan) {
                    seen[id as usize] += 1;
                }
            }
            if drop_last {
                // Dropped: the cross-rank remainder, then each rank's partial batch.
                let per_rank = total / world;
                let kept = per_rank / batch as u64 * batch as u64 * world;
                prop_assert!(seen.iter().all(|&c| c <= 1));
                prop_assert_eq!(seen.iter().filter(|&&c| c == 1).count() as u64, kept);
            } else {
                // Padded: every row at least once; wrapping repeats rows evenly.
                let padded_total = total.div_ceil(world) * world;
                prop_assert_eq!(seen.iter().map(|&c| c as u64).sum::<u64>(), padded_total);
                if let (Some(min), Some(max)) = (seen.iter().min(), seen.iter().max()) {
                    prop_assert!(*min >= 1 && max - min <= 1);
                }
            }
        }

        #[test]
        fn the_same_inputs_give_the_same_order(
            layout in prop::collection::vec(prop::collection::vec(1u64..50, 1..4), 1..5),
            seed in 0u64..100,
        ) {
            let m = manifest(&layout);
            let opts = PlanOptions { seed, epoch: 3, rank: 0, world_size: 1, shuffle: true, window: 2, batch_size: 4, drop_last: false, first_slices: 4, keep_partial: false, part_rows: 0 };
            let a = row_ids(&m, &EpochPlan::new(&m, opts.clone()));
            let b = row_ids(&m, &EpochPlan::new(&m, opts));
            prop_assert_eq!(a, b);
        }
    }

    proptest! {
        /// Pieces of old ranks' sequences, replanned: the new plan yields
        /// exactly the old ranks' rows at those positions, in order, and its
        /// remaining pieces from any position do too.
        #[test]
        fn plans_from_pieces_yield_the_old_ranks_rows(
            layout in prop::collection::vec(prop::collection::vec(1u64..40, 1..4), 1..6),
            world in 1u64..5,
            window in 1usize..4,
            cuts in prop::collection::vec((0u64..200, 0u64..200), 1..6),
            from in 0u64..300,
            first_slices in 0u32..9,
        ) {
            let m = manifest(&layout);
            let opts = |rank, world| PlanOptions { seed: 3, epoch: 2, rank, world_size: world, shuffle: true, window, batch_size: 4, drop_last: true, first_slices, keep_partial: true, part_rows: 0 };
            let plan_of = |rank, world| EpochPlan::new(&m, opts(rank, world));
            let pieces: Vec<Piece> = cuts.iter().enumerate().map(|(i, &(a, b))| {
                let rank = i as u64 % world;
                let n = plan_of(rank, world).positions();
                let (a, b) = (a.min(n), b.min(n));
                Piece { rank, world, start: a.min(b), end: a.max(b) }
            }).collect();
            let expected: Vec<u64> = pieces.iter().flat_map(|p| {
                let ids = row_ids(&m, &plan_of(p.rank, p.world));
                ids[p.start as usize..p.end as usize].to_vec()
            }).collect();
            let plan = EpochPlan::from_pieces(opts(0, 1), &pieces, plan_of);
            prop_assert_eq!(row_ids(&m, &plan), expected.clone());
            let from = from.min(plan.positions());
            let rest = EpochPlan::from_pieces(opts(0, 1), &plan.remaining(from), plan_of);
            prop_assert_eq!(row_ids(&m, &rest), expected[from as usize..].to_vec());
        }
    }

    /// No ramp-up: the first window's row groups are split into their first
    /// slices (one window, drawing from all of them) and the rest (a second);
    /// every later window holds `window` row groups.
    #[test]
    fn the_first_window_is_split_into_slices_of_all_its_row_groups() {
        let m = manifest(&vec![vec![16; 50]; 4]);
        let plan = EpochPlan::new(
            &m,
            PlanOptions {
                seed: 1,
                epoch: 0,
                rank: 0,
                world_size: 1,
                shuffle: true,
                window: 4,
                batch_size: 7,
                drop_last: false,
                first_slices: 8,
                keep_partial: false,
                part_rows: 0,
            },
        );
        let windows: Vec<Window> = (0..plan.window_count()).map(|w| plan.window(w)).collect();
        assert_eq!(windows[0].segments.len(), 4);
        assert!(
            windows[0]
                .segments
                .iter()
                .all(|s| s.start == 0 && s.end == 2)
        );
        assert_eq!(windows[1].segments.len(), 4);
        assert!(
            windows[1]
                .segments
                .iter()
                .all(|s| s.start == 2 && s.end == 16)
        );
        let units = |w: &Window| {
            let mut u: Vec<_> = w.segments.iter().map(|s| (s.shard, s.row_group)).collect();
            u.sort();
            u
        };
        assert_eq!(units(&windows[0]), units(&windows[1]));
        assert!(
            windows[2..]
                .iter()
                .all(|w| w.segments.len() == 4 || w.index == windows.len() - 1)
        );
        let mut ids = row_ids(&m, &plan);
        ids.sort();
        assert_eq!(ids, (0..3200).collect::<Vec<_>>());
    }

    /// Where two batches fit in the first slices of fewer row groups than a
    /// window holds, only those are sliced (at least two): the first batches
    /// wait for two row groups' fetches, not a whole window's; the rest of
    /// the window (their tails and the other row groups whole) comes next.
    #[test]
    fn only_as_many_row_groups_are_sliced_as_the_first_batches_need() {
        let m = manifest(&vec![vec![80; 20]; 2]);
        let opts = |batch_size| PlanOptions {
            seed: 4,
            epoch: 1,
            rank: 0,
            world_size: 1,
            shuffle: true,
            window: 8,
            batch_size,
            drop_last: false,
            first_slices: 8,
            keep_partial: false,
            part_rows: 0,
        };
        // Slices of 10 rows: batches of 7 need two row groups (14 rows),
        // of 15 three (30 rows), of 50 all eight.
        for (batch, sliced) in [(1, 2), (7, 2), (10, 2), (15, 3), (50, 8), (4000, 8)] {
            let plan = EpochPlan::new(&m, opts(batch));
            let heads = plan.window(0).segments;
            let rest = plan.window(1).segments;
            assert_eq!(heads.len(), sliced, "batch {batch}");
            assert!(heads.iter().all(|s| s.start == 0 && s.end == 10));
            assert_eq!(rest.len(), 8, "batch {batch}");
            let (tails, whole) = rest.split_at(sliced);
            for (h, t) in heads.iter().zip(tails) {
                assert_eq!(
                    (t.shard, t.row_group, t.start, t.end),
                    (h.shard, h.row_group, 10, 80)
                );
            }
            assert!(whole.iter().all(|s| s.start == 0 && s.end == 80));
            assert!((2..plan.window_count()).all(|w| plan.window(w).segments.len() == 8));
            let mut ids = row_ids(&m, &plan);
            ids.sort();
            assert_eq!(ids, (0..3200).collect::<Vec<_>>());
        }
    }

    #[test]
    fn epochs_change_the_order_and_no_shuffle_keeps_input_order() {
        let m = manifest(&[vec![100, 100], vec![100, 50]]);
        let opts = |epoch, shuffle| PlanOptions {
            seed: 9,
            epoch,
            rank: 0,
            world_size: 1,
            shuffle,
            window: 2,
            batch_size: 10,
            drop_last: false,
            first_slices: 8,
            keep_partial: false,
            part_rows: 0,
        };
        let e0 = row_ids(&m, &EpochPlan::new(&m, opts(0, true)));
        let e1 = row_ids(&m, &EpochPlan::new(&m, opts(1, true)));
        assert_ne!(e0, e1);
        let mut sorted = e0.clone();
        sorted.sort();
        assert_eq!(sorted, (0..350).collect::<Vec<_>>());
        let plain = row_ids(&m, &EpochPlan::new(&m, opts(0, false)));
        assert_eq!(plain, (0..350).collect::<Vec<_>>());
    }

    /// A window's rows at any range of offsets are the same rows as the
    /// whole window's, one permutation evaluation at a time, shuffled or not.
    #[test]
    fn rows_at_a_range_of_offsets_are_the_windows_rows() {
        let m = manifest(&[vec![1000, 700], vec![1300, 5]]);
        for shuffle in [true, false] {
            #[rustfmt::skip]
            let opts = PlanOptions { seed: 4, epoch: 2, rank: 0, world_size: 1, shuffle, window: 3, batch_size: 10, drop_last: false, first_slices: 8, keep_partial: false, part_rows: 0 };
            let plan = EpochPlan::new(&m, opts);
            for w in 0..plan.window_count() {
                let window = plan.window(w);
                let all: Vec<u64> = window.rows().into_iter().map(u64::from).collect();
                let p = window.permutation.as_ref();
                for (i, &row) in all.iter().enumerate() {
                    let one = p.map_or(window.base + i as u64, |p| p.apply(window.base + i as u64));
                    assert_eq!(row, one, "window {w} offset {i}");
                }
                let n = window.rows;
                for (from, to) in [(0, n), (1, 1), (3, 1030), (n - 1, n)] {
                    let (from, to) = (from.min(n), to.min(n));
                    assert_eq!(window.rows_at(from, to), all[from as usize..to as usize]);
                }
            }
        }
    }
}

#[cfg(test)]
mod golden {
    use super::*;
    use shardfeed_format::{Crc32, ShardEntry, WriteOptions};

    fn layout() -> Manifest {
        let shards = [vec![10u64, 7], vec![5], vec![12, 3]]
            .iter()
            .enumerate()
            .map(|(i, groups)| ShardEntry {
                path: shardfeed_format::shard_path(i),
                rows: groups.iter().sum(),
                bytes: 1000,
                row_groups: groups.clone(),
                footer_len: 100,
                footer_crc32: Crc32(0),
                crc32: Some(Crc32(0)),
                base: None,
                fingerprint: None,
                chunk_checksums: None,
                page_checksums: None,
            })
            .collect();
        Manifest::new(
            arrow_schema::Schema::empty(),
            WriteOptions {
                compression: "zstd".into(),
                zstd_level: 3,
                shard_size: 1,
                row_group_rows: None,
                row_group_bytes: None,
                large_row_group_bytes: None,
                shuffle_seed: None,
                tokenizer: None,
            },
            shards,
            0,
        )
    }

    /// Global ids (rows numbered shard by shard) of a rank's epoch.
    fn ids(seed: u64, epoch: u64, rank: u64, world: u64) -> Vec<u64> {
        ids_with(seed, epoch, rank, world, 2, 4)
    }

    /// [`ids`] with another window and batch size.
    fn ids_with(
        seed: u64,
        epoch: u64,
        rank: u64,
        world: u64,
        window: usize,
        batch_size: usize,
    ) -> Vec<u64> {
        let m = layout();
        let plan = EpochPlan::new(
            &m,
            PlanOptions {
                seed,
                epoch,
                rank,
                world_size: world,
                shuffle: true,
                window,
                batch_size,
                drop_last: true,
                first_slices: 8,
                keep_partial: false,
                part_rows: 0,
            },
        );
        let mut base = Vec::new();
        let mut acc = 0;
        for s in &m.shards {
            base.push(
                s.row_groups
                    .iter()
                    .map(|g| {
                        acc += g;
                        acc - g
                    })
                    .collect::<Vec<_>>(),
            );
        }
        (0..plan.positions())
            .map(|p| {
                let (seg, row) = plan.locate(p);
                let s = plan.segments()[seg];
                base[s.shard as usize][s.row_group as usize] + row as u64
            })
            .collect()
    }

    /// The order of four fixed (seed, epoch, rank, world size), pinned:
    /// saved states resume by position, so a change to the order must bump
    /// `PLAN_VERSION` (old states are then refused) and these values with it.
    #[test]
    fn orders_for_fixed_seeds_are_pinned() {
        assert_eq!(
            crate::state::PLAN_VERSION,
            4,
            "update the pinned orders with the version"
        );
        // Which epochs slice their first window (version 4: every one of a
        // dataset shuffled at shard time with more row groups per rank than
        // the heads; version 3 asked for two windows per rank).
        for (shuffled, groups, world, sliced) in [
            (true, 3, 1, true),
            (true, 2, 1, false),
            (true, 8, 3, false),
            (true, 9, 3, true),
            (false, 1000, 1, false),
        ] {
            assert_eq!(
                slices_first_window(shuffled, groups, world),
                sliced,
                "{groups} row groups, {world} ranks, shuffled at shard time: {shuffled}"
            );
        }
        // (seed, epoch, rank, world size) -> the rank's rows, in order.
        type Case = ((u64, u64, u64, u64), &'static [u64]);
        let pinned: [Case; 4] = [
            (
                (0, 0, 0, 1),
                &[
                    10, 17, 21, 14, 19, 11, 18, 12, 13, 15, 20, 16, 22, 23, 31, 30, 36, 35, 29, 33,
                    27, 25, 28, 34, 32, 26, 24, 4, 0, 8, 5, 6, 9, 1, 2, 3,
                ],
            ),
            (
                (7, 3, 0, 1),
                &[
                    34, 10, 36, 35, 11, 16, 14, 13, 15, 12, 1, 7, 25, 4, 5, 31, 30, 6, 29, 9, 27,
                    22, 32, 8, 28, 33, 3, 23, 2, 26, 0, 24, 20, 19, 21, 17,
                ],
            ),
            (
                (7, 3, 1, 2),
                &[30, 1, 0, 32, 3, 2, 8, 5, 6, 33, 31, 9, 4, 7, 18, 20],
            ),
            (
                (123456789, 1, 2, 3),
                &[1, 14, 0, 2, 3, 15, 16, 4, 5, 6, 7, 8],
            ),
        ];
        for ((seed, epoch, rank, world), expected) in pinned {
            assert_eq!(
                ids(seed, epoch, rank, world),
                expected,
                "seed {seed} epoch {epoch} rank {rank}/{world}"
            );
        }
        // A first window of five row groups of which two are sliced (plan
        // version 3; version 2 sliced all five).
        assert_eq!(ids_with(5, 0, 0, 1, 5, 1), PINNED_FEW_HEADS);
    }

    /// Heads `[10, 17]`: the first slices (one row each) of the first two
    /// row groups in the epoch's order; then the rest of the window.
    const PINNED_FEW_HEADS: &[u64] = &[
        10, 17, 35, 18, 4, 20, 14, 11, 16, 6, 19, 13, 9, 15, 12, 3, 1, 2, 34, 25, 0, 23, 24, 8, 21,
        31, 27, 32, 36, 33, 5, 28, 22, 26, 30, 29, 7,
    ];
}
