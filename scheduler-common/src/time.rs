//! Times on the kernel's monotonic clock ([`MonotonicNs`]).

/// A time on `CLOCK_MONOTONIC`, in nanoseconds: what the programs' `bpf_ktime_get_ns` reads
/// (so the times of their events, [`crate::PlayoutEvent::ts_ns`] and
/// [`crate::ForkEvent::ts_ns`]), what abissd's clock reads (`abiss_os::clock`), and what a
/// client's position message carries. One clock, so a client's message and the kernel's
/// events can be ordered by time.
///
/// Its own type so that a time is not taken for an offset, a size or a duration, nor for a
/// time on another clock: `task_struct.start_boottime` is `CLOCK_BOOTTIME`, which runs on
/// through suspend. The maps and events keep a plain `u64` (their layout is the ABI). A
/// duration stays a plain count of nanoseconds: [`Self::saturating_since`] gives one, and
/// [`Self::saturating_add`] adds one.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonotonicNs(pub u64);

impl MonotonicNs {
    /// The clock's beginning (boot): earlier than every time it reads.
    pub const ZERO: Self = Self(0);

    /// Nanoseconds from `earlier` to this time; 0 if `earlier` is later.
    #[must_use]
    pub const fn saturating_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// The time `ns` nanoseconds later (the clock's end at most).
    #[must_use]
    pub const fn saturating_add(self, ns: u64) -> Self {
        Self(self.0.saturating_add(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::MonotonicNs;

    #[test]
    fn times_give_durations_and_durations_give_times() {
        let earlier = MonotonicNs(1_000);
        let later = earlier.saturating_add(500);
        assert_eq!(later, MonotonicNs(1_500));
        assert_eq!(later.saturating_since(earlier), 500);
        assert_eq!(earlier.saturating_since(later), 0);
        assert_eq!(
            MonotonicNs(u64::MAX).saturating_add(1),
            MonotonicNs(u64::MAX)
        );
        assert!(MonotonicNs::ZERO < earlier);
    }
}
