//! The real-time readers' schedule and deadlines (pure: fed times, no I/O).
//!
//! A stream of rate R is read in reads of S bytes into an application buffer of B bytes, as in
//! the ABISS slides' reference measurement ("Measurements, description": 1 MB/s, 64 kB reads,
//! 564 kB playout buffer). Read i is issued at `t0 + i·S/R` (or at once if the reader is
//! behind) and is due at `t0 + B/R + i·S/R`: playback starts once the buffer could have been
//! filled at the stream's rate, then consumes S bytes every S/R. A read that completes later
//! is a deadline miss; the reader keeps to its schedule after a miss, as a player that skips a
//! frame would.

use std::time::Duration;

use serde::Serialize;

/// A stream's rate, read size and application buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StreamSpec {
    /// The stream's byterate (bytes per second).
    pub rate_bps: u64,
    /// Bytes per read(2) call.
    pub read_bytes: u64,
    /// The application's playout buffer.
    pub buffer_bytes: u64,
}

impl StreamSpec {
    /// The time the stream takes to consume `bytes`.
    #[must_use]
    pub fn time_for(&self, bytes: u64) -> Duration {
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.rate_bps.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// When read `index` is issued, relative to the stream's start.
    #[must_use]
    pub fn issue_offset(&self, index: u64) -> Duration {
        self.time_for(index * self.read_bytes)
    }

    /// When read `index` must have completed, relative to the stream's start.
    #[must_use]
    pub fn deadline_offset(&self, index: u64) -> Duration {
        self.time_for(self.buffer_bytes + index * self.read_bytes)
    }

    /// How long a read issued on time may take before it misses: B/R.
    #[must_use]
    pub fn slack(&self) -> Duration {
        self.time_for(self.buffer_bytes)
    }
}

/// Deadline accounting of one reader (or, merged, of all readers of a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeadlineTally {
    /// Reads completed.
    pub reads: u64,
    /// Reads that completed after their deadline.
    pub misses: u64,
    /// Reads issued more than [`LATE_ISSUE_TOLERANCE`] after their issue time (the reader was
    /// still waiting for an earlier read).
    pub late_issues: u64,
    /// The largest amount by which a read overran its deadline (zero without misses).
    pub worst_overrun: Duration,
}

/// Sleeping threads wake up a little late; an issue within this of its time is on time.
pub const LATE_ISSUE_TOLERANCE: Duration = Duration::from_millis(5);

impl DeadlineTally {
    /// Records read `index`, issued at `issued` and completed at `completed` (both relative to
    /// the stream's start). Returns whether it missed its deadline.
    pub fn record(
        &mut self,
        spec: &StreamSpec,
        index: u64,
        issued: Duration,
        completed: Duration,
    ) -> bool {
        self.reads += 1;
        if issued > spec.issue_offset(index) + LATE_ISSUE_TOLERANCE {
            self.late_issues += 1;
        }
        let deadline = spec.deadline_offset(index);
        if completed > deadline {
            self.misses += 1;
            self.worst_overrun = self.worst_overrun.max(completed.saturating_sub(deadline));
            true
        } else {
            false
        }
    }

    /// Adds another tally (e.g. another reader's) to this one.
    pub fn merge(&mut self, other: &Self) {
        self.reads += other.reads;
        self.misses += other.misses;
        self.late_issues += other.late_issues;
        self.worst_overrun = self.worst_overrun.max(other.worst_overrun);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference stream: 1 MB/s, 64 KiB reads, 564 KiB buffer.
    const REFERENCE: StreamSpec = StreamSpec {
        rate_bps: 1_000_000,
        read_bytes: 64 << 10,
        buffer_bytes: 564 << 10,
    };

    #[test]
    fn issue_and_deadline_follow_the_rate() {
        assert_eq!(REFERENCE.issue_offset(0), Duration::ZERO);
        assert_eq!(REFERENCE.issue_offset(1), Duration::from_micros(65_536));
        assert_eq!(REFERENCE.issue_offset(10), Duration::from_micros(655_360));
        assert_eq!(REFERENCE.slack(), Duration::from_micros(577_536));
        assert_eq!(
            REFERENCE.deadline_offset(3),
            Duration::from_micros(577_536 + 3 * 65_536)
        );
    }

    #[test]
    fn a_read_misses_only_after_its_deadline() {
        let mut tally = DeadlineTally::default();
        let deadline = REFERENCE.deadline_offset(2);
        let issued = REFERENCE.issue_offset(2);
        assert!(!tally.record(&REFERENCE, 2, issued, deadline));
        assert!(tally.record(&REFERENCE, 2, issued, deadline + Duration::from_millis(7)));
        assert_eq!(tally.reads, 2);
        assert_eq!(tally.misses, 1);
        assert_eq!(tally.late_issues, 0);
        assert_eq!(tally.worst_overrun, Duration::from_millis(7));
    }

    #[test]
    fn a_late_issue_keeps_the_original_deadline() {
        // A reader held up by a slow read issues read 5 late; its deadline does not move.
        let mut tally = DeadlineTally::default();
        let issued = REFERENCE.issue_offset(5) + Duration::from_millis(300);
        let completed = issued + Duration::from_millis(300);
        assert!(tally.record(&REFERENCE, 5, issued, completed));
        assert_eq!(tally.late_issues, 1);
        assert_eq!(
            tally.worst_overrun,
            completed.saturating_sub(REFERENCE.deadline_offset(5))
        );
    }

    #[test]
    fn merge_adds_counts_and_keeps_the_worst_overrun() {
        let mut a = DeadlineTally {
            reads: 10,
            misses: 1,
            late_issues: 2,
            worst_overrun: Duration::from_millis(4),
        };
        let b = DeadlineTally {
            reads: 5,
            misses: 2,
            late_issues: 0,
            worst_overrun: Duration::from_millis(9),
        };
        a.merge(&b);
        assert_eq!(
            a,
            DeadlineTally {
                reads: 15,
                misses: 3,
                late_issues: 2,
                worst_overrun: Duration::from_millis(9)
            }
        );
    }
}
