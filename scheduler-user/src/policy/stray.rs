//! A raised thread's real-time reads beyond what its stream was admitted for: who pays for them.
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
//! and seek refills: charged at abissd's check of the raise, or when the raise ends (dropped,
//! detached, idle, its thread gone), taken from the bucket whatever it holds and owed beyond
//! (`BurstAllowance::charge`). No thread of a user who owes is raised (nor adopted from a start
//! raise). A user's raises may owe together up to [`STRAY_CREDIT_KIB`]: a player that reads a
//! subtitle file, a font or an index after its user's prerolls emptied the allowance keeps its
//! raise. A raise that reads at real time while its user owes more is dropped. The credit is the
//! user's, not each raise's: lent per raise, a user's 32 streams × (32 raised threads + 32 tasks
//! adopted at a player's start) could owe 2 GiB at real time before any raise was dropped.
//!
//! A stream's raises read its own file at real time for what the stream was admitted for, all
//! of them together ([`StreamLedger`]): its buffer, what its rates earned since it was attached,
//! and [`super::raise::OWN_FILE_SLACK_KIB`] for the kernel's readahead. Counted per raise, a
//! 1 B/s stream whose short-lived threads were each announced as readers (`reader_starts`) and
//! read 4 MiB with `O_DIRECT` before exiting read at disk speed at real time. Past the stream's
//! allowance, its readers' user is charged for every KiB, as for other files, and the raises
//! that read past it are dropped.
//!
//! Over any time `t` one user's raises read at most `user bytes + user rate × t` at real time
//! beyond what their streams were admitted for, plus [`STRAY_CREDIT_KIB`], plus what their
//! threads raised at once queue in one check interval before the user owes; all users but root
//! together no more than the shared bucket gives (plus the same). Root's threads are exempt, as
//! root's fills are.

/// KiB a user's raises may owe together and be kept: a few small files (a font, subtitles, an
/// index), not a program's libraries.
pub(crate) const STRAY_CREDIT_KIB: u64 = 1024;

/// What of a raise's real-time reads, as the kernel counts them, was charged or held against
/// its stream so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RaiseAccount {
    /// KiB of other files than its stream's.
    pub(crate) stray_kib: u64,
    /// KiB of its stream's file (counted afresh when the thread is raised for another file).
    pub(crate) own_kib: u64,
}

impl RaiseAccount {
    /// The kernel counts `stray_kib` and `own_kib` for the raise now: the KiB of each not
    /// accounted before, with the account brought up to the counts. A count below the
    /// account (a count the kernel made afresh) brings nothing new.
    pub(crate) fn take_new(&mut self, stray_kib: u64, own_kib: u64) -> (u64, u64) {
        let new = (
            stray_kib.saturating_sub(self.stray_kib),
            own_kib.saturating_sub(self.own_kib),
        );
        self.stray_kib = self.stray_kib.max(stray_kib);
        self.own_kib = self.own_kib.max(own_kib);
        new
    }
}

/// Whether a raise that read at real time beyond what its stream was admitted for may stay
/// while its user owes `debt_kib` (after that read was charged).
#[must_use]
pub(crate) fn may_keep(debt_kib: u64) -> bool {
    debt_kib <= STRAY_CREDIT_KIB
}

/// What the raises of one stream read of its file at real time, every raise together,
/// those that ended included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamLedger {
    /// KiB read.
    pub(crate) read_kib: u64,
    /// Of those, KiB charged to users for being past the stream's allowance.
    pub(crate) charged_kib: u64,
    /// The user whose raise read last: who is charged for what ended raises read past the
    /// allowance (a user's stream raises only that user's threads; root's any user's).
    pub(crate) uid: u32,
}

impl StreamLedger {
    /// A raise of user `uid`'s read `kib` more.
    pub(crate) fn add(&mut self, kib: u64, uid: u32) {
        if kib > 0 {
            self.read_kib = self.read_kib.saturating_add(kib);
            self.uid = uid;
        }
    }

    /// The KiB read past `allowance_kib` not charged before, now charged. What was charged
    /// stays charged when the allowance grows: those reads were made at real time.
    pub(crate) fn charge_past(&mut self, allowance_kib: u64) -> u64 {
        let past = self.read_kib.saturating_sub(allowance_kib);
        let new = past.saturating_sub(self.charged_kib);
        self.charged_kib = self.charged_kib.saturating_add(new);
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_raise_brings_what_the_kernel_counted_since_and_no_more() {
        let mut account = RaiseAccount::default();
        assert_eq!(account.take_new(100, 40), (100, 40));
        assert_eq!(account.take_new(100, 40), (0, 0));
        assert_eq!(account.take_new(150, 100), (50, 60));
        // A count made afresh (another thread's, or another file's) brings nothing it had.
        assert_eq!(account.take_new(0, 0), (0, 0));
        assert_eq!(account.take_new(160, 110), (10, 10));
    }

    #[test]
    fn the_credit_is_a_little_and_no_more() {
        assert!(may_keep(0));
        assert!(may_keep(STRAY_CREDIT_KIB));
        assert!(!may_keep(STRAY_CREDIT_KIB + 1));
    }

    #[test]
    fn a_streams_raises_together_are_charged_past_its_allowance() {
        let mut ledger = StreamLedger::default();
        // 96 short-lived threads of a 1 B/s stream, each 4 MiB: the stream's 4 MiB and a bit.
        for _ in 0..96 {
            ledger.add(4096, 65534);
        }
        assert_eq!(ledger.charge_past(4096 + 64), 95 * 4096 - 64);
        assert_eq!(ledger.charge_past(4096 + 64), 0, "charged once");
        assert_eq!(ledger.charge_past(1 << 30), 0, "and not given back");
        ledger.add(10, 7);
        assert_eq!(ledger.uid, 7);
        assert_eq!(ledger.charge_past(4096 + 64), 10);
    }

    proptest! {
        /// However the reads of a stream's raises come and its allowance grows, what is
        /// charged in all is exactly what was read past the largest allowance at the time of
        /// the charge: never more than read, and every KiB past the allowance charged.
        #[test]
        fn what_is_charged_is_what_was_read_past_the_allowance(
            steps in proptest::collection::vec((0u64..8192, 0u64..4096), 1..100),
        ) {
            let (mut ledger, mut allowance, mut charged, mut read) =
                (StreamLedger::default(), 0u64, 0u64, 0u64);
            for (kib, grows) in steps {
                ledger.add(kib, 1);
                read += kib;
                allowance += grows;
                charged += ledger.charge_past(allowance);
                prop_assert!(charged <= read);
                prop_assert!(read <= allowance + charged);
                prop_assert_eq!(charged, ledger.charged_kib);
            }
        }

        /// Whatever the counts the kernel shows for a raise, in any order, the KiB brought
        /// in all are the largest count seen, never more.
        #[test]
        fn a_raise_brings_each_kib_once(counts in proptest::collection::vec((0u64..1 << 20, 0u64..1 << 20), 1..50)) {
            let mut account = RaiseAccount::default();
            let (mut stray, mut own) = (0u64, 0u64);
            for (s, o) in &counts {
                let (new_stray, new_own) = account.take_new(*s, *o);
                stray += new_stray;
                own += new_own;
            }
            prop_assert_eq!(stray, counts.iter().map(|c| c.0).max().unwrap_or(0));
            prop_assert_eq!(own, counts.iter().map(|c| c.1).max().unwrap_or(0));
        }
    }
}
