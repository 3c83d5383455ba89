//! The Debian package (`cargo xtask deb`) as an operator meets it: `dpkg -i` enables and starts
//! abissd under a real systemd, it serves a stream, `dpkg -i` of the same package upgrades it
//! over itself keeping the operator's `/etc/abiss/abissd.toml`, and `dpkg -r` then `dpkg -P`
//! leave no file, unit, eBPF program or changed disk setting behind.
//!
//! dpkg must not change this machine, and the package's systemd must be the test's own (see
//! `abiss_tests::systemd`): the test boots systemd in namespaces in which `/usr`, `/etc` and
//! `/var` are overlays on the host's, their changes kept in the test's scratch directory.
//! dpkg installs into them with the host's package database as its starting point, and what a
//! purge leaves is what is left in the overlays' upper directories. The host's
//! `policy-rc.d` (a container's "start no service") is removed in the overlay, so that the
//! maintainer scripts start abissd as on a machine whose PID 1 is systemd.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use abiss_tests::systemd::{prepare_units, scheduler_of, text, ServiceManager, SYSTEMD};
use abiss_tests::{
    binary, program_loaded, require_root, wait_until, Ext4Mount, LoopDevice, Scratch,
};

/// The host directories dpkg and the service write to, overlaid in the namespace.
const OVERLAID: [&str; 3] = ["usr", "etc", "var"];

const CONFIG: &str = "/etc/abiss/abissd.toml";

/// Paths of the package on the host, which the test must not touch.
const HOST_PATHS: [&str; 4] = [
    "/usr/sbin/abissd",
    "/usr/bin/abissctl",
    "/etc/abiss",
    "/lib/systemd/system/abissd.service",
];

/// `cargo xtask deb` of the test's binaries, into `out`.
fn build_package(out: &Path) -> PathBuf {
    let bin_dir = binary("abissd").parent().unwrap().to_owned();
    let output = Command::new(binary("xtask"))
        .arg("deb")
        .arg("--from")
        .arg(&bin_dir)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run xtask deb");
    assert!(output.status.success(), "xtask deb: {}", text(&output));
    std::fs::read_dir(out)
        .expect("the package directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("xtask deb made no .deb")
}

/// The test's systemd, with `/usr`, `/etc` and `/var` overlaid (upper directories under
/// `scratch`), a private `/run`, and `units` on `/etc/systemd/system`.
fn boot(scratch: &Path, units: &Path) -> ServiceManager {
    let mut mounts = String::new();
    for dir in OVERLAID {
        let upper = scratch.join("upper").join(dir);
        let work = scratch.join("work").join(dir);
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let _ = write!(
            mounts,
            "mount -t overlay overlay -o lowerdir=/{dir},upperdir={},workdir={} /{dir}; ",
            upper.display(),
            work.display()
        );
    }
    let _ = write!(
        mounts,
        "mount -t tmpfs tmpfs /run; \
         if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi; \
         mount --bind {} /etc/systemd/system; rm -f /usr/sbin/policy-rc.d",
        units.display()
    );
    ServiceManager::boot(&mounts, &scratch.join("systemd.log"))
}

/// `dpkg ARGS` in the namespace, which must succeed.
fn dpkg(manager: &ServiceManager, args: &[&str]) {
    let output = manager.run(Path::new("/usr/bin/dpkg"), args);
    assert!(
        output.status.success(),
        "dpkg {args:?}: {}\n{}",
        text(&output),
        manager.journal()
    );
}

/// A shell command in the namespace; its output.
fn sh(manager: &ServiceManager, script: &str) -> Output {
    manager.run(Path::new("/bin/sh"), &["-c", script])
}

/// The installed abissctl, in the namespace.
fn abissctl(manager: &ServiceManager, args: &[&str]) -> Output {
    manager.run(Path::new("/usr/bin/abissctl"), args)
}

/// The queue settings abissd changes on a disk it manages, and puts back. `nr_requests` is
/// what the kernel shows (after an elevator is switched off, the allocated depth whatever the
/// live one is); the live driver depth is compared where the kernel shows it (blk-mq's
/// debugfs), and is `None` on both sides where it does not.
fn disk_settings(disk: &LoopDevice) -> Vec<(String, String)> {
    let mut settings: Vec<(String, String)> = [
        "scheduler",
        "nr_requests",
        "read_ahead_kb",
        "max_sectors_kb",
    ]
    .iter()
    .map(|file| {
        let path = format!("/sys/block/{}/queue/{file}", disk.name());
        let value = std::fs::read_to_string(&path).unwrap_or_default();
        ((*file).to_owned(), value.trim().to_owned())
    })
    .collect();
    let live = abiss_os::blk_mq::driver_tag_depth(&disk.name()).map(|(depth, _)| depth);
    settings.push(("live driver depth".to_owned(), format!("{live:?}")));
    settings
}

/// Every path under `dir` (files, links and directories), relative to it; an overlay's
/// whiteouts (character devices, which hide a deleted lower file) are not counted.
fn paths_under(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| {
                use std::os::unix::fs::FileTypeExt as _;
                t.is_char_device()
            }) {
                continue;
            }
            out.insert(path.strip_prefix(base).unwrap_or(&path).to_owned());
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&path, base, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// The kernel ids of the programs the service's abissd has loaded.
fn program_ids(manager: &ServiceManager) -> Vec<u32> {
    let stats = abissctl(manager, &["stats", "--json", "--interval", "0.2"]);
    assert!(stats.status.success(), "stats: {}", text(&stats));
    let report: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    report["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["id"].as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect()
}

#[test]
#[expect(clippy::too_many_lines, reason = "one package life, step by step")]
fn the_package_installs_serves_upgrades_and_purges_without_a_trace() {
    require_root!();
    assert!(
        Path::new(SYSTEMD).exists(),
        "{SYSTEMD} is missing: `cargo xtask setup` installs systemd"
    );
    // What the host has of abiss (another test may have left an empty /etc/abiss): the same
    // after the test.
    let on_host = || {
        HOST_PATHS
            .iter()
            .filter(|p| Path::new(p).exists())
            .collect::<Vec<_>>()
    };
    let host_before = on_host();
    let root = Scratch::new_in(env!("CARGO_TARGET_TMPDIR"), "deb");
    let deb = build_package(&root.path().join("out"));
    let deb_arg = deb.to_string_lossy().into_owned();
    let units = root.path().join("units");
    std::fs::create_dir_all(&units).unwrap();
    let prepared = prepare_units(&units);
    let units_before = paths_under(&units);

    let disk = LoopDevice::new_in("/dev/shm", 128);
    // As a new loop device is: a loop device keeps its queue when detached, and one left under
    // an elevator shows the allocated depth once switched to `none`, whatever its live depth,
    // until the depth is written (a step through a neighbour: a write of the value shown is
    // ignored).
    disk.set_scheduler("none");
    let allocated: u32 =
        std::fs::read_to_string(format!("/sys/block/{}/mq/0/nr_tags", disk.name()))
            .expect("allocated tags")
            .trim()
            .parse()
            .expect("a number");
    let nr_requests = format!("/sys/block/{}/queue/nr_requests", disk.name());
    for depth in [allocated - 1, allocated] {
        abiss_os::sysfs::write_attr(Path::new(&nr_requests), &depth.to_string())
            .expect("set the driver depth");
    }
    let mount = Ext4Mount::new(disk);
    let media = mount.path().join("media.bin");
    std::fs::write(&media, vec![7u8; 16 << 20]).unwrap();
    let settings_before = disk_settings(mount.device());

    let manager = boot(root.path(), &units);
    // Installed: enabled, and started with the commented configuration (no disk managed).
    dpkg(&manager, &["-i", &deb_arg]);
    assert_eq!(
        text(&manager.systemctl(&["is-enabled", "abissd"])).trim(),
        "enabled"
    );
    assert_eq!(manager.property("abissd", "ActiveState"), "active");
    assert_eq!(scheduler_of(mount.device()), "none");

    // The operator names the disk and restarts: the service serves a stream.
    let config = format!(
        "device = [\"{}\"]\ncapacity = \"20MB/s\"\nrealtime_share = 70\n",
        mount.device().path().display()
    );
    let written = sh(&manager, &format!("printf '%s' '{config}' > {CONFIG}"));
    assert!(written.status.success(), "{}", text(&written));
    manager.systemctl_ok(&["restart", "abissd"]);
    assert_eq!(scheduler_of(mount.device()), "mq-deadline");
    manager.attach_until_loaded(Path::new("/usr/bin/abissctl"), &media);
    let mut programs = program_ids(&manager);

    // Upgraded over itself: the operator's configuration is kept, abissd restarted with it.
    let before = manager.property("abissd", "MainPID");
    dpkg(&manager, &["-i", &deb_arg]);
    let kept = sh(&manager, &format!("cat {CONFIG}"));
    assert_eq!(String::from_utf8_lossy(&kept.stdout), config);
    assert_eq!(manager.property("abissd", "ActiveState"), "active");
    assert_ne!(
        manager.property("abissd", "MainPID"),
        before,
        "not restarted"
    );
    assert_eq!(scheduler_of(mount.device()), "mq-deadline");
    let status = abissctl(&manager, &["status", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(
        report["devices"][0]["realtime_share_percent"], 70,
        "{report}"
    );
    programs.extend(program_ids(&manager));
    assert!(!programs.is_empty(), "abissd reported no programs");

    // Removed: prerm stopped abissd, which put the disk back; the conffile stays until purge.
    dpkg(&manager, &["-r", "abiss"]);
    assert_eq!(manager.property("abissd", "ActiveState"), "inactive");
    assert_eq!(
        disk_settings(mount.device()),
        settings_before,
        "{}",
        manager.journal()
    );
    assert!(sh(&manager, &format!("test -f {CONFIG}")).status.success());
    assert!(
        wait_until(Duration::from_secs(5), || programs
            .iter()
            .all(|&id| !program_loaded(id))),
        "abissd's programs are still loaded after the package was removed"
    );

    // Purged: nothing of the package in the overlays, the unit directory, /run, dpkg.
    dpkg(&manager, &["-P", "abiss"]);
    assert!(
        !manager
            .run(Path::new("/usr/bin/dpkg-query"), &["-W", "abiss"])
            .status
            .success(),
        "dpkg still knows the package"
    );
    manager.systemctl_ok(&["daemon-reload"]);
    assert_eq!(manager.property("abissd", "LoadState"), "not-found");
    for dir in ["/etc/abiss", "/var/lib/abiss", "/run/abiss"] {
        assert!(
            !sh(&manager, &format!("test -e {dir}")).status.success(),
            "{dir} is left"
        );
    }
    for dir in OVERLAID {
        let left: Vec<PathBuf> = paths_under(&root.path().join("upper").join(dir))
            .into_iter()
            .filter(|p| p.to_string_lossy().contains("abiss"))
            .collect();
        assert!(left.is_empty(), "left in /{dir}: {left:?}");
    }
    // What the maintainer scripts made in the unit directory, but empty directories (a
    // `.wants` directory is shared by every unit of its target).
    let units_after = paths_under(&units);
    let left: Vec<&PathBuf> = units_after
        .difference(&units_before)
        .filter(|p| {
            std::fs::read_dir(units.join(p)).map_or(true, |mut entries| entries.next().is_some())
        })
        .collect();
    assert!(
        left.is_empty(),
        "left in /etc/systemd/system: {left:?} (the test wrote {prepared:?})"
    );
    drop(manager);
    assert_eq!(disk_settings(mount.device()), settings_before);
    assert_eq!(on_host(), host_before, "the package reached the host");
}
