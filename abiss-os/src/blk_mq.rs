//! The live depth of a disk's driver tags (blk-mq): how many requests the driver may hold at
//! once, the number the elevator cannot reorder.
//!
//! `queue/nr_requests` shows it only while the scheduler is `none` (and not even then right
//! after an elevator was switched off), and `mq/N/nr_tags` shows what was allocated, not what is
//! in use after a shrink. The one place the kernel shows it is debugfs
//! (`block/<disk>/hctxN/tags`). A fresh machine, a container or a minimal system often has no
//! debugfs mounted, so when it is not, this module mounts it privately: in a thread that
//! leaves the process's mount namespace (`unshare(CLONE_NEWNS)`), makes every mount private so
//! nothing propagates back, mounts debugfs, reads, and exits, which takes the namespace and the
//! mount with it. The system's mount table never changes. Needs `CAP_SYS_ADMIN` and a kernel
//! with `CONFIG_DEBUG_FS` that is not locked down; otherwise the depth is unknown (`None`).

use std::fs;
use std::io;
use std::path::Path;

/// Where debugfs is mounted, by convention.
pub const DEBUGFS: &str = "/sys/kernel/debug";

/// How a depth was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// debugfs was mounted at [`DEBUGFS`].
    MountedDebugfs,
    /// debugfs was mounted privately for the read.
    PrivateDebugfs,
}

/// The live driver tag depth of `disk` (its kernel name), the largest over its hardware
/// queues, with how it was read; `None` when it cannot be read (no debugfs in this kernel, no
/// privilege, lockdown, no such disk).
#[must_use]
pub fn driver_tag_depth(disk: &str) -> Option<(u32, Via)> {
    if Path::new(DEBUGFS).join("block").is_dir() {
        return read_depth(Path::new(DEBUGFS), disk).map(|depth| (depth, Via::MountedDebugfs));
    }
    let disk = disk.to_owned();
    std::thread::Builder::new()
        .name("abiss-debugfs".into())
        .spawn(move || private_read(&disk))
        .ok()?
        .join()
        .ok()
        .flatten()
        .map(|depth| (depth, Via::PrivateDebugfs))
}

/// Runs in a thread of its own, which it leaves in a mount namespace of its own: the thread
/// must end after this (it does: it is spawned for this alone).
fn private_read(disk: &str) -> Option<u32> {
    use nix::mount::{mount, MsFlags};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).ok()?;
    // Without this, a shared root (systemd's default) would propagate the mount below back
    // into the system's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .ok()?;
    mount(
        Some("debugfs"),
        DEBUGFS,
        Some("debugfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .ok()?;
    read_depth(Path::new(DEBUGFS), disk)
}

fn read_depth(debugfs: &Path, disk: &str) -> Option<u32> {
    fs::read_dir(debugfs.join("block").join(disk))
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("hctx"))
        .filter_map(|entry| fs::read_to_string(entry.path().join("tags")).ok())
        .filter_map(|text| parse_tags_depth(&text))
        .max()
}

/// The live depth from a `hctxN/tags` file: the `depth` of `bitmap_tags` plus the reserved
/// tags, as `nr_requests` counts them.
#[must_use]
pub fn parse_tags_depth(text: &str) -> Option<u32> {
    let mut reserved = None;
    let mut in_bitmap_tags = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(value) = line.strip_prefix("nr_reserved_tags=") {
            reserved = value.parse::<u32>().ok();
        } else if line == "bitmap_tags:" {
            in_bitmap_tags = true;
        } else if in_bitmap_tags {
            if let Some(value) = line.strip_prefix("depth=") {
                return value.parse::<u32>().ok()?.checked_add(reserved?);
            }
        }
    }
    None
}

/// Whether debugfs is mounted at [`DEBUGFS`] in this mount namespace, for reports that say
/// which way a measurement ran.
pub fn debugfs_mounted() -> io::Result<bool> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    Ok(mounts
        .lines()
        .any(|line| line.split_whitespace().nth(1) == Some(DEBUGFS)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_files_give_the_live_depth_with_reserved_tags() {
        let tags = "nr_tags=128\nnr_reserved_tags=1\nactive_queues=0\n\nbitmap_tags:\ndepth=7\n\
                    busy=0\ncleared=0\n\nbreserved_tags:\ndepth=1\nbusy=0\n";
        assert_eq!(parse_tags_depth(tags), Some(8));
        assert_eq!(parse_tags_depth("nr_tags=128\n"), None);
    }
}
