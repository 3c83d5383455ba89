//! abissd as a systemd service, under a real systemd: `cargo xtask install` puts the files in
//! place, and the unit starts (readiness by `sd_notify`), serves `abissctl` with every
//! hardening option of the unit on, reloads its configuration file, restarts after a
//! `kill -9` and puts the disk back on stop; a broken configuration is not restarted in a loop.
//!
//! The systemd is the test's own, booted in namespaces (`abiss_tests::systemd`), with a private
//! `/run`, `/var/lib` and unit directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use abiss_tests::systemd::{prepare_units, scheduler_of, text, ServiceManager, SYSTEMD};
use abiss_tests::{binary, require_root, wait_until, Ext4Mount, LoopDevice, Scratch};

/// Boots the test's systemd with `units` as its unit directory.
fn boot(units: &Path, log: &Path) -> ServiceManager {
    let mounts = format!(
        "mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /var/lib; \
         if [ -d /var/log/journal ]; then mount -t tmpfs tmpfs /var/log/journal; fi; \
         mount --bind {units} /etc/systemd/system",
        units = units.display()
    );
    ServiceManager::boot(&mounts, log)
}

fn abissctl(manager: &ServiceManager, args: &[&str]) -> Output {
    manager.run(&binary("abissctl"), args)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The optional parts that are on, by name.
fn switched_on(status: &serde_json::Value) -> Vec<String> {
    status["capabilities"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["on"] == true)
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// `abissctl status --json` of an abissd started by hand, outside any unit.
fn plain_daemon_status() -> serde_json::Value {
    let daemon = abiss_tests::Daemon::start();
    let output = daemon.ctl(["status", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).expect("status JSON")
}

fn write_config(etc: &Path, device: &Path, share: &str) {
    std::fs::write(
        etc.join("abiss/abissd.toml"),
        format!(
            "device = [\"{}\"]\ncapacity = \"20MB/s\"\nrealtime_share = {share}\n",
            device.display()
        ),
    )
    .expect("write the configuration");
}

/// The installed tree: `cargo xtask install` into a scratch prefix.
struct Installed {
    prefix: PathBuf,
    etc: PathBuf,
    units: PathBuf,
}

fn install(root: &Path) -> Installed {
    let installed = Installed {
        prefix: root.join("prefix"),
        etc: root.join("etc"),
        units: root.join("units"),
    };
    let bin_dir = binary("abissd").parent().unwrap().to_owned();
    let output = Command::new(binary("xtask"))
        .arg("install")
        .arg("--from")
        .arg(&bin_dir)
        .arg("--prefix")
        .arg(&installed.prefix)
        .arg("--sysconfdir")
        .arg(&installed.etc)
        .arg("--unitdir")
        .arg(&installed.units)
        .output()
        .expect("run xtask install");
    assert!(output.status.success(), "xtask install: {}", text(&output));
    installed
}

/// `man abissctl` finds the installed page, and bash loads the installed completion.
fn assert_docs_installed(prefix: &Path) {
    let man = Command::new("man")
        .arg("-M")
        .arg(prefix.join("share/man"))
        .args(["-w", "abissctl"])
        .output()
        .expect("man");
    assert!(
        text(&man).contains("man1/abissctl.1"),
        "man -w abissctl: {}",
        text(&man)
    );
    let completion = prefix.join("share/bash-completion/completions/abissctl");
    let bash = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; complete -p abissctl",
            completion.display()
        ))
        .output()
        .expect("bash");
    assert!(
        text(&bash).contains("abissctl"),
        "the bash completion is not registered: {}",
        text(&bash)
    );
}

#[test]
fn install_puts_a_library_with_soname_and_pkg_config_file() {
    require_root!();
    let root = Scratch::new_in(env!("CARGO_TARGET_TMPDIR"), "install");
    let installed = install(root.path());
    for file in [
        "sbin/abissd",
        "bin/abissctl",
        "include/abiss.h",
        "lib/libabiss.a",
    ] {
        assert!(installed.prefix.join(file).exists(), "{file} not installed");
    }
    let soname = Command::new("readelf")
        .arg("-d")
        .arg(installed.prefix.join("lib/libabiss.so"))
        .output()
        .expect("readelf");
    assert!(
        text(&soname).contains("Library soname: [libabiss.so.0]"),
        "{}",
        text(&soname)
    );
    // A C program built the way users build: pkg-config for the flags, linked to the SONAME.
    let pc_dir = installed.prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "abiss"])
        .env("PKG_CONFIG_PATH", &pc_dir)
        .output()
        .expect("pkg-config");
    assert!(flags.status.success(), "pkg-config: {}", text(&flags));
    let program = root.path().join("probe");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../abiss-c/examples/probe.c");
    let mut cc = Command::new("cc");
    cc.arg(&example).arg("-o").arg(&program);
    cc.args(String::from_utf8_lossy(&flags.stdout).split_whitespace());
    let built = cc.output().expect("cc");
    assert!(built.status.success(), "cc: {}", text(&built));
    let needed = Command::new("readelf")
        .arg("-d")
        .arg(&program)
        .output()
        .expect("readelf");
    assert!(
        text(&needed).contains("Shared library: [libabiss.so.0]"),
        "{}",
        text(&needed)
    );
    assert_docs_installed(&installed.prefix);
    // The configuration is written once; installing again keeps the operator's.
    let config = installed.etc.join("abiss/abissd.toml");
    std::fs::write(&config, "capacity = \"25MB/s\"\n").unwrap();
    let _ = install(root.path());
    assert_eq!(read(&config), "capacity = \"25MB/s\"\n");
    let unit = read(&installed.units.join("abissd.service"));
    assert!(unit.contains(&format!(
        "ExecStart={}/sbin/abissd --config {}",
        installed.prefix.display(),
        config.display()
    )));
}

#[test]
#[expect(clippy::too_many_lines, reason = "one service life, step by step")]
fn the_unit_starts_serves_reloads_restarts_and_restores_under_systemd() {
    require_root!();
    assert!(
        Path::new(SYSTEMD).exists(),
        "{SYSTEMD} is missing: `cargo xtask setup` installs systemd"
    );
    let root = Scratch::new_in(env!("CARGO_TARGET_TMPDIR"), "service");
    let installed = install(root.path());
    let _ = prepare_units(&installed.units);
    let disk = LoopDevice::new_in("/dev/shm", 128);
    disk.set_scheduler("none");
    let mount = Ext4Mount::new(disk);
    let media = mount.path().join("media.bin");
    std::fs::write(&media, vec![7u8; 16 << 20]).unwrap();
    let device = mount.device().path().to_owned();
    write_config(&installed.etc, &device, "80");

    let manager = boot(&installed.units, &root.path().join("systemd.log"));
    // Type=notify: start returns once abissd said READY=1, after it took the disk.
    manager.systemctl_ok(&["start", "abissd"]);
    assert_eq!(manager.property("abissd", "ActiveState"), "active");
    assert_eq!(scheduler_of(mount.device()), "mq-deadline");
    let status = abissctl(&manager, &["status", "--json"]);
    assert!(status.status.success(), "status: {}", text(&status));
    let report: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status JSON");
    assert_eq!(
        report["devices"][0]["realtime_share_percent"], 80,
        "{report}"
    );
    // The hardening costs no optional part: the service has what a daemon started by hand
    // has on this kernel (reading kernel addresses needed CAP_SYSLOG, found this way).
    assert_eq!(
        switched_on(&report),
        switched_on(&plain_daemon_status()),
        "{report}"
    );

    // A stream works under every hardening option: prefetch through io_uring at the
    // stream's priority, buffers locked in memory.
    manager.attach_until_loaded(&binary("abissctl"), &media);
    // Not checked here: raising a reader that misses. The eBPF side reports thread ids of the
    // initial PID namespace, and this test's abissd lives in the namespace of its systemd, so
    // it cannot find them (a gap of abissd in any PID namespace, noted on the issue).

    // Reload: the file is read again and the new share applies at once.
    write_config(&installed.etc, &device, "50");
    manager.systemctl_ok(&["reload", "abissd"]);
    let share = wait_until(Duration::from_secs(5), || {
        let status = abissctl(&manager, &["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&status.stdout)
            .is_ok_and(|v| v["devices"][0]["realtime_share_percent"] == 50)
    });
    assert!(share, "the reload did not apply\n{}", manager.journal());

    // Log lines reach the journal with their level: info is priority 6, and the `<6>` prefix
    // journald reads is not left in the message.
    let journal = manager.journal();
    let reloaded = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| {
            v["MESSAGE"]
                .as_str()
                .is_some_and(|m| m.starts_with("reloaded:"))
        })
        .unwrap_or_else(|| panic!("no reload line in the journal:\n{journal}"));
    assert_eq!(reloaded["PRIORITY"], "6", "{reloaded}");

    // kill -9: systemd restarts abissd, which first puts back what the dead one left.
    let before = manager.property("abissd", "MainPID");
    manager.systemctl_ok(&["kill", "-s", "KILL", "abissd"]);
    let restarted = wait_until(Duration::from_secs(20), || {
        manager.property("abissd", "NRestarts") == "1"
            && manager.property("abissd", "ActiveState") == "active"
            && manager.property("abissd", "MainPID") != before
    });
    assert!(restarted, "abissd was not restarted\n{}", manager.journal());
    assert!(
        manager
            .journal()
            .contains("left managed by a daemon that did not exit cleanly"),
        "the restarted daemon did not restore the disk first\n{}",
        manager.journal()
    );
    assert!(abissctl(&manager, &["status"]).status.success());
    // How exposed the unit is, by systemd's own measure (a figure for the log).
    let exposure = manager.run(
        Path::new("/bin/systemd-analyze"),
        &["security", "--no-pager", "abissd.service"],
    );
    println!(
        "{}",
        text(&exposure)
            .lines()
            .filter(|l| l.contains("Overall exposure"))
            .collect::<String>()
    );
    println!("journal of abissd:\n{}", manager.journal());

    // Stop: the disk gets its elevator back.
    manager.systemctl_ok(&["stop", "abissd"]);
    assert_eq!(manager.property("abissd", "ActiveState"), "inactive");
    assert_eq!(scheduler_of(mount.device()), "none");

    // A broken configuration fails the start with its own exit code, and is not restarted.
    std::fs::write(
        installed.etc.join("abiss/abissd.toml"),
        "realtime_share = 99\n",
    )
    .unwrap();
    let started = manager.systemctl(&["start", "abissd"]);
    assert!(
        !started.status.success(),
        "started with a broken configuration"
    );
    assert_eq!(manager.property("abissd", "ExecMainStatus"), "18");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(manager.property("abissd", "ActiveState"), "failed");
    assert_eq!(manager.property("abissd", "NRestarts"), "0");
    drop(manager);
    assert_eq!(scheduler_of(mount.device()), "none");
}
