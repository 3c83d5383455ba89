//! What timing a recorder's write(2) calls costs, measured: `dd` writing 64 KiB blocks to
//! /dev/null plainly, traced by `perf trace` as the rows trace their recorders, beside such a
//! perf, and under `strace -T` (the usual alternative: ptrace stops at every call's entry and
//! exit).

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;

use super::recorder::Tracer;
use super::writes;

/// Blocks each `dd` writes.
const WRITES: u32 = 20_000;
/// Runs per method; the fastest counts.
const RUNS: usize = 3;

/// One method's cost.
#[derive(Clone, Debug, Serialize)]
pub struct MethodCost {
    /// How the loop ran.
    pub method: &'static str,
    /// Wall time per write of the loop (a read and a write of 64 KiB), µs, fastest run.
    pub loop_us_per_write: f64,
    /// Added to each write against the plain loop, µs.
    pub added_us_per_write: f64,
    /// The median duration of a write as the tracer timed it, µs.
    pub timed_write_p50_us: Option<f64>,
}

/// Times `line` `RUNS` times; the fastest wall time per write, µs.
fn fastest_us_per_write(method: &str, line: &[String]) -> anyhow::Result<f64> {
    let mut fastest = f64::INFINITY;
    for _ in 0..RUNS {
        crate::interrupt::check()?;
        let begun = Instant::now();
        let status = Command::new(&line[0])
            .args(&line[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .with_context(|| format!("cannot run {}", line[0]))?;
        fastest = fastest.min(begun.elapsed().as_secs_f64());
        anyhow::ensure!(status.success(), "dd {method} failed ({status})");
    }
    Ok(fastest * 1e6 / f64::from(WRITES))
}

/// Measures the methods (their files in `scratch`): plain; in a cgroup traced by `perf trace
/// -a -G` as the rows do; plain while that perf runs (the syscall tracepoints are then on for
/// every task); under `strace -T`.
pub fn measure(scratch: &std::path::Path) -> anyhow::Result<Vec<MethodCost>> {
    let dd: Vec<String> = [
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=64k",
        &format!("count={WRITES}"),
        "status=none",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let plain = fastest_us_per_write("plain", &dd)?;
    let mut tracer = Tracer::start(
        &format!("abiss-bench-recording-cost-{}", std::process::id()),
        scratch,
    )?;
    crate::trial::sleep_interruptibly(std::time::Duration::from_secs(2))?;
    tracer.mark()?;
    let traced_line: Vec<String> = tracer.enter().into_iter().chain(dd.clone()).collect();
    let in_cgroup = fastest_us_per_write("traced", &traced_line)?;
    let beside = fastest_us_per_write("beside perf", &dd)?;
    let (trace, _, _) = tracer.finish(abiss_os::clock::monotonic_ns(), None)?;
    drop(tracer);
    let mut perf_timed: Vec<f64> = trace
        .writes
        .iter()
        .filter(|w| w.bytes == 64 << 10)
        .map(|w| w.duration_ms * 1000.0)
        .collect();
    perf_timed.sort_by(f64::total_cmp);
    let output = scratch.join("strace.out");
    let strace_line: Vec<String> = ["strace", "-f", "-T", "-e", "trace=write", "-o"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([output.display().to_string()])
        .chain(dd)
        .collect();
    let strace = fastest_us_per_write("strace", &strace_line)?;
    let strace_timed = std::fs::read_to_string(&output)
        .ok()
        .and_then(|text| strace_write_p50_us(&text));
    let _ = std::fs::remove_file(&output);
    let cost = |method, loop_us: f64, timed| MethodCost {
        method,
        loop_us_per_write: loop_us,
        added_us_per_write: loop_us - plain,
        timed_write_p50_us: timed,
    };
    Ok(vec![
        cost("plain", plain, None),
        cost(
            "perf trace -a -G (the rows' method), traced task",
            in_cgroup,
            (!perf_timed.is_empty()).then(|| writes::quantile(&perf_timed, 0.5)),
        ),
        cost("perf trace -a -G, a task outside the cgroup", beside, None),
        cost("strace -f -T -e trace=write", strace, strace_timed),
    ])
}

/// The median write duration in strace's output (`write(1, "..."..., 65536) = 65536
/// <0.000012>`), µs.
fn strace_write_p50_us(text: &str) -> Option<f64> {
    let mut durations: Vec<f64> = text
        .lines()
        .filter(|l| l.contains("= 65536 <"))
        .filter_map(|l| l.rsplit_once('<'))
        .filter_map(|(_, t)| t.trim_end_matches('>').parse::<f64>().ok())
        .map(|s| s * 1e6)
        .collect();
    if durations.is_empty() {
        return None;
    }
    durations.sort_by(f64::total_cmp);
    Some(writes::quantile(&durations, 0.5))
}
