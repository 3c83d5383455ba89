//! The tracer's own cost: eBPF run time per event under a 4 KiB random-read load (fio,
//! `io_uring`, iodepth 32) on a loop device over memory, per elevator, with the load's IOPS with
//! and without tracing. Needs root, fio and the debug abissd/abissctl (`ABISS_BIN_DIR`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::report;

/// `abiss-bench overhead`.
#[derive(Debug, clap::Args)]
pub struct OverheadArgs {
    /// Seconds of load per elevator (the stats window is 4 s shorter).
    #[arg(long, default_value_t = 12)]
    pub secs: u64,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

fn bin_dir() -> anyhow::Result<PathBuf> {
    std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("ABISS_BIN_DIR (where abissd and abissctl are) is not set; run through `cargo xtask bench overhead`")
}

/// Runs a command and returns its standard output.
fn output(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let out = command
        .output()
        .with_context(|| format!("cannot start {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A loop device over a memory-backed image, so only its own requests are traced.
struct MemoryDisk {
    device: String,
    image: PathBuf,
}

impl MemoryDisk {
    fn new(name: &str, size_mib: u64) -> anyhow::Result<Self> {
        let image = PathBuf::from(format!(
            "/dev/shm/abiss-bench-{name}-{}.img",
            std::process::id()
        ));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .context("cannot create the memory-backed image")?;
        let device = output(
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
    fn start(bin_dir: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let socket = PathBuf::from(format!("/tmp/abiss-bench-{}.sock", std::process::id()));
        let child = Command::new(bin_dir.join("abissd"))
            .arg("--socket")
            .arg(&socket)
            .args(extra)
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

/// A small ext4 on a second memory-backed loop device with one file, for abissd to manage and
/// attach: while a file is attached, the programs look up every request's file.
struct AttachedFileDisk {
    disk: MemoryDisk,
    mount: PathBuf,
    state: PathBuf,
}

impl AttachedFileDisk {
    fn new() -> anyhow::Result<Self> {
        let disk = MemoryDisk::new("attached", 64)?;
        output(Command::new("mkfs.ext4").args(["-q", &disk.device]))?;
        let mount = PathBuf::from(format!(
            "/tmp/abiss-bench-overhead-{}.mnt",
            std::process::id()
        ));
        std::fs::create_dir_all(&mount)?;
        output(Command::new("mount").arg(&disk.device).arg(&mount))?;
        std::fs::write(mount.join("stream.bin"), vec![7u8; 4 << 20])?;
        let state = PathBuf::from(format!(
            "/tmp/abiss-bench-overhead-{}.state",
            std::process::id()
        ));
        Ok(Self { disk, mount, state })
    }

    fn daemon_args(&self) -> Vec<String> {
        vec![
            "--device".into(),
            self.disk.device.clone(),
            "--state-dir".into(),
            self.state.to_string_lossy().into_owned(),
        ]
    }

    fn attach(&self, bin_dir: &Path, daemon: &BenchDaemon) -> anyhow::Result<()> {
        output(
            Command::new(bin_dir.join("abissctl"))
                .arg("--socket")
                .arg(&daemon.socket)
                .arg("attach")
                .arg(self.mount.join("stream.bin"))
                .args(["--rate", "100kB/s", "--buffer", "64KiB", "--batch", "4"]),
        )
        .map(drop)
    }
}

impl Drop for AttachedFileDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// Per-event cost of the tracer under a 4 KiB random-read load, per elevator, and the load's
/// IOPS with and without tracing; the last row has a stream attached (on another disk), so
/// every request's file is looked up.
pub fn run(args: &OverheadArgs) -> anyhow::Result<()> {
    let secs = args.secs;
    let bin_dir = bin_dir()?;
    if secs < 6 {
        bail!("--secs must be at least 6 (2 s warm-up and 2 s margin around the window)");
    }
    let bench = OverheadBench {
        disk: MemoryDisk::new("load", 1024)?,
        attached_disk: AttachedFileDisk::new()?,
        bin_dir,
        secs,
        window: secs - 4,
    };
    let window = bench.window;
    let mut rows = Vec::new();
    for (scheduler, attached) in [
        ("none", false),
        ("mq-deadline", false),
        ("bfq", false),
        ("mq-deadline", true),
    ] {
        rows.push(bench.row(scheduler, attached)?);
    }
    drop(bench);

    let command = format!("cargo xtask bench overhead --secs {secs}");
    let markdown = markdown(&command, window, &rows);
    let report = json!({
        "benchmark": "overhead",
        "command": command,
        "machine": report::machine(),
        "parameters": { "secs": secs, "window_s": window, "block": "4k", "iodepth": 32, "engine": "io_uring" },
        "rows": rows,
    });
    report::write_results(&args.results_dir, "overhead", &report, &markdown)
}

/// The disks and settings every row is measured with. The load disk is dropped (detached)
/// before the attached-file disk, as the fields are declared.
struct OverheadBench {
    disk: MemoryDisk,
    attached_disk: AttachedFileDisk,
    bin_dir: PathBuf,
    secs: u64,
    /// Seconds of the stats window, inside the load.
    window: u64,
}

impl OverheadBench {
    /// One row: the load untraced, then traced under a fresh abissd (with a file attached on
    /// the other disk if `attached`), with the programs' costs over the window.
    fn row(&self, scheduler: &str, attached: bool) -> anyhow::Result<Value> {
        self.disk.set_scheduler(scheduler)?;
        let baseline = fio_iops(&output(&mut fio(&self.disk.device, self.secs))?)?;

        let daemon = self.start_daemon(attached)?;
        let load = fio(&self.disk.device, self.secs)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start fio")?;
        std::thread::sleep(Duration::from_secs(2));
        let stats = output(
            Command::new(self.bin_dir.join("abissctl"))
                .arg("--socket")
                .arg(&daemon.socket)
                .args(["stats", "--json", "--interval", &self.window.to_string()]),
        )?;
        let output = load.wait_with_output().context("fio failed")?;
        drop(daemon);
        let traced = fio_iops(&String::from_utf8_lossy(&output.stdout))?;
        let stats: Value =
            serde_json::from_str(&stats).context("abissctl stats printed no JSON")?;
        let cost = ProgramCost::from_stats(&stats);
        Ok(json!({
            "scheduler": scheduler,
            "file_attached": attached,
            "iops_untraced": baseline,
            "iops_traced": traced,
            "events": cost.runs,
            "avg_ns_per_event": cost.avg_ns,
            "programs": cost.programs,
            "daemon_cpu_ns": stats["daemon_cpu_ns"],
            "daemon_rss_bytes": stats["daemon_rss_bytes"],
            "window_ns": stats["window_ns"],
        }))
    }

    /// abissd, managing and with a file attached on the other disk if `attached`.
    fn start_daemon(&self, attached: bool) -> anyhow::Result<BenchDaemon> {
        if attached {
            let args = self.attached_disk.daemon_args();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let daemon = BenchDaemon::start(&self.bin_dir, &args)?;
            self.attached_disk.attach(&self.bin_dir, &daemon)?;
            Ok(daemon)
        } else {
            BenchDaemon::start(&self.bin_dir, &[])
        }
    }
}

/// The eBPF programs' cost over a stats window, from `abissctl stats --json`.
struct ProgramCost {
    /// The per-program entries, as abissctl printed them.
    programs: Vec<Value>,
    /// Runs of all programs.
    runs: u64,
    /// Mean run time per run, in ns.
    avg_ns: f64,
}

impl ProgramCost {
    fn from_stats(stats: &Value) -> Self {
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
        Self {
            programs,
            runs,
            avg_ns,
        }
    }
}

/// The Markdown table of the rows.
fn markdown(command: &str, window: u64, rows: &[Value]) -> String {
    let mut markdown = format!(
        "### Tracer overhead: 4 KiB random reads, fio io_uring iodepth 32, loop device over memory\n\n\
         `{command}`; stats window {window} s. \"+ attached file\": a stream is attached on \
         another disk, so the programs look up the file of every request (these direct reads \
         carry user pages, which are told apart after two probe reads).\n\n\
         | elevator | IOPS untraced | IOPS traced | eBPF events/s | avg ns per event | insert ns | issue ns | complete ns | abissd CPU % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for row in rows {
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
        let attached = if row["file_attached"].as_bool().unwrap_or(false) {
            " + attached file"
        } else {
            ""
        };
        let _ = writeln!(
            markdown,
            "| {}{attached} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} |",
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
    markdown
}
