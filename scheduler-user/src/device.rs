//! Managed block devices: elevator and dispatch depth while streams are active, restored on exit.
//!
//! ABISS priorities are decided by the elevator, and an elevator can only order the requests it
//! still holds: whatever the driver has already accepted is out of its hands. So a managed disk
//! gets an elevator that honours I/O priorities (`bfq` or `mq-deadline`) and a shallow driver
//! queue (the *dispatch depth*). The kernel sets that depth through `queue/nr_requests`, which
//! sizes the driver tags only while the scheduler is `none`; the depth stays when an elevator is
//! selected afterwards (verified on Linux 6.18). So taking a disk writes, in order:
//! scheduler `none`, `nr_requests` = dispatch depth, then the elevator.
//!
//! Every setting is saved to a state file before anything changes, and put back on drop; a
//! daemon that crashed leaves the file behind, and [`recover`] restores from it on the next start.
//! Requires root (the sysfs files are root's) and, to read the live driver depth, debugfs mounted
//! at `/sys/kernel/debug`.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use abiss_proto::DeviceNumber;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Where sysfs is mounted.
pub const SYSFS: &str = "/sys";

/// Where debugfs shows each disk's blk-mq state (`<disk>/hctxN/tags`).
pub const DEBUGFS_BLOCK: &str = "/sys/kernel/debug/block";

/// The smallest depth the kernel accepts for `nr_requests` (`BLKDEV_MIN_RQ`); it rounds smaller
/// values up to this.
pub const MIN_DISPATCH_DEPTH: u32 = 4;

/// The scheduler name that means "no elevator".
const NO_ELEVATOR: &str = "none";

/// Version of the state file layout; a file of another version is treated as corrupt.
const STATE_FORMAT: u32 = 1;

/// Failures to manage a device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The elevator name is not one abissd selects.
    #[error("'{name}' is not an elevator abissd can select; choose bfq or mq-deadline")]
    UnknownElevator {
        /// The name given.
        name: String,
    },
    /// The dispatch depth is below what the kernel accepts.
    #[error(
        "dispatch depth {depth} is below the kernel's minimum of {MIN_DISPATCH_DEPTH} requests"
    )]
    DispatchDepthTooSmall {
        /// The depth asked for.
        depth: u32,
    },
    /// Nothing by that name, path or number is a block device on this system.
    #[error("no block device '{spec}' (looked for a name in /sys/class/block, a /dev path, or MAJOR:MINOR)")]
    UnknownDevice {
        /// The device as the user gave it.
        spec: String,
    },
    /// The path exists but is not a block device.
    #[error("{spec} is not a block device")]
    NotABlockDevice {
        /// The device as the user gave it.
        spec: String,
    },
    /// The disk is bio-based: it has no request queue, hence no elevator to select.
    #[error("{name} has no I/O scheduler (it is bio-based, like zram, md or most device-mapper targets); manage the disks beneath it instead")]
    NoElevatorQueue {
        /// The disk.
        name: String,
    },
    /// The kernel refused the elevator and does not list it.
    #[error("{name} does not offer the {elevator} elevator (it offers: {offered}); it needs the {module} kernel module, or choose another elevator")]
    ElevatorNotOffered {
        /// The disk.
        name: String,
        /// The elevator asked for.
        elevator: Elevator,
        /// What the kernel offers, as in `queue/scheduler`.
        offered: String,
        /// The kernel module that provides it.
        module: &'static str,
    },
    /// Writing sysfs needs root (or `CAP_DAC_OVERRIDE`).
    #[error("cannot change {path}: permission denied; abissd must run as root to manage devices")]
    PermissionDenied {
        /// The file.
        path: PathBuf,
    },
    /// A sysfs or debugfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused a setting.
    #[error("cannot write '{value}' to {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A sysfs file holds something this code does not understand.
    #[error("{path} holds '{content}', which abissd cannot parse")]
    Unparsable {
        /// The file.
        path: PathBuf,
        /// What it holds.
        content: String,
    },
    /// Another daemon holds the device.
    #[error("{name} ({number}) is already managed by another abissd (it holds {lock})")]
    AlreadyManaged {
        /// The disk.
        name: String,
        /// Its number.
        number: DeviceNumber,
        /// The lock file.
        lock: PathBuf,
    },
    /// The state directory or a state file could not be written or read.
    #[error("cannot keep device state in {path}: {source}")]
    StateFile {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A state file cannot be trusted, so the settings it should hold are unknown.
    #[error(
        "state file {path} is corrupt ({reason}); fix or remove it, then set the device by hand"
    )]
    CorruptState {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// An elevator that honours I/O priorities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Elevator {
    /// Budget Fair Queueing: weights per class and level, with idling.
    Bfq,
    /// mq-deadline: strict class order (real time, best effort, idle) with aging.
    MqDeadline,
}

impl Elevator {
    /// The name in `queue/scheduler`.
    #[must_use]
    pub const fn sysfs_name(self) -> &'static str {
        match self {
            Self::Bfq => "bfq",
            Self::MqDeadline => "mq-deadline",
        }
    }

    /// The kernel module that provides it, for `modprobe`.
    #[must_use]
    pub const fn module(self) -> &'static str {
        match self {
            Self::Bfq => "bfq",
            Self::MqDeadline => "mq-deadline",
        }
    }
}

impl fmt::Display for Elevator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.sysfs_name())
    }
}

impl FromStr for Elevator {
    type Err = DeviceError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name.trim() {
            "bfq" => Ok(Self::Bfq),
            "mq-deadline" => Ok(Self::MqDeadline),
            other => Err(DeviceError::UnknownElevator {
                name: other.to_owned(),
            }),
        }
    }
}

/// How abissd sets up a managed device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// The elevator while managed.
    pub elevator: Elevator,
    /// The most requests the driver may hold; the elevator orders the rest. Never raised above
    /// what the driver had.
    pub dispatch_depth: u32,
}

impl DeviceConfig {
    /// The default: mq-deadline, because it serves the ABISS classes in strict order (real-time
    /// requests always dispatch before best effort, which dispatch before idle), it is built into
    /// most distribution kernels, and it costs little per request; bfq turns priorities into
    /// weights and idles on queues, which trades latency of the highest class for fairness.
    /// A depth of 8: the kernel's minimum is 4, and a few more keep a disk's internal
    /// parallelism busy while a request dispatched ahead of a real-time one waits at most
    /// behind 7 others.
    pub const DEFAULT: Self = Self {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 8,
    };
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A whole disk: the block device that owns the request queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Disk {
    /// Kernel name (`sda`, `loop0`, `nvme0n1`).
    pub name: String,
    /// Its device number.
    pub number: DeviceNumber,
}

impl fmt::Display for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.number)
    }
}

/// Resolves a device as users type it (`sda`, `/dev/sda`, `8:0`, or a partition such as `sda1`
/// or `/dev/loop0p1`) to its whole disk, because the queue belongs to the disk.
pub fn resolve_disk(spec: &str) -> Result<Disk, DeviceError> {
    resolve_disk_in(Path::new(SYSFS), spec)
}

/// How a device spec names a device.
#[derive(Clone, Debug, PartialEq, Eq)]
enum DeviceSpec<'a> {
    /// A path, usually under /dev; symlinks such as /dev/disk/by-id/… are followed.
    Path(&'a Path),
    /// `MAJOR:MINOR`.
    Number(DeviceNumber),
    /// A kernel name, as in /sys/class/block.
    Name(&'a str),
}

impl<'a> DeviceSpec<'a> {
    fn classify(spec: &'a str) -> Self {
        if spec.contains('/') {
            Self::Path(Path::new(spec))
        } else if let Ok(number) = spec.parse() {
            Self::Number(number)
        } else {
            Self::Name(spec)
        }
    }
}

fn resolve_disk_in(sys: &Path, spec: &str) -> Result<Disk, DeviceError> {
    let unknown = || DeviceError::UnknownDevice {
        spec: spec.to_owned(),
    };
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(unknown());
    }
    let link = match DeviceSpec::classify(spec) {
        DeviceSpec::Path(path) => {
            let meta = fs::metadata(path).map_err(|_| unknown())?;
            if !meta.file_type().is_block_device() {
                return Err(DeviceError::NotABlockDevice {
                    spec: spec.to_owned(),
                });
            }
            let rdev = meta.rdev();
            let number = DeviceNumber {
                major: nix::sys::stat::major(rdev)
                    .try_into()
                    .map_err(|_| unknown())?,
                minor: nix::sys::stat::minor(rdev)
                    .try_into()
                    .map_err(|_| unknown())?,
            };
            sys.join("dev/block").join(number.to_string())
        }
        DeviceSpec::Number(number) => sys.join("dev/block").join(number.to_string()),
        DeviceSpec::Name(name) => sys.join("class/block").join(name),
    };
    let device_dir = fs::canonicalize(&link).map_err(|_| unknown())?;
    // A partition's sysfs directory sits inside its disk's and has a `partition` file.
    let disk_dir = if device_dir.join("partition").exists() {
        device_dir.parent().ok_or_else(unknown)?.to_path_buf()
    } else {
        device_dir
    };
    let name = disk_dir
        .file_name()
        .ok_or_else(unknown)?
        .to_string_lossy()
        .into_owned();
    let dev_file = disk_dir.join("dev");
    let text = read_trimmed(&dev_file)?;
    let number = text.parse().map_err(|_| DeviceError::Unparsable {
        path: dev_file.clone(),
        content: text.clone(),
    })?;
    Ok(Disk { name, number })
}

/// The line of `queue/scheduler`, e.g. `none [mq-deadline] kyber bfq`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SchedulerLine {
    /// The bracketed one.
    active: String,
    /// All of them, in the kernel's order.
    offered: Vec<String>,
}

impl SchedulerLine {
    /// `None` for a line without an active entry (old kernels print a bare `none` for
    /// bio-based disks) or with no entries at all.
    fn parse(line: &str) -> Option<Self> {
        let mut active = None;
        let mut offered = Vec::new();
        for word in line.split_whitespace() {
            if let Some(name) = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
                if active.replace(name.to_owned()).is_some() {
                    return None;
                }
                offered.push(name.to_owned());
            } else {
                offered.push(word.to_owned());
            }
        }
        Some(Self {
            active: active?,
            offered,
        })
    }

    fn offers(&self, name: &str) -> bool {
        self.offered.iter().any(|offered| offered == name)
    }
}

/// The live depth of the driver tags from a debugfs `hctxN/tags` file: the `depth` of
/// `bitmap_tags` plus the reserved tags, as `nr_requests` counts them.
fn parse_tags_depth(text: &str) -> Option<u32> {
    let mut reserved = None;
    let mut in_bitmap_tags = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(value) = line.strip_prefix("nr_reserved_tags=") {
            reserved = value.parse::<u32>().ok();
        } else if line == "bitmap_tags:" {
            in_bitmap_tags = true;
        } else if in_bitmap_tags {
            if let Some(value) = line.strip_prefix("depth=") {
                return value.parse::<u32>().ok()?.checked_add(reserved?);
            }
        }
    }
    None
}

/// How a driver depth was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepthSource {
    /// Read live from debugfs.
    Debugfs,
    /// Without debugfs: the allocated tag count (`mq/N/nr_tags`), which is the driver's own
    /// depth unless someone shrank it before.
    AllocatedTags,
    /// What abissd wrote, not read back (no debugfs).
    Written,
}

/// A disk's queue settings that abissd changes, as they were before it took the disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// The active scheduler (`none`, `mq-deadline`, `kyber`, `bfq`, …).
    pub elevator: String,
    /// `queue/nr_requests`: the elevator's own depth, or with `none` the driver depth.
    pub nr_requests: u32,
    /// The driver depth.
    pub driver_depth: u32,
    /// How `driver_depth` was learned.
    pub driver_depth_source: DepthSource,
    /// The elevator's tunables (`queue/iosched/*`), which selecting another elevator discards.
    pub iosched: BTreeMap<String, String>,
}

/// What a state file holds: enough to put a disk back and to tell it is still the same disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedDevice {
    format: u32,
    disk: Disk,
    /// `diskseq` (Linux 5.15+) grows each time a disk is (re)created or a loop device attached;
    /// a different value means the disk we changed is gone.
    diskseq: Option<u64>,
    original: QueueSettings,
    /// The driver depth abissd was about to set, or `None` if it left the depth alone; without
    /// debugfs this is how recovery knows the depth needs putting back.
    shrunk_to: Option<u32>,
}

impl SavedDevice {
    fn to_json(&self) -> String {
        // A struct of strings, numbers and string maps always serializes.
        serde_json::to_string_pretty(self).expect("device state serializes")
    }

    fn from_json(text: &str) -> Result<Self, String> {
        let saved: Self = serde_json::from_str(text).map_err(|error| error.to_string())?;
        if saved.format != STATE_FORMAT {
            return Err(format!(
                "format {} where {STATE_FORMAT} was expected",
                saved.format
            ));
        }
        Ok(saved)
    }
}

/// One sysfs write of a plan, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum QueueWrite {
    /// Select a scheduler.
    Scheduler(String),
    /// `nr_requests` with scheduler `none`: resizes the driver tags.
    DriverDepth(u32),
    /// `nr_requests` with an elevator: the elevator's own depth.
    ElevatorDepth(u32),
    /// `queue/iosched/<name>`.
    Tunable(String, String),
}

/// The writes that give a disk `config`, from its `original` settings. Empty when it already
/// has the elevator and a driver depth no deeper than asked, so its tunables survive.
fn plan_take(original: &QueueSettings, config: DeviceConfig) -> Vec<QueueWrite> {
    let elevator = config.elevator.sysfs_name().to_owned();
    if original.driver_depth > config.dispatch_depth {
        vec![
            QueueWrite::Scheduler(NO_ELEVATOR.to_owned()),
            QueueWrite::DriverDepth(config.dispatch_depth),
            QueueWrite::Scheduler(elevator),
        ]
    } else if original.elevator == elevator {
        Vec::new()
    } else {
        vec![QueueWrite::Scheduler(elevator)]
    }
}

/// A disk's settings now, as far as restoring needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct QueueNow {
    elevator: String,
    nr_requests: u32,
    /// `None` without debugfs.
    driver_depth: Option<u32>,
    iosched: BTreeMap<String, String>,
}

/// The writes that put `original` back on a disk that is `now` as it is. `shrunk_to` says
/// whether abissd meant to change the driver depth, for when the live depth cannot be read.
fn plan_restore(saved: &SavedDevice, now: &QueueNow) -> Vec<QueueWrite> {
    let original = &saved.original;
    let mut writes = Vec::new();
    let depth_changed = match now.driver_depth {
        Some(depth) => depth != original.driver_depth,
        None => saved.shrunk_to.is_some(),
    };
    // With `none`, nr_requests shows the driver depth, except after an elevator is switched off:
    // then it shows the allocated tags until written. Writing the depth makes it show the depth.
    let shows_wrong_depth = original.elevator == NO_ELEVATOR
        && (now.elevator != NO_ELEVATOR || now.nr_requests != original.driver_depth);
    let mut elevator_now = now.elevator.as_str();
    if depth_changed || shows_wrong_depth {
        writes.push(QueueWrite::Scheduler(NO_ELEVATOR.to_owned()));
        writes.push(QueueWrite::DriverDepth(original.driver_depth));
        elevator_now = NO_ELEVATOR;
    }
    let switched = elevator_now != original.elevator;
    if switched {
        writes.push(QueueWrite::Scheduler(original.elevator.clone()));
    }
    if original.elevator != NO_ELEVATOR {
        if switched || now.nr_requests != original.nr_requests {
            writes.push(QueueWrite::ElevatorDepth(original.nr_requests));
        }
        for (name, value) in &original.iosched {
            if switched || now.iosched.get(name) != Some(value) {
                writes.push(QueueWrite::Tunable(name.clone(), value.clone()));
            }
        }
    }
    writes
}

/// Where a disk's settings live in sysfs and debugfs.
#[derive(Clone, Debug)]
struct DiskQueue {
    name: String,
    queue_dir: PathBuf,
    mq_dir: PathBuf,
    debugfs_dir: PathBuf,
    diskseq_file: PathBuf,
}

impl DiskQueue {
    fn of(disk: &Disk) -> Self {
        let block = Path::new(SYSFS).join("block").join(&disk.name);
        Self {
            name: disk.name.clone(),
            queue_dir: block.join("queue"),
            mq_dir: block.join("mq"),
            debugfs_dir: Path::new(DEBUGFS_BLOCK).join(&disk.name),
            diskseq_file: block.join("diskseq"),
        }
    }

    fn scheduler_file(&self) -> PathBuf {
        self.queue_dir.join("scheduler")
    }

    fn nr_requests_file(&self) -> PathBuf {
        self.queue_dir.join("nr_requests")
    }

    fn scheduler(&self) -> Result<SchedulerLine, DeviceError> {
        let path = self.scheduler_file();
        let line = match fs::read_to_string(&path) {
            Ok(line) => line,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(DeviceError::NoElevatorQueue {
                    name: self.name.clone(),
                })
            }
            Err(source) => return Err(DeviceError::Read { path, source }),
        };
        if line.trim() == NO_ELEVATOR {
            return Err(DeviceError::NoElevatorQueue {
                name: self.name.clone(),
            });
        }
        SchedulerLine::parse(&line).ok_or(DeviceError::Unparsable {
            path,
            content: line.trim().to_owned(),
        })
    }

    fn nr_requests(&self) -> Result<u32, DeviceError> {
        read_number(&self.nr_requests_file())
    }

    fn diskseq(&self) -> Option<u64> {
        read_trimmed(&self.diskseq_file).ok()?.parse().ok()
    }

    /// The live driver depth from debugfs, the largest over the hardware queues; `None` when
    /// debugfs is not mounted.
    fn live_driver_depth(&self) -> Option<u32> {
        let entries = fs::read_dir(&self.debugfs_dir).ok()?;
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("hctx"))
            .filter_map(|entry| fs::read_to_string(entry.path().join("tags")).ok())
            .filter_map(|text| parse_tags_depth(&text))
            .max()
    }

    /// The allocated driver tags, the largest over the hardware queues.
    fn allocated_tags(&self) -> Result<u32, DeviceError> {
        let entries = fs::read_dir(&self.mq_dir).map_err(|source| DeviceError::Read {
            path: self.mq_dir.clone(),
            source,
        })?;
        let mut largest = None;
        for entry in entries.filter_map(Result::ok) {
            let tags = read_number(&entry.path().join("nr_tags"))?;
            largest = largest.max(Some(tags));
        }
        largest.ok_or_else(|| DeviceError::Read {
            path: self.mq_dir.clone(),
            source: io::Error::new(io::ErrorKind::NotFound, "no hardware queues"),
        })
    }

    fn driver_depth(&self) -> Result<(u32, DepthSource), DeviceError> {
        match self.live_driver_depth() {
            Some(depth) => Ok((depth, DepthSource::Debugfs)),
            None => Ok((self.allocated_tags()?, DepthSource::AllocatedTags)),
        }
    }

    /// The writable tunables of the active elevator.
    fn iosched(&self) -> BTreeMap<String, String> {
        let dir = self.queue_dir.join("iosched");
        let mut tunables = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&dir) else {
            // `none` has no iosched directory.
            return tunables;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let writable = entry
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o200 != 0);
            // A tunable that cannot be read back cannot be restored either; leave it out.
            if let (true, Ok(value)) = (writable, read_trimmed(&path)) {
                tunables.insert(entry.file_name().to_string_lossy().into_owned(), value);
            }
        }
        tunables
    }

    fn settings(&self) -> Result<QueueSettings, DeviceError> {
        let (driver_depth, driver_depth_source) = self.driver_depth()?;
        Ok(QueueSettings {
            elevator: self.scheduler()?.active,
            nr_requests: self.nr_requests()?,
            driver_depth,
            driver_depth_source,
            iosched: self.iosched(),
        })
    }

    fn now(&self) -> Result<QueueNow, DeviceError> {
        Ok(QueueNow {
            elevator: self.scheduler()?.active,
            nr_requests: self.nr_requests()?,
            driver_depth: self.live_driver_depth(),
            iosched: self.iosched(),
        })
    }

    fn apply(&self, writes: &[QueueWrite]) -> Result<(), DeviceError> {
        for write in writes {
            match write {
                QueueWrite::Scheduler(name) => self.select(name)?,
                QueueWrite::DriverDepth(depth) => self.set_driver_depth(*depth)?,
                QueueWrite::ElevatorDepth(depth) => {
                    if self.nr_requests()? != *depth {
                        write_value(&self.nr_requests_file(), &depth.to_string())?;
                    }
                }
                QueueWrite::Tunable(name, value) => {
                    let path = self.queue_dir.join("iosched").join(name);
                    if read_trimmed(&path)? != *value {
                        write_value(&path, value)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn select(&self, name: &str) -> Result<(), DeviceError> {
        if self.scheduler()?.active == name {
            return Ok(());
        }
        let result = write_value(&self.scheduler_file(), name);
        if let Err(DeviceError::Write { .. }) = &result {
            // Writing a name makes the kernel try to load its module, so "not offered" is
            // known only after a refused write.
            let line = self.scheduler()?;
            if let (false, Ok(elevator)) = (line.offers(name), name.parse::<Elevator>()) {
                return Err(DeviceError::ElevatorNotOffered {
                    name: self.name.clone(),
                    elevator,
                    offered: line.offered.join(" "),
                    module: elevator.module(),
                });
            }
        }
        result
    }

    /// Resizes the driver tags; the scheduler must be `none`.
    fn set_driver_depth(&self, depth: u32) -> Result<(), DeviceError> {
        let path = self.nr_requests_file();
        // The kernel ignores a write of the value nr_requests already shows, and after an
        // elevator is switched off it shows the allocated tags whatever the live depth is; so
        // when they match, step to a neighbour first to make the wanted value a change.
        if self.nr_requests()? == depth {
            let neighbour = if depth > MIN_DISPATCH_DEPTH {
                depth - 1
            } else {
                depth + 1
            };
            write_value(&path, &neighbour.to_string())?;
        }
        write_value(&path, &depth.to_string())
    }
}

/// A disk abissd manages; dropping it puts the original settings back.
#[derive(Debug)]
pub struct ManagedDevice {
    disk: Disk,
    queue: DiskQueue,
    saved: SavedDevice,
    config: DeviceConfig,
    state_file: PathBuf,
    restored: bool,
    // Released when the fields drop, which is after `Drop::drop` removed the state file.
    _lock: Flock<File>,
}

/// A managed device as `abissctl status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceStatus {
    /// Kernel name of the disk.
    pub name: String,
    /// Its number, `major:minor`.
    pub number: DeviceNumber,
    /// The active scheduler now.
    pub elevator: String,
    /// The driver depth now.
    pub dispatch_depth: u32,
    /// How `dispatch_depth` was learned.
    pub dispatch_depth_source: DepthSource,
    /// The scheduler it had before abissd took it, and will have again.
    pub original_elevator: String,
    /// The driver depth it had before, and will have again.
    pub original_dispatch_depth: u32,
}

impl ManagedDevice {
    /// Takes the disk of `spec` (see [`resolve_disk`]): saves its settings under
    /// `state_dir/devices/`, then selects `config`'s elevator over a driver queue no deeper
    /// than `config.dispatch_depth`. A state file left for this disk by a crashed daemon is
    /// restored first.
    pub fn take(spec: &str, config: &DeviceConfig, state_dir: &Path) -> Result<Self, DeviceError> {
        if config.dispatch_depth < MIN_DISPATCH_DEPTH {
            return Err(DeviceError::DispatchDepthTooSmall {
                depth: config.dispatch_depth,
            });
        }
        let disk = resolve_disk(spec)?;
        let queue = DiskQueue::of(&disk);
        let offered = queue.scheduler()?;
        if !offered.offers(config.elevator.sysfs_name()) && !load_elevator(config.elevator) {
            return Err(DeviceError::ElevatorNotOffered {
                name: disk.name.clone(),
                elevator: config.elevator,
                offered: offered.offered.join(" "),
                module: config.elevator.module(),
            });
        }
        // Checked before saving anything, so that a daemon without rights leaves no state file.
        for path in [queue.scheduler_file(), queue.nr_requests_file()] {
            if nix::unistd::access(&path, nix::unistd::AccessFlags::W_OK).is_err() {
                return Err(DeviceError::PermissionDenied { path });
            }
        }
        let devices_dir = devices_dir(state_dir);
        create_state_dir(&devices_dir)?;
        let lock = lock_device(&devices_dir, &disk)?;
        let state_file = state_file(&devices_dir, disk.number);
        if state_file.exists() {
            // What a crashed daemon saved is the true original; what the disk has now is that
            // daemon's doing.
            let saved = read_state(&state_file)?;
            if saved.disk == disk && saved.diskseq == queue.diskseq() {
                queue.apply(&plan_restore(&saved, &queue.now()?))?;
            }
            remove_state(&state_file)?;
        }
        let original = queue.settings()?;
        let writes = plan_take(&original, *config);
        let shrunk_to = writes.iter().find_map(|write| match write {
            QueueWrite::DriverDepth(depth) => Some(*depth),
            _ => None,
        });
        let saved = SavedDevice {
            format: STATE_FORMAT,
            disk: disk.clone(),
            diskseq: queue.diskseq(),
            original,
            shrunk_to,
        };
        write_atomically(&state_file, saved.to_json().as_bytes())?;
        let device = Self {
            disk,
            queue,
            saved,
            config: *config,
            state_file,
            restored: false,
            _lock: lock,
        };
        // On failure `device` drops here and undoes the writes that succeeded.
        device.queue.apply(&writes)?;
        Ok(device)
    }

    /// The disk.
    #[must_use]
    pub fn disk(&self) -> &Disk {
        &self.disk
    }

    /// What the disk had before it was taken.
    #[must_use]
    pub fn original(&self) -> &QueueSettings {
        &self.saved.original
    }

    /// The configuration it was taken with.
    #[must_use]
    pub fn config(&self) -> DeviceConfig {
        self.config
    }

    /// Its state file.
    #[must_use]
    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// The disk's settings now, read from sysfs (and debugfs for the depth, if mounted).
    pub fn status(&self) -> Result<DeviceStatus, DeviceError> {
        let (dispatch_depth, dispatch_depth_source) = match self.queue.live_driver_depth() {
            Some(depth) => (depth, DepthSource::Debugfs),
            None => (
                self.saved
                    .shrunk_to
                    .unwrap_or(self.saved.original.driver_depth),
                DepthSource::Written,
            ),
        };
        Ok(DeviceStatus {
            name: self.disk.name.clone(),
            number: self.disk.number,
            elevator: self.queue.scheduler()?.active,
            dispatch_depth,
            dispatch_depth_source,
            original_elevator: self.saved.original.elevator.clone(),
            original_dispatch_depth: self.saved.original.driver_depth,
        })
    }

    /// Puts the original settings back and removes the state file. If that fails the state file
    /// stays, for [`recover`] on the next start. Dropping does the same and logs failures.
    pub fn restore(mut self) -> Result<(), DeviceError> {
        self.restore_once()
    }

    fn restore_once(&mut self) -> Result<(), DeviceError> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        let now = self.queue.now()?;
        self.queue.apply(&plan_restore(&self.saved, &now))?;
        remove_state(&self.state_file)
    }
}

impl Drop for ManagedDevice {
    fn drop(&mut self) {
        if let Err(error) = self.restore_once() {
            log::error!(
                "cannot restore {}: {error}; the next abissd start retries from {}",
                self.disk,
                self.state_file.display()
            );
        }
    }
}

/// What [`recover`] did with one state file.
#[derive(Debug)]
pub enum RecoveryOutcome {
    /// The disk has its original settings again; the file is removed.
    Restored {
        /// The disk.
        disk: Disk,
    },
    /// The disk no longer exists; the file is removed.
    DeviceGone {
        /// The disk the file was for.
        disk: Disk,
    },
    /// Another disk has the name or number now (or the loop device was re-attached): the
    /// settings are not applied to it, and the file is removed.
    DeviceReplaced {
        /// The disk the file was for.
        disk: Disk,
    },
    /// A running abissd manages the disk; the file is left to it.
    InUse {
        /// The state file.
        state_file: PathBuf,
    },
    /// The file cannot be trusted; it is moved aside and the disk left as it is.
    Corrupt {
        /// Where the file is now.
        moved_to: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Restoring failed; the file stays for the next start.
    Failed {
        /// The state file.
        state_file: PathBuf,
        /// Why.
        error: DeviceError,
    },
}

impl fmt::Display for RecoveryOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Restored { disk } => {
                write!(f, "restored {disk} as it was before a previous abissd")
            }
            Self::DeviceGone { disk } => {
                write!(f, "{disk} is gone; dropped its saved settings")
            }
            Self::DeviceReplaced { disk } => write!(
                f,
                "{disk} is another disk now; dropped the saved settings of the old one"
            ),
            Self::InUse { state_file } => write!(
                f,
                "left {} alone: a running abissd manages that disk",
                state_file.display()
            ),
            Self::Corrupt { moved_to, reason } => write!(
                f,
                "a device state file is corrupt ({reason}); moved it to {} and left the disk as it is",
                moved_to.display()
            ),
            Self::Failed { state_file, error } => write!(
                f,
                "cannot restore from {}: {error}; will retry on the next start",
                state_file.display()
            ),
        }
    }
}

/// Restores every disk whose state file a crashed daemon left under `state_dir/devices/`. Call
/// at daemon start, before taking devices. Fails only if the directory cannot be listed; a
/// missing directory means there is nothing to recover.
pub fn recover(state_dir: &Path) -> Result<Vec<RecoveryOutcome>, DeviceError> {
    let devices_dir = devices_dir(state_dir);
    let entries = match fs::read_dir(&devices_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DeviceError::StateFile {
                path: devices_dir,
                source,
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .collect();
    files.sort();
    let mut outcomes = Vec::new();
    for path in files {
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => outcomes.push(recover_one(&devices_dir, &path)),
            // A temporary file is a save cut short, before any setting changed.
            Some("tmp") => {
                let _ = fs::remove_file(&path);
            }
            _ => {}
        }
    }
    Ok(outcomes)
}

fn recover_one(devices_dir: &Path, state_file: &Path) -> RecoveryOutcome {
    let failed = |error| RecoveryOutcome::Failed {
        state_file: state_file.to_path_buf(),
        error,
    };
    let saved = match read_state(state_file) {
        Ok(saved) => saved,
        Err(DeviceError::CorruptState { reason, .. }) => {
            let mut moved_to = state_file.as_os_str().to_owned();
            moved_to.push(".corrupt");
            let moved_to = PathBuf::from(moved_to);
            return match fs::rename(state_file, &moved_to) {
                Ok(()) => RecoveryOutcome::Corrupt { moved_to, reason },
                Err(source) => failed(DeviceError::StateFile {
                    path: state_file.to_path_buf(),
                    source,
                }),
            };
        }
        Err(error) => return failed(error),
    };
    let lock = match lock_device(devices_dir, &saved.disk) {
        Ok(lock) => lock,
        Err(DeviceError::AlreadyManaged { .. }) => {
            return RecoveryOutcome::InUse {
                state_file: state_file.to_path_buf(),
            }
        }
        Err(error) => return failed(error),
    };
    let disk = saved.disk.clone();
    let outcome = match resolve_disk(&disk.number.to_string()) {
        Err(DeviceError::UnknownDevice { .. }) => RecoveryOutcome::DeviceGone { disk },
        Err(error) => return failed(error),
        Ok(found) if found != disk || DiskQueue::of(&found).diskseq() != saved.diskseq => {
            RecoveryOutcome::DeviceReplaced { disk }
        }
        Ok(found) => {
            let queue = DiskQueue::of(&found);
            if let Err(error) = queue
                .now()
                .and_then(|now| queue.apply(&plan_restore(&saved, &now)))
            {
                return failed(error);
            }
            RecoveryOutcome::Restored { disk }
        }
    };
    match remove_state(state_file) {
        Ok(()) => {
            drop(lock);
            outcome
        }
        Err(error) => failed(error),
    }
}

/// Asks the kernel to load an elevator's module, as writing its name to a scheduler file would.
/// Whether it worked shows in the scheduler lines afterwards.
fn load_elevator(elevator: Elevator) -> bool {
    std::process::Command::new("modprobe")
        .arg("-q")
        .arg(format!("{}-iosched", elevator.module()))
        .status()
        .is_ok_and(|status| status.success())
}

fn devices_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("devices")
}

fn state_file(devices_dir: &Path, number: DeviceNumber) -> PathBuf {
    devices_dir.join(format!("{number}.json"))
}

fn create_state_dir(dir: &Path) -> Result<(), DeviceError> {
    fs::create_dir_all(dir).map_err(|source| DeviceError::StateFile {
        path: dir.to_path_buf(),
        source,
    })
}

/// Locks a disk's state against a second daemon (and recovery by one). The lock files stay:
/// removing one while another process waits on it would let two processes hold "the" lock.
fn lock_device(devices_dir: &Path, disk: &Disk) -> Result<Flock<File>, DeviceError> {
    let path = devices_dir.join(format!("{}.lock", disk.number));
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| DeviceError::StateFile {
            path: path.clone(),
            source,
        })?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| DeviceError::AlreadyManaged {
        name: disk.name.clone(),
        number: disk.number,
        lock: path,
    })
}

fn read_state(path: &Path) -> Result<SavedDevice, DeviceError> {
    let text = fs::read_to_string(path).map_err(|source| DeviceError::StateFile {
        path: path.to_path_buf(),
        source,
    })?;
    SavedDevice::from_json(&text).map_err(|reason| DeviceError::CorruptState {
        path: path.to_path_buf(),
        reason,
    })
}

fn remove_state(path: &Path) -> Result<(), DeviceError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DeviceError::StateFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `path` so that a crash leaves either the old file or the whole new one.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), DeviceError> {
    let state_error = |source| DeviceError::StateFile {
        path: path.to_path_buf(),
        source,
    };
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut file = File::create(&temporary).map_err(state_error)?;
    file.write_all(contents).map_err(state_error)?;
    file.sync_all().map_err(state_error)?;
    fs::rename(&temporary, path).map_err(state_error)?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|dir| dir.sync_all())
            .map_err(state_error)?;
    }
    Ok(())
}

fn read_trimmed(path: &Path) -> Result<String, DeviceError> {
    fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .map_err(|source| DeviceError::Read {
            path: path.to_path_buf(),
            source,
        })
}

fn read_number(path: &Path) -> Result<u32, DeviceError> {
    let text = read_trimmed(path)?;
    text.parse().map_err(|_| DeviceError::Unparsable {
        path: path.to_path_buf(),
        content: text,
    })
}

fn write_value(path: &Path, value: &str) -> Result<(), DeviceError> {
    // One write(2) of the whole value: sysfs takes a store as one call.
    fs::write(path, value).map_err(|source| {
        if source.kind() == io::ErrorKind::PermissionDenied {
            DeviceError::PermissionDenied {
                path: path.to_path_buf(),
            }
        } else {
            DeviceError::Write {
                path: path.to_path_buf(),
                value: value.to_owned(),
                source,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct TempTree(PathBuf);

    impl TempTree {
        fn new(tag: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "abiss-device-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A fake sysfs with disk `sda` (8:0) holding partition `sda1` (8:1), laid out as the
    /// kernel does: the device directories under `devices/`, symlinks in `class/block` and
    /// `dev/block`.
    fn fake_sysfs(root: &Path) {
        use std::os::unix::fs::symlink;
        let disk = root.join("devices/pci0000:00/0000:00:1f.2/ata1/host0/block/sda");
        let partition = disk.join("sda1");
        fs::create_dir_all(&partition).unwrap();
        fs::write(disk.join("dev"), "8:0\n").unwrap();
        fs::write(partition.join("dev"), "8:1\n").unwrap();
        fs::write(partition.join("partition"), "1\n").unwrap();
        fs::create_dir_all(root.join("class/block")).unwrap();
        fs::create_dir_all(root.join("dev/block")).unwrap();
        symlink(&disk, root.join("class/block/sda")).unwrap();
        symlink(&partition, root.join("class/block/sda1")).unwrap();
        symlink(&disk, root.join("dev/block/8:0")).unwrap();
        symlink(&partition, root.join("dev/block/8:1")).unwrap();
    }

    fn sda() -> Disk {
        Disk {
            name: "sda".into(),
            number: DeviceNumber { major: 8, minor: 0 },
        }
    }

    #[test]
    fn specs_are_told_apart_by_shape() {
        assert_eq!(
            DeviceSpec::classify("/dev/sda"),
            DeviceSpec::Path(Path::new("/dev/sda"))
        );
        assert_eq!(
            DeviceSpec::classify("8:0"),
            DeviceSpec::Number(DeviceNumber { major: 8, minor: 0 })
        );
        assert_eq!(DeviceSpec::classify("sda1"), DeviceSpec::Name("sda1"));
        assert_eq!(DeviceSpec::classify("8:x"), DeviceSpec::Name("8:x"));
    }

    #[test]
    fn names_numbers_and_partitions_resolve_to_the_whole_disk() {
        let tree = TempTree::new("resolve");
        fake_sysfs(&tree.0);
        for spec in ["sda", "sda1", "8:0", "8:1", " sda "] {
            assert_eq!(resolve_disk_in(&tree.0, spec).unwrap(), sda(), "{spec}");
        }
    }

    #[test]
    fn unknown_devices_are_named_in_the_error() {
        let tree = TempTree::new("unknown");
        fake_sysfs(&tree.0);
        for spec in ["sdz", "9:9", "/dev/does-not-exist", ""] {
            let error = resolve_disk_in(&tree.0, spec).unwrap_err();
            assert!(
                matches!(&error, DeviceError::UnknownDevice { spec: s } if s == spec),
                "{spec}: {error}"
            );
            assert!(error.to_string().contains(spec.trim()));
        }
    }

    #[test]
    fn paths_that_are_not_block_devices_are_refused() {
        let tree = TempTree::new("notblock");
        fake_sysfs(&tree.0);
        let file = tree.0.join("plain-file");
        fs::write(&file, "").unwrap();
        let spec = file.to_string_lossy().into_owned();
        let error = resolve_disk_in(&tree.0, &spec).unwrap_err();
        assert!(
            matches!(error, DeviceError::NotABlockDevice { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(&spec));
    }

    #[test]
    fn scheduler_lines_give_the_active_and_offered_elevators() {
        let line = SchedulerLine::parse("none [mq-deadline] kyber bfq \n").unwrap();
        assert_eq!(line.active, "mq-deadline");
        assert_eq!(line.offered, ["none", "mq-deadline", "kyber", "bfq"]);
        assert!(line.offers("bfq"));
        assert!(!line.offers("cfq"));
        assert_eq!(SchedulerLine::parse("[none] ").unwrap().active, "none");
        assert_eq!(SchedulerLine::parse("none"), None);
        assert_eq!(SchedulerLine::parse(""), None);
        assert_eq!(SchedulerLine::parse("[none] [bfq]"), None);
    }

    #[test]
    fn elevators_parse_and_print_their_sysfs_names() {
        for elevator in [Elevator::Bfq, Elevator::MqDeadline] {
            assert_eq!(elevator.to_string().parse::<Elevator>().unwrap(), elevator);
        }
        let error = "kyber".parse::<Elevator>().unwrap_err();
        assert!(error.to_string().contains("'kyber'"), "{error}");
        assert_eq!(
            serde_json::to_string(&Elevator::MqDeadline).unwrap(),
            "\"mq-deadline\""
        );
    }

    #[test]
    fn debugfs_tags_give_the_live_depth_with_reserved_tags() {
        let tags = "nr_tags=128\nnr_reserved_tags=1\nactive_queues=0\n\nbitmap_tags:\ndepth=7\n\
                    busy=0\ncleared=0\n\nbreserved_tags:\ndepth=1\nbusy=0\n";
        assert_eq!(parse_tags_depth(tags), Some(8));
        assert_eq!(parse_tags_depth("nr_tags=128\n"), None);
    }

    fn settings(elevator: &str, nr_requests: u32, driver_depth: u32) -> QueueSettings {
        QueueSettings {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            driver_depth_source: DepthSource::Debugfs,
            iosched: BTreeMap::from([("fifo_batch".into(), "16".into())]),
        }
    }

    fn saved(original: QueueSettings, shrunk_to: Option<u32>) -> SavedDevice {
        SavedDevice {
            format: STATE_FORMAT,
            disk: sda(),
            diskseq: Some(42),
            original,
            shrunk_to,
        }
    }

    #[test]
    fn state_files_round_trip_and_refuse_other_formats() {
        let state = saved(settings("kyber", 64, 128), Some(8));
        assert_eq!(SavedDevice::from_json(&state.to_json()).unwrap(), state);
        let other = SavedDevice {
            format: 99,
            ..state
        };
        assert!(SavedDevice::from_json(&other.to_json())
            .unwrap_err()
            .contains("format 99"));
        assert!(SavedDevice::from_json("{\"format\": 1").is_err());
    }

    #[test]
    fn taking_a_deep_queue_shrinks_it_under_none_then_selects_the_elevator() {
        let config = DeviceConfig {
            elevator: Elevator::Bfq,
            dispatch_depth: 8,
        };
        assert_eq!(
            plan_take(&settings("mq-deadline", 256, 128), config),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(8),
                QueueWrite::Scheduler("bfq".into()),
            ]
        );
    }

    #[test]
    fn taking_never_deepens_the_driver_queue() {
        let config = DeviceConfig {
            elevator: Elevator::MqDeadline,
            dispatch_depth: 16,
        };
        assert_eq!(
            plan_take(&settings("none", 4, 4), config),
            [QueueWrite::Scheduler("mq-deadline".into())]
        );
        assert_eq!(plan_take(&settings("mq-deadline", 256, 16), config), []);
    }

    fn now(elevator: &str, nr_requests: u32, driver_depth: Option<u32>) -> QueueNow {
        QueueNow {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            iosched: BTreeMap::new(),
        }
    }

    #[test]
    fn restoring_deepens_under_none_then_puts_elevator_depth_and_tunables_back() {
        let state = saved(settings("mq-deadline", 64, 128), Some(8));
        assert_eq!(
            plan_restore(&state, &now("bfq", 256, Some(8))),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(128),
                QueueWrite::Scheduler("mq-deadline".into()),
                QueueWrite::ElevatorDepth(64),
                QueueWrite::Tunable("fifo_batch".into(), "16".into()),
            ]
        );
    }

    #[test]
    fn restoring_without_debugfs_trusts_the_saved_plan() {
        let state = saved(settings("none", 128, 128), Some(8));
        assert_eq!(
            plan_restore(&state, &now("bfq", 256, None)),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(128),
            ]
        );
        let untouched_depth = saved(settings("kyber", 256, 128), None);
        assert_eq!(
            plan_restore(&untouched_depth, &now("bfq", 256, None)),
            [
                QueueWrite::Scheduler("kyber".into()),
                QueueWrite::ElevatorDepth(256),
                QueueWrite::Tunable("fifo_batch".into(), "16".into()),
            ]
        );
    }

    #[test]
    fn restoring_none_writes_the_driver_depth_last_so_nr_requests_shows_it() {
        let state = saved(settings("none", 6, 6), None);
        let writes = [
            QueueWrite::Scheduler("none".into()),
            QueueWrite::DriverDepth(6),
        ];
        assert_eq!(
            plan_restore(&state, &now("mq-deadline", 256, Some(6))),
            writes
        );
        assert_eq!(plan_restore(&state, &now("none", 128, Some(6))), writes);
        assert_eq!(plan_restore(&state, &now("none", 6, Some(6))), []);
    }

    #[test]
    fn restoring_a_restored_disk_writes_nothing() {
        let original = settings("mq-deadline", 64, 128);
        let state = saved(original.clone(), Some(8));
        let restored = QueueNow {
            iosched: original.iosched.clone(),
            ..now("mq-deadline", 64, Some(128))
        };
        assert_eq!(plan_restore(&state, &restored), []);
    }

    #[test]
    fn the_default_config_is_accepted_by_the_kernel() {
        assert!(DeviceConfig::default().dispatch_depth >= MIN_DISPATCH_DEPTH);
    }
}
