//! How punctual the daemon's loop is. Every load starts when the loop wakes for it, so a
//! stream misses when a refill waits longer than its buffer's slack, in the disk or before
//! it: a loop that runs late (other tasks on its CPU, a long turn of its own) is the second
//! kind, and the suite's timing tests print this figure beside their misses to tell the two
//! apart. The credit timer is tokio's, whose wheel rounds a deadline up to the next
//! millisecond: a timer lateness of about 1 ms is that rounding, not a busy loop. The figures
//! are daemon-wide, as `status`'s other counts are, for every user.

use std::time::{Duration, Instant};

use abiss_proto::LoopReport;
use hdrhistogram::Histogram;
use scheduler_common::MonotonicNs;

use crate::latency_histogram::{self, quantiles_us};

/// Lateness of the credit timer's wakeups and of readers' accesses, and the longest turn of
/// the loop.
#[derive(Debug)]
pub(crate) struct LoopClock {
    /// Timer lateness in ns.
    late: Histogram<u64>,
    /// Access to handling in ns.
    access: Histogram<u64>,
    longest_turn: Duration,
}

impl Default for LoopClock {
    fn default() -> Self {
        Self {
            late: latency_histogram::new(),
            access: latency_histogram::new(),
            longest_turn: Duration::ZERO,
        }
    }
}

impl LoopClock {
    /// The credit timer, set for `set_for`, ran at `ran`.
    pub(crate) fn timer_fired(&mut self, set_for: Instant, ran: Instant) {
        let late = ran.saturating_duration_since(set_for);
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.late.saturating_record(ns.max(1_000));
    }

    /// The loop handled, at `now`, a reader's access the kernel saw at `at`.
    pub(crate) fn access_handled(&mut self, at: MonotonicNs, now: MonotonicNs) {
        self.access
            .saturating_record(now.saturating_since(at).max(1_000));
    }

    /// One turn of the loop (a wakeup and its work) took `took`.
    pub(crate) fn turn(&mut self, took: Duration) {
        self.longest_turn = self.longest_turn.max(took);
    }

    /// Figures for `status`.
    #[must_use]
    pub(crate) fn report(&self) -> LoopReport {
        let [late_p50_us, late_p99_us, late_max_us] = quantiles_us(&self.late);
        let [access_p50_us, access_p99_us, access_max_us] = quantiles_us(&self.access);
        LoopReport {
            timer_wakeups: self.late.len(),
            late_p50_us,
            late_p99_us,
            late_max_us,
            longest_turn_us: u64::try_from(self.longest_turn.as_micros()).unwrap_or(u64::MAX),
            accesses: self.access.len(),
            access_p50_us,
            access_p99_us,
            access_max_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_and_the_longest_turn_are_reported_in_microseconds() {
        let mut clock = LoopClock::default();
        assert_eq!(clock.report(), LoopReport::default());
        let set_for = Instant::now();
        for late_ms in [1, 1, 2, 250] {
            clock.timer_fired(set_for, set_for + Duration::from_millis(late_ms));
        }
        // A timer run early (tokio rounds to its millisecond wheel) counts as on time.
        clock.timer_fired(set_for + Duration::from_millis(5), set_for);
        clock.access_handled(MonotonicNs(1_000_000), MonotonicNs(4_000_000));
        clock.turn(Duration::from_micros(700));
        clock.turn(Duration::from_micros(300));
        let report = clock.report();
        assert_eq!(report.timer_wakeups, 5);
        // Two significant figures: a value reads back within 1 % above.
        let within =
            |value: Option<u64>, us: u64| value.is_some_and(|v| (us..=us * 101 / 100).contains(&v));
        assert!(within(report.late_p50_us, 1000), "{report:?}");
        assert!(report
            .late_max_us
            .is_some_and(|max| (249_000..=251_000).contains(&max)));
        assert_eq!(report.longest_turn_us, 700);
        assert_eq!(report.accesses, 1);
        assert!(within(report.access_max_us, 3000), "{report:?}");
    }
}
