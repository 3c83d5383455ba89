//! The emulator process set apart from the memory limits of whoever brought the lab up: it is
//! a disk's server, and the kernel's reclaim must never wait on it for pages only it can write.
//!
//! Seen on the lab VM (2026-12-07): a test in a cgroup v1 memory cgroup of 300 MiB wrote to its
//! lab disk; the emulator, in the same cgroup, needed a page, the cgroup's reclaim waited in
//! `folio_wait_writeback` for a page of the lab disk's own file system, whose writeback was a
//! request queued to the emulator, and the disk hung for good (until its FUSE connection was
//! aborted). Two guards, each where the machine allows it:
//! - the emulator moves to the root memory cgroup, which has no limit to reclaim for;
//! - it asks to be an I/O flusher (`PR_SET_IO_FLUSHER`, Linux 5.6, for user-space block
//!   devices: its allocations never wait on I/O), which takes `CAP_SYS_RESOURCE`, missing from
//!   the lab VM's bounding set.

use std::path::Path;

/// `PR_SET_IO_FLUSHER`, which the `libc` crate names only for Android.
const PR_SET_IO_FLUSHER: libc::c_int = 57;

/// cgroup v1's memory hierarchy, where systemd and most distributions mount it.
const V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";

/// The unified hierarchy (cgroup v2).
const V2_ROOT: &str = "/sys/fs/cgroup";

/// Sets the calling process apart (call it before it starts threads: they inherit the flag).
/// What cannot be done is said on standard error, which is the emulator's log.
pub fn set_apart() {
    if let Err(reason) = move_to_root_memory_cgroup() {
        eprintln!("abiss-lab serve: staying in this memory cgroup: {reason}");
    }
    // SAFETY: prctl with integer arguments only; it changes this process's flags.
    if unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "abiss-lab serve: not an I/O flusher ({})",
            std::io::Error::last_os_error()
        );
    }
}

/// Moves this process into the root memory cgroup of the hierarchy that has the memory
/// controller; nothing to do when it is there already.
fn move_to_root_memory_cgroup() -> Result<(), String> {
    let membership = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let procs = match memory_cgroup(&membership) {
        Some(MemoryCgroup::V1("/") | MemoryCgroup::V2("/")) | None => return Ok(()),
        Some(MemoryCgroup::V1(_)) => Path::new(V1_MEMORY_ROOT).join("cgroup.procs"),
        Some(MemoryCgroup::V2(_)) => {
            let controllers =
                std::fs::read_to_string(Path::new(V2_ROOT).join("cgroup.controllers"))
                    .unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "memory") {
                return Ok(());
            }
            Path::new(V2_ROOT).join("cgroup.procs")
        }
    };
    std::fs::write(&procs, std::process::id().to_string())
        .map_err(|e| format!("cannot write {}: {e}", procs.display()))
}

/// The memory cgroup process `pid` is in (v1's memory hierarchy, else the unified one), as
/// its `/proc/PID/cgroup` names it; `None` where it cannot be read.
#[must_use]
pub fn memory_cgroup_of(pid: u32) -> Option<String> {
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    match memory_cgroup(&membership)? {
        MemoryCgroup::V1(path) | MemoryCgroup::V2(path) => Some(path.to_owned()),
    }
}

/// Where a process's memory is accounted, from its `/proc/PID/cgroup`.
#[derive(Debug, PartialEq, Eq)]
enum MemoryCgroup<'a> {
    /// A cgroup v1 `memory` hierarchy's path.
    V1(&'a str),
    /// The unified hierarchy's path (used when no v1 hierarchy has the controller).
    V2(&'a str),
}

fn memory_cgroup(membership: &str) -> Option<MemoryCgroup<'_>> {
    let mut unified = None;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            return Some(MemoryCgroup::V1(path));
        }
        if id == "0" && controllers.is_empty() {
            unified = Some(MemoryCgroup::V2(path));
        }
    }
    unified
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_v1s_when_a_v1_hierarchy_has_the_controller() {
        let lab_vm = "9:name=systemd:/\n4:memory:/process_api/7fa4\n1:cpu:/\n0::/\n";
        assert_eq!(
            memory_cgroup(lab_vm),
            Some(MemoryCgroup::V1("/process_api/7fa4"))
        );
        let joined = "5:cpu,memory:/a/b\n0::/\n";
        assert_eq!(memory_cgroup(joined), Some(MemoryCgroup::V1("/a/b")));
        let unified = "0::/system.slice/abissd.service\n";
        assert_eq!(
            memory_cgroup(unified),
            Some(MemoryCgroup::V2("/system.slice/abissd.service"))
        );
        assert_eq!(memory_cgroup(""), None);
    }
}
