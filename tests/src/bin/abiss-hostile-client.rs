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
//! - `abiss-hostile-client SOCKET attach FILE 0`: opens FILE for reading, prints `attaching`
//!   and attaches it at 1000 B/s; prints the answer when it comes.
//! - `abiss-hostile-client SOCKET opath FILE 0`: attaches FILE through an `O_PATH` descriptor,
//!   which needs no right to read it; prints the answer.
//! - `abiss-hostile-client SOCKET threads FILE COUNT`: attaches FILE at 1000 B/s, starts COUNT
//!   threads that wait, and says each is about to read the stream; prints `raised R of COUNT`.
//! - `abiss-hostile-client SOCKET direct FILE COUNT` and `users FILE STREAMS`: the attacks on
//!   raises of `abiss_tests::hostile_raises`.
//! - `abiss-hostile-client SOCKET speedup FILE SECS`: attaches FILE at 1000 B/s, puts its own
//!   thread at best effort 5 and has it raised as the stream's reader, waits SECS (reading the
//!   first page every second, which keeps the raise), sets the
//!   stream's rate to 8 MB/s and at once reads FILE whole; prints `raised true|false` a
//!   second later (whether the thread is still real time).
//! - `abiss-hostile-client SOCKET flood FILE SECS`: attaches FILE at 1000 B/s, then reads its
//!   first byte over and over from two threads for SECS seconds (every read of an attached
//!   file by its owner is an event for abissd); prints `reads N`.
//! - `abiss-hostile-client SOCKET raise FILE TID`: attaches FILE at 1000 B/s and says thread
//!   TID (someone else's) is about to read it; prints `raised true|false`, or the refusal.
//! - `abiss-hostile-client SOCKET raises FILE 0`: attaches FILE at 1000 B/s, prints `attached`,
//!   then for each thread id read from standard input says that thread is about to read the
//!   stream and prints `raised TID true|false` (or the refusal), until standard input ends.
//! - `abiss-hostile-client SOCKET outlive 0 0`: with SIGPIPE at its default (as a C program has
//!   it), connects, waits for a line on standard input (the test stops the daemon meanwhile),
//!   then sends position messages as a reading `AbissFile` does: exits 0 when a send fails
//!   with an error, 3 if all went through; a SIGPIPE kills it instead.
//! - `abiss-hostile-client SOCKET subscribe CONNECTIONS FILE`: CONNECTIONS times, one after
//!   another: connects, attaches FILE (a non-persistent stream; `-` for none), subscribes to
//!   request events, and hangs up once subscribed. A connection refused for the limits is
//!   tried again. Prints `subscribed N attached A retried R`.
//! - `abiss-hostile-client SOCKET hold CONNECTIONS 0`: opens CONNECTIONS connections and keeps
//!   them all, sends `hello` on each and reads the first answer; prints `answered A refused R`
//!   and the first refusal, then holds them until a line arrives on standard input.
//! - `abiss-hostile-client SOCKET plans DEVICE CONNECTIONS`: CONNECTIONS connections each ask
//!   for the costliest capacity plan (10 000 streams of 1 B/s on DEVICE) back to back; prints
//!   `planning` once all have asked once, and stops when a line arrives on standard input.
//! - `abiss-hostile-client SOCKET linger SECS COUNT`: makes COUNT TCP connections on loopback
//!   whose last close waits SECS (`SO_LINGER`, data unsent to a listener that never accepts),
//!   passes each with a `hello` on a connection of its own, closes its own copies and hangs
//!   up, so that abissd's close of each is the last; prints `handed N` (how many were sent:
//!   one abissd refused before it came is reset instead),
//!   then keeps the listeners until a line arrives on standard input. `linger-oob`: each socket
//!   rides on a byte of out-of-band data after the `hello`.
//! - `abiss-hostile-client SOCKET harass SECS FILE DEVICE FUSE_FILE`: the soak's hostile user,
//!   every attack at once ([`abiss_tests::harass`]).
//! - `abiss-hostile-client ADDRESS unread-metrics COUNT 0`: makes COUNT TCP connections to
//!   abissd's metrics at ADDRESS, each with a receive buffer as small as the kernel allows
//!   and 536-byte segments,
//!   sends a whole `GET /metrics` head on each and reads nothing; prints `sent N`, then holds
//!   them until a line arrives on standard input.
//! - `abiss-hostile-client SOCKET readers FILE COUNT`: makes COUNT processes one after another,
//!   each reading the first page of FILE; prints `readers N`, and holds them until a line
//!   comes on standard input, when they exit.
//! - `abiss-hostile-client SOCKET idle SECONDS 0`: connects and sends nothing; prints how long
//!   the daemon took to close the connection (`closed after MS ms: ANSWER`), or exits 3 if it
//!   was still open after SECONDS.
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

use std::path::Path;

use abiss_client::Client;
use abiss_proto::{
    encode_line, AdmitRequest, AttachRequest, ByteRate, ByteSize, Envelope, Request, StreamId,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let [_, socket, mode, secs, file, device, fuse_file] = args.as_slice() {
        return abiss_tests::harass::run(mode, socket, secs, file, device, fuse_file);
    }
    let [_, socket, mode, first, second] = args.as_slice() else {
        eprintln!(
            "usage: abiss-hostile-client SOCKET fds|overflow|admit|attach|unread-metrics|threads|direct|users|speedup|flood|opath|linger|linger-oob|outlive|subscribe|hold|idle|plans|readers ARG ARG"
        );
        return ExitCode::from(2);
    };
    match mode.as_str() {
        "fds" => {
            let (Ok(connections), Ok(fds)) = (first.parse::<u32>(), second.parse::<usize>()) else {
                eprintln!("CONNECTIONS and FDS are numbers");
                return ExitCode::from(2);
            };
            let answered = abiss_tests::hostile::hellos_with_descriptors(socket, connections, fds);
            println!("{answered}");
            ExitCode::SUCCESS
        }
        "overflow" => overflow(socket, first),
        "raise" => raise_other(socket, first, second),
        "raises" => raise_each_named(socket, first),
        "flood" | "speedup" => {
            let Ok(secs) = second.parse::<u64>() else {
                eprintln!("SECS is a number");
                return ExitCode::from(2);
            };
            if mode == "flood" {
                flood_with_reads(socket, first, secs)
            } else {
                speed_up_then_read(socket, first, secs)
            }
        }
        "threads" => {
            let Ok(count) = second.parse::<u32>() else {
                eprintln!("COUNT is a number");
                return ExitCode::from(2);
            };
            raise_many_threads(socket, first, count)
        }
        "outlive" => outlive(socket),
        "plans" => {
            let Ok(connections) = second.parse::<u32>() else {
                eprintln!("CONNECTIONS is a number");
                return ExitCode::from(2);
            };
            plans_back_to_back(socket, first, connections)
        }
        "subscribe" | "hold" | "idle" | "unread-metrics" => {
            let Ok(number) = first.parse::<u32>() else {
                eprintln!("the first argument of {mode} is a number");
                return ExitCode::from(2);
            };
            match mode.as_str() {
                "subscribe" => subscribe_and_hang_up(socket, number, second),
                "hold" => hold_connections(socket, number),
                "unread-metrics" => abiss_tests::hostile::unread_metrics(socket, number),
                _ => idle(socket, number),
            }
        }
        "opath" => opath(socket, first),
        "linger" | "linger-oob" => {
            let (Ok(secs), Ok(count)) = (first.parse::<i32>(), second.parse::<u32>()) else {
                eprintln!("SECS and COUNT are numbers");
                return ExitCode::from(2);
            };
            hand_lingering_sockets(socket, secs, count, mode == "linger-oob")
        }
        "attach" => attach_and_wait(socket, first),
        "readers" => abiss_tests::hostile::held_readers_command(first, second),
        "admit" => {
            let Ok(count) = second.parse::<u32>() else {
                eprintln!("COUNT is a number");
                return ExitCode::from(2);
            };
            admit(socket, first, count)
        }
        // `direct`, `users`, or unknown.
        other => abiss_tests::hostile_raises::run(other, socket, first, second),
    }
}

/// Passes `count` lingering TCP sockets and keeps their listeners (so the lingers last) until
/// standard input says otherwise.
fn hand_lingering_sockets(socket: &str, linger_secs: i32, count: u32, oob: bool) -> ExitCode {
    let listeners: Vec<_> = (0..count)
        .filter_map(|_| abiss_tests::hostile::pass_lingering_socket(socket, linger_secs, oob))
        .collect();
    println!("handed {}", listeners.len());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(listeners);
    ExitCode::SUCCESS
}

/// Connects and attaches `file` at 1000 B/s with a 64 KiB buffer.
fn attach_slowly(socket: &str, file: &str) -> (Client, abiss_proto::StreamInfo) {
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let stream = client
        .attach(
            std::fs::File::open(file).expect("open"),
            AttachRequest {
                persistent: false,
                ..abiss_tests::read_request(1000, 64 << 10, 1)
            },
        )
        .expect("attach");
    (client, stream)
}

/// A playout point at the end of the number line.
fn overflow(socket: &str, file: &str) -> ExitCode {
    let (mut client, stream) = attach_slowly(socket, file);
    client.position(stream.id, u64::MAX).expect("position");
    client.position(stream.id, u64::MAX - 1).expect("position");
    let listed = client.list().expect("list");
    println!("{}", listed.len());
    ExitCode::SUCCESS
}

/// Asks for another user's thread to be raised through one's own stream.
fn raise_other(socket: &str, file: &str, tid: &str) -> ExitCode {
    let Ok(tid) = tid.parse::<u32>() else {
        eprintln!("TID is a number");
        return ExitCode::from(2);
    };
    let (mut client, stream) = attach_slowly(socket, file);
    match client.reader_starts(stream.id, tid) {
        Ok(raised) => println!("raised {raised}"),
        Err(error) => println!("refused: {error}"),
    }
    ExitCode::SUCCESS
}

/// Thread after thread named on standard input, each said to be about to read one stream.
fn raise_each_named(socket: &str, file: &str) -> ExitCode {
    let (mut client, stream) = attach_slowly(socket, file);
    println!("attached");
    for line in std::io::stdin().lines() {
        let Ok(tid) = line.unwrap_or_default().trim().parse::<u32>() else {
            eprintln!("a thread id per line");
            return ExitCode::from(2);
        };
        match client.reader_starts(stream.id, tid) {
            Ok(raised) => println!("raised {tid} {raised}"),
            Err(error) => println!("refused: {error}"),
        }
    }
    ExitCode::SUCCESS
}

/// The owner's own reads of its attached file, as fast as two threads go.
fn flood_with_reads(socket: &str, file: &str, secs: u64) -> ExitCode {
    let (_client, _stream) = attach_slowly(socket, file);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let file = std::fs::File::open(file).expect("open");
            std::thread::spawn(move || {
                let mut byte = [0u8; 1];
                let mut reads = 0u64;
                while std::time::Instant::now() < until {
                    let _ = std::os::unix::fs::FileExt::read_at(&file, &mut byte, 0);
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap_or(0)).sum();
    println!("reads {reads}");
    ExitCode::SUCCESS
}

/// A stream raised long ago at a low rate, then set to a high one, then read at once.
fn speed_up_then_read(socket: &str, file: &str, secs: u64) -> ExitCode {
    let best_effort_5 = (2 << 13) | 5;
    abiss_os::ioprio::set(0, best_effort_5).expect("ioprio_set");
    let (mut client, stream) = attach_slowly(socket, file);
    let tid = u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0);
    if !client.reader_starts(stream.id, tid).unwrap_or(false) {
        println!("never raised");
        return ExitCode::from(3);
    }
    // Keeps the raise alive meanwhile with a read of the first page every second (a raise
    // idles out after 5 s without a read).
    let first_page = std::fs::File::open(file).expect("open");
    let mut page = [0u8; 4096];
    for _ in 0..secs {
        let _ = std::os::unix::fs::FileExt::read_at(&first_page, &mut page, 0);
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
    if let Err(error) = client.set_rate(
        abiss_proto::StreamTarget::Id(stream.id),
        ByteRate(8_000_000),
    ) {
        println!("set-rate refused: {error}");
        return ExitCode::from(3);
    }
    let mut whole = std::fs::File::open(file).expect("open");
    let mut sink = vec![0u8; 1 << 20];
    while std::io::Read::read(&mut whole, &mut sink).is_ok_and(|n| n > 0) {}
    std::thread::sleep(std::time::Duration::from_secs(1));
    let now = abiss_os::ioprio::get(tid).unwrap_or(0);
    println!("raised {}", now != best_effort_5);
    ExitCode::SUCCESS
}

/// Asks for `count` waiting threads of this process to be raised for one stream.
fn raise_many_threads(socket: &str, file: &str, count: u32) -> ExitCode {
    let (mut client, stream) = attach_slowly(socket, file);
    let (tids, waiting) = std::sync::mpsc::channel();
    // The threads wait here until every raise was asked for.
    let done = std::sync::Arc::new(std::sync::Barrier::new(count as usize + 1));
    let threads: Vec<_> = (0..count)
        .map(|_| {
            let tids = tids.clone();
            let done = std::sync::Arc::clone(&done);
            std::thread::spawn(move || {
                let _ = tids.send(nix::unistd::gettid().as_raw());
                done.wait();
            })
        })
        .collect();
    let mut raised = 0;
    for _ in 0..count {
        let Ok(tid) = waiting.recv() else { break };
        let tid = u32::try_from(tid).unwrap_or(0);
        if client.reader_starts(stream.id, tid).unwrap_or(false) {
            raised += 1;
        }
    }
    println!("raised {raised} of {count}");
    done.wait();
    for thread in threads {
        let _ = thread.join();
    }
    ExitCode::SUCCESS
}

/// An attach of `file`, said before it is sent, answered whenever the daemon answers.
fn attach_and_wait(socket: &str, file: &str) -> ExitCode {
    let Ok(handle) = std::fs::File::open(file) else {
        eprintln!("cannot open {file}");
        return ExitCode::from(4);
    };
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    println!("attaching");
    let answer = client.attach(&handle, abiss_tests::read_request(1000, 64 << 10, 1));
    println!("{answer:?}");
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
    let answer = client.attach(&handle, abiss_tests::read_request(1000, 64 << 10, 1));
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
        if client.try_position(StreamId(1), offset).is_err() {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ExitCode::from(3)
}

/// Whether `answer` (one protocol line) refuses the connection.
fn is_refusal(answer: &str) -> bool {
    answer.contains("\"refused\"")
}

/// Subscriptions that hang up once they are served; each may first attach `file`.
fn subscribe_and_hang_up(socket: &str, connections: u32, file: &str) -> ExitCode {
    let (mut subscribed, mut attached, mut retried) = (0, 0, 0);
    while subscribed < connections {
        let mut client = match Client::connect(Path::new(socket)) {
            Ok(client) => client,
            Err(error) => {
                eprintln!("connect: {error}");
                return ExitCode::from(4);
            }
        };
        if file != "-" {
            let request = AttachRequest {
                persistent: false,
                ..abiss_tests::read_request(1000, 64 << 10, 1)
            };
            // Another limit (streams, memory, bursts) may refuse an attach: the subscription
            // is the attack, the stream only what it would hold. A connection refused for the
            // limits answers its first request, here the attach, and closes: try again, as
            // below (while abissd is still letting the last hung-up ones go, a fresh-clone
            // run's neighbours slowing it, the refusal came here and the subscription then
            // found the connection closed).
            match client.attach(std::fs::File::open(file).expect("open"), request) {
                Ok(_) => attached += 1,
                Err(error) if error.to_string().contains("connections") => {
                    retried += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                Err(_) => {}
            }
        }
        match client.subscribe_events() {
            Ok(()) => subscribed += 1,
            Err(error) if error.to_string().contains("connections") => {
                retried += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(error) => {
                eprintln!("subscription refused: {error}");
                return ExitCode::from(5);
            }
        }
        // Dropping the client hangs up.
    }
    println!("subscribed {subscribed} attached {attached} retried {retried}");
    ExitCode::SUCCESS
}

/// `connections` connections held open at once, each asked `hello`.
fn hold_connections(socket: &str, connections: u32) -> ExitCode {
    let hello = encode_line(&Envelope::new(Request::Hello)).expect("encode");
    let mut held = Vec::new();
    let (mut answered, mut refused, mut refusal) = (0, 0, String::new());
    for _ in 0..connections {
        let stream = UnixStream::connect(socket).expect("connect");
        // A refused connection may be closed before the request arrives: that is fine.
        let _ = std::io::Write::write_all(&mut &stream, &hello);
        let mut answer = String::new();
        let _ = BufReader::new(&stream).read_line(&mut answer);
        if is_refusal(&answer) {
            refused += 1;
            if refusal.is_empty() {
                answer.trim().clone_into(&mut refusal);
            }
        } else if answer.contains("hello") {
            answered += 1;
        }
        held.push(stream);
    }
    println!("answered {answered} refused {refused}");
    println!("{refusal}");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    drop(held);
    ExitCode::SUCCESS
}

/// A connection that sends nothing: how long until the daemon closes it.
fn idle(socket: &str, seconds: u32) -> ExitCode {
    let stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(seconds.into())))
        .expect("timeout");
    let started = std::time::Instant::now();
    let mut reader = BufReader::new(&stream);
    let mut answer = String::new();
    let mut rest = String::new();
    let closed = reader.read_line(&mut answer).is_ok() && reader.read_line(&mut rest).is_ok();
    if !closed || !rest.is_empty() {
        println!("still open after {seconds} s: {answer}{rest}");
        return ExitCode::from(3);
    }
    println!(
        "closed after {} ms: {}",
        started.elapsed().as_millis(),
        answer.trim()
    );
    ExitCode::SUCCESS
}

/// Connections asking for the costliest plan, back to back, until standard input has a line.
fn plans_back_to_back(socket: &str, device: &str, connections: u32) -> ExitCode {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};
    let stop = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(Barrier::new(connections as usize + 1));
    let workers: Vec<_> = (0..connections)
        .map(|_| {
            let (stop, asked) = (Arc::clone(&stop), Arc::clone(&asked));
            let (socket, device) = (socket.to_owned(), device.to_owned());
            std::thread::spawn(move || {
                let mut client = Client::connect(Path::new(&socket)).expect("connect");
                let plan = abiss_tests::hostile::costliest_plan(&device);
                client.send(plan.clone()).expect("ask");
                asked.wait();
                while client.receive().is_ok() && !stop.load(Ordering::Relaxed) {
                    if client.send(plan.clone()).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    asked.wait();
    println!("planning");
    let mut go = String::new();
    let _ = std::io::stdin().read_line(&mut go);
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.join();
    }
    ExitCode::SUCCESS
}
