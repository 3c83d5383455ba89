//! Fixtures of the integration tests: a real `abissd`, real loop devices, real files.
//!
//! The tests run as root on the real kernel, one at a time (`cargo xtask test` passes
//! `--test-threads=1`), because they share kernel state. Every fixture undoes what it made in
//! `Drop`, so a failing test leaves no loop device, mount or daemon behind. Fixtures panic
//! rather than return errors, for backtraces. The fixtures are in this file and its modules,
//! and each concern's tests in one file under `tests/tests/`.
//!
//! | concern | file |
//! | --- | --- |
//! | fixtures: [`Daemon`], [`Connection`], [`LoopDevice`], [`Ext4Mount`], [`HddLab`], [`CopyLoop`], [`Scratch`], [`require_root!`], [`as_nobody`] | `src/lib.rs` |
//! | objects whose close waits: [`hostile::lingering_socket`] | `src/hostile.rs` |
//! | the hostile client's attacks on raises: [`hostile_raises`] | `src/hostile_raises.rs` |
//! | a paced reader that knows nothing of abiss (read(2) or `io_uring`) | `src/bin/abiss-test-reader.rs` |
//! | a paced recorder that knows nothing of abiss (write(2), overflows counted) | `src/bin/abiss-test-recorder.rs` |
//! | an unprivileged user who means harm, run as `nobody` by the security tests | `src/bin/abiss-hostile-client.rs` |
//! | the protocol fuzzer's hands: does to the socket what each generated case says | `src/bin/abiss-fuzz-client.rs` |
//! | a FUSE file system `nobody` mounts to stall whoever examines its file | `src/bin/abiss-stalling-fs.rs` |
//! | `io_uring` polls that never complete, submitted by a reader of an attached file | `src/bin/abiss-stuck-uring.rs` |
//! | **the guarantee and the window** | |
//! | the guarantee: no missed deadline, pages resident when a read begins | `tests/stream_guarantee.rs` |
//! | streams: prefetch priority, resident and locked window, rate conformance | `tests/streams.rs` |
//! | what the window has passed is unlocked and unmapped | `tests/window_release.rs` |
//! | loads reach the disk in requests as large as the disk takes | `tests/load_requests.rs` |
//! | abissd's own use of a file leaves its access time alone | `tests/access_time.rs` |
//! | a rate change on a live stream (fast-forward, slow motion) | `tests/trick_play.rs` |
//! | several streams of one file; a reader behind a recording | `tests/shared_files.rs` |
//! | write streams (recordings): write-back at the stream's level, a paced recorder | `tests/recording.rs` |
//! | a real player (`ffmpeg`) under `abissctl run --preroll` and a load | `tests/players.rs` |
//! | [`write_cold_file`] on the lab hdd: written without the model's time, read under it | `tests/cold_files.rs` |
//! | **priorities and admission** | |
//! | automatic priority upgrades, and putting them back | `tests/upgrades.rs` |
//! | admission refuses exactly at the capacity `abissctl admit` predicts | `tests/admission_capacity.rs` |
//! | automatic buffers enlarged for the disk's admission, within the memory budgets | `tests/capacity_buffers.rs` |
//! | **devices, kernels, tracing** | |
//! | managed devices: elevator, driver depth, restore, `recover` | `tests/managed_device.rs` |
//! | `abissctl profile` recovers the emulated disk; bad devices and model files | `tests/device_profile.rs` |
//! | the tracer counts every request, in the right class, on the right device | `tests/trace_counts.rs` |
//! | requests attributed to their submitting task and their file | `tests/attribution.rs` |
//! | optional parts switched off as on older kernels (`--disable`) | `tests/capabilities.rs` |
//! | `abissctl doctor`: the kernel's parts, a path's stack and disk, served or not (exit 16), as root and `nobody` | `tests/doctor.rs` |
//! | this build on the distributions' own kernels, in qemu (`cargo xtask kernels`) | `tests/kernels.rs` |
//! | **interfaces** | |
//! | the C API from real C programs | `tests/c_example.rs` |
//! | abissctl's habits: bcc's `[interval [count]]`, `64k`, RFC 3339 times | `tests/cli_habits.rs` |
//! | `abissctl top` in a real terminal (tmux) | `tests/top.rs` |
//! | man pages and completions from `cargo xtask man` | `tests/man_pages.rs` |
//! | `--metrics` scraped by a real Prometheus; the Grafana dashboard's names | `tests/metrics.rs` |
//! | abissd as a systemd service under a real systemd (`cargo xtask install`) | `tests/service.rs` |
//! | bad input: one sentence, its exit code, nothing changed | `tests/bad_input.rs` |
//! | **security: an unprivileged user (`nobody`) against abissd** | |
//! | attacks with `src/bin/abiss-hostile-client.rs` | `tests/security.rs` |
//! | start-up fills and seek refills bounded per user | `tests/security_burst.rs` |
//! | closes that wait as long as their owner likes stay off the main loop | `tests/security_closes.rs` |
//! | what one user learns of others: answers, log lines | `tests/security_privacy.rs` |
//! | kernel maps one user can fill (`io_uring` requests never completed) deny no other | `tests/security_kernel_maps.rs` |
//! | connections: hung-up subscribers, too many, idle | `tests/security_connections.rs` |
//! | a raise never outlives what it is for, nor passes to a forked task | `tests/security_raises.rs` |
//! | a stream's raises, every thread together, read no more at real time than it and its user pay for; raises per user | `tests/security_raise_allowance.rs` |
//! | a raised player's reads of other files are paid for by its user | `tests/security_start_up_reads.rs` |
//! | kernel maps, the playout ring, the state directory against users and disk failures | `tests/security_state.rs` |
//! | the protocol fuzzer (hostile requests and descriptor sets) | `tests/fuzz_protocol.rs` |
//! | nothing left behind: bounded records, nothing in flight, no programs | `tests/teardown.rs` |
//!
//! `xtask/tests/doc_index.rs` fails when a file of `tests/` is missing from this table.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use abiss_proto::{decode_line, encode_line, DeviceNumber, Envelope, Request, Response};

pub mod hostile;
pub mod hostile_raises;
pub mod http;

/// The path of built binary `name` (in `ABISS_BIN_DIR`, set by `cargo xtask test`), its pages
/// read into the page cache first: on the lab VM the reclaim takes a test program's pages
/// between tests, and a program raised at real time at its start then reads them at real time,
/// which abissd rightly charges to its user. A test of the start-up allowance saw 4 MiB of
/// `abiss-test-reader`'s own pages charged beside the 768 KiB it read, and its raise dropped.
#[must_use]
pub fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("ABISS_BIN_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug"),
        PathBuf::from,
    );
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build with `cargo xtask build` (or run `cargo xtask test`)",
        path.display()
    );
    let _bytes = abiss_bench::players::program::warm_file(&path);
    path
}

/// Whether this process runs as root; tests that need it print why they skip otherwise.
#[must_use]
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips the calling test (returns) with a printed reason unless running as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::is_root() {
            eprintln!("skipped: needs root (loads eBPF programs, creates loop devices)");
            return;
        }
    };
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A new directory under `base` (e.g. /tmp, or /dev/shm for memory-backed images).
    #[must_use]
    pub fn new_in(base: &str, tag: &str) -> Self {
        let path = Path::new(base).join(format!("abiss-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch dir");
        Self { path }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A running abissd on its own socket; stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Daemon {
    process: Option<abiss_bench::daemon::DaemonProcess>,
    command: abiss_bench::daemon::DaemonCommand,
    socket: PathBuf,
    args: Vec<String>,
    /// Its socket, state and models; removed when it drops.
    _dir: Scratch,
    /// A load on the lab disk it manages, if it manages one (see [`write_cold_file`]).
    load: Option<DiskLoad>,
    /// Its standard error goes to this file, at log level info ([`Daemon::start_logging`]).
    log: Option<PathBuf>,
}

impl Daemon {
    /// Starts abissd and waits until it answers.
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts abissd managing `device` (streams need a managed disk).
    #[must_use]
    pub fn start_managing(device: &Path, extra: &[&str]) -> Self {
        let device = device.to_string_lossy().into_owned();
        let mut args = vec!["--device", device.as_str()];
        args.extend_from_slice(extra);
        Self::start_with(&args)
    }

    /// Starts abissd with extra arguments (its socket and state directory are private).
    #[must_use]
    pub fn start_with(args: &[&str]) -> Self {
        Self::launch(args, false)
    }

    /// Starts abissd with extra arguments, logging at level info to a file [`Daemon::log`]
    /// reads.
    #[must_use]
    pub fn start_logging(args: &[&str]) -> Self {
        Self::launch(args, true)
    }

    fn launch(args: &[&str], logging: bool) -> Self {
        // On tmpfs, as abissd's default /run/abiss is on a systemd machine: a raise writes its
        // record there.
        let dir = Scratch::new_in("/dev/shm", "daemon");
        let log = logging.then(|| dir.path().join("abissd.log"));
        let mut command = abiss_bench::daemon::DaemonCommand::new(
            binary("abissd").parent().expect("a directory"),
            dir.path(),
        )
        .args(args);
        if let Some(log) = &log {
            command = command.log_to(log, "info");
        }
        let mut daemon = Self {
            process: None,
            socket: command.socket(),
            command,
            args: args.iter().map(|&a| a.to_owned()).collect(),
            _dir: dir,
            load: None,
            log,
        };
        daemon.spawn();
        daemon
    }

    /// What abissd logged so far (started with [`Daemon::start_logging`]).
    #[must_use]
    pub fn log(&self) -> String {
        let path = self.log.as_ref().expect("started with start_logging");
        std::fs::read_to_string(path).expect("read abissd's log")
    }

    fn spawn(&mut self) {
        if self.load.is_none() {
            let devices = self
                .args
                .windows(2)
                .filter(|pair| pair[0] == "--device")
                .map(|pair| Path::new(&pair[1]));
            self.load = DiskLoad::on(devices);
        }
        self.process = Some(self.command.start().expect("start abissd"));
    }

    /// The daemon's state directory (device and upgrade records for crash recovery).
    #[must_use]
    pub fn state_dir(&self) -> PathBuf {
        self.command.state_dir()
    }

    /// The daemon's model directory (where `abissctl profile --save --model-dir` puts
    /// device models).
    #[must_use]
    pub fn model_dir(&self) -> PathBuf {
        self.command.model_dir()
    }

    /// The daemon's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("abissd runs").pid()
    }

    /// Kills the daemon with SIGKILL, as a crash would, and starts a new one with the same
    /// socket, state directory and arguments.
    pub fn crash_and_restart(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        self.spawn();
    }

    /// The control socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// A protocol connection.
    #[must_use]
    pub fn connect(&self) -> Connection {
        Connection::open(&self.socket)
    }

    /// Runs abissctl against this daemon.
    pub fn ctl<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Command::new(binary("abissctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run abissctl")
    }

    /// Attaches `file` with `abissctl attach` at 1 MB/s with the ABISS measurement's 564 KiB
    /// buffer; returns the stream id.
    #[must_use]
    pub fn attach_at_1mb(&self, file: &Path) -> u64 {
        attached_id(&self.attach_1mb_output(file, "564KiB"))
    }

    /// `abissctl attach FILE --rate 1MB/s --buffer BUFFER`, as it ended.
    #[must_use]
    pub fn attach_1mb_output(&self, file: &Path, buffer: &str) -> Output {
        self.ctl([
            OsStr::new("attach"),
            file.as_os_str(),
            OsStr::new("--rate"),
            OsStr::new("1MB/s"),
            OsStr::new("--buffer"),
            OsStr::new(buffer),
        ])
    }

    /// The daemon's view of its streams.
    #[must_use]
    pub fn streams(&self) -> Vec<abiss_proto::StreamInfo> {
        abiss_client::Client::connect(&self.socket)
            .and_then(|mut client| client.list())
            .expect("list streams")
    }

    /// Stops the daemon with SIGTERM and returns its exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let code = self.process.take()?.stop();
        self.load = None;
        code
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One protocol connection to abissd.
#[derive(Debug)]
pub struct Connection {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Connection {
    /// Connects to `socket`.
    #[must_use]
    pub fn open(socket: &Path) -> Self {
        let writer = UnixStream::connect(socket).expect("connect to abissd");
        let reader = BufReader::new(writer.try_clone().expect("clone stream"));
        Self { writer, reader }
    }

    /// Sends a raw line (for malformed-input tests).
    pub fn send_raw(&mut self, line: &[u8]) {
        self.writer.write_all(line).expect("send");
    }

    /// Sends a request.
    pub fn send(&mut self, request: Request) {
        let line = encode_line(&Envelope::new(request)).expect("encode");
        self.send_raw(&line);
    }

    /// Reads one response.
    pub fn receive(&mut self) -> Response {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line).expect("receive");
        assert!(!line.is_empty(), "abissd closed the connection");
        decode_line(&line).expect("decode response")
    }

    /// Sets how long `receive` may block.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("set timeout");
    }

    /// Sends a request and reads its answer.
    pub fn call(&mut self, request: Request) -> Response {
        self.send(request);
        self.receive()
    }

    /// The cumulative latency groups.
    pub fn latency(&mut self) -> Vec<abiss_proto::LatencyGroup> {
        match self.call(Request::Latency) {
            Response::Latency { groups, .. } => groups,
            other => panic!("unexpected answer {other:?}"),
        }
    }
}

/// A loop device over a sparse image file; detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    number: DeviceNumber,
    _dir: Scratch,
}

impl LoopDevice {
    /// A `size_mib` loop device with direct I/O to its image, which lives under `base`.
    #[must_use]
    pub fn new_in(base: &str, size_mib: u64) -> Self {
        let dir = Scratch::new_in(base, "loop");
        let image = dir.path().join("disk.img");
        File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("create image");
        let output = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&image)
            .output()
            .expect("run losetup");
        assert!(
            output.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        let name = path
            .file_name()
            .expect("device name")
            .to_string_lossy()
            .into_owned();
        let number = std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
            .expect("read dev")
            .trim()
            .parse()
            .expect("parse dev");
        // udev probes new devices; let that finish so it does not count as test I/O.
        let _ = Command::new("udevadm").arg("settle").status();
        Self {
            path,
            number,
            _dir: dir,
        }
    }

    /// `/dev/loopN`.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `loopN`.
    #[must_use]
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Its device number.
    #[must_use]
    pub fn number(&self) -> DeviceNumber {
        self.number
    }

    /// Selects an I/O scheduler (none, mq-deadline, kyber, bfq).
    pub fn set_scheduler(&self, scheduler: &str) {
        std::fs::write(
            format!("/sys/block/{}/queue/scheduler", self.name()),
            scheduler,
        )
        .expect("set scheduler");
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// An ext4 filesystem on a loop device, mounted; unmounted on drop.
#[derive(Debug)]
pub struct Ext4Mount {
    mount: Scratch,
    // Field order: unmount before the device is detached.
    device: LoopDevice,
}

impl Ext4Mount {
    /// Formats `device` and mounts it.
    #[must_use]
    pub fn new(device: LoopDevice) -> Self {
        Self::with_mkfs_args(device, &[])
    }

    /// Formats `device` with `mkfs.ext4 ARGS` and mounts it (a small device gets 1 KiB blocks
    /// otherwise, and files at most 4 TiB).
    #[must_use]
    pub fn with_mkfs_args(device: LoopDevice, args: &[&str]) -> Self {
        let status = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(args)
            .arg(device.path())
            .status()
            .expect("run mkfs.ext4");
        assert!(status.success(), "mkfs.ext4 failed");
        let mount = Scratch::new_in("/tmp", "mnt");
        let status = Command::new("mount")
            .arg(device.path())
            .arg(mount.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount failed");
        Self { mount, device }
    }

    /// The mount point.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &LoopDevice {
        &self.device
    }
}

impl Drop for Ext4Mount {
    fn drop(&mut self) {
        // A process that just closed a file on it (a stopped daemon) may take a moment to go.
        let unmounted = wait_until(Duration::from_secs(5), || {
            Command::new("umount")
                .arg(self.mount.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !unmounted {
            eprintln!(
                "{} is still busy: detaching it lazily",
                self.mount.path().display()
            );
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.mount.path())
                .status();
        }
    }
}

/// A command that runs `program` as `nobody` (uid and gid 65534), without capabilities: how
/// the tests act as an unprivileged local user.
#[must_use]
pub fn as_nobody(program: &Path) -> Command {
    abiss_bench::process::as_user(program, 65534, 65534)
}

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

/// Open descriptors of process `pid`.
#[must_use]
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("list fds")
        .count()
}

/// Bytes read from block device `name` so far (512-byte sectors in its stat file): what
/// the disk itself was asked for, whoever asked.
#[must_use]
pub fn disk_bytes_read(name: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("disk stat");
    stat.split_whitespace()
        .nth(2)
        .and_then(|sectors| sectors.parse::<u64>().ok())
        .expect("sectors read")
        * 512
}

/// A persistent read stream's request at `rate_bps` with a fixed buffer of `buffer_bytes`, in
/// batches of `batch_pages`, at level 0: what most tests attach.
#[must_use]
pub fn read_request(
    rate_bps: u64,
    buffer_bytes: u64,
    batch_pages: u32,
) -> abiss_proto::AttachRequest {
    abiss_proto::AttachRequest {
        rate: abiss_proto::ByteRate(rate_bps),
        buffer: abiss_proto::ByteSize(buffer_bytes),
        batch_pages,
        priority: 0,
        persistent: true,
        write: false,
        preallocate: false,
        preroll: None,
        buffer_auto: false,
    }
}

/// Read requests block device `name` completed so far (its stat file's first field, after the
/// elevator merged what it could).
#[must_use]
pub fn disk_reads(name: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("disk stat");
    stat.split_whitespace()
        .next()
        .and_then(|reads| reads.parse::<u64>().ok())
        .expect("reads completed")
}

/// Saves the laptop-disk model for `device` in `daemon`'s model directory, so admission and
/// capacity plans on it run the statistical model (the costly path).
pub fn save_laptop_model(daemon: &Daemon, device: &LoopDevice) {
    let identity = abiss_model::DeviceIdentity::of(device.number()).expect("identity");
    let model = abiss_model::DeviceModel {
        identity,
        ..abiss_model::fixtures::laptop_disk(1.0, abiss_model::fixtures::LAPTOP_REVOLUTION_MS)
    };
    model.save(&daemon.model_dir()).expect("save model");
}

/// `abissctl --socket SOCKET ARGS…` as `nobody`.
pub fn abissctl_as_nobody(socket: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    as_nobody(&binary("abissctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run abissctl as nobody")
}

/// `abissd` arguments that switch off what a kernel before 6.4 lacks (as far as abiss can
/// tell): the tests' stand-in for an older kernel.
pub const OLD_KERNEL_ARGS: [&str; 6] = [
    "--disable",
    "read-tracking",
    "--disable",
    "miss-upgrades",
    "--disable",
    "uring-reports",
];

/// Sets the calling thread's I/O priority (class, level).
pub fn set_thread_ioprio(class: u8, level: u8) {
    let value = abiss_os::ioprio::encode(class, level);
    abiss_os::ioprio::set(abiss_os::ioprio::CALLING_THREAD, value)
        .unwrap_or_else(|error| panic!("ioprio_set failed: {error}"));
}

/// Reads `count` blocks of `block` bytes with `O_DIRECT` from `device`, starting at `first_block`.
pub fn direct_reads(device: &Path, block: usize, first_block: u64, count: u64) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .expect("open device O_DIRECT");
    let mut buffer = abiss_lab::direct_io::AlignedBuffer::new(block);
    let slice = buffer.slice(block);
    for i in 0..count {
        let offset = (first_block + i) * block as u64;
        file.read_exact_at(slice, offset).expect("direct read");
    }
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

/// Waits until `condition` holds, up to `timeout`.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `bpftool -j ARGS`, parsed.
fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("run bpftool");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("bpftool json")
}

/// The kernel id of the eBPF map `name` that process `pid` (a daemon) holds.
#[must_use]
pub fn daemon_map_id(pid: u32, name: &str) -> String {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let info = std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default();
        if let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) {
            ids.push(id.trim().to_owned());
        }
    }
    ids.into_iter()
        .find(|id| bpftool_json(&["map", "show", "id", id])["name"] == name)
        .unwrap_or_else(|| panic!("the daemon holds no map {name}"))
}

/// The entries of the eBPF map with kernel id `id`, as `bpftool map dump` gives them (with
/// BTF, each has a `formatted` key and value; without, raw bytes).
#[must_use]
pub fn map_dump(id: &str) -> Vec<serde_json::Value> {
    match bpftool_json(&["map", "dump", "id", id]) {
        serde_json::Value::Array(entries) => entries,
        other => panic!("bpftool dumped {other}"),
    }
}

/// The entries of the eBPF map `name` that process `pid` (a daemon) holds.
#[must_use]
pub fn daemon_map_dump(pid: u32, name: &str) -> Vec<serde_json::Value> {
    map_dump(&daemon_map_id(pid, name))
}

/// Field `name` of the `CONTROL` map's entry `entry` (as [`map_dump`] gives it), the
/// `index`th u32 of the struct when bpftool has no BTF to name it by.
#[must_use]
pub fn control_field(entry: &serde_json::Value, name: &str, index: usize) -> u64 {
    if let Some(value) = entry.get("formatted").map(|f| &f["value"]) {
        return value[name].as_u64().expect("a number");
    }
    let bytes: Vec<u8> = entry["value"]
        .as_array()
        .expect("value bytes")
        .iter()
        .map(|b| {
            u8::from_str_radix(b.as_str().expect("hex").trim_start_matches("0x"), 16).expect("hex")
        })
        .collect();
    let at = index * 4;
    u64::from(u32::from_ne_bytes(
        bytes[at..at + 4].try_into().expect("4 bytes"),
    ))
}

/// Whether a BPF program with kernel id `id` is loaded.
#[must_use]
pub fn program_loaded(id: u32) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// An emulated laptop hdd from the lab (FUSE + loop device) with ext4 mounted; torn down on
/// drop.
#[derive(Debug)]
pub struct HddLab {
    lab: abiss_lab::Lab,
    state_dir: PathBuf,
    /// Holds the lab's state (and its image where memory has no room for it).
    scratch: Scratch,
}

impl HddLab {
    /// A `size_gib` lab hdd with `scheduler` selected, ext4 made and mounted.
    #[must_use]
    pub fn up(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Ext4),
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected, xfs made and mounted.
    #[must_use]
    pub fn up_xfs(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Xfs),
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected and nothing on it (a raw disk).
    #[must_use]
    pub fn up_raw(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(tag, size_gib, scheduler, None)
    }

    fn up_with(
        tag: &str,
        size_gib: u64,
        scheduler: &str,
        mkfs: Option<abiss_lab::FilesystemKind>,
    ) -> Self {
        use abiss_lab::{Lab, LabOptions, ModelFile, ModelKind};
        let dir = Scratch::new_in("/tmp", &format!("lab-{tag}"));
        let mut options =
            LabOptions::new(ModelFile::default().spec(ModelKind::Hdd)).expect("lab options");
        options.size_bytes = size_gib << 30;
        options.mkfs = mkfs;
        if mkfs.is_some() {
            options.mount_dir = Some(dir.path().join("mnt"));
        }
        options.scheduler = Some(scheduler.to_owned());
        options.state_dir = dir.path().join("state");
        // In memory where it fits, as the benchmarks do (`abiss_lab::lab::memory_backing_dir`),
        // in a directory of its own (every test lab's state directory is called `state`).
        options.backing_dir = abiss_lab::lab::memory_backing_dir(options.size_bytes).map_or_else(
            || dir.path().join("backing"),
            |memory| memory.join(dir.path().file_name().unwrap_or_default()),
        );
        let lab = Lab::up(&options).expect("bring the lab hdd up");
        if mkfs.is_some() {
            register_lab_disk(&lab, &options.state_dir);
        }
        Self {
            lab,
            state_dir: options.state_dir,
            scratch: dir,
        }
    }

    /// The loop device.
    #[must_use]
    pub fn device(&self) -> &Path {
        self.lab.device()
    }

    /// The mounted filesystem.
    #[must_use]
    pub fn mount(&self) -> &Path {
        self.lab.mount_dir().expect("mounted")
    }

    /// The lab itself (stats).
    #[must_use]
    pub fn lab(&self) -> &abiss_lab::Lab {
        &self.lab
    }
}

impl Drop for HddLab {
    fn drop(&mut self) {
        let device = device_number(self.lab.device());
        lab_disks().retain(|disk| Some(disk.device) != device);
        if let Err(error) = abiss_lab::Lab::down(&self.state_dir) {
            eprintln!("lab down: {error}");
        }
        // A backing directory in memory is not under the scratch directory: should `down`
        // have failed, it would hold the image in memory until a reboot.
        let memory = Path::new(abiss_lab::lab::MEMORY_BACKING_DIR);
        let lab_dir = memory.join(self.scratch.path().file_name().unwrap_or_default());
        let _ = std::fs::remove_dir_all(lab_dir);
    }
}

/// The lab disks with a file system that [`HddLab`] brought up in this process, for
/// [`write_cold_file`].
static LAB_DISKS: Mutex<Vec<LabDisk>> = Mutex::new(Vec::new());

/// One of [`LAB_DISKS`].
#[derive(Debug)]
struct LabDisk {
    /// The loop device's number: its `st_rdev`, and the `st_dev` of the files on it.
    device: u64,
    /// A second handle on the lab, to switch its model off and on.
    lab: abiss_lab::Lab,
    /// Files being written with the model off ([`ModelOff`]).
    fills: usize,
    /// Daemons managing the disk and copy loops on it ([`DiskLoad`]).
    loads: usize,
}

fn lab_disks() -> MutexGuard<'static, Vec<LabDisk>> {
    LAB_DISKS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn register_lab_disk(lab: &abiss_lab::Lab, state_dir: &Path) {
    let device = device_number(lab.device()).expect("the lab's loop device");
    let lab = abiss_lab::Lab::open(state_dir).expect("a second handle on the lab");
    lab_disks().push(LabDisk {
        device,
        lab,
        fills: 0,
        loads: 0,
    });
}

/// The device a path is on: a block device's own number, or that of the file system holding
/// the file (or, if it does not exist yet, its directory).
fn device_number(path: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = std::fs::metadata(path).or_else(|_| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        std::fs::metadata(parent.unwrap_or(Path::new(".")))
    });
    let metadata = metadata.ok()?;
    Some(if metadata.file_type().is_block_device() {
        metadata.rdev()
    } else {
        metadata.dev()
    })
}

/// A load on lab disks (a daemon managing one, a copy loop on one), for as long as it is held:
/// [`write_cold_file`] keeps the model on for files on those disks meanwhile.
#[derive(Debug)]
struct DiskLoad {
    devices: Vec<u64>,
}

impl DiskLoad {
    /// A load on those of `paths` (devices or files) that are on lab disks; `None` if none is.
    fn on<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Option<Self> {
        let mut disks = lab_disks();
        let mut devices = Vec::new();
        for device in paths.into_iter().filter_map(device_number) {
            if devices.contains(&device) {
                continue;
            }
            if let Some(disk) = disks.iter_mut().find(|d| d.device == device) {
                disk.loads += 1;
                devices.push(device);
            }
        }
        drop(disks);
        // Not `then_some`: it would make (and drop, locking the list again) an empty load.
        if devices.is_empty() {
            None
        } else {
            Some(Self { devices })
        }
    }
}

impl Drop for DiskLoad {
    fn drop(&mut self) {
        for disk in lab_disks()
            .iter_mut()
            .filter(|d| self.devices.contains(&d.device))
        {
            disk.loads -= 1;
        }
    }
}

/// A lab disk's model switched off while a file is put on it; switched back on when dropped
/// (also when unwinding from a panic).
struct ModelOff {
    device: u64,
}

impl ModelOff {
    /// Switches the model off for a file at `path`, if `path` is on a lab disk of this process
    /// with no [`DiskLoad`] on it.
    fn for_file(path: &Path) -> Option<Self> {
        let device = device_number(path)?;
        let mut disks = lab_disks();
        let disk = disks
            .iter_mut()
            .find(|d| d.device == device && d.loads == 0)?;
        if disk.fills == 0 {
            disk.lab
                .set_unmodelled(true)
                .expect("switch the lab's model off");
        }
        disk.fills += 1;
        Some(Self { device })
    }
}

impl Drop for ModelOff {
    fn drop(&mut self) {
        let mut disks = lab_disks();
        let Some(disk) = disks.iter_mut().find(|d| d.device == self.device) else {
            return;
        };
        disk.fills -= 1;
        if disk.fills > 0 {
            return;
        }
        if let Err(error) = disk.lab.set_unmodelled(false) {
            // A panic while unwinding would abort, and hide the first one.
            if std::thread::panicking() {
                eprintln!("switching the lab's model back on: {error}");
            } else {
                panic!("switching the lab's model back on: {error}");
            }
        }
    }
}

/// Writes a file of `bytes` pseudo-random bytes ([`cold_file_bytes`]), synced and evicted from
/// the page cache.
///
/// On the disk of an [`HddLab`] of this process, the file is written with the lab's model
/// switched off ([`abiss_lab::Lab::set_unmodelled`]): it stands for data that was on the disk
/// before the test, and costs no modelled time (200 MB took 5 s at the emulated disk's rate),
/// nor shows in the lab's statistics. Before the model is switched back on (also when this
/// panics), the file is synced, and the file system with it (`syncfs`, and ext4's journal
/// checkpointed), so that no write of the fill reaches the model later, and the file is
/// evicted: the first read of it is a modelled cold read, as on any disk.
///
/// Other I/O on that disk meanwhile would go unmodelled too. While a [`Daemon`] manages the
/// disk or a [`CopyLoop`] runs on it, the file is written under the model instead, as before;
/// I/O a test starts on the disk by other means is not known here: write the files first.
pub fn write_cold_file(path: &Path, bytes: u64) {
    let model_off = ModelOff::for_file(path);
    let mut file = File::create(path).expect("create file");
    cold_blocks(bytes, |block| file.write_all(block).expect("write"));
    file.sync_all().expect("sync");
    if model_off.is_some() {
        sync_file_system(&file);
    }
    evict(&file);
    drop(model_off);
}

/// The contents [`write_cold_file`] writes for a file of `bytes` bytes.
#[must_use]
pub fn cold_file_bytes(bytes: u64) -> Vec<u8> {
    let mut contents = Vec::with_capacity(usize::try_from(bytes).expect("fits in memory"));
    cold_blocks(bytes, |block| contents.extend_from_slice(block));
    contents
}

/// Hands the contents of a cold file of `bytes` bytes to `each`, 1 MiB at a time.
fn cold_blocks(bytes: u64, mut each: impl FnMut(&[u8])) {
    let mut block = vec![0u8; 1 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ bytes;
    let mut done = 0;
    while done < bytes {
        for chunk in block.chunks_mut(8) {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let n = usize::try_from((bytes - done).min(block.len() as u64)).expect("fits");
        each(&block[..n]);
        done += n as u64;
    }
}

/// `_IOW('f', 43, __u32)`: write everything in an ext4 file system's journal to its place
/// (Linux 5.13).
const EXT4_IOC_CHECKPOINT: libc::c_ulong = 0x4004_662b;

/// Brings what is dirty in `file`'s file system to the disk, metadata included: `syncfs`,
/// then ext4's journal checkpointed, which jbd2 would otherwise do at some later time.
fn sync_file_system(file: &File) {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: syncfs on an open descriptor.
    let rc = unsafe { libc::syncfs(fd) };
    assert_eq!(rc, 0, "syncfs: {}", std::io::Error::last_os_error());
    let flags: u32 = 0;
    // SAFETY: the ioctl reads one u32 of flags. Without it (not ext4, an older kernel) the
    // journal's blocks are written later, as they always were.
    let _ = unsafe { libc::ioctl(fd, EXT4_IOC_CHECKPOINT, &raw const flags) };
}

/// The JSON a successful command printed (`abissctl … --json`); fails the test with the
/// command's stderr otherwise.
#[must_use]
pub fn json_of(output: &Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Drops a file's pages from the page cache.
pub fn evict(file: &File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fadvise on an open descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// A best-effort copy loop, as in the ABISS measurement: the benchmarks' copy loop (128 KiB
/// reads and writes, the source dropped from the page cache each pass, writeback kept going in
/// windows as under a small machine's dirty limit), stopped on drop.
#[derive(Debug)]
pub struct CopyLoop {
    inner: Option<abiss_bench::workload::CopyLoop>,
    /// A load on the lab disk it copies on, if it does (see [`write_cold_file`]).
    load: Option<DiskLoad>,
}

impl CopyLoop {
    /// Starts copying.
    #[must_use]
    pub fn start(source: PathBuf, target: PathBuf) -> Self {
        Self {
            load: DiskLoad::on([source.as_path(), target.as_path()]),
            inner: Some(abiss_bench::workload::CopyLoop::start(
                source,
                target,
                128 << 10,
            )),
        }
    }

    /// Stops and returns the bytes copied.
    ///
    /// # Panics
    /// If the copy failed.
    pub fn stop(&mut self) -> u64 {
        let Some(inner) = self.inner.take() else {
            return 0;
        };
        let copied = inner.copied_bytes();
        inner.stop().expect("the copy loop");
        self.load = None;
        copied
    }
}

impl Drop for CopyLoop {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let _ = inner.stop();
        }
    }
}

/// What a paced reader saw: per-read latency and deadline misses.
#[derive(Debug, Default)]
pub struct PacedReport {
    /// Latency of each read, ns.
    pub latencies_ns: Vec<u64>,
    /// Reads that completed after their deadline.
    pub misses: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Reads that took over a millisecond.
    pub slow: Vec<SlowRead>,
    /// Reads that began while part of their range was not in the page cache: the window
    /// lagged the reader, and the read waited for the disk (with a watched file only).
    pub not_resident: Vec<SlowRead>,
}

/// A read that took over a millisecond, with what the page cache held just before it.
#[derive(Debug, Clone, Copy)]
pub struct SlowRead {
    /// Index of the read.
    pub index: u64,
    /// File offset it started at.
    pub offset: u64,
    /// How long it took, ns.
    pub latency_ns: u64,
    /// Bytes of the read's range that were in the page cache when it started (`None` when the
    /// reader was not given a file to look at).
    pub resident_before: Option<u64>,
}

/// Bytes of `[offset, offset + len)` of `file` that are in the page cache.
///
/// Uses `mincore` on a private mapping, which neither reads the file nor counts as an access, so
/// it does not disturb the readers it watches (or the daemon's view of them). `offset` must be
/// page-aligned; the range is clipped to the file.
///
/// # Panics
/// If the file cannot be mapped.
#[must_use]
pub fn resident_bytes(file: &File, offset: u64, len: u64) -> u64 {
    let size = file.metadata().expect("file size").len();
    let len = len.min(size.saturating_sub(offset));
    if len == 0 {
        return 0;
    }
    let length = usize::try_from(len).expect("a range that fits in memory");
    // SAFETY: a fresh read-only mapping of a file we hold open, used only for mincore.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(file),
            i64::try_from(offset).expect("an offset within the file"),
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap for mincore");
    let mut pages = vec![0u8; length.div_ceil(4096)];
    // SAFETY: `pages` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(map, length, pages.as_mut_ptr()) };
    // SAFETY: our mapping, unmapped once.
    unsafe { libc::munmap(map, length) };
    assert_eq!(rc, 0, "mincore");
    let pages = pages.iter().filter(|&&p| p & 1 == 1).count() as u64;
    (pages * 4096).min(len)
}

impl PacedReport {
    /// The latency below which `quantile` of the reads completed, ns.
    #[must_use]
    pub fn quantile_ns(&self, quantile: f64) -> u64 {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        abiss_lab::stats::quantile(&sorted, quantile).unwrap_or(0)
    }
}

/// The stream id `abissctl attach` printed.
///
/// # Panics
/// If the attach failed (with its message) or printed no id.
#[must_use]
pub fn attached_id(output: &Output) -> u64 {
    assert!(
        output.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("abissctl attach prints the stream id")
}

/// A command's standard error as text.
#[must_use]
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts that a command failed as bad input must: exit code `code`, one sentence on
/// standard error (clap's pointer to `--help` aside) that mentions `needle`, and no panic.
///
/// # Panics
/// If it did not.
pub fn assert_fails(output: &Output, code: i32, needle: &str) {
    let message = stderr(output);
    assert_eq!(output.status.code(), Some(code), "exit code for: {message}");
    assert!(
        message.contains(needle),
        "message '{message}' should mention '{needle}'"
    );
    assert!(!message.contains("panicked"), "no panic: {message}");
    // clap follows a usage error with a blank line and a pointer to --help.
    let sentence = message
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with("For more information"))
        .count();
    assert_eq!(sentence, 1, "one sentence: {message}");
}

/// Runs the calling thread under `SCHED_FIFO`, as a player runs its time-critical thread.
///
/// The lab's emulated disk runs its own threads at real-time CPU priority to keep its timing;
/// on a two-core machine a normal-priority reader then competes for the CPU with the emulated
/// disk's data mover during write bursts, and a page-cache hit can take milliseconds for want of
/// a CPU. The priority is above the emulator's so that read latency measures I/O waits only;
/// a reader that waits for the disk still waits, whatever its CPU priority.
///
/// # Panics
/// If the thread cannot be made real-time (the tests run as root).
pub fn run_at_realtime_cpu_priority() {
    let param = libc::sched_param { sched_priority: 30 };
    // SAFETY: a valid sched_param that outlives the call; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    assert_eq!(rc, 0, "SCHED_FIFO for the reader thread");
}

/// Reads `reader` in `read_bytes` reads on the ABISS schedule: read i is issued at
/// `t0 + i·S/R` (at once if late) and misses if it completes after `t0 + B/R + i·S/R`.
/// With `watched` (the same file, opened separately), each slow read records how much of its
/// range was in the page cache just before it.
pub fn paced_read(
    reader: &mut impl std::io::Read,
    watched: Option<&File>,
    rate_bps: u64,
    buffer_bytes: u64,
    read_bytes: usize,
    duration: Duration,
) -> PacedReport {
    let start = Instant::now();
    let mut report = PacedReport::default();
    let mut chunk = vec![0u8; read_bytes];
    let period_ns = read_bytes as u64 * 1_000_000_000 / rate_bps;
    let slack_ns = buffer_bytes * 1_000_000_000 / rate_bps;
    for i in 0u64.. {
        let issue = Duration::from_nanos(i * period_ns);
        if issue >= duration {
            break;
        }
        if let Some(wait) = issue.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        // Only the page-aligned part is looked at: mincore maps from a page boundary.
        let aligned = report.bytes / 4096 * 4096;
        let resident_before = watched.map(|file| resident_bytes(file, aligned, read_bytes as u64));
        let wanted = watched.map(|file| {
            let size = file.metadata().map_or(0, |m| m.len());
            size.saturating_sub(aligned).min(read_bytes as u64)
        });
        let before = Instant::now();
        let read = reader.read(&mut chunk).expect("paced read");
        let done = start.elapsed();
        let latency = u64::try_from(before.elapsed().as_nanos()).unwrap_or(u64::MAX);
        report.latencies_ns.push(latency);
        let this = SlowRead {
            index: i,
            offset: report.bytes,
            latency_ns: latency,
            resident_before,
        };
        if resident_before < wanted {
            report.not_resident.push(this);
        }
        if latency > 1_000_000 {
            report.slow.push(this);
        }
        if done > Duration::from_nanos(slack_ns + i * period_ns) {
            report.misses += 1;
        }
        report.bytes += read as u64;
        if read == 0 {
            break;
        }
    }
    report
}

/// Builds `abiss-c` and returns the directory holding `libabiss.so`, with the `libabiss.so.0`
/// link that programs look for at run time (the library's SONAME; cargo makes only
/// `libabiss.so`, and ldconfig would make the link in an installed tree). `cargo xtask test`
/// builds only binaries, so the library is built here (quick when it is fresh); cargo's own
/// report says where it went.
#[must_use]
pub fn abiss_c_library() -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "abiss-c", "--message-format=json"])
        .arg("--manifest-path")
        .arg(workspace().join("Cargo.toml"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo build -p abiss-c");
    assert!(output.status.success(), "cargo build -p abiss-c failed");
    let library = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["filenames"].as_array().cloned())
        .flatten()
        .filter_map(|name| name.as_str().map(PathBuf::from))
        .find(|name| name.file_name().is_some_and(|n| n == "libabiss.so"))
        .expect("cargo reported no libabiss.so");
    let dir = library.parent().expect("library dir").to_path_buf();
    let soname = dir.join("libabiss.so.0");
    if std::fs::symlink_metadata(&soname).is_err() {
        std::os::unix::fs::symlink("libabiss.so", &soname).expect("link libabiss.so.0");
    }
    dir
}

/// The workspace's root directory.
#[must_use]
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Compiles `abiss-c/examples/NAME.c` as strict C99 against the header and the library in
/// `library` (from [`abiss_c_library`]) into `dir`; returns the program's path.
#[must_use]
pub fn compile_c_example(name: &str, library: &Path, dir: &Path) -> PathBuf {
    let crate_dir = workspace().join("abiss-c");
    let program = dir.join(name);
    let output = Command::new("cc")
        .args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-O2",
        ])
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples").join(format!("{name}.c")))
        .arg("-o")
        .arg(&program)
        .arg("-L")
        .arg(library)
        .arg("-labiss")
        .arg(format!("-Wl,-rpath,{}", library.display()))
        .output()
        .expect("run cc");
    assert!(
        output.status.success(),
        "cc {name}.c failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    program
}

/// Where `path` lies on its device, as byte ranges (`filefrag`; a file system on the whole
/// device).
#[must_use]
pub fn file_extents(path: &Path) -> Vec<(u64, u64)> {
    let output = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .expect("run filefrag");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("blocks of 4096 bytes"), "{text}");
    // `   0:        0..    2047:      34816..     36863:   2048:             last,eof`
    text.lines()
        .filter_map(|line| {
            let fields: Vec<_> = line
                .split_whitespace()
                .map(|f| f.trim_end_matches([':', '.']))
                .collect();
            let _extent: u64 = fields.first()?.parse().ok()?;
            let start: u64 = fields.get(3)?.parse().ok()?;
            let blocks: u64 = fields.get(5)?.parse().ok()?;
            Some((start * 4096, (start + blocks) * 4096))
        })
        .collect()
}

/// The requests of `records` of kind `op` that touch `extents`.
pub fn on_extents<'a>(
    records: &'a [abiss_lab::RequestRecord],
    extents: &'a [(u64, u64)],
    op: abiss_lab::Op,
) -> impl Iterator<Item = &'a abiss_lab::RequestRecord> {
    records.iter().filter(move |r| {
        r.op == op
            && extents
                .iter()
                .any(|&(start, end)| r.offset < end && start < r.offset + r.len)
    })
}
