//! The hostile client's attacks on raises (`abiss-hostile-client SOCKET direct|users …`): a
//! user's many threads, each said to be about to read one of the user's streams.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, StreamId};

/// What each short-lived thread of [`direct_threads`] reads of the stream's file.
const THREAD_BYTES: u64 = 4 << 20;
/// The size of each of its reads.
const CHUNK: usize = 256 << 10;
/// Its threads at once, a wave every [`WAVE_EVERY`]: one check of abissd's (250 ms) between
/// two waves, so what a test bounds is what abissd controls, not the disk's speed.
const WAVE: u32 = 4;
const WAVE_EVERY: Duration = Duration::from_millis(500);

/// `abiss-hostile-client SOCKET MODE FILE NUMBER` for MODE `direct` ([`direct_threads`]) or
/// `users` ([`user_threads`]); any other mode is unknown (exit 2).
#[must_use]
pub fn run(mode: &str, socket: &str, file: &str, number: &str) -> ExitCode {
    if mode != "direct" && mode != "users" {
        eprintln!("unknown mode {mode}");
        return ExitCode::from(2);
    }
    let Ok(number) = number.parse::<u32>() else {
        eprintln!("the last argument of {mode} is a number");
        return ExitCode::from(2);
    };
    if mode == "direct" {
        direct_threads(socket, file, number)
    } else {
        user_threads(socket, file, number)
    }
}

/// Connects and attaches `file` at `rate` bytes a second with a 64 KiB buffer.
fn attach(socket: &str, file: &str, rate: u64) -> (Client, StreamId) {
    try_attach(Path::new(socket), Path::new(file), rate).expect("attach")
}

/// Connects and attaches `file` at `rate` bytes a second with a 64 KiB buffer (non-persistent);
/// the step that failed, and why.
///
/// # Errors
/// The connection, the open or the attach failed.
pub fn try_attach(socket: &Path, file: &Path, rate: u64) -> Result<(Client, StreamId), String> {
    let mut client = Client::connect(socket).map_err(|e| format!("connect: {e}"))?;
    let opened = std::fs::File::open(file).map_err(|e| format!("open: {e}"))?;
    let request = AttachRequest {
        persistent: false,
        ..crate::read_request(rate, 64 << 10, 1)
    };
    let stream = client
        .attach(opened, request)
        .map_err(|e| format!("attach: {e}"))?;
    Ok((client, stream.id))
}

/// This thread's id.
fn gettid() -> u32 {
    u32::try_from(nix::unistd::gettid().as_raw()).unwrap_or(0)
}

/// Whether this thread's I/O priority is real time.
fn real_time() -> bool {
    abiss_os::ioprio::get(abiss_os::ioprio::CALLING_THREAD).is_ok_and(|prio| prio >> 13 == 1)
}

/// Reads [`THREAD_BYTES`] of `file` from `offset` with `O_DIRECT`; the bytes read while this
/// thread was real time.
fn read_direct(file: &str, offset: u64) -> u64 {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .expect("open O_DIRECT");
    let mut buffer = abiss_lab::direct_io::AlignedBuffer::new(CHUNK);
    let slice = buffer.slice(CHUNK);
    let mut at_real_time = 0;
    for chunk in 0..THREAD_BYTES / CHUNK as u64 {
        let rt = real_time();
        let read = file
            .read_at(slice, offset + chunk * CHUNK as u64)
            .expect("direct read");
        if rt || real_time() {
            at_real_time += read as u64;
        }
    }
    at_real_time
}

/// `direct FILE COUNT`: attaches FILE at 1 B/s; starts COUNT threads, [`WAVE`] at a time, each
/// said to be about to read the stream (`reader_starts`), then reading [`THREAD_BYTES`] of
/// FILE (each its own part) with `O_DIRECT` and exiting. Then, after two of abissd's checks,
/// says one more thread is about to read it. Prints `rt_kib K raised R of COUNT then B`: the
/// KiB the threads read while they were real time, how many were raised, and whether the
/// last was.
#[must_use]
pub fn direct_threads(socket: &str, file: &str, count: u32) -> ExitCode {
    let (mut client, stream) = attach(socket, file, 1);
    let parts = std::fs::metadata(file).expect("stat").len() / THREAD_BYTES;
    let (mut raised, mut rt_bytes) = (0, 0);
    let mut started = 0;
    while started < count {
        let wave_start = Instant::now();
        let mut threads = Vec::new();
        for _ in 0..WAVE.min(count - started) {
            let (tid_tx, tid_rx) = mpsc::channel();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let file = file.to_owned();
            let offset = u64::from(started) % parts.max(1) * THREAD_BYTES;
            threads.push(std::thread::spawn(move || {
                let _ = tid_tx.send(gettid());
                let _ = go_rx.recv();
                read_direct(&file, offset)
            }));
            let tid = tid_rx.recv().expect("thread id");
            if client.reader_starts(stream, tid).unwrap_or(false) {
                raised += 1;
            }
            let _ = go_tx.send(());
            started += 1;
        }
        rt_bytes += threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or(0))
            .sum::<u64>();
        std::thread::sleep(WAVE_EVERY.saturating_sub(wave_start.elapsed()));
    }
    std::thread::sleep(Duration::from_millis(600));
    let (tid_tx, tid_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let last = std::thread::spawn(move || {
        let _ = tid_tx.send(gettid());
        let _ = done_rx.recv();
    });
    let tid = tid_rx.recv().expect("thread id");
    let then = client.reader_starts(stream, tid).unwrap_or(false);
    let _ = done_tx.send(());
    let _ = last.join();
    println!(
        "rt_kib {} raised {raised} of {count} then {then}",
        rt_bytes >> 10
    );
    ExitCode::SUCCESS
}

/// `users FILE STREAMS`: attaches FILE STREAMS times at 1000 B/s, and says 32 waiting threads
/// are about to read each stream; prints `raised R of N`.
#[must_use]
pub fn user_threads(socket: &str, file: &str, streams: u32) -> ExitCode {
    const PER_STREAM: u32 = 32;
    let attached: Vec<(Client, StreamId)> =
        (0..streams).map(|_| attach(socket, file, 1000)).collect();
    let count = streams * PER_STREAM;
    let (tids, waiting) = mpsc::channel();
    // The threads wait here until every raise was asked for.
    let done = std::sync::Arc::new(std::sync::Barrier::new(count as usize + 1));
    let threads: Vec<_> = (0..count)
        .map(|_| {
            let (tids, done) = (tids.clone(), std::sync::Arc::clone(&done));
            std::thread::spawn(move || {
                let _ = tids.send(gettid());
                done.wait();
            })
        })
        .collect();
    let mut raised = 0;
    for (mut client, stream) in attached {
        for _ in 0..PER_STREAM {
            let Ok(tid) = waiting.recv() else { break };
            if client.reader_starts(stream, tid).unwrap_or(false) {
                raised += 1;
            }
        }
        // Kept open: a connection's streams end with it.
        std::mem::forget(client);
    }
    println!("raised {raised} of {count}");
    done.wait();
    for thread in threads {
        let _ = thread.join();
    }
    ExitCode::SUCCESS
}
