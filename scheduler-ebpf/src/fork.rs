//! The fork program: a task made by a thread abissd raised (a child process, a new thread,
//! anything `kernel_clone` makes) starts with a copy of the raised priority, which abissd did
//! not give it. The program notes the new task in `RAISED` with the raise it comes from (so
//! the tasks it makes in turn are followed too) and tells abissd (the `FORKS` ring), which puts
//! it back. A task that could not be reported (the ring was full) is counted in `FORK_LOST`,
//! and abissd then looks for it in `RAISED` (where it is unless that map was full too).
//!
//! BTF tracepoint: `sched_process_fork(parent, child)`, which fires in the parent once the
//! child is fully made (its I/O context included) and before it first runs, for every new
//! task: processes and threads alike. It is attached only while abissd has raised some thread.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use scheduler_common::{raised_flags, ForkEvent, RaisedThread};

use crate::kernel::{field, layout, now_ns};
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
    let parent_tid: u32 = field(parent, layout!(task_pid));
    // SAFETY: pointer to a live map value, copied.
    let Some(raise) = RAISED.get_ptr(parent_tid).map(|found| unsafe { *found }) else {
        return 0;
    };
    let child_tid: u32 = field(child, layout!(task_pid));
    let context: u64 = field(parent, layout!(task_io_context));
    let shares = context != 0 && field::<u64>(child, layout!(task_io_context)) == context;
    let entry = RaisedThread {
        flags: raised_flags::INHERITED
            | if shares {
                raised_flags::SHARES_IO_CONTEXT
            } else {
                0
            },
        ..raise
    };
    // A full map only stops the child's own children from being followed: abissd still
    // hears of the child itself below.
    let _ = RAISED.insert(child_tid, entry, 0);
    if let Some(mut event) = FORKS.reserve::<ForkEvent>(0) {
        event.write(ForkEvent {
            ts_ns: now_ns(),
            parent: parent_tid,
            child: child_tid,
            raise: entry,
        });
        event.submit(0);
    } else {
        lost();
    }
    0
}
