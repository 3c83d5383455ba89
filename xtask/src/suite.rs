//! The integration run: every integration-test binary of the workspace, built once, then run
//! in two lanes under the integration lock (`/tmp/abiss-integration.lock`).
//!
//! Most binaries assert what abiss controls on an emulated disk under load (misses, pages not
//! resident, requests at the wrong priority) or change what the whole machine shares (the dirty
//! limits, a systemd, programs counted by name), so each runs alone, holding the lock
//! exclusively. The binaries in [`BESIDE_OTHERS`] do neither: they check files, sentences,
//! exit codes and what a hostile user can do to their own daemon, with no emulated disk timed
//! and bounds of a second or more. They run first, two at a time (the machine's two CPUs),
//! each holding the lock shared. A developer's `flock /tmp/abiss-integration.lock cargo test
//! …` takes it exclusively, so it waits for either lane and neither lane runs beside it.
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
use crate::test_log::{BinaryLog, TestLog};

/// The lock every integration run takes: the suite's lanes here, a developer's run by hand.
pub const LOCK: &str = "/tmp/abiss-integration.lock";

/// Integration-test binaries (their source, from the workspace root) that may run beside
/// another of this list, longest first so that two lanes end together. Any other binary
/// runs alone. A binary belongs here only if it times no emulated disk, changes nothing the
/// machine shares, and bounds no answer tighter than a second.
///
/// `tests/tests/kernels.rs` is not here: its guests run under TCG on both CPUs, and a guest's
/// paced reader missed a deadline when the fuzzer ran beside it.
pub const BESIDE_OTHERS: &[&str] = &[
    // Hostile cases against its own daemon; root's status is bounded at 1 s.
    "tests/tests/fuzz_protocol.rs",
    // Its own systemd in its own namespaces, over /usr, /etc and /var overlaid.
    "tests/tests/deb_package.rs",
    "tests/tests/service.rs",
    "tests/tests/security_state_dir.rs",
    "tests/tests/security_privacy.rs",
    "tests/tests/managed_device_specs.rs",
    "tests/tests/doctor.rs",
    "tests/tests/bad_input.rs",
    "tests/tests/cli_habits.rs",
    "tests/tests/man_pages.rs",
    "lab/tests/bad_input.rs",
    "lab/tests/lifecycle.rs",
    "xtask/tests/architecture.rs",
    "xtask/tests/doc_index.rs",
];

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
    let beside = |binary: &TestBinary| BESIDE_OTHERS.contains(&binary.source.as_str());
    let mut queue: Vec<TestBinary> = binaries.iter().filter(|b| beside(b)).cloned().collect();
    queue.sort_by_key(|b| BESIDE_OTHERS.iter().position(|s| *s == b.source));
    let queue = Mutex::new(VecDeque::from(queue));
    let started = Instant::now();
    let log = Mutex::new(TestLog::default());
    let failed_to_run: Mutex<Vec<String>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..2 {
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
    let beside_took = started.elapsed();
    let mut log = log.into_inner().expect("not poisoned");
    let mut failed_to_run = failed_to_run.into_inner().expect("not poisoned");
    for binary in binaries.iter().filter(|b| !beside(b)) {
        match run_in_lane(binary, Lane::Alone, &bin_dir, filter) {
            Ok(done) => log.push(done),
            Err(error) => failed_to_run.push(format!("{}: {error:#}", binary.source)),
        }
    }
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "{}",
        log.summary(beside_took, started.elapsed().saturating_sub(beside_took))
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
    fn every_binary_that_runs_beside_others_exists() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask is one level down");
        for source in BESIDE_OTHERS {
            assert!(root.join(source).is_file(), "{source} is not a test file");
        }
    }
}
