//! Idempotent machine setup: fast when everything is already there.
//!
//! The recipe is the verified one in shared/notes/toolchain.md: Debian's rustc-web (with a
//! prebuilt `core` for bpfel-unknown-none) builds the eBPF crate, and bpf-linker links it
//! against LLVM 22.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::shell;

/// Debian packages the build, the tests and the demo use.
const PACKAGES: &[&str] = &[
    // eBPF build: compiler with the bpf target's core, and what bpf-linker links against.
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    // Lab and tests: loop devices, filesystems, FUSE, load generators, inspection.
    "util-linux",
    "e2fsprogs",
    "fuse3",
    "libfuse3-dev",
    "pkg-config",
    "fio",
    "bpftool",
];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Installs whatever is missing.
pub fn ensure(_root: &Path) -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        eprintln!("xtask setup: installing {}", missing.join(" "));
        shell::run(Command::new("apt-get").arg("update").arg("-qq"))
            .context("apt-get update failed (setup needs root and Debian's package mirror)")?;
        shell::run(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
        .context("installing the build's Debian packages failed")?;
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
