//! The fork program: a task made by a thread abissd raised (a child process, a new thread,
//! anything `kernel_clone` makes) starts with a copy of the raised priority, which abissd did
//! not give it. The program notes the new task in `RAISED` with the raise it comes from (so
//! the tasks it makes in turn are followed too) and tells abissd (the `FORKS` ring), which puts
//! it back. A task that could not be reported (the ring was full) is counted in `FORK_LOST`,
//! and abissd then looks for it in `RAISED` (where it is unless that map was full too).
//!
//! Tasks that share the raised thread's I/O context (`CLONE_IO`) stay in `RAISED` until the
//! raise ends, or until a new task takes their id (then they are gone, and their entry is
//! deleted here), so they are counted in the raise's `RAISE_COUNTS` entry; past
//! `MAX_SHARED_IO_TASKS_PER_RAISE` they are reported but not noted, and the raise's counts
//! mark it for abissd to drop.
//!
//! BTF tracepoint: `sched_process_fork(parent, child)`, which fires in the parent once the
//! child is fully made (its I/O context included) and before it first runs, for every new
//! task: processes and threads alike. It is attached only while abissd has raised some thread.

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use scheduler_common::{raised_flags, ForkEvent, RaisedThread, MAX_SHARED_IO_TASKS_PER_RAISE};

use crate::kernel::{
    counts_of, field, layout, now_ns, raise_of_context, raised_entry, remember_raised_context,
};
use crate::maps::{CONTROL, FORKS, FORK_LOST, RAISED};

/// Counts a new task of a followed thread that could not be reported.
#[inline(always)]
fn lost() {
    if let Some(count) = FORK_LOST.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array, written by nothing else meanwhile.
        unsafe { *count += 1 };
    }
}

/// `sched_process_fork(parent, child)`: `parent` made `child`.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn abiss_fork(ctx: BtfTracePointContext) -> i32 {
    // One array read while nothing is raised (the program is detached then anyway).
    let raised = CONTROL.get(0).map_or(0, |control| control.raised_threads);
    if raised == 0 || layout!(valid) == 0 {
        return 0;
    }
    let parent: u64 = ctx.arg(0);
    let child: u64 = ctx.arg(1);
    if parent == 0 || child == 0 {
        return 0;
    }
    let child_tid: u32 = field(child, layout!(task_pid));
    forget_earlier_task(child_tid);
    let parent_tid: u32 = field(parent, layout!(task_pid));
    let context: u64 = field(parent, layout!(task_io_context));
    let Some(raise) = followed_raise(
        parent_tid,
        field(parent, layout!(task_start_boottime)),
        context,
    ) else {
        return 0;
    };
    let child_started: u64 = field(child, layout!(task_start_boottime));
    // Whether the child shares the raised thread's own I/O context: it does if it shares its
    // parent's and the parent is that thread or shares it. A child sharing the context of a
    // plain task the raised thread made does not: that context is put back with that task,
    // and so is the child, at once, like any task made under the raise.
    let parent_shares_root = raise.flags & raised_flags::INHERITED == 0
        || raise.flags & raised_flags::SHARES_IO_CONTEXT != 0;
    let shares = parent_shares_root
        && context != 0
        && field::<u64>(child, layout!(task_io_context)) == context;
    let mut flags = raised_flags::INHERITED;
    if shares {
        flags |= raised_flags::SHARES_IO_CONTEXT;
        if !count_shared_task(raise.root, child_tid, child_started) {
            flags |= raised_flags::OVER_BOUND;
        }
    }
    let entry = RaisedThread {
        flags,
        started_ns: child_started,
        ..raise
    };
    // A full map only stops the child's own children from being followed: abissd still
    // hears of the child itself below. Past the bound the child is not noted: it shares the
    // raised thread's context, so its own tasks are still followed through
    // `RAISED_CONTEXTS`, and abissd drops the raise on hearing of it.
    let mut reported = entry;
    if flags & raised_flags::OVER_BOUND == 0 && RAISED.insert(child_tid, entry, 0).is_err() {
        reported.flags |= raised_flags::UNNOTED;
    }
    if let Some(mut event) = FORKS.reserve::<ForkEvent>(0) {
        event.write(ForkEvent {
            ts_ns: now_ns(),
            parent: parent_tid,
            child: child_tid,
            raise: reported,
        });
        event.submit(0);
    } else {
        lost();
    }
    0
}

/// A new task took id `tid`, so the task noted under it before is gone: its entry, if a task's
/// (not a raised thread's own, which abissd looks after: `raises::reused_id`), is deleted, for
/// abissd must not put back the new task with the earlier one's raise. This is where the two
/// can be told apart for certain: `/proc/TID/stat` gives a task's start in clock ticks (10 ms),
/// and a task that takes the id within the same tick looks the same there (issue 33: root's
/// process that took a `CLONE_IO` child's id was put back with the child's raise). Every new
/// task passes this tracepoint, which is attached while any thread is raised.
#[inline(always)]
fn forget_earlier_task(tid: u32) {
    // SAFETY: pointer to a live map value of this type, one field read.
    let earlier = RAISED.get_ptr(tid).map(|entry| unsafe { (*entry).flags });
    if earlier.is_some_and(|flags| flags & raised_flags::INHERITED != 0) {
        let _ = RAISED.remove(tid);
    }
}

/// The raise a task made by thread `tid` (which started at `started_ns`, and whose I/O
/// context is `context`) starts with: the thread's own entry, or, for a task sharing a raised
/// thread's context that is not in the map (one past the bound), that thread's raise. An
/// entry noted for an earlier task under the same id is not the thread's.
#[inline(always)]
fn followed_raise(tid: u32, started_ns: u64, context: u64) -> Option<RaisedThread> {
    if let Some(found) = raised_entry(tid, || started_ns) {
        // A raised thread about to share its context: it must be findable by it.
        remember_raised_context(tid, found);
        // SAFETY: pointer to a live map value, copied.
        return Some(unsafe { *found });
    }
    if context == 0 {
        return None;
    }
    // SAFETY: pointer to a live map value, copied.
    raise_of_context(context).map(|found| unsafe { *found })
}

/// Counts task `tid`, which shares raised thread `root`'s I/O context, under its raise;
/// false once that passes [`MAX_SHARED_IO_TASKS_PER_RAISE`] (the raise's counts are then
/// marked, with the task, by which abissd can reach the context should every other task of it
/// be gone), or when the raise has ended (nothing noted under it would be swept any more).
#[inline(always)]
fn count_shared_task(root: u32, tid: u32, started_ns: u64) -> bool {
    // SAFETY: pointer to a live map value of this type, one field read.
    let own = RAISED.get_ptr(root).map(|entry| unsafe { (*entry).flags });
    // Not a task's entry under an id that came round again.
    if own.is_none_or(|flags| flags & raised_flags::INHERITED != 0) {
        return false;
    }
    let Some(counts) = counts_of(root) else {
        return false;
    };
    // SAFETY: pointer to a live map value of this type, an aligned u64 field. Added to with
    // BPF's atomic add (several CPUs may fork under one raise at once): `core`'s atomic types
    // need compare-and-swap, which this target lacks, and the add's result is not used, so
    // it needs no BPF_FETCH (Linux 5.12).
    let count = unsafe { &raw mut (*counts).shared_io_tasks };
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, 1) };
    // SAFETY: as above.
    if unsafe { count.read_volatile() } <= MAX_SHARED_IO_TASKS_PER_RAISE {
        return true;
    }
    // SAFETY: as above; setting the mark twice from two CPUs is harmless, and either task
    // will do.
    unsafe {
        (*counts).over_bound = 1;
        (*counts).past_bound_task = tid;
        (*counts).past_bound_started_ns = started_ns;
    }
    false
}
