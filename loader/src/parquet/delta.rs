//! `DELTA_BINARY_PACKED` values of INT32 and INT64 columns: a header (block
//! size, miniblocks a block, value count, first value), then blocks of a
//! minimum delta and one bit width a miniblock, each miniblock's deltas
//! (less the minimum) bit-packed LSB first. Arithmetic wraps in the
//! column's physical width, as the format asks.
//!
//! `shard` writes an integer column this way where it is smaller than the
//! dictionary encoding (high-cardinality ids, counts, timestamps): it needs
//! no zstd and no dictionary lookup, so it decodes several times faster.
//! Every count and width in the header is untrusted: checked before it
//! indexes the page.

/// A cursor over a page's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// An unsigned LEB128 varint; `what` names it in errors.
    fn varint(&mut self, what: &str) -> Result<u64, String> {
        super::rle::uleb128(self.buf, &mut self.pos, what)
    }

    /// A zigzag-encoded signed varint.
    fn zigzag(&mut self, what: &str) -> Result<i64, String> {
        let v = self.varint(what)?;
        Ok((v >> 1) as i64 ^ -((v & 1) as i64))
    }

    /// The next `n` bytes, or an error naming `what` when the page has fewer.
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "delta values: {what} needs {n} bytes, the page has {} left",
                    self.buf.len() - self.pos
                )
            })?;
        let buf: &'a [u8] = self.buf;
        let bytes = &buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }
}

/// Largest block the decoder accepts (writers use 128 to 1,024 values).
const MAX_BLOCK: u64 = 1 << 16;

/// Decode the `count` values of the `DELTA_BINARY_PACKED` data `buf` (of a
/// column whose values are `physical` bytes: 4 or 8), appending each, little
/// endian, narrowed to its first `width` bytes, to `out`. `count` is the
/// page's number of non-null values: the header must give the same.
pub(super) fn delta_values(
    buf: &[u8],
    count: usize,
    physical: usize,
    width: usize,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    debug_assert!(matches!(physical, 4 | 8) && width <= physical);
    let mut cur = Cursor { buf, pos: 0 };
    let block = cur.varint("delta header: its block size")?;
    let miniblocks = cur.varint("delta header: its miniblock count")?;
    let total = cur.varint("delta header: its value count")?;
    let first = cur.zigzag("delta header: its first value")?;
    if block == 0 || !block.is_multiple_of(128) || block > MAX_BLOCK {
        return Err(format!(
            "delta header: a block of {block} values (a multiple of 128, at most {MAX_BLOCK})"
        ));
    }
    if miniblocks == 0
        || !block.is_multiple_of(miniblocks)
        || !(block / miniblocks).is_multiple_of(32)
    {
        return Err(format!(
            "delta header: {miniblocks} miniblocks in a block of {block} values (each a multiple of 32)"
        ));
    }
    if total != count as u64 {
        return Err(format!(
            "delta header: {total} values in a page of {count} non-null values"
        ));
    }
    if count == 0 {
        return Ok(());
    }
    let (miniblocks, per_mini) = (miniblocks as usize, (block / miniblocks) as usize);
    let max_width = physical * 8;
    out.reserve(count.saturating_mul(width));
    let mut last = first as u64;
    let mut group = [0u64; 32];
    group[0] = last;
    push(&group[..1], width, out);
    let mut left = count - 1;
    while left > 0 {
        let min_delta = cur.zigzag("delta values: a minimum delta")? as u64;
        let widths = cur.take(miniblocks, "the miniblock bit widths")?;
        for &w in widths {
            if left == 0 {
                // The last block's unused miniblocks have no bodies.
                break;
            }
            let w = w as usize;
            if w > max_width {
                return Err(format!(
                    "delta values: a miniblock of {w}-bit deltas in a column of {max_width}-bit values"
                ));
            }
            // A miniblock body is `per_mini * w / 8` bytes (a multiple of 32
            // values: whole bytes); the last one may stop once its values end.
            let full = per_mini * w / 8;
            let needed = if left >= per_mini {
                full
            } else {
                (left * w).div_ceil(8)
            };
            let available = full.min(buf.len() - cur.pos);
            let start = cur.pos;
            cur.take(available.max(needed), "a miniblock")?;
            let mut at = 0;
            let mut in_mini = 0;
            while in_mini < per_mini && left > 0 {
                // The group's values (past the last value, a partial group's
                // padding runs on: `last` is not used after it). The group
                // is read from the rest of the page, not of its miniblock:
                // the unpacking reads 16 bytes past a group's, and a
                // miniblock's last group (every group, with parquet's 32
                // values a miniblock) would otherwise be copied into a
                // zeroed buffer first. The bytes past the group do not
                // change its values; where the page ends, they read as zeros.
                unpack32(
                    w,
                    &buf[(start + at).min(buf.len())..],
                    min_delta,
                    &mut last,
                    &mut group,
                );
                let n = left.min(32);
                push(&group[..n], width, out);
                left -= n;
                at += 4 * w;
                in_mini += 32;
            }
        }
    }
    Ok(())
}

/// Append `values` (at most 32) to `out`, each as its first `width`
/// little-endian bytes (the low bytes: a value wrapped in a narrower
/// physical width keeps them). A whole group is narrowed into an array it
/// fills (no zeroing) and appended as that array's bytes, one copy; on a
/// little-endian machine 64-bit values are appended as they lie.
#[inline]
fn push(values: &[u64], width: usize, out: &mut Vec<u8>) {
    use arrow_buffer::ToByteSlice;
    #[cfg(target_endian = "little")]
    if width == 8 {
        out.extend_from_slice(values.to_byte_slice());
        return;
    }
    if let (Ok(group), true) = (
        <&[u64; 32]>::try_from(values),
        cfg!(target_endian = "little"),
    ) {
        match width {
            4 => {
                let narrow: [u32; 32] = std::array::from_fn(|i| group[i] as u32);
                out.extend_from_slice(narrow.to_byte_slice());
                return;
            }
            2 => {
                let narrow: [u16; 32] = std::array::from_fn(|i| group[i] as u16);
                out.extend_from_slice(narrow.to_byte_slice());
                return;
            }
            1 => {
                let narrow: [u8; 32] = std::array::from_fn(|i| group[i] as u8);
                out.extend_from_slice(&narrow);
                return;
            }
            _ => {}
        }
    }
    for v in values {
        out.extend_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// Unpack 32 deltas of `w` bits (LSB first) from `src` (fewer bytes than
/// `4 * w`: the missing ones read as zeros) and write the values they make
/// to `out`: each the one before (`last`, then updated) plus `min_delta`
/// plus its delta, wrapping.
fn unpack32(w: usize, src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    // Constant-width unpacking reads 16 bytes past the values' last byte.
    if src.len() >= 4 * w + 16 {
        return unpack32_any(w, src, min_delta, last, out);
    }
    let mut padded = [0u8; 4 * 64 + 16];
    let n = src.len().min(4 * w);
    padded[..n].copy_from_slice(&src[..n]);
    unpack32_any(w, &padded, min_delta, last, out)
}

/// [`unpack32`] of a `src` holding at least `4 * w + 16` bytes: with
/// AVX-512 (VBMI) where the CPU has it and the width is 1 to 56 bits, else
/// the scalar code.
#[inline]
fn unpack32_any(w: usize, src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    #[cfg(target_arch = "x86_64")]
    if (1..=simd::MAX_WIDTH).contains(&w) && simd::available() {
        // SAFETY: the CPU has the kernel's features (`available`), the width
        // is within its range, and `src` holds `4 * w + 16` bytes (checked
        // by the caller, asserted again in the kernel).
        return unsafe { simd::unpack32(w, src, min_delta, last, out) };
    }
    unpack32_dispatch(w, src, min_delta, last, out)
}

/// The AVX-512 kernel: 8 deltas a vector, each lane's 8 bytes gathered
/// from one 64-byte load with a byte permutation (VBMI), shifted, masked,
/// then summed in the vector (three shifted adds) onto the value before.
/// Every group of 8 deltas starts on a byte (8 x `w` bits), so one table of
/// byte positions and shifts per width serves them all.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;
    use std::sync::OnceLock;

    /// The widest deltas the kernel takes: a lane's value, shifted by up
    /// to 7 bits, must lie within its 8 bytes.
    pub(super) const MAX_WIDTH: usize = 56;

    /// Per width: each lane's 8 byte positions, and its shift.
    struct Table {
        bytes: [[u8; 64]; MAX_WIDTH + 1],
        shifts: [[u64; 8]; MAX_WIDTH + 1],
    }

    const TABLE: Table = {
        let mut t = Table {
            bytes: [[0; 64]; MAX_WIDTH + 1],
            shifts: [[0; 8]; MAX_WIDTH + 1],
        };
        let mut w = 1;
        while w <= MAX_WIDTH {
            let mut lane = 0;
            while lane < 8 {
                let bit = lane * w;
                let mut b = 0;
                while b < 8 {
                    t.bytes[w][lane * 8 + b] = (bit / 8 + b) as u8;
                    b += 1;
                }
                t.shifts[w][lane] = (bit % 8) as u64;
                lane += 1;
            }
            w += 1;
        }
        t
    };

    /// Whether this CPU runs the kernel (checked once).
    pub(super) fn available() -> bool {
        static AVAILABLE: OnceLock<bool> = OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vbmi")
        })
    }

    /// `super::unpack32_width` for `w` in 1..=[`MAX_WIDTH`].
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and VBMI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) unsafe fn unpack32(
        w: usize,
        src: &[u8],
        min_delta: u64,
        last: &mut u64,
        out: &mut [u64; 32],
    ) {
        assert!((1..=MAX_WIDTH).contains(&w) && src.len() >= 4 * w + 16);
        // Bytes a group's lanes read: up to the last lane's 8 (below w + 8).
        let load: u64 = if w + 8 >= 64 {
            u64::MAX
        } else {
            (1u64 << (w + 8)) - 1
        };
        // SAFETY (every load and store below): the table rows are 64 and
        // 8 x 8 bytes; group `g`'s masked load reads `src[g * w..g * w + w + 8]`,
        // within `4 * w + 8` bytes (asserted above); `out` holds 4 x 8 values.
        unsafe {
            let positions = _mm512_loadu_si512(TABLE.bytes[w].as_ptr().cast());
            let shifts = _mm512_loadu_si512(TABLE.shifts[w].as_ptr().cast());
            let mask = _mm512_set1_epi64(((1u64 << w) - 1) as i64);
            let min = _mm512_set1_epi64(min_delta as i64);
            let zero = _mm512_setzero_si512();
            let top = _mm512_set1_epi64(7);
            let mut carry = _mm512_set1_epi64(*last as i64);
            for g in 0..4 {
                let bytes = _mm512_maskz_loadu_epi8(load, src.as_ptr().add(g * w).cast());
                let mut v = _mm512_permutexvar_epi8(positions, bytes);
                v = _mm512_and_si512(_mm512_srlv_epi64(v, shifts), mask);
                v = _mm512_add_epi64(v, min);
                // Each lane plus the lanes below it (shifted in zeros).
                v = _mm512_add_epi64(v, _mm512_alignr_epi64::<7>(v, zero));
                v = _mm512_add_epi64(v, _mm512_alignr_epi64::<6>(v, zero));
                v = _mm512_add_epi64(v, _mm512_alignr_epi64::<4>(v, zero));
                v = _mm512_add_epi64(v, carry);
                _mm512_storeu_si512(out.as_mut_ptr().add(g * 8).cast(), v);
                carry = _mm512_permutexvar_epi64(top, v);
            }
        }
        *last = out[31];
    }
}

/// [`unpack32`] with the width a constant (the compiler unrolls each).
fn unpack32_dispatch(w: usize, src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    macro_rules! widths {
        ($($n:literal)*) => {
            match w {
                $($n => unpack32_width::<$n>(src, min_delta, last, out),)*
                _ => unreachable!("bit width {w} was checked against 64"),
            }
        };
    }
    widths!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30
        31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
        60 61 62 63 64)
}

/// [`unpack32`] of `W`-bit deltas; `src` holds at least `4 * W + 16` bytes.
#[inline(always)]
fn unpack32_width<const W: usize>(src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    let src = &src[..4 * W + 16];
    let mask = if W == 64 { u64::MAX } else { (1u64 << W) - 1 };
    let mut value = *last;
    for (i, o) in out.iter_mut().enumerate() {
        let bit = i * W;
        let (byte, shift) = (bit / 8, bit % 8);
        let delta = if W == 0 {
            0
        } else if W <= 56 {
            let word = u64::from_le_bytes(src[byte..byte + 8].try_into().expect("8 bytes"));
            (word >> shift) & mask
        } else {
            let word = u128::from_le_bytes(src[byte..byte + 16].try_into().expect("16 bytes"));
            (word >> shift) as u64 & mask
        };
        value = value.wrapping_add(min_delta).wrapping_add(delta);
        *o = value;
    }
    *last = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 kernel gives the scalar code's values and last value, for
    /// every width it takes and random deltas, minima and starting values
    /// (where the CPU has it; elsewhere there is nothing to compare).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_kernel_matches_the_scalar_one() {
        if !simd::available() {
            return;
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..4000 {
            let w = 1 + round % simd::MAX_WIDTH;
            let src: Vec<u8> = (0..4 * w + 16).map(|_| next() as u8).collect();
            let (min_delta, start) = match round % 3 {
                0 => (next(), next()),
                1 => (0, 0),
                _ => ((next() % 5).wrapping_sub(2), u64::MAX - 3),
            };
            let (mut a, mut b) = ([0u64; 32], [0u64; 32]);
            let (mut last_a, mut last_b) = (start, start);
            unpack32_dispatch(w, &src, min_delta, &mut last_a, &mut a);
            // SAFETY: `available` said the CPU has the kernel's features.
            unsafe { simd::unpack32(w, &src, min_delta, &mut last_b, &mut b) };
            assert_eq!(a, b, "width {w}");
            assert_eq!(last_a, last_b, "width {w}");
        }
    }

    fn i64s(out: &[u8]) -> Vec<i64> {
        out.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// The format's own examples (parquet-format's Encodings.md).
    #[test]
    fn the_specifications_examples_decode() {
        // 1, 2, 3, 4, 5: one block, every delta the minimum (width 0).
        let mut out = Vec::new();
        delta_values(&[0x80, 1, 4, 5, 2, 2, 0, 0, 0, 0], 5, 8, 8, &mut out).unwrap();
        assert_eq!(i64s(&out), [1, 2, 3, 4, 5]);
        // 7, 5, 3, 1, 2, 3, 4, 5: minimum delta -2, then deltas 0 0 0 3 3 3 3
        // in 2 bits.
        let mut page = vec![0x80, 1, 4, 8, 14, 3, 2, 0, 0, 0, 0xc0, 0x3f];
        page.extend([0u8; 6]);
        let mut out = Vec::new();
        delta_values(&page, 8, 8, 8, &mut out).unwrap();
        assert_eq!(i64s(&out), [7, 5, 3, 1, 2, 3, 4, 5]);
        // As INT32 narrowed to one byte.
        let mut out = Vec::new();
        delta_values(&page, 8, 4, 1, &mut out).unwrap();
        assert_eq!(out, [7, 5, 3, 1, 2, 3, 4, 5]);
        // The last miniblock cut where its values end (no padding) is read too.
        let mut out = Vec::new();
        delta_values(&page[..12], 8, 8, 8, &mut out).unwrap();
        assert_eq!(i64s(&out), [7, 5, 3, 1, 2, 3, 4, 5]);
    }

    /// Damaged headers and bodies are errors, never a panic or a short page.
    #[test]
    fn damaged_pages_are_refused() {
        let mut page = vec![0x80, 1, 4, 8, 14, 3, 2, 0, 0, 0, 0xc0, 0x3f];
        page.extend([0u8; 6]);
        let mut out = Vec::new();
        // Every truncation before the last values' bytes fails, with a message.
        for cut in 0..11 {
            let err = delta_values(&page[..cut], 8, 8, 8, &mut out).unwrap_err();
            assert!(err.starts_with("delta"), "{err}");
        }
        // A count other than the page's.
        let err = delta_values(&page, 7, 8, 8, &mut out).unwrap_err();
        assert!(err.contains("8 values in a page of 7"), "{err}");
        // A block size that is no multiple of 128; zero miniblocks; miniblocks
        // of 16 values.
        let err = delta_values(&[100, 4, 1, 0], 1, 8, 8, &mut out).unwrap_err();
        assert!(err.contains("a block of 100 values"), "{err}");
        let err = delta_values(&[0x80, 1, 0, 1, 0], 1, 8, 8, &mut out).unwrap_err();
        assert!(err.contains("0 miniblocks"), "{err}");
        let err = delta_values(&[0x80, 1, 8, 1, 0], 1, 8, 8, &mut out).unwrap_err();
        assert!(err.contains("8 miniblocks"), "{err}");
        // A 40-bit miniblock in an INT32 column.
        let mut bad = vec![0x80, 1, 4, 3, 0, 0, 40, 0, 0, 0];
        bad.extend([0u8; 200]);
        let err = delta_values(&bad, 3, 4, 4, &mut out).unwrap_err();
        assert!(err.contains("40-bit deltas"), "{err}");
        // A varint that never ends.
        let err = delta_values(&[0xff; 12], 1, 8, 8, &mut out).unwrap_err();
        assert!(err.contains("overflows 64 bits"), "{err}");
    }

    /// Every width unpacks as the bits were packed, with and without bytes
    /// after the group, into the running values.
    #[test]
    fn groups_of_every_width_unpack() {
        for w in 0..=64usize {
            let mask = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
            let values: Vec<u64> = (0..32u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(i as u32) & mask)
                .collect();
            let mut packed = vec![0u8; 4 * w + 16];
            for (i, &v) in values.iter().enumerate() {
                for b in 0..w {
                    if v >> b & 1 == 1 {
                        let bit = i * w + b;
                        packed[bit / 8] |= 1 << (bit % 8);
                    }
                }
            }
            // From 5, with a minimum delta of 3: running sums.
            let mut expected = Vec::new();
            let mut value = 5u64;
            for &v in &values {
                value = value.wrapping_add(3).wrapping_add(v);
                expected.push(value);
            }
            for src in [&packed[..], &packed[..4 * w]] {
                let (mut out, mut last) = ([0u64; 32], 5u64);
                unpack32(w, src, 3, &mut last, &mut out);
                assert_eq!(out.to_vec(), expected, "width {w}, {} bytes", src.len());
                assert_eq!(last, expected[31]);
            }
        }
    }
}
