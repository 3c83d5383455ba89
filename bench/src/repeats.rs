//! What repeated runs of one step add up to: the mean and its 95 % confidence interval
//! (Student's t over the runs), so a figure measured three times is given with how far it
//! could be off (pure).

use serde::Serialize;
use statrs::distribution::{ContinuousCDF as _, StudentsT};

/// The runs of one figure: their mean and its 95 % interval, and the runs themselves.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// The mean of the runs.
    pub mean: f64,
    /// The 95 % interval of that mean (the mean itself with one run).
    pub low: f64,
    /// See `low`.
    pub high: f64,
    /// Each run's figure, in order.
    pub runs: Vec<f64>,
}

impl Spread {
    /// The spread of `runs` (empty: NaN).
    #[must_use]
    pub fn of(runs: Vec<f64>) -> Self {
        #[expect(clippy::cast_precision_loss, reason = "a handful of runs")]
        let n = runs.len() as f64;
        let mean = runs.iter().sum::<f64>() / n;
        let half = if runs.len() < 2 {
            0.0
        } else {
            let variance = runs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
            let t =
                StudentsT::new(0.0, 1.0, n - 1.0).map_or(f64::NAN, |dist| dist.inverse_cdf(0.975));
            t * (variance / n).sqrt()
        };
        Self {
            mean,
            low: mean - half,
            high: mean + half,
            runs,
        }
    }

    /// The same, with the interval kept within `[floor, ceiling]` (a fraction cannot be
    /// negative).
    #[must_use]
    pub fn within(mut self, floor: f64, ceiling: f64) -> Self {
        self.low = self.low.clamp(floor, ceiling);
        self.high = self.high.clamp(floor, ceiling);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_runs_give_the_t_interval_of_their_mean() {
        let spread = Spread::of(vec![1.0, 2.0, 3.0]);
        // s = 1, t(0.975, 2 df) = 4.303: 2 ± 4.303 / √3.
        assert!((spread.mean - 2.0).abs() < 1e-12);
        assert!((spread.high - 2.0 - 4.302_653 / 3f64.sqrt()).abs() < 1e-5);
        assert!((spread.mean - spread.low - (spread.high - spread.mean)).abs() < 1e-12);
        let clamped = spread.within(0.0, 1.0);
        assert_eq!((clamped.low, clamped.high), (0.0, 1.0));
    }

    #[test]
    fn one_run_or_equal_runs_have_no_width() {
        let one = Spread::of(vec![0.25]);
        assert_eq!((one.low, one.mean, one.high), (0.25, 0.25, 0.25));
        let same = Spread::of(vec![0.0, 0.0, 0.0]);
        assert_eq!((same.low, same.high), (0.0, 0.0));
        assert!(Spread::of(Vec::new()).mean.is_nan());
    }
}
