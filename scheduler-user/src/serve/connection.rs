//! One client connection: protocol lines in, file descriptors alongside (`SCM_RIGHTS`).
//!
//! Every descriptor that arrives is the client's object: it is held as a [`ClientFd`], whose
//! close runs on its user's closing thread ([`Closer`]), never here. One that can never be a
//! stream (a socket, a pipe, a device, a directory, an `O_PATH` descriptor) is given back to
//! the closer at once, and the attach it came with is told why.

use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use abiss_proto::MAX_LINE_BYTES;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use crate::serve::closer::{ClientFd, Closer};

/// A descriptor as it arrived: held, or already given back with the reason it can never be a
/// stream.
pub(crate) type Received = Result<ClientFd, String>;

/// A Unix stream socket read as lines, keeping every descriptor that arrives in order.
#[derive(Debug)]
pub(crate) struct FramedSocket {
    stream: Option<UnixStream>,
    buffer: Vec<u8>,
    fds: VecDeque<Received>,
    uid: u32,
    closer: Closer,
}

impl FramedSocket {
    /// Wraps an accepted connection of user `uid`: what it passes, and the socket itself, are
    /// closed through `closer`.
    #[must_use]
    pub(crate) fn new(stream: UnixStream, uid: u32, closer: Closer) -> Self {
        Self {
            stream: Some(stream),
            buffer: Vec::new(),
            fds: VecDeque::new(),
            uid,
            closer,
        }
    }

    fn socket(&self) -> &UnixStream {
        self.stream
            .as_ref()
            .expect("the socket is taken only when the connection drops")
    }

    /// The next line, without its newline; `None` at the end of the connection.
    pub(crate) async fn next_line(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buffer.drain(..=end).collect();
                line.pop();
                return Ok(Some(line));
            }
            if self.buffer.len() > MAX_LINE_BYTES {
                return Err(io::Error::other(format!(
                    "message longer than {MAX_LINE_BYTES} bytes"
                )));
            }
            self.socket().readable().await?;
            let mut chunk = [0u8; 8192];
            let fd = self.socket().as_raw_fd();
            let (uid, closer) = (self.uid, self.closer.clone());
            let fds = &mut self.fds;
            let stream = self
                .stream
                .as_ref()
                .expect("the socket is taken only when the connection drops");
            match stream.try_io(Interest::READABLE, || {
                receive(fd, &mut chunk, fds, uid, &closer)
            }) {
                Ok(0) => return Ok(None),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
        }
    }

    /// The oldest descriptor received and not yet taken.
    pub(crate) fn take_fd(&mut self) -> Option<Received> {
        self.fds.pop_front()
    }

    /// Writes all of `bytes`.
    pub(crate) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream
            .as_mut()
            .expect("the socket is taken only when the connection drops")
            .write_all(bytes)
            .await
    }
}

impl Drop for FramedSocket {
    /// The socket may still hold descriptors the client sent and abissd never received: their
    /// last close would be abissd's, so the socket is closed through the closer too.
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        match stream.into_std() {
            Ok(stream) => self
                .closer
                .close_connection(self.uid, OwnedFd::from(stream)),
            Err(error) => log::warn!(
                "cannot hand a connection of uid {} to its closer: {error}",
                self.uid
            ),
        }
    }
}

/// The most descriptors the kernel passes with one message (`SCM_MAX_FD`): room for all of
/// them, so the kernel never installs descriptors in the daemon that it then cannot see
/// (`MSG_CTRUNC`), which would leak them.
const SCM_MAX_FD: usize = 253;

/// The most descriptors a connection may have waiting for the requests that take them: an
/// attach takes one, and a client has no reason to send ahead.
pub(crate) const MAX_PENDING_FDS: usize = 4;

/// One `recvmsg`: data into `buffer`, descriptors onto `fds` (close-on-exec). A message with
/// more than one descriptor, or more waiting than [`MAX_PENDING_FDS`], is refused; every
/// descriptor it brought is closed.
fn receive(
    fd: RawFd,
    buffer: &mut [u8],
    fds: &mut VecDeque<Received>,
    uid: u32,
    closer: &Closer,
) -> io::Result<usize> {
    let mut control = nix::cmsg_space!([RawFd; SCM_MAX_FD]);
    let mut iov = [IoSliceMut::new(buffer)];
    let message = recvmsg::<()>(fd, &mut iov, Some(&mut control), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut arrived = Vec::new();
    // With room for SCM_MAX_FD descriptors the control data is never cut short; if it were,
    // nix cannot list it, and the descriptors in it could not be closed.
    for cmsg in message.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            // SAFETY: the kernel just installed these descriptors for us; nothing else owns
            // them.
            arrived.extend(received.into_iter().map(|raw| {
                ClientFd::new(unsafe { OwnedFd::from_raw_fd(raw) }, uid, closer.clone())
            }));
        }
    }
    if arrived.len() > 1 || fds.len() + arrived.len() > MAX_PENDING_FDS {
        // `arrived` drops here, closing them.
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message may carry one descriptor, for the attach request it comes with",
        ));
    }
    fds.extend(arrived.into_iter().map(|fd| {
        match crate::serve::client_file::examine(fd.as_fd()) {
            Ok(_) => Ok(fd),
            // `fd` drops here, on its way to the closer.
            Err(reason) => Err(format!("the descriptor passed {reason}")),
        }
    }));
    Ok(message.bytes)
}
