//! The programs the players and recording benchmarks start, each leading a process group of
//! its own: waiting for one with its CPU time, keeping the end of its stderr, and whether it
//! has ended. The players and the recorders differ in how they are stopped, not in this.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How much of a program's stderr is kept: the end, where the reason it stopped is.
const STDERR_TAIL: usize = 2000;

/// Reads `stdout` to its end on a thread of its own; joins to all of it.
pub fn output_of(mut stdout: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    })
}

/// Reads `stderr` to its end on a thread of its own; joins to its last 2000 bytes, trimmed.
pub fn stderr_tail(mut stderr: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let mut start = text.len().saturating_sub(STDERR_TAIL);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        text[start..].trim().to_owned()
    })
}

/// Waits for our child `pid`, calling `meanwhile` every 10 ms until it has ended (the caller
/// escalates there: kills its children or its group after a while). How it ended (`exit 0`,
/// `signal 15`), and the CPU time, user + system, of it and its waited-for descendants, s.
pub fn reap(pid: i32, mut meanwhile: impl FnMut()) -> anyhow::Result<(String, f64)> {
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child, with valid pointers.
        let waited = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut usage) };
        if waited == pid {
            break;
        }
        anyhow::ensure!(waited == 0, "wait4: {}", std::io::Error::last_os_error());
        meanwhile();
        std::thread::sleep(Duration::from_millis(10));
    }
    let ended = if libc::WIFEXITED(status) {
        format!("exit {}", libc::WEXITSTATUS(status))
    } else {
        format!("signal {}", libc::WTERMSIG(status))
    };
    #[expect(clippy::cast_precision_loss, reason = "CPU seconds")]
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((ended, seconds(usage.ru_utime) + seconds(usage.ru_stime)))
}

/// Whether our child `pid` has ended and waits to be reaped.
#[must_use]
pub fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// A command that runs `program` as user `uid` and group `gid`, with no supplementary groups
/// and without capabilities (`setpriv`): how the tests and the benchmarks act as an
/// unprivileged local user.
#[must_use]
pub fn as_user(program: &std::path::Path, uid: u32, gid: u32) -> std::process::Command {
    let mut setpriv = std::process::Command::new("setpriv");
    setpriv
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(program);
    setpriv
}

/// Waits for `pid` (a process group leader), told to stop at `signalled`; 10 s after that its
/// group is killed. How it
/// ended, and the CPU time of it and its descendants.
pub fn wait_for(pid: i32, signalled: Instant) -> anyhow::Result<(String, f64)> {
    let mut killed = false;
    reap(pid, || {
        if !killed && signalled.elapsed() > Duration::from_secs(10) {
            killed = true;
            // SAFETY: killpg(2) of the group `pid` leads.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    })
}
