//! One VM run: qemu booted on a kernel's files, and its serial console read, with what the
//! guest reported in it parsed.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::image::Boot;
use super::{KernelsArgs, VM_TIMEOUT};

/// What the guest said: `@@ KEY VALUE` lines and `@@begin NAME` … `@@end NAME` blocks.
#[derive(Default)]
pub(super) struct Serial {
    pub(super) says: Vec<(String, String)>,
    pub(super) blocks: Vec<(String, String)>,
}

impl Serial {
    pub(super) fn parse(lines: &[String]) -> Self {
        let mut serial = Self::default();
        let mut open: Option<(String, Vec<&str>)> = None;
        for line in lines {
            if let Some((name, body)) = &mut open {
                if line.trim() == format!("@@end {name}") {
                    serial
                        .blocks
                        .push((name.clone(), body.join("\n").trim().to_owned()));
                    open = None;
                } else {
                    body.push(line);
                }
            } else if let Some(name) = line.strip_prefix("@@begin ") {
                open = Some((name.trim().to_owned(), Vec::new()));
            } else if let Some(rest) = line.strip_prefix("@@ ") {
                let (key, value) = rest.split_once(' ').unwrap_or((rest, ""));
                serial.says.push((key.to_owned(), value.trim().to_owned()));
            }
        }
        serial
    }

    pub(super) fn say(&self, key: &str) -> Option<&str> {
        self.says
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn block(&self, name: &str) -> &str {
        self.blocks
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or("", |(_, b)| b.as_str())
    }

    /// The first word of a `@@` line as a number.
    pub(super) fn number(&self, key: &str) -> Option<i64> {
        self.say(key)?.split_whitespace().next()?.parse().ok()
    }
}

/// The console of one VM run.
pub(super) struct Console {
    pub(super) lines: Vec<String>,
    /// From starting qemu to the `/init` script's first line.
    pub(super) booted_after: Option<Duration>,
    pub(super) status: std::process::ExitStatus,
    pub(super) wall_secs: f64,
}

/// What a run adds to the guest: qemu arguments (drives) and kernel command-line words (which
/// `/init` sees as variables).
#[derive(Default)]
pub(super) struct Extra {
    pub(super) qemu: Vec<String>,
    pub(super) cmdline: String,
}

/// Runs qemu until the guest powers off (or `VM_TIMEOUT` passes) and collects its console.
pub(super) fn run_vm(boot: &Boot, args: &KernelsArgs, extra: &Extra) -> anyhow::Result<Console> {
    let mut command = Command::new("qemu-system-x86_64");
    if args.accel == "kvm" {
        command.args(["-enable-kvm", "-cpu", "host"]);
    } else {
        command.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    command
        .args([
            "-m",
            "2G",
            "-smp",
            "2",
            "-nographic",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(&extra.qemu)
        .args(["-net", "none", "-no-reboot", "-kernel"])
        .arg(&boot.vmlinuz)
        .arg("-initrd")
        .arg(&boot.initramfs)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 quiet loglevel=3 abiss_read_secs={} abiss_log={}{}",
            args.read_secs, args.daemon_log, extra.cmdline
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().context(
        "cannot start qemu-system-x86_64 (`cargo xtask setup` installs qemu-system-x86)",
    )?;
    let stdout = child.stdout.take().context("qemu's output")?;
    let pid = libc::pid_t::try_from(child.id()).context("qemu's process id")?;
    // Kills this qemu if it runs past VM_TIMEOUT; told when it has been waited for, so that it
    // never signals a process id the system has handed to someone else since.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(VM_TIMEOUT).is_err() {
            // SAFETY: kill(2) on the qemu we started, which has not been waited for yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut lines = Vec::new();
    let mut booted_at = None;
    for line in BufReader::new(stdout).lines() {
        let mut line = line.unwrap_or_default().replace('\r', "");
        // The firmware's terminal escapes can precede the first line on the same row.
        if let Some(at) = line.find("@@").filter(|&at| at > 0) {
            line.drain(..at);
        }
        if booted_at.is_none() && line.starts_with("@@ booted") {
            booted_at = Some(started.elapsed());
        }
        lines.push(line);
    }
    let status = child.wait()?;
    let _ = done.send(());
    let _ = watchdog.join();
    Ok(Console {
        lines,
        booted_after: booted_at,
        status,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}
