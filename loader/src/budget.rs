//! The memory policy: how the byte budget, the row groups' sizes and the
//! batch's size give the shuffle window, the row groups held, the bytes read
//! ahead and the slab pool. Pure arithmetic (saturating: every size here may
//! come from a manifest or a footer), assembled by [`crate::build`].

use crate::config::{
    DEFAULT_PREFETCH_BATCHES, DEFAULT_PREFETCH_BYTES, DEFAULT_WINDOW, MAX_AUTO_WINDOW,
    MIN_FITTED_WINDOW,
};

/// Slabs beyond the prefetched batches: the batch being collated, the one
/// the consumer holds, and the one it just dropped.
pub(crate) const SPARE_SLABS: usize = 3;

/// The pool may be at most this many times the byte budget.
pub(crate) const POOL_BUDGETS: u64 = 4;

/// The least the loader reads ahead, whatever the row groups' size.
pub(crate) const MIN_IN_FLIGHT: u64 = 1 << 20;

/// The smallest slab.
pub(crate) const MIN_SLAB: usize = 64 << 10;

/// What the row-group side of the policy follows from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// The byte budget.
    pub byte_budget: u64,
    /// Projected bytes (fetched + decoded) of an average row group.
    pub unit_bytes: u64,
    /// Row groups in the dataset (at least 1).
    pub units: u64,
    /// Row groups one batch can touch: [`batch_groups`].
    pub batch_groups: u64,
    /// The window of a dataset shuffled at shard time when the budget holds
    /// two of it: [`DEFAULT_WINDOW`], or a mixture's source's share of it
    /// ([`shared_window`]).
    pub fitted_window: usize,
}

/// The default window of a mixture's source shuffled at shard time whose
/// share of the mixture's rows is `share`: its share of [`DEFAULT_WINDOW`]'s
/// row groups, at least [`MIN_FITTED_WINDOW`]. The sources together then
/// hold about what one loader holds (two windows each): three sources
/// weighted 0.6/0.3/0.1 get windows of 5, 2 and 2 (18 row groups held
/// against 16), not 8 each (48), whose first touches cost a short run a
/// tenth of its rate on a VM that clears every fresh page.
pub(crate) fn shared_window(share: f64) -> usize {
    shared_window_of(share, DEFAULT_WINDOW as f64)
}

/// [`shared_window`] for a source that hands its rows on uncollated
/// ([`crate::collate::Handoff`]): the batches in flight reach back to about
/// one window more, so its share is of two thirds of [`DEFAULT_WINDOW`]
/// (one packed dataset: 5, holding about what one loader's two windows of 8
/// hold).
pub(crate) fn handoff_window(share: f64) -> usize {
    shared_window_of(share, DEFAULT_WINDOW as f64 * 2.0 / 3.0)
}

fn shared_window_of(share: f64, of: f64) -> usize {
    let w = (of * share).round();
    if w.is_nan() {
        return MIN_FITTED_WINDOW;
    }
    (w as usize).clamp(MIN_FITTED_WINDOW, DEFAULT_WINDOW)
}

/// Row groups a batch of `batch_size` rows can touch when the smallest row
/// group holds `min_group_rows` rows: its rows' groups, plus one where it
/// starts inside a group.
pub(crate) fn batch_groups(batch_size: usize, min_group_rows: u64) -> u64 {
    (batch_size as u64)
        .div_ceil(min_group_rows.max(1))
        .saturating_add(1)
}

impl Shape {
    /// Row groups the collator holds at once with windows of `window` row
    /// groups: two windows and the rest of a batch's row groups, never more
    /// than the dataset has (but at least two windows' worth, which a
    /// window's order is drawn over).
    pub(crate) fn needed(&self, window: usize) -> u64 {
        let two = (window as u64).saturating_mul(2);
        two.saturating_add(self.batch_groups.saturating_sub(1))
            .min(self.units.max(two))
    }

    /// Whether the budget holds what windows of `window` row groups need.
    pub(crate) fn fits(&self, window: usize) -> bool {
        self.unit_bytes.saturating_mul(self.needed(window)) <= self.byte_budget
    }

    /// The window when none was asked for. A dataset shuffled at shard time
    /// (or read in order, `fitted`): `fitted_window`, or as large as the budget
    /// holds two of, down to [`MIN_FITTED_WINDOW`] (below it the default,
    /// which the budget check then refuses by name). Otherwise the windows
    /// alone mix the rows: a quarter of the budget's row groups, from the
    /// default up to [`MAX_AUTO_WINDOW`].
    pub(crate) fn auto_window(&self, fitted: bool) -> usize {
        if fitted {
            let default = self.fitted_window.clamp(MIN_FITTED_WINDOW, DEFAULT_WINDOW);
            return (MIN_FITTED_WINDOW..=default)
                .rev()
                .find(|&w| self.fits(w))
                .unwrap_or(default);
        }
        usize::try_from(self.byte_budget / 4 / self.unit_bytes.max(1))
            .unwrap_or(MAX_AUTO_WINDOW)
            .clamp(DEFAULT_WINDOW, MAX_AUTO_WINDOW)
    }

    /// Bytes fetched or decoded ahead at most: the `needed` row groups, an
    /// `extra` window's, and two per decode thread; within the budget, and
    /// at least [`MIN_IN_FLIGHT`] (or the budget, if smaller).
    pub(crate) fn in_flight(&self, needed: u64, extra: u64, decode_threads: usize) -> u64 {
        let useful = self.unit_bytes.saturating_mul(
            needed
                .saturating_add(extra)
                .saturating_add((decode_threads as u64).saturating_mul(2)),
        );
        self.byte_budget.min(useful.max(MIN_IN_FLIGHT))
    }
}

/// The most parts a row group is cut into.
pub(crate) const MAX_PARTS: u64 = 1 << 12;

/// Parts of at most how many rows the row groups of `shape` (of `rows`
/// rows on average) are read in so that what `window_of` windows touch fits
/// the budget: the fewest parts (doubling) that fit, each costing its share
/// of the row group and `overhead` more; with the shape of those parts.
/// `None` when even parts of one row, or [`MAX_PARTS`] parts, do not fit.
pub(crate) fn parts(
    shape: &Shape,
    rows: u64,
    overhead: u64,
    batch_size: usize,
    window_of: impl Fn(&Shape) -> usize,
) -> Option<(u64, Shape)> {
    cuts(shape, rows, overhead, batch_size).find(|(_, cut)| cut.fits(window_of(cut)))
}

/// The row groups of `shape` (`rows` on average) cut in 2, 4, 8, ... parts,
/// up to parts of one row or [`MAX_PARTS`] parts: each cut's rows a part and
/// the shape of its parts.
fn cuts(
    shape: &Shape,
    rows: u64,
    overhead: u64,
    batch_size: usize,
) -> impl Iterator<Item = (u64, Shape)> + '_ {
    let ks =
        std::iter::successors(Some(2u64), |&k| k.checked_mul(2)).take_while(|&k| k <= MAX_PARTS);
    let mut done = false;
    ks.map_while(move |k| {
        if done {
            return None;
        }
        let part = rows.div_ceil(k).max(1);
        done = part == 1;
        let cut = Shape {
            unit_bytes: (shape.unit_bytes / k)
                .saturating_add(overhead)
                .min(shape.unit_bytes),
            units: shape.units.saturating_mul(k),
            // A row group's parts hold at least half `part` rows each.
            batch_groups: batch_groups(batch_size, (part / 2).max(1)),
            ..*shape
        };
        Some((part, cut))
    })
}

/// The shape of parts of `part_rows` rows, when [`parts`] cuts `shape`'s row
/// groups (`rows` on average) into parts of that many rows; `None` for any
/// other count (a state's, from another dataset or forged).
pub(crate) fn parts_of(
    shape: &Shape,
    rows: u64,
    overhead: u64,
    batch_size: usize,
    part_rows: u64,
) -> Option<Shape> {
    cuts(shape, rows, overhead, batch_size)
        .find(|&(part, _)| part == part_rows)
        .map(|(_, cut)| cut)
}

/// Batches collated ahead by default: as many as [`DEFAULT_PREFETCH_BYTES`]
/// hold, 2 to [`DEFAULT_PREFETCH_BATCHES`].
pub(crate) fn default_prefetch(batch_bytes: u64) -> usize {
    usize::try_from(DEFAULT_PREFETCH_BYTES / batch_bytes.max(1))
        .unwrap_or(usize::MAX)
        .clamp(2, DEFAULT_PREFETCH_BATCHES)
}

/// Slabs of a pool for `prefetch` batches ahead.
pub(crate) fn slabs(prefetch: usize) -> usize {
    prefetch.saturating_add(SPARE_SLABS)
}

/// `slabs` and as many of `transform_slabs` more (slabs for a user
/// transform's outputs) as stay within the budget ([`pool_fits`]).
pub(crate) fn with_transform_slabs(
    slabs: usize,
    slab_bytes: usize,
    transform_slabs: usize,
    byte_budget: u64,
) -> usize {
    (1..=transform_slabs)
        .rev()
        .map(|extra| slabs.saturating_add(extra))
        .find(|&all| pool_fits(slab_bytes, all, byte_budget))
        .unwrap_or(slabs)
}

/// Whether `slabs` slabs of `slab_bytes` stay within [`POOL_BUDGETS`] times
/// the budget.
pub(crate) fn pool_fits(slab_bytes: usize, slabs: usize, byte_budget: u64) -> bool {
    (slab_bytes as u64).saturating_mul(slabs as u64) <= byte_budget.saturating_mul(POOL_BUDGETS)
}

/// The most bytes each of `slabs` slabs may grow to when batches come out
/// larger than estimated ([`crate::pinned::Pool::grow_for`]): the pool
/// within [`POOL_BUDGETS`] times `byte_budget`, as [`pool_fits`] asks.
pub(crate) fn max_slab_bytes(slabs: usize, byte_budget: u64) -> usize {
    let all = byte_budget.saturating_mul(POOL_BUDGETS);
    usize::try_from(all / slabs.max(1) as u64).unwrap_or(usize::MAX)
}

/// Bytes per slab for batches estimated at `batch_bytes`, of which
/// `image_bytes` are decoded images (exactly their size); `fixed_bytes` when
/// every column has a fixed width (the batch's exact size). Otherwise twice
/// the rest of the estimate, for what varies from batch to batch (lists,
/// strings). At least [`MIN_SLAB`].
pub(crate) fn slab_bytes(batch_bytes: u64, image_bytes: u64, fixed_bytes: Option<u64>) -> usize {
    let bytes = match fixed_bytes {
        Some(exact) => exact,
        None => batch_bytes
            .saturating_sub(image_bytes)
            .saturating_mul(2)
            .saturating_add(image_bytes),
    };
    usize::try_from(bytes).unwrap_or(usize::MAX).max(MIN_SLAB)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn shape(budget_mib: u64, unit_mib: u64, units: u64, batch_groups: u64) -> Shape {
        Shape {
            byte_budget: budget_mib * MIB,
            unit_bytes: unit_mib * MIB,
            units,
            batch_groups,
            fitted_window: DEFAULT_WINDOW,
        }
    }

    #[test]
    fn a_batch_touches_its_rows_groups_and_one_more() {
        assert_eq!(batch_groups(256, 1000), 2);
        assert_eq!(batch_groups(1000, 1000), 2);
        assert_eq!(batch_groups(1001, 1000), 3);
        // Empty row groups do not divide by zero.
        assert_eq!(batch_groups(4, 0), 5);
        assert_eq!(batch_groups(usize::MAX, 1), u64::MAX);
    }

    #[test]
    fn two_windows_and_a_batch_are_held_within_the_dataset() {
        let s = shape(1024, 8, 1000, 3);
        assert_eq!(s.needed(8), 16 + 2);
        // A dataset of 10 row groups: never more than it has...
        let small = shape(1024, 8, 10, 3);
        assert_eq!(small.needed(8), 16);
        assert_eq!(small.needed(2), 6);
        // ... but two windows are drawn over even when it has fewer.
        assert_eq!(shape(1024, 8, 1, 1).needed(2), 4);
        assert_eq!(s.needed(usize::MAX), u64::MAX);
    }

    #[test]
    fn a_states_parts_give_the_shape_parts_chose_and_no_other() {
        // Row groups of 128 MiB and 40,000 rows in a 256 MiB budget, windows of 8.
        let whole = shape(256, 128, 4, 2);
        let (rows, cut) = parts(&whole, 40_000, 1 << 20, 97, |_| 8).expect("parts fit");
        let again = parts_of(&whole, 40_000, 1 << 20, 97, rows).expect("its own count");
        assert_eq!(
            (again.unit_bytes, again.units, again.batch_groups),
            (cut.unit_bytes, cut.units, cut.batch_groups)
        );
        assert!(parts_of(&whole, 40_000, 1 << 20, 97, rows + 1).is_none());
        assert!(parts_of(&whole, 40_000, 1 << 20, 97, u64::MAX).is_none());
    }

    #[test]
    fn the_budget_holds_what_is_needed_or_the_window_does_not_fit() {
        // 18 row groups of 8 MiB: 144 MiB.
        assert!(shape(144, 8, 1000, 3).fits(8));
        assert!(!shape(143, 8, 1000, 3).fits(8));
        // A forged row-group size saturates instead of wrapping to "fits".
        let forged = Shape {
            unit_bytes: u64::MAX / 2,
            ..shape(1024, 8, 1000, 3)
        };
        assert!(!forged.fits(8));
    }

    #[test]
    fn mixture_sources_share_the_default_window_by_weight() {
        assert_eq!(shared_window(0.6), 5);
        assert_eq!(shared_window(0.3), 2);
        assert_eq!(shared_window(0.1), 2);
        assert_eq!(shared_window(0.5), 4);
        assert_eq!(shared_window(1.0), DEFAULT_WINDOW);
        assert_eq!(shared_window(0.0), MIN_FITTED_WINDOW);
        assert_eq!(shared_window(f64::NAN), MIN_FITTED_WINDOW);
        assert_eq!(shared_window(f64::INFINITY), DEFAULT_WINDOW);
        assert_eq!(handoff_window(1.0), 5);
        assert_eq!(handoff_window(0.6), 3);
        assert_eq!(handoff_window(0.1), MIN_FITTED_WINDOW);
        // The shared window, or as many as the budget holds two of.
        let five = Shape {
            fitted_window: 5,
            ..shape(1024, 8, 1000, 2)
        };
        assert_eq!(five.auto_window(true), 5);
        let tight = Shape {
            byte_budget: 64 * MIB,
            ..five
        };
        assert_eq!(tight.auto_window(true), 3);
        // Data not shuffled at shard time: the budget's quarter, as before.
        assert_eq!(
            five.auto_window(false),
            shape(1024, 8, 1000, 2).auto_window(false)
        );
    }

    #[test]
    fn windows_shrink_to_the_budget_when_rows_were_shuffled_at_shard_time() {
        // 8 MiB row groups: 128 MiB holds windows of 7 (14 + 1 groups).
        assert_eq!(shape(128, 8, 1000, 2).auto_window(true), 7);
        assert_eq!(shape(1024, 8, 1000, 2).auto_window(true), DEFAULT_WINDOW);
        assert_eq!(shape(40, 8, 1000, 2).auto_window(true), 2);
        // Too small for windows of 2: the default, refused by the check.
        let tiny = shape(32, 8, 1000, 2);
        assert_eq!(tiny.auto_window(true), DEFAULT_WINDOW);
        assert!(!tiny.fits(DEFAULT_WINDOW));
    }

    #[test]
    fn windows_grow_with_the_budget_when_they_alone_mix_the_rows() {
        // A quarter of the budget's row groups: 4 GiB of 8 MiB groups -> 128.
        assert_eq!(shape(4096, 8, 100_000, 2).auto_window(false), 128);
        assert_eq!(shape(64, 8, 100_000, 2).auto_window(false), DEFAULT_WINDOW);
        assert_eq!(
            shape(1 << 30, 1, 100_000, 2).auto_window(false),
            MAX_AUTO_WINDOW
        );
        // Empty row groups do not divide by zero.
        assert_eq!(shape(64, 0, 10, 2).auto_window(false), MAX_AUTO_WINDOW);
    }

    #[test]
    fn reads_ahead_stay_within_the_budget_and_above_a_mebibyte() {
        let s = shape(1024, 8, 1000, 2);
        // 17 held + 8 ahead + 2 x 2 threads = 29 groups of 8 MiB.
        assert_eq!(s.in_flight(17, 8, 2), 29 * 8 * MIB);
        assert_eq!(shape(100, 8, 1000, 2).in_flight(17, 8, 2), 100 * MIB);
        let small = Shape {
            unit_bytes: 10,
            ..s
        };
        assert_eq!(small.in_flight(17, 0, 2), MIN_IN_FLIGHT);
        let tiny_budget = Shape {
            byte_budget: 1000,
            ..small
        };
        assert_eq!(tiny_budget.in_flight(17, 0, 2), 1000);
        assert_eq!(s.in_flight(u64::MAX, u64::MAX, usize::MAX), s.byte_budget);
    }

    #[test]
    fn the_pool_prefetches_by_bytes_and_stays_within_four_budgets() {
        assert_eq!(default_prefetch(0), DEFAULT_PREFETCH_BATCHES);
        assert_eq!(default_prefetch(MIB), DEFAULT_PREFETCH_BATCHES);
        assert_eq!(default_prefetch(32 * MIB), 4);
        assert_eq!(default_prefetch(u64::MAX), 2);
        assert_eq!(slabs(4), 7);
        assert_eq!(slabs(usize::MAX), usize::MAX);
        assert!(pool_fits(1 << 20, 16, 4 * MIB));
        assert!(!pool_fits((1 << 20) + 1, 16, 4 * MIB));
        assert!(!pool_fits(usize::MAX, usize::MAX, u64::MAX / 8));
    }

    #[test]
    fn slabs_hold_twice_what_varies_and_exactly_what_does_not() {
        assert_eq!(slab_bytes(10 * MIB, 0, None), (20 * MIB) as usize);
        // Decoded images are counted once.
        assert_eq!(slab_bytes(10 * MIB, 6 * MIB, None), (14 * MIB) as usize);
        assert_eq!(slab_bytes(10 * MIB, 0, Some(3 * MIB)), (3 * MIB) as usize);
        assert_eq!(slab_bytes(1, 0, None), MIN_SLAB);
        assert_eq!(slab_bytes(u64::MAX, 0, None), usize::MAX);
    }
}
