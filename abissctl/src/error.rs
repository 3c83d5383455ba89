//! Errors of abissctl, each with its own exit code (the README lists them).

use std::path::PathBuf;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No daemon answers on the socket.
    #[error("abissd is not running ({reason} at {path}); start it as root with `abissd`, or point ABISS_SOCKET/--socket at its socket")]
    DaemonNotRunning {
        /// The socket path tried.
        path: PathBuf,
        /// What was found there.
        reason: &'static str,
    },
    /// The socket path is something else.
    #[error("{path} is not a socket; point ABISS_SOCKET/--socket at abissd's socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// No such block device.
    #[error("{0}")]
    UnknownDevice(String),
    /// The daemon or the socket refused this user.
    #[error("{0}")]
    PermissionDenied(String),
    /// Client and daemon speak different protocol versions.
    #[error("{0}")]
    VersionMismatch(String),
    /// The daemon refused the request as invalid.
    #[error("{0}")]
    Refused(String),
    /// Anything else (a broken connection, an internal daemon error).
    #[error("{0}")]
    Other(String),
}

impl CliError {
    /// Process exit code. 2 is left to clap's usage errors.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Other(_) => 1,
            Self::DaemonNotRunning { .. } => 3,
            Self::NotASocket { .. } => 4,
            Self::UnknownDevice(_) => 5,
            Self::PermissionDenied(_) => 6,
            Self::VersionMismatch(_) => 7,
            Self::Refused(_) => 8,
        }
    }
}
