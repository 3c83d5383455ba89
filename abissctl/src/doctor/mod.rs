//! `abissctl doctor [PATH]`: what this machine allows abiss, and whether abiss can serve PATH,
//! one line per finding (or `--json`). It asks the running abissd only what `status` asks,
//! reads only files every user may read, and mounts nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use abiss_client::{Client, ClientError};
use abiss_proto::{ByteSize, StatusReport};
use serde::Serialize;

use crate::error::CliError;

mod kernel;
mod path;

/// The exit code when PATH cannot be served now (documented in `doctor --help` and in the
/// user's guide's exit code table).
pub(crate) const NOT_SERVED: u8 = 16;

/// How a finding came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Present, on, or served.
    Yes,
    /// Missing, or not served.
    No,
    /// The kernel has it; the running abissd has it switched off.
    Off,
    /// Cannot tell as this user.
    Unknown,
    /// A fact, neither good nor bad.
    Info,
}

impl State {
    fn word(self) -> &'static str {
        match self {
            Self::Yes => "yes",
            Self::No => "no",
            Self::Off => "off",
            Self::Unknown => "unknown",
            Self::Info => "-",
        }
    }
}

/// One finding: a line of the report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Finding {
    /// What it is about (`btf`, `part read-tracking`, `disk loop3`).
    pub topic: String,
    /// How it came out.
    pub state: State,
    /// What was found, and why it matters.
    pub detail: String,
}

impl Finding {
    fn new(topic: impl Into<String>, state: State, detail: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            state,
            detail: detail.into(),
        }
    }

    fn info(topic: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(topic, State::Info, detail)
    }
}

/// The whole report, as `--json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    findings: Vec<Finding>,
    /// PATH's file system, stack and disk, when a PATH was given.
    path: Option<path::PathReport>,
    /// The process's exit code: 0, or [`NOT_SERVED`].
    exit_code: u8,
}

/// Runs `doctor`; returns the exit code.
pub(crate) fn run(socket: &Path, target: Option<&PathBuf>, json: bool) -> Result<u8, CliError> {
    // Examined first: a path that cannot be examined is an error, before any report.
    let examined = target.map(|p| path::examine(p)).transpose()?;
    let root = nix::unistd::geteuid().is_root();
    let daemon = Client::connect(socket).and_then(|mut client| client.status_report());
    let mut findings = vec![who(root)];
    let capabilities = daemon
        .as_ref()
        .ok()
        .map(|report| report.capabilities.as_slice());
    findings.extend(kernel::findings(capabilities, root));
    findings.extend(daemon_findings(socket, &daemon));
    let path = examined.map(|examined| path::report(examined, daemon.as_ref().ok()));
    if let Some(path) = &path {
        findings.extend(path.findings.iter().cloned());
    }
    let exit_code = if path.as_ref().is_some_and(|p| !p.served) {
        NOT_SERVED
    } else {
        0
    };
    let report = Report {
        findings,
        path,
        exit_code,
    };
    let mut out = std::io::stdout().lock();
    if json {
        crate::json::print(&mut out, &report);
    } else {
        for finding in &report.findings {
            let _ = writeln!(
                out,
                "{:<24} {:<7} {}",
                finding.topic,
                finding.state.word(),
                finding.detail
            );
        }
    }
    Ok(exit_code)
}

/// Who is asking, and what that hides.
fn who(root: bool) -> Finding {
    if root {
        Finding::info("user", "root: every finding below could be checked")
    } else {
        Finding::info(
            "user",
            format!(
                "uid {}, not root: /proc/kallsyms hides its addresses (direct-io-tagging is unknown), paths you may not search cannot be examined, and loop devices' backing files may be hidden; nothing here needs root",
                nix::unistd::geteuid()
            ),
        )
    }
}

/// Whether abissd answers, which disks it manages, and its locked-memory room.
fn daemon_findings(socket: &Path, daemon: &Result<StatusReport, ClientError>) -> Vec<Finding> {
    let report = match daemon {
        Ok(report) => report,
        Err(ClientError::NotRunning { .. }) => {
            return vec![Finding::new(
                "abissd",
                State::No,
                format!(
                    "not running: nothing answers on {} (--socket, ABISS_SOCKET); streams need it",
                    socket.display()
                ),
            )]
        }
        Err(error) => return vec![Finding::new("abissd", State::No, error.to_string())],
    };
    let disks: Vec<String> = report
        .devices
        .iter()
        .map(|d| format!("{} ({})", d.name, d.device))
        .collect();
    let managed = if disks.is_empty() {
        "manages no disk (abissd --device DEV)".to_owned()
    } else {
        format!("manages {}", disks.join(", "))
    };
    let memory = &report.memory;
    vec![
        Finding::new(
            "abissd",
            State::Yes,
            format!("answers on {}; {managed}", socket.display()),
        ),
        Finding::info(
            "locked memory",
            format!(
                "{} of {} free for playout buffers; yours: {} of {} per user",
                ByteSize(memory.budget_bytes.saturating_sub(memory.reserved_bytes)).readable(),
                ByteSize(memory.budget_bytes).readable(),
                ByteSize(
                    memory
                        .per_user_budget_bytes
                        .saturating_sub(memory.yours_reserved_bytes)
                )
                .readable(),
                ByteSize(memory.per_user_budget_bytes).readable(),
            ),
        ),
    ]
}
