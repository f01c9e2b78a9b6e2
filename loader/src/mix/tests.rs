//! Tests of [`super`].

use super::*;

fn blend(weights: &[f64]) -> Blend {
    Blend {
        shares: Blend::shares(weights).unwrap(),
        weights: weights.to_vec(),
        tie: Blend::tie_order(3, weights.len()),
        drawn: 0,
        counts: vec![0; weights.len()],
    }
}

/// Every prefix holds each source within one row of its share.
#[test]
fn blending_is_exact_in_every_prefix() {
    for weights in [
        vec![0.6, 0.3, 0.1],
        vec![0.98, 0.02],
        vec![1.0, 1.0, 1.0, 5.0],
    ] {
        let total: f64 = weights.iter().sum();
        let mut b = blend(&weights);
        for n in 1..=100_000u64 {
            let s = b.pick();
            b.count(s);
            for (i, w) in weights.iter().enumerate() {
                let expected = w / total * n as f64;
                assert!(
                    (b.counts[i] as f64 - expected).abs() <= 1.0,
                    "{weights:?} after {n}: source {i} has {} (share {expected})",
                    b.counts[i]
                );
            }
        }
    }
}

#[test]
fn zero_weights_are_never_drawn_and_all_zero_is_refused() {
    let mut b = blend(&[0.0, 1.0]);
    for _ in 0..100 {
        let s = b.pick();
        assert_eq!(s, 1);
        b.count(s);
    }
    assert!(Blend::shares(&[0.0, 0.0]).is_err());
}
