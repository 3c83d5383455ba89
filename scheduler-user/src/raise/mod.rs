//! Raising and restoring readers' I/O priorities: the system calls, `/proc`, and the record in
//! the state directory that lets a restarted daemon undo what a crashed one did.
//!
//! The decisions are in [`crate::policy::raise`]. The tasks a raised thread makes are
//! followed and put back at once by [`crate::raise::forks`], which says why that way.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use abiss_os::{clock::monotonic_now, ioprio};
use abiss_proto::{RaiseReport, StreamId};
use hdrhistogram::Histogram;
use log::{debug, info, warn};
use scheduler_common::{AbissLevel, MonotonicNs};

use crate::kernel::events::Reader;
use crate::latency_histogram;
use crate::policy::raise::{
    may_raise, raised_priority, Raise, RaiseTable, MAX_RAISED_PER_STREAM, MAX_RAISED_PER_USER,
};
use crate::policy::stray::{RaiseAccount, StreamLedger};
use crate::raise::forks::{ForkHook, RaisedForks};

mod task;

use barred::BarredThreads;
pub(crate) use task::restore_leftovers;
use task::{restore, task_identity, Restored};

mod adoption;
use adoption::Cause;
mod barred;
pub(crate) mod forks;
mod journal;
mod ledger;
mod made_while_down;
mod misuse;
mod reused_id;

/// The file in the state directory listing the threads to restore. Its name is from before
/// the code said "raise" for what it once called an upgrade: an abissd started over the state
/// an earlier version left when it crashed finds its raised threads to put back.
pub(crate) const RAISES_FILE: &str = "upgrades.json";

/// While the record cannot be written, how often a miss tries again (then raises, if it can).
const RECORD_RETRY_NS: u64 = 5_000_000_000;

/// How often raised threads' stray requests are checked while any thread is raised.
const POLICE_INTERVAL_NS: u64 = 250_000_000;

/// What the streams' side tells and lends the policing of raises ([`misuse`]).
pub(crate) trait StreamBounds {
    /// What stream `stream` was admitted for since `since` ([`MonotonicNs::ZERO`]: since it
    /// was attached, as far as its rate changes are kept): the bytes its rates earned since, and its buffer,
    /// which bound what its raised readers may read of its file at the raised priority. `None`
    /// if there is no such stream.
    fn admitted(&self, stream: StreamId, since: MonotonicNs) -> Option<(u128, u64)>;

    /// Charges user `uid` for `kib` KiB of real-time reads of a raised thread of theirs beyond
    /// what its stream was admitted for ([`crate::policy::stray`]): out of their start-up
    /// allowance, owed beyond what it holds.
    fn charge(&mut self, uid: u32, kib: u64);

    /// KiB user `uid` owes for such reads.
    fn debt_kib(&self, uid: u32) -> u64;
}

/// The stream a thread is raised for, and its file's tag in the kernel maps (what the block
/// program counts the thread's own real-time requests by).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RaiseFor {
    /// The stream.
    pub(crate) stream: StreamId,
    /// Its file's tag ([`crate::stream::Stream::file_tag`]).
    pub(crate) file_tag: u64,
}

/// The daemon's raises of readers.
#[derive(Debug)]
pub(crate) struct ReaderRaises {
    table: RaiseTable,
    enabled: bool,
    record: PathBuf,
    /// Event to priority set, ns.
    latency: Histogram<u64>,
    total: u64,
    restored: u64,
    per_stream: HashMap<StreamId, u64>,
    /// Raises dropped for stray real-time requests.
    policed: u64,
    /// Per stream, the threads whose raise was dropped: never raised again for it.
    barred: HashMap<StreamId, BarredThreads>,
    /// Set while the record cannot be written: no thread is raised then (a crash would leave
    /// it raised for good), and a miss tries the record again from this time on.
    unrecorded_retry: Option<MonotonicNs>,
    /// The tasks raised threads make.
    forks: RaisedForks,
    /// Per stream, the tasks adopted from its players' start raises ([`adoption`]).
    adopted: HashMap<StreamId, u64>,
    /// When a full stream's raises were last looked at for threads that are gone (any
    /// stream's: the bound is on abissd's work, not per stream).
    gone_checked: Option<MonotonicNs>,
    /// Per user, KiB of real-time reads that raises which ended had made and were not charged
    /// for ([`Self::take_owed`]).
    owed: HashMap<u32, u64>,
    /// Journal threads found, per file system.
    journals: journal::JournalThreads,
    /// Per stream, what its raises read of its file at real time, every raise together
    /// ([`ledger`]).
    ledgers: HashMap<StreamId, StreamLedger>,
}

impl ReaderRaises {
    /// Raises that expire after `idle_ns` without an access, recorded in `state_dir`, the
    /// tasks raised threads make followed by `forks`; `enabled` false makes every call a
    /// no-op (for comparisons).
    #[must_use]
    pub(crate) fn new(state_dir: &Path, idle_ns: u64, enabled: bool, forks: RaisedForks) -> Self {
        Self {
            table: RaiseTable::new(idle_ns),
            enabled,
            record: state_dir.join(RAISES_FILE),
            latency: latency_histogram::new(),
            total: 0,
            restored: 0,
            per_stream: HashMap::new(),
            policed: 0,
            barred: HashMap::new(),
            unrecorded_retry: None,
            forks,
            adopted: HashMap::new(),
            gone_checked: None,
            owed: HashMap::new(),
            journals: journal::JournalThreads::default(),
            ledgers: HashMap::new(),
        }
    }

    /// A thread missed the page cache on the file of stream `stream` (owned by `owner_uid`,
    /// at ABISS `level`): raise it if it needs it and may have it, its forks followed (`hook`
    /// attaches the fork program) from before the raise on. Returns whether it was raised now.
    pub(crate) fn on_miss(
        &mut self,
        stream: RaiseFor,
        reader: &Reader,
        when: (MonotonicNs, AbissLevel),
        owner_uid: u32,
        hook: &mut dyn ForkHook,
    ) -> bool {
        self.raise(stream, reader, when, owner_uid, hook, Cause::Miss)
    }

    /// [`Self::on_miss`] and [`Self::on_reader_start`]: a miss's latency is measured.
    fn raise(
        &mut self,
        RaiseFor { stream, file_tag }: RaiseFor,
        reader: &Reader,
        (at, level): (MonotonicNs, AbissLevel),
        owner_uid: u32,
        hook: &mut dyn ForkHook,
        cause: Cause,
    ) -> bool {
        if !self.enabled {
            return false;
        }
        // The uid comes with the event, so the cheap refusals come before `/proc` is read: the
        // reads the thread waits for are being queued right now. (`/proc` is read once before
        // the raise, for the record, and once after, to be sure the id named the same thread.)
        let (pid, uid) = (reader.pid, reader.uid);
        if !may_raise(owner_uid, uid) {
            debug!("stream {stream}: thread {pid} of uid {uid} is not the owner's; not raised");
            return false;
        }
        if self
            .barred
            .get_mut(&stream)
            .is_some_and(|barred| barred.bars(pid))
        {
            debug!("stream {stream}: thread {pid} lost its raise for stray I/O; not raised again");
            return false;
        }
        if !self.room_for(stream, pid, uid, at) {
            return false;
        }
        let Ok(current) = ioprio::get(pid) else {
            return false;
        };
        let Some(target) = raised_priority(current, level) else {
            self.table.touch(pid, stream, at);
            return false;
        };
        if !self.can_record(at) {
            debug!("stream {stream}: thread {pid} not raised: the record cannot be written");
            return false;
        }
        let Some(mut raise) = self.record_ahead(
            reader,
            RaiseFor { stream, file_tag },
            (current, target),
            at,
            cause,
        ) else {
            return false;
        };
        let task = raise.task;
        // What it read of its file so far is its earlier stream's (the kernel may count afresh).
        self.fold_own_of(pid, stream);
        let raising = RaiseFor { stream, file_tag };
        let Some(followed) = self.follow_and_raise(raising, pid, (current, target), hook) else {
            self.forget_unmade();
            return false;
        };
        let done = monotonic_now();
        if cause == Cause::Miss {
            let _ = self.latency.record(done.saturating_since(at).max(1_000));
        }
        let Some(followed) =
            self.confirm_reader(reader, task, raising, (current, target), followed, hook)
        else {
            self.forget_unmade();
            return false;
        };
        raise.last_access = done;
        raise.raised_at = done;
        // A start raise's player makes its reading threads next ([`adoption`]).
        raise.started_at = (cause == Cause::ReaderStart).then_some(done);
        self.table.insert(raise);
        if let Some(kept) = self.table.get(pid).map(Raise::followed_as) {
            // As the table keeps it (the id may have named a thread raised before). Only if
            // that differs: each follow rewrites the thread's whole entry (what the eBPF side
            // counts of the raise is not in it: `RAISE_COUNTS`).
            if kept != followed {
                let _ = self.forks.follow_back(pid, kept, hook);
            }
        }
        self.total += 1;
        *self.per_stream.entry(stream).or_default() += 1;
        info!(
            "stream {stream}: raised thread {pid} ({}) from ioprio {current:#x} to {target:#x} in {} µs",
            reader.command,
            done.saturating_since(at) / 1000
        );
        true
    }

    /// Records the raise of `reader`'s thread from `current` to `target` before it is made:
    /// killed between the two, abissd would leave a raise that no later start knows of (a test
    /// that killed it as soon as the reader was raised found one left at real time). The
    /// record needs the thread's start time. The raise as recorded, if it was.
    fn record_ahead(
        &mut self,
        reader: &Reader,
        RaiseFor { stream, file_tag }: RaiseFor,
        (current, target): (u16, u16),
        at: MonotonicNs,
        cause: Cause,
    ) -> Option<Raise> {
        let task = reused_id::reader_task(reader, stream)?;
        let raise = Raise {
            task,
            tgid: reader.tgid,
            stream,
            file_tag,
            previous: current,
            applied: target,
            last_access: at,
            raised_at: at,
            started_at: None,
            journal: false,
            writer: cause == Cause::DirectWriter,
            uid: reader.uid,
            account: RaiseAccount::default(),
        };
        self.record_with(&raise).then_some(raise)
    }

    /// Whether thread `pid` of user `uid` may be raised for `stream` now: the table has room
    /// for it, or has after the raises of threads that are gone were let go.
    fn room_for(&mut self, stream: StreamId, pid: u32, uid: u32, now: MonotonicNs) -> bool {
        if self.table.has_room(stream, pid, uid)
            || (self.let_go_of_gone(stream, uid, now) && self.table.has_room(stream, pid, uid))
        {
            return true;
        }
        debug!(
            "stream {stream}: thread {pid} not raised: the stream has {MAX_RAISED_PER_STREAM} \
             raised, or uid {uid} {MAX_RAISED_PER_USER}"
        );
        false
    }

    /// Follows thread `pid`'s forks, then raises it from `current` to `target`; what the fork
    /// program was told of the raise (previous, applied, file tag), if it was raised. (Followed
    /// first: whatever it makes from the raise on is put back.)
    fn follow_and_raise(
        &mut self,
        RaiseFor { stream, file_tag }: RaiseFor,
        pid: u32,
        (current, target): (u16, u16),
        hook: &mut dyn ForkHook,
    ) -> Option<(u16, u16, u64)> {
        // An earlier raise of the thread keeps the priority it had before it.
        let previous = self
            .table
            .get(pid)
            .map_or(current, |earlier| earlier.previous);
        let followed = (previous, target, file_tag);
        if let Err(error) = self.forks.follow(pid, followed, hook) {
            warn!("stream {stream}: cannot follow thread {pid}'s forks ({error}); not raised");
            self.not_raised(pid, hook);
            return None;
        }
        if let Err(error) = ioprio::set(pid, target) {
            warn!("stream {stream}: cannot raise thread {pid}: {error}");
            self.not_raised(pid, hook);
            return None;
        }
        Some(followed)
    }

    /// Lets go of the raises for `stream` and of user `uid` whose threads are gone, at most
    /// once every [`GONE_CHECK_NS`]; whether any was let go (what they read is charged as for
    /// any raise that ends). A player that reads in short-lived threads left each one's raise
    /// in the stream's [`MAX_RAISED_PER_STREAM`] until it idled out: 96
    /// of 200 new threads were raised, one every 60 ms, in the raises benchmark. This runs
    /// on a miss that waits for its raise, so it is kept short: a thread is gone when `/proc`
    /// has no entry for it (a reused id keeps its place until it idles out); a gone thread has
    /// nothing to put back, and the record is rewritten with the next raise.
    fn let_go_of_gone(&mut self, stream: StreamId, uid: u32, now: MonotonicNs) -> bool {
        if self
            .gone_checked
            .is_some_and(|at| now.saturating_since(at) < GONE_CHECK_NS)
        {
            return false;
        }
        self.gone_checked = Some(now);
        let gone: Vec<u32> = self
            .table
            .all()
            .iter()
            .filter(|u| (u.stream == stream || u.uid == uid) && !u.journal)
            .map(|u| u.task.pid)
            .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .collect();
        let taken: Vec<Raise> = gone
            .iter()
            .flat_map(|&pid| self.table.take_thread(pid))
            .collect();
        self.note_owed(&taken);
        self.forks.restored(&gone);
        // No detach of the fork program even if the table is empty now: the raise this makes
        // room for attaches it again at once (or, failing, syncs it), and a detach waits for
        // the tracepoint's readers: 12-14 ms on this miss on one kernel build (6.18.44-fc-v657),
        // 0.09 ms on another (-v1147), measured.
        !gone.is_empty()
    }

    /// Thread `pid` was followed for a raise that did not happen (or was undone at once):
    /// follows it as its earlier raise has it, or not at all. Always false.
    fn not_raised(&mut self, pid: u32, hook: &mut dyn ForkHook) -> bool {
        match self.table.get(pid) {
            Some(earlier) => {
                let _ = self.forks.follow_back(pid, earlier.followed_as(), hook);
            }
            None => self.forks.restored(&[pid]),
        }
        RaisedForks::sync(hook, !self.table.is_empty());
        false
    }

    /// Thread `pid` touched stream `stream`'s file.
    pub(crate) fn touch(&mut self, pid: u32, stream: StreamId, now: MonotonicNs) {
        self.table.touch(pid, stream, now);
    }

    /// Restores the threads idle for too long; puts back the tasks of raised threads the fork
    /// program could not report; polices the raises ([`misuse`]) by what `bounds` says of
    /// their streams.
    pub(crate) fn expire(
        &mut self,
        now: MonotonicNs,
        hook: &mut dyn ForkHook,
        bounds: &mut dyn StreamBounds,
    ) {
        let idle = self.table.take_idle(now);
        self.restore_all(&idle, "idle", hook);
        self.police(hook, bounds);
        if !self.table.is_empty() {
            self.forks.find_unreported();
        }
        self.forks.prune_counts();
    }

    /// Restores the threads raised for a stream that ends, and charges what its raises read
    /// of its file past `allowance_kib` (what it was admitted for, as it ends).
    pub(crate) fn end_stream(
        &mut self,
        stream: StreamId,
        allowance_kib: u64,
        hook: &mut dyn ForkHook,
    ) {
        let taken = self.table.take_stream(stream);
        self.restore_all(&taken, "stream ended", hook);
        self.close_ledger(stream, allowance_kib);
        self.per_stream.remove(&stream);
        self.barred.remove(&stream);
        self.adopted.remove(&stream);
    }

    /// Restores every raised thread, and every task they made still followed (daemon
    /// shutdown).
    pub(crate) fn shutdown(&mut self, hook: &mut dyn ForkHook) {
        let all = self.table.take_all();
        self.restore_all(&all, "daemon stopping", hook);
        self.forks.shutdown();
    }

    /// Restores each raise, then the tasks its thread made that are still followed;
    /// detaches the fork program once nothing is raised.
    fn restore_all(&mut self, raises: &[Raise], why: &str, hook: &mut dyn ForkHook) {
        if raises.is_empty() {
            return;
        }
        for raise in raises {
            if matches!(restore(raise), Restored::Yes) {
                self.restored += 1;
                info!(
                    "stream {}: restored thread {} to ioprio {:#x} ({why})",
                    raise.stream, raise.task.pid, raise.previous
                );
            }
        }
        // After their own restores: from then on what they make starts at their own priority.
        let pids: Vec<u32> = raises.iter().map(|u| u.task.pid).collect();
        self.note_owed(raises);
        self.forks.restored(&pids);
        self.persist();
        RaisedForks::sync(hook, !self.table.is_empty());
    }

    /// Nanoseconds until an raise goes idle.
    #[must_use]
    pub(crate) fn ns_until_next_expiry(&self, now: MonotonicNs) -> Option<u64> {
        let expiry = self.table.ns_until_next_expiry(now);
        // While a thread is raised, its stray requests are looked at this often; after the last
        // raise ended, once more, for counts made as it ended.
        if self.table.is_empty() && !self.forks.counts_to_prune() {
            expiry
        } else {
            Some(expiry.map_or(POLICE_INTERVAL_NS, |ns| ns.min(POLICE_INTERVAL_NS)))
        }
    }

    /// Whether a thread of `tgid` is raised for `stream`.
    #[must_use]
    pub(crate) fn raises(&self, tgid: u32, stream: StreamId) -> bool {
        self.table.raises(tgid, stream)
    }

    /// Readers of `stream` whose raise was dropped for stray real-time I/O.
    #[must_use]
    pub(crate) fn policed_for(&self, stream: StreamId) -> u64 {
        self.barred.get(&stream).map_or(0, BarredThreads::dropped)
    }

    /// Raises made for `stream` so far.
    #[must_use]
    pub(crate) fn count_for(&self, stream: StreamId) -> u64 {
        self.per_stream.get(&stream).copied().unwrap_or(0)
    }

    /// Figures for `status`.
    #[must_use]
    pub(crate) fn report(&self) -> RaiseReport {
        let [latency_p50_us, latency_p99_us, latency_max_us] =
            latency_histogram::quantiles_us(&self.latency);
        RaiseReport {
            enabled: self.enabled,
            active: u64::try_from(self.table.all().len()).unwrap_or(u64::MAX),
            total: self.total,
            restored: self.restored,
            latency_p50_us,
            latency_p99_us,
            latency_max_us,
            policed: self.policed,
        }
    }

    /// Rewrites the record of raised threads (removed when there is none).
    fn persist(&mut self) {
        let all = self.table.all();
        let result = if all.is_empty() {
            match std::fs::remove_file(&self.record) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            }
        } else {
            self.write_record(&all)
        };
        self.note_record(result);
    }

    /// Replaces the record whole, without a sync. It has to survive abissd, not the machine:
    /// a restarted daemon reads it from the page cache, and after a reboot none of the threads
    /// it names is left to restore. The write is on the thread that raises the next reader, so
    /// it must not wait for a disk: the state directory belongs on a memory file system
    /// (`/run/abiss`, and abissd says so at start otherwise). On ext4 under load a write here
    /// took up to 68 ms without a sync and 60–100 ms more with one (2026-12-01).
    fn write_record(&self, raises: &[Raise]) -> io::Result<()> {
        serde_json::to_vec(raises)
            .map_err(io::Error::other)
            .and_then(|bytes| abiss_os::fs::replace(&self.record, &bytes))
    }

    /// The record of a raise that was not made after all: rewritten from the table, so that
    /// a crash does not leave it for the next start (which would put the thread back only if
    /// its priority were the raise's still, but that may be its own choice by then).
    fn forget_unmade(&mut self) {
        let result = self.write_record(&self.table.all());
        let _ = self.note_record(result);
    }

    /// Records the raised threads with `raise` among them (as the table will hold it),
    /// before the table holds it; whether the record was written.
    fn record_with(&mut self, raise: &Raise) -> bool {
        let mut all = self.table.all();
        let mut new = raise.clone();
        if let Some(earlier) = all.iter().find(|u| u.task == new.task) {
            new.previous = earlier.previous;
        }
        all.retain(|u| u.task.pid != new.task.pid);
        all.push(new);
        let result = self.write_record(&all);
        self.note_record(result)
    }

    /// Whether a raise may be recorded now: yes unless the last write failed, and then only
    /// if writing works again (tried at most every `RECORD_RETRY_NS`).
    fn can_record(&mut self, now: MonotonicNs) -> bool {
        match self.unrecorded_retry {
            None => true,
            Some(retry) if now < retry => false,
            Some(_) => {
                let result = self.write_record(&self.table.all());
                self.note_record(result)
            }
        }
    }

    /// Notes whether a write of the record worked, saying so when that changes; whether it did.
    fn note_record(&mut self, result: io::Result<()>) -> bool {
        let was_unrecorded = self.unrecorded_retry.is_some();
        match result {
            Ok(()) => {
                if was_unrecorded {
                    info!(
                        "raised threads can be recorded in {} again; raising readers again",
                        self.record.display()
                    );
                }
                self.unrecorded_retry = None;
                true
            }
            Err(error) => {
                if !was_unrecorded {
                    warn!(
                        "cannot record raised threads in {}: {error}; raising no reader until it can be written, since a crash would leave an unrecorded raise for good",
                        self.record.display()
                    );
                }
                self.unrecorded_retry = Some(monotonic_now().saturating_add(RECORD_RETRY_NS));
                false
            }
        }
    }
}

/// How often, at most, a stream or user whose raises are all taken has them looked at for
/// threads that are gone (one clock for all): each look reads `/proc` for up to
/// [`MAX_RAISED_PER_STREAM`] + [`MAX_RAISED_PER_USER`] threads, and a user's misses on a full
/// stream would otherwise make abissd read it at every miss.
const GONE_CHECK_NS: u64 = 20_000_000;
