//! Writing results: JSON and Markdown under bench/results/, with the machine, the kernel and
//! the exact command, as `cargo xtask bench overhead` does.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use serde_json::{json, Value};

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
    json!({
        "cpu": cpu,
        "cores": cores,
        "memory_gib": memory_kib >> 20,
        "kernel": kernel.trim(),
        "debugfs_mounted": debugfs_mounted,
        "elevators": abiss_lab::system::elevators_offered(),
        "date": date,
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

/// A benchmark's JSON document: its name, the command that ran it, the machine and the wall
/// time since `begun`, then the entries of `fields` (an object: parameters and results).
#[must_use]
pub fn document(
    benchmark: &str,
    command: &str,
    machine: &Value,
    begun: std::time::Instant,
    fields: Value,
) -> Value {
    let mut document = json!({
        "benchmark": benchmark,
        "command": command,
        "machine": machine,
        "wall_s": begun.elapsed().as_secs_f64(),
    });
    if let (Some(document), Value::Object(fields)) = (document.as_object_mut(), fields) {
        document.extend(fields);
    }
    document
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

/// Writes `name.json` and `name.md` under `dir` and prints the Markdown.
pub fn write_results(dir: &Path, name: &str, report: &Value, markdown: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    std::fs::write(dir.join(format!("{name}.md")), markdown)?;
    println!("{markdown}");
    println!("written: {0}/{name}.json and {0}/{name}.md", dir.display());
    Ok(())
}

/// Writes `name.json` and `name.md` as [`write_results`] does, then `name.svg` under `dir`
/// with `chart`, and says so.
pub fn write_results_and_chart(
    dir: &Path,
    name: &str,
    report: &Value,
    markdown: &str,
    chart: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    write_results(dir, name, report, markdown)?;
    let svg = dir.join(format!("{name}.svg"));
    chart(&svg).with_context(|| format!("cannot draw {name}.svg"))?;
    println!("written: {}", svg.display());
    Ok(())
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

/// A Markdown sentence describing the lab disk's queue.
#[must_use]
pub fn disk_line(queue: &crate::lab_disk::QueueSettings) -> String {
    format!(
        "Disk: lab hdd (5400 rpm laptop model), {} requests at once, readahead {} KiB, ext4.",
        queue
            .dispatch_depth
            .map_or_else(|| "?".to_owned(), |d| d.to_string()),
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
    format!(
        "Machine: {} ({} cores, {} GiB), Linux {}{debugfs}{elevators}, {}.",
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
    fn a_document_has_the_run_then_its_fields_and_steps_their_parameters() {
        let begun = std::time::Instant::now();
        let machine = json!({ "cores": 2 });
        let parameters = step_parameters(20, 3, 32, &[12, 14], 1, json!({ "p_req": 0.01 }));
        assert_eq!(parameters["steps"], json!([12, 14]));
        assert_eq!(parameters["p_req"], 0.01);
        assert_eq!(parameters["secs_per_step"], 20);
        let document = document(
            "memory",
            "cargo xtask bench memory",
            &machine,
            begun,
            json!({ "parameters": parameters, "budgets": [] }),
        );
        assert_eq!(document["benchmark"], "memory");
        assert_eq!(document["machine"]["cores"], 2);
        assert!(document["wall_s"].as_f64().is_some());
        assert_eq!(document["parameters"]["max_streams"], 32);
        assert_eq!(document["budgets"], json!([]));
    }
}
