//! What abissd keeps (kernel maps, the playout ring, its state directory, its workers) holds
//! up against other local users, against failures of the disk it records on, and across a
//! crash (issue 9: findings 7, 8 and 9, and the state directory). Users are `nobody` and
//! made-up uids through `setpriv`.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, ByteRate, ByteSize, StreamTarget};
use abiss_tests::chmod;
use abiss_tests::{
    binary, require_root, wait_until, write_cold_file, Daemon, Ext4Mount, LoopDevice, Scratch,
};

/// A user that is neither root nor `nobody`: the owner of streams `nobody` attacks.
const OWNER_UID: u32 = 4242;
const NOBODY_UID: u32 = 65534;

/// A command that runs `program` as `uid` (and its gid), without capabilities.
fn as_user(uid: u32, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut setpriv = Command::new("setpriv");
    setpriv
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(program);
    setpriv
}

/// An ext4 filesystem whose root everybody may enter, with `files` cold files of `bytes`
/// each that everybody may read.
fn shared_fs(files: &[&str], bytes: u64) -> (Ext4Mount, Vec<PathBuf>) {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    chmod(fs.path(), 0o755);
    let paths = files
        .iter()
        .map(|name| {
            let path = fs.path().join(name);
            write_cold_file(&path, bytes);
            chmod(&path, 0o644);
            path
        })
        .collect();
    (fs, paths)
}

/// An attach request at `rate` B/s with `buffer` bytes, persistent (it outlives abissctl).
fn request(rate: u64, buffer: u64, batch_pages: u32, priority: u8) -> AttachRequest {
    AttachRequest {
        rate: ByteRate(rate),
        buffer: ByteSize(buffer),
        batch_pages,
        priority,
        persistent: true,
        write: false,
        preallocate: false,
        preroll: None,
        buffer_auto: false,
    }
}

/// `abissctl attach` as `uid`; the stream id.
fn attach_as(uid: u32, socket: &Path, file: &Path, rate: &str) -> u64 {
    let output = as_user(uid, binary("abissctl"))
        .arg("--socket")
        .arg(socket)
        .arg("attach")
        .arg(file)
        .args(["--rate", rate])
        .output()
        .expect("run abissctl");
    assert!(output.status.success(), "attach as {uid}: {output:?}");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("abissctl attach prints the stream id")
}

/// An abissd on a socket and state directory the test chooses (the `Daemon` fixture picks
/// its own), with its standard error kept when asked; stopped with SIGTERM on drop.
struct OwnDaemon {
    child: Option<Child>,
    socket: PathBuf,
}

impl OwnDaemon {
    /// The abissd command line over `socket` and `state_dir`.
    fn command(socket: &Path, state_dir: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(binary("abissd"));
        command
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--model-dir")
            .arg(state_dir.with_file_name("models"))
            .args(args)
            .env("RUST_LOG", "warn");
        command
    }

    /// Starts abissd and waits until it answers; its standard error goes to a pipe when
    /// `capture`.
    fn start(socket: &Path, state_dir: &Path, args: &[&str], capture: bool) -> Self {
        let mut command = Self::command(socket, state_dir, args);
        if capture {
            command.stderr(Stdio::piped());
        }
        let mut child = command.spawn().expect("start abissd");
        let answered = wait_until(Duration::from_secs(20), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("abissd exited with {status} before serving");
            }
            Client::connect(socket)
                .and_then(|mut client| client.call(abiss_proto::Request::Hello))
                .is_ok()
        });
        assert!(answered, "abissd did not start within 20 s");
        Self {
            child: Some(child),
            socket: socket.to_path_buf(),
        }
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect")
    }

    /// Stops it with SIGTERM; its output.
    fn stop(&mut self) -> Output {
        let child = self.child.take().expect("abissd runs");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        child.wait_with_output().expect("wait for abissd")
    }
}

impl Drop for OwnDaemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop();
        }
    }
}

/// Reads `bytes` at `offset` of `file` with `O_DIRECT`: one request to the disk, whatever the
/// page cache holds.
fn direct_read(file: &Path, offset: u64, bytes: usize) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .expect("open O_DIRECT");
    let mut storage = vec![0u8; bytes + 4096];
    let start = storage.as_ptr().align_offset(4096);
    file.read_exact_at(&mut storage[start..start + bytes], offset)
        .expect("direct read");
}

#[test]
fn streams_that_ended_leave_room_in_the_latency_map_for_new_ones() {
    require_root!();
    let (fs, files) = shared_fs(&["kept.bin", "cycled.bin"], 4 << 20);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    // A stream that stays keeps the page-cache programs attached, so each cycle below is
    // only a map update, not program attachments.
    let kept = File::open(&files[0]).expect("open");
    client
        .attach(&kept, request(1_000_000, 64 << 10, 4, 7))
        .expect("attach the kept stream");
    let reattached = File::open(&files[1]).expect("open");
    // More streams than the map has keys (scheduler_common::MAX_HISTOGRAM_KEYS, 4096), each
    // with one direct read of its file: a request tagged with the stream, so a key of its own.
    let cycles = 4_400;
    let started = Instant::now();
    for i in 0..cycles {
        let info = client
            .attach(&reattached, request(1_000_000, 8 << 10, 1, 7))
            .expect("attach");
        direct_read(&files[1], (i % 1000) * 4096, 4096);
        client.detach(StreamTarget::Id(info.id)).expect("detach");
    }
    eprintln!(
        "{cycles} attach/read/detach cycles in {:?}",
        started.elapsed()
    );
    let info = client
        .attach(&reattached, request(1_000_000, 8 << 10, 1, 7))
        .expect("attach");
    direct_read(&files[1], 1 << 20, 4096);
    // Before, the map also filled up with ended streams' keys, until the answer was too long
    // to send.
    let (_, groups) = client
        .latency()
        .unwrap_or_else(|error| panic!("latency after {cycles} ended streams: {error}"));
    let ours: Vec<_> = groups
        .iter()
        .filter(|group| group.stream == Some(info.id))
        .collect();
    assert!(
        ours.iter().map(|group| group.requests).sum::<u64>() >= 1,
        "stream {} after {cycles} ended streams is missing from the latency groups ({} groups)",
        info.id,
        groups.len()
    );
    // The ended streams' requests still count for their disk.
    let disk_reads: u64 = groups
        .iter()
        .filter(|group| group.device == fs.device().number())
        .map(|group| group.requests)
        .sum();
    assert!(
        disk_reads > cycles,
        "{disk_reads} requests on the disk after {cycles} direct reads"
    );
}

/// Runs `command` until it exits, for at most 20 s (then it is killed: it was meant to stop).
fn run_to_exit(mut command: Command) -> Output {
    let mut child = command
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

#[test]
fn another_users_reads_do_not_crowd_the_owners_misses_out_of_the_ring() {
    require_root!();
    let (fs, files) = shared_fs(&["shared.bin"], 64 << 20);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = files[0].to_string_lossy().into_owned();
    let id = attach_as(OWNER_UID, daemon.socket(), &files[0], "1MB/s");
    // nobody rereads the start of the owner's file (in the loaded window, so from the page
    // cache) one byte per read(2), as fast as two processes go: once a ring record per read.
    let hammer =
        format!("while :; do dd if={path} of=/dev/null bs=1 count=400000 status=none; done");
    let mut hammers: Vec<Child> = (0..2)
        .map(|_| {
            as_user(NOBODY_UID, "sh")
                .args(["-c", &hammer])
                .spawn()
                .expect("start the hammer")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile the owner reads one page every 2 MiB from 4 MiB on: each read misses the page
    // cache (each a jump away from the window), and abissd must hear of each.
    let reads = owner_reads_a_page_every_2_mib(&files[0]);
    std::thread::sleep(Duration::from_millis(500));
    for hammer in &mut hammers {
        let _ = hammer.kill();
        let _ = hammer.wait();
    }
    let waited = waits_heard(&daemon, id);
    assert!(
        waited >= reads,
        "abissd heard of {waited} of the owner's {reads} reads that waited for the disk while \
         nobody read the file in a loop"
    );
}

/// The reads of stream `id` that abissd heard wait for the disk. Each of
/// [`owner_reads_a_page_every_2_mib`]'s reads jumps 2 MiB past the window, so abissd counts
/// its wait as the seek's rather than as a miss: both count here.
fn waits_heard(daemon: &Daemon, id: u64) -> u64 {
    let stream = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .expect("the owner's stream");
    stream.misses + stream.seek_waits
}

/// `OWNER_UID` reads one page of `file` every 2 MiB from 4 MiB on, 50 ms apart: each read
/// misses the page cache. Returns how many reads it made.
fn owner_reads_a_page_every_2_mib(file: &Path) -> u64 {
    let path = file.to_string_lossy();
    let positions: Vec<u64> = (2..31).map(|k| k * 2 * 256).collect();
    let reads: Vec<String> = positions
        .iter()
        .map(|block| format!("dd if={path} of=/dev/null bs=4096 count=1 skip={block} status=none"))
        .collect();
    let owner = as_user(OWNER_UID, "sh")
        .args(["-c", &reads.join("; sleep 0.05; ")])
        .output()
        .expect("owner reads");
    assert!(owner.status.success(), "{owner:?}");
    positions.len() as u64
}

/// `nobody` rereads its own attached file in a tight loop (two threads, a read(2) of one
/// byte each time) while another user's reader misses at known places in its own file: each
/// of nobody's reads is an event of nobody's own stream, and unpaced they filled the ring
/// every stream shares, so that the other user's misses found no room in it.
#[test]
fn an_owners_tight_loop_on_its_own_file_does_not_crowd_other_users_misses_out_of_the_ring() {
    require_root!();
    let (fs, files) = shared_fs(&["owners.bin"], 64 << 20);
    let nobodys = fs.path().join("nobodys.bin");
    write_cold_file(&nobodys, 1 << 20);
    chmod(&nobodys, 0o644);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let id = attach_as(OWNER_UID, daemon.socket(), &files[0], "1MB/s");
    let socket = daemon.socket().to_string_lossy().into_owned();
    let flood = as_user(NOBODY_UID, binary("abiss-hostile-client"))
        .args([socket.as_str(), "flood", &nobodys.to_string_lossy(), "5"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood");
    std::thread::sleep(Duration::from_secs(1));
    let reads = owner_reads_a_page_every_2_mib(&files[0]);
    let flooded = flood.wait_with_output().expect("the flood");
    assert!(flooded.status.success(), "{flooded:?}");
    std::thread::sleep(Duration::from_millis(300));
    let waited = waits_heard(&daemon, id);
    println!(
        "nobody's flood: {}; abissd heard of {waited} of the owner's {reads} waits",
        String::from_utf8_lossy(&flooded.stdout).trim()
    );
    assert!(
        waited >= reads,
        "abissd heard of {waited} of the owner's {reads} reads that waited for the disk while \
         nobody reread its own attached file in a loop"
    );
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
    as_user(uid, binary("abiss-test-reader"))
        .arg(file)
        .args(["1000000", "65536", "577536", &secs.to_string()])
        .args(["--start", &start.to_string(), "--ioprio", "2/5"])
        .args(["--linger", &linger.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the test reader")
}

const BE5: u16 = (2 << 13) | 5;
const RT0: u16 = 1 << 13;

#[test]
fn raises_stop_while_their_record_cannot_be_written() {
    require_root!();
    let (fs, files) = shared_fs(&["stream.bin"], 64 << 20);
    let state = Tmpfs::new("fullstate", "256k");
    // The socket (and its lock file) outside the full file system, in a directory of its own
    // that goes with the test.
    let sockets = abiss_tests::Scratch::new_in("/tmp", "fullstate-socket");
    let socket = sockets.path().join("abiss.sock");
    let mut daemon = OwnDaemon::start(
        &socket,
        state.path(),
        &["--device", &fs.device().path().to_string_lossy()],
        true,
    );
    attach_as(NOBODY_UID, &socket, &files[0], "1MB/s");
    state.fill();
    // nobody's reader of nobody's stream starts far outside the window: it misses, and would
    // be raised, but the raise could not be recorded.
    let mut reader = test_reader(NOBODY_UID, &files[0], 4, 16 << 20, 2);
    let pid = reader.id();
    std::thread::sleep(Duration::from_secs(3));
    let upgrades = daemon.client().status_report().expect("status").raises;
    let now = abiss_os::ioprio::get(pid).expect("ioprio of the reader");
    let _ = reader.kill();
    let _ = reader.wait();
    let log = String::from_utf8_lossy(&daemon.stop().stderr).into_owned();
    assert_eq!(
        (upgrades.active, upgrades.total, now),
        (0, 0, BE5),
        "a raise went on while the state dir was full: {upgrades:?}, ioprio {now:#x}\n{log}"
    );
    assert_eq!(
        log.matches("cannot record raised threads").count(),
        1,
        "said once: {log}"
    );
    assert!(log.contains("raising no reader"), "{log}");
}

#[test]
fn a_crashed_daemons_raises_are_put_back_even_when_the_next_start_fails_on_a_disk() {
    require_root!();
    let (fs, files) = shared_fs(&["stream.bin"], 64 << 20);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    attach_as(NOBODY_UID, daemon.socket(), &files[0], "1MB/s");
    let mut reader = test_reader(NOBODY_UID, &files[0], 2, 16 << 20, 30);
    let pid = reader.id();
    let raised = wait_until(Duration::from_secs(5), || {
        abiss_os::ioprio::get(pid).ok() == Some(RT0)
    });
    assert!(raised, "nobody's reader of nobody's stream was raised");
    let daemon_pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.pid()).expect("pid"));
    nix::sys::signal::kill(daemon_pid, nix::sys::signal::Signal::SIGKILL).expect("kill -9");
    std::thread::sleep(Duration::from_millis(300));
    // The next start cannot take its disk (exit 16).
    let next = run_to_exit(OwnDaemon::command(
        daemon.socket(),
        &daemon.state_dir(),
        &["--device", "/dev/abiss-no-such-disk"],
    ));
    let now = abiss_os::ioprio::get(pid).expect("ioprio of the reader");
    let _ = reader.kill();
    let _ = reader.wait();
    assert_eq!(next.status.code(), Some(16), "{next:?}");
    assert_eq!(
        now, BE5,
        "the reader a crashed daemon raised is still at {now:#x} after a start that failed"
    );
}

#[test]
fn a_state_dir_others_can_write_is_refused() {
    require_root!();
    let scratch = Scratch::new_in("/tmp", "opendir");
    let state = scratch.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chmod(&state, 0o777);
    let output = run_to_exit(OwnDaemon::command(
        &scratch.path().join("abiss.sock"),
        &state,
        &[],
    ));
    abiss_tests::assert_fails(&output, 20, "writable by group or others (mode 0777)");
    chmod(&state, 0o755);
    std::os::unix::fs::chown(&state, Some(NOBODY_UID), None).expect("chown");
    let output = run_to_exit(OwnDaemon::command(
        &scratch.path().join("abiss.sock"),
        &state,
        &[],
    ));
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
fn a_forged_upgrade_record_raises_nobody_at_start() {
    require_root!();
    let scratch = Scratch::new_in("/tmp", "forged");
    let state = scratch.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    // nobody's process at BE/4, and a record that claims abissd raised it from RT/0 to BE/4:
    // "putting it back" would raise it to real time.
    let mut victim = as_user(NOBODY_UID, "ionice")
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
    let daemon = OwnDaemon::start(&scratch.path().join("abiss.sock"), &state, &[], false);
    let now = abiss_os::ioprio::get(pid).expect("ioprio");
    drop(daemon);
    let _ = victim.kill();
    let _ = victim.wait();
    assert_eq!(now, be4, "a forged record set nobody's sleep to {now:#x}");
}

/// Sets `kernel.io_uring_disabled`; the old value is put back on drop.
struct UringSwitch {
    old: String,
}

const URING_SWITCH: &str = "/proc/sys/kernel/io_uring_disabled";

impl UringSwitch {
    fn set(value: &str) -> Self {
        let old = std::fs::read_to_string(URING_SWITCH).expect("read the sysctl");
        std::fs::write(URING_SWITCH, value).expect("write the sysctl");
        Self {
            old: old.trim().to_owned(),
        }
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(URING_SWITCH, &self.old);
    }
}

#[test]
fn a_prefetch_worker_that_fails_is_started_again_and_its_level_loads() {
    require_root!();
    let (fs, files) = shared_fs(&["stream.bin"], 16 << 20);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let file = File::open(&files[0]).expect("open");
    // While io_uring is off for everyone, the first stream at level 3 starts its level's
    // worker, whose ring cannot be set up. Kept short: the switch is machine-wide.
    let info = {
        let _off = UringSwitch::set("2");
        let info = client
            .attach(&file, request(10_000_000, 564 << 10, 20, 3))
            .expect("attach");
        std::thread::sleep(Duration::from_millis(200));
        info
    };
    // Loaded again: the window holds at least half its buffer (it refills in requests of a
    // third of it, so it need not be full).
    let loaded = wait_until(Duration::from_secs(10), || {
        daemon
            .streams()
            .iter()
            .any(|s| s.id == info.id && s.locked_bytes >= 282 << 10)
    });
    let stream = daemon.streams().into_iter().find(|s| s.id == info.id);
    assert!(
        loaded,
        "level 3 never loaded after io_uring came back: {stream:?}"
    );
}

#[test]
fn truncating_an_attached_file_logs_its_failed_loads_once() {
    require_root!();
    let (fs, files) = shared_fs(&["shrinking.bin"], 64 << 20);
    let scratch = Scratch::new_in("/tmp", "truncate");
    let state = scratch.path().join("state");
    let mut daemon = OwnDaemon::start(
        &scratch.path().join("abiss.sock"),
        &state,
        &["--device", &fs.device().path().to_string_lossy()],
        true,
    );
    let mut client = daemon.client();
    let file = File::open(&files[0]).expect("open");
    let info = client
        .attach(&file, request(10_000_000, 564 << 10, 20, 0))
        .expect("attach");
    std::thread::sleep(Duration::from_millis(300));
    // Truncated under the stream: every load of the window past the new end fails, and the
    // window keeps asking for them at its rate.
    File::options()
        .write(true)
        .open(&files[0])
        .and_then(|f| f.set_len(1 << 20))
        .expect("truncate");
    for step in 1..=30 {
        client
            .position(info.id, step * (1 << 20))
            .expect("position");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(client);
    let log = String::from_utf8_lossy(&daemon.stop().stderr).into_owned();
    let lines = log
        .lines()
        .filter(|line| line.contains(&format!("stream {}: loading", info.id)))
        .count();
    assert_eq!(
        lines, 1,
        "a truncated file's failed loads in the log:\n{log}"
    );
}
