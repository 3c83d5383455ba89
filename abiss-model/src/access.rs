//! [`AccessTimes`]: the time a model's disk takes to reach a block, with the integrals over
//! the seek curve that do not depend on the queue computed once.
//!
//! Admission asks for these figures in every prediction, and a `status` or a refusal bisects
//! over dozens of predictions. Computed afresh each time, the seek curve's integrals (about
//! 24 000 evaluations of it per prediction) were most of abissd's CPU time while the protocol
//! fuzzer asked for `status` every 50 ms: 86 % of its samples (`perf record -g -p` on the
//! debug daemon), and root's `status` took 20 ms at the median. Built once per model, a
//! prediction integrates only what depends on the queue: the ordered gap.

use crate::DeviceModel;

/// Steps of the midpoint rule over the seek distance in the ordered-seek integral.
const ORDERED_STEPS: u32 = 2000;

/// A model's access-time figures (seek, rotation, driver overhead), ready to be asked often.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessTimes {
    /// At the midpoint `x` of each step of the ordered-seek integral: `ln(1 − x)` and the
    /// seek time over distance `x`, ms.
    steps: Vec<(f64, f64)>,
    /// Mean and variance of the seek between two random positions, ms and ms².
    random_seek_ms: (f64, f64),
    /// One revolution, ms.
    revolution_ms: f64,
    /// What the measured access takes beyond the fitted seek and half a revolution, ms.
    overhead_ms: f64,
    /// The longest access, s.
    worst_s: f64,
}

impl AccessTimes {
    /// The figures of `model`.
    #[must_use]
    pub fn new(model: &DeviceModel) -> Self {
        let random_seek_ms = model.seek.random_seek_moments();
        let steps = (0..ORDERED_STEPS)
            .map(|i| {
                let x = (f64::from(i) + 0.5) / f64::from(ORDERED_STEPS);
                ((1.0 - x).ln(), model.seek.seek_ms(x))
            })
            .collect();
        Self {
            steps,
            random_seek_ms,
            revolution_ms: model.revolution_ms,
            overhead_ms: (model.mean_access_ms - random_seek_ms.0 - model.revolution_ms / 2.0)
                .max(0.0),
            // A full-stroke seek and a whole revolution; never less than the measured mean.
            worst_s: ((model.seek.full_stroke_ms + model.revolution_ms).max(model.mean_access_ms))
                / 1e3,
        }
    }

    /// Mean seek time, ms, when the elevator orders `queued` requests at random positions
    /// (`queued` ≥ 1; 1 is TRAC's random placement with no reordering).
    ///
    /// Sorted by position, the gap from one request to the next has the density
    /// `(k + 1)(1 − x)^k` (Beta(1, k + 1); for k = 1 that is the distance of two random
    /// points); one sweep of k requests also ends with a return, a random seek, so the mean is
    /// `(k·E[seek(gap)] + E[random seek]) / (k + 1)`.
    #[must_use]
    pub fn ordered_seek_mean_ms(&self, queued: f64) -> f64 {
        let k = queued.max(1.0);
        let gap_mean: f64 = self
            .steps
            .iter()
            .map(|(ln_rest, seek_ms)| (k + 1.0) * (k * ln_rest).exp() * seek_ms)
            .sum::<f64>()
            / f64::from(ORDERED_STEPS);
        (k * gap_mean + self.random_seek_ms.0) / (k + 1.0)
    }

    /// Time the measured random access takes beyond the fitted seek plus half a revolution
    /// (driver and controller time), ms; never negative.
    #[must_use]
    pub fn overhead_ms(&self) -> f64 {
        self.overhead_ms
    }

    /// Mean time to reach a block, s, with `queued` requests for the elevator to order: the
    /// seek, half a revolution, and the overhead.
    #[must_use]
    pub fn mean_s(&self, queued: f64) -> f64 {
        (self.ordered_seek_mean_ms(queued) + self.revolution_ms / 2.0 + self.overhead_ms) / 1e3
    }

    /// Variance of the time to reach a random block, s² (random seek distance, rotational
    /// latency uniform over a revolution): the larger, unordered spread.
    #[must_use]
    pub fn variance_s2(&self) -> f64 {
        (self.random_seek_ms.1 + self.revolution_ms * self.revolution_ms / 12.0) / 1e6
    }

    /// The longest access: a full-stroke seek and a whole revolution, s (the deterministic
    /// worst case); never less than the measured mean.
    #[must_use]
    pub fn worst_s(&self) -> f64 {
        self.worst_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{laptop_disk, LAPTOP_REVOLUTION_MS};

    /// The ordered-seek integral as it was computed before it was split: `powf` at each
    /// step, the seek curve evaluated afresh.
    fn ordered_seek_mean_directly(model: &DeviceModel, queued: f64) -> f64 {
        let k = queued.max(1.0);
        let mut gap_mean = 0.0;
        for i in 0..ORDERED_STEPS {
            let x = (f64::from(i) + 0.5) / f64::from(ORDERED_STEPS);
            gap_mean +=
                (k + 1.0) * (1.0 - x).powf(k) * model.seek.seek_ms(x) / f64::from(ORDERED_STEPS);
        }
        (k * gap_mean + model.seek.random_seek_moments().0) / (k + 1.0)
    }

    #[test]
    fn the_split_integral_is_the_direct_one() {
        let model = laptop_disk(1.0, LAPTOP_REVOLUTION_MS);
        let times = AccessTimes::new(&model);
        for queued in [0.5, 1.0, 1.7, 2.0, 4.0, 8.0, 33.3, 500.0, 10_000.0] {
            let split = times.ordered_seek_mean_ms(queued);
            let direct = ordered_seek_mean_directly(&model, queued);
            assert!(
                (split - direct).abs() <= 1e-9 * direct.abs().max(1.0),
                "{queued}: {split} against {direct}"
            );
        }
    }

    #[test]
    fn ordering_shortens_seeks_and_no_access_is_worse_than_the_worst() {
        let model = laptop_disk(1.0, LAPTOP_REVOLUTION_MS);
        let times = AccessTimes::new(&model);
        let random = times.ordered_seek_mean_ms(1.0);
        assert!(
            (random - model.seek.random_seek_moments().0).abs() < 0.5,
            "{random}"
        );
        let mut last = random;
        for queued in [2.0, 4.0, 16.0, 64.0] {
            let ordered = times.ordered_seek_mean_ms(queued);
            assert!(ordered < last, "{queued}: {ordered} after {last}");
            last = ordered;
        }
        assert!(times.mean_s(1.0) <= times.worst_s());
        assert!(times.variance_s2() > 0.0);
    }
}
