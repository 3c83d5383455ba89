//! Idempotent machine setup: fast when everything is already there.
//!
//! The recipe is the one described in docs/building.md: Debian's rustc-web (with a prebuilt
//! `core` for bpfel-unknown-none) builds the eBPF crate, and bpf-linker links it against
//! LLVM 22. Where apt cannot provide that compiler (another distribution, or no apt at all),
//! setup stops with one sentence saying what it needs instead of a raw apt error.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

use crate::shell;

mod services;

/// Debian packages the build uses: the eBPF compiler with the bpf target's core, and what
/// bpf-linker links against.
const BUILD: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
];

/// What `cargo xtask demo` runs besides the build: the lab's loop device, ext4 and FUSE
/// emulator, fio as the player, bpftool for its teardown check.
const DEMO: &[&str] = &["util-linux", "e2fsprogs", "fuse3", "fio", "bpftool"];

/// What `cargo xtask deb` runs: dpkg-shlibdeps computes the package's dependencies, strip
/// strips its binaries.
const PACKAGE: &[&str] = &["dpkg-dev", "binutils"];

/// What only the tests and benchmarks use.
const TESTS: &[&str] = &[
    "pkg-config",
    "libfuse3-dev",
    // The metrics test runs a real Prometheus server (its binary; the packaged service is
    // left disabled, see `install`).
    "prometheus",
    // `abissctl top` is tested in a tmux pane; the generated man pages are rendered by man.
    "tmux",
    "man-db",
    // The service test boots Debian's systemd in namespaces and checks the installed library
    // (readelf) and a C program built against it; the package test checks the .deb.
    "systemd",
    "binutils",
    "gcc",
    "lintian",
    // `cargo xtask kernels` boots distribution kernels in qemu with a busybox initramfs, from
    // packages it downloads (curl), unpacks and whose modules it decompresses (xz, zstd) and
    // orders by their dependencies (modinfo, from kmod: a fresh container has none).
    "qemu-system-x86",
    "kmod",
    "busybox-static",
    "cpio",
    "curl",
    "xz-utils",
    "zstd",
    // The kernels' guests build their storage stacks with the host's dmsetup and mdadm
    // (copied into the initramfs with their libraries).
    "dmsetup",
    "mdadm",
    // Real players and recorders (the players test, `cargo xtask bench players` and
    // `recording`): ffmpeg, GStreamer with its libav plugins, mpv; xfs for the recording
    // benchmark's file-system rows, perf for its recorders' write(2) times.
    "ffmpeg",
    "gstreamer1.0-tools",
    "gstreamer1.0-plugins-base",
    "gstreamer1.0-plugins-good",
    "gstreamer1.0-plugins-bad",
    "gstreamer1.0-libav",
    "python3-gi",
    "gir1.2-gstreamer-1.0",
    "mpv",
    "xfsprogs",
    // `abissctl doctor` on a two-device btrfs (tests/tests/doctor.rs).
    "btrfs-progs",
    "linux-perf",
];

/// What a command needs installed: each adds to the build's packages only what it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Building, installing, man pages.
    Build,
    /// `cargo xtask demo`.
    Demo,
    /// `cargo xtask deb`.
    Package,
    /// The tests, benchmarks and kernels: everything.
    Everything,
}

impl Needs {
    fn packages(self) -> Vec<&'static str> {
        let extra: &[&[&str]] = match self {
            Self::Build => &[],
            Self::Demo => &[DEMO],
            Self::Package => &[PACKAGE],
            Self::Everything => &[DEMO, PACKAGE, TESTS],
        };
        let mut packages: Vec<&str> = BUILD
            .iter()
            .chain(extra.iter().copied().flatten())
            .copied()
            .collect();
        packages.sort_unstable();
        packages.dedup();
        packages
    }
}

const BPF_LINKER_VERSION: &str = "0.13.0";

/// The packages of Debian's rustc-web that carry the eBPF compiler: the one part of the recipe
/// no other distribution's package manager provides.
const EBPF_COMPILER: &[&str] = &["rustc-web", "libstd-rust-web-dev-bpf"];

/// What setup says, and fails with, where apt cannot install `EBPF_COMPILER`.
const NEEDS_EBPF_COMPILER: &str = "cargo xtask setup needs Debian's rustc-web with \
    libstd-rust-web-dev-bpf (from the Debian security suite) to build the eBPF programs, and \
    apt here cannot install them: build the eBPF object the rustup-nightly way described in \
    docs/building.md and pass it to a plain `cargo build` with ABISS_EBPF_OBJECT=<path>.";

/// Installs whatever `needs` lacks.
pub fn ensure(needs: Needs) -> anyhow::Result<()> {
    let missing: Vec<&str> = needs
        .packages()
        .into_iter()
        .filter(|p| !installed(p))
        .collect();
    if !missing.is_empty() {
        let needs_compiler = missing.iter().any(|p| EBPF_COMPILER.contains(p));
        if needs_compiler && !runs("apt-get") {
            anyhow::bail!(NEEDS_EBPF_COMPILER);
        }
        eprintln!("xtask setup: installing {}", missing.join(" "));
        shell::run(Command::new("apt-get").arg("update").arg("-qq"))
            .context("apt-get update failed (setup needs root and Debian's package mirror)")?;
        // Only after the update do apt's lists say what can be installed (a fresh Debian
        // machine has empty lists).
        if needs_compiler
            && !without_candidate(&apt_policy(EBPF_COMPILER), EBPF_COMPILER).is_empty()
        {
            anyhow::bail!(NEEDS_EBPF_COMPILER);
        }
        services::install_quietly(&missing)?;
    }
    let linker = bpf_linker();
    let current = Command::new(&linker)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if !current
        .as_deref()
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION))
    {
        eprintln!("xtask setup: installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        shell::run(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
                .args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )
        .context("installing bpf-linker failed")?;
    }
    Ok(())
}

/// Whether `program --version` runs (the program is on PATH).
fn runs(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `apt-cache policy` for `packages` (empty when apt-cache cannot run).
fn apt_policy(packages: &[&str]) -> String {
    Command::new("apt-cache")
        .arg("policy")
        .args(packages)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// The `packages` that `apt-cache policy` output `policy` offers no version of: either apt
/// does not know them (they have no section) or their candidate is `(none)`.
fn without_candidate<'a>(policy: &str, packages: &[&'a str]) -> Vec<&'a str> {
    let mut installable = Vec::new();
    let mut section: Option<&str> = None;
    for line in policy.lines() {
        if !line.starts_with(char::is_whitespace) {
            // A section starts with `name:` (or `name:arch:`).
            section = line
                .strip_suffix(':')
                .and_then(|header| header.split(':').next());
            continue;
        }
        if let (Some(package), Some(candidate)) = (section, line.trim().strip_prefix("Candidate:"))
        {
            let candidate = candidate.trim();
            if !candidate.is_empty() && candidate != "(none)" {
                installable.push(package);
            }
        }
    }
    packages
        .iter()
        .copied()
        .filter(|package| !installable.contains(package))
        .collect()
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn bpf_linker() -> PathBuf {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"));
    home.join("bin").join("bpf-linker")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `apt-cache policy rustc-web libstd-rust-web-dev-bpf` on Debian 12 with its security
    /// suite.
    const DEBIAN: &str = "\
rustc-web:
  Installed: (none)
  Candidate: 1.96.0+dfsg1-1~deb12u2
  Version table:
     1.96.0+dfsg1-1~deb12u2 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
     1.85.0+dfsg3-1~deb12u3 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
libstd-rust-web-dev-bpf:
  Installed: (none)
  Candidate: 1.96.0+dfsg1-1~deb12u2
  Version table:
     1.96.0+dfsg1-1~deb12u2 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
";

    #[test]
    fn debian_offers_the_compiler() {
        assert!(without_candidate(DEBIAN, EBPF_COMPILER).is_empty());
    }

    #[test]
    fn packages_apt_does_not_know_are_missing() {
        // apt-cache prints nothing on stdout for a package it has never heard of.
        assert_eq!(without_candidate("", EBPF_COMPILER), EBPF_COMPILER);
    }

    #[test]
    fn a_package_without_candidate_is_missing() {
        // Debian 12 without its security suite: rustc-web 1.85 exists, the bpf core does not.
        let policy = "\
rustc-web:
  Installed: (none)
  Candidate: 1.85.0+dfsg3-1~deb12u3
  Version table:
     1.85.0+dfsg3-1~deb12u3 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
libstd-rust-web-dev-bpf:
  Installed: (none)
  Candidate: (none)
  Version table:
";
        assert_eq!(
            without_candidate(policy, EBPF_COMPILER),
            ["libstd-rust-web-dev-bpf"]
        );
    }

    #[test]
    fn an_architecture_qualified_section_counts() {
        let policy = "rustc-web:amd64:\n  Installed: (none)\n  Candidate: 1.96.0\n";
        assert!(without_candidate(policy, &["rustc-web"]).is_empty());
    }

    #[test]
    fn the_message_names_every_way_out() {
        for needed in [
            "rustc-web",
            "libstd-rust-web-dev-bpf",
            "ABISS_EBPF_OBJECT",
            "docs/building.md",
        ] {
            assert!(NEEDS_EBPF_COMPILER.contains(needed), "{needed}");
        }
    }
}
