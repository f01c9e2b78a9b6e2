//! `DELTA_BINARY_PACKED` pages of integer columns: the header (block size,
//! miniblocks a block, value count, first value), then blocks of
//! [`BLOCK`] deltas, each a zigzag minimum delta, one bit width a miniblock
//! of 32, and the deltas less the minimum bit-packed LSB first. Arithmetic
//! wraps in the column's width (32 or 64 bits), as the format asks.
//!
//! `shard` writes a flat integer column without nulls this way where the
//! deltas take fewer bytes than its dictionary encoding (high-cardinality
//! ids, counts, measurements): the loader then decodes it without zstd and
//! without a dictionary lookup (docs/FORMAT.md).

/// Deltas a block (parquet's writer uses the same).
pub(crate) const BLOCK: usize = 128;
/// Deltas a miniblock.
const MINI: usize = 32;
/// Miniblocks a block.
const MINIS: usize = BLOCK / MINI;

/// `b - a` wrapped in `bits` (32 or 64), sign-extended.
#[inline(always)]
fn delta(a: i64, b: i64, bits: u32) -> i64 {
    if bits == 32 {
        i64::from((b as i32).wrapping_sub(a as i32))
    } else {
        b.wrapping_sub(a)
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// `v` as an unsigned LEB128 varint (also the RLE run headers of
/// `dictionary.rs`).
pub(crate) fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros() as usize).div_ceil(7).max(1)
}

/// Each block of `values`' deltas: its minimum, the deltas less it (zeros
/// past the block's end) and how many there are.
fn blocks<T: Copy>(
    values: &[T],
    get: impl Fn(T) -> i64,
    bits: u32,
    mut each: impl FnMut(i64, &[u64; BLOCK], usize),
) {
    let mut deltas = [0i64; BLOCK];
    let mut rel = [0u64; BLOCK];
    let mut at = 1;
    while at < values.len() {
        let n = (values.len() - at).min(BLOCK);
        for (d, pair) in deltas.iter_mut().zip(values[at - 1..at + n].windows(2)) {
            *d = delta(get(pair[0]), get(pair[1]), bits);
        }
        at += n;
        let min = deltas[..n].iter().copied().min().unwrap_or(0);
        for (r, &d) in rel.iter_mut().zip(&deltas[..n]) {
            // In 32 bits the difference fits without wrapping; in 64 it
            // wraps to the unsigned distance.
            *r = d.wrapping_sub(min) as u64;
        }
        rel[n..].fill(0);
        each(min, &rel, n);
    }
}

/// The bit width of each miniblock of `rel` (those holding any of the `n`
/// deltas; the others 0).
fn widths(rel: &[u64; BLOCK], n: usize) -> [u8; MINIS] {
    let mut widths = [0u8; MINIS];
    for (m, w) in widths.iter_mut().enumerate().take(n.div_ceil(MINI)) {
        let any = rel[m * MINI..(m + 1) * MINI].iter().fold(0, |a, &r| a | r);
        *w = (64 - any.leading_zeros()) as u8;
    }
    widths
}

fn header<T: Copy>(values: &[T], get: impl Fn(T) -> i64) -> (u64, u64) {
    (
        values.len() as u64,
        zigzag(values.first().map_or(0, |&v| get(v))),
    )
}

/// Bytes [`encode`] writes for `values`.
pub(crate) fn size<T: Copy>(values: &[T], get: impl Fn(T) -> i64 + Copy, bits: u32) -> usize {
    let (count, first) = header(values, get);
    let mut size = varint_len(BLOCK as u64) + varint_len(MINIS as u64);
    size += varint_len(count) + varint_len(first);
    blocks(values, get, bits, |min, rel, n| {
        size += varint_len(zigzag(min)) + MINIS;
        size += widths(rel, n)
            .iter()
            .map(|&w| 4 * w as usize)
            .sum::<usize>();
    });
    size
}

/// Append `values` (integers of `bits` = 32 or 64 bits, read by `get`) to
/// `out` as one `DELTA_BINARY_PACKED` stream.
pub(crate) fn encode<T: Copy>(
    values: &[T],
    get: impl Fn(T) -> i64 + Copy,
    bits: u32,
    out: &mut Vec<u8>,
) {
    let (count, first) = header(values, get);
    varint(BLOCK as u64, out);
    varint(MINIS as u64, out);
    varint(count, out);
    varint(first, out);
    blocks(values, get, bits, |min, rel, n| {
        varint(zigzag(min), out);
        let widths = widths(rel, n);
        out.extend_from_slice(&widths);
        for (m, &w) in widths.iter().enumerate().take(n.div_ceil(MINI)) {
            pack32(&rel[m * MINI..(m + 1) * MINI], w as usize, out);
        }
    });
}

/// Append 32 values of `w` bits (`4 * w` bytes), LSB first.
fn pack32(values: &[u64], w: usize, out: &mut Vec<u8>) {
    let mut acc = 0u128;
    let mut held = 0;
    for &v in values {
        acc |= u128::from(v) << held;
        held += w;
        if held >= 64 {
            out.extend_from_slice(&(acc as u64).to_le_bytes());
            acc >>= 64;
            held -= 64;
        }
    }
    // 32 values of `w` bits end on a byte.
    out.extend_from_slice(&acc.to_le_bytes()[..held / 8]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format's example (parquet-format's Encodings.md): 7, 5, 3, 1, 2,
    /// 3, 4, 5 is a minimum delta of -2 and deltas 0 0 0 3 3 3 3 in 2 bits.
    /// (Streams read back by parquet's reader: `encode.rs`'s tests.)
    #[test]
    fn the_specifications_example_encodes() {
        let values = [7i64, 5, 3, 1, 2, 3, 4, 5];
        let mut out = Vec::new();
        encode(&values, |v| v, 64, &mut out);
        let mut expected = vec![0x80, 1, 4, 8, 14, 3, 2, 0, 0, 0, 0xc0, 0x3f];
        expected.extend([0u8; 6]);
        assert_eq!(out, expected);
        assert_eq!(size(&values, |v| v, 64), out.len());
    }

    /// `size` is what `encode` writes, for every width and partial blocks;
    /// 32-bit deltas wrap.
    #[test]
    fn sizes_match_the_streams() {
        let mut next = crate::encode::tests::random();
        for n in [1usize, 2, 32, 33, 129, 1000] {
            for bits in [0u32, 1, 9, 31, 33, 64] {
                let values: Vec<i64> = (0..n)
                    .map(|_| match bits {
                        0 => 7,
                        64 => next() as i64,
                        b => (next() >> (64 - b)) as i64 - (1i64 << (b - 1)),
                    })
                    .collect();
                let mut out = Vec::new();
                encode(&values, |v| v, 64, &mut out);
                assert_eq!(
                    out.len(),
                    size(&values, |v| v, 64),
                    "{n} values of {bits} bits"
                );
                let values32: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                let mut out = Vec::new();
                encode(&values32, i64::from, 32, &mut out);
                assert_eq!(out.len(), size(&values32, i64::from, 32));
            }
        }
        // A swing across the whole range wraps to deltas of -1 and 1: after
        // the header (9 bytes) and the minimum delta (1), 2-bit deltas.
        let swing = [i32::MIN, i32::MAX, i32::MIN];
        let mut out = Vec::new();
        encode(&swing, i64::from, 32, &mut out);
        assert_eq!(out[10..14], [2, 0, 0, 0]);
    }
}
