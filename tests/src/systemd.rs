//! A real systemd for the service tests: Debian's systemd booted as PID 1 of new PID, mount,
//! UTS and IPC namespaces (as a container would, sharing the host's devices and file systems),
//! driven with `systemctl` through `nsenter`.
//!
//! This machine's PID 1 is not systemd, and CI's is not either. On a machine whose PID 1 is
//! systemd the unit would run under the host's manager; the tests still use their own.
//!
//! That systemd shares the host's `/tmp`, `/sys` and `/dev`, so it must never run the boot jobs
//! of `sysinit.target`: `systemd-tmpfiles-setup` empties `/tmp` (it did, once, while the service
//! test was written), udev would trigger every device, sysctl would apply the distribution's
//! settings. `abissd.service` gets a drop-in with `DefaultDependencies=no` (its ordering after
//! sysinit is all that changes), and the boot targets and jobs are masked, so anything that
//! still asked for them would fail rather than run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::wait_until;

/// Debian's systemd.
pub const SYSTEMD: &str = "/lib/systemd/systemd";

/// The target the namespace's systemd boots into: nothing but what the test starts.
const BOOT_TARGET: &str = "[Unit]\nDescription=abiss service test\nDefaultDependencies=no\n";

/// Units masked in the namespace: the boot targets and the jobs that would touch the host.
const MASKED: [&str; 16] = [
    "sysinit.target",
    "basic.target",
    "local-fs.target",
    "swap.target",
    "sockets.target",
    "timers.target",
    "paths.target",
    "systemd-tmpfiles-setup.service",
    "systemd-tmpfiles-setup-dev.service",
    "systemd-tmpfiles-clean.timer",
    "systemd-udevd.service",
    "systemd-udev-trigger.service",
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "systemd-remount-fs.service",
    "systemd-random-seed.service",
];

/// Fills `units`, which the namespace mounts on `/etc/systemd/system`: the boot target, the
/// masks, and abissd's drop-in. Returns the names it wrote (what a package must leave there).
pub fn prepare_units(units: &Path) -> BTreeSet<String> {
    std::fs::write(units.join("abiss-test.target"), BOOT_TARGET).expect("write the boot target");
    let drop_in = units.join("abissd.service.d");
    std::fs::create_dir_all(&drop_in).expect("create the drop-in directory");
    std::fs::write(
        drop_in.join("namespace.conf"),
        "[Unit]\nDefaultDependencies=no\n",
    )
    .expect("write the drop-in");
    for unit in MASKED {
        let link = units.join(unit);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/dev/null", &link).expect("mask a unit");
    }
    std::iter::once("abiss-test.target")
        .chain(std::iter::once("abissd.service.d"))
        .chain(MASKED)
        .map(str::to_owned)
        .collect()
}

/// A systemd running as PID 1 of its own PID and mount namespaces; killed with everything it
/// started on drop, and the control groups it made removed.
#[derive(Debug)]
pub struct ServiceManager {
    unshare: Child,
    /// Its PID as the host sees it.
    pid: u32,
    cgroups_before: BTreeSet<PathBuf>,
}

impl ServiceManager {
    /// Boots systemd after `mounts` (shell commands run in the new mount namespace, which must
    /// give it a private `/run` and bind its unit directory on `/etc/systemd/system`); its
    /// console log goes to `log`. Starts the journal.
    #[must_use]
    pub fn boot(mounts: &str, log: &Path) -> Self {
        let cgroups_before = cgroup_dirs();
        let script = format!(
            "set -e; {mounts}; exec {SYSTEMD} --system --unit=abiss-test.target --log-target=console"
        );
        let unshare = Command::new("unshare")
            .args([
                "--pid",
                "--fork",
                "--mount",
                "--mount-proc",
                "--uts",
                "--ipc",
            ])
            .args(["--propagation", "private"])
            .args(["sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).expect("log file"))
            .stderr(Stdio::null())
            .spawn()
            .expect("start unshare");
        let mut pid = None;
        let found = wait_until(Duration::from_secs(10), || {
            pid = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id()))
                .ok()
                .and_then(|children| children.split_whitespace().next()?.parse().ok());
            pid.is_some()
        });
        let manager = Self {
            unshare,
            pid: pid.unwrap_or(0),
            cgroups_before,
        };
        assert!(found, "systemd did not start; its log: {}", read(log));
        let up = wait_until(Duration::from_secs(30), || {
            let state = manager.systemctl(&["is-system-running"]);
            let state = String::from_utf8_lossy(&state.stdout);
            ["running", "degraded"].contains(&state.trim())
        });
        assert!(up, "systemd did not come up; its log: {}", read(log));
        // The journal, so that the service's log lines and their levels can be read back.
        manager.systemctl_ok(&[
            "start",
            "systemd-journald.socket",
            "systemd-journald.service",
        ]);
        manager
    }

    /// Runs `program` inside the namespaces.
    #[must_use]
    pub fn run(&self, program: &Path, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.pid.to_string(), "-m", "-p", "-u", "-i", "--"])
            .arg(program)
            .args(args)
            .output()
            .expect("run nsenter")
    }

    /// `systemctl ARGS` inside the namespaces.
    #[must_use]
    pub fn systemctl(&self, args: &[&str]) -> Output {
        self.run(Path::new("/bin/systemctl"), args)
    }

    /// `systemctl ARGS`, which must succeed.
    pub fn systemctl_ok(&self, args: &[&str]) {
        let output = self.systemctl(args);
        assert!(
            output.status.success(),
            "systemctl {args:?}: {}{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.journal()
        );
    }

    /// Property `name` of `unit`, as `systemctl show` gives it.
    #[must_use]
    pub fn property(&self, unit: &str, name: &str) -> String {
        let output = self.systemctl(&["show", "-p", name, "--value", unit]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// The service's journal, with priorities.
    #[must_use]
    pub fn journal(&self) -> String {
        let output = self.run(
            Path::new("/bin/journalctl"),
            &[
                "-u",
                "abissd",
                "--no-pager",
                "-o",
                "json",
                "--output-fields=PRIORITY,MESSAGE",
            ],
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for ServiceManager {
    fn drop(&mut self) {
        if self.pid > 1 {
            // PID 1 of a namespace dies only of SIGKILL from outside; everything in the
            // namespace dies with it.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(self.pid).unwrap_or(0)),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.unshare.kill();
        let _ = self.unshare.wait();
        // The control groups systemd made, deepest first, once their processes are gone.
        let _ = wait_until(Duration::from_secs(5), || {
            let made: Vec<PathBuf> = cgroup_dirs()
                .difference(&self.cgroups_before)
                .cloned()
                .collect();
            for dir in made.iter().rev() {
                let _ = std::fs::remove_dir(dir);
            }
            cgroup_dirs().difference(&self.cgroups_before).count() == 0
        });
    }
}

/// Every control group directory (all hierarchies), sorted so that parents come first.
fn cgroup_dirs() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                out.insert(entry.path());
                walk(&entry.path(), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/sys/fs/cgroup"), &mut out);
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Standard output and error of `output`, one after the other (for failure messages).
#[must_use]
pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The elevator active on `disk` (`/sys/block/NAME/queue/scheduler`'s bracketed word).
#[must_use]
pub fn scheduler_of(disk: &crate::LoopDevice) -> String {
    let line = std::fs::read_to_string(format!("/sys/block/{}/queue/scheduler", disk.name()))
        .unwrap_or_default();
    line.split_whitespace()
        .find(|s| s.starts_with('['))
        .map(|s| s.trim_matches(['[', ']']).to_owned())
        .unwrap_or_default()
}

impl ServiceManager {
    /// Attaches `media` at 1 MB/s with `abissctl` (the path of the one the test installed) in
    /// the namespace, and waits until the stream's window is loaded; the journal goes into the
    /// failure message.
    pub fn attach_until_loaded(&self, abissctl: &Path, media: &Path) {
        let media = media.to_string_lossy().into_owned();
        let attach = self.run(abissctl, &["attach", &media, "--rate", "1MB/s", "--json"]);
        assert!(
            attach.status.success(),
            "attach: {}\n{}",
            text(&attach),
            self.journal()
        );
        let loaded = wait_until(Duration::from_secs(10), || {
            let list = self.run(abissctl, &["list", "--json"]);
            serde_json::from_slice::<serde_json::Value>(&list.stdout)
                .ok()
                .and_then(|v| v[0]["resident_bytes"].as_u64())
                .is_some_and(|bytes| bytes > 0)
        });
        assert!(
            loaded,
            "the stream's window was never loaded\n{}",
            self.journal()
        );
    }
}
