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
//! and seek refills; a raise whose reads the allowance cannot pay for is dropped. What a raise
//! read and did not pay for when it ends (dropped, detached, idle, its thread gone) is charged
//! then or at abissd's next look at its raises, into debt (`BurstAllowance::charge`), and no
//! thread of a user who owes is raised (nor adopted from a start raise), so a raise that ends
//! between two checks is no way around it. Over any time `t` one user's
//! raises read at most `user bytes + user rate × t` of other files at real time together (plus
//! what their threads raised at once queue in one check interval before the user owes), and
//! all users but root together no more than the shared bucket gives. Root's threads are
//! exempt, as root's fills are.

/// Settles a raise's reads of other files at a check: it queued `stray_kib` of them in all and
/// has paid for `paid_kib`; `pay` is asked for the rest and answers what it took, which may be
/// less. Returns what the raise has paid in all now, and whether it stays.
pub fn settle(stray_kib: u64, paid_kib: u64, pay: impl FnOnce(u64) -> u64) -> (u64, bool) {
    let unpaid = stray_kib.saturating_sub(paid_kib);
    if unpaid == 0 {
        return (paid_kib, true);
    }
    // What was taken stays taken even when it is short: those reads were made at real time,
    // so they are the user's real-time traffic either way.
    let taken = pay(unpaid).min(unpaid);
    (paid_kib.saturating_add(taken), taken == unpaid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn what_is_read_is_paid_for_and_a_short_payment_drops_the_raise() {
        assert_eq!(settle(0, 0, |_| unreachable!()), (0, true));
        assert_eq!(settle(100, 100, |_| unreachable!()), (100, true));
        assert_eq!(settle(100, 0, |kib| kib), (100, true));
        assert_eq!(settle(100, 40, |kib| kib), (100, true));
        assert_eq!(settle(100, 0, |_| 60), (60, false));
        assert_eq!(settle(100, 0, |_| u64::MAX), (100, true));
        assert_eq!(settle(u64::MAX, 0, |kib| kib), (u64::MAX, true));
    }

    proptest! {
        /// Over a raise's checks, against a bucket that holds `bucket` KiB: the raise stays
        /// only while every KiB it read was paid for, and it never pays more than it read or
        /// the bucket held.
        #[test]
        fn a_raise_keeps_only_what_it_paid_for(
            reads in proptest::collection::vec(0u64..8192, 1..60),
            bucket in 0u64..64 * 1024,
        ) {
            let (mut stray, mut paid, mut left) = (0u64, 0u64, bucket);
            for read in reads {
                stray += read;
                let (now_paid, stays) = settle(stray, paid, |kib| {
                    let taken = kib.min(left);
                    left -= taken;
                    taken
                });
                paid = now_paid;
                prop_assert!(paid <= bucket, "paid {paid} KiB from a {bucket} KiB bucket");
                prop_assert!(paid <= stray);
                prop_assert_eq!(stays, stray == paid);
                if !stays {
                    break;
                }
            }
        }
    }
}
