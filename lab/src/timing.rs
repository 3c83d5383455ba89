//! Waiting until an exact instant: sleep until shortly before, then spin.
//!
//! A plain sleep wakes up to tens of microseconds late (timer slack, scheduling); on a loaded
//! machine much later. The emulator sleeps until `SPIN_MARGIN` before the deadline and spins
//! (yielding) for the rest, and runs its service thread with a real-time priority so the wake-up
//! itself is prompt.

use std::time::{Duration, Instant};

/// How long before a deadline the sleeping stops and spinning starts.
pub const SPIN_MARGIN: Duration = Duration::from_micros(150);

/// Blocks until `deadline`.
pub fn wait_until(deadline: Instant) {
    let sleep = deadline.saturating_duration_since(Instant::now());
    if sleep > SPIN_MARGIN {
        std::thread::sleep(sleep.saturating_sub(SPIN_MARGIN));
    }
    spin_until(deadline);
}

/// Spins (yielding the CPU to equal-priority threads) until `deadline`.
pub fn spin_until(deadline: Instant) {
    while Instant::now() < deadline {
        std::thread::yield_now();
    }
}

#[must_use]
/// Gives the calling thread the real-time policy `SCHED_FIFO` at `priority`, so that it wakes
/// on time on a loaded machine. Returns whether it worked (it needs `CAP_SYS_NICE`).
pub fn make_current_thread_realtime(priority: i32) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is this thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    rc == 0
}

/// Locks every page the process maps now (its program, libraries, thread stacks) in memory,
/// so that serving a request never waits for a page fault on the root disk: on the lab VM the
/// reclaim takes a program's pages between uses, and the emulator's replies were late by the
/// faults. Pages mapped later (a heap that grows) are anonymous and fault without I/O, so they
/// are not locked. Returns whether it worked (it needs `CAP_IPC_LOCK` or the limit for it).
#[must_use]
pub fn lock_memory() -> bool {
    nix::sys::mman::mlockall(nix::sys::mman::MlockAllFlags::MCL_CURRENT).is_ok()
}

/// Converts a duration to whole nanoseconds, saturating.
#[must_use]
pub fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
