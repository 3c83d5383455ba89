//! A raised thread's real-time reads of other files than its stream's: who pays for them.
//!
//! A raise is for reading the stream, not a pass to real-time I/O on every disk (issue 9,
//! finding 2). But a raised player reads other files too: its shared libraries as it starts,
//! when the system reclaimed them (`GStreamer` with its libav plugin read 8 to 12 MiB of them on
//! the lab machine), an index or subtitles now and then. Such reads were allowed 4 MiB per
//! raise, past which the raise was dropped; `GStreamer`'s decoding thread lost its raise for its
//! libraries (issue 12), and the allowance was renewed by every new raise (a raise that idled
//! out, then a new miss), so a user's many threads could read without bound at real time.
//!
//! So every KiB of them is paid for out of the reading thread's user's start-up allowance
//! ([`super::burst`]), the per-user token bucket that already pays for start-up fills, prerolls
//! and seek refills. When the allowance is empty (a user who just started players with large
//! prerolls), a raise is lent up to [`STRAY_CREDIT_KIB`], which its user owes at once: a player
//! that reads a subtitle file, a font or an index then keeps its raise, where it lost it for
//! its first KiB. A raise whose reads neither the allowance nor that credit covers is dropped.
//! What a raise read and did not pay for when it ends (dropped, detached, idle, its thread
//! gone) is charged then or at abissd's next look at its raises, into debt
//! (`BurstAllowance::charge`), and no thread of a user who owes is raised (nor adopted from a
//! start raise), so a raise that ends between two checks is no way around it. What is lent is
//! repaid out of the same bucket. Over any time `t` one user's raises read at most
//! `user bytes + user rate × t` of other files at real time together, plus [`STRAY_CREDIT_KIB`]
//! for each raise the user holds at once (plus what their threads raised at once queue in one
//! check interval before the user owes), and all users but root together no more than the
//! shared bucket gives (plus the same). Root's threads are exempt, as root's fills are.

/// KiB of its reads of other files that a raise may owe when its user's allowance cannot pay:
/// a few small files (a font, subtitles, an index), not a program's libraries.
pub const STRAY_CREDIT_KIB: u64 = 1024;

/// A raise's account of its reads of other files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StrayAccount {
    /// KiB settled so far: paid from the allowance, or owed.
    pub settled_kib: u64,
    /// Of those, KiB owed (lent by [`STRAY_CREDIT_KIB`]).
    pub owed_kib: u64,
}

/// What a check of a raise's reads of other files comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The raise's account after the check.
    pub account: StrayAccount,
    /// KiB its user owes from this check on (to be charged to the user's bucket as debt).
    pub owe_now_kib: u64,
    /// Whether the raise stays.
    pub stays: bool,
}

/// Settles a raise's reads of other files at a check: it queued `stray_kib` of them in all,
/// and `account` says what was settled before; `pay` is asked for the rest and answers what it
/// took from the allowance, which may be less. What it lacks is lent while the raise's debt
/// stays within [`STRAY_CREDIT_KIB`]; otherwise the raise goes, and the rest is charged when it
/// ends.
pub fn settle(stray_kib: u64, account: StrayAccount, pay: impl FnOnce(u64) -> u64) -> Settlement {
    let unpaid = stray_kib.saturating_sub(account.settled_kib);
    if unpaid == 0 {
        return Settlement {
            account,
            owe_now_kib: 0,
            stays: true,
        };
    }
    // What was taken stays taken even when it is short: those reads were made at real time,
    // so they are the user's real-time traffic either way.
    let taken = pay(unpaid).min(unpaid);
    let short = unpaid - taken;
    let owed = account.owed_kib.saturating_add(short);
    if owed <= STRAY_CREDIT_KIB {
        return Settlement {
            account: StrayAccount {
                settled_kib: account.settled_kib.saturating_add(unpaid),
                owed_kib: owed,
            },
            owe_now_kib: short,
            stays: true,
        };
    }
    Settlement {
        account: StrayAccount {
            settled_kib: account.settled_kib.saturating_add(taken),
            owed_kib: account.owed_kib,
        },
        owe_now_kib: 0,
        stays: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn account(settled_kib: u64, owed_kib: u64) -> StrayAccount {
        StrayAccount {
            settled_kib,
            owed_kib,
        }
    }

    #[test]
    fn what_is_read_is_paid_for_or_lent_a_little_and_past_that_the_raise_goes() {
        let settled = |stray, before, pay: u64| {
            let s = settle(stray, before, |kib| kib.min(pay));
            (
                s.account.settled_kib,
                s.account.owed_kib,
                s.owe_now_kib,
                s.stays,
            )
        };
        assert_eq!(settled(0, account(0, 0), 0), (0, 0, 0, true));
        assert_eq!(settled(100, account(100, 0), 0), (100, 0, 0, true));
        assert_eq!(settled(100, account(0, 0), u64::MAX), (100, 0, 0, true));
        assert_eq!(settled(100, account(40, 0), u64::MAX), (100, 0, 0, true));
        // An empty allowance lends: 1 KiB, then up to the credit.
        assert_eq!(settled(1, account(0, 0), 0), (1, 1, 1, true));
        assert_eq!(settled(100, account(0, 0), 60), (100, 40, 40, true));
        let full = STRAY_CREDIT_KIB;
        assert_eq!(settled(full, account(0, 0), 0), (full, full, full, true));
        // Past the credit the raise goes, keeping what it took; nothing more is lent.
        assert_eq!(settled(full + 1, account(0, 0), 0), (0, 0, 0, false));
        assert_eq!(
            settled(full + 10, account(full, full), 5),
            (full + 5, full, 0, false)
        );
        assert_eq!(
            settled(u64::MAX, account(0, 0), u64::MAX),
            (u64::MAX, 0, 0, true)
        );
    }

    proptest! {
        /// Over a raise's checks, against a bucket that holds `bucket` KiB: the raise stays
        /// only while every KiB it read was paid for or lent; it never pays more than it read
        /// or the bucket held, and never owes more than the credit.
        #[test]
        fn a_raise_keeps_only_what_it_paid_for_or_was_lent(
            reads in proptest::collection::vec(0u64..2048, 1..60),
            bucket in 0u64..64 * 1024,
        ) {
            let (mut stray, mut left, mut owed_total) = (0u64, bucket, 0u64);
            let mut held = StrayAccount::default();
            for read in reads {
                stray += read;
                let s = settle(stray, held, |kib| {
                    let taken = kib.min(left);
                    left -= taken;
                    taken
                });
                owed_total += s.owe_now_kib;
                held = s.account;
                prop_assert!(held.settled_kib - held.owed_kib <= bucket);
                prop_assert!(held.settled_kib <= stray);
                prop_assert!(held.owed_kib <= STRAY_CREDIT_KIB);
                prop_assert_eq!(owed_total, held.owed_kib);
                prop_assert_eq!(s.stays, stray == held.settled_kib);
                if !s.stays {
                    break;
                }
            }
        }
    }
}
