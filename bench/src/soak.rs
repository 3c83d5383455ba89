//! The soak: many attach/detach cycles by four users at once (root and three unprivileged
//! users), with abissd killed (`kill -9`) and restarted every so many cycles; then what is
//! left is counted: the daemon's descriptors and threads, entries of its eBPF hash maps,
//! locked memory, raised threads, loop devices and mounts; and after each kill, whether the
//! disk's elevator and driver depth were put back.
//!
//! Each user runs one worker process (`abiss-bench soak-worker`, started through `setpriv` for
//! the unprivileged users) that loops: connect, attach its own file (non-persistent, level 0),
//! drop 64 KiB of the file from the page cache and read it (a miss: abissd raises the reader),
//! then end the stream, by `detach` on even cycles and by hanging up on odd ones. While abissd
//! is down a cycle fails and is tried again. The disk is a loop device over /dev/shm with ext4,
//! which makes cycles fast; the lab hdd would only slow them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, ByteRate, ByteSize, StreamTarget};
use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::daemon::{DaemonCommand, DaemonProcess};
use crate::report;

/// `abiss-bench soak`.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Attach/detach cycles in all, shared by the four users.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(4..=1_000_000))]
    pub cycles: u64,
    /// abissd is killed with SIGKILL and restarted after every this many cycles.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub kill_every: u64,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// `abiss-bench soak-worker` (started by `soak`, one per user).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// abissd's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The user's file on the managed disk.
    #[arg(long)]
    pub file: PathBuf,
    /// Cycles to make.
    #[arg(long)]
    pub cycles: u64,
}

/// The unprivileged users the soak runs as (made with `useradd` if missing).
const USERS: [&str; 3] = ["abiss-soak1", "abiss-soak2", "abiss-soak3"];
const FILE_BYTES: u64 = 16 << 20;
const MISS_BYTES: u64 = 64 << 10;
/// What a cycle's stream asks: small, so that four users' streams always fit.
const STREAM: AttachRequest = AttachRequest {
    rate: ByteRate(500_000),
    buffer: ByteSize(256 << 10),
    batch_pages: 8,
    priority: 0,
    persistent: false,
    write: false,
    preallocate: false,
    preroll: None,
    buffer_auto: false,
};

/// Runs the soak and writes soak.{json,md,svg}.
pub fn run(args: &SoakArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd is); run it through `cargo xtask bench`")?;
    let users = ensure_users()?;
    let disk = ShmDisk::up()?;
    let files = disk.user_files(&users)?;
    let baseline_file = disk.mount.join("baseline.data");
    write_file(&baseline_file, 0, 0)?;
    let before = System::now(&disk.name);
    let mut soak = Soak::new(&bin_dir, &disk)?;
    let figures = soak.cycle(args, &users, &files, &baseline_file)?;
    let end = soak.finish()?;
    let after = System::now(&disk.name);
    drop(disk);
    let after_teardown = System::now("");

    let command = report::command_line("soak");
    let machine = report::machine();
    let report = json!({
        "benchmark": "soak",
        "command": command,
        "machine": machine,
        "wall_s": begun.elapsed().as_secs_f64(),
        "parameters": {
            "cycles": args.cycles,
            "kill_every": args.kill_every,
            "users": std::iter::once("root").chain(USERS).collect::<Vec<_>>(),
            "users_created": users.created,
            "stream": {"rate_bps": STREAM.rate.0, "buffer_bytes": STREAM.buffer.0, "level": 0},
            "miss_read_bytes": MISS_BYTES,
            "disk": "loop device over /dev/shm, ext4, 256 MiB",
            "abissd": "debug build (ABISS_BIN_DIR=target/debug), default options",
        },
        "cycles": figures.to_json(),
        "kills": soak.kills,
        "end": end,
        "system_before": before.to_json(),
        "system_after": after.to_json(),
        "system_after_teardown": after_teardown.to_json(),
    });
    let markdown = markdown(&report);
    report::write_results(&args.results_dir, "soak", &report, &markdown)?;
    let chart = args.results_dir.join("soak.svg");
    chart_samples(&chart, &figures.samples, &soak.kills)?;
    println!("written: {}", chart.display());
    Ok(())
}

/// The users of the soak; `created` names those made for it.
struct Users {
    created: Vec<String>,
    ids: Vec<(String, u32, u32)>,
}

/// Makes the soak's users if they are missing (system users, no home, no shell).
fn ensure_users() -> anyhow::Result<Users> {
    let mut created = Vec::new();
    let mut ids = Vec::new();
    for user in USERS {
        if nix::unistd::User::from_name(user)?.is_none() {
            let status = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    user,
                ])
                .status()
                .context("cannot run useradd")?;
            if !status.success() {
                bail!("useradd {user} failed");
            }
            created.push(user.to_owned());
        }
        let entry = nix::unistd::User::from_name(user)?.context("the user just made")?;
        ids.push((user.to_owned(), entry.uid.as_raw(), entry.gid.as_raw()));
    }
    if created.is_empty() {
        println!("soak: users {} exist", USERS.join(", "));
    } else {
        println!(
            "soak: made the users {} (useradd --system)",
            created.join(", ")
        );
    }
    Ok(Users { created, ids })
}

/// A loop device over an image in /dev/shm with ext4 mounted; taken down on drop.
struct ShmDisk {
    dir: PathBuf,
    device: PathBuf,
    name: String,
    mount: PathBuf,
}

impl ShmDisk {
    fn up() -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("/dev/shm/abiss-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let image = dir.join("disk.img");
        std::fs::File::create(&image)?.set_len(256 << 20)?;
        let output = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&image)
            .output()
            .context("cannot run losetup")?;
        if !output.status.success() {
            bail!(
                "losetup: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let device = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        let name = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mount = dir.join("mnt");
        let disk = Self {
            dir,
            device,
            name,
            mount,
        };
        run_quiet(
            Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&disk.device),
        )?;
        std::fs::create_dir_all(&disk.mount)?;
        run_quiet(Command::new("mount").arg(&disk.device).arg(&disk.mount))?;
        for path in [&disk.dir, &disk.mount] {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        let _ = Command::new("udevadm").arg("settle").status();
        Ok(disk)
    }

    /// One file per user (root's first), owned by and readable only by that user.
    fn user_files(&self, users: &Users) -> anyhow::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        let owners = std::iter::once(("root".to_owned(), 0, 0)).chain(users.ids.iter().cloned());
        for (user, uid, gid) in owners {
            let path = self.mount.join(format!("{user}.data"));
            write_file(&path, uid, gid)?;
            files.push(path);
        }
        Ok(files)
    }
}

impl Drop for ShmDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A [`FILE_BYTES`] file at `path`, owned by and readable only by `uid`.
fn write_file(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut file = std::fs::File::create(path)?;
    for _ in 0..FILE_BYTES >> 20 {
        std::io::Write::write_all(&mut file, &block)?;
    }
    file.sync_all()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(())
}

fn run_quiet(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// What the machine holds, as the soak counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct System {
    loop_devices: usize,
    mounts: usize,
    debugfs_mounts: usize,
    mlocked_kib: u64,
    disk: Option<DiskSettings>,
}

/// A disk's queue settings abissd changes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
struct DiskSettings {
    elevator: String,
    nr_requests: String,
    driver_depth: Option<u32>,
}

impl DiskSettings {
    fn of(name: &str) -> Option<Self> {
        let queue = format!("/sys/block/{name}/queue");
        let line = std::fs::read_to_string(format!("{queue}/scheduler")).ok()?;
        let elevator = line
            .split_whitespace()
            .find_map(|s| s.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
            .unwrap_or("none")
            .to_owned();
        let nr_requests = std::fs::read_to_string(format!("{queue}/nr_requests"))
            .ok()?
            .trim()
            .to_owned();
        let driver_depth = abiss_os::blk_mq::driver_tag_depth(name).map(|(depth, _)| depth);
        Some(Self {
            elevator,
            nr_requests,
            driver_depth,
        })
    }
}

impl System {
    fn now(disk: &str) -> Self {
        let losetup = Command::new("losetup").arg("-a").output();
        let loop_devices =
            losetup.map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count());
        let mounts_text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        Self {
            loop_devices,
            mounts: mounts_text.lines().count(),
            debugfs_mounts: mounts_text
                .lines()
                .filter(|l| l.contains(" debugfs "))
                .count(),
            mlocked_kib: meminfo_kib("Mlocked:"),
            disk: (!disk.is_empty()).then(|| DiskSettings::of(disk)).flatten(),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "loop_devices": self.loop_devices,
            "mounts": self.mounts,
            "debugfs_mounts": self.debugfs_mounts,
            "mlocked_kib": self.mlocked_kib,
            "disk": self.disk,
        })
    }
}

fn meminfo_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Descriptors, threads (the kernel's io-wq workers, `iou-wrk-N`, and abissd's threads per user,
/// `abiss-close` and `abiss-lock-N`, left out: they start and end with the work) and locked
/// memory of process `pid`.
fn process_footprint(pid: u32) -> Value {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |tasks| {
        tasks
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| {
                    !["iou-wrk", "abiss-close", "abiss-lock-"]
                        .iter()
                        .any(|transient| c.starts_with(transient))
                })
            })
            .count()
    });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let locked_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    json!({"fds": fds, "threads": threads, "locked_kib": locked_kib, "fd_kinds": fd_kinds(pid)})
}

/// What process `pid`'s descriptors are, counted by kind (`socket`, `anon_inode:bpf-map`,
/// a path), so that a descriptor left over can be named.
fn fd_kinds(pid: u32) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let kind = target
            .split_once(":[")
            .map_or(target.as_str(), |(kind, _)| kind);
        *kinds.entry(kind.to_owned()).or_default() += 1;
    }
    kinds
}

/// Entries of the hash maps process `pid` holds, by map name; arrays are left out (their
/// entries always exist). The maps are found through the process's descriptors (`map_id` in
/// their fdinfo: this bpftool names no owning pids) and dumped with bpftool.
fn hash_map_entries(pid: u32) -> BTreeMap<String, u64> {
    let mut entries = BTreeMap::new();
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let is_map = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf-map");
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ));
        if let (true, Ok(info)) = (is_map, info) {
            ids.extend(
                info.lines()
                    .find_map(|l| l.strip_prefix("map_id:"))
                    .map(|v| v.trim().to_owned()),
            );
        }
    }
    for id in ids {
        let show = bpftool_json(&["map", "show", "id", &id]);
        let kind = show["type"].as_str().unwrap_or_default();
        if !kind.contains("hash") {
            continue;
        }
        let count = bpftool_json(&["map", "dump", "id", &id])
            .as_array()
            .map_or(0, |d| d.len() as u64);
        let name = show["name"].as_str().unwrap_or("?").to_owned();
        *entries.entry(name).or_default() += count;
    }
    entries
}

fn bpftool_json(args: &[&str]) -> Value {
    Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(Value::Null)
}

/// abissd under the soak: started, killed, restarted, on one socket and state directory.
struct Soak {
    bin_dir: PathBuf,
    device: PathBuf,
    disk: String,
    dir: PathBuf,
    daemon: Option<DaemonProcess>,
    original: Option<DiskSettings>,
    baseline: Value,
    kills: Vec<Value>,
    /// Set while abissd is killed and restarted (root's asking counts those answers apart).
    restarting: Arc<std::sync::atomic::AtomicBool>,
}

impl Soak {
    fn new(bin_dir: &Path, disk: &ShmDisk) -> anyhow::Result<Self> {
        let dir = disk.dir.join("daemon");
        std::fs::create_dir_all(&dir)?;
        let mut soak = Self {
            bin_dir: bin_dir.to_path_buf(),
            device: disk.device.clone(),
            disk: disk.name.clone(),
            dir,
            daemon: None,
            original: DiskSettings::of(&disk.name),
            baseline: Value::Null,
            kills: Vec::new(),
            restarting: Arc::default(),
        };
        soak.start(true)?;
        Ok(soak)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("abiss.sock")
    }

    fn pid(&self) -> u32 {
        self.daemon.as_ref().map_or(0, DaemonProcess::pid)
    }

    /// Starts abissd (managing the disk, or not: then it only recovers what a killed one
    /// left) and waits until it answers.
    fn start(&mut self, managing: bool) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut command = DaemonCommand::new(&self.bin_dir, &self.dir).log("error");
        if managing {
            command = command.args(["--device", &self.device.to_string_lossy()]);
        }
        self.daemon = Some(command.start()?);
        Ok(started.elapsed())
    }

    /// Ends the running abissd: `kill -9`, or SIGTERM.
    fn end(&mut self, kill: bool) -> Option<i32> {
        let mut daemon = self.daemon.take()?;
        if kill {
            daemon.kill()
        } else {
            daemon.stop()
        }
    }

    /// One stream at every level and back (a prefetch worker per level starts with the
    /// level's first stream); what the daemon then holds.
    fn warm_up(&mut self, file: &Path) -> anyhow::Result<Value> {
        let mut root = Client::connect(&self.socket())?;
        for level in 0..abiss_proto::ABISS_LEVELS {
            let stream = root.attach(
                &std::fs::File::open(file)?,
                AttachRequest {
                    priority: level,
                    ..STREAM
                },
            )?;
            root.detach(StreamTarget::Id(stream.id))?;
        }
        drop(root);
        std::thread::sleep(Duration::from_millis(500));
        Ok(json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        }))
    }

    /// `kill -9`, then an abissd without disks (it puts back what the killed one left), the
    /// disk's settings compared with the original, and the managing abissd again.
    fn kill_and_restart(&mut self, cycle: u64, baseline_file: &Path) -> anyhow::Result<()> {
        self.restarting.store(true, Ordering::Relaxed);
        let result = self.kill_and_restart_now(cycle, baseline_file);
        self.restarting.store(false, Ordering::Relaxed);
        result
    }

    fn kill_and_restart_now(&mut self, cycle: u64, baseline_file: &Path) -> anyhow::Result<()> {
        let before_kill = json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        });
        self.end(true);
        let after_kill = DiskSettings::of(&self.disk);
        let recovery = self.start(false)?;
        let recovered = DiskSettings::of(&self.disk);
        self.end(false);
        let restart = self.start(true)?;
        let retaken = DiskSettings::of(&self.disk);
        // With the users' cycles going on: for the record, not the baseline.
        let warmed_up = self.warm_up(baseline_file)?;
        self.kills.push(json!({
            "at_cycle": cycle,
            "daemon_before_kill": before_kill,
            "disk_after_kill": after_kill,
            "disk_after_recovery": recovered,
            "restored": recovered == self.original,
            "disk_after_restart": retaken,
            "recovery_start_s": recovery.as_secs_f64(),
            "restart_s": restart.as_secs_f64(),
            "after_restart_under_load": warmed_up,
        }));
        println!(
            "soak: kill -9 at cycle {cycle}: disk {} after recovery, restarted in {:.2} s",
            if recovered == self.original {
                "restored"
            } else {
                "NOT restored"
            },
            restart.as_secs_f64()
        );
        Ok(())
    }

    /// Runs the workers, killing and restarting abissd on the way.
    fn cycle(
        &mut self,
        args: &SoakArgs,
        users: &Users,
        files: &[PathBuf],
        baseline_file: &Path,
    ) -> anyhow::Result<Cycles> {
        // Every abissd of the soak is the same program with the same options: the first one,
        // quiet after its warm-up, is what the last one must come back to.
        self.baseline = self.warm_up(baseline_file)?;
        let done = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        let share = args.cycles / 4;
        for (index, file) in files.iter().enumerate() {
            let cycles = if index == 0 {
                args.cycles - 3 * share
            } else {
                share
            };
            let user = (index > 0).then(|| &users.ids[index - 1]);
            workers.push(Worker::start(&self.socket(), file, cycles, user, &done)?);
        }
        // Nobody's attacks and root's view of them last as long as the workers.
        let hostile =
            crate::soak_hostile::HostileUser::start(&self.bin_dir, &self.socket(), 86_400)?;
        let probe = crate::soak_hostile::StatusProbe::start(&self.socket(), &self.restarting);
        let started = Instant::now();
        let mut samples = Vec::new();
        let mut next_kill = args.kill_every;
        while workers.iter_mut().any(Worker::running) {
            crate::interrupt::check()?;
            let now = done.load(Ordering::Relaxed);
            if now >= next_kill && now < args.cycles {
                self.kill_and_restart(now, baseline_file)?;
                next_kill += args.kill_every;
            }
            samples.push((
                started.elapsed().as_secs_f64(),
                now,
                process_footprint(self.pid()),
            ));
            std::thread::sleep(Duration::from_millis(200));
        }
        let root_status = probe.finish();
        let mut hostile = hostile.finish();
        hostile["root_status"] = root_status;
        let reports = workers
            .into_iter()
            .map(Worker::finish)
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Cycles {
            wall_s: started.elapsed().as_secs_f64(),
            done: done.load(Ordering::Relaxed),
            reports,
            samples,
            hostile,
        })
    }

    /// After the workers: what the last abissd holds against its baseline, then its clean stop
    /// and the disk's settings after it.
    fn finish(&mut self) -> anyhow::Result<Value> {
        std::thread::sleep(Duration::from_secs(2));
        // Counted before root's own connection, which the daemon closes a moment after root.
        let now = json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        });
        let mut root = Client::connect(&self.socket())?;
        let streams = root.list()?.len();
        let (_, upgrades) = root.status_and_upgrades()?;
        drop(root);
        let exit = self.end(false);
        let disk = DiskSettings::of(&self.disk);
        Ok(json!({
            "baseline": self.baseline,
            "at_end": now,
            "streams_left": streams,
            "raised_threads": upgrades.active,
            "upgrades_total": upgrades.total,
            "upgrades_restored": upgrades.restored,
            "exit_code": exit,
            "note": "upgrades_* count the last abissd's raises only (since its start)",
            "disk_original": self.original,
            "disk_after_stop": disk,
            "disk_restored_at_stop": disk == self.original,
        }))
    }
}

impl Drop for Soak {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// The cycles' outcome.
struct Cycles {
    wall_s: f64,
    done: u64,
    reports: Vec<Value>,
    /// (seconds, cycles done, daemon footprint) every 200 ms.
    samples: Vec<(f64, u64, Value)>,
    /// The hostile user, and root's `status` latency meanwhile.
    hostile: Value,
}

impl Cycles {
    fn to_json(&self) -> Value {
        json!({
            "done": self.done,
            "wall_s": self.wall_s,
            "per_s": float(self.done) / self.wall_s.max(1e-9),
            "workers": self.reports,
            "hostile": self.hostile,
        })
    }
}

/// One user's worker process and the thread counting its cycles.
struct Worker {
    child: Child,
    reader: Option<std::thread::JoinHandle<Value>>,
}

impl Worker {
    fn start(
        socket: &Path,
        file: &Path,
        cycles: u64,
        user: Option<&(String, u32, u32)>,
        done: &Arc<AtomicU64>,
    ) -> anyhow::Result<Self> {
        let me = std::env::current_exe()?;
        let mut command = match user {
            None => Command::new(&me),
            Some((_, uid, gid)) => crate::process::as_user(&me, *uid, *gid),
        };
        let mut child = command
            .arg("soak-worker")
            .arg("--socket")
            .arg(socket)
            .arg("--file")
            .arg(file)
            .arg("--cycles")
            .arg(cycles.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a soak worker")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let done = Arc::clone(done);
        let name = user.map_or_else(|| "root".to_owned(), |(name, _, _)| name.clone());
        let reader = std::thread::spawn(move || {
            let mut last = Value::Null;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "." {
                    done.fetch_add(1, Ordering::Relaxed);
                } else if let Ok(mut value) = serde_json::from_str::<Value>(&line) {
                    value["user"] = json!(name);
                    last = value;
                }
            }
            last
        });
        Ok(Self {
            child,
            reader: Some(reader),
        })
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn finish(mut self) -> anyhow::Result<Value> {
        let status = self.child.wait()?;
        let report = self
            .reader
            .take()
            .map(|r| r.join().unwrap_or(Value::Null))
            .unwrap_or_default();
        if !status.success() {
            bail!("a soak worker failed ({status}): {report}");
        }
        Ok(report)
    }
}

/// `abiss-bench soak-worker`: the cycles of one user; prints `.` per cycle done, then a JSON
/// line with its counts and whether its thread was still raised at the end.
pub fn worker(args: &WorkerArgs) -> anyhow::Result<()> {
    let initial = crate::ioprio::current_thread_ioprio()?;
    let (mut done, mut refused, mut retried, mut raised_seen) = (0u64, 0u64, 0u64, 0u64);
    let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
    let mut buffer = vec![0u8; usize::try_from(MISS_BYTES)?];
    while done < args.cycles {
        match one_cycle(args, done, &mut buffer) {
            Ok(raised) => {
                done += 1;
                raised_seen += u64::from(raised);
                println!(".");
            }
            // A refused cycle is made again: the soak counts cycles that attached.
            Err(CycleError::Refused(message)) => {
                refused += 1;
                *refusals.entry(message).or_default() += 1;
                if refused > 1000 + args.cycles / 2 {
                    bail!("abissd refused {refused} attaches: {refusals:?}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(CycleError::Down) => {
                retried += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // The last stream has ended: the raise must be put back.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut end = crate::ioprio::current_thread_ioprio()?;
    while end != initial && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        end = crate::ioprio::current_thread_ioprio()?;
    }
    println!(
        "{}",
        json!({
            "cycles": done, "refused": refused, "refusals": refusals, "retried": retried,
            "raised_during_cycles": raised_seen, "ioprio_at_start": initial,
            "ioprio_at_end": end, "raised_at_end": end != initial,
        })
    );
    Ok(())
}

enum CycleError {
    /// abissd refused the attach (the message says why).
    Refused(String),
    /// abissd is not there (killed, restarting) or the connection broke.
    Down,
}

/// Attach, miss, end the stream; whether the thread was raised after the miss.
fn one_cycle(args: &WorkerArgs, cycle: u64, buffer: &mut [u8]) -> Result<bool, CycleError> {
    let mut client = Client::connect(&args.socket).map_err(|_| CycleError::Down)?;
    let file = std::fs::File::open(&args.file).map_err(|_| CycleError::Down)?;
    let stream = match client.attach(&file, STREAM) {
        Ok(stream) => stream,
        Err(
            abiss_client::ClientError::NotRunning { .. } | abiss_client::ClientError::Broken { .. },
        ) => return Err(CycleError::Down),
        // The sentence with its file and numbers left out, so that like refusals count
        // together.
        Err(error) => {
            let message = error
                .to_string()
                .replace(&*args.file.to_string_lossy(), "FILE");
            let mut kind = String::new();
            for c in message.chars() {
                if !c.is_ascii_digit() {
                    kind.push(c);
                } else if !kind.ends_with('N') {
                    kind.push('N');
                }
            }
            return Err(CycleError::Refused(kind));
        }
    };
    let offset = (cycle * 7919 % (FILE_BYTES / MISS_BYTES)) * MISS_BYTES;
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        i64::try_from(offset).unwrap_or(0),
        i64::try_from(MISS_BYTES).unwrap_or(0),
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    let _ = file.read_exact_at(buffer, offset);
    // The miss reaches abissd through the kernel's ring a moment after the read: the stream
    // is kept until the raise is seen, or for 30 ms.
    let deadline = Instant::now() + Duration::from_millis(30);
    let mut raised = false;
    while !raised && Instant::now() < deadline {
        raised = crate::ioprio::current_thread_ioprio().is_ok_and(|p| p >> 13 == 1);
        std::thread::sleep(Duration::from_millis(1));
    }
    if cycle.is_multiple_of(2) {
        client
            .detach(StreamTarget::Id(stream.id))
            .map_err(|_| CycleError::Down)?;
    }
    // Odd cycles hang up: a non-persistent stream ends with its connection.
    drop(client);
    Ok(raised)
}

/// A count as a float, for rates and chart coordinates (counts here stay far below 2^52).
#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
fn float(count: u64) -> f64 {
    count as f64
}

/// The Markdown report.
fn markdown(report: &Value) -> String {
    let end = &report["end"];
    let base = &end["baseline"];
    let at_end = &end["at_end"];
    let mut md = format!(
        "### Soak: {} attach/detach cycles by 4 users, abissd killed every {} cycles\n\n\
         `{}`: root and {} (unprivileged{}) each loop: attach their own file (500 kB/s, \
         256 KiB buffer, level 0), drop 64 KiB of it from the page cache and read it (a miss: \
         the reader is raised), end the stream (detach, or hang up). abissd (debug build) \
         manages a loop device over /dev/shm with ext4; it is killed with SIGKILL every {} \
         cycles, an abissd without disks then recovers what it left, and the managing abissd \
         starts again. {}\n\n",
        report["parameters"]["cycles"],
        report["parameters"]["kill_every"],
        report["command"].as_str().unwrap_or(""),
        USERS.join(", "),
        if report["parameters"]["users_created"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            ", made by the soak with useradd"
        } else {
            ""
        },
        report["parameters"]["kill_every"],
        report::machine_line(&report["machine"]),
    );
    let cycles = &report["cycles"];
    let _ = writeln!(
        md,
        "{} cycles in {:.0} s ({:.0} per second); per user:\n\n\
         | user | cycles | refused | retried while abissd was down | raised after the miss | raised at the end |\n\
         | --- | ---: | ---: | ---: | ---: | --- |",
        cycles["done"],
        cycles["wall_s"].as_f64().unwrap_or(0.0),
        cycles["per_s"].as_f64().unwrap_or(0.0),
    );
    for worker in cycles["workers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            worker["user"].as_str().unwrap_or("?"),
            worker["cycles"],
            worker["refused"],
            worker["retried"],
            worker["raised_during_cycles"],
            if worker["raised_at_end"].as_bool() == Some(false) {
                "no"
            } else {
                "YES"
            },
        );
    }
    md.push_str(&crate::soak_hostile::markdown(&cycles["hostile"]));
    md.push_str(&kills_table(report));
    md.push_str(&leftovers_table(report));
    let _ = writeln!(
        md,
        "Descriptors by kind, baseline → end: {}.\n",
        map_changes(&base["process"]["fd_kinds"], &at_end["process"]["fd_kinds"]),
    );
    let _ = writeln!(
        md,
        "Hash map entries by map, baseline → end: {} (`INFLIGHT` keeps a record per kernel \
         request structure seen, reused in place: bounded by the disk's tags, not by cycles).\n\nThe last abissd exited with {} on \
         SIGTERM; the disk's settings after it: {} (before the soak: {}). The last abissd \
         raised readers {} times and put {} back.",
        map_changes(&base["hash_map_entries"], &at_end["hash_map_entries"]),
        end["exit_code"],
        settings_text(&end["disk_after_stop"]),
        settings_text(&end["disk_original"]),
        end["upgrades_total"],
        end["upgrades_restored"],
    );
    md
}

/// What is left over: the last abissd against its baseline, the machine against before.
fn leftovers_table(report: &Value) -> String {
    let end = &report["end"];
    let base = &end["baseline"];
    let at_end = &end["at_end"];
    let fd = |v: &Value| v["process"]["fds"].as_u64().unwrap_or(0);
    let th = |v: &Value| v["process"]["threads"].as_u64().unwrap_or(0);
    let maps = |v: &Value| -> u64 {
        v["hash_map_entries"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };
    let before = &report["system_before"];
    let after = &report["system_after_teardown"];
    let mut md = String::new();
    let _ = write!(
        md,
        "\nAfterwards: the last abissd, its users gone, against the first one quiet after its \
         warm-up (one stream at each level and back; the same program and options); then the \
         machine against before the soak:\n\n\
         | what | baseline | at the end | left over |\n| --- | ---: | ---: | ---: |\n\
         | abissd descriptors | {} | {} | {} |\n\
         | abissd threads (io-wq workers aside) | {} | {} | {} |\n\
         | entries of abissd's eBPF hash maps | {} | {} | {} |\n\
         | abissd locked memory (VmLck, kB) | {} | {} | {} |\n\
         | streams | 0 | {} | {} |\n\
         | raised threads | 0 | {} | {} |\n\
         | Mlocked on the machine (kB, after the soak's disk is gone) | {} | {} | {} |\n\
         | loop devices | {} | {} | {} |\n\
         | mounts (debugfs among them: {} → {}) | {} | {} | {} |\n\n",
        fd(base),
        fd(at_end),
        fd(at_end).saturating_sub(fd(base)),
        th(base),
        th(at_end),
        th(at_end).saturating_sub(th(base)),
        maps(base),
        maps(at_end),
        maps(at_end).saturating_sub(maps(base)),
        base["process"]["locked_kib"],
        at_end["process"]["locked_kib"],
        at_end["process"]["locked_kib"],
        end["streams_left"],
        end["streams_left"],
        end["raised_threads"],
        end["raised_threads"],
        before["mlocked_kib"],
        after["mlocked_kib"],
        after["mlocked_kib"].as_i64().unwrap_or(0) - before["mlocked_kib"].as_i64().unwrap_or(0),
        before["loop_devices"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(1),
        after["loop_devices"],
        i128::from(after["loop_devices"].as_u64().unwrap_or(0))
            - i128::from(
                before["loop_devices"]
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_sub(1)
            ),
        before["debugfs_mounts"],
        after["debugfs_mounts"],
        before["mounts"].as_u64().unwrap_or(0).saturating_sub(1),
        after["mounts"],
        i128::from(after["mounts"].as_u64().unwrap_or(0))
            - i128::from(before["mounts"].as_u64().unwrap_or(0).saturating_sub(1)),
    );
    md
}

fn kills_table(report: &Value) -> String {
    let mut md = String::from(
        "\nAfter each kill -9:\n\n\
         | at cycle | abissd fds before the kill | disk after the kill | after recovery | restored | restart s |\n\
         | ---: | ---: | --- | --- | --- | ---: |\n",
    );
    for kill in report["kills"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} |",
            kill["at_cycle"],
            kill["daemon_before_kill"]["process"]["fds"],
            settings_text(&kill["disk_after_kill"]),
            settings_text(&kill["disk_after_recovery"]),
            if kill["restored"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            },
            kill["restart_s"].as_f64().unwrap_or(0.0),
        );
    }
    md
}

fn settings_text(settings: &Value) -> String {
    if settings.is_null() {
        return "?".to_owned();
    }
    format!(
        "{}, nr_requests {}, depth {}",
        settings["elevator"].as_str().unwrap_or("?"),
        settings["nr_requests"].as_str().unwrap_or("?"),
        settings["driver_depth"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), |d| d.to_string()),
    )
}

fn map_changes(before: &Value, after: &Value) -> String {
    let names: std::collections::BTreeSet<&String> = before
        .as_object()
        .into_iter()
        .chain(after.as_object())
        .flat_map(|m| m.keys())
        .collect();
    if names.is_empty() {
        return "none (bpftool names no map held by abissd's pid)".to_owned();
    }
    names
        .into_iter()
        .map(|name| {
            format!(
                "{name} {} → {}",
                before[name.as_str()],
                after[name.as_str()]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cycles done and abissd's descriptors over time, the kills marked.
fn chart_samples(
    path: &Path,
    samples: &[(f64, u64, Value)],
    kills: &[Value],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let last_t = samples.last().map_or(1.0, |s| s.0).max(1.0);
    let max_cycles = float(samples.last().map_or(1, |s| s.1).max(1));
    let max_fds = float(
        samples
            .iter()
            .filter_map(|s| s.2["fds"].as_u64())
            .max()
            .unwrap_or(1),
    );
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Soak: cycles done and abissd's descriptors; kill -9 marked",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0f64..last_t, 0f64..max_cycles * 1.05)?
        .set_secondary_coord(0f64..last_t, 0f64..max_fds * 1.2);
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("cycles done")
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("abissd descriptors")
        .draw()?;
    let blue = Palette99::pick(0).to_rgba();
    let red = Palette99::pick(1).to_rgba();
    chart
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.0, float(s.1))),
            blue.stroke_width(2),
        ))?
        .label("cycles done")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(
            samples
                .iter()
                .filter_map(|s| s.2["fds"].as_u64().map(|f| (s.0, float(f)))),
            red.stroke_width(1),
        ))?
        .label("abissd descriptors (0 while it is down)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
    let kill_times: Vec<f64> = kills
        .iter()
        .filter_map(|k| k["at_cycle"].as_u64())
        .filter_map(|cycle| samples.iter().find(|s| s.1 >= cycle).map(|s| s.0))
        .collect();
    chart
        .draw_series(kill_times.iter().map(|&t| {
            PathElement::new(
                vec![(t, 0.0), (t, max_cycles * 1.05)],
                BLACK.stroke_width(1),
            )
        }))?
        .label("kill -9")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    crate::chart::finish(&mut chart, &root)
}
