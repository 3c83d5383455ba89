//! Log2 latency histograms, as bcc's biolatency prints them.

use serde::{Deserialize, Serialize};

/// Buckets per histogram: bucket 0 holds latencies under 1 µs, bucket `i > 0` holds
/// `[2^(i-1), 2^i)` µs, and the last bucket also holds everything longer.
pub const LATENCY_BUCKETS: usize = 27;

/// A log2 µs latency histogram with its exact maximum where known.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log2Histogram {
    /// Counts per bucket (see [`LATENCY_BUCKETS`]).
    pub slots: Vec<u64>,
    /// Largest latency, ns. Exact when `max_exact`; otherwise an upper bound taken from the
    /// highest non-empty bucket (a difference of two snapshots whose maximum did not grow).
    pub max_ns: u64,
    /// Whether `max_ns` is the exact maximum.
    pub max_exact: bool,
}

impl Log2Histogram {
    /// A histogram from bucket counts and an exact maximum.
    #[must_use]
    pub fn from_slots(slots: &[u64], max_ns: u64) -> Self {
        Self {
            slots: slots.to_vec(),
            max_ns,
            max_exact: true,
        }
    }

    /// Number of samples.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.slots.iter().sum()
    }

    /// Bounds of bucket `index` in µs: `[low, high)`.
    #[must_use]
    pub fn bucket_bounds_us(index: usize) -> (u64, u64) {
        if index == 0 {
            (0, 1)
        } else {
            (1 << (index - 1), 1 << index)
        }
    }

    /// The samples added since `earlier`, a snapshot of the same cumulative histogram.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        let slots: Vec<u64> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, now)| now.saturating_sub(earlier.slots.get(i).copied().unwrap_or(0)))
            .collect();
        let mut delta = Self {
            slots,
            max_ns: 0,
            max_exact: false,
        };
        if delta.count() == 0 {
            delta.max_exact = true;
        } else if self.max_ns > earlier.max_ns {
            // The maximum grew, so the new maximum was among the new samples.
            delta.max_ns = self.max_ns;
            delta.max_exact = self.max_exact;
        } else {
            let top = delta.slots.iter().rposition(|&c| c > 0).unwrap_or(0);
            delta.max_ns = (Self::bucket_bounds_us(top).1 * 1000).min(self.max_ns);
        }
        delta
    }

    /// Adds another histogram's samples (e.g. of another CPU).
    pub fn merge(&mut self, other: &Self) {
        if self.slots.len() < other.slots.len() {
            self.slots.resize(other.slots.len(), 0);
        }
        for (mine, theirs) in self.slots.iter_mut().zip(&other.slots) {
            *mine += theirs;
        }
        if other.max_ns > self.max_ns {
            self.max_ns = other.max_ns;
        }
        self.max_exact = self.max_exact && other.max_exact;
    }

    /// Upper bound, in µs, of the latency below which a fraction `quantile` (0..=1) of the
    /// samples lie: the top of the bucket holding that sample, capped by the maximum.
    /// `None` for an empty histogram.
    #[must_use]
    pub fn quantile_us(&self, quantile: f64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank within a u64 count, clamped to 1..=total"
        )]
        let rank = ((quantile.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, &count) in self.slots.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let high = Self::bucket_bounds_us(index).1;
                return Some(high.min(self.max_ns.div_ceil(1000)));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn histogram(slots: &[(usize, u64)], max_ns: u64) -> Log2Histogram {
        let mut all = vec![0; LATENCY_BUCKETS];
        for &(i, c) in slots {
            all[i] = c;
        }
        Log2Histogram::from_slots(&all, max_ns)
    }

    #[test]
    fn quantiles_are_bucket_tops_capped_by_max() {
        // 90 samples in [64, 128) µs, 10 in [1024, 2048) µs, max 1.5 ms.
        let h = histogram(&[(7, 90), (11, 10)], 1_500_000);
        assert_eq!(h.quantile_us(0.5), Some(128));
        assert_eq!(h.quantile_us(0.9), Some(128));
        assert_eq!(h.quantile_us(0.91), Some(1500));
        assert_eq!(h.quantile_us(1.0), Some(1500));
        assert_eq!(Log2Histogram::default().quantile_us(0.5), None);
    }

    #[test]
    fn a_difference_knows_when_its_maximum_is_exact() {
        let before = histogram(&[(7, 10)], 100_000);
        let grew = histogram(&[(7, 10), (11, 1)], 1_500_000);
        let delta = grew.since(&before);
        assert_eq!(delta.count(), 1);
        assert!(delta.max_exact);
        assert_eq!(delta.max_ns, 1_500_000);

        let same_max = histogram(&[(7, 15)], 100_000);
        let delta = same_max.since(&before);
        assert_eq!(delta.count(), 5);
        assert!(!delta.max_exact);
        assert_eq!(delta.max_ns, 100_000);
    }

    proptest! {
        #[test]
        fn quantiles_are_monotone(counts in proptest::collection::vec(0u64..1000, LATENCY_BUCKETS),
                                  a in 0.0f64..=1.0, b in 0.0f64..=1.0) {
            let h = Log2Histogram::from_slots(&counts, u64::MAX / 2);
            let (low, high) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(h.quantile_us(low) <= h.quantile_us(high));
        }

        #[test]
        fn since_then_merge_restores(first in proptest::collection::vec(0u64..1000, LATENCY_BUCKETS),
                                     extra in proptest::collection::vec(0u64..1000, LATENCY_BUCKETS)) {
            let earlier = Log2Histogram::from_slots(&first, 10);
            let later_slots: Vec<u64> = first.iter().zip(&extra).map(|(a, b)| a + b).collect();
            let later = Log2Histogram::from_slots(&later_slots, 10);
            let mut rebuilt = earlier.clone();
            rebuilt.merge(&later.since(&earlier));
            prop_assert_eq!(rebuilt.slots, later.slots);
        }
    }
}
