//! The tasks a raised thread makes: followed by the fork program, and put back at once.
//!
//! A raise ([`crate::raise`]) is `ioprio_set` on one thread, and the kernel copies a
//! thread's I/O priority into every task it makes: a forked child, a new thread, a
//! `posix_spawn`ed program. Those never asked for the raise, and nothing would put them back.
//! So a raised thread's forks are followed: before a thread is raised it is written into the
//! `RAISED` map, and while any thread is raised the fork program (`scheduler-ebpf/src/fork.rs`,
//! a BTF tracepoint on `sched_process_fork`, which fires for every new task, thread or process)
//! is attached. For a task made by a thread in the map it notes the task in the map with the
//! raise it comes from (so the tasks it makes in turn are followed too) and reports it on the
//! `FORKS` ring; [`RaisedForks::on_fork`] then **puts it back at once** to the priority the
//! raised thread had before its raise, if it still has the raised one, and takes it out of the
//! map.
//!
//! Putting it back at once, rather than recording it with its parent's raise and restoring
//! both together, was chosen because:
//! - a child never keeps, even for the seconds until an idle expiry, a raise it was not given
//!   (a raise is for one thread's reads of one file);
//! - nothing about a child needs to survive the daemon: it is never written to
//!   `upgrades.json`, so a restart has no children to find again (a crash leaves one raised
//!   only if it falls between its fork and its put-back, a fraction of a millisecond when the
//!   daemon is not busy);
//! - a child is not its parent: it may outlive it, exec another program or set its own
//!   priority, so a recorded child would need identity checks of its own at every restore.
//!
//! A player's own start-up is the other exception: a task made soon after a start raise is
//! adopted as an raise of its own instead (`raises::adoption`), with its own record, policing
//! and put-back, so none of the reasons above applies to it.
//!
//! One kind of task is the exception: one made with `CLONE_IO` by the raised thread, or by
//! such a task, shares the raised thread's I/O context, so its priority *is* the thread's, and
//! putting it back alone would put back the thread. It stays in the map and goes back with the
//! thread: at a raised thread's restore every task noted under its raise is put back if it
//! still has the raised priority (a shared one then only if the thread was gone) and leaves
//! the map. The same sweep runs at shutdown, and whenever the fork program counted reports it
//! could not make (`FORK_LOST`: its ring was full), so such a task is still found in the map;
//! each sweep also puts back the tasks noted under a raise that had already ended. (A task
//! that shares the context of a plain task the raised thread made is put back at once, with
//! that task's context.)
//!
//! Such tasks are bounded, since a user can make thousands of them and the map is shared by
//! every user's raises: a stream's raises together may note
//! [`crate::policy::raise::MAX_SHARED_IO_TASKS_PER_STREAM`], counted here, and one raise
//! `MAX_SHARED_IO_TASKS_PER_RAISE`, counted by the fork program for when abissd lags behind.
//! Past its bound the fork program notes no more of them, marks the raise's counts with the
//! task, and still reports it. Either way abissd drops the raise at once (a misuse, like reading other
//! files at real time beyond what its user pays for). Restoring the raised thread puts back
//! every task of its context at once, noted or not; if that thread is gone, the task past the
//! bound is put back instead, which does the same. A task past the bound still has its own forks followed: the fork
//! program finds its raise through its I/O context (`RAISED_CONTEXTS`), whose entry abissd
//! deletes with the raise, after the sweep.
//!
//! The fork program is attached only while some thread is raised ([`ForkHook`]): with nothing
//! raised a fork costs what it costs without abissd.
//!
//! What the eBPF side counts of a raise (its reads at real time, its tasks sharing the I/O
//! context, the context itself) is in a map of its own, `RAISE_COUNTS`, which only the eBPF
//! side writes: abissd writes a raised thread's `RAISED` entry again when it raises it again,
//! and with the counts in that entry, what the programs added between abissd's read and its
//! write was lost.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use abiss_os::{clock::monotonic_now, ioprio};
use abiss_proto::StreamId;
use aya::maps::{HashMap, MapData, PerCpuArray};
use log::{debug, info, warn};
use scheduler_common::{RaiseCounts, RaisedThread};

use crate::kernel::events::{inherited_raise, Fork, InheritedRaise};
use crate::kernel::tracer::BlockTracer;
use crate::policy::raise::SharedIoTasks;

/// Attaches the fork program while some thread is raised and detaches it once none is.
pub(crate) trait ForkHook {
    /// Whether the new tasks of raised threads are to be followed from now on.
    fn follow_forks(&mut self, on: bool) -> Result<(), String>;
}

impl ForkHook for BlockTracer {
    fn follow_forks(&mut self, on: bool) -> Result<(), String> {
        self.set_raised(on).map_err(|error| error.to_string())
    }
}

/// What a raised thread did with its raise, as the eBPF side counted it since it was followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RaiseUse {
    /// KiB of real-time requests it queued for other files than its stream's.
    pub(crate) stray_kib: u32,
    /// KiB of real-time requests it queued for its stream's own file.
    pub(crate) stream_kib: u32,
    /// More tasks made under the raise share its I/O context than a raise may note.
    pub(crate) over_bound: bool,
}

/// The `RAISED` map, what the eBPF side counted of each raise, the fork program's count of
/// reports it could not make, and what was put back.
pub(crate) struct RaisedForks {
    raised: HashMap<MapData, u32, RaisedThread>,
    /// `RAISE_COUNTS`, written only by the eBPF side: abissd reads an entry and deletes it when
    /// the raise ends, and never writes one (it would lose what the programs add meanwhile).
    counts: HashMap<MapData, u32, RaiseCounts>,
    /// `RAISED_CONTEXTS`: raised threads by I/O context, as the eBPF side saw them.
    contexts: HashMap<MapData, u64, u32>,
    lost: PerCpuArray<MapData, u64>,
    /// Reports of the fork ring dropped for a full queue to the main loop (counted by the
    /// ring's pump).
    unqueued: Arc<AtomicU64>,
    /// The tasks sharing raised threads' I/O contexts noted in `raised`, per raise.
    shared: SharedIoTasks,
    /// The own entry the last [`Self::follow`] replaced, with its thread id: a raise that
    /// then fails puts it back as it was ([`Self::follow_back`]).
    replaced: Option<(u32, RaisedThread)>,
    /// A raise ended since counts were last looked for that no raise has
    /// ([`Self::prune_counts`]).
    ended_since_prune: bool,
    /// Tasks made by raised threads and put back.
    put_back: u64,
    /// `lost` as last looked at.
    lost_seen: u64,
}

impl std::fmt::Debug for RaisedForks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaisedForks")
            .field("put_back", &self.put_back)
            .field("lost_seen", &self.lost_seen)
            .finish_non_exhaustive()
    }
}

impl RaisedForks {
    /// Over the raise maps the tracer hands over
    /// ([`take_raise_maps`](crate::kernel::tracer::BlockTracer::take_raise_maps)).
    pub(crate) fn new(
        raised: HashMap<MapData, u32, RaisedThread>,
        counts: HashMap<MapData, u32, RaiseCounts>,
        contexts: HashMap<MapData, u64, u32>,
        lost: PerCpuArray<MapData, u64>,
    ) -> Self {
        Self {
            raised,
            counts,
            contexts,
            lost,
            unqueued: Arc::default(),
            shared: SharedIoTasks::default(),
            replaced: None,
            ended_since_prune: false,
            put_back: 0,
            lost_seen: 0,
        }
    }

    /// The count of the fork ring's reports the pump could not queue for the main loop:
    /// those tasks are looked for in the map as the unreported ones are.
    #[must_use]
    pub(crate) fn unqueued(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.unqueued)
    }

    /// Follows thread `tid`'s forks under a raise from `previous` to `applied`, with the fork
    /// program attached: called before the thread is raised.
    pub(crate) fn follow(
        &mut self,
        tid: u32,
        (previous, applied, stream): (u16, u16, u64),
        hook: &mut dyn ForkHook,
    ) -> Result<(), String> {
        // Followed again (its raise goes on, or comes back): the tasks already noted under
        // it, its I/O context and what it read at real time are still there, in its counts,
        // which only the eBPF side writes (its user paid for its reads of other files,
        // `policy::stray`, and its reads of the file raised for again count against the same
        // raise: `RaiseTable::insert`), so a thread cannot renew its raise's allowances by
        // lowering its own priority and missing. Followed afresh: counts left from a raise
        // under its id that ended as the eBPF side counted (`counts_of` in the eBPF crate)
        // are not its; nothing counts for it until its entry below is in.
        let own = self.own_entry(tid);
        self.replaced = own.map(|own| (tid, own));
        if own.is_none() {
            let _ = self.counts.remove(&tid);
        }
        // Raised for another file: its count of the stream's own file starts afresh, as the
        // table's record of the raise does (`RaiseTable::insert`).
        let generation = own.map_or(0, |own| {
            if own.stream == stream {
                own.generation
            } else {
                own.generation.wrapping_add(1)
            }
        });
        self.write_own_entry(tid, (previous, applied, stream), generation, hook)
    }

    /// Follows thread `tid` under its raise `earlier` again, after a raise that
    /// [`Self::follow`] followed did not happen (or the table kept the earlier raise): its
    /// entry goes back as it was, generation included, so what the thread read of the file of
    /// `earlier` still counts against it (with [`Self::follow`]'s change of file, that count
    /// would start afresh while the table's raise goes on).
    pub(crate) fn follow_back(
        &mut self,
        tid: u32,
        earlier: (u16, u16, u64),
        hook: &mut dyn ForkHook,
    ) -> Result<(), String> {
        match self.replaced.take() {
            Some((replaced, entry))
                if replaced == tid && (entry.previous, entry.applied, entry.stream) == earlier =>
            {
                self.raised
                    .insert(tid, entry, 0)
                    .map_err(|error| error.to_string())?;
                hook.follow_forks(true)
            }
            _ => self.follow(tid, earlier, hook),
        }
    }

    /// Writes raised thread `tid`'s own entry, then attaches the fork program.
    fn write_own_entry(
        &mut self,
        tid: u32,
        (previous, applied, stream): (u16, u16, u64),
        generation: u32,
        hook: &mut dyn ForkHook,
    ) -> Result<(), String> {
        let entry = RaisedThread {
            root: tid,
            previous,
            applied,
            flags: 0,
            generation,
            stream,
            started_ns: 0,
        };
        self.raised
            .insert(tid, entry, 0)
            .map_err(|error| error.to_string())?;
        hook.follow_forks(true)
    }

    /// What raised thread `tid` did with its raise, as the eBPF side counted it (`None` if it
    /// is not followed).
    #[must_use]
    pub(crate) fn use_of(&self, tid: u32) -> Option<RaiseUse> {
        let entry = self.raised.get(&tid, 0).ok()?;
        let counts = self.counts.get(&tid, 0).unwrap_or_default();
        Some(RaiseUse {
            stray_kib: counts.stray_kib,
            // Nothing if counted for another file: the thread's raise before the last.
            stream_kib: counts.stream_kib(entry.generation),
            over_bound: counts.over_bound != 0,
        })
    }

    /// Threads `tids` are no longer raised (restored, gone, or their raises did not happen):
    /// the tasks they made still followed are put back (in one look at the map), then they are
    /// no longer followed and their I/O contexts are forgotten (in this order: while a thread
    /// is followed, the forks of a task past the bound are still found through its context).
    pub(crate) fn restored(&mut self, tids: &[u32]) {
        let own: Vec<(u32, RaisedThread)> = tids
            .iter()
            .filter_map(|&tid| Some((tid, self.own_entry(tid)?)))
            .collect();
        self.sweep(Some(tids), true);
        for (tid, own) in own {
            self.forget_context(tid, &own);
        }
        for &tid in tids {
            // In this order: the eBPF side makes counts only for a thread with an entry.
            let _ = self.raised.remove(&tid);
            let _ = self.counts.remove(&tid);
            self.shared.forget(tid);
        }
        self.ended_since_prune = true;
    }

    /// Deletes the counts the eBPF side made for raises as they ended (it found a thread's
    /// entry just before abissd deleted it, and counted just after), if a raise ended since
    /// the last look: called on abissd's periodic check, when such a count has long been
    /// made. The sweeps do the same.
    pub(crate) fn prune_counts(&mut self) {
        if std::mem::take(&mut self.ended_since_prune) {
            let followed = self.followed();
            self.prune_counts_but(&followed);
        }
    }

    /// Whether a raise ended since [`Self::prune_counts`] last looked.
    #[must_use]
    pub(crate) fn counts_to_prune(&self) -> bool {
        self.ended_since_prune
    }

    /// The threads followed under a raise of their own (not tasks they made).
    fn followed(&self) -> HashSet<u32> {
        self.raised
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, entry)| inherited_raise(entry).is_none())
            .map(|(tid, _)| tid)
            .collect()
    }

    /// Deletes every raise's counts but those of `followed`.
    fn prune_counts_but(&mut self, followed: &HashSet<u32>) {
        let ended: Vec<u32> = self
            .counts
            .keys()
            .filter_map(Result::ok)
            .filter(|tid| !followed.contains(tid))
            .collect();
        for tid in ended {
            let _ = self.counts.remove(&tid);
        }
    }

    /// Follows thread `tid` as [`Self::follow`] does, but with nothing the kernel counted for
    /// an earlier raise under its id: that raise was another thread's, which had the id before
    /// (`raises::reused_id`). The tasks noted under the earlier raise are put back and its
    /// I/O context is forgotten, as at its restore; the entry is overwritten, not removed
    /// first, so that no fork of the thread falls between two entries unfollowed.
    pub(crate) fn follow_afresh(
        &mut self,
        tid: u32,
        (previous, applied, stream): (u16, u16, u64),
        hook: &mut dyn ForkHook,
    ) -> Result<(), String> {
        let earlier = self.own_entry(tid);
        self.replaced = None;
        self.sweep(Some(&[tid]), true);
        if let Some(earlier) = earlier {
            self.forget_context(tid, &earlier);
        }
        self.shared.forget(tid);
        // Before the entry is overwritten: what the eBPF side counts between the two is this
        // thread's (the earlier one is gone), counted under the entry it is about to replace.
        let _ = self.counts.remove(&tid);
        self.write_own_entry(tid, (previous, applied, stream), 0, hook)
    }

    /// Thread `tid`'s own entry (not one it inherited as a task of another raise).
    fn own_entry(&self, tid: u32) -> Option<RaisedThread> {
        self.raised
            .get(&tid, 0)
            .ok()
            .filter(|entry| inherited_raise(entry).is_none())
    }

    /// The raise of thread `tid`, whose entry was `own`, ends: the task past its bound is put
    /// back (if the raised thread and every noted task are gone, it is the way to the
    /// context), and its I/O context is no longer a raised one.
    fn forget_context(&mut self, tid: u32, own: &RaisedThread) {
        let Ok(counts) = self.counts.get(&tid, 0) else {
            return;
        };
        if counts.over_bound != 0 && counts.past_bound_task != 0 {
            let raise = InheritedRaise {
                root: tid,
                file_tag: own.stream,
                previous: own.previous,
                applied: own.applied,
                shares_io_context: true,
                over_bound: true,
                noted: false,
                started_ns: counts.past_bound_started_ns,
            };
            self.put_back(counts.past_bound_task, &raise);
        }
        if self.contexts.get(&counts.io_context, 0).ok() == Some(tid) {
            let _ = self.contexts.remove(&counts.io_context);
        }
    }

    /// Keeps the fork program attached while `any_raised`, and only then.
    pub(crate) fn sync(hook: &mut dyn ForkHook, any_raised: bool) {
        if let Err(error) = hook.follow_forks(any_raised) {
            warn!("cannot switch the fork program: {error}");
        }
    }

    /// A followed thread made a task, which started with the raise: put it back at once,
    /// unless it shares its parent's I/O context (it goes back with its parent) or the daemon
    /// raised it since for its own reads (`raised_itself`). One made past the bound
    /// (`over_bound`) is put back even though it shares the context, which puts back the
    /// raised thread with it (its raise is dropped next): if the raised thread is gone, this
    /// task is what is left to reach the context by.
    pub(crate) fn on_fork(&mut self, fork: &Fork, raised_itself: bool) {
        if fork.raise.over_bound {
            self.put_back(fork.child, &fork.raise);
            return;
        }
        if fork.raise.shares_io_context {
            debug!(
                "thread {} made {} with CLONE_IO: it goes back with thread {}",
                fork.parent, fork.child, fork.raise.root
            );
            return;
        }
        if raised_itself {
            return;
        }
        if self.put_back(fork.child, &fork.raise) {
            debug!(
                "thread {} made {}, put back to ioprio {:#x} {} µs after",
                fork.parent,
                fork.child,
                fork.raise.previous,
                monotonic_now().saturating_since(fork.at) / 1000
            );
        }
    }

    /// Whether the raise `fork` was made under must be dropped for the tasks sharing its I/O
    /// context: the fork program found one raise's too many, or the raise is the table's for
    /// stream `stream` and that stream's raises together now have more than
    /// [`crate::policy::raise::MAX_SHARED_IO_TASKS_PER_STREAM`] noted.
    pub(crate) fn too_many_shared(&mut self, fork: &Fork, stream: Option<StreamId>) -> bool {
        let raise = &fork.raise;
        if raise.over_bound {
            return true;
        }
        // Noted only while the raise lasts: a report that comes after its end (its tasks
        // were swept) would never be forgotten.
        match stream {
            Some(stream) if raise.shares_io_context => !self.shared.note(raise.root, stream),
            _ => false,
        }
    }

    /// Puts back the followed tasks the fork program could not report, if it says there were
    /// any since the last look.
    pub(crate) fn find_unreported(&mut self) {
        let lost = self
            .lost
            .get(&0, 0)
            .map_or(0, |per_cpu| per_cpu.iter().sum::<u64>())
            .wrapping_add(self.unqueued.load(Ordering::Relaxed));
        if lost != self.lost_seen {
            warn!(
                "{} new tasks of raised threads went unreported (ring or queue full); looking for them",
                lost.wrapping_sub(self.lost_seen)
            );
            self.lost_seen = lost;
            // Not those sharing a raised thread's I/O context: that would put it back too.
            self.sweep(None, false);
        }
    }

    /// Puts back every task still followed (daemon shutdown, once no thread is raised).
    pub(crate) fn shutdown(&mut self) {
        self.sweep(None, true);
        if self.put_back > 0 {
            info!("put back {} tasks made by raised threads", self.put_back);
        }
    }

    /// Puts task `tid`, made under `raise`, back to the raised thread's own priority if it
    /// still has the raised one, then stops following it (in this order: a task it makes
    /// after the put-back starts at the right priority; one made before is in the map).
    /// Whether it was put back.
    /// A task under `tid` that is not the one the fork program saw start (that one is gone,
    /// and another took its id) is left alone, and so is its entry, if it has one.
    fn put_back(&mut self, tid: u32, raise: &InheritedRaise) -> bool {
        let noted = raise.noted;
        if noted && !self.still_noted(tid, raise) {
            debug!("task {tid} is gone: another task has its id, and is not put back");
            return false;
        }
        let done = started_at(tid, raise.started_ns)
            && ioprio::get(tid).ok() == Some(raise.applied)
            && match ioprio::set(tid, raise.previous) {
                Ok(()) => true,
                Err(error) => {
                    warn!("cannot put back task {tid}, made by a raised thread: {error}");
                    false
                }
            };
        self.put_back += u64::from(done);
        if noted {
            let _ = self.raised.remove(&tid);
        }
        done
    }

    /// Whether task `tid`'s entry in `RAISED` is still the one the fork program wrote for it
    /// under `raise`: the fork program deletes a task's entry when a new task takes its id
    /// (`forget_earlier_task` in the eBPF crate), where start times are known to the
    /// nanosecond. `/proc` gives them in clock ticks (10 ms), and a task that took the id in the
    /// same tick as the noted one started looks the same there: root's process that took a
    /// `CLONE_IO` child's id was put back with the child's raise, in 9 runs of 10 of
    /// `a_task_that_takes_a_clone_io_tasks_id_is_not_put_back_with_the_raise` (issue 33).
    /// Looked at just before the put-back: a task that takes the id after this look and before
    /// `ioprio_set` (the noted one exited and was reaped meanwhile) is the race every system
    /// call that names a task by its id has; `ioprio_set` has no pidfd form.
    fn still_noted(&self, tid: u32, raise: &InheritedRaise) -> bool {
        self.raised.get(&tid, 0).ok().is_some_and(|entry| {
            inherited_raise(&entry).is_some_and(|noted| {
                noted.root == raise.root && noted.started_ns == raise.started_ns
            })
        })
    }

    /// Puts back the followed tasks made under the raises of `roots` (every raise's for
    /// `None`), those sharing an I/O context with their parent only if `shared`; and the tasks
    /// whose raise is no longer followed at all (noted by the fork program as it ended),
    /// shared or not.
    fn sweep(&mut self, roots: Option<&[u32]>, shared: bool) {
        let entries: Vec<(u32, RaisedThread)> = self.raised.iter().filter_map(Result::ok).collect();
        let followed: HashSet<u32> = entries
            .iter()
            .filter(|(_, entry)| inherited_raise(entry).is_none())
            .map(|&(tid, _)| tid)
            .collect();
        for (tid, entry) in entries {
            let Some(raise) = inherited_raise(&entry) else {
                continue;
            };
            let orphan = !followed.contains(&raise.root);
            let under = roots.is_none_or(|roots| roots.contains(&raise.root));
            if orphan || (under && (shared || !raise.shares_io_context)) {
                self.put_back(tid, &raise);
            }
        }
        self.prune_counts_but(&followed);
    }
}

/// Whether the task under id `tid` is the one that started at `started_ns`
/// (`task_struct.start_boottime`, ns since boot, which `/proc/TID/stat` gives in clock ticks);
/// false when there is none, or `/proc` cannot tell. A `started_ns` of 0 (not known) names
/// whatever task has the id. A task that took the id within the tick looks the same: this
/// alone names a task only for those the map does not hold (past the bound, or the map was
/// full); the others are named by their entry ([`RaisedForks::still_noted`]).
fn started_at(tid: u32, started_ns: u64) -> bool {
    if started_ns == 0 {
        return true;
    }
    let Ok(pid) = i32::try_from(tid) else {
        return false;
    };
    let ns_per_tick = 1_000_000_000 / procfs::ticks_per_second().max(1);
    procfs::process::Process::new(pid)
        .and_then(|task| task.stat())
        .is_ok_and(|stat| stat.starttime == started_ns / ns_per_tick)
}
