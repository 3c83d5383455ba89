//! Running under systemd: readiness and reload notifications (`Type=notify`), and log lines
//! with levels journald understands.
//!
//! Outside systemd both are no-ops: without `NOTIFY_SOCKET` nothing is sent, and without
//! `JOURNAL_STREAM` log lines keep their usual form.

use std::io::Write;
use std::os::unix::fs::MetadataExt as _;

use log::{warn, Level};
use sd_notify::NotifyState;

/// Tells the service manager that the daemon serves: the programs are attached and the disks
/// taken, so a unit ordered after abissd finds it ready.
pub(crate) fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells the service manager that the daemon re-reads its configuration (SIGHUP); `ready`
/// follows when it is done.
pub(crate) fn reloading() {
    // systemd matches a reload by the monotonic time at which it began.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// Tells the service manager that the daemon stops: it restores the disks first.
pub(crate) fn stopping() {
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
pub(crate) fn stderr_is_journal() -> bool {
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
pub(crate) fn syslog_priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// Sets up logging (`RUST_LOG`, default `info`): to the journal with priorities when stderr
/// is the journal (which adds its own time stamps), else with time and level, as `env_logger`
/// writes them. Either way a record is one line: its message is written with
/// [`write_escaped`], since it may hold what clients chose (a path, a thread's name).
pub(crate) fn init_logging() {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if stderr_is_journal() {
        builder.format(|out, record| {
            write!(out, "<{}>", syslog_priority(record.level()))?;
            write_escaped(out, *record.args())?;
            writeln!(out)
        });
    } else {
        builder.format(|out, record| {
            let style = out.default_level_style(record.level());
            let level = record.level();
            write!(
                out,
                "[{} {style}{level:<5}{style:#} {}] ",
                out.timestamp_millis(),
                record.target()
            )?;
            write_escaped(out, *record.args())?;
            writeln!(out)
        });
    }
    builder.init();
}

/// Whether `c` is written escaped in a log line: control characters (a newline would start a
/// line, or with journald an entry at a priority of the writer's choosing; a terminal acts on
/// escape sequences), the Unicode line and paragraph separators, and the bidirectional
/// overrides and isolates, which reorder what a terminal shows; and the backslash, so that
/// an escape is always abissd's.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || c == '\\'
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Writes `args` to `out` with every character [`needs_escape`] names escaped as Rust escapes
/// it (`\n`, `\u{1b}`), so that no file name or thread name a client chose can forge a log
/// line. A backslash is escaped too (`\\`): a name holding `\n` as two characters is logged
/// as `\\n`, told apart from an escaped newline.
pub(crate) fn write_escaped(
    out: &mut impl Write,
    args: std::fmt::Arguments<'_>,
) -> std::io::Result<()> {
    struct Escaping<'a, W> {
        out: &'a mut W,
        error: Option<std::io::Error>,
    }
    impl<W: Write> std::fmt::Write for Escaping<'_, W> {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            let mut rest = text;
            let written = loop {
                let Some(at) = rest.find(needs_escape) else {
                    break self.out.write_all(rest.as_bytes());
                };
                let c = rest[at..].chars().next().unwrap_or_default();
                let escaped = self
                    .out
                    .write_all(&rest.as_bytes()[..at])
                    .and_then(|()| write!(self.out, "{}", c.escape_default()));
                if escaped.is_err() {
                    break escaped;
                }
                rest = &rest[at + c.len_utf8()..];
            };
            written.map_err(|error| {
                self.error = Some(error);
                std::fmt::Error
            })
        }
    }
    let mut escaping = Escaping { out, error: None };
    match std::fmt::write(&mut escaping, args) {
        Ok(()) => Ok(()),
        Err(_) => Err(escaping
            .error
            .unwrap_or_else(|| std::io::Error::other("a log message failed to format"))),
    }
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

    #[test]
    fn a_message_is_one_line_whatever_a_client_named() {
        let escaped = |text: &str| {
            let mut out = Vec::new();
            write_escaped(&mut out, format_args!("stream 3: {text} at 1 MB/s")).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            escaped("/m/a\n[2026-01-01T00:00:00Z WARN  abissd] forged"),
            "stream 3: /m/a\\n[2026-01-01T00:00:00Z WARN  abissd] forged at 1 MB/s"
        );
        assert_eq!(
            escaped("x\r\u{1b}[2Jy\u{2028}z\u{202e}é"),
            "stream 3: x\\r\\u{1b}[2Jy\\u{2028}z\\u{202e}é at 1 MB/s"
        );
        // A backslash written by a user is not an escape.
        assert_eq!(escaped("a\\nb"), "stream 3: a\\\\nb at 1 MB/s");
        assert_ne!(escaped("a\\nb"), escaped("a\nb"));
        assert_eq!(
            escaped("/plain/ünïcode file"),
            "stream 3: /plain/ünïcode file at 1 MB/s"
        );
    }
}
