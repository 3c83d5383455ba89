//! Managed block devices: elevator and dispatch depth while streams are active, restored on exit.
//!
//! ABISS priorities are decided by the elevator, and an elevator can only order the requests it
//! still holds: whatever the driver has already accepted is out of its hands. So a managed disk
//! gets an elevator that honours I/O priorities (`bfq` or `mq-deadline`) and a shallow driver
//! queue (the *dispatch depth*). The kernel sets that depth through `queue/nr_requests`, which
//! sizes the driver tags only while the scheduler is `none`; the depth stays when an elevator is
//! selected afterwards (verified on Linux 6.18). So taking a disk writes, in order: the largest
//! request down to [`REQUEST_CAP_KIB`] where larger (a refused write is logged, not fatal),
//! scheduler `none`, `nr_requests` = dispatch depth, then the elevator, and with mq-deadline its
//! `write_expire` down to [`WRITE_EXPIRE_MS`].
//!
//! Every setting is saved to a state file before anything changes, and put back on drop; a
//! daemon that crashed leaves the file behind, and [`recover`] restores from it on the next start.
//! Requires root (the sysfs files are root's). The live driver depth is shown by the kernel only
//! in debugfs; where nobody mounted it, it is read through a private mount that the system never
//! sees (`abiss_os::blk_mq`). Without debugfs in the kernel at all, `nr_requests` under `none`
//! and then the allocated tags stand in, and a depth someone shrank under an active elevator
//! cannot be known.
//!
//! The modules, each importing only those listed before it:
//! - `config`: the [`Elevator`] and [`DeviceConfig`] a disk is taken with, chosen from the
//!   command line's [`DeviceOptions`] by the disk's kind;
//! - `error`: [`DeviceError`];
//! - `sysfs`: reading and writing one-value sysfs files;
//! - `disk`: resolving what users type to the whole [`Disk`];
//! - `plan`: the sysfs writes that take and restore a disk, planned from settings alone;
//! - `queue`: a disk's queue in sysfs and debugfs, read and written;
//! - `state`: state files, lock files and [`recover`];
//! - this one: [`ManagedDevice`], which ties them together.

mod config;
mod disk;
mod error;
mod plan;
mod queue;
mod state;
mod sysfs;

use std::fs::File;
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use nix::fcntl::Flock;
use scheduler_common::MonotonicNs;
use serde::Serialize;

pub use config::{
    DeviceConfig, DeviceOptions, Elevator, ROTATIONAL_DISPATCH_DEPTH, SOLID_STATE_DISPATCH_DEPTH,
};
pub(crate) use disk::{resolve_client_disk, resolve_disks};
pub use disk::{resolve_disk, Disk};
pub use error::DeviceError;
pub use plan::{DepthSource, REQUEST_CAP_KIB, WRITE_EXPIRE_MS};
pub use state::{recover, RecoveryOutcome};
pub(crate) use sysfs::SYSFS;

use config::MIN_DISPATCH_DEPTH;

use plan::{plan_restore, plan_take, QueueWrite};
use queue::DiskQueue;
use state::{
    create_state_dir, devices_dir, lock_device, read_state, remove_state, state_file, write_state,
    SavedDevice, STATE_FORMAT,
};

/// How often `status` reads a disk's live driver depth; between, it shows the last one read.
/// Where nobody mounted debugfs, a read mounts it privately (a thread, a mount namespace, a
/// mount), and any user may ask for `status` as often as they like (issue 33): so that work
/// is at most once per managed disk in this long, however many ask.
pub(crate) const STATUS_DEPTH_EVERY_NS: u64 = 5_000_000_000;

/// A disk abissd manages; dropping it puts the original settings back.
#[derive(Debug)]
pub struct ManagedDevice {
    disk: Disk,
    queue: DiskQueue,
    saved: SavedDevice,
    state_file: PathBuf,
    restored: bool,
    /// The live driver depth `status` last read, and when ([`STATUS_DEPTH_EVERY_NS`]).
    status_depth: std::sync::Mutex<Option<(MonotonicNs, Option<u32>)>>,
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

/// Whether the kernel treats `disk` as rotational (`queue/rotational`); a disk that does not
/// say is taken as solid state.
#[must_use]
pub fn is_rotational(disk: &Disk) -> bool {
    DiskQueue::of(disk).rotational()
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
                queue.apply(&plan_restore(
                    &saved.original,
                    saved.shrunk_to,
                    &queue.now()?,
                ))?;
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
        write_state(&state_file, &saved)?;
        let device = Self {
            disk,
            queue,
            saved,
            state_file,
            restored: false,
            status_depth: std::sync::Mutex::new(None),
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

    /// Its state file.
    #[must_use]
    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// The disk's settings now, read from sysfs (and blk-mq's debugfs for the depth).
    pub fn status(&self) -> Result<DeviceStatus, DeviceError> {
        let (dispatch_depth, dispatch_depth_source) = match self.live_depth_for_status() {
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

    /// The live driver depth, read at most every [`STATUS_DEPTH_EVERY_NS`].
    fn live_depth_for_status(&self) -> Option<u32> {
        let now = abiss_os::clock::monotonic_now();
        let mut last = self
            .status_depth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match *last {
            Some((at, depth)) if now.saturating_since(at) < STATUS_DEPTH_EVERY_NS => depth,
            _ => {
                let depth = self.queue.live_driver_depth();
                *last = Some((now, depth));
                depth
            }
        }
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
        self.queue.apply(&plan_restore(
            &self.saved.original,
            self.saved.shrunk_to,
            &now,
        ))?;
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

/// Asks the kernel to load an elevator's module, as writing its name to a scheduler file would.
/// Whether it worked shows in the scheduler lines afterwards.
fn load_elevator(elevator: Elevator) -> bool {
    std::process::Command::new("modprobe")
        .arg("-q")
        .arg(format!("{}-iosched", elevator.module()))
        .status()
        .is_ok_and(|status| status.success())
}
