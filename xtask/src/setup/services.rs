//! Installing packages without starting or enabling their services.
//!
//! Debian's service packages (Prometheus, man-db's timer, …) enable their units in postinst
//! and start them where systemd runs: `cargo xtask setup` on such a machine left a Prometheus
//! server listening on port 9090. abiss needs their programs, never their services. So no
//! service starts during the install (a `policy-rc.d` that denies every start, which
//! `deb-systemd-invoke` consults), and every unit the install enabled is disabled again.
//! A package already installed is not touched: what its administrator enabled stays.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::process::Command;

use anyhow::Context as _;

use crate::shell;

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

/// Where apt keeps the output of the package scripts it ran.
const APT_LOG: &str = "/var/log/apt/term.log";

/// Packages whose units are left as their install made them: systemd's own units (getty,
/// remote-fs.target) run only on a machine that boots with it, which installing the package
/// alone (without systemd-sysv) does not make.
const KEEP_UNITS_OF: &[&str] = &["systemd"];

/// `apt-get install`s `packages`; no service of theirs is started, and none stays enabled.
pub fn install_quietly(packages: &[&str]) -> anyhow::Result<()> {
    let enabled_before = enabled_units();
    {
        let _deny = DenyStarts::new()?;
        // dpkg's progress (some 300 lines for the build's packages) would fill the first
        // screen of `cargo xtask demo`; apt keeps all of it in its own log, and errors still
        // reach stderr.
        shell::run(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(packages)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(std::process::Stdio::null()),
        )
        .context(format!(
            "installing the Debian packages failed (apt's and dpkg's output: {APT_LOG})"
        ))?;
    }
    eprintln!("xtask setup: installed (apt's and dpkg's output: {APT_LOG})");
    let theirs = units_of(packages);
    let enabled: Vec<String> = enabled_units()
        .difference(&enabled_before)
        .filter(|unit| theirs.contains(*unit))
        .cloned()
        .collect();
    if enabled.is_empty() {
        return Ok(());
    }
    eprintln!(
        "xtask setup: disabling what the packages enabled (abiss uses their programs only): {}",
        enabled.join(" ")
    );
    // `systemctl disable` edits the links without a running systemd; `was-enabled` then says
    // no, so the packages' upgrades leave the units disabled.
    shell::run(Command::new("systemctl").arg("disable").args(&enabled))?;
    if Path::new("/run/systemd/system").exists() {
        // Nothing should have started (the policy denied it); stop whatever did anyway.
        let _ = Command::new("systemctl")
            .arg("stop")
            .args(&enabled)
            .status();
    }
    Ok(())
}

/// A `policy-rc.d` denying every start while it lives, removed on drop. An existing one is the
/// administrator's policy and is left as it is.
struct DenyStarts {
    written: bool,
}

impl DenyStarts {
    fn new() -> anyhow::Result<Self> {
        let created = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(POLICY_RC_D);
        match created {
            Ok(mut file) => {
                file.write_all(
                    b"#!/bin/sh\n# cargo xtask setup is installing packages: no service starts.\nexit 101\n",
                )
                .with_context(|| format!("cannot write {POLICY_RC_D}"))?;
                Ok(Self { written: true })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Self { written: false }),
            Err(e) => Err(e).with_context(|| format!("cannot write {POLICY_RC_D}")),
        }
    }
}

impl Drop for DenyStarts {
    fn drop(&mut self) {
        if self.written {
            let _ = std::fs::remove_file(POLICY_RC_D);
        }
    }
}

/// The unit files enabled now (`systemctl list-unit-files` reads them without a manager).
fn enabled_units() -> BTreeSet<String> {
    let listed = Command::new("systemctl")
        .args([
            "list-unit-files",
            "--state=enabled",
            "--no-legend",
            "--no-pager",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The names of the systemd units `packages` ship, but for `KEEP_UNITS_OF`.
fn units_of(packages: &[&str]) -> BTreeSet<String> {
    let listed: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !KEEP_UNITS_OF.contains(p))
        .collect();
    if listed.is_empty() {
        return BTreeSet::new();
    }
    let files = Command::new("dpkg")
        .arg("-L")
        .args(&listed)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    unit_names(&files)
}

/// The unit names among the paths of `dpkg -L` output `files`.
fn unit_names(files: &str) -> BTreeSet<String> {
    files
        .lines()
        .filter(|path| path.contains("/systemd/system/"))
        .filter_map(|path| path.rsplit('/').next())
        .filter(|name| {
            [".service", ".timer", ".socket", ".path", ".target"]
                .iter()
                .any(|kind| name.ends_with(kind))
        })
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_found_among_a_packages_files() {
        let files = "/.\n/lib/systemd/system\n/lib/systemd/system/prometheus.service\n\
                     /usr/bin/prometheus\n/usr/lib/systemd/system/man-db.timer\n\
                     /etc/systemd/system/x.conf\n";
        let names: Vec<String> = unit_names(files).into_iter().collect();
        assert_eq!(names, ["man-db.timer", "prometheus.service"]);
    }
}
