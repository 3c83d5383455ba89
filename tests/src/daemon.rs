//! The daemon fixture: a real abissd on a private socket, started by the one starter
//! ([`abiss_bench::daemon`]), a protocol connection to it, and the requests most tests make.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use abiss_bench::daemon::{DaemonCommand, DaemonProcess};
use abiss_proto::{decode_line, encode_line, Envelope, Request, Response, StreamId};

use crate::devices::LoopDevice;
use crate::lab_disk::DiskLoad;
use crate::output::attached_id;
use crate::{binary, FixtureTimer, Scratch};

/// abissd of this build as the one starter runs it, with its socket, state and models in
/// `dir`: for a test that picks its own state directory, or whose start must fail.
#[must_use]
pub fn abissd_command(dir: &Path) -> DaemonCommand {
    DaemonCommand::new(binary("abissd").parent().expect("a directory"), dir)
}

/// A running abissd on its own socket; stopped with SIGTERM on drop.
#[derive(Debug)]
pub struct Daemon {
    process: Option<DaemonProcess>,
    command: DaemonCommand,
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
        let mut command = abissd_command(dir.path()).args(args);
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
        let _timer = FixtureTimer::start("abissd start");
        self.process = Some(self.command.start().expect("start abissd"));
    }

    /// The daemon's state directory (device and raise records for crash recovery).
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
    pub fn attach_at_1mb(&self, file: &Path) -> StreamId {
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

    /// How late the daemon's loop has woken for its credit timer: printed beside a timing
    /// test's misses, so that a late loop is told from a slow disk.
    #[must_use]
    pub fn main_loop(&self) -> abiss_proto::LoopReport {
        abiss_client::Client::connect(&self.socket)
            .and_then(|mut client| client.status_report())
            .expect("status")
            .main_loop
    }

    /// Stops the daemon with SIGTERM and returns its exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut process = self.process.take()?;
        let _timer = FixtureTimer::start("abissd stop");
        let code = process.stop();
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

/// A persistent read stream's request at `rate_bps` with a fixed buffer of `buffer_bytes`, in
/// batches of `batch_pages`, at level 0: what most tests attach.
#[must_use]
pub fn read_request(
    rate_bps: u64,
    buffer_bytes: u64,
    batch_pages: u32,
) -> abiss_proto::AttachRequest {
    abiss_proto::AttachRequest {
        persistent: true,
        ..abiss_proto::AttachRequest::read(
            abiss_proto::ByteRate(rate_bps),
            abiss_proto::ByteSize(buffer_bytes),
            batch_pages,
            0,
        )
    }
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

/// `abissd` arguments that switch off what a kernel before 6.4 lacks (as far as abiss can
/// tell): the tests' stand-in for an older kernel.
pub const OLD_KERNEL_ARGS: [&str; 6] = [
    "--disable",
    "read-tracking",
    "--disable",
    "miss-raises",
    "--disable",
    "uring-reports",
];
