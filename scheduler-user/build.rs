//! Builds the eBPF object (`scheduler-ebpf`) and hands it to `abissd` to embed.
//!
//! The eBPF crate needs Debian's rustc-web (it ships `core` for `bpfel-unknown-none`) and
//! bpf-linker; `cargo xtask setup` installs both. We drive cargo ourselves instead of using
//! aya-build, which insists on rustup toolchains and `-Z build-std` (see docs/building.md).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const BPF_RUSTC: &str = "/usr/bin/rustc";
const BPF_TARGET: &str = "bpfel-unknown-none";

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("crate lives in the workspace")
        .to_path_buf();
    let ebpf_dir = root.join("scheduler-ebpf");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));

    for watched in [
        "scheduler-ebpf/src",
        "scheduler-ebpf/Cargo.toml",
        "scheduler-ebpf/Cargo.lock",
        "scheduler-common/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=ABISS_EBPF_OBJECT");

    let object = if let Some(prebuilt) = env::var_os("ABISS_EBPF_OBJECT") {
        PathBuf::from(prebuilt)
    } else {
        build_ebpf(&root, &ebpf_dir)
    };
    std::fs::copy(&object, out_dir.join("abiss.bpf.o")).unwrap_or_else(|error| {
        panic!("cannot copy the eBPF object {}: {error}", object.display())
    });
}

fn build_ebpf(root: &Path, ebpf_dir: &Path) -> PathBuf {
    assert!(
        Path::new(BPF_RUSTC).exists(),
        "{BPF_RUSTC} (Debian's rustc-web) is missing, so the eBPF programs cannot be built: \
         run `cargo xtask setup` first"
    );
    let target_dir = root.join("target").join("ebpf");
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    // The outer build's settings (wrappers from clippy, flags, target) must not leak into the
    // eBPF build, which has its own compiler and target.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_")
            || key.starts_with("RUSTC")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
        {
            command.env_remove(&key);
        }
    }
    let home = env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = format!("{home}/.cargo/bin:{}", env::var("PATH").unwrap_or_default());
    command
        .current_dir(ebpf_dir)
        .env("PATH", path)
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            [
                "--cfg=bpf_target_arch=\"x86_64\"",
                "-Cdebuginfo=2",
                "-Clink-arg=--btf",
            ]
            .join("\u{1f}"),
        )
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            BPF_TARGET,
            "--target-dir",
        ])
        .arg(&target_dir);
    let status = command
        .status()
        .unwrap_or_else(|error| panic!("cannot run cargo for the eBPF build: {error}"));
    assert!(
        status.success(),
        "building the eBPF programs failed (see above); `cargo xtask setup` installs what it needs"
    );
    target_dir.join(BPF_TARGET).join("release").join("abiss")
}
