//! Write streams (recordings), end to end on the real kernel: abissd writes a recording's dirty
//! pages back at the stream's level within its window, allocates ahead when asked and gives
//! back what it allocated, and refuses what it must. A paced recorder against a best-effort
//! writer is in `tests/recording_deadlines.rs`; the clients that record, and a reader behind a
//! recording, in `tests/recording_clients.rs`.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use abiss_client::{Client, ClientError};
use abiss_proto::{
    decode_line, encode_line, AttachRequest, ByteRate, ByteSize, DeviceNumber, Envelope, IoClass,
    Operation, Request, RequestRecord, Response, StreamId,
};
use abiss_tests::{
    abissctl_as_nobody, as_nobody, assert_fails, attached_id, chmod, require_root, Daemon,
    Ext4Mount, LoopDevice, Scratch,
};

// A test file is the root of its crate, so a module it shares is named by its path; each
// file uses part of it.
#[path = "recording/common.rs"]
#[allow(dead_code)]
mod common;

use common::*;

/// Samples `path`'s dirty bytes every 10 ms until stopped; the most seen.
struct DirtyWatch {
    stop: Arc<AtomicBool>,
    most: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DirtyWatch {
    fn start(path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let most = Arc::new(AtomicU64::new(0));
        let (stop2, most2) = (Arc::clone(&stop), Arc::clone(&most));
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                most2.fetch_max(dirty_bytes(&path), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Self {
            stop,
            most,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("dirty watch");
        }
        self.most.load(Ordering::Relaxed)
    }
}

/// Every request event abissd reports, collected in a thread until the test is done with them.
struct Events {
    records: mpsc::Receiver<RequestRecord>,
    stop: Arc<AtomicBool>,
}

impl Events {
    fn subscribe(socket: &Path) -> Self {
        let mut writer = UnixStream::connect(socket).expect("connect");
        let mut reader = BufReader::new(writer.try_clone().expect("clone"));
        writer
            .write_all(&encode_line(&Envelope::new(Request::Events)).expect("encode"))
            .expect("send");
        let mut line = Vec::new();
        reader.read_until(b'\n', &mut line).expect("subscribed");
        assert_eq!(
            decode_line::<Response>(&line).expect("decode"),
            Response::Subscribed
        );
        reader
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let (sender, records) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        std::thread::spawn(move || {
            let _keep = writer;
            while !stopping.load(Ordering::Relaxed) {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        if let Ok(Response::Event(record)) = decode_line::<Response>(&line) {
                            let _ = sender.send(record);
                        }
                    }
                    Err(_) => {}
                }
            }
        });
        Self { records, stop }
    }

    /// The events so far.
    fn drain(&self) -> Vec<RequestRecord> {
        self.records.try_iter().collect()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The journal thread (`jbd2/NAME-8`) of the ext4 file system on device `name`.
fn journal_thread(name: &str) -> u32 {
    let wanted = format!("jbd2/{name}-");
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.starts_with(&wanted))
        })
        .expect("a journal thread")
}

/// The I/O priority class of thread `tid` (1 real time, 2 best effort).
fn ioprio_class(tid: u32) -> u16 {
    abiss_os::ioprio::get(tid).expect("ioprio_get") >> 13
}

/// What `trace --by stream` shows of recording `id`: its writes (at least `written` bytes),
/// with their latency, at its level and with no inversion.
fn traces_the_writes_of(daemon: &Daemon, id: StreamId, written: u64) {
    let writes: Vec<_> = daemon
        .connect()
        .latency()
        .into_iter()
        .filter(|g| g.stream == Some(id) && g.operation == Operation::Write)
        .collect();
    let requests: u64 = writes.iter().map(|g| g.requests).sum();
    let bytes: u64 = writes.iter().map(|g| g.bytes).sum();
    assert!(
        bytes >= written && requests > 0 && writes.iter().all(|g| g.inversions == 0),
        "the stream's write latency groups: {writes:?}"
    );
    assert!(
        writes.iter().all(|g| g.priority.class == IoClass::Rt),
        "{writes:?}"
    );
}

/// The write requests among `events` of file `inode` on `device`: (bytes at RT/0 tagged with
/// `stream`, all bytes, the others). Root's events cover every disk, and another test's file
/// on its own disk may have the same inode number.
fn writes_of(
    events: &[RequestRecord],
    (device, inode): (DeviceNumber, u64),
    stream: Option<StreamId>,
) -> (u64, u64, Vec<RequestRecord>) {
    let mut at_level = 0;
    let mut all = 0;
    let mut others = Vec::new();
    for record in events
        .iter()
        .filter(|r| r.device == device && r.inode == Some(inode) && r.operation == Operation::Write)
    {
        all += u64::from(record.bytes);
        if record.priority.class == IoClass::Rt
            && record.priority.level == 0
            && record.stream == stream
        {
            at_level += u64::from(record.bytes);
        } else {
            others.push(record.clone());
        }
    }
    (at_level, all, others)
}

/// A recording at 1 MiB/s with a 1 MiB buffer: without a stream its pages stay dirty (the
/// kernel writes them back after 30 s, at best effort); with one, abissd writes them back at
/// the stream's level (RT/0 here), tagged with the stream, and the file never has more than
/// the buffer, a batch and one 64 KiB write dirty.
#[test]
fn a_recording_is_written_back_at_its_level_within_its_window() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let events = Events::subscribe(daemon.socket());

    // Without a stream: the control, which the assertions below must fail.
    let plain = fs.path().join("plain.ts");
    let watch = DirtyWatch::start(plain.clone());
    record(&plain, 1000, 4);
    let plain_dirty = watch.stop();
    let plain_inode = std::fs::metadata(&plain).expect("stat").ino();
    let (plain_rt, _, _) = writes_of(&events.drain(), (fs.device().number(), plain_inode), None);
    eprintln!(
        "without a stream: {} KiB dirty at most, {plain_rt} bytes written back at RT/0",
        plain_dirty / 1024
    );
    assert!(plain_dirty > BUFFER + BATCH + WRITE && plain_rt == 0);

    let file = fs.path().join("recording.ts");
    let id = attach_for_writing(&daemon, &file);
    let status: serde_json::Value =
        serde_json::from_slice(&daemon.ctl(["status", "--json"]).stdout).expect("status");
    let disk = &status["devices"][0];
    assert_eq!(disk["reserved_write"], RATE, "status: {disk}");
    assert_eq!(disk["reserved"], RATE, "status: {disk}");
    let inode = std::fs::metadata(&file).expect("stat").ino();
    let watch = DirtyWatch::start(file.clone());
    let summary = record(&file, 1000, 8);
    // The last partial request goes once the writer has been idle for a second.
    std::thread::sleep(Duration::from_secs(2));
    let most_dirty = watch.stop();
    let written = std::fs::metadata(&file).expect("stat").len();
    let stream = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .expect("stream listed");
    let recording = stream.recording.expect("a write stream");
    let (at_level, all, others) =
        writes_of(&events.drain(), (fs.device().number(), inode), Some(id));
    eprintln!(
        "with a stream: recorder {summary}; {} KiB dirty at most; {at_level} of {all} bytes of the file's writes at RT/0; list: {recording:?}",
        most_dirty / 1024
    );
    assert_eq!(recording.written_end, written);
    assert_eq!(
        recording.written_back_end, written,
        "everything written is written back"
    );
    assert!(
        others.is_empty(),
        "every write of the file at the stream's level, tagged with it: {others:?}"
    );
    assert!(
        at_level >= written,
        "the file's {written} bytes went to the disk at RT/0 ({at_level})"
    );
    // The window: a writer at its rate has at most a buffer dirty beyond the written-back end
    // plus the batch the window moves in; cachestat also sees the recorder's write in progress.
    assert!(
        most_dirty <= BUFFER + BATCH + WRITE,
        "{most_dirty} bytes dirty with a {BUFFER}-byte buffer"
    );
    assert_eq!(
        recording.preallocated_bytes, 0,
        "allocation ahead is asked for"
    );
    let list = String::from_utf8_lossy(&daemon.ctl(["list"]).stdout).into_owned();
    assert!(
        list.contains("recording: written 8MiB, written back 8MiB"),
        "{list}"
    );
    traces_the_writes_of(&daemon, id, written);
    // The file system's journal thread carries the recording's level while it lasts.
    let journal = journal_thread(&fs.device().name());
    assert_eq!(
        ioprio_class(journal),
        1,
        "jbd2 at real time while recording"
    );
    assert!(daemon.ctl(["detach", &id.to_string()]).status.success());
    assert!(
        abiss_tests::wait_until(Duration::from_secs(2), || ioprio_class(journal) == 2),
        "jbd2 put back to best effort when the recording ended"
    );
}

/// With `--preallocate`, the file is allocated a few seconds of the rate ahead of the writer
/// (without changing its size), in whole mebibytes.
#[test]
fn a_recording_asked_to_is_allocated_ahead_of_its_writer() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let file = fs.path().join("allocated.ts");
    let output = daemon.ctl([
        "attach".as_ref(),
        file.as_os_str(),
        "--write".as_ref(),
        "--preallocate".as_ref(),
        "--rate".as_ref(),
        "1MiB/s".as_ref(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut writer = File::options().append(true).open(&file).expect("open");
    // 4 MiB are allocated at once; more once half of that is written into.
    writer.write_all(&vec![1u8; 3 << 20]).expect("write");
    let allocated = || std::fs::metadata(&file).expect("stat").blocks() * 512;
    assert!(
        abiss_tests::wait_until(Duration::from_secs(2), || allocated() >= 7 * MIB),
        "allocated {} bytes for 3 MiB written at 1 MiB/s (4 s ahead)",
        allocated()
    );
    assert_eq!(
        std::fs::metadata(&file).expect("stat").len(),
        3 * MIB,
        "the size is the writer's"
    );
    let recording = daemon.streams()[0].recording.clone().expect("a recording");
    assert!(recording.preallocated_end >= 7 * MIB, "{recording:?}");
}

/// Blocks allocated ahead of a recording's writer are given back when its stream ends (issue
/// 33): nobody records with `--preallocate`, writes 3 MiB, closes the file and detaches; the
/// file keeps its size and every byte written, and no block past its end. Before, the 4 MiB
/// or more allocated ahead stayed the owner's for as long as the file did.
#[test]
fn blocks_allocated_ahead_are_given_back_when_the_recording_ends() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    chmod(fs.path(), 0o777);
    let file = fs.path().join("nobody.ts");
    let path = file.to_string_lossy().into_owned();
    let as_nobody_sh = |script: &str| {
        let status = as_nobody(Path::new("/bin/sh"))
            .args(["-c", script])
            .status()
            .expect("run sh as nobody");
        assert!(status.success(), "{script}");
    };
    as_nobody_sh(&format!("touch '{path}'"));
    let socket = daemon.socket().to_string_lossy().into_owned();
    let id = attached_id(&abissctl_as_nobody(
        &socket,
        &[
            "attach",
            &path,
            "--write",
            "--preallocate",
            "--rate",
            "1MiB/s",
        ],
    ));
    as_nobody_sh(&format!(
        "head -c {} /dev/zero | tr '\\0' a >> '{path}'",
        3 * MIB
    ));
    let allocated = || std::fs::metadata(&file).expect("stat").blocks() * 512;
    assert!(
        abiss_tests::wait_until(Duration::from_secs(2), || allocated() >= 7 * MIB),
        "allocated {} bytes ahead of 3 MiB written",
        allocated()
    );
    let detach = abissctl_as_nobody(&socket, &["detach", &id.to_string()]);
    assert!(detach.status.success(), "{}", abiss_tests::stderr(&detach));
    let given_back = abiss_tests::wait_until(Duration::from_secs(10), || {
        allocated() <= 3 * MIB + 64 * 1024
    });
    let data = std::fs::read(&file).expect("read");
    assert!(given_back, "{} bytes still allocated", allocated());
    assert_eq!(data.len() as u64, 3 * MIB, "the size is the writer's");
    assert!(data.iter().all(|&b| b == b'a'), "every byte written stays");
}

/// One user's recordings together hold at most 64 MiB allocated ahead of their writers
/// (issue 33): nobody records two files with `--preallocate`, each of which would allocate
/// 64 MiB ahead (a 192 MiB buffer: write-backs of 64 MiB), and writes nothing; together they
/// hold no more than 64 MiB, and after the detaches neither holds a block. Before, each
/// stream was bounded alone: 128 MiB.
#[test]
fn one_users_recordings_together_allocate_ahead_no_more_than_their_users_bound() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 512));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    chmod(fs.path(), 0o777);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let files: Vec<PathBuf> = ["first.ts", "second.ts"]
        .iter()
        .map(|name| fs.path().join(name))
        .collect();
    let mut ids = Vec::new();
    for file in &files {
        let path = file.to_string_lossy().into_owned();
        let touched = as_nobody(Path::new("/bin/touch"))
            .arg(&path)
            .status()
            .expect("touch as nobody");
        assert!(touched.success());
        let attach = [
            "attach",
            &path,
            "--write",
            "--preallocate",
            "--rate",
            "1MiB/s",
            "--buffer",
            "192MiB",
        ];
        ids.push(attached_id(&abissctl_as_nobody(&socket, &attach)));
    }
    let allocated = |file: &PathBuf| std::fs::metadata(file).expect("stat").blocks() * 512;
    let total = || files.iter().map(allocated).sum::<u64>();
    // Each stream allocates at its attach; let both settle.
    std::thread::sleep(Duration::from_millis(1500));
    let held: Vec<u64> = files.iter().map(allocated).collect();
    println!("allocated ahead: {held:?} bytes");
    assert!(
        held[0] >= 32 * MIB,
        "the first recording allocated ahead (the premise): {held:?}"
    );
    assert!(
        total() <= 64 * MIB + MIB,
        "nobody's two recordings hold {held:?} bytes allocated ahead, more than 64 MiB"
    );
    for id in ids {
        let detach = abissctl_as_nobody(&socket, &["detach", &id.to_string()]);
        assert!(detach.status.success(), "{}", abiss_tests::stderr(&detach));
    }
    let given_back = abiss_tests::wait_until(Duration::from_secs(10), || total() <= 64 * 1024);
    assert!(given_back, "{} bytes still allocated", total());
}

/// A write stream needs a descriptor open for writing; it is refused on a disk abissd does not
/// manage; and nobody cannot record into (or take over) root's recording.
#[test]
fn write_streams_are_refused_without_the_right_to_write() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let file = fs.path().join("root.ts");
    std::fs::write(&file, b"").expect("create");
    chmod(fs.path(), 0o755);
    chmod(&file, 0o644);
    let request = AttachRequest {
        write: true,
        ..AttachRequest::read(ByteRate(RATE), ByteSize(BUFFER), 20, 0)
    };
    // A read-only descriptor proves no right to write.
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let read_only = File::open(&file).expect("open");
    match client.attach(&read_only, request.clone()) {
        Err(ClientError::BadRequest { message }) => {
            assert!(message.contains("read-only"), "{message}");
        }
        other => panic!("a read-only descriptor for a recording: {other:?}"),
    }
    // A file on a disk abissd does not manage.
    let elsewhere = Scratch::new_in("/tmp", "rec-unmanaged");
    let unmanaged = elsewhere.path().join("rec.ts");
    assert_fails(
        &daemon.ctl([
            "attach".as_ref(),
            unmanaged.as_os_str(),
            "--write".as_ref(),
            "--rate".as_ref(),
            "1MB/s".as_ref(),
        ]),
        5,
        "does not manage",
    );
    // Root records; nobody may neither open the file to record into it, nor detach or slow
    // root's stream.
    let id = attach_for_writing(&daemon, &file);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let path = file.to_string_lossy().into_owned();
    assert_fails(
        &abissctl_as_nobody(&socket, &["attach", &path, "--write", "--rate", "1MB/s"]),
        11,
        "for writing",
    );
    // Root's stream is not nobody's to know of: answered as a missing one.
    assert_fails(
        &abissctl_as_nobody(&socket, &["detach", &id.to_string()]),
        10,
        "is not attached",
    );
    assert_fails(
        &abissctl_as_nobody(&socket, &["set-rate", &id.to_string(), "1B/s"]),
        10,
        "is not attached",
    );
    // A read stream still needs a readable descriptor.
    let write_only = File::options().write(true).open(&file).expect("open");
    let read_request = AttachRequest {
        write: false,
        preallocate: false,
        direct: false,
        preroll: None,
        ..request
    };
    match client.attach(&write_only, read_request) {
        Err(ClientError::BadRequest { message }) => assert!(message.contains("write-only")),
        other => panic!("a write-only descriptor for a read stream: {other:?}"),
    }
}
