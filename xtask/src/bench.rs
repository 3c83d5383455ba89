//! `cargo xtask bench`: measurements that are not tests. Each writes JSON and a Markdown table
//! under `bench/results/`, with the machine and the parameters.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::shell;

/// A loop device over a memory-backed image, so only its own requests are traced.
struct MemoryDisk {
    device: String,
    image: PathBuf,
}

impl MemoryDisk {
    fn new(size_mib: u64) -> anyhow::Result<Self> {
        let image = PathBuf::from(format!("/dev/shm/abiss-bench-{}.img", std::process::id()));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .context("cannot create the memory-backed image")?;
        let device = shell::output(
            Command::new("losetup")
                .args(["--find", "--show", "--direct-io=on"])
                .arg(&image),
        )?
        .trim()
        .to_owned();
        Ok(Self { device, image })
    }

    fn set_scheduler(&self, scheduler: &str) -> anyhow::Result<()> {
        let name = self.device.trim_start_matches("/dev/");
        std::fs::write(format!("/sys/block/{name}/queue/scheduler"), scheduler)
            .with_context(|| format!("cannot select {scheduler} on {name}"))
    }
}

impl Drop for MemoryDisk {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// abissd on a private socket, stopped on drop.
struct BenchDaemon {
    child: Child,
    socket: PathBuf,
}

impl BenchDaemon {
    fn start(root: &Path) -> anyhow::Result<Self> {
        let socket = PathBuf::from(format!("/tmp/abiss-bench-{}.sock", std::process::id()));
        let child = Command::new(root.join("target/debug/abissd"))
            .arg("--socket")
            .arg(&socket)
            .env("RUST_LOG", "warn")
            .spawn()
            .context("cannot start abissd")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if Instant::now() > deadline {
                bail!("abissd did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { child, socket })
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child; SIGTERM is abissd's clean shutdown.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}

fn fio(device: &str, secs: u64) -> Command {
    let mut command = Command::new("fio");
    command
        .args([
            "--name=randread",
            "--rw=randread",
            "--bs=4k",
            "--iodepth=32",
        ])
        .args([
            "--ioengine=io_uring",
            "--direct=1",
            "--time_based",
            "--output-format=json",
        ])
        .arg(format!("--filename={device}"))
        .arg(format!("--runtime={secs}"));
    command
}

fn fio_iops(output: &str) -> anyhow::Result<f64> {
    let report: Value = serde_json::from_str(output).context("fio printed no JSON")?;
    report["jobs"][0]["read"]["iops"]
        .as_f64()
        .context("no read IOPS in fio's JSON")
}

/// Machine, kernel and time of a run.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = shell::output(Command::new("uname").arg("-r")).unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let date =
        shell::output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])).unwrap_or_default();
    json!({ "cpu": cpu, "cores": cores, "kernel": kernel.trim(), "date": date.trim() })
}

/// Writes `name.json` and `name.md` under bench/results.
pub fn write_results(
    root: &Path,
    name: &str,
    report: &Value,
    markdown: &str,
) -> anyhow::Result<()> {
    let dir = root.join("bench").join("results");
    std::fs::create_dir_all(&dir).context("cannot create bench/results")?;
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    std::fs::write(dir.join(format!("{name}.md")), markdown)?;
    println!("{markdown}");
    println!("written: bench/results/{name}.json and bench/results/{name}.md");
    Ok(())
}

/// Per-event cost of the tracer under a 4 KiB random-read load, per elevator, and the load's
/// IOPS with and without tracing.
pub fn overhead(root: &Path, secs: u64) -> anyhow::Result<()> {
    if secs < 6 {
        bail!("--secs must be at least 6 (2 s warm-up and 2 s margin around the window)");
    }
    let disk = MemoryDisk::new(1024)?;
    let window = secs - 4;
    let mut rows = Vec::new();
    for scheduler in ["none", "mq-deadline", "bfq"] {
        disk.set_scheduler(scheduler)?;
        let baseline = fio_iops(&shell::output(&mut fio(&disk.device, secs))?)?;

        let daemon = BenchDaemon::start(root)?;
        let load = fio(&disk.device, secs)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start fio")?;
        std::thread::sleep(Duration::from_secs(2));
        let stats = shell::output(
            Command::new(root.join("target/debug/abissctl"))
                .arg("--socket")
                .arg(&daemon.socket)
                .args(["stats", "--json", "--interval", &window.to_string()]),
        )?;
        let output = load.wait_with_output().context("fio failed")?;
        drop(daemon);
        let traced = fio_iops(&String::from_utf8_lossy(&output.stdout))?;
        let stats: Value =
            serde_json::from_str(&stats).context("abissctl stats printed no JSON")?;
        let programs = stats["programs"].as_array().cloned().unwrap_or_default();
        let runs: u64 = programs
            .iter()
            .filter_map(|p| p["run_count"].as_u64())
            .sum();
        let time: u64 = programs
            .iter()
            .filter_map(|p| p["run_time_ns"].as_u64())
            .sum();
        #[expect(clippy::cast_precision_loss, reason = "a mean for the report")]
        let avg_ns = if runs == 0 {
            0.0
        } else {
            time as f64 / runs as f64
        };
        rows.push(json!({
            "scheduler": scheduler,
            "iops_untraced": baseline,
            "iops_traced": traced,
            "events": runs,
            "avg_ns_per_event": avg_ns,
            "programs": programs,
            "daemon_cpu_ns": stats["daemon_cpu_ns"],
            "daemon_rss_bytes": stats["daemon_rss_bytes"],
            "window_ns": stats["window_ns"],
        }));
    }
    drop(disk);

    let command = format!("cargo xtask bench overhead --secs {secs}");
    let mut markdown = format!(
        "### Tracer overhead: 4 KiB random reads, fio io_uring iodepth 32, loop device over memory\n\n\
         `{command}`; stats window {window} s.\n\n\
         | elevator | IOPS untraced | IOPS traced | eBPF events/s | avg ns per event | insert ns | issue ns | complete ns | abissd CPU % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for row in &rows {
        let program_ns = |name: &str| {
            row["programs"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == name))
                .and_then(|p| p["avg_ns"].as_f64())
                .unwrap_or(0.0)
        };
        #[expect(clippy::cast_precision_loss, reason = "rates for the report")]
        let (events_per_s, cpu_percent) = {
            let window_ns = row["window_ns"].as_u64().unwrap_or(1).max(1) as f64;
            (
                row["events"].as_u64().unwrap_or(0) as f64 / (window_ns / 1e9),
                row["daemon_cpu_ns"].as_u64().unwrap_or(0) as f64 / window_ns * 100.0,
            )
        };
        let _ = writeln!(
            markdown,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} |",
            row["scheduler"].as_str().unwrap_or(""),
            row["iops_untraced"].as_f64().unwrap_or(0.0),
            row["iops_traced"].as_f64().unwrap_or(0.0),
            events_per_s,
            row["avg_ns_per_event"].as_f64().unwrap_or(0.0),
            program_ns("abiss_insert"),
            program_ns("abiss_issue"),
            program_ns("abiss_complete"),
            cpu_percent,
        );
    }
    let report = json!({
        "benchmark": "overhead",
        "command": command,
        "machine": machine(),
        "parameters": { "secs": secs, "window_s": window, "block": "4k", "iodepth": 32, "engine": "io_uring" },
        "rows": rows,
    });
    write_results(root, "overhead", &report, &markdown)
}

/// Runs a benchmark of the `abiss-bench` crate (optimised: its readers time themselves).
pub fn run_bench_binary(root: &Path, which: &str, args: &[String]) -> anyhow::Result<()> {
    shell::cargo(
        root,
        &["build", "--release", "-p", "abiss-bench", "-p", "abiss-lab"],
    )?;
    let mut command = Command::new(root.join("target/release/abiss-bench"));
    command
        .current_dir(root)
        .arg(which)
        .args(args)
        .env("ABISS_LAB_BIN", root.join("target/release/abiss-lab"))
        .env("ABISS_BIN_DIR", root.join("target/debug"));
    shell::run(&mut command)
}
