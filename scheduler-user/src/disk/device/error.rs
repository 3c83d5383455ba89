//! Failures to manage a device.

use std::io;
use std::path::PathBuf;
use std::str::FromStr;

use abiss_proto::DeviceNumber;

use super::config::{Elevator, MIN_DISPATCH_DEPTH};

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
    /// A client named the device by a path abissd does not look up for it.
    #[error("abissd does not look up '{spec}' for a client; name the disk as NAME, /dev/NAME or MAJOR:MINOR (abissctl turns other paths into MAJOR:MINOR itself)")]
    PathFromClient {
        /// The device as the client gave it.
        spec: String,
    },
    /// The path exists but is not a block device.
    #[error("{spec} is not a block device")]
    NotABlockDevice {
        /// The device as the user gave it.
        spec: String,
    },
    /// A directory named as a device whose file system is on no disk.
    #[error("{path} is a directory whose file system is on no disk sysfs shows (tmpfs, NFS, FUSE, overlayfs); name a disk, or a directory of a file system on disks")]
    NoDisksUnder {
        /// The directory as the user gave it.
        path: String,
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

// Parsing lives here rather than in config.rs, beside the variant it returns: `DeviceError` names
// `Elevator`, so the impl sits on this side to keep config.rs free of imports from its siblings.
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
