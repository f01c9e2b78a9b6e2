//! Exact blending: which source the next row comes from.

use super::*;

/// Exact blending: see the module documentation.
#[derive(Clone, Debug)]
pub(super) struct Blend {
    /// The weights as given, and each source's share in 2^-40 units.
    pub(super) weights: Vec<f64>,
    pub(super) shares: Vec<u64>,
    /// Tie-break rank of each source (lower wins).
    pub(super) tie: Vec<u64>,
    /// Rows drawn since the counts were last reset.
    pub(super) drawn: u64,
    pub(super) counts: Vec<u64>,
}

pub(super) const ONE: i128 = 1 << 40;

impl Blend {
    /// Each weight's share in 2^-40 units; weights must be finite, not
    /// negative, and one at least positive.
    pub(super) fn shares(weights: &[f64]) -> Result<Vec<u64>> {
        if let Some(w) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return Err(LoaderError::BadOption {
                option: "weights",
                reason: format!("weight {w}: weights must be finite and not negative"),
            });
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 || !total.is_finite() {
            return Err(LoaderError::BadOption {
                option: "weights",
                reason: "at least one weight must be positive".into(),
            });
        }
        Ok(weights
            .iter()
            .map(|w| (w / total * ONE as f64).round() as u64)
            .collect())
    }

    /// Whether `counts` of `drawn` rows are what blending by `shares`
    /// leaves: they add up to `drawn`, a source of no share has none, and
    /// every other stays within `n + 1` rows of its share of `drawn` (the
    /// largest-deficit rule keeps each within a row or two). Counts forged
    /// past that would starve a source for as long as they are off.
    pub(super) fn check_counts(
        shares: &[u64],
        drawn: u64,
        counts: &[u64],
    ) -> std::result::Result<(), String> {
        let sum = counts
            .iter()
            .try_fold(0u64, |acc, &c| acc.checked_add(c))
            .ok_or("they overflow")?;
        if sum != drawn {
            return Err(format!("they add up to {sum}, not the {drawn} rows drawn"));
        }
        let total: i128 = shares.iter().map(|&s| i128::from(s)).sum();
        let slack = (shares.len() as i128 + 1) * total;
        for (i, (&share, &count)) in shares.iter().zip(counts).enumerate() {
            let off = i128::from(count) * total - i128::from(share) * i128::from(drawn);
            if (share == 0 && count > 0) || off.abs() > slack {
                return Err(format!(
                    "source {i} has {count} of {drawn} rows drawn, far from its share"
                ));
            }
        }
        Ok(())
    }

    pub(super) fn tie_order(seed: u64, n: usize) -> Vec<u64> {
        (0..n as u64)
            .map(|i| hash_words(&[seed, i, 0x7469_6573]))
            .collect()
    }

    /// The source furthest below its share.
    pub(super) fn pick(&self) -> usize {
        let next = i128::from(self.drawn) + 1;
        let mut best = usize::MAX;
        let mut best_key = (i128::MIN, 0u64);
        for (i, (&share, &count)) in self.shares.iter().zip(&self.counts).enumerate() {
            if share == 0 {
                continue;
            }
            let deficit = i128::from(share) * next - i128::from(count) * ONE;
            // Higher deficit first; then the lower tie rank.
            let key = (deficit, u64::MAX - self.tie[i]);
            if best == usize::MAX || key > best_key {
                best = i;
                best_key = key;
            }
        }
        best
    }

    pub(super) fn count(&mut self, source: usize) {
        // Saturating: counts may come from a state file.
        self.drawn = self.drawn.saturating_add(1);
        self.counts[source] = self.counts[source].saturating_add(1);
    }

    /// New weights; the counts restart.
    pub(super) fn set(&mut self, weights: &[f64]) -> Result<()> {
        self.shares = Blend::shares(weights)?;
        self.weights = weights.to_vec();
        self.reset();
        Ok(())
    }

    pub(super) fn reset(&mut self) {
        self.drawn = 0;
        self.counts.iter_mut().for_each(|c| *c = 0);
    }
}
