//! The integration run: every integration-test binary of the workspace, built once, then run
//! under the integration lock (`/tmp/abiss-integration.lock`), several at a time and then a
//! few alone.
//!
//! Each binary brings up its own emulated disks, file systems and abissd, named by its process,
//! so binaries side by side do not meet: each asserts what abiss controls on its own disk
//! (misses, pages not resident, requests at the wrong priority), and its neighbours cost it
//! CPU time, which moves the figures it reports (the latency of a read of resident pages) and
//! not what it asserts. So binaries run [`LANES`] at a time, each holding the lock shared, the
//! long ones first ([`LONGEST_FIRST`]) so that the lanes end together; the summary says how
//! busy the CPUs were meanwhile. The binaries in [`ALONE`] change what the whole machine
//! shares, look at every disk, or rest on a timing a neighbour changes, and run afterwards one
//! at a time, holding the lock exclusively. A developer's `flock /tmp/abiss-integration.lock
//! cargo test …` takes it exclusively, so it waits for every lane and no lane runs beside it.
//!
//! A binary that runs beside another has its output kept and printed whole when it ends, so
//! the log never interleaves two binaries.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context as _;
use serde_json::Value;

use crate::shell;
use crate::test_log::{BinaryLog, LaneRun, TestLog};

/// The lock every integration run takes: the suite's lanes here, a developer's run by hand.
pub const LOCK: &str = "/tmp/abiss-integration.lock";

/// Integration-test binaries (their source, from the workspace root) that run alone, after the
/// lanes, each for a reason given beside it.
pub const ALONE: &[&str] = &[
    // Its guests run under TCG with two vCPUs each, two at a time: all the machine's CPUs.
    "tests/tests/kernels.rs",
    // Both set the machine's dirty limits to a small machine's (`DirtyLimits`): every
    // writer on the machine meets them, and two binaries setting and putting them back
    // would put back each other's.
    "tests/tests/recording_deadlines.rs",
    "tests/tests/recording_direct.rs",
    // Counts the request records of every disk but loop devices, whose pools it cannot
    // tell from another binary's lab disk.
    "tests/tests/teardown.rs",
    // Checks that no disk but its own saw real-time or idle-class reads, which any other
    // binary's paced reader makes on its own disk.
    "tests/tests/trace_counts.rs",
    // Checks that the lab's emulated disks answer like their models within 10 %; the
    // emulator's replies wait for a CPU like any thread, so neighbours count against the
    // model: random 4 KiB reads took 1.505 ms against 1.333 in the CI run of 2026-12-06 beside
    // two binaries (0.3 to 5.4 % over the model in nine runs on the lab VM).
    "lab/tests/validate.rs",
    // Asserts root's `status` within 100 ms while nobody's passed sockets linger in their
    // close; abissd's loop runs at an ordinary CPU priority, and the paced readers and lab
    // emulators of the binaries beside it run at real-time CPU priority on the machine's 2
    // CPUs: one answer took 185 ms in a fresh-clone run of 2026-12-07 (5 runs before passed).
    "tests/tests/security_closes.rs",
];

/// The binaries that take longest, longest first (from a suite run's summary on the lab VM,
/// 2026-12-06); the rest follow in the order cargo built them. Taking the long ones first lets
/// the short ones fill in, so that the lanes end within a short binary of each other.
pub const LONGEST_FIRST: &[&str] = &[
    "tests/tests/stream_guarantee.rs",
    "tests/tests/automatic_raises.rs",
    "tests/tests/fuzz_protocol.rs",
    "tests/tests/security_raises.rs",
    "tests/tests/recording_clients.rs",
    "tests/tests/security_raises_clone_io.rs",
    "tests/tests/players.rs",
    "tests/tests/deb_package.rs",
    "tests/tests/btrfs.rs",
    "tests/tests/security_start_up_reads.rs",
    "tests/tests/device_profile.rs",
    "tests/tests/admission_capacity.rs",
    "lab/tests/priority.rs",
    "tests/tests/security_state.rs",
    "tests/tests/recording.rs",
    "tests/tests/metrics.rs",
];

/// How many binaries run at once outside [`ALONE`]; `ABISS_SUITE_LANES` overrides it. Three
/// on the lab VM's two CPUs: the binaries mostly wait for their emulated disks (the CPUs were
/// 52 % busy with three lanes, 2026-12-06), and the pool took 336 s against 480 s with two.
pub const LANES: usize = 3;

fn lanes() -> usize {
    std::env::var("ABISS_SUITE_LANES")
        .ok()
        .and_then(|text| text.parse().ok())
        .filter(|&lanes| (1..=8).contains(&lanes))
        .unwrap_or(LANES)
}

/// The machine's CPU time so far from `/proc/stat`'s first line: (not idle, all), in ticks.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    let all: u64 = ticks.iter().take(8).sum();
    // idle and iowait: waiting for the emulated disks is not CPU work.
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((all.saturating_sub(idle), all))
}

/// One integration-test binary as cargo built it.
#[derive(Debug, Clone)]
struct TestBinary {
    /// Its source, from the workspace root (`tests/tests/streams.rs`).
    source: String,
    /// The executable.
    path: PathBuf,
    /// Its package's directory: cargo runs tests there, and so does the suite.
    package_dir: PathBuf,
}

/// Builds every integration-test binary and returns them, in the order cargo built them.
fn build(root: &Path) -> anyhow::Result<Vec<TestBinary>> {
    let mut command = shell::cargo_command(
        root,
        &[
            "test",
            "--workspace",
            "--tests",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ],
    );
    // The build's progress and diagnostics go to the terminal; the JSON is read here.
    command.stderr(Stdio::inherit());
    let json = shell::output(&mut command)?;
    let mut binaries = Vec::new();
    for line in json.lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let is_test_target = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|kind| kind == "test"));
        let (Some(executable), Some(src), Some(manifest)) = (
            message["executable"].as_str(),
            message["target"]["src_path"].as_str(),
            message["manifest_path"].as_str(),
        ) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || !is_test_target {
            continue;
        }
        let source = Path::new(src)
            .strip_prefix(root)
            .unwrap_or(Path::new(src))
            .to_string_lossy()
            .into_owned();
        binaries.push(TestBinary {
            source,
            path: PathBuf::from(executable),
            package_dir: Path::new(manifest)
                .parent()
                .context("a manifest in a directory")?
                .to_path_buf(),
        });
    }
    anyhow::ensure!(!binaries.is_empty(), "cargo built no integration tests");
    Ok(binaries)
}

/// How a binary holds the integration lock while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Beside,
    Alone,
}

/// Holds [`LOCK`] (shared beside others, exclusive alone) until dropped: closing the
/// descriptor releases it.
struct Held {
    _file: File,
}

impl Held {
    fn take(lane: Lane) -> anyhow::Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(LOCK)
            .with_context(|| format!("cannot open {LOCK}"))?;
        let operation = match lane {
            Lane::Beside => libc::LOCK_SH,
            Lane::Alone => libc::LOCK_EX,
        };
        // SAFETY: flock on a descriptor this function owns; no memory is passed.
        while unsafe { libc::flock(file.as_raw_fd(), operation) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::Interrupted {
                return Err(error).with_context(|| format!("cannot lock {LOCK}"));
            }
        }
        Ok(Self { _file: file })
    }
}

/// The command that runs `binary`'s tests one at a time, as `cargo test` would.
fn command(binary: &TestBinary, bin_dir: &Path, filter: Option<&str>) -> Command {
    let mut command = Command::new(&binary.path);
    command
        .current_dir(&binary.package_dir)
        .env("ABISS_BIN_DIR", bin_dir)
        // Timing tests print what they do not assert (p99.9, reads over 1 ms, residency):
        // the log shows those figures for passing runs too.
        .args(["--test-threads=1", "--show-output"]);
    if let Some(filter) = filter {
        command.arg(filter);
    }
    command
}

/// Runs `binary` with its standard output and error on one pipe, handing each line to
/// `line` as it comes; returns whether it passed.
fn run_one(
    binary: &TestBinary,
    bin_dir: &Path,
    filter: Option<&str>,
    mut line: impl FnMut(&str),
) -> anyhow::Result<bool> {
    let mut command = command(binary, bin_dir, filter);
    let (reader, writer) = std::io::pipe().context("a pipe for the tests' output")?;
    let mut child = command
        .stdout(writer.try_clone().context("a pipe for the tests' output")?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.path.display()))?;
    // The writing ends went with `command`: drop them so the pipe ends when the child does.
    command.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let mut reader = BufReader::new(reader);
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        // Tests may print bytes that are not UTF-8: take them lossily, never stop early.
        if reader.read_until(b'\n', &mut buffer).unwrap_or(0) == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buffer);
        line(text.trim_end_matches('\n'));
    }
    let _ = reader.read_to_end(&mut buffer);
    let status = child
        .wait()
        .with_context(|| format!("waiting for {}", binary.path.display()))?;
    Ok(status.success())
}

/// Runs `binary` in `lane` and returns what it printed and how it ended; lines go to the
/// terminal as they come when it runs alone.
fn run_in_lane(
    binary: &TestBinary,
    lane: Lane,
    bin_dir: &Path,
    filter: Option<&str>,
) -> anyhow::Result<BinaryLog> {
    let _held = Held::take(lane)?;
    let started = Instant::now();
    let mut log = BinaryLog::new(&binary.source);
    let header = format!("     Running {} ({})", binary.source, binary.path.display());
    if lane == Lane::Alone {
        println!("{header}");
    } else {
        log.keep(&header);
    }
    let passed = run_one(binary, bin_dir, filter, |line| {
        if lane == Lane::Alone {
            println!("{line}");
        } else {
            log.keep(line);
        }
        log.line(line);
    })?;
    log.end(started.elapsed(), passed);
    Ok(log)
}

/// Builds and runs every integration-test binary (the lanes above), then prints the
/// summary; any failing binary makes the run fail, after all have run. The lanes start once
/// `fetching` (the kernels test's packages, fetched while the tests build) has ended, so that
/// no test runs beside the download and the kernels test does not fetch the same files.
pub fn run(
    root: &Path,
    filter: Option<&str>,
    fetching: Option<std::thread::JoinHandle<()>>,
) -> anyhow::Result<()> {
    let binaries = build(root)?;
    if let Some(fetching) = fetching {
        let _ = fetching.join();
    }
    let bin_dir = root.join("target").join("debug");
    let alone = |binary: &TestBinary| ALONE.contains(&binary.source.as_str());
    let mut queue: Vec<TestBinary> = binaries.iter().filter(|b| !alone(b)).cloned().collect();
    // A stable sort: the listed ones in their order, then the rest as cargo built them.
    queue.sort_by_key(|b| {
        LONGEST_FIRST
            .iter()
            .position(|s| *s == b.source)
            .unwrap_or(LONGEST_FIRST.len())
    });
    let queue = Mutex::new(VecDeque::from(queue));
    let started = Instant::now();
    let ticks_before = cpu_ticks();
    let lanes = lanes();
    let log = Mutex::new(TestLog::default());
    let failed_to_run: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..lanes {
            scope.spawn(|| loop {
                let Some(binary) = queue.lock().expect("not poisoned").pop_front() else {
                    return;
                };
                match run_in_lane(&binary, Lane::Beside, &bin_dir, filter) {
                    Ok(done) => {
                        let mut out = std::io::stdout().lock();
                        for line in done.kept() {
                            let _ = writeln!(out, "{line}");
                        }
                        let _ = out.flush();
                        log.lock().expect("not poisoned").push(done);
                    }
                    Err(error) => failed_to_run
                        .lock()
                        .expect("not poisoned")
                        .push(format!("{}: {error:#}", binary.source)),
                }
            });
        }
    });
    let beside = LaneRun {
        count: lanes,
        took: started.elapsed(),
        cpu_busy: ticks_before.zip(cpu_ticks()).and_then(|(before, after)| {
            let all = after.1.checked_sub(before.1).filter(|&all| all > 0)?;
            #[expect(clippy::cast_precision_loss, reason = "a share, to the percent")]
            Some(after.0.saturating_sub(before.0) as f64 / all as f64)
        }),
    };
    let mut log = log.into_inner().expect("not poisoned");
    let mut failed_to_run = failed_to_run.into_inner().expect("not poisoned");
    for binary in binaries.iter().filter(|b| alone(b)) {
        match run_in_lane(binary, Lane::Alone, &bin_dir, filter) {
            Ok(done) => log.push(done),
            Err(error) => failed_to_run.push(format!("{}: {error:#}", binary.source)),
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "{}",
        log.summary(&beside, started.elapsed().saturating_sub(beside.took))
    );
    let _ = out.flush();
    for failure in &failed_to_run {
        eprintln!("xtask: could not run {failure}");
    }
    let failing = log.failing();
    anyhow::ensure!(
        failing.is_empty() && failed_to_run.is_empty(),
        "integration tests failed: {}",
        failing
            .into_iter()
            .chain(failed_to_run.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_binary_named_in_the_lists_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask is one level down");
        for source in LONGEST_FIRST {
            assert!(!ALONE.contains(source), "{source} is in both lists");
        }
        for source in ALONE.iter().chain(LONGEST_FIRST) {
            assert!(root.join(source).is_file(), "{source} is not a test file");
        }
    }
}
