//! Latencies the daemon keeps of itself (a raise's, from the kernel's event to the priority
//! set; its loop's lateness), in one kind of histogram, summarised one way.

use hdrhistogram::Histogram;

/// A histogram of nanoseconds from 1 µs to 60 s at two significant figures.
pub(crate) fn new() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, 60_000_000_000, 2)
        .expect("1 µs to 60 s at 2 significant digits are valid bounds")
}

/// The median, the 99th percentile and the largest value of `histogram`, in µs; `None`
/// each while it is empty.
pub(crate) fn quantiles_us(histogram: &Histogram<u64>) -> [Option<u64>; 3] {
    if histogram.is_empty() {
        return [None; 3];
    }
    [0.5, 0.99, 1.0].map(|q| Some(histogram.value_at_quantile(q) / 1000))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_empty_histogram_has_no_quantiles_and_a_full_one_reads_in_microseconds() {
        let mut histogram = super::new();
        assert_eq!(super::quantiles_us(&histogram), [None; 3]);
        for us in [100, 200, 300, 40_000] {
            histogram.record(us * 1000).expect("within bounds");
        }
        let [p50, p99, max] = super::quantiles_us(&histogram);
        assert!(p50.is_some_and(|v| (200..=202).contains(&v)), "{p50:?}");
        assert!(
            p99.is_some_and(|v| (40_000..=40_400).contains(&v)),
            "{p99:?}"
        );
        assert_eq!(p99, max);
    }
}
