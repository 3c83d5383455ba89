//! `abissctl doctor [PATH]`: what the machine allows and whether abiss can serve PATH, checked
//! against what abissd itself then does: a file on a managed disk (served, with the free rate
//! `status` reports), on an unmanaged disk and on a two-device btrfs (not served, exit 16,
//! and abissd refuses the attach too), a part switched off with `--disable`, and no daemon.
//! Each is asked as root and as `nobody`, who needs no privilege for any of it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use abiss_tests::{
    abissctl_as_nobody, binary, require_root, Daemon, Ext4Mount, LoopDevice, Scratch,
};
use serde_json::Value;

/// `doctor`'s exit code when PATH cannot be served.
const NOT_SERVED: i32 = 16;

/// `abissctl --socket SOCKET doctor ARGS…` as root.
fn doctor(socket: &Path, args: &[&str]) -> Output {
    Command::new(binary("abissctl"))
        .arg("--socket")
        .arg(socket)
        .arg("doctor")
        .args(args)
        .output()
        .expect("run abissctl doctor")
}

/// `doctor ARGS…` as `nobody`.
fn doctor_as_nobody(socket: &Path, args: &[&str]) -> Output {
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    abissctl_as_nobody(socket, &all)
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", text(output)))
}

/// The finding about `topic` as (state, detail).
fn finding(report: &Value, topic: &str) -> (String, String) {
    let found = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["topic"] == topic)
        .unwrap_or_else(|| panic!("no {topic} in {report:#}"));
    (
        found["state"].as_str().unwrap_or_default().to_owned(),
        found["detail"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The line of the text report about `topic`.
fn line<'a>(text: &'a str, topic: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(topic) && l[topic.len()..].starts_with("  "))
        .unwrap_or_else(|| panic!("no line for {topic} in\n{text}"))
}

/// A file of 4 MiB in `dir`, readable by everyone.
fn file_in(dir: &Path) -> PathBuf {
    let path = dir.join("movie.bin");
    std::fs::write(&path, vec![7u8; 4 << 20]).expect("write file");
    path
}

#[test]
fn a_file_on_a_managed_disk_is_served_with_the_rate_admission_would_give() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let file = file_in(fs.path());
    let daemon = Daemon::start_managing(fs.device().path(), &["--capacity", "20MB/s"]);
    let _stream = daemon.attach_at_1mb(&file);
    let status: Value = serde_json::from_slice(&daemon.ctl(["status", "--json"]).stdout).unwrap();
    let free = status["devices"][0]["free"].as_u64().expect("a free rate");
    let path = file.to_str().unwrap();

    let output = doctor(daemon.socket(), &["--json", path]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let report = json(&output);
    let disk = &report["path"]["disk"];
    assert_eq!(disk["name"], fs.device().name());
    assert_eq!(disk["managed"], true);
    assert_eq!(
        disk["free"].as_u64(),
        Some(free),
        "the free rate status reports"
    );
    assert!(
        disk["model"].as_str().unwrap().contains("configured"),
        "{disk}"
    );
    assert_eq!(report["path"]["served"], true);
    assert_eq!(report["path"]["file_system"]["fs_type"], "ext4");
    assert_eq!(finding(&report, "abissd").0, "yes");

    for output in [
        doctor(daemon.socket(), &[path]),
        doctor_as_nobody(daemon.socket(), &[path]),
    ] {
        let shown = text(&output);
        assert_eq!(output.status.code(), Some(0), "{shown}");
        let served = line(&shown, "served");
        let readable = abiss_proto::ByteRate(free).readable();
        assert!(
            served.contains("yes") && served.contains(&readable),
            "{served}"
        );
        let disk = line(&shown, &format!("disk {}", fs.device().name()));
        assert!(
            disk.contains("managed by abissd") && disk.contains("1MB/s"),
            "{disk}"
        );
        assert!(
            line(&shown, "stack").contains(&format!(
                "{} ({}, loop over",
                fs.device().name(),
                fs.device().number()
            )),
            "{shown}"
        );
    }
    // What root may see and nobody may not is said, not guessed.
    let as_nobody = text(&doctor_as_nobody(daemon.socket(), &[]));
    assert!(
        line(&as_nobody, "part direct-io-tagging").contains("unknown"),
        "{as_nobody}"
    );
    assert!(line(&as_nobody, "user").contains("not root"), "{as_nobody}");
    let as_root = text(&doctor(daemon.socket(), &[]));
    assert!(
        line(&as_root, "part direct-io-tagging").contains("yes"),
        "{as_root}"
    );
}

#[test]
fn a_file_on_an_unmanaged_disk_is_not_served_and_abissd_agrees() {
    require_root!();
    let managed = LoopDevice::new_in("/dev/shm", 16);
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let file = file_in(fs.path());
    let daemon = Daemon::start_managing(managed.path(), &[]);
    let path = file.to_str().unwrap();
    let unmanaged = fs.device().name();

    let report = json(&doctor(daemon.socket(), &["-j", path]));
    assert_eq!(report["exit_code"], NOT_SERVED);
    assert_eq!(report["path"]["served"], false);
    assert_eq!(report["path"]["disk"]["managed"], false);
    let why = report["path"]["why_not"].as_str().unwrap();
    assert!(
        why.contains(&unmanaged) && why.contains("does not manage"),
        "{why}"
    );
    assert!(
        finding(&report, "abissd").1.contains(&managed.name()),
        "the disks it manages"
    );

    for output in [
        doctor(daemon.socket(), &[path]),
        doctor_as_nobody(daemon.socket(), &[path]),
    ] {
        let shown = text(&output);
        assert_eq!(output.status.code(), Some(NOT_SERVED), "{shown}");
        assert!(
            line(&shown, &format!("disk {unmanaged}")).contains(" no "),
            "{shown}"
        );
        assert!(
            line(&shown, "served").contains(&format!("--device {unmanaged}")),
            "{shown}"
        );
    }
    // abissd refuses it for the reason doctor gave (exit 5: a disk it does not manage).
    let attach = daemon.ctl(["attach", path, "--rate", "1MB/s"]);
    assert_eq!(attach.status.code(), Some(5), "{}", text(&attach));
}

/// btrfs over two loop devices, mounted; unmounted on drop (before the devices go).
struct Btrfs {
    mount: Scratch,
    devices: [LoopDevice; 2],
}

impl Btrfs {
    fn new() -> Self {
        // 128 MiB each: mkfs.btrfs refuses devices much smaller than 110 MiB.
        let devices = [
            LoopDevice::new_in("/dev/shm", 128),
            LoopDevice::new_in("/dev/shm", 128),
        ];
        let status = Command::new("mkfs.btrfs")
            .args(["-q", "-f", "-d", "raid0", "-m", "raid1"])
            .stdout(std::process::Stdio::null())
            .args(devices.iter().map(LoopDevice::path))
            .status()
            .expect("run mkfs.btrfs (btrfs-progs)");
        assert!(status.success(), "mkfs.btrfs failed");
        let mount = Scratch::new_in("/tmp", "btrfs");
        let status = Command::new("mount")
            .arg("-o")
            .arg(format!("device={}", devices[1].path().display()))
            .arg(devices[0].path())
            .arg(mount.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount btrfs failed");
        Self { mount, devices }
    }
}

impl Drop for Btrfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.mount.path()).status();
    }
}

#[test]
fn a_file_on_a_btrfs_over_two_disks_names_both_and_is_served_once_both_are_managed() {
    require_root!();
    let btrfs = Btrfs::new();
    let file = file_in(btrfs.mount.path());
    let path = file.to_str().unwrap();
    let mut names: Vec<String> = btrfs.devices.iter().map(LoopDevice::name).collect();
    names.sort();
    {
        let daemon = Daemon::start_managing(btrfs.devices[0].path(), &[]);
        let report = json(&doctor(daemon.socket(), &["--json", path]));
        assert_eq!(report["exit_code"], NOT_SERVED);
        assert_eq!(report["path"]["file_system"]["fs_type"], "btrfs");
        let stack: Vec<&str> = report["path"]["stack"]
            .as_array()
            .unwrap()
            .iter()
            .map(|layer| layer["name"].as_str().unwrap())
            .collect();
        assert_eq!(stack, names, "both devices of the file system");
        let unmanaged = btrfs.devices[1].name();
        let why = report["path"]["why_not"].as_str().unwrap();
        assert!(
            why.contains(&format!(
                "which abissd does not manage; start abissd with --device {unmanaged}"
            )),
            "{why}"
        );
        let shown = text(&doctor_as_nobody(daemon.socket(), &[path]));
        assert!(
            line(&shown, &format!("disk {}", btrfs.devices[0].name()))
                .contains("managed by abissd"),
            "{shown}"
        );
        assert!(
            line(&shown, &format!("disk {unmanaged}")).contains(" no "),
            "{shown}"
        );
        // With one of its devices managed, abissd does not serve it either, and names the other.
        let attach = daemon.ctl(["attach", path, "--rate", "1MB/s"]);
        assert_eq!(attach.status.code(), Some(5), "{}", text(&attach));
        assert!(
            text(&attach).contains(&format!("is on {unmanaged} (")),
            "{}",
            text(&attach)
        );
    }
    let daemon = Daemon::start_with(&[
        "--device",
        btrfs.devices[0].path().to_str().unwrap(),
        "--device",
        btrfs.devices[1].path().to_str().unwrap(),
    ]);
    let report = json(&doctor(daemon.socket(), &["--json", path]));
    assert_eq!(report["path"]["served"], true, "{report}");
    let disks: Vec<&str> = report["path"]["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|disk| disk["name"].as_str().unwrap())
        .collect();
    assert_eq!(disks, names, "served from both: {report}");
    let shown = text(&doctor_as_nobody(daemon.socket(), &[path]));
    assert!(
        line(&shown, "served")
            .contains(&format!("abiss can serve it from {}", names.join(" and "))),
        "{shown}"
    );
}

#[test]
fn a_part_switched_off_in_abissd_is_off_though_the_kernel_has_it() {
    require_root!();
    let daemon = Daemon::start_with(&["--disable", "uring-reports"]);
    let output = doctor(daemon.socket(), &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let report = json(&output);
    let (state, detail) = finding(&report, "part uring-reports");
    assert_eq!(state, "off", "{detail}");
    assert!(detail.contains("--disable uring-reports"), "{detail}");
    assert_eq!(finding(&report, "part read-tracking").0, "yes");
    let shown = text(&doctor_as_nobody(daemon.socket(), &[]));
    assert!(
        line(&shown, "part uring-reports").contains(" off "),
        "{shown}"
    );
}

#[test]
fn without_a_daemon_the_kernel_is_still_reported_and_no_path_is_served() {
    require_root!();
    let scratch = Scratch::new_in("/tmp", "doctor-nodaemon");
    let socket = scratch.path().join("nobody-listens.sock");
    let file = file_in(scratch.path());
    let path = file.to_str().unwrap();
    for output in [doctor(&socket, &[]), doctor_as_nobody(&socket, &[])] {
        let shown = text(&output);
        assert_eq!(
            output.status.code(),
            Some(0),
            "no PATH, nothing to refuse: {shown}"
        );
        assert!(line(&shown, "abissd").contains("not running"), "{shown}");
        assert!(line(&shown, "btf").contains("yes"), "{shown}");
        assert!(line(&shown, "debugfs").contains("not needed"), "{shown}");
    }
    for output in [doctor(&socket, &[path]), doctor_as_nobody(&socket, &[path])] {
        let shown = text(&output);
        assert_eq!(output.status.code(), Some(NOT_SERVED), "{shown}");
        assert!(line(&shown, "served").contains("not running"), "{shown}");
    }
    // A path that is not there is a bad file (11), said in one sentence.
    let missing = doctor(&socket, &["/nonexistent/file"]);
    assert_eq!(missing.status.code(), Some(11), "{}", text(&missing));
    assert_eq!(String::from_utf8_lossy(&missing.stderr).lines().count(), 1);
}
