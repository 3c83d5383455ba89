//! PATH's part of `doctor`: its file system, its stack down to the physical disks, whether
//! abissd manages the disk it would serve PATH from, that disk's model, and the rate admission
//! would give a stream there now (abissd's `status`, as `abissctl status` shows it).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use abiss_proto::{ByteRate, ByteSize, DeviceNumber, DeviceStatus, StatusReport};
use serde::Serialize;

use super::{Finding, State};
use crate::error::CliError;
use abiss_kernel::storage::{self, Layer, Mount};

const SYS: &str = "/sys";

/// PATH as the user can see it.
#[derive(Debug)]
pub(super) struct Examined {
    path: PathBuf,
    device: DeviceNumber,
    what: String,
    readable: bool,
}

/// Looks PATH up as the user; a path the user cannot reach is an error (exit 11).
pub(super) fn examine(path: &Path) -> Result<Examined, CliError> {
    let canonical = std::fs::canonicalize(path).map_err(|error| {
        CliError::BadFile(format!("cannot examine {}: {error}", path.display()))
    })?;
    let meta = std::fs::metadata(&canonical).map_err(|error| {
        CliError::BadFile(format!("cannot examine {}: {error}", path.display()))
    })?;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        format!("a regular file of {}", ByteSize(meta.len()).readable())
    } else if kind.is_dir() {
        "a directory: what follows holds for the files in it".to_owned()
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device node: abissd streams regular files, and this node's own file system is below"
            .to_owned()
    } else {
        "neither a file nor a directory: abissd streams regular files".to_owned()
    };
    let readable = nix::unistd::access(&canonical, nix::unistd::AccessFlags::R_OK).is_ok();
    Ok(Examined {
        device: DeviceNumber {
            major: libc::major(meta.dev()),
            minor: libc::minor(meta.dev()),
        },
        path: canonical,
        what,
        readable,
    })
}

/// The disk a file would be served from, as `--json` shows it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct ServingDisk {
    name: String,
    device: DeviceNumber,
    managed: bool,
    /// Where abissd's figures for it come from (its device model, or the configured capacity).
    model: Option<String>,
    admission: Option<String>,
    /// The rate admission would give one more stream with the default buffer now.
    free: Option<ByteRate>,
}

/// What `doctor` found of PATH.
#[derive(Debug, Serialize)]
pub(super) struct PathReport {
    path: PathBuf,
    file_system: Option<Mount>,
    /// The block devices under the file system (several for a multi-device btrfs).
    stack: Vec<Layer>,
    /// The first of `disks` (the one, for most file systems).
    disk: Option<ServingDisk>,
    /// Every disk that would serve a stream of PATH (several for a file system over several:
    /// each is charged the stream's whole rate).
    disks: Vec<ServingDisk>,
    /// Whether abiss can serve PATH now; when not, why.
    pub served: bool,
    why_not: Option<String>,
    #[serde(skip)]
    pub findings: Vec<Finding>,
}

/// The report on PATH, with what abissd said (`None`: it does not answer).
pub(super) fn report(examined: Examined, daemon: Option<&StatusReport>) -> PathReport {
    let mut findings = vec![Finding::info(
        "path",
        format!("{}: {}", examined.path.display(), examined.what),
    )];
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| storage::parse_mountinfo(&text))
        .unwrap_or_default();
    let mount = storage::mount_of(&mounts, &examined.path, examined.device).cloned();
    findings.push(file_system_finding(mount.as_ref(), examined.device));
    let sys = Path::new(SYS);
    let stacks = storage::file_system_stacks(sys, mount.as_ref(), examined.device);
    for layer in &stacks {
        findings.push(Finding::info("stack", layer.describe()));
    }
    let devices = daemon.map_or(&[][..], |report| report.devices.as_slice());
    let physical: Vec<&Layer> = stacks.iter().flat_map(Layer::physical).collect();
    for disk in &physical {
        findings.push(managed_finding(disk, devices, daemon.is_some()));
    }
    // The device mapper's tables say more (dm-crypt's workqueues, LVM's raid5), but only to
    // root: as another user this says nothing, as abissd will at attach.
    let tables = abiss_kernel::device_mapper::findings(&stacks);
    let path_text = examined.path.display().to_string();
    for warning in &tables.warnings {
        findings.push(Finding::info("warning", format!("{path_text} {warning}")));
    }
    // abissd serves a file from the disks under its file system (a partition's disk, every
    // device of a btrfs, the members of a raid1), as `storage::serving_disks` finds them for
    // abissd too.
    let serving_disks = storage::serving_disks_of(&stacks, mount.as_ref(), examined.device);
    let serving: Vec<(&Layer, Option<&DeviceStatus>)> = serving_disks
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|disk| (disk, devices.iter().find(|d| d.device == disk.device)))
        .collect();
    let why_not = tables
        .refusal
        .map(|refusal| format!("{path_text} {refusal}"))
        .or_else(|| why_not(&examined, &serving_disks, &serving, daemon.is_some()));
    findings.push(match &why_not {
        None => {
            let names: Vec<&str> = serving.iter().map(|(d, _)| d.name.as_str()).collect();
            let free = serving.iter().filter_map(|(_, s)| s.map(|s| s.free)).min();
            Finding::new(
                "served",
                State::Yes,
                format!(
                    "abiss can serve it from {}: admission would give a stream up to {} now",
                    names.join(" and "),
                    free.map_or_else(String::new, abiss_proto::ByteRate::readable)
                ),
            )
        }
        Some(why) => Finding::new("served", State::No, why.clone()),
    });
    let disks: Vec<ServingDisk> = serving
        .iter()
        .map(|(disk, status)| serving_disk(disk, *status))
        .collect();
    PathReport {
        path: examined.path,
        file_system: mount,
        disk: disks.first().cloned(),
        disks,
        stack: stacks,
        served: why_not.is_none(),
        why_not,
        findings,
    }
}

fn file_system_finding(mount: Option<&Mount>, device: DeviceNumber) -> Finding {
    match mount {
        Some(mount) => Finding::info(
            "file system",
            format!(
                "{} from {} at {}; its files report device {device}",
                mount.fs_type,
                mount.source,
                mount.at.display()
            ),
        ),
        None => Finding::new(
            "file system",
            State::Unknown,
            format!("no mount in /proc/self/mountinfo holds it; its files report device {device}"),
        ),
    }
}

fn managed_finding(disk: &Layer, devices: &[DeviceStatus], daemon: bool) -> Finding {
    let topic = format!("disk {}", disk.name);
    match devices.iter().find(|d| d.device == disk.device) {
        Some(status) => Finding::new(
            topic,
            State::Yes,
            format!(
                "managed by abissd: elevator {}, capacity {} ({}), admission {}, {} streams reserving {}, {} free",
                status.elevator,
                status.capacity.readable(),
                status.capacity_source,
                status.admission,
                status.streams,
                status.reserved.readable(),
                status.free.readable()
            ),
        ),
        None if daemon => Finding::new(
            topic,
            State::No,
            format!("{} ({}) is not managed by abissd (abissd --device {})", disk.name, disk.device, disk.name),
        ),
        None => Finding::new(topic, State::Unknown, "abissd does not answer, so nothing is managed now"),
    }
}

fn serving_disk(disk: &Layer, status: Option<&DeviceStatus>) -> ServingDisk {
    ServingDisk {
        name: disk.name.clone(),
        device: disk.device,
        managed: status.is_some(),
        model: status.map(|s| s.capacity_source.clone()),
        admission: status.map(|s| s.admission.clone()),
        free: status.map(|s| s.free),
    }
}

/// Why abiss cannot serve PATH now, or `None` when it can: from the disks that would
/// serve it, each with what abissd says of it.
fn why_not(
    examined: &Examined,
    serving: &Result<Vec<Layer>, storage::Unservable>,
    statuses: &[(&Layer, Option<&DeviceStatus>)],
    daemon: bool,
) -> Option<String> {
    let path = examined.path.display();
    if let Err(unservable) = serving {
        return Some(format!("{path} {}", unservable.reason()));
    }
    if !daemon {
        return Some("abissd is not running; start it with --device for this disk".to_owned());
    }
    for (disk, status) in statuses {
        let Some(status) = status else {
            return Some(format!(
                "{path} is on {} ({}), which abissd does not manage; start abissd with --device {}",
                disk.name, disk.device, disk.name
            ));
        };
        if status.free == ByteRate(0) {
            return Some(format!(
                "{} is full: admission would give a stream nothing now",
                disk.name
            ));
        }
    }
    if !examined.readable {
        return Some(
            "you may not read it, so you cannot attach it (abissctl opens the file as you)"
                .to_owned(),
        );
    }
    None
}
