//! What the managed-device tests share: a loop device put back as it was found
//! ([`TestDisk`]), its queue's settings read and written through sysfs, and the state files a
//! take leaves. Included by `tests/managed_device.rs` and `tests/managed_device_specs.rs`.

use std::path::{Path, PathBuf};

use abiss_daemon::disk::device::{DeviceConfig, Disk, Elevator};
use abiss_proto::DeviceNumber;
use abiss_tests::{LoopDevice, Scratch};

/// The settings a managed device changes, read straight from sysfs and debugfs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueueSettings {
    pub(crate) scheduler: String,
    pub(crate) nr_requests: u32,
    /// `None` without debugfs.
    pub(crate) driver_depth: Option<u32>,
    /// kyber's `read_lat_nsec`, when kyber is active.
    pub(crate) read_lat_nsec: Option<String>,
    /// `max_sectors_kb`, the largest request.
    pub(crate) max_request_kib: u32,
}

/// A loop device over a /dev/shm image that is put back as it was found before it is detached.
pub(crate) struct TestDisk {
    found_scheduler: String,
    found_driver_depth: u32,
    found_max_request_kib: String,
    /// Whether the kernel shows the live driver depth (blk-mq's debugfs, which a kernel built
    /// without `CONFIG_BLK_DEBUG_FS` lacks). Where it does not, the depth checks are left out
    /// and said so; `lab/tests/queue_depth.rs` measures a depth by what the disk receives.
    pub(crate) shows_depth: bool,
    // Detached after `Drop::drop` put the queue back.
    device: LoopDevice,
}

impl TestDisk {
    pub(crate) fn new() -> Self {
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
    pub(crate) fn assert_depth(&self, settings: &QueueSettings, expected: u32, what: &str) {
        if self.shows_depth {
            assert_eq!(settings.driver_depth, Some(expected), "{what}");
        }
    }

    pub(crate) fn name(&self) -> String {
        self.device.name()
    }

    pub(crate) fn spec(&self) -> String {
        self.device.path().to_string_lossy().into_owned()
    }

    pub(crate) fn number(&self) -> DeviceNumber {
        self.device.number()
    }

    pub(crate) fn disk(&self) -> Disk {
        Disk {
            name: self.name(),
            number: self.number(),
        }
    }

    /// Gives the device settings no default has: kyber with depth 100 and its own read latency
    /// target over a driver depth of 100, and requests of up to 1000 KiB (above abissd's cap).
    pub(crate) fn prepare(&self) -> QueueSettings {
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
    pub(crate) fn set_driver_depth(&self, depth: u32) {
        self.device.set_scheduler("none");
        let nr_requests = queue_file(&self.name(), "nr_requests");
        write(&nr_requests, &(depth - 1).to_string());
        write(&nr_requests, &depth.to_string());
    }

    pub(crate) fn settings(&self) -> QueueSettings {
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
    /// Puts the queue back as it was found. The driver depth is written under `none`, through a
    /// neighbour (the kernel ignores a write of the value shown, and refuses one above the
    /// allocated tags, so the neighbour is below where it can be). Failures are said, not
    /// hidden: a device left changed is handed to the next test that attaches it.
    fn drop(&mut self) {
        let name = self.name();
        let nr_requests = queue_file(&name, "nr_requests");
        let found = self.found_driver_depth;
        let neighbour = if found > 4 { found - 1 } else { found + 1 };
        let writes = [
            (queue_file(&name, "scheduler"), "none".to_owned()),
            (nr_requests.clone(), neighbour.to_string()),
            (nr_requests, found.to_string()),
            (queue_file(&name, "scheduler"), self.found_scheduler.clone()),
            (
                queue_file(&name, "max_sectors_kb"),
                self.found_max_request_kib.clone(),
            ),
        ];
        for (path, value) in writes {
            if let Err(error) = abiss_os::sysfs::write_attr(&path, &value) {
                eprintln!(
                    "{name} not put back: writing {value} to {}: {error}",
                    path.display()
                );
            }
        }
    }
}

pub(crate) fn block_file(name: &str, file: &str) -> PathBuf {
    Path::new("/sys/block").join(name).join(file)
}

pub(crate) fn queue_file(name: &str, file: &str) -> PathBuf {
    block_file(name, "queue").join(file)
}

pub(crate) fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
        .trim()
        .to_owned()
}

pub(crate) fn read_number(path: &Path) -> u32 {
    read(path).parse().expect("a number")
}

pub(crate) fn write(path: &Path, value: &str) {
    abiss_os::sysfs::write_attr(path, value)
        .unwrap_or_else(|error| panic!("write {value} to {}: {error}", path.display()));
}

pub(crate) fn active_scheduler(name: &str) -> String {
    let line = read(&queue_file(name, "scheduler"));
    let start = line.find('[').expect("an active scheduler") + 1;
    let end = line.find(']').expect("an active scheduler");
    line[start..end].to_owned()
}

/// The live driver tag depth, read as the kernel shows it (blk-mq's debugfs, mounted privately
/// when nobody mounted it), so every test checks the depth on a fresh machine too.
pub(crate) fn live_driver_depth(name: &str) -> Option<u32> {
    abiss_os::blk_mq::driver_tag_depth(name).map(|(depth, _)| depth)
}

/// mq-deadline, which every kernel abissd runs on has (bfq may be missing), over a depth of 8:
/// both differ from what `TestDisk::prepare` sets.
pub(crate) fn deadline_over_8() -> DeviceConfig {
    DeviceConfig {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 8,
    }
}

pub(crate) fn state_files(state: &Scratch) -> Vec<PathBuf> {
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
