//! State files: a disk's original settings, saved before abissd changes anything, and the
//! recovery that puts them back after a daemon crashed. Each disk also has a lock file, so that
//! two daemons (or a daemon and a recovery) never work on the same disk.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::disk::{resolve_disk, Disk};
use super::error::DeviceError;
use super::plan::{plan_restore, QueueSettings};
use super::queue::DiskQueue;

/// Version of the state file layout; a file of another version is treated as corrupt.
pub(super) const STATE_FORMAT: u32 = 1;

/// What a state file holds: enough to put a disk back and to tell it is still the same disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SavedDevice {
    pub(super) format: u32,
    pub(super) disk: Disk,
    /// `diskseq` (Linux 5.15+) grows each time a disk is (re)created or a loop device attached;
    /// a different value means the disk we changed is gone.
    pub(super) diskseq: Option<u64>,
    pub(super) original: QueueSettings,
    /// The driver depth abissd was about to set, or `None` if it left the depth alone; without
    /// debugfs this is how recovery knows the depth needs putting back.
    pub(super) shrunk_to: Option<u32>,
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
                .and_then(|now| queue.apply(&plan_restore(&saved.original, saved.shrunk_to, &now)))
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

pub(super) fn devices_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("devices")
}

pub(super) fn state_file(devices_dir: &Path, number: DeviceNumber) -> PathBuf {
    devices_dir.join(format!("{number}.json"))
}

pub(super) fn create_state_dir(dir: &Path) -> Result<(), DeviceError> {
    fs::create_dir_all(dir).map_err(|source| DeviceError::StateFile {
        path: dir.to_path_buf(),
        source,
    })
}

/// Locks a disk's state against a second daemon (and recovery by one). The lock files stay:
/// removing one while another process waits on it would let two processes hold "the" lock.
pub(super) fn lock_device(devices_dir: &Path, disk: &Disk) -> Result<Flock<File>, DeviceError> {
    let path = devices_dir.join(format!("{}.lock", disk.number));
    // A link planted at the name is not followed (root would create or open its target).
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
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

pub(super) fn read_state(path: &Path) -> Result<SavedDevice, DeviceError> {
    let text = fs::read_to_string(path).map_err(|source| DeviceError::StateFile {
        path: path.to_path_buf(),
        source,
    })?;
    SavedDevice::from_json(&text).map_err(|reason| DeviceError::CorruptState {
        path: path.to_path_buf(),
        reason,
    })
}

pub(super) fn remove_state(path: &Path) -> Result<(), DeviceError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DeviceError::StateFile {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes a disk's state file so that a crash leaves either the old file or the whole new one
/// (its temporary, `<file>.tmp`, is what [`recover`] removes as a save cut short).
pub(super) fn write_state(path: &Path, saved: &SavedDevice) -> Result<(), DeviceError> {
    abiss_os::fs::write_atomically(path, saved.to_json().as_bytes()).map_err(|source| {
        DeviceError::StateFile {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::plan::DepthSource;
    use super::*;

    fn saved(shrunk_to: Option<u32>) -> SavedDevice {
        SavedDevice {
            format: STATE_FORMAT,
            disk: Disk {
                name: "sda".into(),
                number: DeviceNumber { major: 8, minor: 0 },
            },
            diskseq: Some(42),
            original: QueueSettings {
                elevator: "kyber".into(),
                nr_requests: 64,
                driver_depth: 128,
                driver_depth_source: DepthSource::Debugfs,
                iosched: BTreeMap::from([("fifo_batch".into(), "16".into())]),
                max_request_kib: Some(1280),
            },
            shrunk_to,
        }
    }

    #[test]
    fn state_files_round_trip_and_refuse_other_formats() {
        let state = saved(Some(8));
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
}
