//! What the integration run printed, repeated where a CI log keeps it: the log of a run is
//! long (every test shows its figures), and a CI service that keeps the head and the tail of
//! it drops the middle, where libtest prints why a test failed. So at the run's end the
//! failure sections of the failing test binaries are printed again, with how long each
//! binary took (the suite has a time budget).

use std::fmt::Write as _;
use std::time::Duration;

/// Lines of one binary's failure section repeated at the end, at most: enough for the
/// assertion, its figures and the start of a backtrace.
const FAILURE_LINES: usize = 120;

/// Lines of one panic's message kept for the last lines of the run, and characters of each:
/// a CI service that keeps only the log's tail shows why every test failed, however long the
/// failure sections above it (a test's figures come first in its section).
const REASON_LINES: usize = 8;
const REASON_CHARS: usize = 400;

/// What one test binary printed and how it ended.
#[derive(Debug)]
pub struct BinaryLog {
    /// Its source (`tests/tests/streams.rs`).
    pub name: String,
    /// How long it ran.
    pub took: Duration,
    /// Whether it passed.
    pub passed: bool,
    /// Whether the lines are in a `failures:` section.
    in_failures: bool,
    /// Its failure section, if it printed one.
    pub failure: Vec<String>,
    /// Every line, when it ran beside another and prints only at its end.
    kept: Vec<String>,
    /// Each panic's `panicked at` line and its message, from anywhere in the section.
    reasons: Vec<String>,
    /// Lines of the current panic's message still to keep.
    reason_left: usize,
}

impl BinaryLog {
    /// The log of binary `name`, which has printed nothing yet.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            took: Duration::ZERO,
            passed: false,
            in_failures: false,
            failure: Vec::new(),
            kept: Vec::new(),
            reasons: Vec::new(),
            reason_left: 0,
        }
    }

    /// Takes one line the binary printed.
    pub fn line(&mut self, line: &str) {
        if line == "failures:" {
            // libtest prints the heading twice: before the outputs and before the names.
            self.in_failures = true;
        }
        if line.starts_with("test result:") {
            self.in_failures = false;
        }
        if self.in_failures && self.failure.len() < FAILURE_LINES {
            self.failure.push(line.to_owned());
        }
        if line.contains(" panicked at ") {
            self.reason_left = REASON_LINES;
        } else if line.starts_with("stack backtrace:") || line.starts_with("note: ") {
            self.reason_left = 0;
        }
        if self.reason_left > 0 {
            self.reason_left -= 1;
            let cut = line
                .char_indices()
                .nth(REASON_CHARS)
                .map_or(line.len(), |(at, _)| at);
            let ellipsis = if cut < line.len() { " …" } else { "" };
            self.reasons.push(format!("{}{ellipsis}", &line[..cut]));
        }
    }

    /// Keeps `line` to print later.
    pub fn keep(&mut self, line: &str) {
        self.kept.push(line.to_owned());
    }

    /// The lines kept to print later.
    pub fn kept(&self) -> &[String] {
        &self.kept
    }

    /// The binary ended after `took`.
    pub fn end(&mut self, took: Duration, passed: bool) {
        self.took = took;
        self.passed = passed;
        self.in_failures = false;
    }
}

/// How the binaries that ran beside each other went: in how many lanes, for how long, and how
/// busy the machine's CPUs were meanwhile (the noise each binary's figures carry).
#[derive(Debug)]
pub struct LaneRun {
    pub count: usize,
    pub took: Duration,
    /// The share of CPU time not idle, from `/proc/stat`; `None` where it cannot be read.
    pub cpu_busy: Option<f64>,
}

/// Every binary's log, in the order they ended.
#[derive(Debug, Default)]
pub struct TestLog {
    binaries: Vec<BinaryLog>,
}

impl TestLog {
    /// Adds an ended binary.
    pub fn push(&mut self, binary: BinaryLog) {
        self.binaries.push(binary);
    }

    /// The names of the binaries that failed.
    pub fn failing(&self) -> Vec<&str> {
        self.binaries
            .iter()
            .filter(|b| !b.passed)
            .map(|b| b.name.as_str())
            .collect()
    }

    /// The summary printed at the end: the time of each lane, the slowest binaries, then
    /// every failure section, and last why each test failed.
    pub fn summary(&self, beside: &LaneRun, alone: Duration) -> String {
        let mut slowest: Vec<&BinaryLog> = self.binaries.iter().collect();
        slowest.sort_by_key(|b| std::cmp::Reverse(b.took));
        let busy = beside
            .cpu_busy
            .map(|busy| format!(", the CPUs {:.0} % busy", busy * 100.0))
            .unwrap_or_default();
        let mut out = format!(
            "xtask: {} test binaries in {:.0} s ({:.0} s {} at a time{busy}, {:.0} s one at a time); the slowest:\n",
            self.binaries.len(),
            (beside.took + alone).as_secs_f64(),
            beside.took.as_secs_f64(),
            beside.count,
            alone.as_secs_f64()
        );
        for binary in slowest.iter().take(10) {
            let _ = writeln!(
                out,
                "  {:>6.1} s  {}",
                binary.took.as_secs_f64(),
                binary.name
            );
        }
        for binary in self.binaries.iter().filter(|b| !b.passed) {
            let _ = writeln!(out, "xtask: {} failed; what it printed:", binary.name);
            for line in &binary.failure {
                let _ = writeln!(out, "  | {line}");
            }
        }
        for binary in self.binaries.iter().filter(|b| !b.passed) {
            let _ = writeln!(out, "xtask: why {} failed:", binary.name);
            for line in &binary.reasons {
                let _ = writeln!(out, "  > {line}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_binarys_section_and_every_duration_are_kept() {
        let mut log = TestLog::default();
        let mut passing = BinaryLog::new("tests/tests/a.rs");
        for line in ["test one ... ok", "test result: ok. 1 passed"] {
            passing.line(line);
        }
        passing.end(Duration::from_secs(3), true);
        log.push(passing);
        let mut failing = BinaryLog::new("tests/tests/b.rs");
        for line in [
            "test two ... FAILED",
            "failures:",
            "",
            "---- two stdout ----",
            "a figure",
            "thread 'two' (7) panicked at tests/b.rs:3:5:",
            "assertion failed: the raise was kept",
            "stack backtrace:",
            "   0: a frame",
            "",
            "failures:",
            "    two",
            "",
            "test result: FAILED. 0 passed; 1 failed",
            "a line after the result",
        ] {
            failing.line(line);
        }
        failing.end(Duration::from_secs(17), false);
        log.push(failing);
        assert_eq!(log.failing(), ["tests/tests/b.rs"]);
        let lanes = LaneRun {
            count: 3,
            took: Duration::from_secs(5),
            cpu_busy: Some(0.42),
        };
        let summary = log.summary(&lanes, Duration::from_secs(15));
        assert!(summary.contains(
            "2 test binaries in 20 s (5 s 3 at a time, the CPUs 42 % busy, 15 s one at a time)"
        ));
        let first = summary.find("tests/tests/b.rs").expect("named");
        let second = summary.find("tests/tests/a.rs").expect("named");
        assert!(first < second, "the slowest first: {summary}");
        assert!(summary.contains("tests/tests/b.rs failed"));
        assert!(summary.contains("| assertion failed: the raise was kept"));
        assert!(!summary.contains("a line after the result"));
        let why = summary
            .find("why tests/tests/b.rs failed")
            .expect("the reasons");
        assert!(
            summary[why..].ends_with(
                "  > thread 'two' (7) panicked at tests/b.rs:3:5:\n  > assertion failed: the raise was kept\n"
            ),
            "{summary}"
        );
    }
}
