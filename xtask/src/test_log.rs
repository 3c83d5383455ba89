//! What the integration run printed, repeated where a CI log keeps it: the log of a run is
//! long (every test shows its figures), and a CI service that keeps the head and the tail of
//! it drops the middle, where libtest prints why a test failed. So the run's standard output
//! is passed through as it comes, and at its end the failure sections of the failing test
//! binaries are printed again, with how long each binary took (the suite has a time budget).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// Lines of one binary's failure section repeated at the end, at most: enough for the
/// assertion, its figures and the start of a backtrace.
const FAILURE_LINES: usize = 120;

/// What the run said so far of the binary it runs and of failures.
#[derive(Debug, Default)]
pub struct TestLog {
    /// The binary running now (`tests/x.rs`), and since when.
    current: Option<(String, Instant)>,
    /// Every binary with how long it ran.
    pub durations: Vec<(String, Duration)>,
    /// Whether the lines are in a `failures:` section of the binary running now.
    in_failures: bool,
    /// Per failing binary, its failure section.
    pub failures: Vec<(String, Vec<String>)>,
}

impl TestLog {
    /// Takes one line of the run's output.
    pub fn line(&mut self, line: &str, now: Instant) {
        if let Some(binary) = line.trim_start().strip_prefix("Running ") {
            self.finish(now);
            let name = binary.split(" (").next().unwrap_or(binary).to_owned();
            self.current = Some((name, now));
            return;
        }
        if line == "failures:" {
            // libtest prints the heading twice: before the outputs and before the names.
            if !self.in_failures {
                let name = self
                    .current
                    .as_ref()
                    .map_or_else(String::new, |(n, _)| n.clone());
                self.failures.push((name, Vec::new()));
            }
            self.in_failures = true;
        }
        if line.starts_with("test result:") {
            self.in_failures = false;
        }
        if self.in_failures {
            if let Some((_, lines)) = self.failures.last_mut() {
                if lines.len() < FAILURE_LINES {
                    lines.push(line.to_owned());
                }
            }
        }
    }

    /// The run ended (or a new binary starts) at `now`.
    pub fn finish(&mut self, now: Instant) {
        if let Some((name, since)) = self.current.take() {
            self.durations.push((name, now - since));
        }
        self.in_failures = false;
    }

    /// The summary printed at the end: the slowest binaries, then every failure section.
    pub fn summary(&self) -> String {
        let mut slowest = self.durations.clone();
        slowest.sort_by_key(|(_, took)| std::cmp::Reverse(*took));
        let total: Duration = self.durations.iter().map(|(_, d)| *d).sum();
        let mut out = format!(
            "xtask: {} test binaries in {:.0} s; the slowest:\n",
            self.durations.len(),
            total.as_secs_f64()
        );
        for (name, took) in slowest.iter().take(10) {
            let _ = writeln!(out, "  {:>6.1} s  {name}", took.as_secs_f64());
        }
        for (name, lines) in &self.failures {
            let _ = writeln!(out, "xtask: {name} failed; what it printed:");
            for line in lines {
                let _ = writeln!(out, "  | {line}");
            }
        }
        out
    }
}

/// Runs `command` with its standard output and error on one pipe (cargo names the binary it
/// runs on its error, the binary's tests print on the output), passing them through line by
/// line, and prints the [`TestLog`] summary after it; a non-zero exit is an error naming the
/// command.
pub fn run_logged(command: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{command:?}");
    let (reader, writer) = std::io::pipe().context("a pipe for the tests' output")?;
    let mut child = command
        .stdout(writer.try_clone().context("a pipe for the tests' output")?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("cannot start {shown}"))?;
    // The parent's copies of the writing end went with `command`'s: drop it so the pipe ends
    // when the child does.
    command.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    let mut log = TestLog::default();
    let mut out = std::io::stdout().lock();
    for line in BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(out, "{line}");
        log.line(&line, Instant::now());
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {shown}"))?;
    log.finish(Instant::now());
    let _ = write!(out, "{}", log.summary());
    let _ = out.flush();
    if !status.success() {
        anyhow::bail!("{shown} failed with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_binarys_section_and_every_duration_are_kept() {
        let start = Instant::now();
        let mut log = TestLog::default();
        let lines = [
            "     Running tests/a.rs (target/debug/deps/a-1)",
            "test one ... ok",
            "test result: ok. 1 passed",
            "     Running tests/b.rs (target/debug/deps/b-2)",
            "test two ... FAILED",
            "failures:",
            "",
            "---- two stdout ----",
            "assertion failed: the raise was kept",
            "",
            "failures:",
            "    two",
            "",
            "test result: FAILED. 0 passed; 1 failed",
        ];
        for (i, line) in lines.iter().enumerate() {
            log.line(line, start + Duration::from_secs(i as u64));
        }
        log.finish(start + Duration::from_secs(20));
        let names: Vec<_> = log.durations.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["tests/a.rs", "tests/b.rs"]);
        assert_eq!(log.durations[1].1, Duration::from_secs(17));
        assert_eq!(log.failures.len(), 1);
        assert_eq!(log.failures[0].0, "tests/b.rs");
        assert!(log.failures[0]
            .1
            .iter()
            .any(|l| l.contains("the raise was kept")));
        assert!(log.summary().contains("tests/b.rs failed"));
    }
}
