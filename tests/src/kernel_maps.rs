//! The kernel's side, through `bpftool`: abissd's eBPF maps and programs.

use std::process::{Command, Stdio};

/// `bpftool -j ARGS`, parsed.
fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("run bpftool");
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).expect("bpftool json")
}

/// The kernel id of the eBPF map `name` that process `pid` (a daemon) holds.
#[must_use]
pub fn daemon_map_id(pid: u32, name: &str) -> String {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let info = std::fs::read_to_string(entry.expect("entry").path()).unwrap_or_default();
        if let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) {
            ids.push(id.trim().to_owned());
        }
    }
    ids.into_iter()
        .find(|id| bpftool_json(&["map", "show", "id", id])["name"] == name)
        .unwrap_or_else(|| panic!("the daemon holds no map {name}"))
}

/// The entries of the eBPF map with kernel id `id`, as `bpftool map dump` gives them (with
/// BTF, each has a `formatted` key and value; without, raw bytes).
#[must_use]
pub fn map_dump(id: &str) -> Vec<serde_json::Value> {
    match bpftool_json(&["map", "dump", "id", id]) {
        serde_json::Value::Array(entries) => entries,
        other => panic!("bpftool dumped {other}"),
    }
}

/// The entries of the eBPF map `name` that process `pid` (a daemon) holds.
#[must_use]
pub fn daemon_map_dump(pid: u32, name: &str) -> Vec<serde_json::Value> {
    map_dump(&daemon_map_id(pid, name))
}

/// Field `name` of the `CONTROL` map's entry `entry` (as [`map_dump`] gives it), the
/// `index`th u32 of the struct when bpftool has no BTF to name it by.
#[must_use]
pub fn control_field(entry: &serde_json::Value, name: &str, index: usize) -> u64 {
    if let Some(value) = entry.get("formatted").map(|f| &f["value"]) {
        return value[name].as_u64().expect("a number");
    }
    let bytes: Vec<u8> = entry["value"]
        .as_array()
        .expect("value bytes")
        .iter()
        .map(|b| {
            u8::from_str_radix(b.as_str().expect("hex").trim_start_matches("0x"), 16).expect("hex")
        })
        .collect();
    let at = index * 4;
    u64::from(u32::from_ne_bytes(
        bytes[at..at + 4].try_into().expect("4 bytes"),
    ))
}

/// Whether a BPF program with kernel id `id` is loaded.
#[must_use]
pub fn program_loaded(id: u32) -> bool {
    Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
