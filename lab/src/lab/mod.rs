//! Bringing a lab up and taking it down: state directory, emulator process, loop device,
//! queue settings, file system.
//!
//! Everything `up` makes is recorded in `state.json` in the state directory before it is made,
//! so `down` can remove it even after a crash; `down` also finds what it owns without the
//! state file (loop devices over the lab's image, mounts of them, emulator processes serving
//! the state directory).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::emulator::image_path;
use crate::error::LabError;
use crate::model::{ModelKind, ModelSpec};
use crate::stats::{read_summary, StatsCursor, StatsSummary};
use crate::system;

mod bring_up;
mod take_down;

use bring_up::{bring_up, calibrate_transport, set_unmodelled, unmodelled_control};
pub use bring_up::{read_emulator_config, record_emulator_failure, record_emulator_pid};
use take_down::take_down;
pub use take_down::{configure_queue, driver_tag_depth};

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
    if !root_owns(dir) {
        return None;
    }
    let stats = nix::sys::statvfs::statvfs(parent).ok()?;
    let free = stats
        .blocks_available()
        .saturating_mul(stats.fragment_size());
    let available = procfs::Meminfo::current().ok()?.mem_available?;
    (free >= size_bytes && available >= size_bytes.saturating_mul(2)).then(|| dir.to_path_buf())
}

/// Whether `dir` is a directory root made and alone may write, making it (0755) if it is
/// missing. `/dev/shm` is every user's to write: a directory someone else put at that name, or
/// a link, would let them choose what root's lab writes its image over.
fn root_owns(dir: &Path) -> bool {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    let _ = std::fs::DirBuilder::new().mode(0o755).create(dir);
    std::fs::symlink_metadata(dir)
        .is_ok_and(|found| found.is_dir() && found.uid() == 0 && found.mode() & 0o022 == 0)
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

impl LabOptions {
    /// The lab hdd of every harness (the tests, the benchmarks and the demo): the default hdd
    /// model, `size_bytes` big, `mkfs` made and mounted at `dir/mnt`, the lab's state in
    /// `dir/state`, the `none` elevator, and the image in memory where it fits
    /// ([`memory_backing_dir`], in a directory named after `dir` and this process), else in
    /// `dir/backing`.
    ///
    /// # Errors
    /// The `abiss-lab` executable is not found ([`emulator_exe`]).
    pub fn hdd_in(
        dir: &Path,
        size_bytes: u64,
        mkfs: Option<FilesystemKind>,
    ) -> Result<Self, LabError> {
        let mut options = Self::new(crate::model::ModelFile::default().spec(ModelKind::Hdd))?;
        options.size_bytes = size_bytes;
        options.mkfs = mkfs;
        options.mount_dir = mkfs.map(|_| dir.join("mnt"));
        options.state_dir = dir.join("state");
        options.scheduler = Some("none".into());
        // Named after the lab and this process: two checkouts' demos may run at once.
        let name = format!(
            "{}-{}",
            dir.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        );
        options.backing_dir = memory_backing_dir(size_bytes)
            .map_or_else(|| dir.join("backing"), |memory| memory.join(name));
        Ok(options)
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
