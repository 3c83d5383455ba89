//! Running under systemd: readiness and reload notifications (`Type=notify`), and log lines
//! with levels journald understands.
//!
//! Outside systemd both are no-ops: without `NOTIFY_SOCKET` nothing is sent, and without
//! `JOURNAL_STREAM` log lines keep their usual form.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;

use log::{warn, Level};
use sd_notify::NotifyState;

/// Tells the service manager that the daemon serves: the programs are attached and the disks
/// taken, so a unit ordered after abissd finds it ready.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager that the daemon re-reads its configuration (SIGHUP); `ready`
/// follows when it is done.
pub fn reloading() {
    // systemd matches a reload by the monotonic time at which it began.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// Tells the service manager that the daemon stops: it restores the disks first.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

fn send(states: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(error) = sd_notify::notify(states) {
        warn!("cannot notify the service manager: {error}");
    }
}

/// Whether standard error is the journal: systemd sets `JOURNAL_STREAM` to the device and
/// inode of the stream it connected, and a child whose stderr was redirected inherits the
/// variable, so the numbers are compared rather than trusted.
#[must_use]
pub fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The syslog priority of a log level, as the `<N>` prefix journald reads on a stream.
#[must_use]
pub fn syslog_priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// Sets up logging (`RUST_LOG`, default `info`): to the journal with priorities when stderr
/// is the journal (which adds its own time stamps), else with time and level.
pub fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if stderr_is_journal() {
        builder.format(|out, record| {
            writeln!(
                out,
                "<{}>{}",
                syslog_priority(record.level()),
                record.args()
            )
        });
    }
    builder.init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(syslog_priority(Level::Error), 3);
        assert_eq!(syslog_priority(Level::Warn), 4);
        assert_eq!(syslog_priority(Level::Info), 6);
        assert_eq!(syslog_priority(Level::Debug), 7);
    }
}
