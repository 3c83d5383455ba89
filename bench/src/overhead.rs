//! The tracer's own cost: eBPF run time per I/O under a 4 KiB random-read load (fio,
//! `io_uring`, iodepth 32, `O_DIRECT`) on loop devices over memory, in each situation abissd
//! can be in, side by side with the load's IOPS:
//!
//! - `floor`: no abissd; an empty program on `block_rq_issue`, to show what the kernel's
//!   statistics charge a program that does nothing (the clock reads around each run);
//! - `a`: no abissd (the baseline IOPS);
//! - `b`: an idle abissd (nothing managed, attached or traced), the load on another disk;
//! - `b+`: the same, but abissd manages a disk (not the loaded one);
//! - `c`: the load on a file of a managed disk, a stream attached to another file of it;
//! - `d`: `abissctl trace` running, the load on a disk abissd does not manage.
//!
//! Needs root, fio, mkfs.ext4 and the built abissd/abissctl (`ABISS_BIN_DIR`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::empty_program::{self, EmptyProgram};
use crate::report::Row;
use crate::row::{self, RowsArg};

mod table;

/// A row: a situation of abissd and what the programs cost in it.
type OverheadRow = Row<Value, Value>;

/// `abiss-bench overhead`.
#[derive(Debug, clap::Args)]
pub struct OverheadArgs {
    /// Seconds of load per row (the stats window is 4 s shorter).
    #[arg(long, default_value_t = 12)]
    pub secs: u64,
    /// The situations to measure: `floor`, `a`, `b`, `b+`, `c`, `d` (see the module's doc;
    /// without `floor`, nothing is taken off as the statistics' own cost).
    #[command(flatten)]
    pub rows: RowsArg,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// The elevator of the loaded disk where abissd does not choose it (abissd gives the disks it
/// manages mq-deadline): with an elevator, all three block events fire per request.
const ELEVATOR: &str = "mq-deadline";

/// The goals: ns per I/O for row `b` and for row `c`.
const GOALS: [(&str, &str, f64); 2] = [("b", "goal for b", 100.0), ("c", "goal for c", 400.0)];

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

    fn name(&self) -> &str {
        self.device.trim_start_matches("/dev/")
    }

    fn set_scheduler(&self, scheduler: &str) -> anyhow::Result<()> {
        let name = self.name();
        abiss_os::sysfs::write_attr(
            std::path::Path::new(&format!("/sys/block/{name}/queue/scheduler")),
            scheduler,
        )
        .with_context(|| format!("cannot select {scheduler} on {name}"))
    }

    /// Reads completed on the disk so far (`/sys/block/NAME/stat`, first field), and when.
    fn reads_completed(&self) -> anyhow::Result<(u64, Instant)> {
        let name = self.name();
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat"))
            .with_context(|| format!("cannot read the statistics of {name}"))?;
        let reads = stat
            .split_whitespace()
            .next()
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("no read count in /sys/block/{name}/stat"))?;
        Ok((reads, Instant::now()))
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
    process: crate::daemon::DaemonProcess,
    dir: PathBuf,
}

impl BenchDaemon {
    fn start(bin_dir: &Path, extra: &[String]) -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!(
            "/dev/shm/abiss-bench-overhead-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).context("cannot create the daemon's directory")?;
        let process = crate::daemon::DaemonCommand::new(bin_dir, &dir)
            .args(extra)
            .start()?;
        Ok(Self { process, dir })
    }

    fn ctl(&self, bin_dir: &Path) -> Command {
        let mut command = Command::new(bin_dir.join("abissctl"));
        command.arg("--socket").arg(self.process.socket());
        command
    }
}

/// Stops a child with SIGTERM (abissd's clean shutdown; abissctl's end) and reaps it.
fn terminate(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let _ = child.wait();
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fio(target: &Path, secs: u64) -> Command {
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
        .arg(format!("--filename={}", target.display()))
        .arg(format!("--runtime={secs}"));
    command
}

fn fio_iops(output: &str) -> anyhow::Result<f64> {
    let report: Value = serde_json::from_str(output).context("fio printed no JSON")?;
    report["jobs"][0]["read"]["iops"]
        .as_f64()
        .context("no read IOPS in fio's JSON")
}

/// A small ext4 on a memory-backed loop device for abissd to manage, with a large file to
/// load and a small one to attach as a stream.
struct ManagedDisk {
    disk: MemoryDisk,
    mount: PathBuf,
    state: PathBuf,
}

impl ManagedDisk {
    fn new() -> anyhow::Result<Self> {
        let disk = MemoryDisk::new("managed", 1024)?;
        output(Command::new("mkfs.ext4").args(["-q", &disk.device]))?;
        let mount = PathBuf::from(format!(
            "/tmp/abiss-bench-overhead-{}.mnt",
            std::process::id()
        ));
        std::fs::create_dir_all(&mount)?;
        output(Command::new("mount").arg(&disk.device).arg(&mount))?;
        let state = PathBuf::from(format!(
            "/tmp/abiss-bench-overhead-{}.state",
            std::process::id()
        ));
        let managed = Self { disk, mount, state };
        std::fs::write(managed.mount.join("stream.bin"), vec![7u8; 4 << 20])?;
        // Written, not allocated: reads of unwritten extents never reach the disk.
        let chunk = vec![3u8; 8 << 20];
        let mut load = std::fs::File::create(managed.load_file())?;
        for _ in 0..96 {
            std::io::Write::write_all(&mut load, &chunk)?;
        }
        load.sync_all()?;
        Ok(managed)
    }

    fn load_file(&self) -> PathBuf {
        self.mount.join("load.bin")
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
            daemon
                .ctl(bin_dir)
                .arg("attach")
                .arg(self.mount.join("stream.bin"))
                .args(["--rate", "100kB/s", "--buffer", "64KiB", "--batch", "4"]),
        )
        .map(drop)
    }
}

impl Drop for ManagedDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = std::fs::remove_dir(&self.mount);
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Situation {
    Floor,
    NoDaemon,
    Idle,
    IdleManaging,
    ManagedStream,
    Traced,
}

impl Situation {
    const ALL: [Self; 6] = [
        Self::Floor,
        Self::NoDaemon,
        Self::Idle,
        Self::IdleManaging,
        Self::ManagedStream,
        Self::Traced,
    ];

    fn row(self) -> &'static str {
        match self {
            Self::Floor => "floor",
            Self::NoDaemon => "a",
            Self::Idle => "b",
            Self::IdleManaging => "b+",
            Self::ManagedStream => "c",
            Self::Traced => "d",
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Floor => "no abissd; an empty BPF program on block_rq_issue",
            Self::NoDaemon => "no abissd",
            Self::Idle => "idle abissd (manages nothing), load on another disk, no trace client",
            Self::IdleManaging => {
                "idle abissd managing a disk, load on another disk, no trace client"
            }
            Self::ManagedStream => {
                "load on a file of a managed disk, a stream attached to another file of it"
            }
            Self::Traced => "abissctl trace running, load on a disk abissd does not manage",
        }
    }
}

/// The eBPF run time over a stats window.
#[derive(Debug, Default)]
struct WindowCost {
    /// Per program, as `abissctl stats --json` prints them (or the empty program's).
    programs: Vec<Value>,
    /// Runs of all programs.
    runs: u64,
    /// Run time of all programs, in ns.
    run_time_ns: u64,
    /// The daemon's report, if a daemon ran.
    stats: Value,
}

impl WindowCost {
    fn from_stats(stats: Value) -> Self {
        let programs = stats["programs"].as_array().cloned().unwrap_or_default();
        let sum = |field: &str| -> u64 { programs.iter().filter_map(|p| p[field].as_u64()).sum() };
        Self {
            runs: sum("run_count"),
            run_time_ns: sum("run_time_ns"),
            programs,
            stats,
        }
    }
}

/// The disks every row is measured on, and the settings. The load disk is dropped (detached)
/// before the managed disk, as the fields are declared.
struct OverheadBench {
    disk: MemoryDisk,
    managed: ManagedDisk,
    bin_dir: PathBuf,
    secs: u64,
    /// Seconds of the stats window, inside the load.
    window: u64,
}

/// Per-event and per-I/O cost of the programs in each situation; see the module's doc.
pub fn run(args: &OverheadArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    let secs = args.secs;
    let bin_dir = bin_dir()?;
    if secs < 6 {
        bail!("--secs must be at least 6 (2 s warm-up and 2 s margin around the window)");
    }
    let bench = OverheadBench {
        disk: MemoryDisk::new("load", 1024)?,
        managed: ManagedDisk::new()?,
        bin_dir,
        secs,
        window: secs - 4,
    };
    bench.disk.set_scheduler(ELEVATOR)?;
    let baseline_disk = fio_iops(&output(&mut fio(Path::new(&bench.disk.device), secs))?)?;
    let baseline_file = fio_iops(&output(&mut fio(&bench.managed.load_file(), secs))?)?;
    let situations = args
        .rows
        .select(Situation::ALL.to_vec(), |s| s.row(), row::always)?;
    let mut rows = Vec::new();
    let mut floor_ns = 0.0;
    for situation in situations {
        let baseline = if situation == Situation::ManagedStream {
            baseline_file
        } else {
            baseline_disk
        };
        let row = bench.row(situation, baseline, floor_ns)?;
        if situation == Situation::Floor {
            floor_ns = row.figures["avg_ns_per_event"].as_f64().unwrap_or(0.0);
        }
        rows.push(row);
    }
    let window = bench.window;
    drop(bench);
    table::write(args, begun, window, floor_ns, rows)
}

impl OverheadBench {
    /// One row: a fresh abissd in `situation` (if it has one), the load, and the programs'
    /// costs over the window; `floor_ns` is the empty program's ns per run, once measured.
    fn row(
        &self,
        situation: Situation,
        baseline: f64,
        floor_ns: f64,
    ) -> anyhow::Result<OverheadRow> {
        let daemon = self.start_daemon(situation)?;
        let trace = match (&daemon, situation) {
            (Some(daemon), Situation::Traced) => Some(self.start_trace_client(daemon)?),
            _ => None,
        };
        let empty = (situation == Situation::Floor)
            .then(|| EmptyProgram::attach("block_rq_issue"))
            .transpose()?;
        let (target, counted) = if situation == Situation::ManagedStream {
            (self.managed.load_file(), &self.managed.disk)
        } else {
            (PathBuf::from(&self.disk.device), &self.disk)
        };
        let load = fio(&target, self.secs)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start fio")?;
        std::thread::sleep(Duration::from_secs(2));
        let before = counted.reads_completed()?;
        let cost = match (&daemon, &empty) {
            (Some(daemon), _) => self.daemon_window(daemon)?,
            (None, Some(empty)) => self.empty_window(empty)?,
            (None, None) => {
                std::thread::sleep(Duration::from_secs(self.window));
                WindowCost::default()
            }
        };
        let after = counted.reads_completed()?;
        // The floor row is the floor: nothing of it is left above itself.
        #[expect(clippy::cast_precision_loss, reason = "a mean for the report")]
        let floor_ns = if situation == Situation::Floor {
            cost.run_time_ns as f64 / cost.runs.max(1) as f64
        } else {
            floor_ns
        };
        let output = load.wait_with_output().context("fio failed")?;
        if let Some(mut trace) = trace {
            terminate(&mut trace);
        }
        drop((daemon, empty));
        let iops = fio_iops(&String::from_utf8_lossy(&output.stdout))?;
        #[expect(clippy::cast_precision_loss, reason = "rates for the report")]
        let reads = (after.0 - before.0) as f64 / after.1.duration_since(before.1).as_secs_f64()
            * Duration::from_secs(self.window).as_secs_f64();
        Ok(table::row(
            situation, baseline, iops, reads, floor_ns, &cost,
        ))
    }

    /// abissd as `situation` wants it: none, idle, managing the managed disk, with a stream.
    fn start_daemon(&self, situation: Situation) -> anyhow::Result<Option<BenchDaemon>> {
        let daemon = match situation {
            Situation::Floor | Situation::NoDaemon => return Ok(None),
            Situation::Idle => BenchDaemon::start(&self.bin_dir, &[])?,
            Situation::IdleManaging | Situation::ManagedStream | Situation::Traced => {
                BenchDaemon::start(&self.bin_dir, &self.managed.daemon_args())?
            }
        };
        if situation == Situation::ManagedStream {
            self.managed.attach(&self.bin_dir, &daemon)?;
        }
        Ok(Some(daemon))
    }

    /// `abissctl trace` as a user runs it, its output thrown away; running once it has
    /// asked for the first snapshot (which starts tracing every disk).
    fn start_trace_client(&self, daemon: &BenchDaemon) -> anyhow::Result<Child> {
        let child = daemon
            .ctl(&self.bin_dir)
            .args(["trace", "--interval", "1"])
            .stdout(Stdio::null())
            .spawn()
            .context("cannot start abissctl trace")?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(child)
    }

    /// The programs' costs over the window, from `abissctl stats --json`.
    fn daemon_window(&self, daemon: &BenchDaemon) -> anyhow::Result<WindowCost> {
        let stats = output(daemon.ctl(&self.bin_dir).args([
            "stats",
            "--json",
            "--interval",
            &self.window.to_string(),
        ]))?;
        let stats: Value =
            serde_json::from_str(&stats).context("abissctl stats printed no JSON")?;
        Ok(WindowCost::from_stats(stats))
    }

    /// The empty program's runs and run time over the window, with statistics on.
    fn empty_window(&self, empty: &EmptyProgram) -> anyhow::Result<WindowCost> {
        let stats_on = empty_program::enable_stats()?;
        let (runs0, time0) = empty.runs()?;
        std::thread::sleep(Duration::from_secs(self.window));
        let (runs1, time1) = empty.runs()?;
        drop(stats_on);
        let (runs, run_time_ns) = (runs1 - runs0, time1 - time0);
        #[expect(clippy::cast_precision_loss, reason = "a mean for the report")]
        let avg_ns = run_time_ns as f64 / runs.max(1) as f64;
        Ok(WindowCost {
            programs: vec![json!({
                "name": "empty (r0 = 0; exit)",
                "run_count": runs,
                "run_time_ns": run_time_ns,
                "avg_ns": avg_ns,
            })],
            runs,
            run_time_ns,
            stats: Value::Null,
        })
    }
}
