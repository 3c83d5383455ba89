//! Users and processes: `nobody` and its commands, task ids, descriptors, children, I/O and CPU
//! priorities.

use abiss_proto::StreamId;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::output::attached_id;
use crate::{binary, wait_until};

/// A command that runs `program` as `nobody` (uid and gid 65534), without capabilities: how
/// the tests act as an unprivileged local user.
#[must_use]
pub fn as_nobody(program: &Path) -> Command {
    as_user(NOBODY_UID, program)
}

/// `nobody`'s user and group id.
pub const NOBODY_UID: u32 = 65534;

/// A command that runs `program` as user `uid` (and the group of the same number), without
/// capabilities: a local user other than `nobody`, such as the owner of a stream `nobody`
/// attacks.
#[must_use]
pub fn as_user(uid: u32, program: &Path) -> Command {
    abiss_bench::process::as_user(program, uid, uid)
}

/// Best effort, level 5 (encoded as `ioprio_get` gives it): the priority a test's reader sets
/// itself, so that a put-back is told from the kernel's default (best effort 4).
pub const BE5: u16 = (2 << 13) | 5;
/// Real time, level 0 (encoded): what abissd raises a reader to.
pub const RT0: u16 = 1 << 13;

/// A shell of `nobody`'s at best effort 5 that waits for a line on its standard input, then
/// runs `then` in its place (same thread id). Returned once it is the shell (`setpriv` and
/// `ionice` have run in its place), so that it is `nobody`'s thread when it is named.
#[must_use]
pub fn nobody_waiting_to_run(then: &str) -> Child {
    let shell = as_nobody(Path::new("ionice"))
        .args(["-c2", "-n5", "sh", "-c"])
        .arg(format!("read go && exec {then}"))
        .stdin(Stdio::piped())
        .spawn()
        .expect("a shell as nobody");
    let comm = format!("/proc/{}/comm", shell.id());
    let started = wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&comm).is_ok_and(|name| name.trim() == "sh")
    });
    assert!(started, "the shell did not start");
    shell
}

/// A task `spawn` makes with thread id `id`, which an earlier task had (it must be gone):
/// the kernel is asked for the id after `id - 1` next (`ns_last_pid`, as any user gets an id
/// by making tasks until the ids wrap). Tries 20 times, as another task may take it first.
pub fn spawn_with_id(id: u32, mut spawn: impl FnMut() -> Child) -> Option<Child> {
    (0..20).find_map(|_| {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (id - 1).to_string())
            .expect("write ns_last_pid");
        let mut task = spawn();
        if task.id() == id {
            return Some(task);
        }
        let _ = task.kill();
        let _ = task.wait();
        None
    })
}

/// Gives `path` `mode`, so that `nobody` may reach (or not reach) what a test prepared as root.
pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .unwrap_or_else(|error| panic!("chmod {}: {error}", path.display()));
}

/// Bytes of memory process `pid` holds locked (`VmLck` in its /proc status): abissd's own,
/// where the machine's `Mlocked` also counts what the suite's other lanes lock meanwhile (it
/// once read 55.8 MB here, 13.9 MB of it theirs).
#[must_use]
pub fn locked_bytes_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmLck:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmLck")
        * 1024
}

/// Open descriptors of process `pid`.
#[must_use]
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list fds")
        .count()
}

/// The child processes of process `pid` (its main thread's children).
#[must_use]
pub fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .collect()
}

/// `abissctl --socket SOCKET ARGS…` as `nobody`.
pub fn abissctl_as_nobody(socket: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    abissctl_as(NOBODY_UID, socket, args)
}

/// `abissctl --socket SOCKET ARGS…` as user `uid`.
pub fn abissctl_as(uid: u32, socket: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    as_user(uid, &binary("abissctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("run abissctl as {uid}: {error}"))
}

/// `abissctl attach FILE --rate RATE` as user `uid`: the stream id.
#[must_use]
pub fn attach_as(uid: u32, socket: &Path, file: &Path, rate: &str) -> StreamId {
    attached_id(&abissctl_as(
        uid,
        socket,
        &["attach", &file.to_string_lossy(), "--rate", rate],
    ))
}

/// Sets the calling thread's I/O priority (class, level).
pub fn set_thread_ioprio(class: u8, level: u8) {
    let value = abiss_os::ioprio::encode(class, level);
    abiss_os::ioprio::set(abiss_os::ioprio::CALLING_THREAD, value)
        .unwrap_or_else(|error| panic!("ioprio_set failed: {error}"));
}

/// Polls thread `tid`'s I/O priority until it is `wanted` (encoded), up to `timeout`; how
/// long it took.
#[must_use]
pub fn wait_for_ioprio(tid: u32, wanted: u16, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if abiss_os::ioprio::get(tid).ok() == Some(wanted) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

/// Runs the calling thread under `SCHED_FIFO`, as a player runs its time-critical thread.
///
/// The lab's emulated disk runs its own threads at real-time CPU priority to keep its timing;
/// on a two-core machine a normal-priority reader then competes for the CPU with the emulated
/// disk's data mover during write bursts, and a page-cache hit can take milliseconds for want of
/// a CPU. The priority is above the emulator's so that read latency measures I/O waits only;
/// a reader that waits for the disk still waits, whatever its CPU priority.
///
/// Threads and processes the thread makes afterwards start at the ordinary priority
/// (`SCHED_RESET_ON_FORK`): a test's best-effort load started after its reader is best effort.
/// Without it, the timeshift test's page-cache writer ran at real-time priority, a CPU flat out
/// for 8 s, and held up every abissd on the machine by up to 0.1 s (2026-12-07).
///
/// # Panics
/// If the thread cannot be made real-time (the tests run as root).
pub fn run_at_realtime_cpu_priority() {
    let param = libc::sched_param { sched_priority: 30 };
    // SAFETY: a valid sched_param that outlives the call; pid 0 is the calling thread.
    let rc = unsafe {
        libc::sched_setscheduler(
            0,
            libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
            &raw const param,
        )
    };
    assert_eq!(rc, 0, "SCHED_FIFO for the reader thread");
}
