//! Which disks serve a client's file: its mount (by the id `statx` reported, so a file in a
//! btrfs subvolume, whose device number no mount shows, is found too), and the disks under
//! that mount's file system, read through the one stack reader abissd and `abissctl doctor`
//! share ([`abiss_kernel::storage`]): a partition's disk, the disks under device-mapper and
//! md devices that read in the caller's context (LVM, LUKS, striped LVM, md raid0/1/10), every
//! device of a btrfs. An md raid4/5/6 and a file system on no block device each get one
//! sentence naming what is in the way; so does a recording through a device mapper that writes
//! from pages of its own (dm-crypt), or through md.
//!
//! Only `/proc/self/mountinfo` and sysfs are read: nothing of the file's own file system,
//! which may be a user's (a FUSE server that never answers), so this may run on the main
//! loop as the sysfs lookup it replaces did.

use std::path::Path;

use abiss_kernel::storage::{self, Layer, Mount};
use abiss_proto::{DeviceNumber, Refusal};

use super::device::{Disk, SYSFS};

/// The disks a file is served from, and the device number its kernel structures carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileDisk {
    /// The whole disks under the file's file system, sorted by number, never empty: one, or
    /// each member of a btrfs over several.
    pub(crate) disks: Vec<Disk>,
    /// The file system's own device number (its super block's, which the eBPF programs read
    /// from a page's inode): a btrfs file's `st_dev` is its subvolume's anonymous number,
    /// which is not this one.
    pub(crate) kernel_device: DeviceNumber,
    /// What its stack costs a stream that abiss cannot take away, as whole sentences
    /// ([`abiss_kernel::device_mapper::findings`]).
    pub(crate) warnings: Vec<String>,
}

impl FileDisk {
    /// The disks' numbers, in order.
    pub(crate) fn numbers(&self) -> Vec<DeviceNumber> {
        self.disks.iter().map(|disk| disk.number).collect()
    }

    /// The largest read the disks all take in one request (see
    /// [`Disk::largest_request_bytes`]); `None` if sysfs says it of none.
    pub(crate) fn largest_request_bytes(&self) -> Option<u64> {
        self.disks
            .iter()
            .filter_map(Disk::largest_request_bytes)
            .min()
    }
}

/// The disks serving a file that reports `file_device` and was opened through mount
/// `mount_id`, named `path` in sentences, for a recording when `write`.
pub(crate) fn disk_of_file(
    file_device: DeviceNumber,
    mount_id: Option<u64>,
    path: &str,
    write: bool,
) -> Result<FileDisk, Refusal> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| storage::parse_mountinfo(&text))
        .unwrap_or_default();
    let mount = mount_id.and_then(|id| storage::mount_by_id(&mounts, id));
    // One read of the stacks, for the disks and for the device mapper's tables (root's ioctls
    // on /dev/mapper/control, never the file's).
    let stacks = storage::file_system_stacks(Path::new(SYSFS), mount, file_device);
    let mut found = disk_in(&stacks, mount, file_device, path, write)?;
    let tables = abiss_kernel::device_mapper::findings(&stacks);
    if let Some(refusal) = tables.refusal {
        return Err(Refusal::UnknownDevice(format!("{path} {refusal}")));
    }
    found.warnings = tables
        .warnings
        .into_iter()
        .map(|warning| format!("{path} {warning}"))
        .collect();
    Ok(found)
}

/// The disks serving a file of the file system on `stacks` (its [`storage::file_system_stacks`]).
fn disk_in(
    stacks: &[Layer],
    mount: Option<&Mount>,
    file_device: DeviceNumber,
    path: &str,
    write: bool,
) -> Result<FileDisk, Refusal> {
    let refused = |reason: String| Refusal::UnknownDevice(format!("{path} {reason}"));
    let found = storage::serving_disks_of(stacks, mount, file_device)
        .map_err(|why| refused(why.reason()))?;
    if write {
        if let Some(reason) = stacks.iter().find_map(storage::recording_reason) {
            return Err(refused(reason));
        }
    }
    let mut disks: Vec<Disk> = found.iter().map(Disk::from).collect();
    disks.sort_by_key(|disk| disk.number);
    Ok(FileDisk {
        disks,
        kernel_device: mount.map_or(file_device, |mount| mount.device),
        warnings: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn number(text: &str) -> DeviceNumber {
        text.parse().unwrap()
    }

    #[test]
    fn a_btrfs_file_is_keyed_by_its_super_blocks_device_and_served_from_its_disk() {
        let sys = std::env::temp_dir().join(format!("abissd-file-disk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sys);
        let loop3 = sys.join("devices/virtual/block/loop3");
        std::fs::create_dir_all(&loop3).unwrap();
        std::fs::write(loop3.join("dev"), "7:3\n").unwrap();
        let devices = sys.join("fs/btrfs/aaaa/devices");
        std::fs::create_dir_all(&devices).unwrap();
        std::os::unix::fs::symlink(&loop3, devices.join("loop3")).unwrap();
        let mount = Mount {
            id: 40,
            device: number("0:45"),
            at: PathBuf::from("/mnt"),
            fs_type: "btrfs".to_owned(),
            source: "/dev/loop3".to_owned(),
        };
        let found = disk_in(
            &storage::file_system_stacks(&sys, Some(&mount), number("0:46")),
            Some(&mount),
            number("0:46"),
            "/mnt/sub/f",
            false,
        )
        .unwrap();
        assert_eq!(found.disks[0].name, "loop3");
        assert_eq!(found.numbers(), [number("7:3")]);
        assert_eq!(found.kernel_device, number("0:45"));
        // Without its mount, nothing tells which btrfs an anonymous number belongs to.
        let refusal = disk_in(
            &storage::file_system_stacks(&sys, None, number("0:46")),
            None,
            number("0:46"),
            "/mnt/sub/f",
            false,
        )
        .unwrap_err();
        assert!(
            refusal.to_string().contains("/mnt/sub/f is on device 0:46"),
            "{refusal}"
        );
        std::fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn a_luks_file_is_read_from_the_disk_beneath_and_not_recorded() {
        let sys = std::env::temp_dir().join(format!("abissd-file-disk-dm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&sys);
        let loop3 = sys.join("devices/virtual/block/loop3");
        let dm = sys.join("devices/virtual/block/dm-0");
        for (dir, dev) in [(&loop3, "7:3"), (&dm, "253:0")] {
            std::fs::create_dir_all(dir.join("slaves")).unwrap();
            std::fs::write(dir.join("dev"), dev).unwrap();
        }
        std::fs::create_dir_all(dm.join("dm")).unwrap();
        std::fs::write(dm.join("dm/name"), "media\n").unwrap();
        std::fs::write(dm.join("dm/uuid"), "CRYPT-LUKS2-abc-media\n").unwrap();
        std::os::unix::fs::symlink(&loop3, dm.join("slaves/loop3")).unwrap();
        std::fs::create_dir_all(sys.join("dev/block")).unwrap();
        std::os::unix::fs::symlink(&dm, sys.join("dev/block/253:0")).unwrap();
        let found = disk_in(
            &storage::file_system_stacks(&sys, None, number("253:0")),
            None,
            number("253:0"),
            "/m/f",
            false,
        )
        .unwrap();
        assert_eq!(found.numbers(), [number("7:3")]);
        assert_eq!(found.kernel_device, number("253:0"));
        let refusal = disk_in(
            &storage::file_system_stacks(&sys, None, number("253:0")),
            None,
            number("253:0"),
            "/m/f",
            true,
        )
        .unwrap_err();
        assert!(
            refusal
                .to_string()
                .starts_with("/m/f is on dm-0 (253:0, dm-crypt 'media') → loop3 (7:3, loop"),
            "{refusal}"
        );
        std::fs::remove_dir_all(&sys).unwrap();
    }
}
