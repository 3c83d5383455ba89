//! Writing results: every benchmark's [`Results`] (its [`Row`]s, the machine, the kernel and
//! the exact command) as JSON, Markdown and an SVG chart under bench/results/, through one
//! writer.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use serde_json::{json, Value};

pub use crate::row::Row;

/// Machine, kernel and time of a run.
#[must_use]
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    // abissd reads the driver depth through a private debugfs mount when nobody mounted it;
    // a run records which way the machine was, so runs with and without can be told apart.
    let debugfs_mounted = abiss_os::blk_mq::debugfs_mounted().ok();
    // Which build of abissd the rows ran: `cargo xtask bench` runs the release build, as users
    // do; a debug build by hand is slower and must show.
    let abissd_build = std::env::var_os("ABISS_BIN_DIR").map(|dir| {
        std::path::Path::new(&dir)
            .file_name()
            .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
    });
    json!({
        "cpu": cpu,
        "cores": cores,
        "memory_gib": memory_kib >> 20,
        "kernel": kernel.trim(),
        "debugfs_mounted": debugfs_mounted,
        "elevators": abiss_lab::system::elevators_offered(),
        "date": date,
        "abissd_build": abissd_build,
    })
}

/// The command that ran this benchmark, as a user would type it.
#[must_use]
pub fn command_line(benchmark: &str) -> String {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let mut command = format!("cargo xtask bench {benchmark}");
    for arg in args {
        command.push(' ');
        command.push_str(&arg);
    }
    command
}

/// The parameters of a benchmark that steps through stream counts, with `more` (an object)
/// of its own.
#[must_use]
pub fn step_parameters(
    secs_per_step: u64,
    warmup_secs: u64,
    max_streams: usize,
    steps: &[usize],
    steps_after_miss: usize,
    more: Value,
) -> Value {
    let mut parameters = json!({
        "secs_per_step": secs_per_step,
        "warmup_secs": warmup_secs,
        "max_streams": max_streams,
        "steps": steps,
        "steps_after_miss": steps_after_miss,
    });
    if let (Some(parameters), Value::Object(more)) = (parameters.as_object_mut(), more) {
        parameters.extend(more);
    }
    parameters
}

/// A benchmark's results, as every benchmark writes them: its name, the command that ran it,
/// the machine, the wall time, the conditions all rows share (`parameters`), what it found
/// beyond its rows (`more`: baselines, headline figures, written beside the rows), and its
/// [`Row`]s.
#[derive(Debug, Serialize)]
pub struct Results<C, F> {
    /// The benchmark (`reference`, `sweep`, …).
    pub benchmark: &'static str,
    /// The command that ran it, as a user would type it.
    pub command: String,
    /// Machine, kernel and date ([`machine`]).
    pub machine: Value,
    /// Seconds the whole benchmark took.
    pub wall_s: f64,
    /// The conditions every row ran under: durations, disk, files, loads.
    pub parameters: Value,
    /// What the benchmark found beyond its rows.
    #[serde(flatten)]
    pub more: serde_json::Map<String, Value>,
    /// The rows, in the order they ran.
    pub rows: Vec<Row<C, F>>,
}

impl<C: Serialize, F: Serialize> Results<C, F> {
    /// The results of `benchmark`, begun at `begun`: the command line and the machine as they
    /// are now.
    #[must_use]
    pub fn new(
        benchmark: &'static str,
        begun: Instant,
        parameters: Value,
        rows: Vec<Row<C, F>>,
    ) -> Self {
        Self {
            benchmark,
            command: command_line(benchmark),
            machine: machine(),
            wall_s: begun.elapsed().as_secs_f64(),
            parameters,
            more: serde_json::Map::new(),
            rows,
        }
    }

    /// The same results with `value` written beside the rows as `key`.
    pub fn with(mut self, key: &str, value: impl Serialize) -> anyhow::Result<Self> {
        self.more
            .insert(key.to_owned(), serde_json::to_value(value)?);
        Ok(self)
    }

    /// Writes `name.json`, `name.md` (`markdown`, also printed) and `name.svg` (drawn by
    /// `chart`) under `dir`, and says so: the one writer of every benchmark.
    pub fn write(
        &self,
        dir: &Path,
        name: &str,
        markdown: &str,
        chart: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_string_pretty(self)? + "\n",
        )?;
        std::fs::write(dir.join(format!("{name}.md")), markdown)?;
        println!("{markdown}");
        println!("written: {0}/{name}.json and {0}/{name}.md", dir.display());
        let svg = dir.join(format!("{name}.svg"));
        chart(&svg).with_context(|| format!("cannot draw {name}.svg"))?;
        println!("written: {}", svg.display());
        Ok(())
    }
}

/// A latency in milliseconds with three significant digits (sub-millisecond page-cache hits
/// and second-long stalls both stay readable).
#[must_use]
pub fn ms(value: f64) -> String {
    if value < 1.0 {
        format!("{value:.3}")
    } else if value < 10.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// A probability in percent, readable from 1e-100 % to 100 %.
#[must_use]
pub fn probability_percent(p: f64) -> String {
    if p == 0.0 {
        "0".to_owned()
    } else if p < 1e-4 {
        format!("{:.1e}", p * 100.0)
    } else {
        format!("{:.2}", p * 100.0)
    }
}

/// A Markdown sentence describing the lab disk's queue, with `file_system` on it.
#[must_use]
pub fn disk_line(queue: &crate::lab_disk::QueueSettings, file_system: &str) -> String {
    let at_once = queue.dispatch_depth.map_or_else(
        || "the driver's depth unread (debugfs is not mounted)".to_owned(),
        |depth| format!("{depth} requests at once"),
    );
    format!(
        "Disk: lab hdd (5400 rpm laptop model), {at_once}, readahead {} KiB, {file_system}.",
        queue.read_ahead_kb
    )
}

/// A Markdown line describing the machine.
#[must_use]
pub fn machine_line(machine: &Value) -> String {
    let debugfs = match machine["debugfs_mounted"].as_bool() {
        Some(true) => ", debugfs mounted",
        Some(false) => ", debugfs not mounted",
        None => "",
    };
    // A kernel may lack an elevator (bfq is not always built): its rows are not in the report.
    let elevators = machine["elevators"]
        .as_array()
        .map(|names| {
            let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
            format!(", elevators {}", names.join(" / "))
        })
        .unwrap_or_default();
    let build = machine["abissd_build"]
        .as_str()
        .map(|build| format!(", abissd's {build} build"))
        .unwrap_or_default();
    format!(
        "Machine: {} ({} cores, {} GiB), Linux {}{debugfs}{elevators}{build}, {}.",
        machine["cpu"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["memory_gib"],
        machine["kernel"].as_str().unwrap_or("?"),
        machine["date"].as_str().unwrap_or("?"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_keep_three_significant_digits() {
        assert_eq!(ms(0.01234), "0.012");
        assert_eq!(ms(4.256), "4.26");
        assert_eq!(ms(42.56), "42.6");
        assert_eq!(ms(391.2), "391");
        assert_eq!(ms(1234.4), "1234");
    }

    #[test]
    fn results_have_the_run_then_their_findings_and_rows_and_steps_their_parameters() {
        let parameters = step_parameters(20, 3, 32, &[12, 14], 1, json!({ "p_req": 0.01 }));
        assert_eq!(parameters["steps"], json!([12, 14]));
        assert_eq!(parameters["p_req"], 0.01);
        assert_eq!(parameters["secs_per_step"], 20);
        let results = Results::new(
            "memory",
            Instant::now(),
            parameters,
            vec![Row::new(
                "abiss-20MiB",
                json!({"budget": 20}),
                json!({"misses": 0}),
            )],
        )
        .with("device_model", json!({"seek_ms": 12}))
        .unwrap();
        let document = serde_json::to_value(&results).unwrap();
        assert_eq!(document["benchmark"], "memory");
        assert!(document["command"]
            .as_str()
            .unwrap()
            .starts_with("cargo xtask bench memory"));
        assert!(document["wall_s"].as_f64().is_some());
        assert_eq!(document["parameters"]["max_streams"], 32);
        assert_eq!(document["device_model"]["seek_ms"], 12);
        assert_eq!(document["rows"][0]["name"], "abiss-20MiB");
        assert_eq!(document["rows"][0]["figures"]["misses"], 0);
    }
}
