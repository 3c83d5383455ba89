//! Bringing a lab up: the backing file, the emulator process serving it, the loop device
//! over it, the transport calibrated, the file system made and mounted; and what the emulator
//! records for `up` to read.

use std::fs::{File, OpenOptions};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::emulator::EmulatorConfig;
use crate::error::LabError;
use crate::stats::StatsCursor;
use crate::system;

use super::take_down::configure_queue;
use super::{
    FilesystemKind, LabOptions, LabState, ProcessId, EMULATOR_CONFIG_FILE, EMULATOR_FAILURE_FILE,
    EMULATOR_PID_FILE, READY_TIMEOUT,
};

pub(super) fn bring_up(state: &mut LabState, options: &LabOptions) -> Result<(), LabError> {
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

pub(super) fn make_and_mount(
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
pub(super) fn unmodelled_control(fuse_mountpoint: &Path) -> PathBuf {
    fuse_mountpoint.join(crate::emulator::UNMODELLED_NAME)
}

/// Switches the model of the emulator whose FUSE file system is at `fuse_mountpoint` off or
/// back on (see [`Lab::set_unmodelled`]).
pub(super) fn set_unmodelled(fuse_mountpoint: &Path, unmodelled: bool) -> Result<(), LabError> {
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
pub(super) const CALIBRATION_READS: u64 = 64;

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
pub(super) fn calibrate_transport(state: &LabState, device: &Path) -> Result<u64, LabError> {
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
pub(super) fn start_emulator(state: &LabState, exe: &Path) -> Result<ProcessId, LabError> {
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
pub(super) fn emulator_failure(state: &LabState) -> LabError {
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
