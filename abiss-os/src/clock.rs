//! The monotonic clock, and how long the calling thread has waited for a CPU.

use scheduler_common::MonotonicNs;

/// `CLOCK_MONOTONIC` in nanoseconds: `bpf_ktime_get_ns()` reads the same clock, so the
/// daemon can order a client's position message against the kernel's events.
#[must_use]
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux; 0 ("the beginning") is a harmless answer if it did.
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(now.tv_nsec()).unwrap_or(0)
    })
}

/// [`monotonic_ns`] as a time ([`MonotonicNs`]).
#[must_use]
pub fn monotonic_now() -> MonotonicNs {
    MonotonicNs(monotonic_ns())
}

/// How long the calling thread has waited on a run queue so far, ns: the second figure of
/// `/proc/thread-self/schedstat` (the kernel's `run_delay`). Read before and after a call, the
/// difference is the part of the call's time the thread was runnable but not running, which
/// is the machine's CPU load, not the call. 0 where the kernel does not say (no schedstats).
#[must_use]
pub fn thread_run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_never_goes_back() {
        let first = monotonic_ns();
        let second = monotonic_ns();
        assert!(first > 0);
        assert!(second >= first);
    }
}
