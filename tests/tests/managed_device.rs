//! Managed devices on real loop devices: taking one sets the elevator and a shallow driver queue
//! (abissd's depth by the disk's kind), dropping or restoring it puts back exactly what was
//! there, and `recover` undoes the work of a daemon that was killed. Which devices may be taken at all is in
//! `tests/managed_device_specs.rs`.
//!
//! Each test first gives its loop device settings no kernel default has (kyber with a latency
//! target of its own, over a driver depth of 100, requests of up to 1000 KiB), so "restored"
//! cannot pass by accident, and puts the device back as it found it before detaching it: a
//! loop device's queue outlives its attachment. On a kernel without blk-mq debugfs the live
//! driver depth cannot be read, so there the depth is not compared (see `TestDisk`).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use abiss_daemon::disk::device::{
    recover, DepthSource, DeviceConfig, DeviceError, Elevator, ManagedDevice, RecoveryOutcome,
};
use abiss_tests::{require_root, Scratch};

// A test file is the root of its crate, so a module it shares is named by its path; each
// file uses part of it.
#[path = "managed_device/queue.rs"]
#[allow(dead_code)]
mod queue;

use queue::{block_file, deadline_over_8, queue_file, read, read_number, state_files, TestDisk};

/// Set in child processes of this binary to what they should do (see [`child_process`]).
const CHILD_ROLE: &str = "ABISS_DEVICE_TEST_CHILD_ROLE";

const CHILD_DEVICE: &str = "ABISS_DEVICE_TEST_CHILD_DEVICE";

const CHILD_STATE_DIR: &str = "ABISS_DEVICE_TEST_CHILD_STATE_DIR";

/// What a child prints once it has taken its device.
const TAKEN_MARKER: &str = "abiss-device-child: taken";

/// What an unprivileged child prints when it was refused as it should be.
const REFUSED_MARKER: &str = "abiss-device-child: refused";

#[test]
fn take_selects_the_elevator_over_a_shallow_driver_queue_and_drop_restores() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-drop");

    let managed =
        ManagedDevice::take(&disk.spec(), &deadline_over_8(), state.path()).expect("take");
    let taken = disk.settings();
    assert_eq!(taken.scheduler, "mq-deadline");
    disk.assert_depth(&taken, 8, "live driver depth while managed");
    assert_eq!(
        taken.max_request_kib,
        abiss_daemon::disk::device::REQUEST_CAP_KIB,
        "requests capped while managed"
    );
    assert_eq!(
        read(&queue_file(&disk.name(), "iosched/write_expire")).trim(),
        abiss_daemon::disk::device::WRITE_EXPIRE_MS.to_string(),
        "a best-effort write waits half a second at most while managed"
    );
    let status = managed.status().expect("status");
    assert_eq!(status.name, disk.name());
    assert_eq!(status.number, disk.number());
    assert_eq!(status.elevator, "mq-deadline");
    assert_eq!(status.dispatch_depth, 8);
    assert_eq!(status.original_elevator, "kyber");
    if disk.shows_depth {
        assert_eq!(status.original_dispatch_depth, 100);
    } else {
        // Without debugfs abissd can only read the allocated tags of a queue under an
        // elevator (the depth it puts back is then theirs), and says the live depth is what
        // it wrote.
        assert_eq!(
            status.original_dispatch_depth,
            read_number(&block_file(&disk.name(), "mq/0/nr_tags"))
        );
        assert_eq!(status.dispatch_depth_source, DepthSource::Written);
    }
    let state_file = managed.state_file().to_path_buf();
    assert_eq!(
        state_file,
        state
            .path()
            .join("devices")
            .join(format!("{}.json", disk.number()))
    );
    assert!(state_file.exists(), "settings are saved while managed");

    drop(managed);
    assert_eq!(disk.settings(), before, "drop restores every setting");
    assert!(!state_file.exists(), "drop removes the state file");
}

#[test]
fn explicit_restore_puts_back_mq_deadline_settings_taken_by_number() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-restore");
    let config = DeviceConfig {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 4,
    };

    let managed =
        ManagedDevice::take(&disk.number().to_string(), &config, state.path()).expect("take");
    assert_eq!(managed.disk(), &disk.disk());
    let taken = disk.settings();
    assert_eq!(taken.scheduler, "mq-deadline");
    disk.assert_depth(&taken, 4, "live driver depth while managed");

    managed.restore().expect("restore");
    assert_eq!(disk.settings(), before);
    assert!(state_files(&state).is_empty());
}

#[test]
fn taking_never_deepens_a_shallow_driver_queue() {
    require_root!();
    let disk = TestDisk::new();
    disk.set_driver_depth(6);
    let before = disk.settings();
    let state = Scratch::new_in("/tmp", "device-state-shallow");
    let config = DeviceConfig {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 16,
    };

    let mounted_before = abiss_os::blk_mq::debugfs_mounted().expect("mounts");
    let managed = ManagedDevice::take(&disk.name(), &config, state.path()).expect("take");
    let taken = disk.settings();
    assert_eq!(taken.scheduler, "mq-deadline");
    disk.assert_depth(&taken, 6, "a depth below the configured one stays");
    drop(managed);
    assert_eq!(disk.settings(), before);
    assert_eq!(
        abiss_os::blk_mq::debugfs_mounted().expect("mounts"),
        mounted_before,
        "reading the depth leaves the system's mounts as they were"
    );
}

#[test]
fn recover_restores_the_settings_of_a_killed_daemon() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-crash");

    let mut child = child_command("take", &disk.spec(), state.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start child");
    let stdout = child.stdout.take().expect("child stdout");
    let taken = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.contains(TAKEN_MARKER));
    // SIGKILL: no destructor runs, as in a crash.
    child.kill().expect("kill child");
    child.wait().expect("reap child");
    assert!(taken, "the child did not take the device");
    let managed = disk.settings();
    assert_eq!(
        managed.scheduler, "mq-deadline",
        "the killed daemon's elevator stays"
    );
    disk.assert_depth(&managed, 8, "the killed daemon's depth stays");
    assert_eq!(
        state_files(&state).len(),
        1,
        "the killed daemon leaves its state file"
    );

    let outcomes = recover(state.path()).expect("recover");
    assert!(
        matches!(outcomes.as_slice(), [RecoveryOutcome::Restored { disk: d }] if *d == disk.disk()),
        "{outcomes:?}"
    );
    assert_eq!(disk.settings(), before, "recover restores every setting");
    assert!(state_files(&state).is_empty());
    assert!(recover(state.path()).expect("recover again").is_empty());
}

#[test]
fn recover_drops_files_of_gone_or_replaced_disks_and_sets_corrupt_ones_aside() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-stale-files");
    let managed =
        ManagedDevice::take(&disk.spec(), &deadline_over_8(), state.path()).expect("take");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(managed.state_file()).expect("read state"))
            .expect("state is JSON");
    managed.restore().expect("restore");
    let devices = state.path().join("devices");

    // A number no disk has, and the real disk with another diskseq (as after a re-attach).
    let mut gone = saved.clone();
    gone["disk"]["number"]["minor"] = 1_048_000.into();
    std::fs::write(devices.join("a-gone.json"), gone.to_string()).expect("write");
    let mut replaced = saved.clone();
    let diskseq = replaced["diskseq"]
        .as_u64()
        .expect("loop devices have a diskseq");
    replaced["diskseq"] = (diskseq + 1000).into();
    std::fs::write(devices.join("b-replaced.json"), replaced.to_string()).expect("write");
    std::fs::write(devices.join("c-corrupt.json"), "{\"format\": 1, \"dis").expect("write");

    let outcomes = recover(state.path()).expect("recover");
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    assert!(
        matches!(&outcomes[0], RecoveryOutcome::DeviceGone { disk: d } if d.number.minor == 1_048_000),
        "{}",
        outcomes[0]
    );
    assert!(
        matches!(&outcomes[1], RecoveryOutcome::DeviceReplaced { disk: d } if *d == disk.disk()),
        "{}",
        outcomes[1]
    );
    let RecoveryOutcome::Corrupt { moved_to, reason } = &outcomes[2] else {
        panic!("not reported corrupt: {}", outcomes[2]);
    };
    assert!(!reason.is_empty());
    assert_eq!(moved_to, &devices.join("c-corrupt.json.corrupt"));
    assert!(moved_to.exists());
    assert!(state_files(&state).is_empty());
    assert_eq!(disk.settings(), before, "a replaced disk is left alone");
    for outcome in &outcomes {
        eprintln!("{outcome}");
    }
}

#[test]
fn a_managed_disk_is_neither_taken_twice_nor_recovered_under_its_daemon() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-twice");
    let managed =
        ManagedDevice::take(&disk.spec(), &deadline_over_8(), state.path()).expect("take");

    let error = ManagedDevice::take(&disk.name(), &deadline_over_8(), state.path()).unwrap_err();
    assert!(
        matches!(error, DeviceError::AlreadyManaged { .. }),
        "{error}"
    );
    let outcomes = recover(state.path()).expect("recover");
    assert!(
        matches!(outcomes.as_slice(), [RecoveryOutcome::InUse { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(
        disk.settings().scheduler,
        "mq-deadline",
        "the daemon's settings stay"
    );

    drop(managed);
    assert_eq!(disk.settings(), before);
}

#[test]
fn an_unprivileged_daemon_is_refused_before_anything_changes() {
    require_root!();
    let disk = TestDisk::new();
    let before = disk.prepare();
    let state = Scratch::new_in("/tmp", "device-state-unprivileged");

    let output = child_command("unprivileged", &disk.spec(), state.path())
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run child as nobody");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains(REFUSED_MARKER),
        "child: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!state.path().join("devices").exists(), "nothing was saved");
    assert_eq!(disk.settings(), before);
}

/// This test binary, run again to do one thing (`role`) in a process of its own.
fn child_command(role: &str, device: &str, state_dir: &Path) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("own path"));
    command
        .args([
            "child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ROLE, role)
        .env(CHILD_DEVICE, device)
        .env(CHILD_STATE_DIR, state_dir);
    command
}

/// Not a test of its own: the body of the child processes started by [`child_command`]. Does
/// nothing unless [`CHILD_ROLE`] is set.
#[test]
fn child_process() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    let device = std::env::var(CHILD_DEVICE).expect("child device");
    let state_dir = PathBuf::from(std::env::var_os(CHILD_STATE_DIR).expect("child state dir"));
    match role.as_str() {
        "take" => {
            let managed =
                ManagedDevice::take(&device, &deadline_over_8(), &state_dir).expect("take");
            println!("{TAKEN_MARKER}");
            // Killed by the parent long before this ends; never restores.
            std::thread::sleep(Duration::from_secs(60));
            std::mem::forget(managed);
        }
        "unprivileged" => match ManagedDevice::take(&device, &deadline_over_8(), &state_dir) {
            Err(DeviceError::PermissionDenied { path }) => {
                println!("{REFUSED_MARKER}: {}", path.display());
            }
            other => panic!("expected a permission error, got {other:?}"),
        },
        other => panic!("unknown child role {other}"),
    }
}

/// The disk's own readahead survives abissd: capping the request size commits new queue limits,
/// and the kernel then recomputes the readahead from the disk's optimal I/O size (on the lab's
/// disk, over a FUSE image, 128 KiB becomes 1 MiB); abissd puts it back, while it manages the disk
/// and when it lets go.
#[test]
fn the_disks_own_readahead_survives_the_take_and_the_restore() {
    require_root!();
    let lab = abiss_tests::HddLab::up("readahead", 1, "none");
    let device = lab.device().to_string_lossy().into_owned();
    let name = lab
        .device()
        .file_name()
        .expect("a device name")
        .to_string_lossy()
        .into_owned();
    let read_ahead = block_file(&name, "queue/read_ahead_kb");
    let max_sectors = block_file(&name, "queue/max_sectors_kb");
    // Requests larger than the cap, as a disk of its own would take, so abissd caps them.
    let original_max = read_number(&max_sectors);
    let wide = read_number(&block_file(&name, "queue/max_hw_sectors_kb")).min(1024);
    assert!(
        wide > abiss_daemon::disk::device::REQUEST_CAP_KIB,
        "the lab disk takes requests over the cap"
    );
    std::fs::write(&max_sectors, wide.to_string()).expect("widen requests");
    // The test can fail: on this disk a new request size does reset the readahead.
    std::fs::write(&read_ahead, "128").expect("set readahead");
    std::fs::write(&max_sectors, "512").expect("cap requests");
    let reset = read_number(&read_ahead);
    std::fs::write(&max_sectors, wide.to_string()).expect("widen requests");
    std::fs::write(&read_ahead, "128").expect("set readahead");
    assert_ne!(reset, 128, "a new request size resets the readahead here");

    let state = Scratch::new_in("/tmp", "device-state-readahead");
    let managed = ManagedDevice::take(&device, &deadline_over_8(), state.path()).expect("take");
    assert_eq!(
        read_number(&max_sectors),
        512,
        "requests capped while managed"
    );
    assert_eq!(
        read_number(&read_ahead),
        128,
        "readahead kept while managed"
    );
    drop(managed);
    assert_eq!(read_number(&max_sectors), wide, "request size restored");
    assert_eq!(
        read_number(&read_ahead),
        128,
        "readahead kept after the restore"
    );
    std::fs::write(&max_sectors, original_max.to_string()).expect("put the lab disk back");
}

/// Sets a loop device's `queue/rotational` for as long as it lives, and puts back what it had
/// (a loop device's queue outlives its attachment).
struct Rotational {
    file: PathBuf,
    before: String,
}

impl Rotational {
    fn set(device: &abiss_tests::LoopDevice, rotational: bool) -> Self {
        let file = queue_file(&device.name(), "rotational");
        let before = read(&file);
        std::fs::write(&file, if rotational { "1" } else { "0" }).expect("set rotational");
        Self { file, before }
    }
}

impl Drop for Rotational {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.before);
    }
}

/// The dispatch depth of each disk abissd manages, by name, as its `status` says.
fn depths(daemon: &abiss_tests::Daemon) -> Vec<(String, u32)> {
    let abiss_proto::Response::Devices(status) =
        daemon.connect().call(abiss_proto::Request::Status)
    else {
        panic!("no status");
    };
    status
        .devices
        .into_iter()
        .map(|device| (device.name, device.dispatch_depth))
        .collect()
}

/// abissd takes a rotational disk at the kernel's least depth and any other at 8, as the
/// kernel's `queue/rotational` says, unless `--dispatch-depth` names one depth for all.
#[test]
fn abissd_takes_a_rotational_disk_at_the_least_depth_and_others_deeper() {
    require_root!();
    let spinning = abiss_tests::LoopDevice::new_in("/tmp", 64);
    let solid = abiss_tests::LoopDevice::new_in("/tmp", 64);
    let _spinning_flag = Rotational::set(&spinning, true);
    let _solid_flag = Rotational::set(&solid, false);
    let both = [
        "--device".to_owned(),
        solid.path().to_string_lossy().into_owned(),
    ];
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    let mut chosen = abiss_tests::Daemon::start_managing(spinning.path(), &both);
    let mut expected = vec![(spinning.name(), 4), (solid.name(), 8)];
    expected.sort();
    let mut seen = depths(&chosen);
    seen.sort();
    assert_eq!(seen, expected, "by kind");
    assert_eq!(chosen.stop(), Some(0));

    let given: Vec<&str> = both
        .iter()
        .copied()
        .chain(["--dispatch-depth", "6"])
        .collect();
    let mut named = abiss_tests::Daemon::start_managing(spinning.path(), &given);
    let mut seen = depths(&named);
    seen.sort();
    let mut expected = vec![(spinning.name(), 6), (solid.name(), 6)];
    expected.sort();
    assert_eq!(seen, expected, "--dispatch-depth 6 for all");
    assert_eq!(named.stop(), Some(0));
}
