//! Write streams (recordings), end to end on the real kernel: abissd writes a recording's dirty
//! pages back at the stream's level within its window, refuses what it must, and a paced
//! recorder on the lab's emulated hdd meets its deadlines against a best-effort writer under a
//! small machine's dirty limits.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use abiss_bench::recording::recorder::Tracer;
use abiss_client::{AbissFile, Client, ClientError, StreamOptions};
use abiss_proto::{
    decode_line, encode_line, AttachRequest, ByteRate, ByteSize, Envelope, IoClass, Operation,
    Request, RequestRecord, Response,
};
use abiss_tests::{
    abiss_c_library, abissctl_as_nobody, as_nobody, assert_fails, attached_id, binary, chmod,
    compile_c_example, evict, paced_read, require_root, resident_bytes,
    run_at_realtime_cpu_priority, Daemon, Ext4Mount, HddLab, LoopDevice, PacedReport, Scratch,
};

const MIB: u64 = 1 << 20;
const RATE: u64 = MIB;
const BUFFER: u64 = MIB;
const BATCH: u64 = 20 * 4096;
const WRITE: u64 = 64 * 1024;

/// Dirty and under-writeback bytes of `path` in the page cache (`cachestat`, Linux 6.5).
fn dirty_bytes(path: &Path) -> u64 {
    #[repr(C)]
    struct Range {
        offset: u64,
        length: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    let Ok(file) = File::open(path) else {
        return 0;
    };
    let range = Range {
        offset: 0,
        length: 0,
    };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, live locals of the kernel's layout.
    let rc = unsafe { libc::syscall(451, file.as_raw_fd(), &raw const range, &raw mut stat, 0u32) };
    assert_eq!(rc, 0, "cachestat: {}", std::io::Error::last_os_error());
    let _ = (stat.cache, stat.evicted, stat.recently_evicted);
    (stat.dirty + stat.writeback) * 4096
}

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

/// Runs the paced recorder on `file` for `seconds` with a capture buffer of `capture_ms`
/// (under `SCHED_FIFO` with `ABISS_RECORDER_FIFO=1`, for a comparison: the kernel lets
/// real-time tasks dirty a quarter more than others).
fn record(file: &Path, capture_ms: u64, seconds: u64) -> serde_json::Value {
    run_recorder(&[], file, (capture_ms, seconds), &[])
}

/// [`record`], started by the command line `prefix` (a tracer's cgroup), with each write's time
/// and wait for a CPU in the summary (`per-write`).
fn record_per_write(
    prefix: &[String],
    file: &Path,
    capture_ms: u64,
    seconds: u64,
) -> serde_json::Value {
    run_recorder(prefix, file, (capture_ms, seconds), &["per-write"])
}

fn run_recorder(
    prefix: &[String],
    file: &Path,
    (capture_ms, seconds): (u64, u64),
    options: &[&str],
) -> serde_json::Value {
    let mut command = if let Some((first, rest)) = prefix.split_first() {
        let mut command = Command::new(first);
        command.args(rest).arg(binary("abiss-test-recorder"));
        command
    } else if std::env::var_os("ABISS_RECORDER_FIFO").is_some() {
        let mut chrt = Command::new("chrt");
        chrt.args(["-f", "30"]).arg(binary("abiss-test-recorder"));
        chrt
    } else {
        Command::new(binary("abiss-test-recorder"))
    };
    let output = command
        .arg(file)
        .args([
            RATE.to_string(),
            WRITE.to_string(),
            capture_ms.to_string(),
            seconds.to_string(),
        ])
        .args(options)
        .output()
        .expect("run the recorder");
    assert!(
        output.status.success(),
        "recorder: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("recorder summary")
}

fn attach_for_writing(daemon: &Daemon, file: &Path) -> u64 {
    let output = daemon.ctl([
        "attach".as_ref(),
        file.as_os_str(),
        "--write".as_ref(),
        "--rate".as_ref(),
        "1MiB/s".as_ref(),
        "--buffer".as_ref(),
        "1MiB".as_ref(),
    ]);
    attached_id(&output)
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
fn traces_the_writes_of(daemon: &Daemon, id: u64, written: u64) {
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

/// The file's write requests among `events`: (bytes at RT/0 tagged with `stream`, all bytes,
/// the others).
fn writes_of(
    events: &[RequestRecord],
    inode: u64,
    stream: Option<u64>,
) -> (u64, u64, Vec<RequestRecord>) {
    let mut at_level = 0;
    let mut all = 0;
    let mut others = Vec::new();
    for record in events
        .iter()
        .filter(|r| r.inode == Some(inode) && r.operation == Operation::Write)
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
    let (plain_rt, _, _) = writes_of(&events.drain(), plain_inode, None);
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
    let (at_level, all, others) = writes_of(&events.drain(), inode, Some(id));
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
        rate: ByteRate(RATE),
        buffer: ByteSize(BUFFER),
        batch_pages: 20,
        priority: 0,
        persistent: false,
        write: true,
        preallocate: false,
        preroll: None,
        buffer_auto: false,
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
        preroll: None,
        ..request
    };
    match client.attach(&write_only, read_request) {
        Err(ClientError::BadRequest { message }) => assert!(message.contains("write-only")),
        other => panic!("a write-only descriptor for a read stream: {other:?}"),
    }
}

/// `vm.dirty_bytes` and `vm.dirty_background_bytes` of a small machine, put back on drop (also
/// when the test panics).
struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

impl DirtyLimits {
    fn small_box() -> Self {
        let keys = [
            "dirty_ratio",
            "dirty_bytes",
            "dirty_background_ratio",
            "dirty_background_bytes",
        ];
        let saved = keys
            .iter()
            .map(|key| {
                let value = std::fs::read_to_string(format!("/proc/sys/vm/{key}")).expect("read");
                (*key, value.trim().to_owned())
            })
            .collect();
        let limits = Self { saved };
        set_vm("dirty_bytes", &(64 * MIB).to_string());
        set_vm("dirty_background_bytes", &(16 * MIB).to_string());
        limits
    }
}

fn set_vm(key: &str, value: &str) {
    std::fs::write(format!("/proc/sys/vm/{key}"), value)
        .unwrap_or_else(|error| panic!("vm.{key} = {value}: {error}"));
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        // Writing a ratio clears its bytes twin and back: write the one that was in force.
        for (ratio, bytes) in [
            ("dirty_ratio", "dirty_bytes"),
            ("dirty_background_ratio", "dirty_background_bytes"),
        ] {
            let value = |key: &str| {
                self.saved
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            if value(bytes) == "0" {
                let _ = std::fs::write(format!("/proc/sys/vm/{ratio}"), value(ratio));
            } else {
                let _ = std::fs::write(format!("/proc/sys/vm/{bytes}"), value(bytes));
            }
        }
    }
}

/// A best-effort sequential writer of 1 MiB blocks, going round a 512 MiB file; stopped on
/// drop. Returns the bytes written.
struct BestEffortWriter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl BestEffortWriter {
    fn start(path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut file = File::create(&path).expect("create the writer's file");
            let block = vec![0x3c_u8; 1 << 20];
            let mut written = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                if written.is_multiple_of(512 * MIB) {
                    file.seek(SeekFrom::Start(0)).expect("rewind");
                }
                file.write_all(&block).expect("best-effort write");
                written += MIB;
            }
            written
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |thread| thread.join().expect("writer"))
    }
}

impl Drop for BestEffortWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

fn recorder_seconds() -> u64 {
    std::env::var("ABISS_RECORDING_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// One run of the recorder against the best-effort writer on the lab hdd; with a `tracer`, the
/// recorder runs in its cgroup and its trace says what its slow writes waited for.
fn recorder_against_writer(
    lab: &HddLab,
    daemon: &Daemon,
    name: &str,
    stream: bool,
    tracer: Option<&mut Tracer>,
) -> (serde_json::Value, u64, Option<SlowWrites>) {
    let file = lab.mount().join(name);
    let id = stream.then(|| attach_for_writing(daemon, &file));
    let mut writer = BestEffortWriter::start(lab.mount().join(format!("{name}.be")));
    // Let the writer reach the dirty limit first (and perf start tracing).
    std::thread::sleep(Duration::from_secs(3));
    let (summary, slow) = match tracer {
        Some(tracer) => {
            tracer.mark().expect("the trace marker");
            let summary = record_per_write(&tracer.enter(), &file, 1000, recorder_seconds());
            let (trace, throttle, stop_ms) = tracer
                .finish(abiss_os::clock::monotonic_ns(), None)
                .expect("perf trace of the recorder");
            let recording = abiss_bench::recording::writes::recording_writes(&trace, stop_ms);
            let slow = SlowWrites::of(&recording, &throttle, &summary);
            (summary, Some(slow))
        }
        None => (record(&file, 1000, recorder_seconds()), None),
    };
    let written = writer.stop();
    if let Some(id) = id {
        let _ = daemon.ctl(["detach", &id.to_string()]);
    }
    let _ = std::fs::remove_file(lab.mount().join(format!("{name}.be")));
    (summary, written, slow)
}

/// The write-time goal: a recorder's write(2) returns within this, ms.
const WRITE_GOAL_MS: f64 = 5.0;

/// What a recorder's writes over [`WRITE_GOAL_MS`] waited for. A write that slept in the
/// kernel's dirty-page throttle was paced by the machine's dirty pages, which every writer of
/// the disk shares (docs/user-guide.md, "Recordings"); one whose time less its wait for a CPU is within
/// the goal waited for the machine's CPUs. Neither is the disk, nor the recording's own pages:
/// what is left is, and that is what a write stream must keep off a recorder.
#[derive(Debug, Default)]
struct SlowWrites {
    /// Writes over the goal.
    slow: usize,
    /// Of those, writes that slept in `balance_dirty_pages`.
    throttled: usize,
    /// Of the rest, writes within the goal without their wait for a CPU.
    cpu_bound: usize,
    /// The rest: (ms, of which waiting for a CPU).
    unexplained: Vec<(f64, f64)>,
    /// Time the recorder waited for a CPU inside its writes, ms: the most, and the sum.
    cpu_wait_max_ms: f64,
    cpu_wait_ms: f64,
}

impl SlowWrites {
    /// Sorts the recorder's writes by its `summary` (each write's time and its wait for a CPU,
    /// on the recorder's clock) with the throttle's `events` during the traced `writes` (the
    /// same writes in the same order, on perf's clock). The times are the recorder's
    /// (`CLOCK_MONOTONIC`): in one run perf timed a write at 6.4 ms while bpftrace, on the
    /// same global clock as the recorder, saw no write between 3.8 and 15 ms. Why perf's time
    /// differed was not established.
    fn of(
        writes: &[abiss_bench::recording::writes::TracedWrite],
        events: &[abiss_bench::recording::throttle::ThrottleEvent],
        summary: &serde_json::Value,
    ) -> Self {
        let per_write_ms = |key: &str| -> Vec<f64> {
            summary[key]
                .as_array()
                .unwrap_or_else(|| panic!("the recorder's {key}"))
                .iter()
                .map(|us| us.as_f64().unwrap_or(0.0) / 1000.0)
                .collect()
        };
        let (times_ms, cpu_waits_ms) = (per_write_ms("write_us"), per_write_ms("cpu_wait_us"));
        assert_eq!(
            writes.len(),
            times_ms.len(),
            "perf traced as many recording writes as the recorder made"
        );
        let mut figures = Self {
            cpu_wait_max_ms: cpu_waits_ms.iter().copied().fold(0.0, f64::max),
            cpu_wait_ms: cpu_waits_ms.iter().sum(),
            ..Self::default()
        };
        for ((write, &ms), &cpu_ms) in writes.iter().zip(&times_ms).zip(&cpu_waits_ms) {
            if ms <= WRITE_GOAL_MS {
                continue;
            }
            figures.slow += 1;
            let throttled = events.iter().any(|e| {
                e.pause_ms > 0.0
                    && e.tid == write.tid
                    && (write.start_ms..=write.returned_ms()).contains(&e.at_ms)
            });
            if throttled {
                figures.throttled += 1;
            } else if ms - cpu_ms <= WRITE_GOAL_MS {
                figures.cpu_bound += 1;
            } else {
                figures.unexplained.push((ms, cpu_ms));
            }
        }
        figures
    }
}

/// One run of [`recorder_against_writer`] on a lab and file system of its own, with abissd
/// managing the disk, and the comparisons asked for by environment variables.
fn recorder_on_a_fresh_lab(name: &str, stream: bool) -> (serde_json::Value, u64) {
    let lab = HddLab::up("recording", 2, "none");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    if std::env::var_os("ABISS_LAZYTIME").is_some() {
        // For a comparison: timestamps kept in memory, so a write(2) needs no journal handle.
        let status = Command::new("mount")
            .args(["-o", "remount,lazytime"])
            .arg(lab.mount())
            .status()
            .expect("mount");
        assert!(status.success(), "remount lazytime");
    }
    // For a comparison: a per-disk dirty limit (`ABISS_BDI_MAX_BYTES`, with strict_limit).
    let _bdi = std::env::var("ABISS_BDI_MAX_BYTES")
        .ok()
        .map(|bytes| BdiLimit::set(lab.device(), &bytes));
    let (summary, written, _) = recorder_against_writer(&lab, &daemon, name, stream, None);
    (summary, written)
}

/// The measurement: a 1 MiB/s recorder (64 KiB every 62.5 ms, a 1 s capture buffer)
/// on the lab hdd against a best-effort sequential writer of 1 MiB blocks, with a small box's
/// dirty limits (64 MiB, background 16 MiB). Without abiss it overflowed (14 of 481 in the
/// issue); with a write stream it must not.
///
/// Each run has a new lab and file system. On one file system, whichever run came second had
/// the longest write (1.15 to 1.18 s, over the 1 s buffer, in 5 of 6 runs with or without
/// abiss, also after a `syncfs` between them), while the first stayed under 1 s: the runs
/// were not measured from the same start.
///
/// The recorder's long writes sleep in the kernel's dirty-page throttle
/// (`balance_dirty_pages`), which paces every writer of the disk by the best-effort writer's
/// backlog whether or not it has a stream, and wait for ext4's journal (`wait_transaction_locked`
/// and `do_get_write_access` from the mtime update of each write, `ext4_da_get_block_prep`),
/// although the journal thread is raised with the recording (docs/user-guide.md, "Recordings").
/// `ABISS_RECORDING_SECS` shortens it, `ABISS_RECORDER_FIFO=1` runs the recorder
/// under `SCHED_FIFO`, `ABISS_BDI_MAX_BYTES` sets a strict per-disk dirty limit,
/// `ABISS_LAZYTIME=1` remounts the lab's file system `lazytime`.
#[test]
#[ignore = "0 overflows not reliable: in 3 runs on fresh labs (2026-12-01) with abiss 0, 2 and 10 \
            overflows of 480 (write p99 61, 742 and 784 ms), without 0, 0 and 1 (p99 715, 737 and \
            426 ms); the long writes sleep in the kernel's dirty-page throttle, paced by the \
            best-effort writer's backlog, and wait for ext4's journal (issue 10)"]
fn a_recorder_meets_its_deadlines_against_a_best_effort_writer() {
    require_root!();
    let _limits = DirtyLimits::small_box();
    let (without, be_without) = recorder_on_a_fresh_lab("plain.ts", false);
    eprintln!(
        "without abiss: {without}; best-effort writer wrote {} MiB",
        be_without / MIB
    );
    let (with, be_with) = recorder_on_a_fresh_lab("stream.ts", true);
    eprintln!(
        "with abiss: {with}; best-effort writer wrote {} MiB",
        be_with / MIB
    );
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
}

/// The same recorder on xfs: no overflow with a 1 s capture buffer, with a write stream,
/// against the best-effort writer under a small box's dirty limits. On ext4 the recorder's
/// slow writes wait for the inode's allocation lock and the journal (the test above); on xfs
/// they did not.
///
/// The goal is write p99.9 under 5 ms, and on this kernel build (6.18.44-fc-v1147,
/// 2026-12-03) 6 of 11 runs missed it: 156, 10.9, 7.4, 7.0, 5.8 and 5.2 ms. In six runs traced
/// for it, off-CPU stacks of the recorder inside write(2) (bpftrace on `sched_switch`) showed
/// the slow writes (the 156 ms one was not traced; a 7.0 ms one spent no time off the CPU
/// inside write(2), so it was slow around the call, in the recorder) either asleep in
/// `balance_dirty_pages`, the kernel's dirty-page throttle that paces every writer of the disk
/// by the machine's dirty pages (10.7 ms), or runnable and waiting for one of the 2 CPUs at
/// `cond_resched` in `iomap_file_buffered_write` (2 to 7 ms). Neither is the disk or the
/// recording's pages, which the write stream controls. So the test prints the p99.9 and what
/// each write over 5 ms waited for (perf traces the throttle, the recorder counts its own wait
/// for a CPU); the next test asserts that those two explain every one. Before, with a
/// write-back that waited for nothing (`sync_file_range(WRITE)` alone), one of two runs had a
/// 484 ms write (`bench/results/recording-write-ahead/`).
#[test]
fn a_recorder_on_xfs_meets_its_deadlines_against_a_best_effort_writer() {
    require_root!();
    let (with, be_with, _) = xfs_recorder_against_writer();
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
    assert!(
        be_with > 64 * MIB,
        "the best-effort writer kept writing: {be_with}"
    );
}

/// The goal's other half, every write over 5 ms explained by the throttle or a CPU, on its
/// own while one write in the suite was not (see the reason).
#[test]
#[ignore = "1 of 6 runs on 2026-12-03 had a 9.4 ms write that neither slept in the throttle nor \
            waited for a CPU (0.7 ms of it); what it waited for is not found yet (issue 10)"]
fn a_recorders_slow_writes_on_xfs_wait_only_for_the_throttle_or_a_cpu() {
    require_root!();
    let (with, _, slow) = xfs_recorder_against_writer();
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
    assert!(
        slow.unexplained.is_empty(),
        "{} writes over {WRITE_GOAL_MS} ms waited neither for the throttle nor for a CPU: {:?}",
        slow.unexplained.len(),
        slow.unexplained
    );
}

/// The recorder with a write stream on a fresh xfs lab against the best-effort writer, under a
/// small box's dirty limits, traced: its summary, what the writer wrote, and what its slow
/// writes waited for (printed).
fn xfs_recorder_against_writer() -> (serde_json::Value, u64, SlowWrites) {
    let _limits = DirtyLimits::small_box();
    let lab = HddLab::up_xfs("recording-xfs", 2, "none");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    let scratch = Scratch::new_in("/tmp", "recording-xfs-trace");
    let mut tracer = Tracer::start(
        &format!("abiss-test-recorder-{}", std::process::id()),
        scratch.path(),
    )
    .expect("perf trace (linux-perf; `cargo xtask setup` installs it)");
    let (with, be_with, slow) =
        recorder_against_writer(&lab, &daemon, "stream.ts", true, Some(&mut tracer));
    let slow = slow.expect("traced");
    let mut shown = with.clone();
    // The per-write figures are in `slow`, summed up.
    if let Some(summary) = shown.as_object_mut() {
        summary.remove("write_us");
        summary.remove("cpu_wait_us");
    }
    eprintln!(
        "with abiss on xfs: {shown}; best-effort writer wrote {} MiB",
        be_with / MIB
    );
    eprintln!(
        "write p99.9 {} ms; {} writes over {WRITE_GOAL_MS} ms: {} slept in the dirty-page \
         throttle, {} within it without their wait for a CPU, {} waited for something else \
         {:?} (ms, of which CPU); CPU wait in writes {:.1} ms in all, {:.1} ms at most",
        with["write_p999_ms"],
        slow.slow,
        slow.throttled,
        slow.cpu_bound,
        slow.unexplained.len(),
        slow.unexplained,
        slow.cpu_wait_ms,
        slow.cpu_wait_max_ms,
    );
    (with, be_with, slow)
}

/// A per-disk dirty limit (`max_bytes`, `strict_limit` of the disk's bdi), put back on drop.
struct BdiLimit {
    dir: PathBuf,
    saved: Vec<(&'static str, String)>,
}

impl BdiLimit {
    fn set(device: &Path, max_bytes: &str) -> Self {
        let rdev = std::fs::metadata(device).expect("stat device").rdev();
        let dir = PathBuf::from(format!(
            "/sys/class/bdi/{}:{}",
            libc::major(rdev),
            libc::minor(rdev)
        ));
        let saved = ["max_bytes", "strict_limit"]
            .into_iter()
            .map(|key| {
                let value = std::fs::read_to_string(dir.join(key)).expect("read bdi setting");
                (key, value.trim().to_owned())
            })
            .collect();
        std::fs::write(dir.join("strict_limit"), "1").expect("strict_limit");
        std::fs::write(dir.join("max_bytes"), max_bytes).expect("max_bytes");
        Self { dir, saved }
    }
}

impl Drop for BdiLimit {
    fn drop(&mut self) {
        for (key, value) in &self.saved {
            let _ = std::fs::write(self.dir.join(key), value);
        }
    }
}

/// The Rust client records: `AbissFile::record` opens the file for writing as a write stream,
/// its writes are written back by the daemon, and dropping it ends the stream.
#[test]
fn the_rust_client_records_through_a_write_stream() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = fs.path().join("client.ts");
    let options = abiss_client::StreamOptions::new(ByteRate(RATE), ByteSize(BUFFER));
    let client = Client::connect(daemon.socket()).expect("connect");
    let mut file =
        abiss_client::AbissFile::record_with(client, &path, &options, false).expect("record");
    file.write_all(&vec![7u8; 1 << 20]).expect("write");
    let id = file.stream_id();
    let written_back = || {
        daemon
            .streams()
            .into_iter()
            .find(|s| s.id == id)
            .and_then(|s| s.recording)
            .map_or(0, |r| r.written_back_end)
    };
    assert!(
        abiss_tests::wait_until(Duration::from_secs(3), || written_back() == MIB),
        "written back: {}",
        written_back()
    );
    drop(file);
    assert!(
        abiss_tests::wait_until(Duration::from_secs(2), || daemon.streams().is_empty()),
        "the stream ends with the file"
    );
}

/// `abiss-c/examples/record.c`, compiled here against the freshly built library, records a
/// file through `abiss_fopen(path, "w", …)` and `abiss_fwrite`: while it runs its stream is a
/// recording whose writes abissd writes back, and it ends with the program.
#[test]
fn the_c_example_records() {
    require_root!();
    let library = abiss_c_library();
    let scratch = Scratch::new_in("/tmp", "c-record");
    let program = compile_c_example("record", &library, scratch.path());
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let file = fs.path().join("c.ts");
    let child = Command::new(&program)
        .arg(&file)
        .args([RATE.to_string(), (3 * MIB).to_string(), BUFFER.to_string()])
        .env("ABISS_SOCKET", daemon.socket())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run record");
    let written_back = || {
        daemon
            .streams()
            .first()
            .and_then(|s| s.recording.clone())
            .map_or(0, |r| r.written_back_end)
    };
    assert!(
        abiss_tests::wait_until(Duration::from_secs(3), || written_back() > 0),
        "abissd writes the recording back while it runs"
    );
    let output = child.wait_with_output().expect("record");
    let line = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{line}");
    assert!(output.status.success(), "record: {line}");
    assert!(line.contains(&format!("bytes={}", 3 * MIB)), "{line}");
    assert_eq!(std::fs::metadata(&file).expect("stat").len(), 3 * MIB);
    assert!(
        abiss_tests::wait_until(Duration::from_secs(2), || daemon.streams().is_empty()),
        "the stream ends with abiss_fclose"
    );
}

/// Opens a read stream on `path` (being recorded) with the library, as a timeshift player
/// would, and reads it on the ABISS schedule for `seconds`: the report, and the stream's file
/// size as abissd knew it at attach and at the end.
fn watch_recording(daemon: &Daemon, path: &Path, seconds: u64) -> (PacedReport, u64, u64) {
    let client = Client::connect(daemon.socket()).expect("connect");
    let options = StreamOptions::new(ByteRate(RATE), ByteSize(BUFFER));
    let mut file = AbissFile::open_with(client, path, &options).expect("attach the reader");
    let id = file.stream_id();
    let size = || {
        daemon
            .streams()
            .into_iter()
            .find(|s| s.id == id)
            .map_or(0, |s| s.file_bytes)
    };
    let at_attach = size();
    let watched = File::open(path).expect("open");
    let report = paced_read(
        &mut file,
        Some(&watched),
        RATE,
        BUFFER,
        usize::try_from(WRITE).expect("a read in memory"),
        Duration::from_secs(seconds),
    );
    (report, at_attach, size())
}

/// Timeshift: a recording on the lab hdd (a write stream, 1 MiB/s) is watched while it is
/// recorded, by read streams on the same file. A reader 3 s behind reads past the file's size
/// at its attach (the window follows the file as it grows); a reader 30 s behind, whose data
/// the write-behind dropped from memory long ago, reads against a best-effort writer. Both
/// meet every deadline with every page resident before it is read.
#[test]
fn a_recording_is_watched_while_it_is_recorded() {
    const BEHIND: u64 = 30;
    const WATCH: u64 = 8;
    require_root!();
    let lab = HddLab::up("timeshift", 2, "none");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    let path = lab.mount().join("live.ts");
    let recording = attach_for_writing(&daemon, &path);
    let recorder = {
        let path = path.clone();
        std::thread::spawn(move || record(&path, 1000, BEHIND + WATCH + 2))
    };
    let started = Instant::now();
    run_at_realtime_cpu_priority();

    std::thread::sleep(Duration::from_secs(3));
    let (near, near_attach, near_end) = watch_recording(&daemon, &path, WATCH);
    eprintln!(
        "3 s behind: {} misses, {} reads not resident, {} reads of {} bytes, file {near_attach} → {near_end} bytes",
        near.misses,
        near.not_resident.len(),
        near.latencies_ns.len(),
        near.bytes
    );
    assert!(
        near.bytes > near_attach + MIB,
        "the reader went past the file's size at attach ({near_attach}): {}",
        near.bytes
    );
    assert!(near_end > near_attach, "the stream saw the file grow");
    assert_eq!(near.misses, 0, "3 s behind: {:?}", near.slow);
    assert!(near.not_resident.is_empty(), "{:?}", near.not_resident);

    std::thread::sleep(Duration::from_secs(BEHIND).saturating_sub(started.elapsed()));
    // What the first reader left in the page cache goes, as it would have on a busy machine
    // by now: the second reader finds its part of the recording on the disk only.
    let file = File::open(&path).expect("open");
    evict(&file);
    let cached = resident_bytes(&file, 0, 8 * MIB);
    assert!(
        cached < MIB,
        "the recording's head is cold ({cached} bytes cached)"
    );
    let mut writer = BestEffortWriter::start(lab.mount().join("be.bin"));
    let (far, _, _) = watch_recording(&daemon, &path, WATCH);
    let written = writer.stop();
    eprintln!(
        "{BEHIND} s behind, against a best-effort writer (it dirtied {} MiB): {} misses, {} reads not resident, p99 {} µs",
        written / MIB,
        far.misses,
        far.not_resident.len(),
        far.quantile_ns(0.99) / 1000
    );
    assert!(
        written > 16 * MIB,
        "the writer really wrote ({written} bytes)"
    );
    assert_eq!(far.misses, 0, "{BEHIND} s behind: {:?}", far.slow);
    assert!(far.not_resident.is_empty(), "{:?}", far.not_resident);
    let summary = recorder.join().expect("recorder");
    eprintln!("recorder: {summary}");
    assert!(daemon
        .ctl(["detach", &recording.to_string()])
        .status
        .success());
}
