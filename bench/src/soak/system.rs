//! What the machine and abissd hold, as the soak counts it before, during and after: memory,
//! loop devices and mounts, the daemon's descriptors, threads and eBPF map entries, and the
//! disk's settings.

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::{json, Value};

/// What the machine holds, as the soak counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct System {
    loop_devices: usize,
    mounts: usize,
    debugfs_mounts: usize,
    mlocked_kib: u64,
    disk: Option<DiskSettings>,
}

/// A disk's queue settings abissd changes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(super) struct DiskSettings {
    elevator: String,
    nr_requests: String,
    driver_depth: Option<u32>,
}

impl DiskSettings {
    pub(super) fn of(name: &str) -> Option<Self> {
        let queue = format!("/sys/block/{name}/queue");
        let line = std::fs::read_to_string(format!("{queue}/scheduler")).ok()?;
        let elevator = line
            .split_whitespace()
            .find_map(|s| s.strip_prefix('[').and_then(|s| s.strip_suffix(']')))
            .unwrap_or("none")
            .to_owned();
        let nr_requests = std::fs::read_to_string(format!("{queue}/nr_requests"))
            .ok()?
            .trim()
            .to_owned();
        let driver_depth = abiss_os::blk_mq::driver_tag_depth(name).map(|(depth, _)| depth);
        Some(Self {
            elevator,
            nr_requests,
            driver_depth,
        })
    }
}

impl System {
    pub(super) fn now(disk: &str) -> Self {
        let losetup = Command::new("losetup").arg("-a").output();
        let loop_devices =
            losetup.map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count());
        let mounts_text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        Self {
            loop_devices,
            mounts: mounts_text.lines().count(),
            debugfs_mounts: mounts_text
                .lines()
                .filter(|l| l.contains(" debugfs "))
                .count(),
            mlocked_kib: meminfo_kib("Mlocked:"),
            disk: (!disk.is_empty()).then(|| DiskSettings::of(disk)).flatten(),
        }
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "loop_devices": self.loop_devices,
            "mounts": self.mounts,
            "debugfs_mounts": self.debugfs_mounts,
            "mlocked_kib": self.mlocked_kib,
            "disk": self.disk,
        })
    }
}

fn meminfo_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Descriptors, threads (the kernel's io-wq workers, `iou-wrk-N`, and abissd's threads per user,
/// `abiss-close` and `abiss-lock-N`, left out: they start and end with the work) and locked
/// memory of process `pid`.
pub(super) fn process_footprint(pid: u32) -> Value {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    // Threads by name, but those that come and go with users' work.
    let mut thread_kinds = BTreeMap::<String, u64>::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else {
            continue;
        };
        if !["iou-wrk", "abiss-close", "abiss-lock-"]
            .iter()
            .any(|transient| name.starts_with(transient))
        {
            *thread_kinds.entry(name.trim().to_owned()).or_default() += 1;
        }
    }
    let threads: u64 = thread_kinds.values().sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let locked_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    json!({
        "fds": fds,
        "threads": threads,
        "thread_kinds": thread_kinds,
        "locked_kib": locked_kib,
        "fd_kinds": fd_kinds(pid),
    })
}

/// What process `pid`'s descriptors are, counted by kind (`socket`, `anon_inode:bpf-map`,
/// a path), so that a descriptor left over can be named.
fn fd_kinds(pid: u32) -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let kind = target
            .split_once(":[")
            .map_or(target.as_str(), |(kind, _)| kind);
        *kinds.entry(kind.to_owned()).or_default() += 1;
    }
    kinds
}

/// Entries of the hash maps process `pid` holds, by map name; arrays are left out (their
/// entries always exist). The maps are found through the process's descriptors (`map_id` in
/// their fdinfo: this bpftool names no owning pids) and dumped with bpftool.
pub(super) fn hash_map_entries(pid: u32) -> BTreeMap<String, u64> {
    let mut entries = BTreeMap::new();
    let mut ids = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let is_map = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf-map");
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            entry.file_name().to_string_lossy()
        ));
        if let (true, Ok(info)) = (is_map, info) {
            ids.extend(
                info.lines()
                    .find_map(|l| l.strip_prefix("map_id:"))
                    .map(|v| v.trim().to_owned()),
            );
        }
    }
    for id in ids {
        let show = bpftool_json(&["map", "show", "id", &id]);
        let kind = show["type"].as_str().unwrap_or_default();
        if !kind.contains("hash") {
            continue;
        }
        let count = bpftool_json(&["map", "dump", "id", &id])
            .as_array()
            .map_or(0, |d| d.len() as u64);
        let name = show["name"].as_str().unwrap_or("?").to_owned();
        *entries.entry(name).or_default() += count;
    }
    entries
}

fn bpftool_json(args: &[&str]) -> Value {
    Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or(Value::Null)
}
