//! abissd's state directory against other local users, a full disk and a crash (issue 9, the
//! state directory): a raise that cannot be recorded is not made, a crashed daemon's raises are
//! put back by the next start even when it fails, a directory others may write is refused, and
//! a forged record raises nobody. Users are `nobody` through `setpriv`; each abissd here is the
//! one starter's ([`abiss_tests::abissd_command`]) on a state directory the test chooses.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use abiss_client::Client;
use abiss_tests::{abissd_command, as_user, attach_as, binary, chmod, require_root, shared_fs};
use abiss_tests::{wait_until, Daemon, Scratch, BE5, NOBODY_UID, RT0};

/// Runs `command` (abissd, which must refuse to start) until it exits, for at most 20 s (then
/// it is killed: it was meant to stop); it logs at warn whatever `ABISS_DAEMON_LOG` says, as
/// the test reads what it printed.
fn run_to_exit(mut command: Command) -> Output {
    let mut child = command
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let exited = wait_until(Duration::from_secs(20), || {
        child.try_wait().expect("poll").is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("wait");
    assert!(exited, "{command:?} did not exit within 20 s: {output:?}");
    output
}

/// A tmpfs of `size` mounted at a new directory, root's with mode 0755; unmounted on drop.
struct Tmpfs {
    dir: Scratch,
}

impl Tmpfs {
    fn new(tag: &str, size: &str) -> Self {
        let dir = Scratch::new_in("/tmp", tag);
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mount tmpfs");
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills it: a file of zeros until no block is left.
    fn fill(&self) {
        let mut file = File::create(self.path().join("filler")).expect("create filler");
        let block = vec![0u8; 4096];
        while std::io::Write::write_all(&mut file, &block).is_ok() {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// The reader abiss-test-reader as `uid` on `file` at 1 MB/s in 64 KiB reads, starting at
/// `start`, at BE/5 (so a raise and its undoing are told from a default), then idle `linger`
/// seconds.
fn test_reader(uid: u32, file: &Path, secs: u64, start: u64, linger: u64) -> Child {
    as_user(uid, &binary("abiss-test-reader"))
        .arg(file)
        .args(["1000000", "65536", "577536", &secs.to_string()])
        .args(["--start", &start.to_string(), "--ioprio", "2/5"])
        .args(["--linger", &linger.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the test reader")
}

#[test]
fn raises_stop_while_their_record_cannot_be_written() {
    require_root!();
    let (fs, files) = shared_fs(&[("stream.bin", 64 << 20)]);
    let state = Tmpfs::new("fullstate", "256k");
    // The socket (and its lock file) outside the full file system, in a directory of its own
    // that goes with the test.
    let sockets = Scratch::new_in("/tmp", "fullstate-socket");
    let log_file = sockets.path().join("abissd.log");
    let mut daemon = abissd_command(sockets.path())
        .state_dir_at(state.path())
        .args(["--device", &fs.device().path().to_string_lossy()])
        .log_to(&log_file, "warn")
        .start()
        .expect("start abissd");
    let _stream = attach_as(NOBODY_UID, daemon.socket(), &files[0], "1MB/s");
    state.fill();
    // nobody's reader of nobody's stream starts far outside the window: it misses, and would
    // be raised, but the raise could not be recorded.
    let mut reader = test_reader(NOBODY_UID, &files[0], 4, 16 << 20, 2);
    let pid = reader.id();
    std::thread::sleep(Duration::from_secs(3));
    let raises = Client::connect(daemon.socket())
        .and_then(|mut client| client.status_report())
        .expect("status")
        .raises;
    let now = abiss_os::ioprio::get(pid).expect("ioprio of the reader");
    let _ = reader.kill();
    let _ = reader.wait();
    daemon.stop();
    let log = std::fs::read_to_string(&log_file).expect("read abissd's log");
    assert_eq!(
        (raises.active, raises.total, now),
        (0, 0, BE5),
        "a raise went on while the state dir was full: {raises:?}, ioprio {now:#x}\n{log}"
    );
    assert_eq!(
        log.matches("cannot record raised threads").count(),
        1,
        "said once: {log}"
    );
    assert!(log.contains("raising no reader"), "{log}");
}

/// Kills `daemon` with SIGKILL the moment thread `pid` is seen raised (looked at every 100 µs):
/// a raise must be recorded before it is made, or this is where it would be lost.
fn kill_once_raised(daemon: &Daemon, pid: u32) {
    let daemon_pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.pid()).expect("pid"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while abiss_os::ioprio::get(pid).ok() != Some(RT0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(100));
    }
    nix::sys::signal::kill(daemon_pid, nix::sys::signal::Signal::SIGKILL).expect("kill -9");
    assert_eq!(
        abiss_os::ioprio::get(pid).ok(),
        Some(RT0),
        "nobody's reader of nobody's stream was raised"
    );
}

/// A start of abissd over the killed `daemon`'s state that cannot take its disk (exit 16).
fn start_failing_on_its_disk(daemon: &Daemon) -> Output {
    run_to_exit(
        abissd_command(daemon.socket().parent().expect("the daemon's directory"))
            .args(["--device", "/dev/abiss-no-such-disk"])
            .command(),
    )
}

#[test]
fn a_crashed_daemons_raises_are_put_back_even_when_the_next_start_fails_on_a_disk() {
    require_root!();
    let (fs, files) = shared_fs(&[("stream.bin", 64 << 20)]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let _stream = attach_as(NOBODY_UID, daemon.socket(), &files[0], "1MB/s");
    let mut reader = test_reader(NOBODY_UID, &files[0], 2, 16 << 20, 30);
    let pid = reader.id();
    kill_once_raised(&daemon, pid);
    std::thread::sleep(Duration::from_millis(300));
    let next = start_failing_on_its_disk(&daemon);
    let now = abiss_os::ioprio::get(pid).expect("ioprio of the reader");
    let _ = reader.kill();
    let _ = reader.wait();
    assert_eq!(next.status.code(), Some(16), "{next:?}");
    assert_eq!(
        now, BE5,
        "the reader a crashed daemon raised is still at {now:#x} after a start that failed"
    );
}

/// The tasks a raised reader makes while no abissd runs take its raise (a new task takes its
/// maker's I/O priority), and no abissd hears of them: the next start puts them back with the
/// reader, even one that then fails on its disk.
#[test]
fn what_a_raised_reader_makes_while_abissd_is_down_is_put_back_at_the_next_start() {
    require_root!();
    let (fs, files) = shared_fs(&[("stream.bin", 64 << 20)]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let _stream = attach_as(NOBODY_UID, daemon.socket(), &files[0], "1MB/s");
    // Reads 3 s from far outside the window (raised at its first miss), then forks a child
    // that reads on and starts a thread, both living 20 s.
    let file = files[0].to_string_lossy().into_owned();
    let mut reader = as_user(NOBODY_UID, &binary("abiss-test-reader"))
        .args([file.as_str(), "1000000", "65536", "577536", "3"])
        .args(["--start", &(16 << 20).to_string(), "--ioprio", "2/5"])
        .args(["--fork", file.as_str(), "20"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the test reader");
    let pid = reader.id();
    kill_once_raised(&daemon, pid);
    let made = |pid: u32| -> Vec<u32> {
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| {
                dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .unwrap_or_default();
        children
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .chain(threads.into_iter().filter(|&t| t != pid))
            .collect()
    };
    assert!(
        wait_until(Duration::from_secs(8), || made(pid).len() >= 2),
        "the reader forked a child and started a thread: {:?}",
        made(pid)
    );
    let tasks = made(pid);
    let before: Vec<Option<u16>> = tasks
        .iter()
        .map(|&t| abiss_os::ioprio::get(t).ok())
        .collect();
    let next = start_failing_on_its_disk(&daemon);
    let after: Vec<Option<u16>> = tasks
        .iter()
        .map(|&t| abiss_os::ioprio::get(t).ok())
        .collect();
    let reader_now = abiss_os::ioprio::get(pid).ok();
    let _ = reader.kill();
    let _ = reader.wait();
    for task in &tasks {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(*task).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert_eq!(next.status.code(), Some(16), "{next:?}");
    assert!(
        before.iter().all(|&p| p == Some(RT0)),
        "what the reader made while abissd was down took its raise: {tasks:?} at {before:?}"
    );
    assert_eq!(reader_now, Some(BE5), "the reader is put back");
    assert!(
        after.iter().all(|&p| p == Some(BE5)),
        "what the reader made while abissd was down is put back: {tasks:?} at {after:?}"
    );
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    require_root!();
    let scratch = Scratch::new_in("/tmp", "opendir");
    let state = scratch.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chmod(&state, 0o777);
    let output = run_to_exit(abissd_command(scratch.path()).command());
    abiss_tests::assert_fails(&output, 20, "writable by group or others (mode 0777)");
    chmod(&state, 0o755);
    std::os::unix::fs::chown(&state, Some(NOBODY_UID), None).expect("chown");
    let output = run_to_exit(abissd_command(scratch.path()).command());
    abiss_tests::assert_fails(&output, 20, "belongs to uid 65534, not root");
}

/// Start time of process `pid` in clock ticks since boot (`/proc/PID/stat`, field 22).
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = &stat[stat.rfind(')').expect("comm") + 2..];
    after_comm
        .split_whitespace()
        .nth(19)
        .and_then(|field| field.parse().ok())
        .expect("start time")
}

#[test]
fn a_forged_raise_record_raises_nobody_at_start() {
    require_root!();
    let scratch = Scratch::new_in("/tmp", "forged");
    let state = scratch.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    // nobody's process at BE/4, and a record that claims abissd raised it from RT/0 to BE/4:
    // "putting it back" would raise it to real time.
    let mut victim = as_user(NOBODY_UID, Path::new("ionice"))
        .args(["-c2", "-n4", "sleep", "60"])
        .spawn()
        .expect("sleep");
    let pid = victim.id();
    let be4 = (2 << 13) | 4;
    assert!(wait_until(Duration::from_secs(2), || {
        abiss_os::ioprio::get(pid).ok() == Some(be4)
    }));
    let record = format!(
        r#"[{{"task":{{"pid":{pid},"start_time":{}}},"tgid":{pid},"stream":1,"previous":{RT0},"applied":{be4},"last_access_ns":0}}]"#,
        start_time(pid)
    );
    std::fs::write(state.join("upgrades.json"), record).expect("forge");
    let daemon = abissd_command(scratch.path())
        .start()
        .expect("start abissd");
    let now = abiss_os::ioprio::get(pid).expect("ioprio");
    drop(daemon);
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(now, be4, "a forged record set nobody's sleep to {now:#x}");
}
