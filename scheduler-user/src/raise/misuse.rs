//! A raise misused: tasks sharing the raised thread's I/O context beyond their bound (heard of
//! as the raised thread's tasks are reported), and real-time I/O beyond what the raise is for
//! or its user pays for (checked every `POLICE_INTERVAL_NS`, charged by [`super::ledger`]).
//! Either drops the raise at once and bars the thread from its stream's raises. Real-time I/O
//! of the raise's own file within its bound keeps the raise from going idle.

use abiss_proto::StreamId;
use scheduler_common::MAX_SHARED_IO_TASKS_PER_RAISE;

use std::collections::HashMap;

use log::debug;

use super::ledger::OwnRead;
use super::{ReaderRaises, StreamBounds};
use crate::kernel::events::Fork;
use crate::policy::raise::{
    stream_allowance_kib, MAX_RAISED_PER_STREAM, MAX_SHARED_IO_TASKS_PER_STREAM, OWN_FILE_SLACK_KIB,
};
use crate::policy::stray;
use crate::raise::forks::ForkHook;

// Every stream's raised threads, the tasks adopted at its players' starts (adoption does not
// ask the table for room) and the tasks sharing their contexts fit the kernel's table together,
// so no user's raises leave another's without room.
#[expect(clippy::cast_possible_truncation, reason = "32 fits any usize")]
const _: () = assert!(
    crate::stream::MAX_STREAMS
        * (MAX_RAISED_PER_STREAM
            + super::adoption::MAX_ADOPTED_PER_STREAM as usize
            + MAX_SHARED_IO_TASKS_PER_STREAM as usize)
        <= scheduler_common::MAX_RAISED as usize
);

impl ReaderRaises {
    /// A followed thread made a task: put back at once (see [`crate::raise::forks`]), unless
    /// a player at its start made it and its user does not owe (`owes`) for real-time reads.
    pub(crate) fn on_fork(
        &mut self,
        fork: &Fork,
        hook: &mut dyn ForkHook,
        owes: &dyn Fn(u32) -> bool,
    ) {
        let raised_itself = self.table.get(fork.child).is_some();
        // The stream of the raise the report comes from, if that raise is still the table's
        // (a late report must not drop a later raise of the same thread id).
        let stream = self
            .table
            .get(fork.raise.root)
            .filter(|u| u.file_tag == fork.raise.file_tag && u.applied == fork.raise.applied)
            .map(|u| u.stream);
        if self.forks.too_many_shared(fork, stream) {
            // The task first (a task past the bound is put back itself: should the raised
            // thread be gone, it is the way to the shared context), then the raise.
            self.forks.on_fork(fork, raised_itself);
            if stream.is_some() {
                self.drop_raise(fork.raise.root, &over_bound_why(), hook);
            }
            return;
        }
        if !raised_itself && self.adopt(fork, hook, owes) {
            return;
        }
        self.forks.on_fork(fork, raised_itself);
    }

    /// Charges the real-time reads of every raise since the last check
    /// ([`crate::policy::stray`]): of other files to its user, of its stream's file to its
    /// stream's ledger ([`super::ledger`]). Drops the raise of every thread that read at real
    /// time while its user owes more than [`stray::STRAY_CREDIT_KIB`], that made more tasks
    /// sharing its I/O context than a raise may have, that queued more of its stream's file
    /// than the stream was admitted for since the raise (its buffer and what its rates earned,
    /// plus [`OWN_FILE_SLACK_KIB`]), or that read its stream's file while the stream's raises
    /// together passed what it was admitted for since it was attached; bars it from the
    /// stream's raises.
    pub(super) fn police(&mut self, hook: &mut dyn ForkHook, bounds: &mut dyn StreamBounds) {
        let mut read_now: HashMap<StreamId, Vec<OwnRead>> = HashMap::new();
        for raise in self.table.all() {
            let pid = raise.task.pid;
            let Some(use_of) = self.forks.use_of(pid) else {
                continue;
            };
            let (stray, own) = (u64::from(use_of.stray_kib), u64::from(use_of.stream_kib));
            let mut account = raise.account;
            let (new_stray, new_own) = account.take_new(stray, own);
            if account != raise.account {
                self.table.set_account(pid, account);
            }
            // Charged first, whatever else the raise did: the reads were made at real time.
            if new_stray > 0 {
                bounds.charge(raise.uid, new_stray);
                debug!(
                    "stream {}: thread {pid} read {stray} KiB of other files at real time; \
                     {new_stray} KiB more charged to uid {}",
                    raise.stream, raise.uid
                );
            }
            if new_own > 0 {
                // Real-time I/O of its own file is use of the raise, as an access is: a
                // direct writer (or reader) is never seen in the page cache, and would
                // otherwise be put back as idle mid-stream. What it may do is bounded below.
                self.table
                    .touch(pid, raise.stream, abiss_os::clock::monotonic_now());
                self.ledgers
                    .entry(raise.stream)
                    .or_default()
                    .add(new_own, raise.uid);
                let read = read_now.entry(raise.stream).or_default();
                read.push((pid, raise.uid, new_own));
            }
            let allowed = bounds
                .admitted(raise.stream, raise.raised_at)
                .map_or(u64::MAX, |(earned, buffer)| {
                    stream_allowance_kib(earned, buffer, OWN_FILE_SLACK_KIB)
                });
            let why = if new_stray > 0 && !stray::may_keep(bounds.debt_kib(raise.uid)) {
                format!(
                    "{stray} KiB of real-time reads of other files, more than its user's \
                     start-up allowance pays for and {} KiB lent; not raised again",
                    stray::STRAY_CREDIT_KIB
                )
            } else if use_of.over_bound {
                over_bound_why()
            } else if own > allowed {
                format!(
                    "{own} KiB of real-time reads of its stream's file, over the {allowed} KiB \
                     its rate and buffer allow; not raised again"
                )
            } else {
                continue;
            };
            self.drop_raise(pid, &why, hook);
        }
        self.charge_streams(&read_now, hook, bounds);
    }

    /// Drops the raise of thread `pid` for `why` (the raise was misused), and bars it from
    /// its stream's raises. Nothing if it is not raised.
    pub(super) fn drop_raise(&mut self, pid: u32, why: &str, hook: &mut dyn ForkHook) {
        let taken = self.table.take_thread(pid);
        let Some((stream, task)) = taken.first().map(|raise| (raise.stream, raise.task)) else {
            return;
        };
        self.restore_all(&taken, why, hook);
        self.policed += 1;
        self.barred.entry(stream).or_default().bar(task);
    }
}

/// Why a raise with too many tasks sharing its I/O context is dropped.
fn over_bound_why() -> String {
    format!(
        "made more tasks sharing its I/O priority (CLONE_IO) than a raise may have \
         ({MAX_SHARED_IO_TASKS_PER_RAISE}) or its stream's raises together \
         ({MAX_SHARED_IO_TASKS_PER_STREAM}); not raised again"
    )
}
