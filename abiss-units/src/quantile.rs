//! The one sample quantile of the workspace: abissctl's disk profile, the client library's
//! direct-recording figures, the lab, the tests and the benchmarks all take it from here, so
//! that a p99 means the same everywhere (nearest rank, as the reports have always given it).

/// The value below which `quantile` (0 to 1) of `sorted` (ascending) lies, by nearest rank:
/// the smallest value with at least that share of the list at or below it; `None` for an
/// empty list. The median of an even count is the lower of the middle two.
#[must_use]
pub fn quantile<T: Copy>(sorted: &[T], quantile: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a rank within the slice"
    )]
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantile_is_nearest_rank() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&v, 0.5), Some(50));
        let thousand: Vec<u32> = (1..=1000).collect();
        assert_eq!(quantile(&thousand, 0.999), Some(999));
        assert_eq!(quantile(&[3.0_f32], 0.999), Some(3.0));
        assert_eq!(quantile::<u32>(&[], 0.5), None);
    }
}
