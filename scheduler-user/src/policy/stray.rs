//! A raised thread's real-time reads of other files than its stream's: how many it may make.
//!
//! A raise is for reading the stream, not a pass to real-time I/O on every disk (issue 9,
//! finding 2), so past a small free allowance the raise is dropped. But a player started under
//! its start raise (`abissctl run`, the libraries' open) also loads its own shared libraries,
//! fonts and plug-in caches in its first seconds, and when the system reclaimed them those are
//! real-time reads of other files too: `GStreamer` with its libav plugin read 8 to 12 MiB of them
//! on the lab machine, and its decoding thread lost its raise for it (issue 12).
//!
//! So during its player's start-up ([`START_UP_NS`] after the start raise) a raise pays for
//! what it reads past the free allowance out of its owner's start-up allowance
//! ([`super::burst`]), the per-user token bucket that already pays for start-up fills, prerolls
//! and seek refills. The bound stays per user: over any time `t` one user's raises read at most
//! the free allowance each, plus `user bytes + user rate × t` together, of other files at real
//! time, and all users but root together no more than the shared bucket gives. Past its
//! start-up, or once the allowance is spent, a raise over what it may read is dropped as
//! before.

/// KiB of real-time reads of other files every raise may make free: a player also reads an
/// index or subtitles now and then. Also the slack on a raise's reads of its stream's own file
/// (readahead beyond what was asked).
pub const STRAY_ALLOWANCE_KIB: u64 = 4 * 1024;

/// How long after its start raise a player is starting: its new tasks keep the raise
/// (`upgrades::adoption`), and its raises' reads of other files may be paid for.
pub const START_UP_NS: u64 = 10_000_000_000;

/// What a raise's real-time reads of other files come to at a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrayReads {
    /// Within the free allowance and what the raise paid for.
    Within,
    /// Over that, in its player's start-up: this many more KiB must come out of its owner's
    /// start-up allowance for the raise to stay.
    ToPay(u64),
    /// Over that, and past its start-up: the raise is dropped.
    Over,
}

/// Judges a raise that queued `stray_kib` of real-time reads of other files, having paid for
/// `paid_kib` past the free allowance so far, started at `started_ns` (a start raise, or a task
/// adopted from one; `None` for a raise after a miss), at `now_ns`.
#[must_use]
pub fn judge(stray_kib: u64, paid_kib: u64, started_ns: Option<u64>, now_ns: u64) -> StrayReads {
    let unpaid = stray_kib.saturating_sub(STRAY_ALLOWANCE_KIB.saturating_add(paid_kib));
    if unpaid == 0 {
        StrayReads::Within
    } else if started_ns.is_some_and(|started| now_ns.saturating_sub(started) <= START_UP_NS) {
        StrayReads::ToPay(unpaid)
    } else {
        StrayReads::Over
    }
}

/// Settles a raise's reads of other files at a check: judges them ([`judge`]), and when they
/// are to be paid for asks `pay` for the KiB (it answers what it took, which may be less).
/// Returns what the raise has paid in all now, and whether it stays.
pub fn settle(
    stray_kib: u64,
    paid_kib: u64,
    started_ns: Option<u64>,
    now_ns: u64,
    pay: impl FnOnce(u64) -> u64,
) -> (u64, bool) {
    match judge(stray_kib, paid_kib, started_ns, now_ns) {
        StrayReads::Within => (paid_kib, true),
        StrayReads::Over => (paid_kib, false),
        StrayReads::ToPay(kib) => {
            // What was taken stays taken even when it is short: those reads were made at real
            // time, so they are the owner's start-up traffic either way.
            let taken = pay(kib).min(kib);
            (paid_kib.saturating_add(taken), taken == kib)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: u64 = 1_000_000_000;
    const FREE: u64 = STRAY_ALLOWANCE_KIB;

    #[test]
    fn a_start_up_pays_what_is_past_the_free_allowance() {
        assert_eq!(judge(FREE, 0, None, 0), StrayReads::Within);
        assert_eq!(judge(FREE + 1, 0, None, 0), StrayReads::Over);
        assert_eq!(
            judge(FREE + 8192, 0, Some(0), 3 * S),
            StrayReads::ToPay(8192)
        );
        assert_eq!(
            judge(FREE + 8192, 8000, Some(0), 3 * S),
            StrayReads::ToPay(192)
        );
        assert_eq!(
            judge(FREE + 8192, 8192, Some(0), 30 * S),
            StrayReads::Within
        );
        assert_eq!(judge(FREE + 8193, 8192, Some(0), 30 * S), StrayReads::Over);
        assert_eq!(judge(u64::MAX, u64::MAX, None, 0), StrayReads::Within);
    }

    #[test]
    fn a_payment_short_of_the_reads_drops_the_raise_and_keeps_what_it_took() {
        assert_eq!(settle(FREE + 100, 0, Some(0), S, |kib| kib), (100, true));
        assert_eq!(settle(FREE + 100, 0, Some(0), S, |_| 60), (60, false));
        assert_eq!(
            settle(FREE + 100, 0, None, S, |_| unreachable!()),
            (0, false)
        );
        assert_eq!(settle(FREE + 100, 0, Some(0), S, |_| u64::MAX), (100, true));
    }

    proptest! {
        /// Over a raise's checks, against a bucket that holds `bucket` KiB: the raise stays
        /// only while every KiB it read past the free allowance was paid for, it never pays
        /// more than it read or the bucket held, and past its start-up it pays nothing.
        #[test]
        fn what_a_raise_keeps_it_read_free_or_paid(
            reads in proptest::collection::vec(0u64..8192, 1..60),
            bucket in 0u64..64 * 1024,
            started in proptest::option::of(0u64..5 * S),
        ) {
            let (mut stray, mut paid, mut left) = (0u64, 0u64, bucket);
            for (check, read) in reads.iter().enumerate() {
                let now = (check as u64) * S / 4;
                stray += read;
                let before = paid;
                let (now_paid, stays) = settle(stray, paid, started, now, |kib| {
                    let taken = kib.min(left);
                    left -= taken;
                    taken
                });
                paid = now_paid;
                prop_assert!(paid <= bucket, "paid {paid} KiB from a {bucket} KiB bucket");
                prop_assert!(paid <= stray.saturating_sub(FREE));
                let in_start_up = started.is_some_and(|s| now.saturating_sub(s) <= START_UP_NS);
                if !in_start_up {
                    prop_assert_eq!(paid, before, "paid past its start-up");
                }
                prop_assert_eq!(stays, stray <= FREE + paid);
                if !stays {
                    break;
                }
            }
        }
    }
}
