//! The daemon's control socket: one daemon per socket path, no stale files left behind.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use tokio::net::UnixListener;

/// Failures to take the socket path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    /// Another daemon holds the path.
    #[error("another abissd is already serving {path}; stop it first, or give this one another --socket")]
    AlreadyRunning {
        /// The socket path.
        path: PathBuf,
    },
    /// Something other than a socket is in the way.
    #[error("{path} exists and is not a socket; remove it or choose another --socket")]
    NotASocket {
        /// The socket path.
        path: PathBuf,
    },
    /// The path could not be set up.
    #[error("cannot listen on {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// A bound control socket. Dropping it removes the socket file and releases the lock.
#[derive(Debug)]
pub(crate) struct ControlSocket {
    path: PathBuf,
    listener: UnixListener,
    _lock: Flock<File>,
}

impl ControlSocket {
    /// Binds `path`, refusing if another daemon serves it. Must run inside a tokio runtime.
    pub(crate) fn bind(path: &Path) -> Result<Self, SocketError> {
        let io_error = |source| SocketError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() && !parent.exists() {
                fs::create_dir_all(parent).map_err(io_error)?;
                fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).map_err(io_error)?;
            }
        }
        if let Ok(meta) = fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(SocketError::NotASocket {
                    path: path.to_path_buf(),
                });
            }
        }
        // The lock decides who owns the path; a connect test alone races between two starts.
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error)?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock).map_err(|_| {
            SocketError::AlreadyRunning {
                path: path.to_path_buf(),
            }
        })?;
        if path.exists() {
            if StdUnixStream::connect(path).is_ok() {
                return Err(SocketError::AlreadyRunning {
                    path: path.to_path_buf(),
                });
            }
            // A socket nobody answers on is left over from a daemon that died.
            fs::remove_file(path).map_err(io_error)?;
        }
        let listener = UnixListener::bind(path).map_err(io_error)?;
        // Clients are unprivileged; what each may do is decided per request from its credentials.
        fs::set_permissions(path, fs::Permissions::from_mode(0o666)).map_err(io_error)?;
        Ok(Self {
            path: path.to_path_buf(),
            listener,
            _lock: lock,
        })
    }

    /// The listener.
    #[must_use]
    pub(crate) fn listener(&self) -> &UnixListener {
        &self.listener
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
