//! The credit timer: a token bucket that meters a stream's window movement at its granted rate.
//!
//! After the ABISS slides ("Rate control"): credit accrues at rate R up to a credit limit, and
//! every byte the stream loads costs a byte of credit: window movement, the initial fill and the
//! refill after a seek alike. So whatever the reader does, a stream loads at most
//! `limit + R × t` bytes in `t` seconds. The bucket starts full, so the first fill is immediate.

use scheduler_common::MonotonicNs;

/// Nanoseconds per second.
const NS: i128 = 1_000_000_000;

/// A token bucket in bytes, exact to the nanosecond (credit is kept in byte-nanoseconds, so
/// no rounding accumulates however often it is read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CreditTimer {
    rate_bps: u64,
    /// Credit in bytes × 10⁹.
    scaled: i128,
    limit_scaled: i128,
    /// When credit last accrued.
    accrued_at: MonotonicNs,
}

impl CreditTimer {
    /// A full timer at `rate_bps` that holds at most `limit_bytes` of credit.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn new(rate_bps: u64, limit_bytes: u64, now: MonotonicNs) -> Self {
        Self::starting_with(rate_bps, limit_bytes, limit_bytes, now)
    }

    /// A timer that starts with `start_bytes` of credit (at most the limit): a stream whose
    /// start-up burst was cut short ([`super::burst`]).
    #[must_use]
    pub(crate) fn starting_with(
        rate_bps: u64,
        limit_bytes: u64,
        start_bytes: u64,
        now: MonotonicNs,
    ) -> Self {
        let limit_scaled = i128::from(limit_bytes) * NS;
        Self {
            rate_bps,
            scaled: (i128::from(start_bytes) * NS).min(limit_scaled),
            limit_scaled,
            accrued_at: now,
        }
    }

    /// From `now` on, credit accrues at `rate_bps` (what accrued until then stays).
    pub(crate) fn set_rate(&mut self, rate_bps: u64, now: MonotonicNs) {
        self.accrue(now);
        self.rate_bps = rate_bps;
    }

    /// From `now` on, the timer holds at most `limit_bytes` (a buffer that grew): what
    /// accrued until then stays, up to the new limit.
    pub(crate) fn set_limit(&mut self, limit_bytes: u64, now: MonotonicNs) {
        self.accrue(now);
        self.limit_scaled = i128::from(limit_bytes) * NS;
        self.scaled = self.scaled.min(self.limit_scaled);
    }

    /// Adds `bytes` of credit from outside the rate (a seek's refill, paid by the owner's
    /// start-up allowance), up to the limit.
    pub(crate) fn grant(&mut self, bytes: u64) {
        self.scaled = (self.scaled + i128::from(bytes) * NS).min(self.limit_scaled);
    }

    /// Adds the credit earned since the last call.
    pub(crate) fn accrue(&mut self, now: MonotonicNs) {
        let elapsed = i128::from(now.saturating_since(self.accrued_at));
        self.accrued_at = self.accrued_at.max(now);
        self.scaled = (self.scaled + elapsed * i128::from(self.rate_bps)).min(self.limit_scaled);
    }

    /// Whole bytes of credit now.
    #[must_use]
    pub(crate) fn credit_bytes(&self) -> u64 {
        u64::try_from(self.scaled / NS).unwrap_or(0)
    }

    /// Spends `bytes` if the credit covers them.
    pub(crate) fn try_spend(&mut self, bytes: u64) -> bool {
        let cost = i128::from(bytes) * NS;
        if self.scaled >= cost {
            self.scaled -= cost;
            true
        } else {
            false
        }
    }

    /// Nanoseconds from `now` until the credit covers `bytes` (0 if it does). Counted
    /// from the last accrual, not from the call: the daemon asks again after every event,
    /// and a wait counted from each call was pushed back by every event that came sooner,
    /// so that a client polling `list` every 50 ms kept a window from refilling for as long
    /// as it polled.
    #[must_use]
    pub(crate) fn ns_until(&self, bytes: u64, now: MonotonicNs) -> u64 {
        let missing = i128::from(bytes) * NS - self.scaled;
        if missing <= 0 || self.rate_bps == 0 {
            return 0;
        }
        let rate = i128::from(self.rate_bps);
        let from_last = u64::try_from((missing + rate - 1) / rate).unwrap_or(u64::MAX);
        self.accrued_at
            .saturating_add(from_last)
            .saturating_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn credit_accrues_at_the_rate_up_to_the_limit() {
        let mut timer = CreditTimer::new(1_000_000, 200_000, MonotonicNs::ZERO);
        assert_eq!(timer.credit_bytes(), 200_000, "starts full");
        assert!(timer.try_spend(200_000));
        timer.accrue(MonotonicNs(100_000_000)); // 0.1 s
        assert_eq!(timer.credit_bytes(), 100_000);
        timer.accrue(MonotonicNs(10_000_000_000));
        assert_eq!(timer.credit_bytes(), 200_000, "capped at the limit");
        assert!(timer.try_spend(150_000));
        assert!(!timer.try_spend(150_000));
        assert_eq!(
            timer.ns_until(150_000, MonotonicNs(10_000_000_000)),
            100_000_000
        );
        // Asked again later, without an accrual between: the wait is shorter by as much.
        assert_eq!(
            timer.ns_until(150_000, MonotonicNs(10_060_000_000)),
            40_000_000
        );
        assert_eq!(timer.ns_until(150_000, MonotonicNs(10_200_000_000)), 0);
    }

    proptest! {
        /// Whatever the pattern of accruals, spending never exceeds rate × time + limit.
        #[test]
        fn spending_is_bounded_by_rate_and_limit(
            rate in 1u64..10_000_000,
            limit in 0u64..1_000_000,
            steps in proptest::collection::vec((0u64..50_000_000, 1u64..200_000), 1..200),
        ) {
            let mut timer = CreditTimer::new(rate, limit, MonotonicNs::ZERO);
            let (mut now, mut spent) = (0u64, 0u128);
            for (dt, want) in steps {
                now += dt;
                timer.accrue(MonotonicNs(now));
                if timer.try_spend(want) {
                    spent += u128::from(want);
                }
            }
            let allowed = u128::from(rate) * u128::from(now) / 1_000_000_000 + u128::from(limit);
            prop_assert!(spent <= allowed, "spent {} > allowed {}", spent, allowed);
        }

        /// With the rate changed on the way (trick play), spending never exceeds the limit
        /// plus each rate times the time it was in force.
        #[test]
        fn spending_follows_each_rate_while_it_holds(
            limit in 0u64..1_000_000,
            steps in proptest::collection::vec(
                (0u64..50_000_000, 1u64..200_000, proptest::option::of(1u64..10_000_000)),
                1..200,
            ),
        ) {
            let mut rate = 1_000_000u64;
            let mut timer = CreditTimer::new(rate, limit, MonotonicNs::ZERO);
            let (mut now, mut spent, mut earned_scaled) = (0u64, 0u128, 0u128);
            for (dt, want, new_rate) in steps {
                now += dt;
                earned_scaled += u128::from(rate) * u128::from(dt);
                if let Some(new_rate) = new_rate {
                    timer.set_rate(new_rate, MonotonicNs(now));
                    rate = new_rate;
                } else {
                    timer.accrue(MonotonicNs(now));
                }
                if timer.try_spend(want) {
                    spent += u128::from(want);
                }
            }
            let allowed = earned_scaled / 1_000_000_000 + u128::from(limit);
            prop_assert!(spent <= allowed, "spent {} > allowed {}", spent, allowed);
        }
    }
}
