//! The loop device's queue, and taking a lab down: everything `up` made, found from the state
//! file or, after a crash, from what the lab owns.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::LabError;
use crate::system;

use super::{emulator_processes, LabState, ProcessId, MIN_DISPATCH_DEPTH};

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

/// Puts a loop device's queue back as a new loop device has it: no scheduler, and the driver
/// depth the loop driver allocated. A loop device keeps its queue after it is detached, so a
/// lab that left its depth of 4 behind handed it to whoever attached the device next (a test's
/// disk found at 4 where a new one has 128, and restored to 4).
fn reset_queue(device: &Path) -> Result<(), LabError> {
    let sysfs = system::sysfs_block(device);
    let queue = sysfs.join("queue");
    let tags_file = sysfs.join("mq/0/nr_tags");
    let shown = system::read_attr(&tags_file)?;
    let allocated: u32 = shown.parse().map_err(|_| {
        LabError::system(
            format!("reading {}", tags_file.display()),
            format!("not a number: {shown:?}"),
        )
    })?;
    system::write_attr(&queue.join("scheduler"), "none")?;
    // Just after a scheduler is switched off, `nr_requests` shows the allocated depth whatever
    // the live one is, and the kernel ignores a write of the value it shows (and refuses one
    // above the allocated tags): a step down to the neighbour first makes the wanted value a
    // change.
    if allocated > MIN_DISPATCH_DEPTH
        && system::read_attr(&queue.join("nr_requests"))? == allocated.to_string()
    {
        system::write_attr(&queue.join("nr_requests"), &(allocated - 1).to_string())?;
    }
    system::write_attr(&queue.join("nr_requests"), &allocated.to_string())
}

/// Puts a loop device's queue back ([`reset_queue`]) and detaches it; says what it removed.
fn detach(device: &Path) -> Result<String, LabError> {
    let dev = device.to_string_lossy().into_owned();
    if let Err(error) = reset_queue(device) {
        eprintln!("abiss-lab: {dev}'s queue keeps the lab's settings: {error}");
    }
    system::run("losetup", &["-d", &dev])?;
    Ok(format!("loop device {dev}"))
}

/// The driver tag depth of a device, as blk-mq shows it in debugfs (mounted privately when
/// nobody mounted it).
#[must_use]
pub fn driver_tag_depth(device: &Path) -> Option<u32> {
    let name = device.file_name()?.to_string_lossy().into_owned();
    abiss_os::blk_mq::driver_tag_depth(&name).map(|(depth, _)| depth)
}

pub(super) fn take_down(state_dir: &Path) -> Result<Vec<String>, LabError> {
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
        removed.push(detach(device)?);
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
