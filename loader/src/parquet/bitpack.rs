//! Bit unpacking: groups of 8 values of a constant bit width, LSB first.
//! Safe scalar code with constant shifts per width (the compiler unrolls and
//! vectorises it), and for widths up to 16 an AVX2 path chosen at run time.

use super::rle::KeySink;

/// bytes, so every 8-byte load stays inside it).
#[inline(always)]
fn unpack8<const W: usize>(src: &[u8], out: &mut [i32; 8]) {
    let mask = if W == 32 {
        u64::from(u32::MAX)
    } else {
        (1u64 << W) - 1
    };
    if W <= 8 {
        // The 8 values fit in one 8-byte load.
        let word = u64::from_le_bytes(src[..8].try_into().expect("8 bytes"));
        for (i, o) in out.iter_mut().enumerate() {
            *o = ((word >> (i * W)) & mask) as i32;
        }
    } else if W <= 16 {
        // ... in one 16-byte load.
        let word = u128::from_le_bytes(src[..16].try_into().expect("16 bytes"));
        for (i, o) in out.iter_mut().enumerate() {
            *o = ((word >> (i * W)) as u64 & mask) as i32;
        }
    } else {
        for (i, o) in out.iter_mut().enumerate() {
            let bit = i * W;
            let word = u64::from_le_bytes(src[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
            *o = ((word >> (bit % 8)) & mask) as i32;
        }
    }
}

/// Unpack `n` values of `W` bits packed in `packed` into `sink`, 8 at a time
/// with constant shifts; the last groups through a zero-padded copy.
fn unpack_width<const W: usize>(packed: &[u8], n: usize, sink: &mut impl KeySink) {
    const CHUNK: usize = 64;
    let mut buf = [0i32; CHUNK];
    let groups = n.div_ceil(8);
    // Groups whose 8-byte loads stay inside `packed`.
    let direct = if packed.len() >= W + 8 {
        ((packed.len() - W - 8) / W + 1).min(groups)
    } else {
        0
    };
    let mut g = 0;
    #[cfg(target_arch = "x86_64")]
    if W <= 16 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        g = unsafe { simd::unpack_groups::<W>(packed, n, sink) };
    }
    let mut left = n - (g * 8).min(n);
    while g < direct {
        let take = (direct - g).min(CHUNK / 8);
        for k in 0..take {
            let out: &mut [i32; 8] = (&mut buf[k * 8..k * 8 + 8]).try_into().expect("8");
            unpack8::<W>(&packed[(g + k) * W..], out);
        }
        let values = (take * 8).min(left);
        sink.keys(&buf[..values]);
        left -= values;
        g += take;
    }
    while g < groups {
        let mut tail = [0u8; 48];
        let rest = &packed[(g * W).min(packed.len())..];
        let len = rest.len().min(W);
        tail[..len].copy_from_slice(&rest[..len]);
        let out: &mut [i32; 8] = (&mut buf[..8]).try_into().expect("8");
        unpack8::<W>(&tail, out);
        let values = 8.min(left);
        sink.keys(&buf[..values]);
        left -= values;
        g += 1;
    }
}

/// Bit unpacking with AVX2: 8 values of up to 16 bits from one 16-byte load,
/// one byte shuffle, one variable shift and one mask (a third of the scalar
/// instructions per key).
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm256_and_si256, _mm256_broadcastsi128_si256,
        _mm256_loadu_si256, _mm256_set1_epi32, _mm256_shuffle_epi8, _mm256_srlv_epi32,
        _mm256_storeu_si256,
    };

    use super::KeySink;

    /// For 8 values of `W` bits (`W` <= 16) packed LSB first in 16 bytes: the
    /// byte shuffle that puts value `i`'s three bytes in 32-bit lane `i` (of a
    /// register holding the 16 bytes in both halves), and each lane's shift.
    const fn spread<const W: usize>() -> ([i8; 32], [i32; 8]) {
        let mut control = [-128i8; 32];
        let mut shifts = [0i32; 8];
        let mut i = 0;
        while i < 8 {
            let bit = i * W;
            let lane = (i % 4) * 4 + (i / 4) * 16;
            let mut j = 0;
            while j < 3 {
                if bit / 8 + j < 16 {
                    control[lane + j] = (bit / 8 + j) as i8;
                }
                j += 1;
            }
            shifts[i] = (bit % 8) as i32;
            i += 1;
        }
        (control, shifts)
    }

    /// Unpack the leading groups of 8 values of `W` bits whose 16-byte loads
    /// stay inside `packed`, of the `n` values packed there, into `sink`;
    /// returns how many groups (none for widths over 16).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn unpack_groups<const W: usize>(
        packed: &[u8],
        n: usize,
        sink: &mut impl KeySink,
    ) -> usize {
        if W == 0 || W > 16 {
            return 0;
        }
        let (control, shifts) = const { spread::<W>() };
        let direct = if packed.len() >= 16 {
            ((packed.len() - 16) / W + 1).min(n.div_ceil(8))
        } else {
            0
        };
        let mut buf = [0i32; 64];
        // SAFETY (loads below): `control` and `shifts` are 32 bytes each.
        let (control, shifts, mask) = unsafe {
            (
                _mm256_loadu_si256(control.as_ptr() as *const __m256i),
                _mm256_loadu_si256(shifts.as_ptr() as *const __m256i),
                _mm256_set1_epi32((u32::MAX >> (32 - W)) as i32),
            )
        };
        let mut g = 0;
        while g < direct {
            let take = (direct - g).min(8);
            for k in 0..take {
                let at = (g + k) * W;
                debug_assert!(at + 16 <= packed.len());
                // SAFETY: group `g + k` < `direct`, so its 16 bytes are inside
                // `packed`; `buf` has room for 8 lanes at `k * 8`.
                unsafe {
                    let bytes = _mm_loadu_si128(packed.as_ptr().add(at) as *const __m128i);
                    let lanes = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(bytes), control);
                    let values = _mm256_and_si256(_mm256_srlv_epi32(lanes, shifts), mask);
                    _mm256_storeu_si256(buf.as_mut_ptr().add(k * 8) as *mut __m256i, values);
                }
            }
            sink.keys(&buf[..(take * 8).min(n - g * 8)]);
            g += take;
        }
        direct
    }
}

/// Unpack `n` values of `width` bits packed in `packed` (LSB first) into `sink`.
pub(super) fn unpack(packed: &[u8], width: usize, n: usize, sink: &mut impl KeySink) {
    macro_rules! widths {
        ($($w:literal)*) => {
            match width {
                0 => sink.run(0, n),
                $($w => unpack_width::<$w>(packed, n, sink),)*
                _ => unreachable!("bit widths are checked to be at most 32"),
            }
        };
    }
    widths!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32);
}

#[cfg(test)]
mod tests {
    use super::super::rle::Keys;
    use super::*;

    #[test]
    fn unpacking_every_width_and_length_gives_the_packed_values() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for width in 1..=32usize {
            for n in [1usize, 7, 8, 9, 15, 16, 17, 63, 64, 65, 127, 200, 1000] {
                let values: Vec<i32> = (0..n)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((state >> 20) & (u64::MAX >> (64 - width))) as i32
                    })
                    .collect();
                // Pack LSB first into exactly the bytes the values need.
                let mut packed = vec![0u8; (n * width).div_ceil(8)];
                for (i, &v) in values.iter().enumerate() {
                    for b in 0..width {
                        if (v as u32 >> b) & 1 == 1 {
                            let bit = i * width + b;
                            packed[bit / 8] |= 1 << (bit % 8);
                        }
                    }
                }
                let mut out: Vec<i32> = Vec::new();
                let mut sink = Keys {
                    out: &mut out,
                    max: 0,
                };
                unpack(&packed, width, n, &mut sink);
                let max = sink.max;
                assert_eq!(out, values, "width {width}, {n} values");
                assert_eq!(max, values.iter().map(|&v| v as u32).max().unwrap());
            }
        }
    }
}
