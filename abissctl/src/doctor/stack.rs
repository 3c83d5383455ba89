//! Where a path's data lives: its mount (from `/proc/self/mountinfo`), and the block devices
//! under it down to the physical disks, read from sysfs (`/sys/dev/block/MAJ:MIN/{partition,
//! slaves, dm/name, dm/uuid, md/level, loop/backing_file}`, and `/sys/fs/btrfs/*/devices` for
//! btrfs, whose files carry an anonymous device number). Reads only files every user may
//! read; mounts nothing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use serde::Serialize;

/// How deep a stack may go before it is taken for a loop in sysfs.
const MAX_DEPTH: usize = 16;

/// One mount of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Mount {
    /// The device number its files report (anonymous, major 0, for btrfs, tmpfs, NFS, …).
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
pub(crate) fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_mount_line).collect()
}

/// `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_mount_line(line: &str) -> Option<Mount> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let device = fields.get(2)?.parse().ok()?;
    let at = PathBuf::from(unescape(fields.get(4)?));
    let mut after = after.split(' ');
    let fs_type = after.next()?.to_owned();
    let source = unescape(after.next()?);
    Some(Mount {
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
pub(crate) fn mount_of<'a>(
    mounts: &'a [Mount],
    path: &Path,
    device: DeviceNumber,
) -> Option<&'a Mount> {
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
pub(crate) enum Kind {
    /// A whole disk (or anything else with a queue of its own and nothing below).
    Disk,
    /// Partition `number` of the device below it.
    Partition { number: u32 },
    /// A device-mapper device; `subsystem` from its uuid (`CRYPT`, `LVM`), when it has one.
    DeviceMapper {
        name: String,
        subsystem: Option<String>,
    },
    /// An md array.
    Md { level: String },
    /// A loop device over a file (unknown when detached, or hidden).
    Loop { backing_file: Option<String> },
}

/// A block device and the devices it is built on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Layer {
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
    /// The disk abissd serves a file of this device from: a partition's disk, else itself.
    pub(crate) fn serving_disk(&self) -> &Layer {
        match (&self.kind, self.below.first()) {
            (Kind::Partition { .. }, Some(disk)) => disk,
            _ => self,
        }
    }

    /// The devices at the bottom: those built on nothing the kernel shows.
    pub(crate) fn physical(&self) -> Vec<&Layer> {
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

    /// `dm-0 (253:0, dm-crypt 'root') → sda2 (8:2, partition 2) → sda (8:0, disk)`.
    pub(crate) fn describe(&self) -> String {
        let mut text = format!("{} ({}, {})", self.name, self.device, self.kind_text());
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
pub(crate) fn stack_of(sys: &Path, device: DeviceNumber) -> Option<Layer> {
    let dir = std::fs::canonicalize(sys.join("dev/block").join(device.to_string())).ok()?;
    layer_at(&dir, 0)
}

/// The stack under the block device whose sysfs directory is `dir` (symlinks resolved).
pub(crate) fn layer_at(dir: &Path, depth: usize) -> Option<Layer> {
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
pub(crate) fn btrfs_devices(sys: &Path, source_name: &str) -> Vec<PathBuf> {
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
#[path = "stack_tests.rs"]
mod tests;
