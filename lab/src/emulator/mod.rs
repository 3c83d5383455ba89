//! The emulator process: a FUSE filesystem with one file, the disk image, whose reads and
//! writes are served by the device model.
//!
//! The FUSE session thread only timestamps each request and hands it, with its reply object,
//! on over a channel; it never blocks, so many requests can be outstanding. A data thread
//! moves the data to or from the sparse backing file in arrival order (so reads see earlier
//! writes), ahead of the modelled time: the backing file system can stall for milliseconds,
//! and that must not delay replies. The service thread alone decides the order (through a
//! [`DeviceQueue`]), keeps the device's virtual clock and sends each reply at the instant the
//! model says the request completes, less the lab's measured transport delay (see
//! [`TRANSPORT_NAME`]). A fourth thread writes the statistics. While [`UNMODELLED_NAME`] holds
//! 1, requests bypass the model: the data thread replies to them itself.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::mpsc::{self};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::MountOption;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::LabError;
use crate::model::ModelSpec;
use crate::queue::DeviceQueue;
use crate::timing::{self};

pub mod apart;
mod fuse;
mod service;

use fuse::{DataMover, DiskImageFs};
use service::{ServiceThread, StatsWriter};

/// Name of the disk image file at the root of the FUSE mount.
pub const IMAGE_NAME: &str = "disk";

/// Name of the control file at the root of the FUSE mount that holds the transport allowance
/// in nanoseconds, as decimal text.
///
/// A request spends time outside the model on its way from the loop device to the emulator and
/// back (loop worker, FUSE queue, two wake-ups): tens to hundreds of microseconds depending on
/// the machine. `up` measures it and writes it here; each reply then goes out that much before
/// the model's completion, so that the kernel, not the emulator, sees the model's timing. It
/// never moves a reply before the request's start.
pub const TRANSPORT_NAME: &str = "transport_ns";

/// Name of the control file at the root of the FUSE mount that switches the model off for
/// setting up: `1` or `0`, as decimal text (anything else is refused with `EINVAL`).
///
/// It stands for data that is already on the disk before the experiment starts: a test's
/// files, written through the loop device and its file system so that they are where the
/// kernel would put them, but without paying the model's time for it (200 MB takes 5 s at an
/// hdd's rate, for nothing the test measures). While it is 1, each request that arrives is
/// served as soon as its data has moved: it does not occupy the actuator, does not move the
/// model's head and is not recorded in the statistics, which show only modelled requests. It
/// is not for measuring anything: whoever sets it must make sure nothing else uses the disk
/// meanwhile, and bring everything it wrote to the disk before setting it back to 0.
pub const UNMODELLED_NAME: &str = "unmodelled";

/// Largest request the kernel may send, so that a loop request of up to 1 MiB reaches the
/// model as one request rather than as pieces.
const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// Real-time priorities: the service thread above the FUSE thread, both above normal work, so
/// that replies leave on time on a loaded machine.
const SERVICE_PRIORITY: i32 = 20;
const FUSE_PRIORITY: i32 = 10;
const DATA_PRIORITY: i32 = 15;

const ROOT_INO: u64 = fuser::FUSE_ROOT_ID;
const IMAGE_INO: u64 = 2;
const TRANSPORT_INO: u64 = 3;
const UNMODELLED_INO: u64 = 4;
const ATTR_TTL: Duration = Duration::from_secs(3600);

/// Everything the emulator process needs; `up` writes it as JSON into the state directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmulatorConfig {
    /// The device model.
    pub model: ModelSpec,
    /// Size of the disk image.
    pub size_bytes: u64,
    /// Sparse file holding the data.
    pub backing_path: PathBuf,
    /// Where to mount the FUSE filesystem.
    pub mountpoint: PathBuf,
    /// Per-request statistics, JSON lines.
    pub stats_path: PathBuf,
    /// Summary statistics, rewritten every second.
    pub summary_path: PathBuf,
}

/// Mounts the filesystem and serves requests until it is unmounted.
pub fn serve(config: &EmulatorConfig) -> Result<(), LabError> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&config.backing_path)
        .map_err(LabError::io(&config.backing_path))?;
    let epoch = Instant::now();
    let outstanding = Arc::new(AtomicU32::new(0));
    let transport_ns = Arc::new(AtomicU64::new(0));
    let unmodelled = Arc::new(AtomicBool::new(false));

    let (record_tx, record_rx) = mpsc::channel();
    let stats_writer = StatsWriter::create(config, epoch)?;
    let stats_thread = std::thread::Builder::new()
        .name("stats".into())
        .spawn(move || stats_writer.run(&record_rx))
        .map_err(|e| LabError::system("starting the stats thread", e))?;

    let (io_tx, io_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mover = DataMover { backing };
    let mover_thread = std::thread::Builder::new()
        .name("data".into())
        .spawn(move || mover.run(&io_rx, &ready_tx))
        .map_err(|e| LabError::system("starting the data thread", e))?;
    let service = ServiceThread {
        model: config.model.instantiate(config.size_bytes),
        queue: DeviceQueue::new(config.model.queue_depth() as usize, config.model.order()),
        rng: ChaCha8Rng::seed_from_u64(config.model.seed),
        epoch,
        outstanding: Arc::clone(&outstanding),
        transport_ns: Arc::clone(&transport_ns),
        records: record_tx,
    };
    let service_thread = std::thread::Builder::new()
        .name("service".into())
        .spawn(move || service.run(&ready_rx))
        .map_err(|e| LabError::system("starting the service thread", e))?;

    let filesystem = DiskImageFs {
        size_bytes: config.size_bytes,
        requests: io_tx,
        next_seq: 0,
        outstanding,
        transport_ns,
        unmodelled,
        created: SystemTime::now(),
    };
    let options = [
        MountOption::FSName("abiss-lab".into()),
        MountOption::Subtype("abiss-lab".into()),
        MountOption::AllowOther,
        MountOption::NoAtime,
    ];
    if !timing::make_current_thread_realtime(FUSE_PRIORITY) {
        eprintln!("abiss-lab: warning: no real-time priority; timing may suffer under load");
    }
    if !timing::lock_memory() {
        eprintln!("abiss-lab: warning: cannot lock the emulator in memory; timing may suffer");
    }
    let mut session =
        fuser::Session::new(filesystem, &config.mountpoint, &options).map_err(|e| {
            LabError::FuseUnavailable {
                reason: format!("cannot mount {}: {e}", config.mountpoint.display()),
            }
        })?;
    // Tell the parent we are serving: the image is visible from now on.
    eprintln!("abiss-lab: serving {}", config.mountpoint.display());
    let result = session.run();
    // Dropping the session drops the filesystem and with it the request channel: the service
    // thread finishes what is in flight and ends, and then the stats thread.
    drop(session);
    let _ = mover_thread.join();
    let _ = service_thread.join();
    let _ = stats_thread.join();
    result.map_err(|e| LabError::system("serving FUSE requests", e))
}

/// Path of the disk image under a FUSE mountpoint.
#[must_use]
pub fn image_path(mountpoint: &Path) -> PathBuf {
    mountpoint.join(IMAGE_NAME)
}
