//! Objects whose close waits as long as their owner likes, for the attacks of the security
//! tests and the fuzzer: a daemon that closes one a user passed it must not wait with it.

use std::io::{IoSlice, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use abiss_proto::{encode_line, Envelope, Request};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

/// A TCP connection on loopback whose last close waits `linger_secs` (`SO_LINGER`): the
/// returned listener never accepts it, so the data it was filled with stays unsent. Closing
/// the listener resets the connection and ends the wait.
#[must_use]
pub fn lingering_socket(linger_secs: i32) -> (TcpListener, OwnedFd) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
    let mut stream =
        TcpStream::connect(listener.local_addr().expect("address")).expect("connect on loopback");
    stream.set_nonblocking(true).expect("nonblocking");
    let chunk = vec![0u8; 65536];
    while stream.write(&chunk).is_ok() {}
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: linger_secs,
    };
    nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger)
        .expect("SO_LINGER");
    stream.set_nonblocking(false).expect("blocking");
    (listener, OwnedFd::from(stream))
}

/// Passes one TCP socket whose last close waits `linger_secs` with a `hello` on a connection
/// of its own to abissd at `socket`, closes our copy and hangs up; its listener (which keeps the linger going) if
/// the socket was sent. One abissd refused first is reset instead of waiting here.
#[must_use]
pub fn pass_lingering_socket(socket: &str, linger_secs: i32) -> Option<std::net::TcpListener> {
    let line = encode_line(&Envelope::new(Request::Hello)).expect("encode");
    let (listener, lingering) = lingering_socket(linger_secs);
    let sent = UnixStream::connect(socket).ok().filter(|stream| {
        let raw = [lingering.as_raw_fd()];
        let rights = [ControlMessage::ScmRights(&raw)];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&line)],
            &rights,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .is_ok()
    });
    if sent.is_none() {
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = nix::sys::socket::setsockopt(&lingering, nix::sys::socket::sockopt::Linger, &reset);
    }
    // Our copy goes first; the connection, with the copy abissd received, after.
    drop(lingering);
    drop(sent?);
    Some(listener)
}
