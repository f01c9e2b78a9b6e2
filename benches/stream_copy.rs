//! The collator's streaming copy at each store width, alone: 115 KB rows in random order from
//! a 342 MB buffer into a slab of 32 rows, one thread (what `stream_copy` in
//! `loader/src/gather/kernels.rs` picks among at run time). Standalone, no dependencies:
//!
//!     rustc -O benches/stream_copy.rs -o /tmp/stream_copy && /tmp/stream_copy
#![cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::time::Instant;

fn sse2(dst: &mut [u8], src: &[u8]) {
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let body = (dst.len() - head) / 16 * 16;
    unsafe {
        let d = dst.as_mut_ptr().add(head) as *mut __m128i;
        let s = src.as_ptr().add(head) as *const __m128i;
        for i in 0..body / 16 {
            _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i)));
        }
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}
#[target_feature(enable = "avx2")]
unsafe fn avx2(dst: &mut [u8], src: &[u8]) {
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let body = (dst.len() - head) / 32 * 32;
    unsafe {
        let d = dst.as_mut_ptr().add(head) as *mut __m256i;
        let s = src.as_ptr().add(head) as *const __m256i;
        for i in 0..body / 32 {
            _mm256_stream_si256(d.add(i), _mm256_loadu_si256(s.add(i)));
        }
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}
#[target_feature(enable = "avx512f")]
unsafe fn avx512(dst: &mut [u8], src: &[u8]) {
    let head = dst.as_ptr().align_offset(64).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let body = (dst.len() - head) / 64 * 64;
    unsafe {
        let d = dst.as_mut_ptr().add(head) as *mut __m512i;
        let s = src.as_ptr().add(head) as *const __m512i;
        for i in 0..body / 64 {
            _mm512_stream_si512(d.add(i), _mm512_loadu_si512(s.add(i)));
        }
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}
fn main() {
    let has = |f: &str| match f {
        "avx2" => is_x86_feature_detected!("avx2"),
        "avx512" => is_x86_feature_detected!("avx512f"),
        _ => true,
    };
    let row = 115_000usize;
    let rows = 2976usize;
    let src: Vec<u8> = (0..row * rows).map(|i| (i * 31 % 251) as u8).collect();
    let mut slab = vec![0u8; row * 32 + 4096];
    let mut order: Vec<usize> = (0..rows).collect();
    let mut x = 12345u64;
    for i in (1..rows).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    for round in 0..3 {
        for (name, f) in [("sse2", 0), ("avx2", 1), ("avx512", 2), ("memcpy", 3)] {
            if !has(name) {
                continue;
            }
            let t = Instant::now();
            for _ in 0..4 {
                for chunk in order.chunks(32) {
                    let mut at = 7; // unaligned like real offsets
                    for &r in chunk {
                        let s = &src[r * row..(r + 1) * row];
                        let d = &mut slab[at..at + row];
                        unsafe {
                            match f {
                                0 => sse2(d, s),
                                1 => avx2(d, s),
                                2 => avx512(d, s),
                                _ => d.copy_from_slice(s),
                            }
                        }
                        at += row;
                    }
                    unsafe { _mm_sfence() };
                }
            }
            let gb = (row * rows * 4) as f64 / 1e9;
            println!(
                "round {round} {name}: {:.2} GB/s",
                gb / t.elapsed().as_secs_f64()
            );
        }
    }
}
