//! Read latency distributions: an HDR histogram per reader, merged per run, summarised as the
//! percentiles the reports show and as a percentile curve for the charts.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latencies are recorded in microseconds, from 1 µs to an hour, to 3 significant digits.
const HIGHEST_US: u64 = 3_600_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;

/// The application-visible latencies of read(2) calls.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    histogram: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    #[must_use]
    pub fn new() -> Self {
        Self {
            histogram: Histogram::new_with_bounds(1, HIGHEST_US, SIGNIFICANT_DIGITS)
                .expect("constant bounds are valid"),
        }
    }

    /// Records one read's latency (clamped to the histogram's range).
    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.histogram.saturating_record(us.clamp(1, HIGHEST_US));
    }

    /// Adds another histogram's samples.
    pub fn merge(&mut self, other: &Self) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms with equal bounds add");
    }

    /// Samples recorded.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.histogram.len()
    }

    /// Whether nothing was recorded.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// The latency at quantile `q` (0..=1), in milliseconds.
    #[must_use]
    pub fn quantile_ms(&self, q: f64) -> f64 {
        us_to_ms(self.histogram.value_at_quantile(q))
    }

    /// The percentiles the reports show.
    #[must_use]
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            reads: self.len(),
            mean_ms: self.histogram.mean() / 1000.0,
            p50_ms: self.quantile_ms(0.5),
            p99_ms: self.quantile_ms(0.99),
            p99_9_ms: self.quantile_ms(0.999),
            max_ms: us_to_ms(self.histogram.max()),
        }
    }

    /// Points of the percentile curve: quantiles 1 - 10^(-k/10) (0 %, 20.6 %, 36.9 %, …, 90 %,
    /// …, 99 %, …) up to the last one the sample count resolves, then the maximum. These are
    /// evenly spaced on the "nines" axis of the charts.
    #[must_use]
    pub fn percentile_curve(&self) -> Vec<PercentilePoint> {
        if self.is_empty() {
            return Vec::new();
        }
        #[expect(clippy::cast_precision_loss, reason = "a sample count as a float")]
        let resolvable_nines = (self.len() as f64).log10();
        let mut points: Vec<PercentilePoint> = (0..=u16::MAX)
            .map(|k| f64::from(k) / 10.0)
            .take_while(|nines| *nines <= resolvable_nines)
            .map(|nines| {
                let quantile = 1.0 - 10f64.powf(-nines);
                PercentilePoint {
                    percentile: quantile * 100.0,
                    latency_ms: self.quantile_ms(quantile),
                }
            })
            .collect();
        points.push(PercentilePoint {
            percentile: 100.0,
            latency_ms: us_to_ms(self.histogram.max()),
        });
        points
    }
}

#[expect(clippy::cast_precision_loss, reason = "latencies far below 2^52 µs")]
fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Percentiles of a latency distribution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Reads measured.
    pub reads: u64,
    /// Mean latency.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p99_9_ms: f64,
    /// Largest latency.
    pub max_ms: f64,
}

/// One point of a percentile curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PercentilePoint {
    /// Percentile (0..=100).
    pub percentile: f64,
    /// Latency at that percentile.
    pub latency_ms: f64,
}

impl PercentilePoint {
    /// The position on a "nines" axis: 0 for 0 %, 1 for 90 %, 2 for 99 %, 3 for 99.9 %;
    /// `None` for 100 %, which has no finite position.
    #[must_use]
    pub fn nines(&self) -> Option<f64> {
        let tail = 1.0 - self.percentile / 100.0;
        (tail > 0.0).then(|| -tail.log10())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform_1_to_1000_ms() -> LatencyHistogram {
        let mut histogram = LatencyHistogram::new();
        for ms in 1..=1000 {
            histogram.record(Duration::from_millis(ms));
        }
        histogram
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= b * 0.002
    }

    #[test]
    fn summary_has_the_percentiles_of_the_samples() {
        let summary = uniform_1_to_1000_ms().summary();
        assert_eq!(summary.reads, 1000);
        assert!(close(summary.p50_ms, 500.0), "{summary:?}");
        assert!(close(summary.p99_ms, 990.0), "{summary:?}");
        assert!(close(summary.p99_9_ms, 999.0), "{summary:?}");
        assert!(close(summary.max_ms, 1000.0), "{summary:?}");
        assert!(close(summary.mean_ms, 500.5), "{summary:?}");
    }

    #[test]
    fn merge_combines_samples() {
        let mut a = LatencyHistogram::new();
        a.record(Duration::from_millis(1));
        let mut b = LatencyHistogram::new();
        b.record(Duration::from_millis(100));
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert!(close(a.summary().max_ms, 100.0));
    }

    #[test]
    fn sub_microsecond_reads_count_as_one_microsecond() {
        let mut histogram = LatencyHistogram::new();
        histogram.record(Duration::from_nanos(200));
        assert_eq!(histogram.len(), 1);
        assert!(close(histogram.summary().max_ms, 0.001));
    }

    #[test]
    fn curve_stops_where_the_samples_do_and_ends_at_the_maximum() {
        let curve = uniform_1_to_1000_ms().percentile_curve();
        // 1000 samples resolve three nines: k = 0..=30, then the maximum.
        assert_eq!(curve.len(), 32);
        assert_eq!(curve[0].nines(), Some(0.0));
        assert!((curve[10].percentile - 90.0).abs() < 1e-9);
        assert!((curve[10].nines().unwrap() - 1.0).abs() < 1e-9);
        assert!(close(curve[20].latency_ms, 990.0));
        let last = curve.last().unwrap();
        assert!((last.percentile - 100.0).abs() < f64::EPSILON);
        assert_eq!(last.nines(), None);
        assert!(curve.windows(2).all(|w| w[0].latency_ms <= w[1].latency_ms));
    }

    #[test]
    fn an_empty_histogram_has_no_curve() {
        assert!(LatencyHistogram::new().percentile_curve().is_empty());
    }
}
