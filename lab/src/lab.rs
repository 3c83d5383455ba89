//! Bringing a lab up and taking it down: state directory, emulator process, loop device,
//! queue settings, file system.
//!
//! Everything `up` makes is recorded in `state.json` in the state directory before it is made,
//! so `down` can remove it even after a crash; `down` also finds what it owns without the
//! state file (loop devices over the lab's image, mounts of them, emulator processes serving
//! the state directory).

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::emulator::{image_path, EmulatorConfig};
use crate::error::LabError;
use crate::model::ModelSpec;
use crate::stats::{read_summary, StatsCursor, StatsSummary};
use crate::system;

/// Where a lab keeps its state unless told otherwise (tmpfs: gone after a reboot, like the
/// loop devices and mounts it describes).
pub const DEFAULT_STATE_DIR: &str = "/run/abiss-lab";
/// Where the sparse backing file lives unless told otherwise (on disk: it can be large).
pub const DEFAULT_BACKING_DIR: &str = "/var/tmp/abiss-lab";
/// Where the benchmarks and tests keep a lab's backing file when memory has room for all of it
/// ([`memory_backing_dir`]).
pub const MEMORY_BACKING_DIR: &str = "/dev/shm/abiss-lab";

/// [`MEMORY_BACKING_DIR`] if the file system there can hold a whole backing file of
/// `size_bytes` now (it is sparse, so it takes what is written) and the machine has twice that
/// memory available (a tmpfs's room is not memory: its pages are never reclaimed without
/// swap), else `None`.
///
/// The emulator serves every request from its backing file. On a disk, a read of a block the
/// page cache let go of waits for that disk, and a write for its journal: the lab VM's
/// proactive reclaim (DAMON `pageout`) evicts idle page cache, and its root file system is
/// ext4 mounted with `discard`. A players test with the image on the root disk found the
/// emulator 531 ms late against its model (p99.9 of its replies) with almost no CPU steal,
/// where runs are usually 1 to 2 ms late. A tmpfs on a machine without swap keeps the image
/// in memory for good, and its writes wait for nothing.
#[must_use]
pub fn memory_backing_dir(size_bytes: u64) -> Option<PathBuf> {
    use procfs::Current as _;
    let dir = Path::new(MEMORY_BACKING_DIR);
    let parent = dir.parent()?;
    let stats = nix::sys::statvfs::statvfs(parent).ok()?;
    let free = stats
        .blocks_available()
        .saturating_mul(stats.fragment_size());
    let available = procfs::Meminfo::current().ok()?.mem_available?;
    (free >= size_bytes && available >= size_bytes.saturating_mul(2)).then(|| dir.to_path_buf())
}

/// The smallest disk a lab makes: room for a file system and for seeks to mean something.
pub const MIN_SIZE_BYTES: u64 = 64 << 20;
/// The block layer does not let a queue's depth go below this many requests.
pub const MIN_DISPATCH_DEPTH: u32 = 4;

const STATE_FILE: &str = "state.json";
const EMULATOR_CONFIG_FILE: &str = "emulator.json";
const EMULATOR_PID_FILE: &str = "emulator.pid";
const EMULATOR_FAILURE_FILE: &str = "emulator.failed";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A file system to make on the lab's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FilesystemKind {
    /// ext4, made whole (inode tables and journal written, not left to lazy initialisation)
    /// with the model off, without discard.
    Ext4,
    /// xfs, made with the model off, without discard.
    Xfs,
    /// btrfs (one device), made with the model off, without discard.
    Btrfs,
}

/// What to bring up.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// The device model.
    pub model: ModelSpec,
    /// Size of the emulated disk.
    pub size_bytes: u64,
    /// Make this file system on the device.
    pub mkfs: Option<FilesystemKind>,
    /// Mount the file system here (created if missing, and then removed by `down`).
    pub mount_dir: Option<PathBuf>,
    /// Mount options (`-o`), e.g. `compress=zstd` for btrfs.
    pub mount_options: Option<String>,
    /// I/O scheduler to select on the device after its depth is set (`none` if not given).
    pub scheduler: Option<String>,
    /// The lab's state directory.
    pub state_dir: PathBuf,
    /// Directory for the sparse backing file.
    pub backing_dir: PathBuf,
    /// The `abiss-lab` executable that runs the emulator (see [`emulator_exe`]).
    pub emulator_exe: PathBuf,
}

impl LabOptions {
    /// Options for `model` with the default size (4 GiB) and directories.
    pub fn new(model: ModelSpec) -> Result<Self, LabError> {
        Ok(Self {
            model,
            size_bytes: 4 << 30,
            mkfs: None,
            mount_dir: None,
            mount_options: None,
            scheduler: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            backing_dir: PathBuf::from(DEFAULT_BACKING_DIR),
            emulator_exe: emulator_exe()?,
        })
    }
}

/// Finds the `abiss-lab` executable: `$ABISS_LAB_BIN`, this executable if it is `abiss-lab`,
/// or an `abiss-lab` next to it or one directory up (where cargo puts binaries relative to
/// test executables in `target/*/deps`).
pub fn emulator_exe() -> Result<PathBuf, LabError> {
    if let Some(path) = std::env::var_os("ABISS_LAB_BIN") {
        return Ok(PathBuf::from(path));
    }
    let current = std::env::current_exe().map_err(|e| LabError::system("finding abiss-lab", e))?;
    if current.file_name().is_some_and(|n| n == "abiss-lab") {
        return Ok(current);
    }
    let dir = current.parent().unwrap_or(Path::new("/"));
    [dir.join("abiss-lab"), dir.join("../abiss-lab")]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            LabError::system(
                "finding abiss-lab",
                "not next to this executable; build it or set ABISS_LAB_BIN",
            )
        })
}

/// Everything a lab is made of, as recorded in its state directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabState {
    /// The device model.
    pub model: ModelSpec,
    /// Size of the emulated disk.
    pub size_bytes: u64,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Where the emulator's FUSE filesystem is mounted.
    pub fuse_mountpoint: PathBuf,
    /// The disk image inside the FUSE mount.
    pub image_path: PathBuf,
    /// The sparse file holding the data.
    pub backing_path: PathBuf,
    /// Per-request statistics (JSON lines).
    pub stats_path: PathBuf,
    /// Summary statistics (JSON, rewritten every second).
    pub summary_path: PathBuf,
    /// The emulator's log.
    pub log_path: PathBuf,
    /// The emulator process, once running.
    pub emulator: Option<ProcessId>,
    /// The loop device, once attached.
    pub loop_device: Option<PathBuf>,
    /// The driver tag depth read back from debugfs after setting it, if debugfs is mounted.
    pub dispatch_depth: Option<u32>,
    /// The measured round trip between the loop device and the emulator outside the model,
    /// which the emulator takes off each reply (see [`crate::emulator::TRANSPORT_NAME`]).
    #[serde(default)]
    pub transport_ns: u64,
    /// Where the file system is mounted, once mounted.
    pub mount_dir: Option<PathBuf>,
    /// Whether `up` created the mount directory (then `down` removes it).
    pub created_mount_dir: bool,
}

/// A process, identified robustly against pid reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    /// Process id.
    pub pid: i32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

impl LabState {
    fn save(&self) -> Result<(), LabError> {
        let path = self.state_dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| LabError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(&path, text).map_err(LabError::io(&path))
    }

    fn load(state_dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(state_dir.join(STATE_FILE)).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// A running lab.
#[derive(Debug)]
pub struct Lab {
    state: LabState,
}

impl Lab {
    /// Brings a lab up: emulator, loop device with direct I/O, queue depth and rotational flag
    /// from the model, optionally a file system and a mount. On failure everything made so far
    /// is removed again.
    pub fn up(options: &LabOptions) -> Result<Self, LabError> {
        check_size(options.size_bytes)?;
        let state_dir = &options.state_dir;
        if leftover_exists(state_dir) {
            return Err(LabError::Leftover {
                state_dir: state_dir.clone(),
            });
        }
        check_fuse()?;
        check_elevator(options.scheduler.as_deref())?;
        let mut state = LabState {
            model: options.model.clone(),
            size_bytes: options.size_bytes,
            state_dir: state_dir.clone(),
            fuse_mountpoint: state_dir.join("fuse"),
            image_path: image_path(&state_dir.join("fuse")),
            backing_path: options.backing_dir.join(format!(
                "{}.img",
                state_dir.file_name().unwrap_or_default().to_string_lossy()
            )),
            stats_path: state_dir.join("stats.jsonl"),
            summary_path: state_dir.join("summary.json"),
            log_path: state_dir.join("emulator.log"),
            emulator: None,
            loop_device: None,
            dispatch_depth: None,
            transport_ns: 0,
            mount_dir: None,
            created_mount_dir: false,
        };
        std::fs::create_dir_all(&state.fuse_mountpoint)
            .map_err(LabError::io(&state.fuse_mountpoint))?;
        state.save()?;
        match bring_up(&mut state, options) {
            Ok(()) => Ok(Self { state }),
            Err(error) => {
                let _ = Self::down(state_dir);
                Err(error)
            }
        }
    }

    /// The lab recorded in `state_dir`.
    pub fn open(state_dir: &Path) -> Result<Self, LabError> {
        let state = LabState::load(state_dir).ok_or_else(|| LabError::NotUp {
            state_dir: state_dir.to_owned(),
        })?;
        Ok(Self { state })
    }

    /// Takes down the lab in `state_dir`, whether healthy, half made or crashed: unmounts the
    /// file system, detaches the loop device, unmounts FUSE, stops the emulator and removes
    /// the files. Returns what it removed.
    pub fn down(state_dir: &Path) -> Result<Vec<String>, LabError> {
        take_down(state_dir)
    }

    /// Everything the lab is made of.
    #[must_use]
    pub fn state(&self) -> &LabState {
        &self.state
    }

    /// The emulated block device, e.g. `/dev/loop0`.
    #[must_use]
    pub fn device(&self) -> &Path {
        self.state
            .loop_device
            .as_deref()
            .unwrap_or(Path::new("/dev/null"))
    }

    /// Where the file system is mounted, if one was made.
    #[must_use]
    pub fn mount_dir(&self) -> Option<&Path> {
        self.state.mount_dir.as_deref()
    }

    /// Measures the transport delay again and tells the emulator. In a VM the delay drifts by
    /// tens of microseconds within seconds (seen: 55 µs, then 130 µs a few seconds later), so a
    /// measurement of the device starts from a fresh figure.
    pub fn recalibrate_transport(&mut self) -> Result<u64, LabError> {
        let device = self.device().to_owned();
        self.state.transport_ns = calibrate_transport(&self.state, &device)?;
        self.state.save()?;
        Ok(self.state.transport_ns)
    }

    /// Switches the device model off (`true`) or back on (`false`): while it is off, requests
    /// are served as fast as the backing file allows and are not recorded in the statistics.
    ///
    /// This is for putting an experiment's starting data on the disk (see
    /// [`crate::emulator::UNMODELLED_NAME`]), never for measuring. Whoever switches the model
    /// off keeps other users off the disk meanwhile, and syncs what it wrote (the file system
    /// too) before switching it back on, so that none of its writes reaches the model later.
    pub fn set_unmodelled(&self, unmodelled: bool) -> Result<(), LabError> {
        set_unmodelled(&self.state.fuse_mountpoint, unmodelled)
    }

    /// Whether the device model is off (see [`Lab::set_unmodelled`]).
    pub fn unmodelled(&self) -> Result<bool, LabError> {
        let control = unmodelled_control(&self.state.fuse_mountpoint);
        let text = std::fs::read_to_string(&control).map_err(LabError::io(&control))?;
        Ok(text.trim() == "1")
    }

    /// A cursor that returns the requests served from now on.
    pub fn stats_cursor(&self) -> Result<StatsCursor, LabError> {
        StatsCursor::at_end(&self.state.stats_path)
    }

    /// The emulator's running totals (updated every second).
    pub fn summary(&self) -> Result<StatsSummary, LabError> {
        read_summary(&self.state.summary_path)
    }
}

fn check_size(size_bytes: u64) -> Result<(), LabError> {
    if size_bytes < MIN_SIZE_BYTES {
        return Err(LabError::Size {
            size_bytes,
            reason: format!("the minimum is {} MiB", MIN_SIZE_BYTES >> 20),
        });
    }
    if !size_bytes.is_multiple_of(4096) {
        return Err(LabError::Size {
            size_bytes,
            reason: "it must be a multiple of 4096 bytes".into(),
        });
    }
    Ok(())
}

/// Refuses a scheduler the kernel does not offer before anything is set up (where no device
/// lists the schedulers, selecting it says what is wrong).
fn check_elevator(scheduler: Option<&str>) -> Result<(), LabError> {
    let Some(name) = scheduler else {
        return Ok(());
    };
    if system::elevator_available(name) {
        Ok(())
    } else {
        Err(LabError::NoElevator {
            name: name.to_owned(),
            offered: system::elevators_offered(),
        })
    }
}

fn check_fuse() -> Result<(), LabError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map(drop)
        .map_err(|e| LabError::FuseUnavailable {
            reason: format!("cannot open /dev/fuse ({e})"),
        })
}

/// Whether anything of a lab in `state_dir` is still there.
fn leftover_exists(state_dir: &Path) -> bool {
    let fuse = state_dir.join("fuse");
    state_dir.join(STATE_FILE).exists()
        || system::is_mounted(&fuse)
        || system::loop_devices()
            .iter()
            .any(|(_, backing)| backing.starts_with(&fuse))
        || !emulator_processes(state_dir).is_empty()
}

fn emulator_processes(state_dir: &Path) -> Vec<(i32, u64)> {
    let dir = state_dir.to_string_lossy();
    system::find_processes(&["serve", "--state-dir", &dir])
}

fn bring_up(state: &mut LabState, options: &LabOptions) -> Result<(), LabError> {
    std::fs::create_dir_all(&options.backing_dir).map_err(LabError::io(&options.backing_dir))?;
    let backing = File::create(&state.backing_path).map_err(LabError::io(&state.backing_path))?;
    backing
        .set_len(state.size_bytes)
        .map_err(LabError::io(&state.backing_path))?;
    drop(backing);

    state.emulator = Some(start_emulator(state, &options.emulator_exe)?);
    state.save()?;

    let image = state.image_path.to_string_lossy().into_owned();
    let device = system::run("losetup", &["--find", "--show", "--direct-io=on", &image])?;
    state.loop_device = Some(PathBuf::from(&device));
    state.save()?;
    let sysfs = system::sysfs_block(Path::new(&device));
    if system::read_attr(&sysfs.join("loop/dio"))? != "1" {
        return Err(LabError::system(
            format!("losetup --direct-io=on {image}"),
            "the loop device did not enable direct I/O",
        ));
    }
    state.dispatch_depth = configure_queue(
        Path::new(&device),
        options.model.queue_depth(),
        options.model.rotational(),
        options.scheduler.as_deref(),
    )?;
    state.save()?;
    state.transport_ns = calibrate_transport(state, Path::new(&device))?;
    state.save()?;

    // A new file system is made with the model off, whole (no lazy inode tables or journal):
    // a disk bought with a file system on it. Made lazily, ext4 zeroes its inode tables from a
    // kernel thread in the first seconds after the mount, under the model, in every
    // experiment's first measurements.
    let made = options.mkfs.is_some();
    if made {
        set_unmodelled(&state.fuse_mountpoint, true)?;
    }
    let result = make_and_mount(state, options, &device);
    if made {
        // What the mount wrote reaches the disk before the model is back (mkfs syncs its own).
        if let Some(dir) = state.mount_dir.as_ref().filter(|_| result.is_ok()) {
            system::run("sync", &["-f", &dir.to_string_lossy()])?;
        }
        set_unmodelled(&state.fuse_mountpoint, false)?;
    }
    result
}

fn make_and_mount(
    state: &mut LabState,
    options: &LabOptions,
    device: &str,
) -> Result<(), LabError> {
    match options.mkfs {
        Some(FilesystemKind::Ext4) => {
            system::run(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                    device,
                ],
            )?;
        }
        Some(FilesystemKind::Xfs) => {
            system::run("mkfs.xfs", &["-q", "-f", "-K", device])?;
        }
        Some(FilesystemKind::Btrfs) => {
            system::run("mkfs.btrfs", &["-q", "-f", "-K", device])?;
        }
        None => {}
    }
    if let Some(dir) = &options.mount_dir {
        if !dir.exists() {
            std::fs::create_dir_all(dir).map_err(LabError::io(dir))?;
            state.created_mount_dir = true;
        }
        state.mount_dir = Some(dir.clone());
        state.save()?;
        let dir = dir.to_string_lossy();
        match &options.mount_options {
            Some(mount_options) => system::run("mount", &["-o", mount_options, device, &dir])?,
            None => system::run("mount", &[device, &dir])?,
        };
    }
    Ok(())
}

/// The control file that switches the model of the emulator whose FUSE file system is at
/// `fuse_mountpoint`.
fn unmodelled_control(fuse_mountpoint: &Path) -> PathBuf {
    fuse_mountpoint.join(crate::emulator::UNMODELLED_NAME)
}

/// Switches the model of the emulator whose FUSE file system is at `fuse_mountpoint` off or
/// back on (see [`Lab::set_unmodelled`]).
fn set_unmodelled(fuse_mountpoint: &Path, unmodelled: bool) -> Result<(), LabError> {
    let control = unmodelled_control(fuse_mountpoint);
    // Without truncation: the control file has no size to truncate.
    OpenOptions::new()
        .write(true)
        .open(&control)
        .and_then(|mut file| {
            std::io::Write::write_all(&mut file, if unmodelled { b"1\n" } else { b"0\n" })
        })
        .map_err(LabError::io(&control))
}

/// Reads this many blocks to measure the transport delay.
const CALIBRATION_READS: u64 = 64;

/// Measures how long a request spends between the loop device and the emulator, outside the
/// model, and tells the emulator to take it off its replies.
///
/// Each of a few 4 KiB direct reads is timed here and in the emulator (arrival to reply); the
/// difference is the transport delay. The reads are spread over the disk, away from the start
/// where a newly attached device gets probed.
///
/// The delay taken off is the mean of the middle 80% of the differences, not their median: the
/// transport delay is skewed (a VM's round trip has a long upper side), and taking off the
/// median would leave the emulated device slower than its model on average by the difference
/// of the two. That was 10% of a 1.3 ms cloud read on a slower VM. Trimming keeps a single
/// preempted read from setting the figure.
fn calibrate_transport(state: &LabState, device: &Path) -> Result<u64, LabError> {
    use crate::direct_io::{open_direct, timed_read, AlignedBuffer};
    const LEN: u64 = 4096;
    let file = open_direct(device)?;
    let mut buf = AlignedBuffer::new(4096);
    let mut cursor = StatsCursor::at_end(&state.stats_path)?;
    let stride = (state.size_bytes / 2 / CALIBRATION_READS) / LEN * LEN;
    let mut client = Vec::new();
    for i in 0..CALIBRATION_READS {
        let offset = state.size_bytes / 2 + i * stride;
        client.push((offset, timed_read(&file, &mut buf, offset, LEN)?));
    }
    let mut transport = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut records = Vec::new();
    while transport.len() < client.len() && Instant::now() < deadline {
        // The emulator flushes its records within 100 ms of going idle.
        std::thread::sleep(Duration::from_millis(50));
        records.extend(cursor.read_new()?);
        transport = client
            .iter()
            .filter_map(|&(offset, took)| {
                let record = records
                    .iter()
                    .find(|r| r.offset == offset && r.len == LEN)?;
                Some(crate::timing::nanos(took).saturating_sub(record.latency_ns()))
            })
            .collect::<Vec<_>>();
    }
    if transport.len() < client.len() {
        return Err(LabError::system(
            "measuring the transport delay",
            "the emulator did not record the calibration reads",
        ));
    }
    transport.sort_unstable();
    let trim = transport.len() / 10;
    let middle = &transport[trim..transport.len() - trim];
    let delay = middle.iter().sum::<u64>() / middle.len() as u64;
    let control = state.fuse_mountpoint.join(crate::emulator::TRANSPORT_NAME);
    // Without truncation: the control file has no size to truncate.
    OpenOptions::new()
        .write(true)
        .open(&control)
        .and_then(|mut file| std::io::Write::write_all(&mut file, format!("{delay}\n").as_bytes()))
        .map_err(LabError::io(&control))?;
    Ok(delay)
}

/// Starts the emulator detached (it forks and its parent exits) and waits until it serves.
fn start_emulator(state: &LabState, exe: &Path) -> Result<ProcessId, LabError> {
    let config = EmulatorConfig {
        model: state.model.clone(),
        size_bytes: state.size_bytes,
        backing_path: state.backing_path.clone(),
        mountpoint: state.fuse_mountpoint.clone(),
        stats_path: state.stats_path.clone(),
        summary_path: state.summary_path.clone(),
    };
    let config_path = state.state_dir.join(EMULATOR_CONFIG_FILE);
    let text = serde_json::to_string_pretty(&config).map_err(std::io::Error::other);
    text.and_then(|t| std::fs::write(&config_path, t))
        .map_err(LabError::io(&config_path))?;
    let log = File::create(&state.log_path).map_err(LabError::io(&state.log_path))?;
    let log_err = log.try_clone().map_err(LabError::io(&state.log_path))?;
    let status = Command::new(exe)
        .arg("serve")
        .arg("--state-dir")
        .arg(&state.state_dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0)
        .status()
        .map_err(|e| LabError::Emulator {
            reason: format!("cannot run {}: {e}", exe.display()),
        })?;
    if !status.success() {
        return Err(emulator_failure(state));
    }
    let pid_path = state.state_dir.join(EMULATOR_PID_FILE);
    let started = Instant::now();
    loop {
        let emulator = std::fs::read_to_string(&pid_path)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .and_then(|pid| {
                Some(ProcessId {
                    pid,
                    start_time: system::process_start_time(pid)?,
                })
            });
        let serving = system::is_mounted(&state.fuse_mountpoint)
            && std::fs::metadata(&state.image_path).is_ok_and(|m| m.len() == state.size_bytes);
        match emulator {
            Some(process) if serving => return Ok(process),
            None if state.state_dir.join(EMULATOR_FAILURE_FILE).exists() => {
                return Err(emulator_failure(state));
            }
            _ if started.elapsed() > READY_TIMEOUT => {
                return Err(LabError::Emulator {
                    reason: format!(
                        "not serving after {} s; see {}",
                        READY_TIMEOUT.as_secs(),
                        state.log_path.display()
                    ),
                });
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// The error the emulator reported: `emulator.failed` holds its exit code and message.
fn emulator_failure(state: &LabState) -> LabError {
    let text =
        std::fs::read_to_string(state.state_dir.join(EMULATOR_FAILURE_FILE)).unwrap_or_default();
    let (code, message) = text.split_once(' ').unwrap_or(("", text.as_str()));
    let message = message.trim().to_owned();
    if code == "6" {
        LabError::FuseUnavailable { reason: message }
    } else {
        LabError::Emulator {
            reason: if message.is_empty() {
                format!("it exited early; see {}", state.log_path.display())
            } else {
                message
            },
        }
    }
}

/// Records a failure of the emulator for `up` to report.
pub fn record_emulator_failure(state_dir: &Path, error: &LabError) {
    let _ = std::fs::write(
        state_dir.join(EMULATOR_FAILURE_FILE),
        format!("{} {error}", error.exit_code()),
    );
}

/// Records the emulator's pid once it is detached.
pub fn record_emulator_pid(state_dir: &Path) -> Result<(), LabError> {
    let path = state_dir.join(EMULATOR_PID_FILE);
    std::fs::write(&path, std::process::id().to_string()).map_err(LabError::io(&path))
}

/// Reads the emulator configuration that `up` wrote.
pub fn read_emulator_config(state_dir: &Path) -> Result<EmulatorConfig, LabError> {
    let path = state_dir.join(EMULATOR_CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(LabError::io(&path))?;
    serde_json::from_str(&text).map_err(|e| LabError::Io {
        path,
        source: std::io::Error::other(e),
    })
}

/// Sets the loop device's dispatch depth and rotational flag, then the scheduler.
///
/// Writing `nr_requests` while the scheduler is `none` resizes the driver tags, i.e. how many
/// requests the driver (and so the emulator) gets at once; selecting a scheduler afterwards
/// keeps that depth (it only sizes the scheduler's own tags). The block layer's minimum is 4.
/// Returns the depth read back from the kernel, when it shows it.
pub fn configure_queue(
    device: &Path,
    depth: u32,
    rotational: bool,
    scheduler: Option<&str>,
) -> Result<Option<u32>, LabError> {
    let queue = system::sysfs_block(device).join("queue");
    system::write_attr(&queue.join("scheduler"), "none")?;
    let depth = depth.max(MIN_DISPATCH_DEPTH);
    system::write_attr(&queue.join("nr_requests"), &depth.to_string())?;
    system::write_attr(
        &queue.join("rotational"),
        if rotational { "1" } else { "0" },
    )?;
    if let Some(scheduler) = scheduler {
        system::write_attr(&queue.join("scheduler"), scheduler)?;
    }
    Ok(driver_tag_depth(device))
}

/// The driver tag depth of a device, as blk-mq shows it in debugfs (mounted privately when
/// nobody mounted it).
#[must_use]
pub fn driver_tag_depth(device: &Path) -> Option<u32> {
    let name = device.file_name()?.to_string_lossy().into_owned();
    abiss_os::blk_mq::driver_tag_depth(&name).map(|(depth, _)| depth)
}

fn take_down(state_dir: &Path) -> Result<Vec<String>, LabError> {
    let mut removed = Vec::new();
    let state = LabState::load(state_dir);
    let emulator_was_running = state
        .as_ref()
        .and_then(|s| s.emulator)
        .is_some_and(|p| system::process_alive(p.pid, p.start_time));
    let fuse = state_dir.join("fuse");
    let ours: Vec<PathBuf> = system::loop_devices()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(&fuse))
        .map(|(device, _)| device)
        .collect();

    // 1. File systems on our loop devices (found from the mount table, not only the state).
    for (mount_point, source) in system::mounts() {
        let on_ours = ours.iter().any(|d| d.as_os_str() == source.as_str());
        if on_ours {
            let mp = mount_point.to_string_lossy().into_owned();
            if system::run("umount", &[&mp]).is_err() {
                system::run("umount", &["-l", &mp])?;
            }
            removed.push(format!("mount {mp}"));
        }
    }
    // 2. The loop devices.
    for device in &ours {
        let dev = device.to_string_lossy().into_owned();
        system::run("losetup", &["-d", &dev])?;
        removed.push(format!("loop device {dev}"));
    }
    // 3. The FUSE mount: once no loop device holds the image, the unmount ends the emulator's
    // session loop and it exits by itself. The loop device lets go of the file asynchronously,
    // so busy is retried for a while.
    if system::is_mounted(&fuse) {
        let mp = fuse.to_string_lossy().into_owned();
        let started = Instant::now();
        while system::run("fusermount3", &["-u", &mp]).is_err() {
            if started.elapsed() > Duration::from_secs(3) {
                system::run("fusermount3", &["-u", "-z", &mp])?;
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        removed.push(format!("FUSE mount {mp}"));
    }
    // 4. The emulator: it should be exiting; kill it if it does not.
    let mut processes = emulator_processes(state_dir);
    if let Some(ProcessId { pid, start_time }) = state.as_ref().and_then(|s| s.emulator) {
        if system::process_alive(pid, start_time) && !processes.iter().any(|(p, _)| *p == pid) {
            processes.push((pid, start_time));
        }
    }
    for (pid, start_time) in processes {
        let started = Instant::now();
        while system::process_alive(pid, start_time) && started.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if system::process_alive(pid, start_time) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            removed.push(format!("emulator process {pid} (killed)"));
        }
    }
    if emulator_was_running && !removed.iter().any(|r| r.starts_with("emulator")) {
        removed.push("emulator process (exited when FUSE was unmounted)".into());
    }
    // 5. Files.
    if let Some(state) = &state {
        if std::fs::remove_file(&state.backing_path).is_ok() {
            removed.push(format!("backing file {}", state.backing_path.display()));
        }
        // The backing directory goes too when nothing else is in it.
        if let Some(dir) = state.backing_path.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        if let (Some(dir), true) = (&state.mount_dir, state.created_mount_dir) {
            if std::fs::remove_dir(dir).is_ok() {
                removed.push(format!("mount directory {}", dir.display()));
            }
        }
    }
    if state_dir.exists() {
        std::fs::remove_dir_all(state_dir).map_err(LabError::io(state_dir))?;
        removed.push(format!("state directory {}", state_dir.display()));
    }
    Ok(removed)
}
