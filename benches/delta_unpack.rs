//! The `DELTA_BINARY_PACKED` miniblock kernels alone (what `unpack32` in
//! `loader/src/parquet/delta.rs` picks between at run time): 32 deltas of `w`
//! bits unpacked and summed onto the value before, scalar (one 8-byte load,
//! shift and mask per value) and AVX-512 VBMI (8 values a vector from one
//! byte permutation), over an 8 KiB buffer that stays in cache. Standalone,
//! no dependencies:
//!
//!     rustc --edition 2024 -O benches/delta_unpack.rs -o /tmp/delta_unpack && /tmp/delta_unpack
#![cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::time::Instant;

/// The scalar kernel with the width a constant, as the loader compiles it
/// (one unrolled copy per width).
fn scalar<const W: usize>(src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    let mask = (1u64 << W) - 1;
    let mut value = *last;
    for (i, o) in out.iter_mut().enumerate() {
        let bit = i * W;
        let word = u64::from_le_bytes(src[bit / 8..bit / 8 + 8].try_into().unwrap());
        value = value.wrapping_add(min_delta).wrapping_add((word >> (bit % 8)) & mask);
        *o = value;
    }
    *last = value;
}

#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
unsafe fn simd(w: usize, table: &([u8; 64], [u64; 8]), src: &[u8], min_delta: u64, last: &mut u64, out: &mut [u64; 32]) {
    let load: u64 = if w + 8 >= 64 { u64::MAX } else { (1u64 << (w + 8)) - 1 };
    unsafe {
        let positions = _mm512_loadu_si512(table.0.as_ptr().cast());
        let shifts = _mm512_loadu_si512(table.1.as_ptr().cast());
        let mask = _mm512_set1_epi64(((1u64 << w) - 1) as i64);
        let min = _mm512_set1_epi64(min_delta as i64);
        let zero = _mm512_setzero_si512();
        let mut carry = _mm512_set1_epi64(*last as i64);
        for g in 0..4 {
            let bytes = _mm512_maskz_loadu_epi8(load, src.as_ptr().add(g * w).cast());
            let mut v = _mm512_permutexvar_epi8(positions, bytes);
            v = _mm512_add_epi64(_mm512_and_si512(_mm512_srlv_epi64(v, shifts), mask), min);
            v = _mm512_add_epi64(v, _mm512_alignr_epi64::<7>(v, zero));
            v = _mm512_add_epi64(v, _mm512_alignr_epi64::<6>(v, zero));
            v = _mm512_add_epi64(v, _mm512_alignr_epi64::<4>(v, zero));
            v = _mm512_add_epi64(v, carry);
            _mm512_storeu_si512(out.as_mut_ptr().add(g * 8).cast(), v);
            carry = _mm512_permutexvar_epi64(_mm512_set1_epi64(7), v);
        }
    }
    *last = out[31];
}

fn main() {
    let vbmi = is_x86_feature_detected!("avx512vbmi") && is_x86_feature_detected!("avx512bw");
    let src: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for w in [4usize, 8, 12, 17, 20, 30] {
        let mut table = ([0u8; 64], [0u64; 8]);
        for lane in 0..8 {
            for b in 0..8 {
                table.0[lane * 8 + b] = (lane * w / 8 + b) as u8;
            }
            table.1[lane] = (lane * w % 8) as u64;
        }
        let (mut out, mut last, n) = ([0u64; 32], 0u64, 400_000);
        let at = |k: usize| (k * 4 * w) % (8192 - 4 * w - 16);
        let t = Instant::now();
        for k in 0..n {
            let src = &src[at(k)..];
            match w {
                4 => scalar::<4>(src, 3, &mut last, &mut out),
                8 => scalar::<8>(src, 3, &mut last, &mut out),
                12 => scalar::<12>(src, 3, &mut last, &mut out),
                17 => scalar::<17>(src, 3, &mut last, &mut out),
                20 => scalar::<20>(src, 3, &mut last, &mut out),
                _ => scalar::<30>(src, 3, &mut last, &mut out),
            }
            std::hint::black_box(&out);
        }
        let a = t.elapsed().as_secs_f64() / n as f64 / 32.0 * 1e9;
        let b = if vbmi {
            let t = Instant::now();
            for k in 0..n {
                // SAFETY: the CPU has the features (checked above).
                unsafe { simd(w, &table, &src[at(k)..], 3, &mut last, &mut out) };
                std::hint::black_box(&out);
            }
            t.elapsed().as_secs_f64() / n as f64 / 32.0 * 1e9
        } else {
            f64::NAN
        };
        println!("w={w:2}: scalar {a:.2} ns/value, avx512 {b:.2} ns/value ({:.2}x)", a / b);
    }
}
