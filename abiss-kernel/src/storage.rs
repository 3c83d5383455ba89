//! Which disks hold a file system: its mount (from `/proc/self/mountinfo`), and the block
//! devices under it down to the physical disks, read from sysfs (`/sys/dev/block/MAJ:MIN/
//! {partition, slaves, dm/name, dm/uuid, md/level, loop/backing_file}`, and
//! `/sys/fs/btrfs/*/devices` for btrfs, whose files carry an anonymous device number). The one
//! place that reads a storage stack: abissd (which disk serves a stream, what `--device`
//! names) and `abissctl doctor` both ask here. Reads only files every user may read, and no
//! file of the file system itself; mounts nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use serde::Serialize;

/// How deep a stack may go before it is taken for a loop in sysfs.
const MAX_DEPTH: usize = 16;
/// At most this many devices are named above a disk (a volume group's logical volumes).
const MAX_BUILT_ON: usize = 1024;

/// One mount of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// Its id (the first field; what `statx` reports as `stx_mnt_id`).
    #[serde(rename = "mount_id")]
    pub id: u64,
    /// Its super block's device number (anonymous, major 0, for btrfs, tmpfs, NFS, …): what
    /// the kernel's own structures, and so the eBPF programs, key its files by. A btrfs
    /// file's `st_dev` is its subvolume's anonymous number instead, which no mount shows.
    pub device: DeviceNumber,
    /// Where it is mounted.
    #[serde(rename = "mount_point")]
    pub at: PathBuf,
    /// The file system type (`ext4`, `btrfs`, `tmpfs`).
    pub fs_type: String,
    /// What was mounted (`/dev/loop3`, `tmpfs`).
    pub source: String,
}

/// The mounts of a `mountinfo` text; lines that do not parse are left out.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_mount_line).collect()
}

/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_mount_line(line: &str) -> Option<Mount> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let id = fields.first()?.parse().ok()?;
    let device = fields.get(2)?.parse().ok()?;
    let at = PathBuf::from(unescape(fields.get(4)?));
    let mut after = after.split(' ');
    let fs_type = after.next()?.to_owned();
    let source = unescape(after.next()?);
    Some(Mount {
        id,
        device,
        at,
        fs_type,
        source,
    })
}

/// mountinfo writes space, tab, newline and backslash as `\040`-style octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount `path` (absolute, symlinks resolved) is on: the one reporting `device`, else
/// (a btrfs subvolume has a device of its own) the deepest mount point above it. The last
/// mount of a point wins, as it hides the ones before.
#[must_use]
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path, device: DeviceNumber) -> Option<&'a Mount> {
    let above = |mount: &&Mount| path.starts_with(&mount.at);
    mounts
        .iter()
        .rev()
        .filter(above)
        .find(|mount| mount.device == device)
        .or_else(|| {
            mounts
                .iter()
                .rev()
                .filter(above)
                .max_by_key(|mount| mount.at.components().count())
        })
}

/// What a block device is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Kind {
    /// A whole disk (or anything else with a queue of its own and nothing below).
    Disk,
    /// Partition `number` of the device below it.
    Partition {
        /// Its number on the disk.
        number: u32,
    },
    /// A device-mapper device; `subsystem` from its uuid (`CRYPT`, `LVM`), when it has one.
    DeviceMapper {
        /// Its name (`dm/name`).
        name: String,
        /// What made it (`CRYPT`, `LVM`), from its uuid's prefix.
        subsystem: Option<String>,
    },
    /// An md array.
    Md {
        /// Its RAID level (`raid1`).
        level: String,
    },
    /// A loop device over a file (unknown when detached, or hidden).
    Loop {
        /// The file behind it, as the kernel shows it.
        backing_file: Option<String>,
    },
}

/// A block device and the devices it is built on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Layer {
    /// The kernel's name (`sda2`, `dm-0`).
    pub name: String,
    /// Its number.
    pub device: DeviceNumber,
    /// What it is.
    #[serde(flatten)]
    pub kind: Kind,
    /// What it is built on: a partition's disk, a dm or md device's members.
    pub below: Vec<Layer>,
}

impl Layer {
    /// The disks abissd serves a file of this device from, each once: the bottom of a chain
    /// of partitions and device-mapper devices each built on one device (LVM on one disk,
    /// LUKS, LVM on LUKS), else itself; through a device-mapper device over several devices
    /// (striped or mirrored LVM) or an md array that reads in its caller's context
    /// ([`md_reads_in_caller`]), the disks under every member. Such layers remap or clone a
    /// read bio in the caller's context (dm-crypt submits its read clones there too, and
    /// decrypts in the file's own pages), so the disks' requests keep the reader's priority
    /// and the file's pages; [`Layer::unserved_layer`] says where a stack stops being served.
    #[must_use]
    pub fn serving_disks(&self) -> Vec<&Layer> {
        let spread = match &self.kind {
            Kind::Partition { .. } | Kind::DeviceMapper { .. } => !self.below.is_empty(),
            Kind::Md { level } => md_reads_in_caller(level) && !self.below.is_empty(),
            Kind::Disk | Kind::Loop { .. } => false,
        };
        if !spread {
            return vec![self];
        }
        let mut found: Vec<&Layer> = Vec::new();
        for disk in self.below.iter().flat_map(Layer::serving_disks) {
            if !found.iter().any(|seen| seen.device == disk.device) {
                found.push(disk);
            }
        }
        found
    }

    /// The first layer from the top through which abissd cannot serve a stream: an md array
    /// of a level whose reads go through md's own thread (raid4, 5, 6: the stripe cache), or
    /// a device-mapper device built on no device. `None` for a stack served down to its
    /// disks.
    #[must_use]
    pub fn unserved_layer(&self) -> Option<&Layer> {
        match (&self.kind, self.below.as_slice()) {
            (Kind::Md { level }, _) if !md_reads_in_caller(level) => Some(self),
            (Kind::DeviceMapper { .. }, []) => Some(self),
            (Kind::Partition { .. } | Kind::DeviceMapper { .. } | Kind::Md { .. }, below) => {
                below.iter().find_map(Layer::unserved_layer)
            }
            _ => None,
        }
    }

    /// The first md layer from the top: recordings through md are not served (its raid1
    /// writes behind from copies of its own on write-mostly members, and the writes through
    /// it are not yet measured), though its reading streams are.
    #[must_use]
    pub fn md_layer(&self) -> Option<&Layer> {
        match &self.kind {
            Kind::Md { .. } => Some(self),
            _ => self.below.iter().find_map(Layer::md_layer),
        }
    }

    /// The first device-mapper layer from the top whose writes may reach the disk on pages
    /// of its own, from its own workers: any but LVM's (whose linear volumes remap a bio in
    /// place). dm-crypt encrypts a written page into a bounce page in its kcryptd workers
    /// and submits that, so the disk's write requests carry no file, and a recording's
    /// write-behind cannot be told or kept at its level there; a device mapper without a
    /// uuid naming its maker is taken as one that might.
    #[must_use]
    pub fn layer_writing_from_own_pages(&self) -> Option<&Layer> {
        match &self.kind {
            Kind::DeviceMapper { subsystem, .. } if subsystem.as_deref() != Some("LVM") => {
                Some(self)
            }
            _ => self
                .below
                .iter()
                .find_map(Layer::layer_writing_from_own_pages),
        }
    }

    /// The devices at the bottom: those built on nothing the kernel shows.
    pub fn physical(&self) -> Vec<&Layer> {
        if self.below.is_empty() {
            return vec![self];
        }
        let mut found: Vec<&Layer> = Vec::new();
        for layer in self.below.iter().flat_map(Layer::physical) {
            if !found.iter().any(|seen| seen.device == layer.device) {
                found.push(layer);
            }
        }
        found
    }

    /// `md0 (9:0, md raid1)`: the layer alone.
    #[must_use]
    pub fn summary(&self) -> String {
        format!("{} ({}, {})", self.name, self.device, self.kind_text())
    }

    /// `dm-0 (253:0, dm-crypt 'root') → sda2 (8:2, partition 2) → sda (8:0, disk)`.
    pub fn describe(&self) -> String {
        let mut text = self.summary();
        match self.below.as_slice() {
            [] => {}
            [one] => {
                let _ = write!(text, " → {}", one.describe());
            }
            many => {
                let members: Vec<String> = many.iter().map(Layer::describe).collect();
                let _ = write!(text, " → [{}]", members.join("; "));
            }
        }
        text
    }

    fn kind_text(&self) -> String {
        match &self.kind {
            Kind::Disk => "disk".to_owned(),
            Kind::Partition { number } => format!("partition {number}"),
            Kind::DeviceMapper { name, subsystem } => match subsystem.as_deref() {
                Some("CRYPT") => format!("dm-crypt '{name}'"),
                Some("LVM") => format!("LVM '{name}'"),
                Some(other) => format!("device mapper ({other}) '{name}'"),
                None => format!("device mapper '{name}'"),
            },
            Kind::Md { level } => format!("md {level}"),
            Kind::Loop {
                backing_file: Some(file),
            } => format!("loop over {file}"),
            Kind::Loop { backing_file: None } => "loop, backing file not shown".to_owned(),
        }
    }
}

/// Reads the stack under block device `device` from the sysfs at `sys`; `None` when sysfs
/// does not know it.
#[must_use]
pub fn stack_of(sys: &Path, device: DeviceNumber) -> Option<Layer> {
    let dir = std::fs::canonicalize(sys.join("dev/block").join(device.to_string())).ok()?;
    layer_at(&dir, 0)
}

/// The stack under the block device whose sysfs directory is `dir` (symlinks resolved).
#[must_use]
pub fn layer_at(dir: &Path, depth: usize) -> Option<Layer> {
    if depth > MAX_DEPTH {
        return None;
    }
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .ok()
            .map(|text| text.trim().to_owned())
    };
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let device = read("dev")?.parse().ok()?;
    if let Some(number) = read("partition").and_then(|n| n.parse().ok()) {
        // A partition's directory sits inside its disk's.
        let disk = dir.parent().and_then(|parent| layer_at(parent, depth + 1));
        return Some(Layer {
            name,
            device,
            kind: Kind::Partition { number },
            below: disk.into_iter().collect(),
        });
    }
    let kind = if let Some(dm_name) = read("dm/name") {
        let subsystem = read("dm/uuid")
            .and_then(|uuid| uuid.split_once('-').map(|(prefix, _)| prefix.to_owned()))
            .filter(|prefix| !prefix.is_empty());
        Kind::DeviceMapper {
            name: dm_name,
            subsystem,
        }
    } else if let Some(level) = read("md/level") {
        Kind::Md { level }
    } else if dir.join("loop").is_dir() || name.starts_with("loop") {
        Kind::Loop {
            backing_file: read("loop/backing_file"),
        }
    } else {
        Kind::Disk
    };
    let slaves = linked_dirs(&dir.join("slaves"));
    let below = slaves
        .iter()
        .filter_map(|slave| layer_at(slave, depth + 1))
        .collect();
    Some(Layer {
        name,
        device,
        kind,
        below,
    })
}

/// The devices of the btrfs file system mounted from `source_name` (`loop3`): the entries of
/// `sys/fs/btrfs/<fsid>/devices/` of the file system that has it, as sysfs block directories.
#[must_use]
pub fn btrfs_devices(sys: &Path, source_name: &str) -> Vec<PathBuf> {
    let Ok(file_systems) = std::fs::read_dir(sys.join("fs/btrfs")) else {
        return Vec::new();
    };
    for fs in file_systems.flatten() {
        let devices = fs.path().join("devices");
        if !devices.join(source_name).exists() {
            continue;
        }
        return linked_dirs(&devices);
    }
    Vec::new()
}

/// The stacks under the file system of `mount` whose files report `device`: one for a file
/// system on one device; for btrfs, one per member device, found from the device it was
/// mounted from. Empty when the file system is on no block device sysfs knows.
#[must_use]
pub fn file_system_stacks(sys: &Path, mount: Option<&Mount>, device: DeviceNumber) -> Vec<Layer> {
    if device.major != 0 {
        return stack_of(sys, device).into_iter().collect();
    }
    let Some(mount) = mount.filter(|m| m.fs_type == "btrfs") else {
        return Vec::new();
    };
    // Only a path under /dev is followed (`/dev/mapper/x` is a link to `dm-0`): a mount's
    // source is whatever its mounter wrote.
    let source = Path::new(&mount.source);
    let source = if source.starts_with("/dev/") {
        std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf())
    } else {
        source.to_path_buf()
    };
    let Some(name) = source.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    btrfs_devices(sys, &name)
        .iter()
        .filter_map(|dir| layer_at(dir, 0))
        .collect()
}

/// The mount with id `id` (`statx`'s `stx_mnt_id`) among `mounts`.
#[must_use]
pub fn mount_by_id(mounts: &[Mount], id: u64) -> Option<&Mount> {
    mounts.iter().find(|mount| mount.id == id)
}

/// Why the data of a file system cannot be served from disks abissd manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unservable {
    /// The file system is on no block device (tmpfs, NFS, FUSE, overlayfs, …).
    NoBlockDevice {
        /// Its type.
        fs_type: String,
        /// The device number its files report.
        device: DeviceNumber,
    },
    /// sysfs knows no block device under it.
    Unknown {
        /// The device number its files report.
        device: DeviceNumber,
    },
    /// A layer abissd cannot serve through ([`Layer::unserved_layer`]): the file system's
    /// stack, and that layer in it.
    Layer {
        /// The whole stack under the file system.
        stack: Box<Layer>,
        /// The layer in the way.
        layer: Box<Layer>,
    },
}

impl Unservable {
    /// Why, as the end of a sentence that begins with the file's name.
    #[must_use]
    pub fn reason(&self) -> String {
        match self {
            Self::NoBlockDevice { fs_type, device } => format!(
                "is on {fs_type}, which is on no block device (its files report device {device}); abissd serves files of file systems on disks"
            ),
            Self::Unknown { device } => {
                format!("is on device {device}, which is in no block device sysfs shows")
            }
            Self::Layer { stack, layer } => {
                let why = match &layer.kind {
                    Kind::Md { level } => format!(
                        "md ({} {level}) reads and writes through its stripe cache from its own thread, so abissd cannot keep a stream's priority through it; md linear, raid0, raid1 and raid10 are served",
                        layer.name
                    ),
                    _ => format!(
                        "the device mapper's {} is built on no disk abissd could manage",
                        layer.name
                    ),
                };
                format!("is on {}: {why}", stack.describe())
            }
        }
    }
}

/// Why a recording (a write stream) of a file on `stack` is not served, as the end of a
/// sentence that begins with the file's name; `None` when it is.
#[must_use]
pub fn recording_reason(stack: &Layer) -> Option<String> {
    if let Some(layer) = stack.layer_writing_from_own_pages() {
        let writes = match &layer.kind {
            Kind::DeviceMapper {
                subsystem: Some(subsystem),
                ..
            } if subsystem == "CRYPT" => "writes",
            _ => "may write",
        };
        return Some(format!(
            "is on {}: {} {writes} a file's pages to the disk from its own workers on pages of its own, so abissd cannot tell a recording's writes there or keep their level; record on a file system without it (reading streams of it are served)",
            stack.describe(),
            layer.kind_text()
        ));
    }
    let md = stack.md_layer()?;
    Some(format!(
        "is on {}: recordings through {} are not served (md's writes are not measured with abiss yet, and a raid1 writes behind from copies of its own); reading streams of it are",
        stack.describe(),
        md.kind_text()
    ))
}

/// The disks that serve the data of the file system of `mount` whose files report `device`:
/// a partition's disk, a whole disk (or loop device) itself, the disks under device-mapper
/// and md devices ([`Layer::serving_disks`]), each member of a btrfs the same way; one entry
/// per disk. A layer abissd cannot serve through anywhere on the way
/// ([`Layer::unserved_layer`]) is [`Unservable::Layer`].
///
/// # Errors
/// Why no disk can serve it.
pub fn serving_disks(
    sys: &Path,
    mount: Option<&Mount>,
    device: DeviceNumber,
) -> Result<Vec<Layer>, Unservable> {
    serving_disks_of(&file_system_stacks(sys, mount, device), mount, device)
}

/// [`serving_disks`] of `stacks`, the [`file_system_stacks`] of `mount` and `device` already
/// read (by a caller that reads their device mapper's tables too).
///
/// # Errors
/// Why no disk can serve it.
pub fn serving_disks_of(
    stacks: &[Layer],
    mount: Option<&Mount>,
    device: DeviceNumber,
) -> Result<Vec<Layer>, Unservable> {
    if stacks.is_empty() {
        return Err(match mount {
            Some(mount) if device.major == 0 && mount.fs_type != "btrfs" => {
                Unservable::NoBlockDevice {
                    fs_type: mount.fs_type.clone(),
                    device,
                }
            }
            _ => Unservable::Unknown { device },
        });
    }
    let mut disks: Vec<Layer> = Vec::new();
    for stack in stacks {
        if let Some(layer) = stack.unserved_layer() {
            return Err(Unservable::Layer {
                stack: Box::new(stack.clone()),
                layer: Box::new(layer.clone()),
            });
        }
        for disk in stack.serving_disks() {
            if !disks.iter().any(|seen| seen.device == disk.device) {
                disks.push(disk.clone());
            }
        }
    }
    Ok(disks)
}

/// The physical disks under block device `device` (itself when it is one, a partition's disk,
/// a device-mapper or md device's members down to their disks): what `--device` naming any
/// level of a stack means. `None` when sysfs does not know it.
#[must_use]
pub fn physical_disks(sys: &Path, device: DeviceNumber) -> Option<Vec<Layer>> {
    let stack = stack_of(sys, device)?;
    Some(stack.physical().into_iter().cloned().collect())
}

/// The devices built on disk `name` (on it or on its partitions), upward through every
/// level, each once, as [`Layer::summary`] says them: what `abissctl status` shows above a
/// managed disk. Empty when nothing is, or sysfs at `sys` does not know the disk.
#[must_use]
pub fn built_on(sys: &Path, name: &str) -> Vec<String> {
    let disk = sys.join("block").join(name);
    let mut pending: Vec<PathBuf> = vec![disk.clone()];
    if let Ok(entries) = std::fs::read_dir(&disk) {
        pending.extend(
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.join("partition").exists()),
        );
    }
    let mut found: Vec<(String, String)> = Vec::new();
    while let Some(dir) = pending.pop() {
        for holder in linked_dirs(&dir.join("holders")) {
            let Some(layer) = layer_at(&holder, 0) else {
                continue;
            };
            if found.len() < MAX_BUILT_ON && !found.iter().any(|(seen, _)| *seen == layer.name) {
                found.push((layer.name.clone(), layer.summary()));
                pending.push(holder);
            }
        }
    }
    found.sort();
    found.into_iter().map(|(_, summary)| summary).collect()
}

/// Whether md's personality `level` (`md/level`: `raid1`) submits a read to its members from
/// the reader's own context: linear, raid0, raid1 and raid10 clone or split the bio there (a
/// raid1 or raid10 picks one mirror per read). raid4, 5 and 6 read through the stripe cache,
/// which md's own thread (`md0_raid5`) works, in new bios of its own.
#[must_use]
pub fn md_reads_in_caller(level: &str) -> bool {
    matches!(level, "linear" | "raid0" | "raid1" | "raid10")
}

/// The directories the links in sysfs directory `dir` lead to (`slaves/`, a btrfs file
/// system's `devices/`), sorted; none when `dir` cannot be read.
fn linked_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| std::fs::canonicalize(entry.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

#[cfg(test)]
#[path = "storage_tests.rs"]
mod tests;
