//! The results: printed per kernel, and written as Markdown and JSON with the conditions.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde_json::json;

use super::{Expect, KernelsArgs, Outcome};

pub(super) fn print_outcome(outcome: &Outcome) {
    let passed = outcome.checks.iter().filter(|c| c.pass).count();
    eprintln!(
        "xtask kernels: {} ({}): booted to /init in {:.1} s, VM {:.1} s; {passed}/{} checks pass",
        outcome.kernel.name,
        outcome.uname,
        outcome.boot_secs,
        outcome.wall_secs,
        outcome.checks.len()
    );
    if !outcome.capability_line.is_empty() {
        eprintln!("  abissd: {}", outcome.capability_line);
    }
    for c in &outcome.checks {
        eprintln!(
            "  [{}] {}: {}",
            if c.pass { "pass" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if outcome.checks.iter().any(|c| !c.pass) {
        eprintln!("{}", outcome.log);
    }
}

pub(super) fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The machine, the build and the settings a run was made with.
pub(super) fn conditions(root: &Path, args: &KernelsArgs) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let commit = command_line(
        "git",
        &[
            "-C",
            &root.to_string_lossy(),
            "describe",
            "--always",
            "--dirty",
        ],
    );
    let date = command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let host = command_line("uname", &["-r"]);
    let qemu = command_line("qemu-system-x86_64", &["--version"])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    format!(
        "{date}; abiss {commit}, binaries from {}; host Linux {host}, {cpu}, {} CPUs; {qemu}, accelerator {}, guest 2 CPUs and 2 GiB, {} at a time; paced reader {} s at 1 MB/s in 64 KiB reads",
        args.bin_dir.as_deref().map_or_else(|| root.join("target/debug"), Path::to_path_buf).display(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        args.accel,
        args.jobs,
        args.read_secs
    )
}

/// kernels.md: the table, then each kernel's checks (and its logs where one failed).
pub(super) fn markdown(conditions: &str, outcomes: &[Outcome]) -> String {
    let mut md = String::from("# abissd on distribution kernels\n\n");
    md.push_str("Made by `cargo xtask kernels` (xtask/src/kernels/): each kernel is booted from its distribution's package in qemu, with an initramfs holding this build's abissd, abissctl and abiss-test-reader; abissd manages an ext4 loop device, a 24 MB file is attached at 1 MB/s and read by the paced reader, then detached, and abissd is stopped. Then storage stacks (issue 35): LVM on LUKS (dm-linear over dm-crypt `aes-xts-plain64`, made with dmsetup and the uuids LVM and cryptsetup give) over a third loop device with ext4 on top, and an md raid1 of two loop devices (mdadm); one abissd manages the disks under both (named as `--device dm-N`, `--device md0`); a recording on the LUKS stack must be refused, an 8 MB file on it is attached and read at 1 MB/s for 4 s, and abissd's requests at the loop device are counted by priority (`abissctl trace --events --json`); attach on the raid1 must be refused with md's sentence, and abissd must put every elevator back.\n\n");
    let _ = write!(md, "Conditions: {conditions}.\n\n");
    md.push_str("| kernel | package | `uname -r` | boot to /init | abissd's parts | checks | result |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for o in outcomes {
        let passed = o.checks.iter().filter(|c| c.pass).count();
        let parts = if o.capability_line.is_empty() {
            match o.kernel.expect {
                Expect::Refuses { .. } => "refused".to_owned(),
                Expect::Runs { .. } => "did not start".to_owned(),
            }
        } else {
            o.capability_line.clone()
        };
        let _ = writeln!(
            md,
            "| {} | {} {} | {} | {:.1} s | {} | {passed}/{} | {} |",
            o.kernel.name,
            o.kernel.distribution,
            o.kernel.version,
            o.uname,
            o.boot_secs,
            parts,
            o.checks.len(),
            if passed == o.checks.len() {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    for o in outcomes {
        let _ = write!(md, "\n## {} ({})\n\n", o.kernel.name, o.uname);
        for p in &o.packages {
            let _ = writeln!(
                md,
                "- package `{}` ({}), SHA-256 `{}`",
                super::image::file_name(&p.url),
                if p.pinned {
                    "pinned"
                } else {
                    "the series' newest in the archive's index, not the pinned build"
                },
                p.sha256
            );
        }
        for c in &o.checks {
            let _ = writeln!(
                md,
                "- {} {}: {}",
                if c.pass { "pass" } else { "**FAIL**" },
                c.name,
                c.detail.replace('|', "\\|")
            );
        }
        if o.checks.iter().any(|c| !c.pass) && !o.log.is_empty() {
            let _ = write!(md, "\n```\n{}\n```\n", o.log);
        }
    }
    md
}

/// kernels.md and kernels.json under `out`.
pub(super) fn write_results(
    root: &Path,
    out: &Path,
    args: &KernelsArgs,
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let conditions = conditions(root, args);
    std::fs::write(out.join("kernels.md"), markdown(&conditions, outcomes))?;
    let json = json!({
        "conditions": conditions,
        "kernels": outcomes.iter().map(|o| json!({
            "name": o.kernel.name,
            "distribution": o.kernel.distribution,
            "package_version": o.kernel.version,
            "packages": o.packages.iter().map(|p| json!({"url": p.url, "sha256": p.sha256, "pinned": p.pinned})).collect::<Vec<_>>(),
            "uname": o.uname,
            "boot_to_init_secs": o.boot_secs,
            "vm_secs": o.wall_secs,
            "capability_line": o.capability_line,
            "capabilities": o.capabilities,
            "checks": o.checks.iter().map(|c| json!({"name": c.name, "pass": c.pass, "detail": c.detail})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("kernels.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    eprintln!(
        "xtask kernels: results in {}",
        out.join("kernels.md").display()
    );
    Ok(())
}
