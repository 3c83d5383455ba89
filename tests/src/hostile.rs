//! Objects whose close waits as long as their owner likes, for the attacks of the security
//! tests and the fuzzer: a daemon that closes one a user passed it must not wait with it.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;

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
