//! The protocol fuzzer's harness: the daemon under attack with the files its descriptors point
//! at, the hostile client (`abiss-fuzz-client` as `nobody`) that plays each case, and the checks
//! of the daemon after it.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use abiss_proto::{Envelope, ErrorKind, Request, Response, StreamTarget};
use abiss_tests::{
    as_nobody, binary, chmod, write_cold_file, Daemon, Ext4Mount, LoopDevice, Scratch,
};
use serde_json::{json, Value};

use super::HostileConnection;

/// How long the daemon may take to give back what a finished case held.
const SETTLE: Duration = Duration::from_secs(3);

/// What the daemon holds between cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Footprint {
    pub(super) fds: usize,
    pub(super) threads: usize,
    pub(super) locked_kib: u64,
}

/// Descriptors, threads and locked memory of process `pid`. The kernel's io-wq workers
/// (`iou-wrk-N`) are not counted: the kernel starts them for the prefetch rings' blocking work
/// and ends them after a few idle seconds, without the daemon. Nor are abissd's threads per
/// user (`abiss-close`, closing what a user passed; `abiss-lock-N`, locking a user's windows
/// at level N): each ends 5 s after its last item, and what they hold is counted in the
/// descriptors and the locked memory.
pub(super) fn footprint(pid: u32) -> Option<Footprint> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| {
                !["iou-wrk", "abiss-close", "abiss-lock-"]
                    .iter()
                    .any(|transient| comm.starts_with(transient))
            })
        })
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let locked_kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmLck:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())?;
    Some(Footprint {
        fds,
        threads,
        locked_kib,
    })
}

/// One request of root's on a new connection, answered within `timeout`.
fn root_call(socket: &Path, request: &Request, timeout: Duration) -> Result<Response, String> {
    let stream = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let line =
        abiss_proto::encode_line(&Envelope::new(request.clone())).map_err(|e| e.to_string())?;
    (&stream).write_all(&line).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    BufReader::new(&stream)
        .read_until(b'\n', &mut answer)
        .map_err(|e| e.to_string())?;
    abiss_proto::decode_line(&answer).map_err(|e| e.to_string())
}

/// Whether process `pid` runs (a dead child of ours stays a zombie until reaped).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// The files and disks the descriptors point at; removed on drop.
pub(super) struct Targets {
    pub(super) managed: Ext4Mount,
    managed_file: PathBuf,
    secret_file: PathBuf,
    other_disk: Scratch,
    memory: Scratch,
    /// A user's FUSE file whose every flush (at every close) is answered only after 200 ms.
    slow_fs: abiss_tests::hostile::StallingFs,
}

impl Targets {
    fn new() -> Self {
        let managed = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
        chmod(managed.path(), 0o755);
        let managed_file = managed.path().join("stream");
        write_cold_file(&managed_file, 4 << 20);
        chmod(&managed_file, 0o644);
        // Root's only: nobody can open it but with O_PATH.
        let secret_file = managed.path().join("secret");
        write_cold_file(&secret_file, 1 << 20);
        chmod(&secret_file, 0o600);
        // /tmp is on the machine's own disk, which the daemon does not manage.
        let other_disk = Scratch::new_in("/tmp", "fuzz-other");
        write_cold_file(&other_disk.path().join("file"), 1 << 20);
        chmod(&other_disk.path().join("file"), 0o644);
        let memory = Scratch::new_in("/dev/shm", "fuzz-memory");
        std::fs::write(memory.path().join("file"), b"a file in memory").expect("write");
        chmod(&memory.path().join("file"), 0o644);
        Self {
            managed,
            managed_file,
            secret_file,
            other_disk,
            memory,
            slow_fs: abiss_tests::hostile::stalling_fs(Some(Duration::from_millis(200))),
        }
    }

    /// `abiss-fuzz-client`'s arguments after the socket.
    fn client_args(&self) -> Vec<PathBuf> {
        vec![
            self.memory.path().join("file"),
            self.memory.path().to_path_buf(),
            self.managed_file.clone(),
            self.other_disk.path().join("file"),
            self.secret_file.clone(),
            self.slow_fs.file(),
        ]
    }
}

/// `abiss-fuzz-client` running as `nobody`, one case per line.
struct Hands {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Hands {
    fn start(socket: &Path, targets: &Targets) -> Self {
        Self::start_with(socket, &targets.client_args())
    }

    /// With `args` after the socket (as [`Targets::client_args`] gives them).
    fn start_with(socket: &Path, args: &[PathBuf]) -> Self {
        let mut child = as_nobody(&binary("abiss-fuzz-client"))
            .arg(socket)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start abiss-fuzz-client as nobody");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Self {
            child,
            input,
            output,
        }
    }

    /// Sends `case`; what the client saw, or why there is no answer.
    fn run(&mut self, case: &[HostileConnection]) -> Result<Value, String> {
        let connections: Vec<Value> = case
            .iter()
            .map(|connection| {
                let messages: Vec<Value> = connection
                    .messages
                    .iter()
                    .map(|m| json!({"hex": hex(&m.bytes), "fds": m.fds}))
                    .collect();
                json!({"messages": messages, "hang_up": connection.hang_up})
            })
            .collect();
        let line = json!({ "connections": connections }).to_string();
        writeln!(self.input, "{line}")
            .and_then(|()| self.input.flush())
            .map_err(|error| format!("abiss-fuzz-client is gone: {error}"))?;
        let mut answer = String::new();
        self.output
            .read_line(&mut answer)
            .map_err(|error| format!("abiss-fuzz-client did not answer: {error}"))?;
        serde_json::from_str(&answer).map_err(|_| format!("abiss-fuzz-client said '{answer}'"))
    }
}

impl Drop for Hands {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// Totals over the run, for the printed report.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) cases: u64,
    pub(super) connections: u64,
    pub(super) answers: u64,
    pub(super) attached: u64,
    pub(super) fds_sent: u64,
    pub(super) persistent_detached: u64,
    pub(super) crashes: u64,
    pub(super) failures: Vec<String>,
}

/// The daemon under attack, what it held before, and the hostile client.
pub(super) struct Harness {
    pub(super) targets: Targets,
    pub(super) daemon: Daemon,
    hands: Hands,
    baseline: Footprint,
    pub(super) totals: Totals,
}

impl Harness {
    pub(super) fn new() -> Self {
        let targets = Targets::new();
        let daemon = Daemon::start_managing(targets.managed.device().path(), &[]);
        // A model for the disk, so capacity plans run the statistical model (the costly path).
        abiss_tests::save_laptop_model(&daemon, targets.managed.device());
        let hands = Hands::start(daemon.socket(), &targets);
        let mut harness = Self {
            targets,
            daemon,
            hands,
            baseline: Footprint {
                fds: 0,
                threads: 0,
                locked_kib: 0,
            },
            totals: Totals::default(),
        };
        harness.take_baseline();
        harness
    }

    /// What the daemon holds once it has served a stream: the prefetch workers and their rings
    /// start with the first stream and stay.
    fn take_baseline(&mut self) {
        // One worker (a thread and its ring) per ABISS level, started by the level's first
        // stream.
        let mut root = abiss_client::Client::connect(self.daemon.socket()).expect("connect");
        for level in 0..abiss_proto::ABISS_LEVELS {
            let file = std::fs::File::open(&self.targets.managed_file).expect("open");
            let request = abiss_proto::AttachRequest::read(
                abiss_proto::ByteRate(1_000_000),
                abiss_proto::ByteSize(564 << 10),
                20,
                level,
            );
            let stream = root.attach(&file, request).expect("attach at every level");
            root.detach(StreamTarget::Id(stream.id)).expect("detach");
        }
        drop(root);
        std::thread::sleep(Duration::from_millis(300));
        self.baseline = footprint(self.daemon.pid()).expect("the daemon's footprint");
        assert_eq!(
            self.baseline.locked_kib, 0,
            "nothing locked without streams"
        );
    }

    /// The checks can fail: a connection root keeps open (one descriptor in the daemon) is
    /// seen, and once it is closed the daemon is back to its baseline.
    pub(super) fn the_checks_see_a_held_connection(&mut self) {
        let mut held = self.daemon.connect();
        assert!(matches!(held.call(Request::Hello), Response::Hello { .. }));
        let seen = self.settled();
        assert!(seen.is_err(), "a held connection must show: {seen:?}");
        drop(held);
        self.settled()
            .expect("back to the baseline once it is closed");
    }

    /// Runs one case and checks the daemon after it.
    pub(super) fn check(&mut self, case: &[HostileConnection]) -> Result<(), String> {
        self.totals.cases += 1;
        let seen = match self.hands.run(case) {
            Ok(seen) => seen,
            Err(error) => {
                self.hands = Hands::start(self.daemon.socket(), &self.targets);
                return Err(error);
            }
        };
        self.totals.connections += seen["connected"].as_u64().unwrap_or(0);
        self.totals.answers += seen["answers"].as_u64().unwrap_or(0);
        self.totals.attached += seen["attached"].as_u64().unwrap_or(0);
        self.totals.fds_sent += seen["fds_sent"].as_u64().unwrap_or(0);
        let pid = self.daemon.pid();
        if !alive(pid) {
            self.totals.crashes += 1;
            self.daemon.crash_and_restart();
            self.take_baseline();
            return Err(format!("abissd (pid {pid}) died"));
        }
        let result = self.status_in_time().and_then(|()| self.settled());
        if result.is_err() {
            // The next case is judged against what the daemon holds now, not this case's rest.
            std::thread::sleep(SETTLE);
            if let Some(now) = footprint(pid) {
                self.baseline = now;
            }
        }
        result
    }

    /// Root's `status` is answered within 1 s.
    fn status_in_time(&self) -> Result<(), String> {
        let started = Instant::now();
        let answer = root_call(
            self.daemon.socket(),
            &Request::Status,
            Duration::from_secs(1),
        );
        let took = started.elapsed();
        match answer {
            Ok(Response::Devices(_)) if took <= Duration::from_secs(1) => Ok(()),
            Ok(other) => Err(format!("root's status took {took:?}: {other:?}")),
            Err(error) => Err(format!(
                "root's status was not answered ({took:?}): {error}"
            )),
        }
    }

    /// Persistent streams the case left are detached (as their owner would); then the
    /// daemon's descriptors, threads and locked memory come back to the baseline.
    fn settled(&mut self) -> Result<(), String> {
        let pid = self.daemon.pid();
        let mut root = self.daemon.connect();
        if let Response::Streams { streams } = root.call(Request::List) {
            for stream in streams {
                let answer = root.call(Request::Detach {
                    target: StreamTarget::Id(stream.id),
                });
                // A stream that is not persistent ends when its connection closes, and
                // abissd may see that close between the list and this detach.
                let ended_with_its_connection = !stream.persistent
                    && matches!(
                        answer,
                        Response::Error {
                            error: ErrorKind::NotFound,
                            ..
                        }
                    );
                if ended_with_its_connection {
                    continue;
                }
                if !matches!(answer, Response::Detached { .. }) {
                    return Err(format!(
                        "root could not detach stream {}: {answer:?}",
                        stream.id
                    ));
                }
                self.totals.persistent_detached += 1;
            }
        }
        drop(root);
        let deadline = Instant::now() + SETTLE;
        loop {
            let now = footprint(pid).ok_or("abissd vanished")?;
            if now.fds <= self.baseline.fds
                && now.threads <= self.baseline.threads
                && now.locked_kib == 0
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "abissd held {:?} {SETTLE:?} after the case, against {:?} before",
                    now, self.baseline
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The generator.

/// How often [`StatusProbe`] asks, and how long it waits for an answer.
const PROBE_EVERY: Duration = Duration::from_millis(50);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Root's `status`, asked on a new connection every [`PROBE_EVERY`] from another thread for
/// as long as the fuzzer runs, so that a case that holds up the daemon only while it lasts
/// (and not when the case's own check comes) is seen too. An unanswered ask counts as
/// [`PROBE_TIMEOUT`].
pub(super) struct StatusProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Duration>>,
}

impl StatusProbe {
    pub(super) fn start(socket: &Path) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let socket = socket.to_path_buf();
        let thread = std::thread::spawn(move || {
            let mut took = Vec::new();
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let started = Instant::now();
                let answer = root_call(&socket, &Request::Status, PROBE_TIMEOUT);
                took.push(match answer {
                    Ok(Response::Devices(_)) => started.elapsed(),
                    _ => PROBE_TIMEOUT,
                });
                std::thread::sleep(PROBE_EVERY);
            }
            took
        });
        Self { stop, thread }
    }

    /// Stops; the times it took, fastest first.
    pub(super) fn finish(self) -> Vec<Duration> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut took = self.thread.join().expect("the probe");
        took.sort();
        took
    }
}

/// The `q`-quantile of `sorted` (the lab's one quantile), zero when empty.
pub(super) fn quantile(sorted: &[Duration], q: f64) -> Duration {
    abiss_lab::stats::quantile(sorted, q).unwrap_or_default()
}

/// The kinds of descriptor that can never be a stream's, each handed over alone with a
/// well-formed attach by [`Harness::hand_over`].
pub(super) fn bad_hand_overs() -> impl Iterator<Item = &'static str> {
    // Every kind the generator hands over but the one that is a stream's.
    super::generator::FD_KINDS
        .into_iter()
        .filter(|kind| *kind != "managed")
}

/// A well-formed attach of 1 MB/s, to go with one descriptor.
fn attach_line() -> Vec<u8> {
    let request = json!({"kind": "attach", "rate": 1_000_000, "buffer": 577_536,
        "batch_pages": 20, "priority": 3, "persistent": false});
    let mut line = json!({"version": abiss_proto::PROTOCOL_VERSION, "request": request})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

/// The message of `answer` if it is one plain error: a refusal whose message is one line of
/// text.
fn one_plain_error(answer: &str) -> Result<String, String> {
    match abiss_proto::decode_line::<Response>(answer.as_bytes()) {
        Ok(Response::Error { message, .. })
            if !message.is_empty() && !message.contains('\n') && message.len() < 400 =>
        {
            Ok(message)
        }
        _ => Err(format!("not one plain error: {answer:?}")),
    }
}

impl Harness {
    /// Hands over one descriptor of `kind` with a well-formed attach, as `nobody`: it is
    /// refused with one plain error and nothing else, root is answered in time, and the daemon
    /// gives back all it held (the same checks as a case's). A failure is kept in the totals.
    pub(super) fn hand_over(&mut self, kind: &'static str) {
        if let Err(failure) = self
            .hand_over_with(kind, None)
            .and_then(|()| self.settled())
        {
            self.totals.failures.push(format!("hand-over: {failure}"));
        }
    }

    /// The hand-over check can fail: a file on the managed disk, handed over the same way,
    /// is attached, not refused (its stream ends with the connection).
    pub(super) fn the_hand_over_check_sees_an_attach(&mut self) {
        let seen = self.hand_over_with("managed", None);
        assert!(
            seen.as_ref().is_err_and(|error| error.contains("attached")),
            "a file on the managed disk must be attached: {seen:?}"
        );
        self.settled().expect("back to the baseline once it ends");
    }

    fn hand_over_with(
        &mut self,
        kind: &'static str,
        hands: Option<&mut Hands>,
    ) -> Result<(), String> {
        let case = [HostileConnection {
            messages: vec![super::Message {
                bytes: attach_line(),
                fds: vec![kind],
            }],
            hang_up: false,
        }];
        self.totals.cases += 1;
        let seen = match hands {
            Some(hands) => hands.run(&case)?,
            None => self.hands.run(&case)?,
        };
        self.totals.fds_sent += seen["fds_sent"].as_u64().unwrap_or(0);
        if seen["fds_sent"] != json!(1) {
            return Err(format!("{kind}: the client could not hand it over: {seen}"));
        }
        if seen["answers"] != json!(1) {
            return Err(format!("{kind}: {} answers: {seen}", seen["answers"]));
        }
        let message = one_plain_error(seen["first_answer"].as_str().unwrap_or_default())
            .map_err(|error| format!("{kind}: {error}"))?;
        println!("fuzz_protocol: hand-over of {kind}: {message}");
        self.status_in_time()
            .map_err(|error| format!("{kind}: {error}"))
    }

    /// A file on a user's FUSE file system whose flushes are never answered, handed over with an
    /// attach: refused with one plain error, and root's `status`, asked every 100 ms for 1 s
    /// while abissd's close of it waits, is answered within the run's [`super::STATUS_BOUND`]
    /// each time; once the server is gone, the daemon gives back all it held. A failure is
    /// kept in the totals.
    ///
    /// A close on the loop would hold every answer until the server is gone, after the asking:
    /// the first would time out ([`PROBE_TIMEOUT`]). So the bound need not be tight, and is
    /// not: the test's lane-mates in the suite took a `status` here to 175 ms once (the CI run
    /// of 655d8f0; 80 to 170 ms at the slowest in the whole fuzzing run of four suite runs).
    pub(super) fn a_fuse_file_whose_flush_never_answers(&mut self) {
        if let Err(failure) = self.fuse_flush_never_answers() {
            self.totals
                .failures
                .push(format!("FUSE file whose flush never answers: {failure}"));
        }
    }

    fn fuse_flush_never_answers(&mut self) -> Result<(), String> {
        let fs = abiss_tests::hostile::stalling_fs(None);
        let mut args = self.targets.client_args();
        *args.last_mut().expect("FUSE_FILE") = fs.file();
        let mut hands = Hands::start_with(self.daemon.socket(), &args);
        let refused = self.hand_over_with("fuse_stuck", Some(&mut hands));
        let mut slowest = Duration::ZERO;
        for _ in 0..10 {
            let started = Instant::now();
            let answer = root_call(self.daemon.socket(), &Request::Status, PROBE_TIMEOUT);
            if !matches!(answer, Ok(Response::Devices(_))) {
                slowest = PROBE_TIMEOUT;
            }
            slowest = slowest.max(started.elapsed());
            std::thread::sleep(Duration::from_millis(100));
        }
        // The server first: the client's exit closes its copy, which waits for the server.
        drop(fs);
        drop(hands);
        refused?;
        if slowest > super::STATUS_BOUND {
            return Err(format!(
                "root's status took {slowest:?} while abissd's close of the FUSE file waited"
            ));
        }
        self.settled()
    }
}
