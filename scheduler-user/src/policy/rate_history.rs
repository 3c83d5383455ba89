//! What a stream was admitted for over time: the bytes its rate earned between two instants.
//!
//! A raised reader may read its stream's file at the raised priority for as much as the stream
//! was admitted for since the raise: its buffer and what its rate earned (`raise`'s
//! allowance). The rate changes (trick play, `SetRate`), so what it earned is the integral of
//! the rates it had, not today's rate times the time since the raise: with the latter, a 1 B/s
//! stream raised an hour ago and set to 10 MB/s for a moment lent its reader 36 GB of real-time
//! reads at once.

use scheduler_common::MonotonicNs;

/// Changes kept: older ones are forgotten, and an instant before the oldest kept one counts
/// as that change's (what was earned before it is not counted: an allowance only shrinks).
pub(crate) const MAX_RATE_CHANGES: usize = 16;

/// The rates a stream had, from when it was attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RateHistory {
    /// `(from, bytes per second, bytes earned before from since the stream began)`, oldest
    /// first; never empty.
    changes: Vec<(MonotonicNs, u64, u128)>,
}

impl RateHistory {
    /// A stream at `rate_bps` from `now`.
    #[must_use]
    pub(crate) fn new(rate_bps: u64, now: MonotonicNs) -> Self {
        Self {
            changes: vec![(now, rate_bps, 0)],
        }
    }

    /// The stream has `rate_bps` from `now` on (an instant before the last change counts as
    /// the last change's).
    pub(crate) fn set(&mut self, rate_bps: u64, now: MonotonicNs) {
        let at = now.max(self.last().0);
        let earned = self.earned_at(at);
        self.changes.push((at, rate_bps, earned));
        if self.changes.len() > MAX_RATE_CHANGES {
            self.changes.remove(0);
        }
    }

    /// Bytes the rate earned from `since` to `now`.
    #[must_use]
    pub(crate) fn earned(&self, since: MonotonicNs, now: MonotonicNs) -> u128 {
        self.earned_at(now)
            .saturating_sub(self.earned_at(since.min(now)))
    }

    fn last(&self) -> (MonotonicNs, u64, u128) {
        self.changes[self.changes.len() - 1]
    }

    /// Bytes earned up to `at` since the first change (an instant before the oldest change
    /// kept counts as that change's).
    fn earned_at(&self, at: MonotonicNs) -> u128 {
        let at = at.max(self.changes[0].0);
        let segment = self.changes.iter().rev().find(|(from, _, _)| *from <= at);
        segment.map_or(0, |(from, rate, before)| {
            // `from <= at`: the subtraction never saturates.
            before + u128::from(*rate) * u128::from(at.saturating_since(*from)) / 1_000_000_000
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_rate_raised_a_moment_ago_earned_only_from_then() {
        let mut rates = RateHistory::new(1, MonotonicNs::ZERO);
        rates.set(10_000_000, MonotonicNs(3600 * S));
        // An hour at 1 B/s, then a second at 10 MB/s: not 36 GB.
        assert_eq!(
            rates.earned(MonotonicNs::ZERO, MonotonicNs(3601 * S)),
            3600 + 10_000_000
        );
        assert_eq!(
            rates.earned(MonotonicNs(3600 * S), MonotonicNs(3601 * S)),
            10_000_000
        );
        assert_eq!(
            rates.earned(MonotonicNs(1800 * S), MonotonicNs(3600 * S)),
            1800
        );
    }

    #[test]
    fn forgotten_changes_count_nothing() {
        let mut rates = RateHistory::new(1_000, MonotonicNs::ZERO);
        for second in 1..=(MAX_RATE_CHANGES as u64 + 4) {
            rates.set(1_000, MonotonicNs(second * S));
        }
        // Since 0, but the oldest change kept is from second 5: 15 s at 1 kB/s, not 20.
        assert_eq!(rates.earned(MonotonicNs::ZERO, MonotonicNs(20 * S)), 15_000);
    }

    proptest! {
        /// Whatever the changes, what was earned between two instants is never more than the
        /// highest rate over that span, and never less when the span grows.
        #[test]
        fn earned_is_bounded_by_the_highest_rate_and_grows_with_the_span(
            changes in proptest::collection::vec((0u64..10 * S, 0u64..1 << 30), 0..40),
            since in 0u64..200 * S,
            span in 0u64..100 * S,
            more in 0u64..100 * S,
        ) {
            let mut rates = RateHistory::new(changes.first().map_or(5, |c| c.1), MonotonicNs::ZERO);
            let mut at = 0;
            let mut highest = rates.last().1;
            for (gap, rate) in changes {
                at += gap;
                rates.set(rate, MonotonicNs(at));
                highest = highest.max(rate);
            }
            let earned = rates.earned(MonotonicNs(since), MonotonicNs(since + span));
            prop_assert!(earned <= u128::from(highest) * u128::from(span) / u128::from(S) + 1);
            prop_assert!(earned <= rates.earned(MonotonicNs(since), MonotonicNs(since + span + more)));
        }
    }
}
