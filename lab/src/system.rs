//! Thin wrappers over the system: commands, sysfs, mounts and processes.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::LabError;

/// Runs a command and returns its standard output; the error carries its standard error.
pub fn run(program: &str, args: &[&str]) -> Result<String, LabError> {
    let what = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| LabError::system(&what, e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(LabError::system(
            &what,
            format!("{} ({})", stderr.trim(), output.status),
        ))
    }
}

/// Mount points and sources from `/proc/self/mountinfo`, octal escapes decoded.
#[must_use]
pub fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = fields.get(4)?;
            let dash = fields.iter().position(|f| *f == "-")?;
            let source = fields.get(dash + 2)?;
            Some((PathBuf::from(unescape(mount_point)), unescape(source)))
        })
        .collect()
}

/// Whether `path` is a mount point.
#[must_use]
pub fn is_mounted(path: &Path) -> bool {
    mounts().iter().any(|(mp, _)| mp == path)
}

fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Ok(code) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(char::from(code));
                i += 4;
                continue;
            }
        }
        out.push(char::from(bytes[i]));
        i += 1;
    }
    out
}

/// Loop devices (`/dev/loopN`) and their backing files.
#[must_use]
pub fn loop_devices() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            Some((
                PathBuf::from("/dev").join(name),
                PathBuf::from(backing.trim().trim_end_matches(" (deleted)")),
            ))
        })
        .collect()
}

/// The sysfs directory of a block device such as `/dev/loop3`.
#[must_use]
pub fn sysfs_block(device: &Path) -> PathBuf {
    let name = device.file_name().unwrap_or_default();
    Path::new("/sys/block").join(name)
}

/// The I/O schedulers (elevators) this kernel offers, as the block devices' `queue/scheduler`
/// files list them (every multi-queue device lists every registered one); empty if no device
/// shows the list.
#[must_use]
pub fn elevators_offered() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut offered: Vec<String> = Vec::new();
    for entry in entries.flatten() {
        let Ok(line) = std::fs::read_to_string(entry.path().join("queue/scheduler")) else {
            continue;
        };
        for name in line.split_whitespace() {
            let name = name.trim_matches(['[', ']']);
            if !offered.iter().any(|known| known == name) {
                offered.push(name.to_owned());
            }
        }
    }
    offered.sort();
    offered
}

/// Whether the kernel offers elevator `name`, after asking for its module (`NAME-iosched`)
/// when no device lists it: distributions build bfq and kyber as modules, which the kernel
/// loads on the first selection. True when no device lists any.
#[must_use]
pub fn elevator_available(name: &str) -> bool {
    let listed = elevators_offered();
    // Where no device lists the schedulers, selecting one is what tells.
    if listed.is_empty() || listed.iter().any(|o| o == name) {
        return true;
    }
    // A name is passed to modprobe only if it cannot read as one of its options.
    let plain = !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
    plain
        && Command::new("modprobe")
            .args(["-q", &format!("{name}-iosched")])
            .status()
            .is_ok_and(|s| s.success())
        && elevators_offered().iter().any(|o| o == name)
}

/// Writes a sysfs attribute, trying again while the kernel says busy ([`abiss_os::sysfs`]).
pub fn write_attr(path: &Path, value: &str) -> Result<(), LabError> {
    abiss_os::sysfs::write_attr(path, value)
        .map_err(|e| LabError::system(format!("writing {value:?} to {}", path.display()), e))
}

/// Reads a sysfs attribute, trimmed.
pub fn read_attr(path: &Path) -> Result<String, LabError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(LabError::io(path))
}

/// A process's start time (clock ticks since boot), or `None` if it is gone or a zombie.
#[must_use]
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    if matches!(fields.first(), Some(&"Z" | &"X")) {
        return None;
    }
    // Field 22 of stat is the start time; `rest` begins at field 3.
    fields.get(19)?.parse().ok()
}

/// Whether the process `pid` that started at `start_time` is still running.
#[must_use]
pub fn process_alive(pid: i32, start_time: u64) -> bool {
    process_start_time(pid) == Some(start_time)
}

/// Processes whose command line contains all of `needles`, as (pid, start time).
#[must_use]
pub fn find_processes(needles: &[&str]) -> Vec<(i32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let all = needles.iter().all(|n| args.iter().any(|a| a == n));
            if all {
                Some((pid, process_start_time(pid)?))
            } else {
                None
            }
        })
        .collect()
}

/// The kernel's count of CPU time stolen by the hypervisor so far (steal: time the machine's
/// CPUs had work but the hypervisor ran something else), all CPUs, in milliseconds; `None`
/// where the kernel does not count it.
#[must_use]
pub fn stolen_ms() -> Option<u64> {
    use procfs::CurrentSI as _;
    let steal_ticks = procfs::KernelStats::current().ok()?.total.steal?;
    Some(steal_ticks * 1000 / procfs::ticks_per_second())
}

/// Steal since a reading of [`stolen_ms`] (`before`), ms; `None` where the kernel does not
/// count it.
#[must_use]
pub fn stolen_since(before: Option<u64>) -> Option<u64> {
    before
        .zip(stolen_ms())
        .map(|(before, now)| now.saturating_sub(before))
}

/// The share of `cpus` CPUs' time over `wall` that `stolen_ms` of steal was.
#[must_use]
pub fn stolen_share(stolen_ms: u64, wall: std::time::Duration, cpus: usize) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "milliseconds and a CPU count")]
    let available_ms = wall.as_secs_f64() * 1000.0 * cpus.max(1) as f64;
    #[expect(clippy::cast_precision_loss, reason = "milliseconds")]
    let stolen = stolen_ms as f64;
    stolen / available_ms.max(1.0)
}

/// (busy, total) ticks of all CPUs so far, from `/proc/stat`: total is user, nice, system,
/// idle, iowait, irq, softirq and steal; busy is total less idle and iowait.
pub fn cpu_ticks() -> Result<(u64, u64), LabError> {
    use procfs::CurrentSI as _;
    let stats = procfs::KernelStats::current()
        .map_err(|error| LabError::system("reading /proc/stat", error))?;
    let cpu = stats.total;
    let idle = cpu.idle + cpu.iowait.unwrap_or(0);
    let total = cpu.user
        + cpu.nice
        + cpu.system
        + idle
        + cpu.irq.unwrap_or(0)
        + cpu.softirq.unwrap_or(0)
        + cpu.steal.unwrap_or(0);
    Ok((total - idle, total))
}

/// The machine's CPUs as the kernel counts them in `/proc/stat` (the ones steal is summed
/// over); 1 if that cannot be read.
#[must_use]
pub fn cpu_count() -> usize {
    use procfs::CurrentSI as _;
    procfs::KernelStats::current().map_or(1, |stats| stats.cpu_time.len().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn own_process_is_alive() {
        let pid = i32::try_from(std::process::id()).unwrap();
        let start = process_start_time(pid).unwrap();
        assert!(process_alive(pid, start));
        assert!(!process_alive(pid, start + 1));
    }
}
