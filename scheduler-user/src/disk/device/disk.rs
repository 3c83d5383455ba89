//! Finding the whole disk behind a device as users name it.

use std::fmt;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use serde::{Deserialize, Serialize};

use super::error::DeviceError;
use super::sysfs::{read_trimmed, SYSFS};

/// A whole disk: the block device that owns the request queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Disk {
    /// Kernel name (`sda`, `loop0`, `nvme0n1`).
    pub name: String,
    /// Its device number.
    pub number: DeviceNumber,
}

impl fmt::Display for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name, self.number)
    }
}

impl From<&abiss_kernel::storage::Layer> for Disk {
    /// The disk a stack reader found (its bottom layer).
    fn from(layer: &abiss_kernel::storage::Layer) -> Self {
        Self {
            name: layer.name.clone(),
            number: layer.device,
        }
    }
}

impl Disk {
    /// The largest read of page-cache pages the disk takes in one request now, in bytes: the
    /// smaller of `queue/max_sectors_kb` and `queue/max_segments` pages. Pages the page cache
    /// holds one by one need a segment each unless they happen to lie side by side in memory,
    /// so the segments bound a request too: a loop disk with `max_sectors_kb` 1280 and 128
    /// segments took a 1280 KiB advice as requests of 512, 512 and 256 KiB (measured by the
    /// lab), and 512 KiB pieces as one request each. Also no more than the kernel reads of one
    /// `POSIX_FADV_WILLNEED` (it reads up to the larger of `max_sectors_kb` and the file's
    /// readahead). `None` if sysfs does not say.
    #[must_use]
    pub(crate) fn largest_request_bytes(&self) -> Option<u64> {
        let queue = Path::new(SYSFS)
            .join("block")
            .join(&self.name)
            .join("queue");
        let read = |name: &str| -> Option<u64> {
            read_trimmed(&queue.join(name))
                .ok()?
                .parse()
                .ok()
                .filter(|&n| n > 0)
        };
        let sectors_bytes = read("max_sectors_kb")?.checked_mul(1024)?;
        let segments_bytes = read("max_segments").map_or(u64::MAX, |segments| {
            segments.saturating_mul(abiss_proto::PAGE_BYTES)
        });
        Some(sectors_bytes.min(segments_bytes))
    }
}

/// Resolves a device as users type it (`sda`, `/dev/sda`, `8:0`, or a partition such as `sda1`
/// or `/dev/loop0p1`) to its whole disk, because the queue belongs to the disk.
pub fn resolve_disk(spec: &str) -> Result<Disk, DeviceError> {
    resolve_disk_in(Path::new(SYSFS), spec)
}

/// The whole disks under a device as users type it (any name [`resolve_disk`] takes): the
/// disk itself, a partition's disk, or the disks at the bottom of a device-mapper or md
/// device's stack (read by [`abiss_kernel::storage`]), each of which has a queue abissd can
/// manage; or, for a directory, every disk under the file system mounted there (all of a
/// btrfs's devices). What `--device` means. Run at start, by the administrator's words, never
/// for a client.
pub(crate) fn resolve_disks(spec: &str) -> Result<Vec<Disk>, DeviceError> {
    if Path::new(spec).is_dir() {
        return disks_under_directory(Path::new(SYSFS), spec);
    }
    resolve_disks_in(Path::new(SYSFS), spec)
}

/// The disks under the file system that holds directory `spec`.
fn disks_under_directory(sys: &Path, spec: &str) -> Result<Vec<Disk>, DeviceError> {
    let not_on_disks = || DeviceError::NoDisksUnder {
        path: spec.to_owned(),
    };
    let dev = std::fs::metadata(spec).map_err(|_| not_on_disks())?.dev();
    let device = DeviceNumber {
        major: libc::major(dev),
        minor: libc::minor(dev),
    };
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| abiss_kernel::storage::parse_mountinfo(&text))
        .unwrap_or_default();
    let mount = abiss_kernel::storage::mount_of(&mounts, Path::new(spec), device);
    let mut disks: Vec<Disk> = Vec::new();
    for stack in abiss_kernel::storage::file_system_stacks(sys, mount, device) {
        for layer in stack.physical() {
            if !disks.iter().any(|d| d.number == layer.device) {
                disks.push(Disk::from(layer));
            }
        }
    }
    if disks.is_empty() {
        return Err(not_on_disks());
    }
    Ok(disks)
}

fn resolve_disks_in(sys: &Path, spec: &str) -> Result<Vec<Disk>, DeviceError> {
    let device = device_dir_in(sys, spec)?;
    let number = read_number(&device)?;
    let below = abiss_kernel::storage::physical_disks(sys, number).unwrap_or_default();
    if below.is_empty() {
        return Ok(vec![resolve_disk_in(sys, spec)?]);
    }
    Ok(below.iter().map(Disk::from).collect())
}

/// Resolves a device a client named (in a capacity plan) without looking up any path: a
/// client's path may lead anywhere, into a FUSE file system whose server never answers, and
/// abissd would look it up as root, in its main loop. So a client names a disk by NAME,
/// `/dev/NAME` (taken as NAME, in sysfs) or MAJOR:MINOR; abissctl turns other paths into
/// MAJOR:MINOR itself, as the user.
pub(crate) fn resolve_client_disk(spec: &str) -> Result<Disk, DeviceError> {
    resolve_client_disk_in(Path::new(SYSFS), spec)
}

fn resolve_client_disk_in(sys: &Path, spec: &str) -> Result<Disk, DeviceError> {
    let trimmed = spec.trim();
    let name = trimmed.strip_prefix("/dev/").unwrap_or(trimmed);
    if name.contains('/') {
        return Err(DeviceError::PathFromClient {
            spec: spec.to_owned(),
        });
    }
    resolve_disk_in(sys, name)
}

/// How a device spec names a device.
#[derive(Clone, Debug, PartialEq, Eq)]
enum DeviceSpec<'a> {
    /// A path, usually under /dev; symlinks such as /dev/disk/by-id/… are followed.
    Path(&'a Path),
    /// `MAJOR:MINOR`.
    Number(DeviceNumber),
    /// A kernel name, as in /sys/class/block.
    Name(&'a str),
}

impl<'a> DeviceSpec<'a> {
    fn classify(spec: &'a str) -> Self {
        if spec.contains('/') {
            Self::Path(Path::new(spec))
        } else if let Ok(number) = spec.parse() {
            Self::Number(number)
        } else {
            Self::Name(spec)
        }
    }
}

/// The sysfs directory of the device `spec` names (symlinks resolved).
fn device_dir_in(sys: &Path, spec: &str) -> Result<PathBuf, DeviceError> {
    let unknown = || DeviceError::UnknownDevice {
        spec: spec.to_owned(),
    };
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(unknown());
    }
    let link = match DeviceSpec::classify(spec) {
        DeviceSpec::Path(path) => {
            let meta = fs::metadata(path).map_err(|_| unknown())?;
            if !meta.file_type().is_block_device() {
                return Err(DeviceError::NotABlockDevice {
                    spec: spec.to_owned(),
                });
            }
            let rdev = meta.rdev();
            let number = DeviceNumber {
                major: nix::sys::stat::major(rdev)
                    .try_into()
                    .map_err(|_| unknown())?,
                minor: nix::sys::stat::minor(rdev)
                    .try_into()
                    .map_err(|_| unknown())?,
            };
            sys.join("dev/block").join(number.to_string())
        }
        DeviceSpec::Number(number) => sys.join("dev/block").join(number.to_string()),
        DeviceSpec::Name(name) => sys.join("class/block").join(name),
    };
    fs::canonicalize(&link).map_err(|_| unknown())
}

/// The number in a sysfs block device directory's `dev` file.
fn read_number(dir: &Path) -> Result<DeviceNumber, DeviceError> {
    let dev_file = dir.join("dev");
    let text = read_trimmed(&dev_file)?;
    text.parse().map_err(|_| DeviceError::Unparsable {
        path: dev_file.clone(),
        content: text.clone(),
    })
}

fn resolve_disk_in(sys: &Path, spec: &str) -> Result<Disk, DeviceError> {
    let unknown = || DeviceError::UnknownDevice {
        spec: spec.to_owned(),
    };
    let device_dir = device_dir_in(sys, spec)?;
    // A partition's sysfs directory sits inside its disk's and has a `partition` file.
    let disk_dir = if device_dir.join("partition").exists() {
        device_dir.parent().ok_or_else(unknown)?.to_path_buf()
    } else {
        device_dir
    };
    let name = disk_dir
        .file_name()
        .ok_or_else(unknown)?
        .to_string_lossy()
        .into_owned();
    let number = read_number(&disk_dir)?;
    Ok(Disk { name, number })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A directory under the system temp dir, removed on drop.
    struct TempTree(PathBuf);

    impl TempTree {
        fn new(tag: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "abiss-device-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&path);
            fs::create_dir_all(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A fake sysfs with disk `sda` (8:0) holding partition `sda1` (8:1), laid out as the
    /// kernel does: the device directories under `devices/`, symlinks in `class/block` and
    /// `dev/block`.
    fn fake_sysfs(root: &Path) {
        use std::os::unix::fs::symlink;
        let disk = root.join("devices/pci0000:00/0000:00:1f.2/ata1/host0/block/sda");
        let partition = disk.join("sda1");
        fs::create_dir_all(&partition).unwrap();
        fs::write(disk.join("dev"), "8:0\n").unwrap();
        fs::write(partition.join("dev"), "8:1\n").unwrap();
        fs::write(partition.join("partition"), "1\n").unwrap();
        fs::create_dir_all(root.join("class/block")).unwrap();
        fs::create_dir_all(root.join("dev/block")).unwrap();
        symlink(&disk, root.join("class/block/sda")).unwrap();
        symlink(&partition, root.join("class/block/sda1")).unwrap();
        symlink(&disk, root.join("dev/block/8:0")).unwrap();
        symlink(&partition, root.join("dev/block/8:1")).unwrap();
    }

    fn sda() -> Disk {
        Disk {
            name: "sda".into(),
            number: DeviceNumber { major: 8, minor: 0 },
        }
    }

    #[test]
    fn specs_are_told_apart_by_shape() {
        assert_eq!(
            DeviceSpec::classify("/dev/sda"),
            DeviceSpec::Path(Path::new("/dev/sda"))
        );
        assert_eq!(
            DeviceSpec::classify("8:0"),
            DeviceSpec::Number(DeviceNumber { major: 8, minor: 0 })
        );
        assert_eq!(DeviceSpec::classify("sda1"), DeviceSpec::Name("sda1"));
        assert_eq!(DeviceSpec::classify("8:x"), DeviceSpec::Name("8:x"));
    }

    #[test]
    fn names_numbers_and_partitions_resolve_to_the_whole_disk() {
        let tree = TempTree::new("resolve");
        fake_sysfs(&tree.0);
        for spec in ["sda", "sda1", "8:0", "8:1", " sda "] {
            assert_eq!(resolve_disk_in(&tree.0, spec).unwrap(), sda(), "{spec}");
        }
    }

    #[test]
    fn a_device_mapper_device_means_the_disks_under_it() {
        use std::os::unix::fs::symlink;
        let tree = TempTree::new("stacked");
        fake_sysfs(&tree.0);
        let dm = tree.0.join("devices/virtual/block/dm-0");
        fs::create_dir_all(dm.join("slaves")).unwrap();
        fs::create_dir_all(dm.join("dm")).unwrap();
        fs::write(dm.join("dev"), "253:0\n").unwrap();
        fs::write(dm.join("dm/name"), "vg-media\n").unwrap();
        let sda1 = fs::canonicalize(tree.0.join("class/block/sda1")).unwrap();
        symlink(&sda1, dm.join("slaves/sda1")).unwrap();
        symlink(&dm, tree.0.join("class/block/dm-0")).unwrap();
        symlink(&dm, tree.0.join("dev/block/253:0")).unwrap();
        for spec in ["dm-0", "253:0", "sda1", "sda"] {
            assert_eq!(resolve_disks_in(&tree.0, spec).unwrap(), [sda()], "{spec}");
        }
    }

    #[test]
    fn unknown_devices_are_named_in_the_error() {
        let tree = TempTree::new("unknown");
        fake_sysfs(&tree.0);
        for spec in ["sdz", "9:9", "/dev/does-not-exist", ""] {
            let error = resolve_disk_in(&tree.0, spec).unwrap_err();
            assert!(
                matches!(&error, DeviceError::UnknownDevice { spec: s } if s == spec),
                "{spec}: {error}"
            );
            assert!(error.to_string().contains(spec.trim()));
        }
    }

    #[test]
    fn a_client_names_a_disk_without_a_path_lookup() {
        let tree = TempTree::new("client");
        fake_sysfs(&tree.0);
        for spec in ["sda", "/dev/sda", "/dev/sda1", "8:0"] {
            assert_eq!(
                resolve_client_disk_in(&tree.0, spec).unwrap(),
                sda(),
                "{spec}"
            );
        }
        // Any other path is refused as given, whether it exists or not: looking it up could
        // wait on whatever file system it leads into.
        let file = tree.0.join("plain-file");
        fs::write(&file, "").unwrap();
        for spec in [
            file.to_string_lossy().as_ref(),
            "/dev/disk/by-id/x",
            "../sda",
        ] {
            let error = resolve_client_disk_in(&tree.0, spec).unwrap_err();
            assert!(
                matches!(&error, DeviceError::PathFromClient { spec: s } if s == spec),
                "{spec}: {error}"
            );
            assert!(error.to_string().contains("MAJOR:MINOR"), "{error}");
        }
    }

    #[test]
    fn paths_that_are_not_block_devices_are_refused() {
        let tree = TempTree::new("notblock");
        fake_sysfs(&tree.0);
        let file = tree.0.join("plain-file");
        fs::write(&file, "").unwrap();
        let spec = file.to_string_lossy().into_owned();
        let error = resolve_disk_in(&tree.0, &spec).unwrap_err();
        assert!(
            matches!(error, DeviceError::NotABlockDevice { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(&spec));
    }
}
