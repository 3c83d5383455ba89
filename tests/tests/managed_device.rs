//! Managed devices on real loop devices: taking one sets the elevator and a shallow driver queue,
//! dropping or restoring it puts back exactly what was there, and `recover` undoes the work of a
//! daemon that was killed.
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
    recover, resolve_disk, DepthSource, DeviceConfig, DeviceError, Disk, Elevator, ManagedDevice,
    RecoveryOutcome,
};
use abiss_proto::DeviceNumber;
use abiss_tests::{require_root, wait_until, LoopDevice, Scratch};

/// Set in child processes of this binary to what they should do (see [`child_process`]).
const CHILD_ROLE: &str = "ABISS_DEVICE_TEST_CHILD_ROLE";
const CHILD_DEVICE: &str = "ABISS_DEVICE_TEST_CHILD_DEVICE";
const CHILD_STATE_DIR: &str = "ABISS_DEVICE_TEST_CHILD_STATE_DIR";
/// What a child prints once it has taken its device.
const TAKEN_MARKER: &str = "abiss-device-child: taken";
/// What an unprivileged child prints when it was refused as it should be.
const REFUSED_MARKER: &str = "abiss-device-child: refused";

/// The settings a managed device changes, read straight from sysfs and debugfs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct QueueSettings {
    scheduler: String,
    nr_requests: u32,
    /// `None` without debugfs.
    driver_depth: Option<u32>,
    /// kyber's `read_lat_nsec`, when kyber is active.
    read_lat_nsec: Option<String>,
    /// `max_sectors_kb`, the largest request.
    max_request_kib: u32,
}

/// A loop device over a /dev/shm image that is put back as it was found before it is detached.
struct TestDisk {
    found_scheduler: String,
    found_driver_depth: u32,
    found_max_request_kib: String,
    /// Whether the kernel shows the live driver depth (blk-mq's debugfs, which a kernel built
    /// without `CONFIG_BLK_DEBUG_FS` lacks). Where it does not, the depth checks are left out
    /// and said so; `lab/tests/queue_depth.rs` measures a depth by what the disk receives.
    shows_depth: bool,
    // Detached after `Drop::drop` put the queue back.
    device: LoopDevice,
}

impl TestDisk {
    fn new() -> Self {
        let device = LoopDevice::new_in("/dev/shm", 16);
        let name = device.name();
        let shown = live_driver_depth(&name);
        if shown.is_none() {
            eprintln!(
                "this kernel does not show the driver depth (no blk-mq debugfs): depth checks left out"
            );
        }
        // Without debugfs: under `none` the depth is `nr_requests`, else the allocated tags.
        let found_driver_depth = shown.unwrap_or_else(|| {
            if active_scheduler(&name) == "none" {
                read_number(&queue_file(&name, "nr_requests"))
            } else {
                read_number(&block_file(&name, "mq/0/nr_tags"))
            }
        });
        Self {
            found_scheduler: active_scheduler(&name),
            found_driver_depth,
            found_max_request_kib: read(&queue_file(&name, "max_sectors_kb")),
            shows_depth: shown.is_some(),
            device,
        }
    }

    /// Asserts that `settings` show driver depth `expected`, where the kernel shows it.
    fn assert_depth(&self, settings: &QueueSettings, expected: u32, what: &str) {
        if self.shows_depth {
            assert_eq!(settings.driver_depth, Some(expected), "{what}");
        }
    }

    fn name(&self) -> String {
        self.device.name()
    }

    fn spec(&self) -> String {
        self.device.path().to_string_lossy().into_owned()
    }

    fn number(&self) -> DeviceNumber {
        self.device.number()
    }

    fn disk(&self) -> Disk {
        Disk {
            name: self.name(),
            number: self.number(),
        }
    }

    /// Gives the device settings no default has: kyber with depth 100 and its own read latency
    /// target over a driver depth of 100, and requests of up to 1000 KiB (above abissd's cap).
    fn prepare(&self) -> QueueSettings {
        self.set_driver_depth(100);
        write(&queue_file(&self.name(), "max_sectors_kb"), "1000");
        self.device.set_scheduler("kyber");
        write(&queue_file(&self.name(), "nr_requests"), "100");
        write(
            &queue_file(&self.name(), "iosched/read_lat_nsec"),
            "3000000",
        );
        let prepared = self.settings();
        assert_eq!(prepared.scheduler, "kyber");
        assert_eq!(prepared.nr_requests, 100);
        assert_eq!(prepared.read_lat_nsec.as_deref(), Some("3000000"));
        assert_eq!(prepared.max_request_kib, 1000);
        self.assert_depth(&prepared, 100, "prepared driver depth");
        prepared
    }

    /// Sets the driver depth under scheduler `none` (and leaves `none` selected). The kernel
    /// ignores a write of the value already shown, so step through a neighbour.
    fn set_driver_depth(&self, depth: u32) {
        self.device.set_scheduler("none");
        let nr_requests = queue_file(&self.name(), "nr_requests");
        write(&nr_requests, &(depth - 1).to_string());
        write(&nr_requests, &depth.to_string());
    }

    fn settings(&self) -> QueueSettings {
        let name = self.name();
        let scheduler = active_scheduler(&name);
        QueueSettings {
            read_lat_nsec: (scheduler == "kyber")
                .then(|| read(&queue_file(&name, "iosched/read_lat_nsec"))),
            scheduler,
            nr_requests: read_number(&queue_file(&name, "nr_requests")),
            driver_depth: live_driver_depth(&name),
            max_request_kib: read_number(&queue_file(&name, "max_sectors_kb")),
        }
    }
}

impl Drop for TestDisk {
    fn drop(&mut self) {
        let name = self.name();
        let nr_requests = queue_file(&name, "nr_requests");
        let _ = std::fs::write(queue_file(&name, "scheduler"), "none");
        let _ = std::fs::write(&nr_requests, (self.found_driver_depth + 1).to_string());
        let _ = std::fs::write(&nr_requests, self.found_driver_depth.to_string());
        let _ = std::fs::write(queue_file(&name, "scheduler"), &self.found_scheduler);
        let _ = std::fs::write(
            queue_file(&name, "max_sectors_kb"),
            &self.found_max_request_kib,
        );
    }
}

fn block_file(name: &str, file: &str) -> PathBuf {
    Path::new("/sys/block").join(name).join(file)
}

fn queue_file(name: &str, file: &str) -> PathBuf {
    block_file(name, "queue").join(file)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
        .trim()
        .to_owned()
}

fn read_number(path: &Path) -> u32 {
    read(path).parse().expect("a number")
}

fn write(path: &Path, value: &str) {
    std::fs::write(path, value)
        .unwrap_or_else(|error| panic!("write {value} to {}: {error}", path.display()));
}

fn active_scheduler(name: &str) -> String {
    let line = read(&queue_file(name, "scheduler"));
    let start = line.find('[').expect("an active scheduler") + 1;
    let end = line.find(']').expect("an active scheduler");
    line[start..end].to_owned()
}

/// The live driver tag depth, read as the kernel shows it (blk-mq's debugfs, mounted privately
/// when nobody mounted it), so every test checks the depth on a fresh machine too.
fn live_driver_depth(name: &str) -> Option<u32> {
    abiss_os::blk_mq::driver_tag_depth(name).map(|(depth, _)| depth)
}

/// mq-deadline, which every kernel abissd runs on has (bfq may be missing), over a depth of 8:
/// both differ from what `TestDisk::prepare` sets.
fn deadline_over_8() -> DeviceConfig {
    DeviceConfig {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 8,
    }
}

fn state_files(state: &Scratch) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(state.path().join("devices")) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

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
fn partitions_resolve_to_their_whole_disk() {
    require_root!();
    let disk = PartitionedLoop::new();
    let partition = format!("{}p1", disk.name);
    let partition_path = format!("/dev/{partition}");
    let partition_number = read(&Path::new("/sys/class/block").join(&partition).join("dev"));
    let whole = Disk {
        name: disk.name.clone(),
        number: read(&block_file(&disk.name, "dev"))
            .parse()
            .expect("number"),
    };
    for spec in [&partition, &partition_path, &partition_number] {
        assert_eq!(resolve_disk(spec).expect("resolve"), whole, "{spec}");
    }

    let state = Scratch::new_in("/tmp", "device-state-partition");
    // Not the elevator the take selects, so that the take shows.
    let untouched = active_scheduler(&disk.name);
    write(&queue_file(&disk.name, "scheduler"), "kyber");
    let found_scheduler = active_scheduler(&disk.name);
    let managed =
        ManagedDevice::take(&partition_path, &deadline_over_8(), state.path()).expect("take");
    assert_eq!(managed.disk(), &whole);
    assert_eq!(active_scheduler(&disk.name), "mq-deadline");
    drop(managed);
    assert_eq!(active_scheduler(&disk.name), found_scheduler);
    write(&queue_file(&disk.name, "scheduler"), &untouched);
}

#[test]
fn unknown_devices_non_block_files_and_bad_settings_are_refused() {
    require_root!();
    let state = Scratch::new_in("/tmp", "device-state-refused");
    let take = |spec: &str, config: &DeviceConfig| {
        ManagedDevice::take(spec, config, state.path()).expect_err("refused")
    };

    let error = take("abiss-no-such-disk", &DeviceConfig::default());
    assert!(
        matches!(error, DeviceError::UnknownDevice { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("abiss-no-such-disk"), "{error}");
    let error = take("4095:1048575", &DeviceConfig::default());
    assert!(
        matches!(error, DeviceError::UnknownDevice { .. }),
        "{error}"
    );
    let error = take("/dev/null", &DeviceConfig::default());
    assert!(
        matches!(error, DeviceError::NotABlockDevice { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("/dev/null"), "{error}");

    let error = "kyber".parse::<Elevator>().unwrap_err();
    assert!(
        matches!(error, DeviceError::UnknownElevator { .. }),
        "{error}"
    );
    let disk = TestDisk::new();
    let shallow = DeviceConfig {
        dispatch_depth: 2,
        ..DeviceConfig::default()
    };
    let error = take(&disk.spec(), &shallow);
    assert!(
        matches!(error, DeviceError::DispatchDepthTooSmall { depth: 2 }),
        "{error}"
    );

    // zram is bio-based: no request queue, no elevator.
    if Path::new("/sys/block/zram0").exists() {
        let error = take("zram0", &DeviceConfig::default());
        assert!(
            matches!(error, DeviceError::NoElevatorQueue { .. }),
            "{error}"
        );
    }
    assert!(state_files(&state).is_empty(), "a refusal saves nothing");
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

/// A loop device whose image holds an MBR with one partition, attached with partition scanning.
/// Kernels without the MBR parser (`CONFIG_MSDOS_PARTITION`) get the partition from `partx`,
/// which reads the table itself and adds it with the BLKPG ioctl.
struct PartitionedLoop {
    name: String,
    _dir: Scratch,
}

impl PartitionedLoop {
    fn new() -> Self {
        const SECTOR: usize = 512;
        const SECTORS: u32 = 32 * 2048;
        const FIRST: u32 = 2048;
        let dir = Scratch::new_in("/dev/shm", "partitioned");
        let image = dir.path().join("disk.img");
        let mut mbr = vec![0_u8; SECTOR];
        // One Linux partition from sector 2048 to the end: status, CHS start, type, CHS end,
        // LBA start, sector count.
        let entry = &mut mbr[446..462];
        entry[4] = 0x83;
        entry[8..12].copy_from_slice(&FIRST.to_le_bytes());
        entry[12..16].copy_from_slice(&(SECTORS - FIRST).to_le_bytes());
        mbr[510] = 0x55;
        mbr[511] = 0xaa;
        std::fs::write(&image, &mbr).expect("write MBR");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .and_then(|file| file.set_len(u64::from(SECTORS) * SECTOR as u64))
            .expect("size image");
        let output = Command::new("losetup")
            .args(["--find", "--show", "--partscan"])
            .arg(&image)
            .output()
            .expect("run losetup");
        assert!(
            output.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        let name = path.trim_start_matches("/dev/").to_owned();
        let disk = Self { name, _dir: dir };
        let partition = format!("/dev/{}p1", disk.name);
        let appeared = || {
            Path::new(&partition).exists()
                && Path::new("/sys/class/block")
                    .join(format!("{}p1", disk.name))
                    .exists()
        };
        if !wait_until(Duration::from_millis(500), appeared) {
            let status = Command::new("partx")
                .args(["--add", &path])
                .status()
                .expect("run partx");
            assert!(status.success(), "partx --add {path} failed");
        }
        assert!(
            wait_until(Duration::from_secs(5), appeared),
            "{partition} did not appear"
        );
        disk
    }
}

impl Drop for PartitionedLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .arg("-d")
            .arg(format!("/dev/{}", self.name))
            .status();
    }
}
