//! Objects whose close waits as long as their owner likes, for the attacks of the security
//! tests and the fuzzer: a daemon that closes one a user passed it must not wait with it.

use std::io::{BufRead, BufReader, IoSlice, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub use abiss_lab::stalling_fs::StallingFs;
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
/// of its own to abissd at `socket` (`out_of_band`: on a byte of out-of-band data inside the
/// `hello`), closes our copy and hangs up, so that abissd's close of it is the last; its
/// listener (which keeps the linger going) if it was. One abissd refused first is reset
/// instead of waiting here.
///
/// abissd refuses a socket at receipt and closes it at once; if it does so before our own
/// close (its thread wakes at our send, and a busy machine may keep us from the CPU between
/// the send and the close), ours is the last and waits. That try is let go (its listener
/// closed, which ends our wait) and another made, up to [`PASS_TRIES`] in all.
#[must_use]
pub fn pass_lingering_socket(
    socket: &str,
    linger_secs: i32,
    out_of_band: bool,
) -> Option<TcpListener> {
    for _ in 0..PASS_TRIES {
        match try_pass_lingering_socket(socket, linger_secs, out_of_band) {
            Passed::Last(listener) => return Some(listener),
            Passed::Refused => return None,
            Passed::OursWasLast => {
                eprintln!("abissd closed the lingering socket before we did; passing another");
            }
        }
    }
    eprintln!("abissd closed each of {PASS_TRIES} lingering sockets before we did; giving up");
    None
}

/// `connections` connections to abissd at `socket`, one after another, each with a `hello`
/// carrying `fds` descriptors (copies of /dev/null); how many were answered.
#[must_use]
pub fn hellos_with_descriptors(socket: &str, connections: u32, fds: usize) -> u32 {
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return 0;
    };
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

/// The costliest capacity plan a user can ask for on `device`: 10 000 streams of 1 B/s.
#[must_use]
pub fn costliest_plan(device: &str) -> Request {
    Request::Admit(abiss_proto::AdmitRequest {
        device: device.to_owned(),
        rate: abiss_proto::ByteRate(1),
        rate_stdev: abiss_proto::ByteRate(0),
        buffer: abiss_proto::ByteSize(564 << 10),
        batch_pages: None,
        count: Some(10_000),
        mode: None,
        write: false,
    })
}

/// How many times [`pass_lingering_socket`] tries to make abissd's close the last.
pub const PASS_TRIES: usize = 5;

/// How long our own close of a socket abissd still holds may take. A close that is not the
/// last only takes the descriptor away; one that waits for the linger waits seconds.
const OWN_CLOSE: Duration = Duration::from_millis(500);

/// How one try of [`pass_lingering_socket`] went.
enum Passed {
    /// Sent, and our close did not wait: abissd holds the last reference.
    Last(TcpListener),
    /// A send failed (abissd had hung up): the socket's linger was taken off, so no close of
    /// it waits, whether or not abissd received it.
    Refused,
    /// Sent, but abissd had closed it before we did: ours was the last, now let go.
    OursWasLast,
}

fn try_pass_lingering_socket(socket: &str, linger_secs: i32, out_of_band: bool) -> Passed {
    let line = encode_line(&Envelope::new(Request::Hello)).expect("encode");
    let (listener, lingering) = lingering_socket(linger_secs);
    let sent = UnixStream::connect(socket).ok().filter(|stream| {
        let raw = [lingering.as_raw_fd()];
        let rights = [ControlMessage::ScmRights(&raw)];
        let send = |bytes: &[u8], with: &[ControlMessage<'_>], flags: MsgFlags| {
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(bytes)],
                with,
                MsgFlags::MSG_NOSIGNAL | flags,
                None,
            )
            .is_ok()
        };
        if out_of_band {
            // The hello's newline is a byte of out-of-band data carrying the socket, which a
            // reader that does not take it inline skips (the kernel then drops what it carried
            // in the reader's own thread); another hello follows, so that such a reader meets
            // the byte with data behind it (at the end of what was sent, it stops short).
            let (body, newline) = line.split_at(line.len() - 1);
            return send(body, &[], MsgFlags::empty())
                && send(newline, &rights, MsgFlags::MSG_OOB)
                && send(&line, &[], MsgFlags::empty());
        }
        send(&line, &rights, MsgFlags::empty())
    });
    let Some(sent) = sent else {
        let reset = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = nix::sys::socket::setsockopt(&lingering, nix::sys::socket::sockopt::Linger, &reset);
        return Passed::Refused;
    };
    // Our copy goes first, on a thread of its own, so that we see whether it waits; the
    // connection, with the copy abissd received, after.
    let (done, ours_closed) = std::sync::mpsc::channel();
    let closing = std::thread::spawn(move || {
        drop(lingering);
        let _ = done.send(());
    });
    let ours_waited = ours_closed.recv_timeout(OWN_CLOSE).is_err();
    drop(sent);
    if ours_waited {
        drop(listener);
        let _ = closing.join();
        return Passed::OursWasLast;
    }
    let _ = closing.join();
    Passed::Last(listener)
}

/// A child killed when it drops (a hostile client whose own close of a stalling file may wait
/// on the file system's server, which must then go after it).
#[derive(Debug)]
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `abiss-stalling-fs` mounted by `nobody` on a mountpoint of its own under /tmp
/// ([`StallingFs`]): its file `media.ts` never answers a request for its attributes; a flush of
/// it is never answered, or after `flush_after` if given.
///
/// # Panics
/// If `nobody` cannot mount it.
#[must_use]
pub fn stalling_fs(flush_after: Option<Duration>) -> StallingFs {
    StallingFs::mount(
        &crate::binary("abiss-stalling-fs"),
        65534,
        Path::new("/tmp"),
        flush_after,
    )
    .expect("nobody could not mount the stalling file system")
}

/// Scrapes of the metrics at `address` that never read their answers: `count` connections,
/// each with the smallest receive buffer, that send a whole request head; held until a line
/// arrives on standard input.
#[must_use]
pub fn unread_metrics(address: &str, count: u32) -> std::process::ExitCode {
    use std::io::Write as _;
    let Ok(address) = address.parse::<std::net::SocketAddr>() else {
        eprintln!("ADDRESS is an address and port");
        return std::process::ExitCode::from(2);
    };
    let held: Vec<std::net::TcpStream> = (0..count)
        .filter_map(|_| {
            let socket = nix::sys::socket::socket(
                nix::sys::socket::AddressFamily::Inet,
                nix::sys::socket::SockType::Stream,
                nix::sys::socket::SockFlag::empty(),
                None,
            )
            .ok()?;
            // Before the connection, so that the window it offers is small from the start,
            // and its segments too: the server sizes its send buffer by the segment size
            // (ten segments' worth, twice: over a megabyte on loopback's 64 KiB segments).
            nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &1).ok()?;
            let segment: libc::c_int = 536;
            // SAFETY: a socket of ours and an int that lives across the call.
            let set = unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::IPPROTO_TCP,
                    libc::TCP_MAXSEG,
                    std::ptr::addr_of!(segment).cast(),
                    libc::socklen_t::try_from(size_of::<libc::c_int>()).ok()?,
                )
            };
            if set != 0 {
                return None;
            }
            let mut stream = std::net::TcpStream::from(socket);
            let std::net::SocketAddr::V4(v4) = address else {
                return None;
            };
            let target = libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).ok()?,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a socket of ours and an address that lives across the call.
            let connected = unsafe {
                libc::connect(
                    stream.as_raw_fd(),
                    std::ptr::addr_of!(target).cast(),
                    libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).ok()?,
                )
            };
            if connected != 0 {
                return None;
            }
            stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").ok()?;
            Some(stream)
        })
        .collect();
    println!("sent {}", held.len());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(held);
    std::process::ExitCode::SUCCESS
}

/// `readers FILE COUNT` of the hostile client: [`held_readers`], then `readers N` (how many
/// read), then the readers are held until a line (or the end) comes on standard input.
#[must_use]
pub fn held_readers_command(file: &str, count: &str) -> std::process::ExitCode {
    let Ok(count) = count.parse::<u32>() else {
        eprintln!("COUNT is a number");
        return std::process::ExitCode::from(2);
    };
    let Ok((release, children)) = held_readers(Path::new(file), count) else {
        eprintln!("cannot make the readers");
        return std::process::ExitCode::from(1);
    };
    println!("readers {}", children.len());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(release);
    for child in children {
        let _ = nix::sys::wait::waitpid(child, None);
    }
    std::process::ExitCode::SUCCESS
}

/// Makes `count` processes, one after another, each of which reads the first page of `file`
/// (a new reader of the file to the kernel programs) and then waits until the pipe whose
/// writing end this returns is closed. The processes that read.
///
/// # Errors
/// The file cannot be opened or the pipe made.
pub fn held_readers(file: &Path, count: u32) -> std::io::Result<(OwnedFd, Vec<nix::unistd::Pid>)> {
    use std::os::unix::fs::FileExt;
    let opened = std::fs::File::open(file)?;
    let (wait_on, release) = nix::unistd::pipe()?;
    let mut children = Vec::new();
    for _ in 0..count {
        // SAFETY: the child only reads into buffers it owns and leaves with `_exit`.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => {
                drop(release);
                let mut page = [0u8; 4096];
                let ok = opened.read_at(&mut page, 0).is_ok();
                let mut byte = [0u8; 1];
                let _ = nix::unistd::read(wait_on.as_raw_fd(), &mut byte);
                // SAFETY: leaves the child without running the parent's exit handlers.
                unsafe { libc::_exit(i32::from(!ok)) };
            }
            Ok(nix::unistd::ForkResult::Parent { child }) => children.push(child),
            Err(_) => break,
        }
    }
    Ok((release, children))
}
