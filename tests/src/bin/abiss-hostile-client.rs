//! A hostile local client, run by the security tests as an unprivileged user (`setpriv`):
//! it does to abissd's socket what a user who means harm would.
//!
//! `abiss-hostile-client SOCKET fds CONNECTIONS FDS`: opens CONNECTIONS connections, one after
//! another; on each sends a valid `hello` line carrying FDS descriptors (`SCM_RIGHTS`, copies of
//! /dev/null), reads the answer, and hangs up. Prints how many connections were answered.
use std::io::{BufRead, BufReader, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use abiss_proto::{encode_line, Envelope, Request};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, mode, connections, fds] = args.as_slice() else {
        eprintln!("usage: abiss-hostile-client SOCKET fds CONNECTIONS FDS");
        return ExitCode::from(2);
    };
    if mode != "fds" {
        eprintln!("unknown mode {mode}");
        return ExitCode::from(2);
    }
    let (Ok(connections), Ok(fds)) = (connections.parse::<u32>(), fds.parse::<usize>()) else {
        eprintln!("CONNECTIONS and FDS are numbers");
        return ExitCode::from(2);
    };
    let null = std::fs::File::open("/dev/null").expect("open /dev/null");
    let raw: Vec<RawFd> = vec![null.as_raw_fd(); fds];
    let line = encode_line(&Envelope::new(Request::Hello)).expect("encode");
    let mut answered = 0;
    for _ in 0..connections {
        let Ok(stream) = UnixStream::connect(socket) else {
            continue;
        };
        let rights = [ControlMessage::ScmRights(&raw)];
        if sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&line)],
            &rights,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .is_err()
        {
            continue;
        }
        let mut answer = String::new();
        if BufReader::new(&stream).read_line(&mut answer).is_ok() && !answer.is_empty() {
            answered += 1;
        }
    }
    println!("{answered}");
    ExitCode::SUCCESS
}
