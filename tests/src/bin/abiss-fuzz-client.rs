//! The hands of the protocol fuzzer (`tests/tests/fuzz_protocol.rs`): run as `nobody`, it does
//! to abissd's socket exactly what each generated case says, so that the daemon meets the cases
//! as an unprivileged local user's, while the test (root) generates them and checks the daemon.
//!
//! `abiss-fuzz-client SOCKET FILE DIRECTORY MANAGED_FILE OTHER_DISK_FILE SECRET_FILE FUSE_FILE`
//!
//! Reads one case per line on standard input, a JSON object:
//! `{"connections": [{"messages": [{"hex": "…", "fds": ["pipe", …]}], "hang_up": false}]}`.
//! Every connection of a case runs at once, each in its own thread: it connects, sends each
//! message (its bytes, given in hex, with a descriptor of each named kind passed by
//! `SCM_RIGHTS`), then either hangs up at once (`hang_up`) or shuts its sending side and reads
//! the daemon's answers until the daemon closes or a second has passed. Writes one JSON line
//! per case: how many connections were made, answer lines read, streams attached, connections the daemon closed
//! itself, messages whose sending failed, and descriptors sent.
//!
//! Descriptor kinds: `file` (`FILE`), `directory` (`DIRECTORY`), `opath` (an `O_PATH` descriptor of
//! `SECRET_FILE`, which `nobody` may not read), `pipe` (the read end of a new pipe), `socket` (one
//! end of a new socket pair), `null` (/dev/null), `managed` (`MANAGED_FILE`, on the disk abissd
//! manages), `other_disk` (`OTHER_DISK_FILE`, on a disk it does not manage), `linger` (a TCP
//! socket whose last close waits up to 2 s, `SO_LINGER` with unsent data, until the case ends
//! and its listener goes), `fifo` (a named pipe, opened read-write), `fifo_read` and
//! `fifo_write` (its read end, its write end: the other end is held until the case ends),
//! `fifo_no_writer` (the read end of one that no process writes), `memfd` (a file in
//! memory, `memfd_create`, of 1 MiB), `fuse` (`FUSE_FILE`, on a user's FUSE file system whose flushes,
//! at every close, are answered only after a while), `tty` (the master of a new
//! pseudo-terminal, a character device), `eventfd`, `pidfd` (of the client itself),
//! `opath_dir` (`O_PATH` of `DIRECTORY`), `opath_managed` (`O_PATH` of `MANAGED_FILE`,
//! which `nobody` may read), and `fuse_stuck` (`FUSE_FILE` as `fuse`, but the client keeps a
//! copy open until it exits: for a file system whose flushes are never answered, where a
//! close would wait for ever).
//!
//! Each case's line also carries `first_answer`: the first answer line of a connection (empty if
//! none), so that the test can see what a hand-over was told.
use std::fs::File;
use std::io::{BufRead, BufReader, IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Value};

/// How long a connection waits for the daemon to close after the client stopped sending.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// The paths the descriptor kinds open.
struct Paths {
    socket: String,
    file: String,
    directory: String,
    managed: String,
    other_disk: String,
    secret: String,
    fuse: String,
}

/// What one connection saw.
#[derive(Default)]
struct Outcome {
    connected: u64,
    answers: u64,
    attached: u64,
    closed_by_daemon: u64,
    send_failed: u64,
    fds_sent: u64,
    /// The first answer line read.
    first_answer: String,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, file, directory, managed, other_disk, secret, fuse] = args.as_slice() else {
        eprintln!("usage: abiss-fuzz-client SOCKET FILE DIRECTORY MANAGED_FILE OTHER_DISK_FILE SECRET_FILE FUSE_FILE");
        return ExitCode::from(2);
    };
    let paths = Paths {
        socket: socket.clone(),
        file: file.clone(),
        directory: directory.clone(),
        managed: managed.clone(),
        other_disk: other_disk.clone(),
        secret: secret.clone(),
        fuse: fuse.clone(),
    };
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else {
            return ExitCode::from(3);
        };
        let Ok(case) = serde_json::from_str::<Value>(&line) else {
            eprintln!("a case is one JSON object per line");
            return ExitCode::from(2);
        };
        let outcome = run_case(&paths, &case);
        let answer = json!({
            "connected": outcome.connected,
            "answers": outcome.answers,
            "attached": outcome.attached,
            "closed_by_daemon": outcome.closed_by_daemon,
            "send_failed": outcome.send_failed,
            "fds_sent": outcome.fds_sent,
            "first_answer": outcome.first_answer,
        });
        if writeln!(stdout, "{answer}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return ExitCode::from(3);
        }
    }
    ExitCode::SUCCESS
}

/// The listeners of the case's `linger` sockets: kept until the case ends, so a close of one
/// of them waits until then (and no longer: their going resets the connections).
static LISTENERS: std::sync::Mutex<Vec<std::net::TcpListener>> = std::sync::Mutex::new(Vec::new());

/// Runs every connection of `case` at once; their outcomes summed.
fn run_case(paths: &Paths, case: &Value) -> Outcome {
    let outcome = run_connections(paths, case);
    LISTENERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    OTHER_ENDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clear();
    outcome
}

/// The ends of the case's FIFOs that were not passed: held until the case ends.
static OTHER_ENDS: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

/// A new named pipe's end opened with `flags` (and `O_NONBLOCK`), and with `other` (if any)
/// its other end, held until the case ends; the pipe's name is removed at once.
fn fifo_end(flags: libc::c_int, other: Option<libc::c_int>) -> Option<OwnedFd> {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("abiss-fuzz-fifo-{}-{made}", std::process::id()));
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).ok()?;
    let open = |flags: libc::c_int| {
        nix::fcntl::open(
            &path,
            nix::fcntl::OFlag::from_bits_truncate(flags | libc::O_NONBLOCK),
            nix::sys::stat::Mode::empty(),
        )
        .ok()
        .and_then(|fd| owned(fd.into()))
    };
    // A write end opens without blocking only once there is a reader.
    let held = other.and_then(open);
    let end = open(flags);
    let _ = std::fs::remove_file(&path);
    if let Some(held) = held {
        OTHER_ENDS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(held);
    }
    end
}

fn run_connections(paths: &Paths, case: &Value) -> Outcome {
    let connections = case["connections"].as_array().cloned().unwrap_or_default();
    let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
        let running: Vec<_> = connections
            .iter()
            .map(|connection| scope.spawn(move || run_connection(paths, connection)))
            .collect();
        running
            .into_iter()
            .map(|thread| thread.join().unwrap_or_default())
            .collect()
    });
    outcomes
        .into_iter()
        .fold(Outcome::default(), |sum, one| Outcome {
            connected: sum.connected + one.connected,
            answers: sum.answers + one.answers,
            attached: sum.attached + one.attached,
            closed_by_daemon: sum.closed_by_daemon + one.closed_by_daemon,
            send_failed: sum.send_failed + one.send_failed,
            fds_sent: sum.fds_sent + one.fds_sent,
            first_answer: if sum.first_answer.is_empty() {
                one.first_answer
            } else {
                sum.first_answer
            },
        })
}

/// One connection: send every message, then hang up or read the answers.
fn run_connection(paths: &Paths, connection: &Value) -> Outcome {
    let mut outcome = Outcome::default();
    let Ok(stream) = UnixStream::connect(&paths.socket) else {
        return outcome;
    };
    outcome.connected = 1;
    // Answers are read while sending: a daemon that answers many requests must never block
    // on a client that is still sending (nor the client on it).
    let reader = stream
        .try_clone()
        .ok()
        .map(|read_side| std::thread::spawn(move || read_answers(read_side)));
    let _ = stream.set_write_timeout(Some(ANSWER_WAIT));
    for message in connection["messages"].as_array().into_iter().flatten() {
        let bytes = decode_hex(message["hex"].as_str().unwrap_or_default());
        let kinds: Vec<&str> = message["fds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let held: Vec<(&str, OwnedFd)> = kinds
            .iter()
            .filter_map(|&kind| Some((kind, open_kind(paths, kind)?)))
            .collect();
        let raw: Vec<RawFd> = held.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
        let sent = send(&stream, &bytes, &raw);
        for (kind, fd) in held {
            // Never closed: where the file system never answers a flush, the close would
            // wait for ever (the test ends the server before it ends this client).
            if kind == "fuse_stuck" {
                std::mem::forget(fd);
            }
        }
        if sent {
            outcome.fds_sent += raw.len() as u64;
        } else {
            outcome.send_failed += 1;
            break;
        }
    }
    if connection["hang_up"].as_bool().unwrap_or(false) {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    } else {
        let _ = stream.shutdown(std::net::Shutdown::Write);
    }
    if let Some(reader) = reader {
        let (answers, attached, closed, first) =
            reader.join().unwrap_or((0, 0, false, String::new()));
        outcome.first_answer = first;
        outcome.answers = answers;
        outcome.attached = attached;
        outcome.closed_by_daemon = u64::from(closed);
    }
    outcome
}

/// Sends `bytes` with `fds` in one message (the whole of it, in as many writes as it takes;
/// the descriptors go with the first). Whether all of it went.
fn send(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> bool {
    let mut sent = 0;
    while sent < bytes.len() {
        let rights = [ControlMessage::ScmRights(fds)];
        let control: &[ControlMessage] = if sent == 0 && !fds.is_empty() {
            &rights
        } else {
            &[]
        };
        match sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&bytes[sent..])],
            control,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(0) | Err(_) => return false,
            Ok(written) => sent += written,
        }
    }
    true
}

/// Reads answer lines until the daemon closes or [`ANSWER_WAIT`] passes; the lines read, the
/// streams attached, whether the daemon closed, and the first line.
fn read_answers(stream: UnixStream) -> (u64, u64, bool, String) {
    let deadline = Instant::now() + ANSWER_WAIT;
    let (mut lines, mut attached) = (0, 0);
    let mut first = String::new();
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return (lines, attached, false, first);
        };
        if left.is_zero() || reader.get_ref().set_read_timeout(Some(left)).is_err() {
            return (lines, attached, false, first);
        }
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return (lines, attached, true, first),
            Ok(_) if line.ends_with(b"\n") => {
                if lines == 0 {
                    String::from_utf8_lossy(&line)
                        .trim_end()
                        .clone_into(&mut first);
                }
                lines += 1;
                attached += u64::from(line.starts_with(br#"{"kind":"attached""#));
                line.clear();
            }
            Ok(_) => {}
            // A reset is the daemon closing on a client that still had data in flight.
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => {
                return (lines, attached, true, first)
            }
            Err(_) => return (lines, attached, false, first),
        }
    }
}

/// A new descriptor of `kind` (none if it cannot be made: the case goes on without it).
fn open_kind(paths: &Paths, kind: &str) -> Option<OwnedFd> {
    let open = |path: &str| File::open(path).ok().map(OwnedFd::from);
    match kind {
        "file" => open(&paths.file),
        "directory" => open(&paths.directory),
        "managed" => open(&paths.managed),
        "other_disk" => open(&paths.other_disk),
        "null" => open("/dev/null"),
        "fuse" | "fuse_stuck" => open(&paths.fuse),
        "opath" => opath(&paths.secret),
        "pipe" => nix::unistd::pipe()
            .ok()
            .map(|(read_end, _write_end)| read_end),
        "socket" => UnixStream::pair()
            .ok()
            .map(|(one, _other)| OwnedFd::from(one)),
        "linger" => {
            let (listener, socket) = abiss_tests::hostile::lingering_socket(2);
            LISTENERS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(listener);
            Some(socket)
        }
        "fifo" => {
            let path = std::env::temp_dir().join(format!("abiss-fuzz-fifo-{}", std::process::id()));
            let _ = nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU);
            let fifo = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .ok()
                .map(OwnedFd::from);
            let _ = std::fs::remove_file(&path);
            fifo
        }
        "fifo_read" => fifo_end(libc::O_RDONLY, Some(libc::O_WRONLY)),
        "fifo_write" => fifo_end(libc::O_WRONLY, Some(libc::O_RDONLY)),
        "fifo_no_writer" => fifo_end(libc::O_RDONLY, None),
        // SAFETY (all three): system calls that make a new descriptor (or fail), no pointers.
        "tty" => owned(unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY) }.into()),
        "eventfd" => owned(unsafe { libc::eventfd(0, 0) }.into()),
        "pidfd" => owned(unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) }),
        "opath_dir" => opath(&paths.directory),
        "opath_managed" => opath(&paths.managed),
        // With 1 MiB in it: an empty one is refused as empty, before anything else is asked.
        "memfd" => nix::sys::memfd::memfd_create(
            c"abiss-fuzz",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .ok()
        .map(|memfd| {
            let mut file = File::from(memfd);
            let _ = file.write_all(&vec![7u8; 1 << 20]);
            OwnedFd::from(file)
        }),
        // A recorder's ring as abissd takes one: 64 KiB, touched, sealed against shrinking,
        // growing and later writers.
        "sealed_ring" => nix::sys::memfd::memfd_create(
            c"abiss-fuzz-ring",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC
                | nix::sys::memfd::MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .ok()
        .and_then(|memfd| {
            let mut file = File::from(memfd);
            file.write_all(&vec![7u8; 64 << 10]).ok()?;
            let seals = nix::fcntl::SealFlag::F_SEAL_SHRINK
                | nix::fcntl::SealFlag::F_SEAL_GROW
                | nix::fcntl::SealFlag::F_SEAL_FUTURE_WRITE;
            nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_ADD_SEALS(seals)).ok()?;
            Some(OwnedFd::from(file))
        }),
        _ => None,
    }
}

/// The new descriptor a system call returned, if it did.
fn owned(fd: libc::c_long) -> Option<OwnedFd> {
    let fd = libc::c_int::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: just made by the call, owned by nothing else.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// An `O_PATH` descriptor of `path`.
fn opath(path: &str) -> Option<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()
        .map(OwnedFd::from)
}

/// Bytes from hex digits (pairs that are not hex are skipped).
fn decode_hex(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .filter_map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 16).ok())
        })
        .collect()
}
