//! Devices and mounts: loop devices over sparse images, ext4 on them, what the disks were asked
//! for, and where a file lies on its device.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use abiss_proto::DeviceNumber;

use crate::{wait_until, Scratch};

/// A loop device over a sparse image file; detached on drop.
#[derive(Debug)]
pub struct LoopDevice {
    path: PathBuf,
    number: DeviceNumber,
    _dir: Scratch,
}

/// Attaches `image` to the first free loop device with `option` (`losetup --find --show`); the
/// device's path.
#[must_use]
pub fn attach_loop(image: &Path, option: &str) -> PathBuf {
    let output = Command::new("losetup")
        .args(["--find", "--show", option])
        .arg(image)
        .output()
        .expect("run losetup");
    assert!(
        output.status.success(),
        "losetup failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

impl LoopDevice {
    /// A `size_mib` loop device with direct I/O to its image, which lives under `base`.
    #[must_use]
    pub fn new_in(base: &str, size_mib: u64) -> Self {
        let dir = Scratch::new_in(base, "loop");
        let image = dir.path().join("disk.img");
        File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .expect("create image");
        let path = attach_loop(&image, "--direct-io=on");
        let name = path
            .file_name()
            .expect("device name")
            .to_string_lossy()
            .into_owned();
        let number = std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
            .expect("read dev")
            .trim()
            .parse()
            .expect("parse dev");
        // udev probes new devices; let that finish so it does not count as test I/O.
        let _ = Command::new("udevadm").arg("settle").status();
        Self {
            path,
            number,
            _dir: dir,
        }
    }

    /// `/dev/loopN`.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `loopN`.
    #[must_use]
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Its device number.
    #[must_use]
    pub fn number(&self) -> DeviceNumber {
        self.number
    }

    /// Selects an I/O scheduler (none, mq-deadline, kyber, bfq).
    pub fn set_scheduler(&self, scheduler: &str) {
        abiss_os::sysfs::write_attr(
            Path::new(&format!("/sys/block/{}/queue/scheduler", self.name())),
            scheduler,
        )
        .expect("set scheduler");
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// An ext4 filesystem on a loop device, mounted; unmounted on drop.
#[derive(Debug)]
pub struct Ext4Mount {
    mount: Scratch,
    // Field order: unmount before the device is detached.
    device: LoopDevice,
}

impl Ext4Mount {
    /// Formats `device` and mounts it.
    #[must_use]
    pub fn new(device: LoopDevice) -> Self {
        Self::with_mkfs_args(device, &[])
    }

    /// Formats `device` with `mkfs.ext4 ARGS` and mounts it (a small device gets 1 KiB blocks
    /// otherwise, and files at most 4 TiB).
    #[must_use]
    pub fn with_mkfs_args(device: LoopDevice, args: &[&str]) -> Self {
        let status = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(args)
            .arg(device.path())
            .status()
            .expect("run mkfs.ext4");
        assert!(status.success(), "mkfs.ext4 failed");
        let mount = Scratch::new_in("/tmp", "mnt");
        let status = Command::new("mount")
            .arg(device.path())
            .arg(mount.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount failed");
        Self { mount, device }
    }

    /// The mount point.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.mount.path()
    }

    /// The device.
    #[must_use]
    pub fn device(&self) -> &LoopDevice {
        &self.device
    }
}

impl Drop for Ext4Mount {
    fn drop(&mut self) {
        // A process that just closed a file on it (a stopped daemon) may take a moment to go.
        let unmounted = wait_until(Duration::from_secs(5), || {
            Command::new("umount")
                .arg(self.mount.path())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        if !unmounted {
            eprintln!(
                "{} is still busy: detaching it lazily",
                self.mount.path().display()
            );
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.mount.path())
                .status();
        }
    }
}

/// Bytes read from block device `name` so far (512-byte sectors in its stat file): what
/// the disk itself was asked for, whoever asked.
#[must_use]
pub fn disk_bytes_read(name: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("disk stat");
    stat.split_whitespace()
        .nth(2)
        .and_then(|sectors| sectors.parse::<u64>().ok())
        .expect("sectors read")
        * 512
}

/// Read requests block device `name` completed so far (its stat file's first field, after the
/// elevator merged what it could).
#[must_use]
pub fn disk_reads(name: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).expect("disk stat");
    stat.split_whitespace()
        .next()
        .and_then(|reads| reads.parse::<u64>().ok())
        .expect("reads completed")
}

/// Reads `count` blocks of `block` bytes with `O_DIRECT` from `device`, starting at `first_block`.
pub fn direct_reads(device: &Path, block: usize, first_block: u64, count: u64) {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .expect("open device O_DIRECT");
    let mut buffer = abiss_lab::direct_io::AlignedBuffer::new(block);
    let slice = buffer.slice(block);
    for i in 0..count {
        let offset = (first_block + i) * block as u64;
        file.read_exact_at(slice, offset).expect("direct read");
    }
}

/// Where `path` lies on its device, as byte ranges (`filefrag`; a file system on the whole
/// device).
#[must_use]
pub fn file_extents(path: &Path) -> Vec<(u64, u64)> {
    let output = Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .expect("run filefrag");
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("blocks of 4096 bytes"), "{text}");
    // `   0:        0..    2047:      34816..     36863:   2048:             last,eof`
    text.lines()
        .filter_map(|line| {
            let fields: Vec<_> = line
                .split_whitespace()
                .map(|f| f.trim_end_matches([':', '.']))
                .collect();
            let _extent: u64 = fields.first()?.parse().ok()?;
            let start: u64 = fields.get(3)?.parse().ok()?;
            let blocks: u64 = fields.get(5)?.parse().ok()?;
            Some((start * 4096, (start + blocks) * 4096))
        })
        .collect()
}

/// The requests of `records` of kind `op` that touch `extents`.
pub fn on_extents<'a>(
    records: &'a [abiss_lab::RequestRecord],
    extents: &'a [(u64, u64)],
    op: abiss_lab::Op,
) -> impl Iterator<Item = &'a abiss_lab::RequestRecord> {
    records.iter().filter(move |r| {
        r.op == op
            && extents
                .iter()
                .any(|&(start, end)| r.offset < end && start < r.offset + r.len)
    })
}
