//! Which devices abissd may manage: a partition resolves to its whole disk (by name, path or
//! number) and taking it takes the disk; unknown devices, files that are not block devices,
//! unknown elevators, too shallow a dispatch depth and queues without an elevator are refused,
//! and a refusal saves nothing. The loop device is put back as it was found (see
//! `tests/managed_device.rs`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use abiss_daemon::disk::device::{
    resolve_disk, DeviceConfig, DeviceError, Disk, Elevator, ManagedDevice,
};
use abiss_tests::{attach_loop, require_root, wait_until, Scratch};

// A test file is the root of its crate, so a module it shares is named by its path; each
// file uses part of it.
#[path = "managed_device/queue.rs"]
#[allow(dead_code)]
mod queue;

use queue::{
    active_scheduler, block_file, deadline_over_8, queue_file, read, state_files, write, TestDisk,
};

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
        let path = attach_loop(&image, "--partscan")
            .to_string_lossy()
            .into_owned();
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
