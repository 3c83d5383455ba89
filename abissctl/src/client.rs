//! A blocking connection to abissd.

use std::io::{BufRead, BufReader, ErrorKind as IoErrorKind, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use abiss_proto::{decode_line, encode_line, Envelope, ErrorKind, Request, Response};

use crate::error::CliError;

/// One connection to the daemon.
#[derive(Debug)]
pub struct DaemonClient {
    path: PathBuf,
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl DaemonClient {
    /// Connects to the daemon's socket at `path`.
    pub fn connect(path: &Path) -> Result<Self, CliError> {
        match std::fs::metadata(path) {
            Err(error) if error.kind() == IoErrorKind::NotFound => {
                return Err(CliError::DaemonNotRunning {
                    path: path.to_path_buf(),
                    reason: "no socket",
                })
            }
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(CliError::NotASocket {
                    path: path.to_path_buf(),
                })
            }
            _ => {}
        }
        let stream = UnixStream::connect(path).map_err(|error| match error.kind() {
            IoErrorKind::ConnectionRefused | IoErrorKind::NotFound => CliError::DaemonNotRunning {
                path: path.to_path_buf(),
                reason: "nobody answers",
            },
            IoErrorKind::PermissionDenied => CliError::PermissionDenied(format!(
                "this user may not connect to {}; ask an administrator for access",
                path.display()
            )),
            _ => CliError::Other(format!("cannot connect to {}: {error}", path.display())),
        })?;
        let reader = BufReader::new(
            stream
                .try_clone()
                .map_err(|error| CliError::Other(format!("cannot use the connection: {error}")))?,
        );
        Ok(Self {
            path: path.to_path_buf(),
            writer: stream,
            reader,
        })
    }

    /// Sends a request without waiting for the answer.
    pub fn send(&mut self, request: Request) -> Result<(), CliError> {
        let line = encode_line(&Envelope::new(request))
            .map_err(|error| CliError::Other(error.to_string()))?;
        self.writer
            .write_all(&line)
            .map_err(|error| self.broken(&error))
    }

    /// Reads the next response; daemon errors become [`CliError`]s.
    pub fn receive(&mut self) -> Result<Response, CliError> {
        let mut line = Vec::new();
        let read = self
            .reader
            .read_until(b'\n', &mut line)
            .map_err(|error| self.broken(&error))?;
        if read == 0 {
            return Err(CliError::Other(format!(
                "abissd closed the connection on {} (did it stop?)",
                self.path.display()
            )));
        }
        let response: Response =
            decode_line(&line).map_err(|error| CliError::Other(format!("abissd sent {error}")))?;
        match response {
            Response::Error { error, message } => Err(match error {
                ErrorKind::BadRequest => CliError::Refused(message),
                ErrorKind::VersionMismatch => CliError::VersionMismatch(message),
                ErrorKind::PermissionDenied => CliError::PermissionDenied(message),
                ErrorKind::Internal => CliError::Other(format!("abissd failed: {message}")),
            }),
            other => Ok(other),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&mut self, request: Request) -> Result<Response, CliError> {
        self.send(request)?;
        self.receive()
    }

    fn broken(&self, error: &std::io::Error) -> CliError {
        CliError::Other(format!(
            "the connection to abissd on {} broke: {error}",
            self.path.display()
        ))
    }
}

/// The answer did not have the expected kind.
pub fn unexpected(response: &Response) -> CliError {
    CliError::Other(format!(
        "abissd answered with an unexpected message: {response:?}"
    ))
}
