//! What raises read at real time beyond what their streams were admitted for, and who is
//! charged for it ([`crate::policy::stray`]): a raise's reads of other files are its user's at
//! once; its reads of its stream's file are held against the stream, every raise together,
//! those that ended included, and what passes the stream's allowance is its readers' user's.

use abiss_proto::StreamId;
use log::debug;
use scheduler_common::MonotonicNs;

use super::{ReaderRaises, StreamBounds};
use crate::policy::raise::{stream_allowance_kib, Raise, OWN_FILE_SLACK_KIB};
use crate::raise::forks::ForkHook;

/// Of one check: a thread of a user read so many KiB of its stream's file at real time.
pub(super) type OwnRead = (u32, u32, u64);

impl ReaderRaises {
    /// Notes what `raises`, which end now, read at real time since their last check: a raise
    /// that ends between two checks (detached, idle, its thread gone) is charged too, or a user
    /// who attached, missed and detached in a loop (or whose short-lived threads each were
    /// raised and read before the next check) read at real time for free. Reads of other files
    /// are owed by the thread's user ([`Self::take_owed`]); reads of the stream's file go to
    /// the stream's ledger, charged past its allowance at the next check or as it ends.
    pub(super) fn note_owed(&mut self, raises: &[Raise]) {
        for raise in raises {
            let Some(use_of) = self.forks.use_of(raise.task.pid) else {
                continue;
            };
            let mut account = raise.account;
            let (stray, own) = account.take_new(use_of.stray_kib.into(), use_of.stream_kib.into());
            if stray > 0 {
                let owed = self.owed.entry(raise.uid).or_default();
                *owed = owed.saturating_add(stray);
            }
            if own > 0 {
                self.ledgers
                    .entry(raise.stream)
                    .or_default()
                    .add(own, raise.uid);
            }
        }
    }

    /// Thread `pid` is about to be raised for `stream`: if it is raised for another stream,
    /// what it read of that one's file goes to that stream's ledger now (raised for another
    /// file, the kernel counts that file afresh).
    pub(super) fn fold_own_of(&mut self, pid: u32, stream: StreamId) {
        let Some(earlier) = self.table.get(pid).filter(|u| u.stream != stream) else {
            return;
        };
        let Some(use_of) = self.forks.use_of(pid) else {
            return;
        };
        let (earlier_stream, uid, mut account) = (earlier.stream, earlier.uid, earlier.account);
        let (_, own) = account.take_new(account.stray_kib, use_of.stream_kib.into());
        self.table.set_account(pid, account);
        self.ledgers
            .entry(earlier_stream)
            .or_default()
            .add(own, uid);
    }

    /// Charges, for every stream, what its raises together read of its file past what it was
    /// admitted for since it was attached: to the users whose raises read it in this check
    /// (`read_now`, by stream), the rest (read by raises that ended) to its last reader's;
    /// and drops the raises that read past it.
    pub(super) fn charge_streams(
        &mut self,
        read_now: &std::collections::HashMap<StreamId, Vec<OwnRead>>,
        hook: &mut dyn ForkHook,
        bounds: &mut dyn StreamBounds,
    ) {
        let streams: Vec<StreamId> = self.ledgers.keys().copied().collect();
        for stream in streams {
            let Some((earned, buffer)) = bounds.admitted(stream, MonotonicNs::ZERO) else {
                // Ended: `end_stream` charged what it read.
                self.ledgers.remove(&stream);
                continue;
            };
            let allowance = stream_allowance_kib(earned, buffer, OWN_FILE_SLACK_KIB);
            let Some(ledger) = self.ledgers.get_mut(&stream) else {
                continue;
            };
            let past = ledger.charge_past(allowance);
            if past == 0 {
                continue;
            }
            let (read, last_uid) = (ledger.read_kib, ledger.uid);
            let readers = read_now.get(&stream).map_or(&[][..], Vec::as_slice);
            let mut left = past;
            for &(_, uid, kib) in readers {
                let share = kib.min(left);
                bounds.charge(uid, share);
                left -= share;
            }
            if left > 0 {
                bounds.charge(last_uid, left);
            }
            debug!(
                "stream {stream}: its raises read {read} KiB of its file at real time, over the \
                 {allowance} KiB it was admitted for; {past} KiB more charged"
            );
            let why = format!(
                "its stream's raises together read {read} KiB of its file at real time, over the \
                 {allowance} KiB its rate and buffer allow since it was attached; not raised again"
            );
            for &(pid, _, _) in readers {
                self.drop_raise(pid, &why, hook);
            }
        }
    }

    /// Stream `stream` ends: what its raises read of its file past `allowance_kib` and was not
    /// charged yet is owed by its last reader's user ([`Self::take_owed`]).
    pub(super) fn close_ledger(&mut self, stream: StreamId, allowance_kib: u64) {
        let Some(mut ledger) = self.ledgers.remove(&stream) else {
            return;
        };
        let past = ledger.charge_past(allowance_kib);
        if past > 0 {
            let owed = self.owed.entry(ledger.uid).or_default();
            *owed = owed.saturating_add(past);
        }
    }

    /// Per user, the KiB of real-time reads that ended raises made without being charged for
    /// them, to be charged to the user's start-up allowance (`BurstAllowance::charge`).
    pub(crate) fn take_owed(&mut self) -> Vec<(u32, u64)> {
        self.owed.drain().collect()
    }
}
