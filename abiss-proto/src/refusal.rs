//! Why abissd said no: one type, so every refusal has its error kind (and so the client's exit
//! code) and its one sentence in a single place.

use crate::{ErrorKind, Response, StreamId};

/// A request abissd will not carry out. Its `Display` is the sentence a person reads: what is
/// wrong and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A parameter is out of range, or the passed descriptor is not a file that can stream;
    /// the sentence names it.
    #[error("{0}")]
    BadRequest(String),
    /// The file is being recorded already: a file has one write stream at most.
    #[error(
        "{path} is already being recorded{}; a file has one recording at most",
        by_stream(*.stream)
    )]
    AlreadyRecording {
        /// The file.
        path: String,
        /// Its write stream, named only to its owner and root: another user's stream ids are
        /// not told.
        stream: Option<StreamId>,
    },
    /// The file has as many streams as one file may.
    #[error("{path} already has {max} streams, the most one file may; detach one first")]
    FileFull {
        /// The file.
        path: String,
        /// The limit.
        max: usize,
    },
    /// The user holds as many streams of the file as one user may: the file's other slots are
    /// for other users.
    #[error(
        "this user already has {max} streams of {path}, the most one user may have of one file; \
         detach one first"
    )]
    FileFullForUser {
        /// The file.
        path: String,
        /// The limit.
        max: usize,
    },
    /// The daemon holds as many streams as it may.
    #[error("abissd already serves {max} streams, its most")]
    DaemonFull {
        /// The limit.
        max: usize,
    },
    /// The user holds as many streams as one user may.
    #[error("this user already holds {max} streams, the most one user may; detach one first")]
    UserFull {
        /// The limit.
        max: usize,
    },
    /// Admission control found no room; the sentence gives the figures.
    #[error("{0}")]
    DoesNotFit(String),
    /// No stream of the asker's matches. Another user's stream gets this answer too, word
    /// for word, so that no user learns of another's streams by asking.
    #[error("{what} is not attached; `abissctl list` shows the streams")]
    NotAttached {
        /// The stream or file asked for, as a person would name it.
        what: String,
    },
    /// The device is unknown, or abissd does not manage it.
    #[error("{0}")]
    UnknownDevice(String),
    /// The device's saved model cannot be used.
    #[error("{0}")]
    ModelUnusable(String),
    /// Something failed inside the daemon.
    #[error("{0}")]
    Internal(String),
}

impl Refusal {
    /// The class of failure, which clients map to exit codes.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::AlreadyRecording { .. }
            | Self::FileFull { .. }
            | Self::FileFullForUser { .. }
            | Self::DaemonFull { .. }
            | Self::UserFull { .. }
            | Self::DoesNotFit(_) => ErrorKind::Refused,
            Self::NotAttached { .. } => ErrorKind::NotFound,
            Self::UnknownDevice(_) => ErrorKind::UnknownDevice,
            Self::ModelUnusable(_) => ErrorKind::ModelUnusable,
            Self::Internal(_) => ErrorKind::Internal,
        }
    }
}

/// " by stream N", or nothing when the stream is not the asker's to know.
fn by_stream(stream: Option<StreamId>) -> String {
    stream.map_or_else(String::new, |id| format!(" by stream {id}"))
}

impl From<Refusal> for Response {
    fn from(refusal: Refusal) -> Self {
        Self::Error {
            error: refusal.kind(),
            message: refusal.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_answers_with_its_kind_and_sentence() {
        let refusal = Refusal::NotAttached {
            what: "stream 7".into(),
        };
        assert_eq!(
            Response::from(refusal),
            Response::Error {
                error: ErrorKind::NotFound,
                message: "stream 7 is not attached; `abissctl list` shows the streams".into(),
            }
        );
        let recorded = |stream| Refusal::AlreadyRecording {
            path: "/a".into(),
            stream,
        };
        assert_eq!(
            recorded(Some(StreamId(3))).to_string(),
            "/a is already being recorded by stream 3; a file has one recording at most"
        );
        assert_eq!(
            recorded(None).to_string(),
            "/a is already being recorded; a file has one recording at most"
        );
        assert_eq!(Refusal::DaemonFull { max: 3 }.kind(), ErrorKind::Refused);
    }
}
