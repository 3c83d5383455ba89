//! Errors of the lab, one enum per concern, each with a process exit code.

use std::path::PathBuf;

/// A model file or model parameter that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read model file {path}: {source}")]
    Read {
        /// The model file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for the model, at `field`.
    #[error("model file field `{field}`: {message}")]
    Syntax {
        /// Dotted path of the offending field (empty for the whole file).
        field: String,
        /// The parser's message.
        message: String,
    },
    /// A field has a value the model cannot use.
    #[error("model field `{field}` {reason}")]
    Invalid {
        /// Dotted path of the offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Why a lab could not be brought up, taken down or measured.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The model file or parameters are unusable.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The requested size is below the minimum or misaligned.
    #[error("disk size {size_bytes} bytes is unusable: {reason}")]
    Size {
        /// The requested size.
        size_bytes: u64,
        /// Why.
        reason: String,
    },
    /// A lab (running, or left over from a crashed run) already exists.
    #[error("a lab already exists in {state_dir} (running, or left over from a crashed run): run `abiss-lab down` first")]
    Leftover {
        /// The lab's state directory.
        state_dir: PathBuf,
    },
    /// No lab is set up.
    #[error("no lab is set up in {state_dir}: run `abiss-lab up` first")]
    NotUp {
        /// The state directory that was looked in.
        state_dir: PathBuf,
    },
    /// FUSE cannot be used on this machine.
    #[error("FUSE is unavailable: {reason}")]
    FuseUnavailable {
        /// Why.
        reason: String,
    },
    /// The emulator process failed to start or serve.
    #[error("the emulator failed: {reason}")]
    Emulator {
        /// Why, with the emulator's last log line when there is one.
        reason: String,
    },
    /// A system command or call failed.
    #[error("{what} failed: {reason}")]
    System {
        /// What was being done.
        what: String,
        /// Why.
        reason: String,
    },
    /// The device does not behave like its model.
    #[error("the device does not match its model: {failed} of {total} checks outside ±{tolerance_percent}%")]
    ValidationFailed {
        /// Checks outside the tolerance.
        failed: usize,
        /// All checks.
        total: usize,
        /// The tolerance.
        tolerance_percent: f64,
    },
    /// Every validation run failed while the hypervisor took much of the CPUs' time: the runs
    /// measured the host, so the model is neither confirmed nor refuted.
    #[error("validation inconclusive: in each of {attempts} runs the hypervisor took {least_stolen_percent:.0}% or more of the CPUs' time (steal), which delays the emulator's replies; run it again when the machine is quieter")]
    ValidationDisturbed {
        /// Runs made.
        attempts: u32,
        /// The least share of CPU time stolen in any of them, %.
        least_stolen_percent: f64,
    },
    /// The kernel has no such I/O scheduler.
    #[error("this kernel has no '{name}' I/O scheduler (its schedulers: {}): choose one of those, or a kernel built with it", offered.join(", "))]
    NoElevator {
        /// The scheduler asked for.
        name: String,
        /// What the kernel offers.
        offered: Vec<String>,
    },
    /// A file of the lab could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl LabError {
    /// The process exit code for this error; each kind of bad input has its own.
    #[must_use]
    pub fn exit_code(&self) -> u8 {
        match self {
            // 2 is clap's code for bad command lines (an unknown model, a malformed size).
            Self::Model(_) => 3,
            Self::Size { .. } => 4,
            Self::Leftover { .. } => 5,
            Self::FuseUnavailable { .. } => 6,
            Self::NotUp { .. } => 7,
            Self::ValidationFailed { .. } => 8,
            Self::ValidationDisturbed { .. } => 11,
            Self::Emulator { .. } => 9,
            Self::NoElevator { .. } => 12,
            Self::System { .. } | Self::Io { .. } => 10,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    /// A failed system command or call.
    pub fn system(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::System {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}
