//! Seeded, stateless randomness shared by both halves of shardfeed.
//!
//! Orders are computed by arithmetic rather than by buffers: [`Permutation`]
//! maps position `k` of a sequence to an index with no history (a Feistel
//! network over the index bits, cycle-walked into range), so a shuffled order
//! takes O(1) state and position `k` can be found without visiting `0..k`.

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hash several words into one, order-sensitive.
pub fn hash_words(words: &[u64]) -> u64 {
    words
        .iter()
        .fold(0x243f_6a88_85a3_08d3, |acc, &w| mix64(acc ^ mix64(w)))
}

/// A small, fast seeded generator (SplitMix64) for Fisher-Yates shuffles.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose stream is a pure function of `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0.wrapping_sub(0x9e37_79b9_7f4a_7c15))
    }

    /// A uniform integer in `0..bound` (`bound > 0`), without modulo bias.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        // Lemire's multiply-shift with rejection.
        loop {
            let r = self.next_u64();
            let m = (r as u128) * (bound as u128);
            let low = m as u64;
            if low >= bound.wrapping_neg() % bound {
                return (m >> 64) as u64;
            }
        }
    }

    /// Shuffle `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// A seeded bijection on `0..len`, evaluated one position at a time.
///
/// A balanced Feistel network on the smallest even number of bits covering
/// `len`, with cycle walking to stay inside `0..len`. Each evaluation costs a
/// few rounds of [`mix64`]; walking needs fewer than 4 steps on average.
#[derive(Clone, Debug)]
pub struct Permutation {
    len: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `0..len` selected by `seed`.
    pub fn new(len: u64, seed: u64) -> Self {
        let bits = 64 - len.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut rng = SplitMix64::new(seed);
        let keys = [
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        ];
        Permutation {
            len,
            half_bits,
            keys,
        }
    }

    /// Number of elements permuted.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the permutation is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The element at position `index` (`index < len`).
    pub fn apply(&self, index: u64) -> u64 {
        debug_assert!(index < self.len);
        let f = self.round();
        let network = Network::new(self.len, self.half_bits);
        network.walk(network.feistel(index, &f), &f)
    }

    /// [`Permutation::apply`] of every position `first..first + out.len()`
    /// (all below `len`), into `out`: the rounds of 8 neighbouring positions
    /// are computed side by side, so they overlap instead of each waiting on
    /// its own chain of multiplications.
    pub fn apply_range(&self, first: u64, out: &mut [u64]) {
        Network::new(self.len, self.half_bits).apply_range(first, out, &self.round());
    }

    /// Round `k`'s function of a half `r`: `mix64(r ^ key_k)`, masked to
    /// `half_bits`.
    fn round(&self) -> impl Fn(usize, u64) -> u64 + '_ {
        let mask = (1u64 << self.half_bits) - 1;
        move |k, r| mix64(r ^ self.keys[k]) & mask
    }

    /// This permutation with each round's function tabulated over its
    /// `2^half_bits` inputs, for evaluating many positions (a window's
    /// order): `None` when the tables would be larger than
    /// [`TABULATED_MAX_HALF_BITS`] allows. Same results as [`Permutation::apply`].
    pub fn tabulated(&self) -> Option<Tabulated> {
        if self.half_bits > TABULATED_MAX_HALF_BITS {
            return None;
        }
        let size = 1usize << self.half_bits;
        let round = self.round();
        let mut tables = Vec::with_capacity(size * ROUNDS);
        for k in 0..ROUNDS {
            tables.extend((0..size as u64).map(|r| round(k, r) as u32));
        }
        Some(Tabulated {
            len: self.len,
            half_bits: self.half_bits,
            tables,
        })
    }
}

/// The shape both [`Permutation`] and [`Tabulated`] evaluate: a balanced
/// Feistel network of [`ROUNDS`] rounds on `2 * half_bits` bits, cycle-walked
/// into `0..len`, given each round's function of a half.
#[derive(Clone, Copy)]
struct Network {
    len: u64,
    half_bits: u32,
}

/// Rounds of every [`Permutation`] (one key each).
const ROUNDS: usize = 4;

/// Values one pass of the network takes side by side.
const LANES: usize = 8;

/// A permutation of at least this many eighths of its network's domain
/// walks each value on alone ([`Network::apply_range`]).
const SPARSE_EIGHTHS: u64 = 7;

impl Network {
    fn new(len: u64, half_bits: u32) -> Self {
        Network { len, half_bits }
    }

    /// One pass of the network over `x` (below `2^(2 * half_bits)`), with
    /// `f(k, half)` round `k`'s function (a value below `2^half_bits`).
    #[inline(always)]
    fn feistel(self, x: u64, f: &impl Fn(usize, u64) -> u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut left = x >> self.half_bits;
        let mut right = x & mask;
        for k in 0..ROUNDS {
            (left, right) = (right, left ^ f(k, right));
        }
        (left << self.half_bits) | right
    }

    /// The permuted index of every position `first..first + out.len()` (all
    /// below `len`), into `out`, a block of positions at a time: one pass of
    /// the network over the block, then passes over the values not yet
    /// inside `0..len` (gathered, with their places), until none is left.
    /// Every pass takes eight values side by side ([`Network::lanes`]).
    /// Walking each value on alone after the first pass (kept where few
    /// walk: [`SPARSE_EIGHTHS`]) cost ten times that pass where `len` is just
    /// above a power of four: 3.6 passes a position on average, 35 ns a
    /// position against 15 ns now for a window of 1.15 M rows (and 3 ns for
    /// one of 255 K rows, whose domain it nearly fills), AMD EPYC Zen 3.
    #[inline(always)]
    fn apply_range(self, first: u64, out: &mut [u64], f: &impl Fn(usize, u64) -> u64) {
        const BLOCK: usize = 512;
        debug_assert!(first + out.len() as u64 <= self.len);
        // Where `len` nearly fills the network's domain (`2^(2 * half_bits)`,
        // up to 2^64) few values walk on: each is walked alone as it is
        // written, a branch seldom taken.
        let domain = 1u128 << (2 * self.half_bits);
        if u128::from(self.len) * 8 >= domain * u128::from(SPARSE_EIGHTHS) {
            self.pass(out, Some(first), f, |y| self.walk(y, f));
            return;
        }
        // The values still walking and their places in the block (a place
        // fits a `u16`).
        const _: () = assert!(BLOCK <= 1 << 16);
        let mut walking = [0u64; BLOCK];
        let mut places = [0u16; BLOCK];
        let mut start = first;
        for block in out.chunks_mut(BLOCK) {
            self.pass(block, Some(start), f, |y| y);
            start += block.len() as u64;
            // Branch-free: whether a value lands inside is a coin toss. At
            // the `j`th value at most `j` are walking, so the index is in
            // the arrays.
            let mut pending = 0;
            for (j, &y) in block.iter().enumerate() {
                walking[pending] = y;
                places[pending] = j as u16;
                pending += usize::from(y >= self.len);
            }
            while pending > 0 {
                self.pass(&mut walking[..pending], None, f, |y| y);
                let mut still = 0;
                for p in 0..pending {
                    let (y, j) = (walking[p], places[p]);
                    block[usize::from(j)] = y;
                    walking[still] = y;
                    places[still] = j;
                    still += usize::from(y >= self.len);
                }
                pending = still;
            }
        }
    }

    /// One pass of the network over every value of `xs` (each below
    /// `2^(2 * half_bits)`), in place, or with `from`, over the positions
    /// `from..from + xs.len()` into `xs`; each result given to `finish`
    /// before it is written.
    #[inline(always)]
    fn pass(
        self,
        xs: &mut [u64],
        from: Option<u64>,
        f: &impl Fn(usize, u64) -> u64,
        finish: impl Fn(u64) -> u64,
    ) {
        let mut chunks = xs.chunks_exact_mut(LANES);
        let mut at = from.unwrap_or(0);
        for chunk in &mut chunks {
            let x = std::array::from_fn(|i| match from {
                Some(_) => at + i as u64,
                None => chunk[i],
            });
            for (o, y) in chunk.iter_mut().zip(self.lanes(x, f)) {
                *o = finish(y);
            }
            at += LANES as u64;
        }
        for (o, at) in chunks.into_remainder().iter_mut().zip(at..) {
            *o = finish(self.feistel(if from.is_some() { at } else { *o }, f));
        }
    }

    /// One pass of the network over [`LANES`] values (each below
    /// `2^(2 * half_bits)`), their rounds computed side by side so that they
    /// overlap instead of each waiting on its own chain (of multiplications,
    /// or of table reads).
    #[inline(always)]
    fn lanes(self, x: [u64; LANES], f: &impl Fn(usize, u64) -> u64) -> [u64; LANES] {
        let mask = (1u64 << self.half_bits) - 1;
        let mut left = [0u64; LANES];
        let mut right = [0u64; LANES];
        for i in 0..LANES {
            left[i] = x[i] >> self.half_bits;
            right[i] = x[i] & mask;
        }
        for k in 0..ROUNDS {
            for i in 0..LANES {
                (left[i], right[i]) = (right[i], left[i] ^ f(k, right[i]));
            }
        }
        std::array::from_fn(|i| (left[i] << self.half_bits) | right[i])
    }

    /// Cycle walking: `x` (one pass of the network) taken on through it
    /// until it lands inside `0..len`.
    #[inline(always)]
    fn walk(self, mut x: u64, f: &impl Fn(usize, u64) -> u64) -> u64 {
        while x >= self.len {
            x = self.feistel(x, f);
        }
        x
    }
}

/// The largest `half_bits` whose rounds [`Permutation::tabulated`]
/// tabulates: 4 tables of 8,192 4-byte values (128 KiB), for permutations
/// of up to 2^26 elements. Building them costs as much as evaluating
/// `2^half_bits` positions directly, so they pay for ranges longer than that.
pub const TABULATED_MAX_HALF_BITS: u32 = 13;

/// A [`Permutation`] whose rounds are table lookups: each round's function
/// of a half (`mix64(half ^ key)` masked to `half_bits`) read from a table
/// instead of computed (measured on the 40-column tabular set's windows of
/// 257 Ki rows: computing the order took 3.7% of a loader's CPU time).
#[derive(Clone, Debug)]
pub struct Tabulated {
    len: u64,
    half_bits: u32,
    /// Round `k`'s function of `r` at `(k << half_bits) + r`.
    tables: Vec<u32>,
}

impl Tabulated {
    /// [`Permutation::apply`] of every position `first..first + out.len()`
    /// (all below the permutation's length), into `out`, as
    /// [`Permutation::apply_range`] does.
    pub fn apply_range(&self, first: u64, out: &mut [u64]) {
        let bits = self.half_bits;
        // `r` is a half: below `2^half_bits`, inside round `k`'s table.
        let f = |k: usize, r: u64| u64::from(self.tables[(k << bits) | r as usize]);
        Network::new(self.len, bits).apply_range(first, out, &f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_range_equals_apply_position_by_position() {
        for len in [1u64, 7, 8, 9, 100, 4097, 70_001, 257_128] {
            for seed in [0, 3] {
                let p = Permutation::new(len, seed);
                for first in [0, 1, len / 3] {
                    let mut out = vec![0u64; (len - first) as usize];
                    p.apply_range(first, &mut out);
                    for (i, &x) in out.iter().enumerate() {
                        assert_eq!(x, p.apply(first + i as u64), "len {len} seed {seed}");
                    }
                    let mut tabulated = vec![0u64; out.len()];
                    let t = p.tabulated().expect("small enough to tabulate");
                    t.apply_range(first, &mut tabulated);
                    assert_eq!(tabulated, out, "len {len} seed {seed}");
                }
            }
        }
        // Huge permutations (a domain of up to 2^64), a few positions.
        for len in [u64::MAX, (1 << 40) + 3, (1 << 41) - 1] {
            let p = Permutation::new(len, 5);
            let mut out = [0u64; 37];
            p.apply_range(len / 2, &mut out);
            for (i, &x) in out.iter().enumerate() {
                assert!(x < len);
                assert_eq!(x, p.apply(len / 2 + i as u64), "len {len}");
            }
        }
    }

    /// Orders shuffled by both halves of shardfeed (shard-time shuffles,
    /// loader plans, saved states) rest on these: pinned, so a change fails here.
    #[test]
    fn seeded_values_are_pinned() {
        let p = Permutation::new(1000, 42);
        assert_eq!(
            (0..12).map(|i| p.apply(i)).collect::<Vec<_>>(),
            [94, 302, 972, 443, 8, 510, 179, 344, 484, 801, 836, 609]
        );
        assert_eq!(hash_words(&[1, 2, 3]), 16299856255350999488);
        assert_eq!(SplitMix64::new(9).next_u64(), 12587370737594032228);
    }

    #[test]
    fn permutation_is_a_bijection_for_many_sizes() {
        for len in [0u64, 1, 2, 3, 7, 8, 9, 100, 1000, 4097] {
            for seed in [0, 1, 42] {
                let p = Permutation::new(len, seed);
                let mut seen = vec![false; len as usize];
                for i in 0..len {
                    let j = p.apply(i) as usize;
                    assert!(!seen[j], "len {len} seed {seed}: {j} twice");
                    seen[j] = true;
                }
            }
        }
    }

    #[test]
    fn seeds_give_different_orders() {
        let a: Vec<u64> = (0..100)
            .map(|i| Permutation::new(100, 1).apply(i))
            .collect();
        let b: Vec<u64> = (0..100)
            .map(|i| Permutation::new(100, 2).apply(i))
            .collect();
        assert_ne!(a, b);
        assert_ne!(a, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn below_is_in_range_and_shuffle_permutes() {
        let mut rng = SplitMix64::new(7);
        for bound in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..100 {
                assert!(rng.below(bound) < bound);
            }
        }
        let mut v: Vec<u32> = (0..1000).collect();
        rng.shuffle(&mut v);
        let mut sorted = v.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_ne!(v, sorted);
    }
}
