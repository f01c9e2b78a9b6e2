//! The state numpy's `SeedSequence` gives a `PCG64`, computed without numpy:
//! a transform's generator is seeded per batch (and per row), and numpy's own
//! `default_rng(words)` took 19 us of the batch's 1 ms on a collate-bound
//! set; this takes well under one. The words and the stream they give are
//! numpy's exactly (a test compares them with `default_rng`'s), so a seed
//! gives the same numbers however the generator was made.

use pyo3::prelude::*;

// numpy's `SeedSequence` constants (O'Neill's `seed_seq_fe` with a pool of
// four 32-bit words).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut value = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    value = value.wrapping_mul(*hash_const);
    value ^ (value >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let result = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    result ^ (result >> XSHIFT)
}

/// `SeedSequence(entropy).generate_state(words, numpy.uint64)`: each entropy
/// value as numpy splits an int (its 32-bit words, low first; 0 as one word).
pub(crate) fn seed_sequence_state(entropy: &[u64], words: usize) -> Vec<u64> {
    let mut assembled = Vec::with_capacity(entropy.len() * 2);
    for &value in entropy {
        if value == 0 {
            assembled.push(0);
        }
        let mut rest = value;
        while rest > 0 {
            assembled.push(rest as u32);
            rest >>= 32;
        }
    }
    let mut hash_const = INIT_A;
    let mut pool = [0u32; POOL];
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hashmix(assembled.get(i).copied().unwrap_or(0), &mut hash_const);
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                pool[dst] = mix(pool[dst], hashmix(pool[src], &mut hash_const));
            }
        }
    }
    for &value in assembled.iter().skip(POOL) {
        for slot in pool.iter_mut() {
            *slot = mix(*slot, hashmix(value, &mut hash_const));
        }
    }
    let mut hash_const = INIT_B;
    let halves: Vec<u32> = (0..words * 2)
        .map(|i| {
            let mut value = pool[i % POOL] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            value = value.wrapping_mul(hash_const);
            value ^ (value >> XSHIFT)
        })
        .collect();
    halves
        .chunks_exact(2)
        .map(|pair| u64::from(pair[0]) | (u64::from(pair[1]) << 32))
        .collect()
}

/// The `words` 64-bit words numpy's `SeedSequence(entropy)` generates (4 for
/// a `PCG64`; at most 64), entropy values being 64-bit.
#[pyfunction]
#[pyo3(signature = (entropy, words = 4))]
pub(crate) fn _seed_state(entropy: Vec<u64>, words: usize) -> Vec<u64> {
    seed_sequence_state(&entropy, words.min(64))
}
