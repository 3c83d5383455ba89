//! The protocol fuzzer: hostile requests and descriptor sets from an unprivileged user, through
//! the real socket of a real abissd that manages a real (loop) disk.
//!
//! cargo-fuzz needs a nightly compiler, which this project does not use, so the generator is
//! proptest's: well-formed requests with hostile numbers, other versions, unknown kinds, random
//! JSON, truncated lines, lines over [`MAX_LINE_BYTES`], raw bytes, deep nesting, and 0 to 12
//! descriptors per message (regular file, directory, `O_PATH` of a file `nobody` may not read,
//! pipe, socket, /dev/null, a file on the managed disk, a file on another disk), over several
//! connections at once. The test (root) generates each case; `abiss-fuzz-client`, run as
//! `nobody`, sends it; then the test checks the daemon as root:
//! - it is alive, and answers root's `status` within 1 s;
//! - once the case's connections are gone (and streams they left on purpose, persistent ones,
//!   are detached), its descriptors and threads are back to where they were, and it locks no
//!   memory.
//!
//! A failing case is shrunk and its seed kept in `fuzz_protocol.proptest-regressions` next to
//! this file, which proptest replays first on every run; the hand-written hostile lines of
//! `tests/fuzz-corpus/*.line` are replayed every run too (each once bare, once with 9
//! descriptors). `ABISS_FUZZ_CASES` sets the number of generated cases (default 500; each run
//! draws new ones, so CI runs add up to far more).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use abiss_proto::{Envelope, Request, Response, StreamTarget, MAX_LINE_BYTES, PROTOCOL_VERSION};
use abiss_tests::chmod;
use abiss_tests::{
    as_nobody, binary, require_root, write_cold_file, Daemon, Ext4Mount, LoopDevice, Scratch,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::{json, Value};

/// Kinds of descriptor a message may carry (`abiss-fuzz-client` opens them).
const FD_KINDS: [&str; 12] = [
    "file",
    "directory",
    "opath",
    "pipe",
    "socket",
    "null",
    "managed",
    "other_disk",
    "linger",
    "fifo",
    "memfd",
    "fuse",
];

/// How long the daemon may take to give back what a finished case held.
const SETTLE: Duration = Duration::from_secs(3);

/// One message: bytes, and the kinds of the descriptors sent with them.
#[derive(Clone)]
struct Message {
    bytes: Vec<u8>,
    fds: Vec<&'static str>,
}

/// The bytes as text, long runs cut short: a failing case is printed, and kept with its seed
/// in the regressions file, in a readable size.
impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.bytes);
        let shown: String = if text.chars().count() > 240 {
            let head: String = text.chars().take(160).collect();
            let tail: String = text.chars().skip(text.chars().count() - 60).collect();
            format!("{head}…{tail}")
        } else {
            text.into_owned()
        };
        write!(
            f,
            "{} bytes {shown:?} with fds {:?}",
            self.bytes.len(),
            self.fds
        )
    }
}

/// One hostile connection: its messages, and whether it hangs up at once after them (rather
/// than shutting its sending side and reading the answers).
#[derive(Clone, Debug)]
struct HostileConnection {
    messages: Vec<Message>,
    hang_up: bool,
}

/// What the daemon holds between cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Footprint {
    fds: usize,
    threads: usize,
    locked_kib: u64,
}

/// Descriptors, threads and locked memory of process `pid`. The kernel's io-wq workers
/// (`iou-wrk-N`) are not counted: the kernel starts them for the prefetch rings' blocking work
/// and ends them after a few idle seconds, without the daemon. Nor are abissd's threads per
/// user (`abiss-close`, closing what a user passed; `abiss-lock-N`, locking a user's windows
/// at level N): each ends 5 s after its last item, and what they hold is counted in the
/// descriptors and the locked memory.
fn footprint(pid: u32) -> Option<Footprint> {
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
struct Targets {
    managed: Ext4Mount,
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
            slow_fs: abiss_tests::hostile::StallingFs::mount(Some(Duration::from_millis(200))),
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
        let mut child = as_nobody(&binary("abiss-fuzz-client"))
            .arg(socket)
            .args(targets.client_args())
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
struct Totals {
    cases: u64,
    connections: u64,
    answers: u64,
    attached: u64,
    fds_sent: u64,
    persistent_detached: u64,
    crashes: u64,
    failures: Vec<String>,
}

/// The daemon under attack, what it held before, and the hostile client.
struct Harness {
    targets: Targets,
    daemon: Daemon,
    hands: Hands,
    baseline: Footprint,
    totals: Totals,
}

impl Harness {
    fn new() -> Self {
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
            let request = abiss_proto::AttachRequest {
                rate: abiss_proto::ByteRate(1_000_000),
                buffer: abiss_proto::ByteSize(564 << 10),
                batch_pages: 20,
                priority: level,
                persistent: false,
                write: false,
                preallocate: false,
                preroll: None,
                buffer_auto: false,
            };
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
    fn the_checks_see_a_held_connection(&mut self) {
        let mut held = self.daemon.connect();
        assert!(matches!(held.call(Request::Hello), Response::Hello { .. }));
        let seen = self.settled();
        assert!(seen.is_err(), "a held connection must show: {seen:?}");
        drop(held);
        self.settled()
            .expect("back to the baseline once it is closed");
    }

    /// Runs one case and checks the daemon after it.
    fn check(&mut self, case: &[HostileConnection]) -> Result<(), String> {
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

/// Numbers a hostile client would try: the edges of every integer type, and anything.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(4096u64),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(i64::MAX as u64),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        1u64..(1 << 32),
        any::<u64>(),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1u32),
        Just(20u32),
        Just(10_000u32),
        Just(10_001u32),
        Just(u32::MAX),
        any::<u32>(),
    ]
}

/// A request of a kind the daemon knows, with hostile parameters, as JSON.
fn request(device: &str) -> impl Strategy<Value = Value> {
    let devices = prop_oneof![
        Just(device.to_owned()),
        Just(format!("/dev/{device}")),
        Just("7:0".to_owned()),
        Just("../../../etc/passwd".to_owned()),
        Just(String::new()),
        "[a-z0-9:/.]{0,40}",
    ];
    prop_oneof![
        1 => Just(json!({"kind": "hello"})),
        1 => Just(json!({"kind": "latency"})),
        1 => Just(json!({"kind": "events"})),
        1 => Just(json!({"kind": "list"})),
        1 => Just(json!({"kind": "status"})),
        // Windows the daemon honours are short here: a valid 60 s window is answered after
        // 60 s, which is no fault.
        1 => prop_oneof![Just(0u64), 1u64..200, Just(60_001), Just(u64::MAX)]
            .prop_map(|window_ms| json!({"kind": "stats", "window_ms": window_ms})),
        // Sane figures most of the time, so that attaches get past the checks to the streams
        // (a stream is what the other requests can then steer).
        3 => prop_oneof![
            3 => (1_000u64..4_000_000, 4_096u64..(8 << 20), 1u32..64, 0u8..8),
            1 => (hostile_u64(), hostile_u64(), hostile_u32(), any::<u8>()),
        ]
        .prop_flat_map(|parameters| (Just(parameters), any::<bool>()))
        .prop_map(|((rate, buffer, batch_pages, priority), persistent)| json!({
            "kind": "attach", "rate": rate, "buffer": buffer, "batch_pages": batch_pages,
            "priority": priority, "persistent": persistent,
        })),
        1 => prop_oneof![
            hostile_u64().prop_map(|id| json!({"id": id})),
            (hostile_u32(), hostile_u32(), hostile_u64()).prop_map(|(major, minor, inode)| {
                json!({"file": {"device": {"major": major, "minor": minor}, "inode": inode}})
            }),
        ]
        .prop_map(|target| json!({"kind": "detach", "target": target})),
        // Stream ids are small and counted up: most of these name a stream of this run.
        2 => (
            prop_oneof![0u64..2000, hostile_u64()],
            hostile_u64(),
            proptest::option::of(hostile_u64())
        )
            .prop_map(|(stream, offset, at_ns)| json!({
                "kind": "position", "stream": stream, "offset": offset, "at_ns": at_ns,
            })),
        1 => (
            devices,
            hostile_u64(),
            hostile_u64(),
            hostile_u64(),
            proptest::option::of(hostile_u32()),
            proptest::option::of(hostile_u32()),
            prop_oneof![
                Just(Value::Null),
                Just(json!("deterministic")),
                Just(json!("statistical")),
                Just(json!("off")),
                Just(json!("bogus")),
            ],
            any::<bool>(),
        )
            .prop_map(
                |(device, rate, rate_stdev, buffer, batch_pages, count, mode, write)| json!({
                    "kind": "admit", "device": device, "rate": rate, "rate_stdev": rate_stdev,
                    "buffer": buffer, "batch_pages": batch_pages, "count": count,
                    "mode": mode, "write": write,
                })
            ),
    ]
}

/// Any JSON, nested a little.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::String),
        prop_oneof![
            Just("kind"),
            Just("version"),
            Just("request"),
            Just("attach")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec(
                (
                    prop_oneof![
                        Just("kind".to_owned()),
                        Just("version".to_owned()),
                        Just("request".to_owned()),
                        "[a-z_]{0,10}",
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// Number literals that JSON allows and no field of the protocol fits, or that fit barely.
fn number_literal() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999999999999999999",
        "-1",
        "-9223372036854775809",
        "1e400",
        "-0",
        "0.5",
        "1E2",
        "4294967296",
        "255",
        "256",
        "00",
        "NaN",
        "Infinity",
    ])
}

/// A well-formed request with one numeric field replaced by a literal of [`number_literal`].
fn huge_numbers() -> impl Strategy<Value = Vec<u8>> {
    let templates = proptest::sample::select(vec![
        r#"{"version":N,"request":{"kind":"hello"}}"#,
        r#"{"version":4,"request":{"kind":"stats","window_ms":N}}"#,
        r#"{"version":4,"request":{"kind":"position","stream":1,"offset":N,"at_ns":N}}"#,
        r#"{"version":4,"request":{"kind":"position","stream":N,"offset":0}}"#,
        r#"{"version":4,"request":{"kind":"detach","target":{"id":N}}}"#,
        r#"{"version":4,"request":{"kind":"attach","rate":N,"buffer":65536,"batch_pages":1,"priority":0,"persistent":false}}"#,
        r#"{"version":4,"request":{"kind":"attach","rate":1000,"buffer":N,"batch_pages":N,"priority":N,"persistent":false}}"#,
        r#"{"version":4,"request":{"kind":"admit","device":"loop0","rate":N,"buffer":N,"count":N,"mode":null}}"#,
    ]);
    (templates, number_literal())
        .prop_map(|(template, number)| format!("{}\n", template.replace('N', number)).into_bytes())
}

/// Lines around [`MAX_LINE_BYTES`]: a long string in a valid request, or plain spaces (valid
/// JSON whitespace), with or without the newline.
fn oversized() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(MAX_LINE_BYTES - 1),
            Just(MAX_LINE_BYTES),
            Just(MAX_LINE_BYTES + 1),
            MAX_LINE_BYTES..MAX_LINE_BYTES + 20_000,
            Just(4 * MAX_LINE_BYTES),
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(length, inside_a_string, newline)| {
            // A long string in a valid request, or plain spaces (valid JSON whitespace).
            let mut line = if inside_a_string {
                let head = format!(
                    r#"{{"version":{PROTOCOL_VERSION},"request":{{"kind":"admit","device":""#
                );
                let mut line = head.into_bytes();
                line.resize(length.max(line.len()), b'a');
                line
            } else {
                vec![b' '; length]
            };
            if newline {
                line.push(b'\n');
            }
            line
        })
}

/// Arrays or objects nested up to 2000 deep.
fn nested() -> impl Strategy<Value = Vec<u8>> {
    (1usize..2000, any::<bool>()).prop_map(|(depth, objects)| {
        let (open, close) = if objects {
            (r#"{"a":"#, "}")
        } else {
            ("[", "]")
        };
        format!("{}{}\n", open.repeat(depth), close.repeat(depth)).into_bytes()
    })
}

/// One line, hostile in one of many ways.
fn line(device: &str) -> impl Strategy<Value = Vec<u8>> {
    let well_formed = request(device).prop_map(|request| {
        let mut line = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
        line.push('\n');
        line.into_bytes()
    });
    let other_version = (
        prop_oneof![
            Just(json!(0)),
            Just(json!(PROTOCOL_VERSION - 1)),
            Just(json!(PROTOCOL_VERSION + 1)),
            Just(json!(u32::MAX)),
            Just(json!(-1)),
            Just(json!(4.5)),
            Just(json!("4")),
            Just(Value::Null),
        ],
        request(device),
    )
        .prop_map(|(version, request)| {
            format!("{}\n", json!({"version": version, "request": request})).into_bytes()
        });
    let unknown_kind = prop_oneof![
        Just(json!("Hello")),
        Just(json!("HELLO")),
        Just(json!("")),
        Just(json!(7)),
        Just(Value::Null),
        "[a-z_]{1,16}".prop_map(Value::String),
    ]
    .prop_flat_map(|kind| {
        prop_oneof![
            Just(json!(PROTOCOL_VERSION)),
            Just(json!(PROTOCOL_VERSION + 1))
        ]
        .prop_map(move |version| {
            format!(
                "{}\n",
                json!({"version": version, "request": {"kind": kind}})
            )
            .into_bytes()
        })
    });
    let truncated = (
        request(device),
        any::<proptest::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(request, cut, newline)| {
            let full = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
            let mut line = full.as_bytes()[..cut.index(full.len())].to_vec();
            if newline {
                line.push(b'\n');
            }
            line
        });
    prop_oneof![
        8 => well_formed,
        1 => other_version,
        1 => unknown_kind,
        1 => json_value().prop_map(|value| format!("{value}\n").into_bytes()),
        1 => truncated,
        1 => oversized(),
        1 => vec(any::<u8>(), 0..300),
        1 => huge_numbers(),
        1 => nested(),
    ]
}

/// The descriptors sent with one message: mostly none or one, sometimes up to 12.
fn fd_set() -> impl Strategy<Value = Vec<&'static str>> {
    // A file on the managed disk as often as all others together: what an attach needs.
    let kind = prop_oneof![
        1 => proptest::sample::select(FD_KINDS.to_vec()),
        1 => Just("managed"),
    ];
    prop_oneof![
        3 => Just(Vec::new()),
        3 => vec(kind.clone(), 1..=1),
        2 => vec(kind, 2..=12),
    ]
}

/// One connection: hostile lines framed into messages at random, or a client's session of
/// well-formed requests with hostile figures.
fn connection(device: &str) -> impl Strategy<Value = HostileConnection> {
    prop_oneof![
        2 => framed_at_random(device),
        1 => client_session(device),
    ]
}

/// Lines cut into messages at random places, or one line per message, each message with a
/// descriptor set.
fn framed_at_random(device: &str) -> impl Strategy<Value = HostileConnection> {
    let lines = vec(line(device), 1..5);
    let cuts = vec((1usize..3000, fd_set()), 1..5);
    (lines, cuts, any::<bool>(), any::<bool>()).prop_map(|(lines, cuts, per_line, hang_up)| {
        let messages = if per_line {
            let sets = cuts
                .into_iter()
                .map(|(_, fds)| fds)
                .chain(std::iter::repeat(Vec::new()));
            lines
                .into_iter()
                .zip(sets)
                .filter(|(bytes, _)| !bytes.is_empty())
                .map(|(bytes, fds)| Message { bytes, fds })
                .collect()
        } else {
            split(&lines.concat(), cuts)
        };
        HostileConnection { messages, hang_up }
    })
}

/// Well-formed requests one per message, an attach with a file of the managed disk as a
/// client sends it: streams come to be, for the other requests to steer and end.
fn client_session(device: &str) -> impl Strategy<Value = HostileConnection> {
    (vec(request(device), 1..8), any::<bool>()).prop_map(|(requests, hang_up)| {
        let messages = requests
            .into_iter()
            .map(|request| {
                let fds = if request["kind"] == json!("attach") {
                    vec!["managed"]
                } else {
                    Vec::new()
                };
                let line = json!({"version": PROTOCOL_VERSION, "request": request});
                Message {
                    bytes: format!("{line}\n").into_bytes(),
                    fds,
                }
            })
            .collect();
        HostileConnection { messages, hang_up }
    })
}

/// `bytes` cut into messages of the cuts' sizes (the last takes the rest).
fn split(bytes: &[u8], cuts: Vec<(usize, Vec<&'static str>)>) -> Vec<Message> {
    let mut messages = Vec::new();
    let mut rest = bytes;
    let count = cuts.len();
    for (index, (size, fds)) in cuts.into_iter().enumerate() {
        if rest.is_empty() {
            break;
        }
        let take = if index + 1 == count {
            rest.len()
        } else {
            size.min(rest.len())
        };
        messages.push(Message {
            bytes: rest[..take].to_vec(),
            fds,
        });
        rest = &rest[take..];
    }
    messages
}

/// A case: a few connections at once.
fn case(device: &str) -> impl Strategy<Value = Vec<HostileConnection>> {
    vec(connection(device), 1..4)
}

// ---------------------------------------------------------------------------------------------
// The test.

/// The hand-written hostile lines, each replayed bare, with one descriptor of a file on the
/// managed disk (for their attach requests), and with 9 descriptors. `@DEVICE@` in a line
/// stands for the managed disk's name.
fn corpus_cases(device: &str) -> Vec<(String, Vec<HostileConnection>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "line"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.line in {}", dir.display());
    let mut cases = Vec::new();
    for path in files {
        let text = std::fs::read(&path).expect("read corpus line");
        let bytes = replace(&text, b"@DEVICE@", device.as_bytes());
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for fds in [Vec::new(), vec!["managed"], vec!["null"; 9]] {
            let label = format!("{name} with {} descriptors", fds.len());
            let message = Message {
                bytes: bytes.clone(),
                fds,
            };
            let connection = HostileConnection {
                messages: vec![message],
                hang_up: false,
            };
            cases.push((label, vec![connection]));
        }
    }
    cases
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(from) {
            out.extend_from_slice(to);
            rest = &rest[from.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

fn generated_cases() -> u32 {
    std::env::var("ABISS_FUZZ_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(500)
}

#[test]
fn hostile_requests_and_descriptors_never_crash_stall_or_leak() {
    require_root!();
    // proptest's strategy trees of this size, unoptimised, outgrow a test thread's 2 MiB
    // stack; an overflow aborts the process, which would leave the daemon and the disk behind.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(fuzz)
        .expect("spawn the fuzzer")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

fn fuzz() {
    let started = Instant::now();
    let harness = RefCell::new(Harness::new());
    harness.borrow_mut().the_checks_see_a_held_connection();
    let device = harness.borrow().targets.managed.device().name();

    for (label, case) in corpus_cases(&device) {
        if let Err(failure) = harness.borrow_mut().check(&case) {
            harness
                .borrow_mut()
                .totals
                .failures
                .push(format!("corpus {label}: {failure}"));
        }
    }
    let corpus = harness.borrow().totals.cases;

    let mut runner = TestRunner::new(Config {
        cases: generated_cases(),
        max_shrink_iters: 64,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let generated = runner.run(&case(&device), |case| {
        harness
            .borrow_mut()
            .check(&case)
            .map_err(TestCaseError::fail)
    });
    if let Err(failure) = generated {
        harness
            .borrow_mut()
            .totals
            .failures
            .push(format!("generated: {failure}"));
    }

    let mut harness = harness.into_inner();
    let end = final_state(&harness.daemon);
    let totals = &harness.totals;
    println!(
        "fuzz_protocol: {} cases ({corpus} corpus replays, {} generated incl. shrinking), {} connections, {} answers, {} streams attached, {} descriptors sent, {} persistent streams detached by root, {} crashes, {:.0} s",
        totals.cases,
        totals.cases - corpus,
        totals.connections,
        totals.answers,
        totals.attached,
        totals.fds_sent,
        totals.persistent_detached,
        totals.crashes,
        started.elapsed().as_secs_f64()
    );
    println!("fuzz_protocol: at the end {end}");
    assert_eq!(totals.crashes, 0, "abissd died: {:#?}", totals.failures);
    assert!(totals.failures.is_empty(), "{:#?}", totals.failures);
    assert!(harness.daemon.streams().is_empty(), "no stream is left");
    assert_eq!(
        harness.daemon.stop(),
        Some(0),
        "abissd stops cleanly after it all"
    );
}

/// No stream, nothing locked, no raised reader: asserted, and described for the report.
fn final_state(daemon: &Daemon) -> String {
    let mut root = daemon.connect();
    let Response::Devices(status) = root.call(Request::Status) else {
        panic!("status");
    };
    let streams = daemon.streams().len();
    assert_eq!(streams, 0, "streams left");
    assert_eq!(status.memory.locked_bytes, 0, "memory still locked");
    assert_eq!(status.raises.active, 0, "readers still raised");
    let fp = footprint(daemon.pid()).expect("footprint");
    format!(
        "{streams} streams, {} B locked (VmLck {} kB), {} raised readers, {} descriptors, {} threads",
        status.memory.locked_bytes, fp.locked_kib, status.raises.active, fp.fds, fp.threads
    )
}

/// Keeps [`Envelope`] in view: the generator writes its JSON by hand so that it can also
/// write what no `Envelope` can hold; this checks that the hand-written form is the real one.
#[test]
fn the_generators_well_formed_lines_decode_as_envelopes() {
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&request("loop0"), |request| {
            let line = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
            // Admit plans with an unknown mode are meant not to decode; every other generated
            // request must, or the fuzzer would stop at the decoder.
            let decoded = abiss_proto::decode_line::<Envelope>(line.as_bytes());
            let meant_to_fail = request["mode"] == json!("bogus");
            prop_assert!(decoded.is_ok() || meant_to_fail, "{line}: {decoded:?}");
            Ok(())
        })
        .expect("well-formed lines decode");
}
