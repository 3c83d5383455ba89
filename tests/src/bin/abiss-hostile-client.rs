//! A hostile local client, run by the security tests as an unprivileged user (`setpriv`):
//! it does to abissd's socket what a user who means harm would.
//!
//! - `abiss-hostile-client SOCKET fds CONNECTIONS FDS`: opens CONNECTIONS connections, one
//!   after another; on each sends a valid `hello` line carrying FDS descriptors (`SCM_RIGHTS`,
//!   copies of /dev/null), reads the answer, and hangs up. Prints how many were answered.
//! - `abiss-hostile-client SOCKET overflow FILE`: attaches FILE at 1000 B/s and tells the
//!   daemon its playout point is at `u64::MAX`, then lists its streams.
//! - `abiss-hostile-client SOCKET admit DEVICE COUNT`: asks for a capacity plan of COUNT
//!   streams of 1 B/s, straight on the protocol (abissctl would refuse such a count itself);
//!   prints the answer.
//! - `abiss-hostile-client SOCKET opath FILE 0`: attaches FILE through an `O_PATH` descriptor,
//!   which needs no right to read it; prints the answer.
//! - `abiss-hostile-client SOCKET outlive 0 0`: with SIGPIPE at its default (as a C program has
//!   it), connects, waits for a line on standard input (the test stops the daemon meanwhile),
//!   then sends position messages as a reading `AbissFile` does: exits 0 when a send fails
//!   with an error, 3 if all went through; a SIGPIPE kills it instead.
use std::io::{BufRead, BufReader, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use std::path::Path;

use abiss_client::Client;
use abiss_proto::{
    encode_line, AdmitRequest, AttachRequest, ByteRate, ByteSize, Envelope, Request,
};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, mode, first, second] = args.as_slice() else {
        eprintln!("usage: abiss-hostile-client SOCKET fds|overflow|admit|opath|outlive ARG ARG");
        return ExitCode::from(2);
    };
    match mode.as_str() {
        "fds" => {
            let (Ok(connections), Ok(fds)) = (first.parse::<u32>(), second.parse::<usize>()) else {
                eprintln!("CONNECTIONS and FDS are numbers");
                return ExitCode::from(2);
            };
            println!("{}", many_descriptors(socket, connections, fds));
            ExitCode::SUCCESS
        }
        "overflow" => overflow(socket, first),
        "outlive" => outlive(socket),
        "opath" => opath(socket, first),
        "admit" => {
            let Ok(count) = second.parse::<u32>() else {
                eprintln!("COUNT is a number");
                return ExitCode::from(2);
            };
            admit(socket, first, count)
        }
        other => {
            eprintln!("unknown mode {other}");
            ExitCode::from(2)
        }
    }
}

/// Connections, each with a hello carrying `fds` descriptors; how many were answered.
fn many_descriptors(socket: &str, connections: u32, fds: usize) -> u32 {
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
    answered
}

/// A playout point at the end of the number line.
fn overflow(socket: &str, file: &str) -> ExitCode {
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let stream = client
        .attach(
            std::fs::File::open(file).expect("open"),
            AttachRequest {
                rate: ByteRate(1000),
                buffer: ByteSize(64 << 10),
                batch_pages: 1,
                priority: 0,
                persistent: false,
            },
        )
        .expect("attach");
    client.position(stream.id, u64::MAX).expect("position");
    client.position(stream.id, u64::MAX - 1).expect("position");
    let listed = client.list().expect("list");
    println!("{}", listed.len());
    ExitCode::SUCCESS
}

/// An attach with a descriptor that proves no right to read.
fn opath(socket: &str, file: &str) -> ExitCode {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(handle) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(file)
    else {
        eprintln!("cannot open {file} with O_PATH");
        return ExitCode::from(4);
    };
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let answer = client.attach(
        &handle,
        AttachRequest {
            rate: ByteRate(1000),
            buffer: ByteSize(64 << 10),
            batch_pages: 1,
            priority: 0,
            persistent: true,
        },
    );
    println!("{answer:?}");
    ExitCode::SUCCESS
}

/// A plan of `count` streams of 1 B/s on `device`.
fn admit(socket: &str, device: &str, count: u32) -> ExitCode {
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let answer = client.call(Request::Admit(AdmitRequest {
        device: device.to_owned(),
        rate: ByteRate(1),
        rate_stdev: ByteRate(0),
        buffer: ByteSize(564 << 10),
        batch_pages: None,
        count: Some(count),
        mode: None,
        write: false,
    }));
    println!("{answer:?}");
    ExitCode::SUCCESS
}

/// Position messages after the daemon went away.
fn outlive(socket: &str) -> ExitCode {
    // SAFETY: restoring the default disposition of a signal; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    for offset in 0..20 {
        // The non-blocking send AbissFile's reads use, and so libabiss's abiss_fread.
        if client.try_position(1, offset).is_err() {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ExitCode::from(3)
}
