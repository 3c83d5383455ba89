//! Errors of abissctl, each with its own exit code (docs/abissctl.md lists them).

use abiss_client::{ClientError, RecordError};

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
    /// A bad combination of arguments found after parsing.
    #[error("{0}")]
    Usage(String),
    /// Not allowed (profiling needs root).
    #[error("{0}")]
    PermissionDenied(String),
    /// The device is in use.
    #[error("{0}")]
    Busy(String),
    /// The device is too small to profile.
    #[error("{0}")]
    TooSmall(String),
    /// Measuring failed.
    #[error("{0}")]
    Profile(String),
    /// A direct recording (`record`) could not start or failed.
    #[error(transparent)]
    Record(#[from] RecordError),
}

impl CliError {
    /// Process exit code. 2 is left to clap's usage errors.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Client(error) | Self::Record(RecordError::Client(error)) => client_code(error),
            Self::Usage(_) => 2,
            Self::PermissionDenied(_) => 6,
            Self::Busy(_) => 13,
            Self::TooSmall(_) => 14,
            Self::Profile(_) | Self::Record(RecordError::Write(_)) => 1,
            Self::UnknownDevice(_) => 5,
            Self::BadFile(_) | Self::Record(RecordError::File(_)) => 11,
            Self::Command(_) => 12,
            Self::Record(RecordError::NoDirectIo(_)) => 17,
            Self::Record(RecordError::DiskFull(_)) => 18,
        }
    }
}

/// The exit code of a failure talking to the daemon.
fn client_code(error: &ClientError) -> u8 {
    match error {
        ClientError::Broken { .. } | ClientError::Daemon { .. } => 1,
        ClientError::NotRunning { .. } => 3,
        ClientError::NotASocket { .. } => 4,
        ClientError::PermissionDenied { .. } => 6,
        ClientError::VersionMismatch { .. } => 7,
        ClientError::BadRequest { .. } => 8,
        ClientError::Refused { .. } => 9,
        ClientError::NotFound { .. } => 10,
        ClientError::UnknownDevice { .. } => 5,
        ClientError::ModelUnusable { .. } => 15,
    }
}
