//! The start-up burst allowance: what a new stream may load at once, before its credit timer
//! paces it.
//!
//! A stream's credit timer starts with credit for its first fill, which is loaded at once at
//! the stream's real-time level. Admission counts a stream's rate, not that fill, so without a
//! bound an attach/detach loop on a 1 B/s reservation bought a full buffer of real-time reads
//! per attach: full-disk real-time traffic for any user (issue 9, finding 4). The start-up
//! credit therefore comes out of token buckets: one per user and one shared by all users but
//! root. A stream gets the smaller of what it wants and what both hold; anything short of its
//! fill it loads at its own rate, like any window movement. Over any time `t` all users but
//! root together start at most `shared capacity + shared rate × t` bytes of real-time fills.
//!
//! The same buckets pay for prerolls, refills after seeks, and raised threads' real-time reads
//! of other files than their streams' ([`super::stray`]).
//!
//! Root's streams are exempt: root is trusted with the disk anyway (it could run `ionice -c1`).

use std::collections::BTreeMap;

use scheduler_common::MonotonicNs;

/// Nanoseconds per second.
const NS: u128 = 1_000_000_000;

/// The sizes of the buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BurstLimits {
    /// What one user may start at once, in bytes.
    pub(crate) user_bytes: u64,
    /// How fast a user's allowance comes back, in bytes per second.
    pub(crate) user_rate_bps: u64,
    /// What all users but root may start at once together.
    pub(crate) shared_bytes: u64,
    /// How fast the shared allowance comes back.
    pub(crate) shared_rate_bps: u64,
}

impl BurstLimits {
    /// The defaults: a user may start a few players with large buffers at once (32 MiB) and
    /// gets 1 MiB/s back; all users together 128 MiB and 4 MiB/s, a small share of a disk.
    pub(crate) const DEFAULT: Self = Self {
        user_bytes: 32 << 20,
        user_rate_bps: 1 << 20,
        shared_bytes: 128 << 20,
        shared_rate_bps: 4 << 20,
    };
}

/// One token bucket, exact to the byte-nanosecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    /// Bytes × 10⁹ held.
    scaled: u128,
    /// Bytes × 10⁹ owed ([`BurstAllowance::charge`]): what comes back repays it first.
    debt: u128,
    /// When it was last refilled.
    refilled_at: MonotonicNs,
}

impl Bucket {
    fn full(capacity: u64, now: MonotonicNs) -> Self {
        Self {
            scaled: u128::from(capacity) * NS,
            debt: 0,
            refilled_at: now,
        }
    }

    fn refill(&mut self, capacity: u64, rate_bps: u64, now: MonotonicNs) {
        let elapsed = u128::from(now.saturating_since(self.refilled_at));
        self.refilled_at = self.refilled_at.max(now);
        let back = elapsed * u128::from(rate_bps);
        let repaid = back.min(self.debt);
        self.debt -= repaid;
        self.scaled = (self.scaled + back - repaid).min(u128::from(capacity) * NS);
    }

    /// Takes `bytes` whatever it holds: what it lacks is owed.
    fn charge(&mut self, bytes: u64) {
        let wanted = u128::from(bytes) * NS;
        let taken = wanted.min(self.scaled);
        self.scaled -= taken;
        self.debt = self.debt.saturating_add(wanted - taken);
    }

    fn bytes(&self) -> u64 {
        u64::try_from(self.scaled / NS).unwrap_or(u64::MAX)
    }

    fn take(&mut self, bytes: u64) {
        self.scaled = self.scaled.saturating_sub(u128::from(bytes) * NS);
    }

    fn is_full(&self, capacity: u64) -> bool {
        self.debt == 0 && self.scaled >= u128::from(capacity) * NS
    }
}

/// The buckets of every user who started a stream lately.
#[derive(Clone, Debug)]
pub(crate) struct BurstAllowance {
    limits: BurstLimits,
    shared: Bucket,
    /// Users whose bucket is not full; a full bucket is the same as none, so the map holds
    /// only users who attached within the last `user_bytes / user_rate_bps` seconds, or who
    /// owe (until what they owe and a full bucket have come back).
    users: BTreeMap<u32, Bucket>,
}

impl BurstAllowance {
    /// Full buckets.
    #[must_use]
    pub(crate) fn new(limits: BurstLimits, now: MonotonicNs) -> Self {
        Self {
            limits,
            shared: Bucket::full(limits.shared_bytes, now),
            users: BTreeMap::new(),
        }
    }

    /// Grants a new stream of `uid` up to `wanted` bytes of start-up credit, and takes them
    /// from the buckets.
    pub(crate) fn grant(&mut self, uid: u32, wanted: u64, now: MonotonicNs) -> u64 {
        if uid == 0 {
            return wanted;
        }
        let limits = self.limits;
        self.shared
            .refill(limits.shared_bytes, limits.shared_rate_bps, now);
        let user = self
            .users
            .entry(uid)
            .or_insert_with(|| Bucket::full(limits.user_bytes, now));
        user.refill(limits.user_bytes, limits.user_rate_bps, now);
        let granted = wanted.min(user.bytes()).min(self.shared.bytes());
        user.take(granted);
        self.shared.take(granted);
        // Forget users whose buckets are full again, so the map stays small.
        self.users.retain(|_, bucket| {
            bucket.refill(limits.user_bytes, limits.user_rate_bps, now);
            !bucket.is_full(limits.user_bytes)
        });
        granted
    }

    /// Charges user `uid` for `bytes` of real-time reads already made (a raised thread's reads
    /// of other files that its raise ended before paying for, [`super::stray`]): taken from
    /// its bucket whatever it holds, the rest owed, so that nothing more is granted to the user
    /// (and no thread of theirs raised: [`Self::in_debt`]) until the bucket has come back that
    /// far. The shared bucket gives what it holds of the part the user's own bucket paid, and
    /// nothing of what the user owes: one user's debt must neither hold back the others nor
    /// empty what their fills, prerolls and refills come from (before, a user who owed 1 GiB
    /// took the shared 128 MiB with it). Root owes nothing.
    pub(crate) fn charge(&mut self, uid: u32, bytes: u64, now: MonotonicNs) {
        if uid == 0 || bytes == 0 {
            return;
        }
        let limits = self.limits;
        self.shared
            .refill(limits.shared_bytes, limits.shared_rate_bps, now);
        let user = self
            .users
            .entry(uid)
            .or_insert_with(|| Bucket::full(limits.user_bytes, now));
        user.refill(limits.user_bytes, limits.user_rate_bps, now);
        let paid = user.bytes().min(bytes);
        user.charge(bytes);
        let shared = self.shared.bytes().min(paid);
        self.shared.take(shared);
    }

    /// Bytes user `uid` owes at `now` ([`Self::charge`]).
    #[must_use]
    pub(crate) fn debt(&self, uid: u32, now: MonotonicNs) -> u64 {
        self.users.get(&uid).map_or(0, |bucket| {
            let mut bucket = *bucket;
            bucket.refill(self.limits.user_bytes, self.limits.user_rate_bps, now);
            u64::try_from(bucket.debt.div_ceil(NS)).unwrap_or(u64::MAX)
        })
    }

    /// Whether user `uid` still owes for reads it was charged for at `now`.
    #[must_use]
    pub(crate) fn in_debt(&self, uid: u32, now: MonotonicNs) -> bool {
        self.users.get(&uid).is_some_and(|bucket| {
            let mut bucket = *bucket;
            bucket.refill(self.limits.user_bytes, self.limits.user_rate_bps, now);
            bucket.debt > 0
        })
    }

    /// Users with a bucket that is not full.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn users_tracked(&self) -> usize {
        self.users.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;

    fn small() -> BurstLimits {
        BurstLimits {
            user_bytes: 10_000,
            user_rate_bps: 1_000,
            shared_bytes: 25_000,
            shared_rate_bps: 2_000,
        }
    }

    #[test]
    fn a_user_gets_the_bucket_then_the_rate() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        assert_eq!(burst.grant(7, 6_000, MonotonicNs::ZERO), 6_000);
        assert_eq!(burst.grant(7, 6_000, MonotonicNs::ZERO), 4_000);
        assert_eq!(burst.grant(7, 6_000, MonotonicNs::ZERO), 0);
        assert_eq!(burst.grant(7, 6_000, MonotonicNs(2 * S)), 2_000);
    }

    #[test]
    fn root_is_exempt_and_costs_nobody_anything() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        assert_eq!(burst.grant(0, u64::MAX, MonotonicNs::ZERO), u64::MAX);
        assert_eq!(burst.grant(7, 10_000, MonotonicNs::ZERO), 10_000);
    }

    #[test]
    fn users_together_are_bounded_by_the_shared_bucket() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        let total: u64 = (1..=5)
            .map(|uid| burst.grant(uid, 10_000, MonotonicNs::ZERO))
            .sum();
        assert_eq!(total, 25_000);
    }

    #[test]
    fn full_buckets_are_forgotten() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        burst.grant(7, 5_000, MonotonicNs::ZERO);
        assert_eq!(burst.users_tracked(), 1);
        burst.grant(8, 0, MonotonicNs(10 * S));
        assert_eq!(burst.users_tracked(), 0);
    }

    #[test]
    fn a_charge_beyond_the_bucket_is_owed_and_grants_nothing_until_repaid() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        burst.charge(7, 13_000, MonotonicNs::ZERO);
        assert!(burst.in_debt(7, MonotonicNs::ZERO));
        assert!(
            burst.in_debt(7, MonotonicNs(2 * S)),
            "3 000 owed, 2 000 back"
        );
        assert!(
            !burst.in_debt(8, MonotonicNs::ZERO),
            "one user's debt is theirs"
        );
        assert_eq!(burst.grant(7, 5_000, MonotonicNs(2 * S)), 0);
        assert!(!burst.in_debt(7, MonotonicNs(3 * S)));
        assert_eq!(burst.grant(7, 5_000, MonotonicNs(4 * S)), 1_000);
        // Another user's bucket is whole.
        assert_eq!(burst.grant(8, 20_000, MonotonicNs(4 * S)), 10_000);
        burst.charge(0, u64::MAX, MonotonicNs(5 * S));
        assert!(!burst.in_debt(0, MonotonicNs(5 * S)));
    }

    #[test]
    fn a_users_debt_leaves_the_shared_bucket_to_the_others() {
        let mut burst = BurstAllowance::new(small(), MonotonicNs::ZERO);
        burst.charge(7, 1 << 30, MonotonicNs::ZERO);
        assert!(burst.debt(7, MonotonicNs::ZERO) > 0);
        // User 7's bucket paid 10 000 of it, and the shared one as much; the rest is 7's debt.
        assert_eq!(burst.grant(8, 10_000, MonotonicNs::ZERO), 10_000);
        assert_eq!(burst.grant(9, 10_000, MonotonicNs::ZERO), 5_000);
        assert_eq!(burst.debt(8, MonotonicNs::ZERO), 0);
    }

    proptest! {
        /// Whatever users are granted and one is charged, and whenever: a charge takes no more
        /// of the shared bucket than the charged user's own bucket held, so what a user owes
        /// is never taken from what the others draw on.
        #[test]
        fn a_charge_takes_no_more_of_the_shared_bucket_than_the_users_own_held(
            steps in proptest::collection::vec((0u32..4, 0u64..40_000, 0u64..(S / 2)), 1..120)
        ) {
            let limits = small();
            let mut burst = BurstAllowance::new(limits, MonotonicNs::ZERO);
            let mut now = 0u64;
            for (who, bytes, step) in steps {
                now += step;
                if who != 0 {
                    burst.grant(who, bytes, MonotonicNs(now));
                    continue;
                }
                let mut before = burst.clone();
                before.shared.refill(limits.shared_bytes, limits.shared_rate_bps, MonotonicNs(now));
                let held = before.users.get(&7).map_or(limits.user_bytes, |user| {
                    let mut user = *user;
                    user.refill(limits.user_bytes, limits.user_rate_bps, MonotonicNs(now));
                    user.bytes()
                });
                burst.charge(7, bytes, MonotonicNs(now));
                let mut after = burst.shared;
                after.refill(limits.shared_bytes, limits.shared_rate_bps, MonotonicNs(now));
                let taken = before.shared.bytes() - after.bytes();
                // Bytes are read rounded down from byte-nanoseconds: one either way.
                prop_assert!(taken <= held + 1, "took {taken} of the shared bucket; 7 held {held}");
            }
        }

        /// Whatever one user is granted and charged, and whenever: together no more than the
        /// bucket, what came back and what is still owed, and nothing granted while owing.
        #[test]
        fn grants_and_charges_stay_within_the_bucket_and_the_debt(
            steps in proptest::collection::vec((proptest::bool::ANY, 0u64..8_000, 0u64..S), 1..100)
        ) {
            let limits = small();
            let mut burst = BurstAllowance::new(limits, MonotonicNs::ZERO);
            let (mut now, mut total) = (0u64, 0u128);
            for (charge, bytes, step) in steps {
                now += step;
                if charge {
                    burst.charge(7, bytes, MonotonicNs(now));
                    total += u128::from(bytes);
                } else {
                    let owed = burst.in_debt(7, MonotonicNs(now));
                    let granted = burst.grant(7, bytes, MonotonicNs(now));
                    prop_assert!(!owed || granted == 0, "granted {granted} while owing");
                    total += u128::from(granted);
                }
            }
            let debt = burst.users.get(&7).map_or(0, |bucket| bucket.debt / NS);
            let came_back = u128::from(limits.user_rate_bps) * (u128::from(now) / u128::from(S) + 1);
            prop_assert!(total <= u128::from(limits.user_bytes) + came_back + debt + 1);
        }

        /// Whatever users ask, and whenever, users but root start no more than the shared
        /// bucket plus its rate over the time, and no user more than its own.
        #[test]
        fn grants_never_exceed_the_buckets(
            asks in proptest::collection::vec((1u32..6, 0u64..20_000, 0u64..(S / 2)), 1..200)
        ) {
            let limits = small();
            let mut burst = BurstAllowance::new(limits, MonotonicNs::ZERO);
            let mut now = 0u64;
            let mut total = 0u64;
            let mut per_user = BTreeMap::<u32, u64>::new();
            for (uid, wanted, step) in asks {
                now += step;
                let granted = burst.grant(uid, wanted, MonotonicNs(now));
                prop_assert!(granted <= wanted);
                total += granted;
                *per_user.entry(uid).or_default() += granted;
            }
            let secs = u128::from(now) / u128::from(S) + 1;
            let bound = |bytes: u64, rate: u64| u128::from(bytes) + u128::from(rate) * secs;
            prop_assert!(u128::from(total) <= bound(limits.shared_bytes, limits.shared_rate_bps));
            for granted in per_user.values() {
                prop_assert!(
                    u128::from(*granted) <= bound(limits.user_bytes, limits.user_rate_bps)
                );
            }
        }
    }
}
