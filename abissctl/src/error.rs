//! Errors of abissctl, each with its own exit code (the README lists them).

use abiss_client::ClientError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Talking to the daemon failed, or the daemon refused.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// No such block device.
    #[error("{0}")]
    UnknownDevice(String),
    /// A file that cannot be streamed, or cannot be opened.
    #[error("{0}")]
    BadFile(String),
    /// A command run under `abissctl run` could not be started.
    #[error("{0}")]
    Command(String),
}

impl CliError {
    /// Process exit code. 2 is left to clap's usage errors.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Client(error) => match error {
                ClientError::Broken { .. } | ClientError::Daemon { .. } => 1,
                ClientError::NotRunning { .. } => 3,
                ClientError::NotASocket { .. } => 4,
                ClientError::PermissionDenied { .. } => 6,
                ClientError::VersionMismatch { .. } => 7,
                ClientError::BadRequest { .. } => 8,
                ClientError::Refused { .. } => 9,
                ClientError::NotFound { .. } => 10,
            },
            Self::UnknownDevice(_) => 5,
            Self::BadFile(_) => 11,
            Self::Command(_) => 12,
        }
    }
}
