//! Streams on a managed loop device: prefetch at the stream's priority, a resident and locked
//! window, conformance to the granted rate, and bad input that changes nothing.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use abiss_client::{AbissFile, Client, ClientError, StreamOptions};
use abiss_proto::{AttachRequest, ByteRate, ByteSize, IoClass};
use abiss_tests::{
    binary, disk_reads, read_request, require_root, resident_bytes, wait_until, write_cold_file,
    Daemon, Ext4Mount, LoopDevice,
};

const BUFFER: u64 = 564 * 1024;
const MB: u64 = 1_000_000;

/// Field order matters: the daemon (which holds the streamed files open) goes before the
/// filesystem is unmounted.
struct Setup {
    daemon: Daemon,
    fs: Ext4Mount,
}

fn setup() -> Setup {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(
        fs.device().path(),
        &["--capacity", "20MB/s", "--realtime-share", "80"],
    );
    Setup { daemon, fs }
}

fn locked_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn ctl(daemon: &Daemon, args: &[&str]) -> std::process::Output {
    daemon.ctl(args)
}

/// A persistent read stream at `rate` with the measurement's buffer, at `priority`.
fn request(rate: u64, priority: u8) -> AttachRequest {
    AttachRequest {
        priority,
        ..read_request(rate, BUFFER, 20)
    }
}

#[test]
fn prefetch_requests_carry_the_streams_priority_and_inode() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let rt_file = fs.path().join("rt.bin");
    let be_file = fs.path().join("be.bin");
    write_cold_file(&rt_file, 4 << 20);
    write_cold_file(&be_file, 4 << 20);
    let mut events = daemon.connect();
    events.send(abiss_proto::Request::Events);
    events.set_timeout(Duration::from_secs(5));
    assert_eq!(events.receive(), abiss_proto::Response::Subscribed);

    let mut client = Client::connect(daemon.socket()).expect("connect");
    let rt = client
        .attach(File::open(&rt_file).unwrap(), request(MB, 0))
        .expect("attach rt");
    let be = client
        .attach(File::open(&be_file).unwrap(), request(MB, 5))
        .expect("attach be");

    events.set_timeout(Duration::from_secs(5));
    let (mut rt_bytes, mut be_bytes) = (0u64, 0u64);
    while rt_bytes < BUFFER || be_bytes < BUFFER {
        let abiss_proto::Response::Event(record) = events.receive() else {
            panic!("expected events");
        };
        if record.device != fs.device().number() {
            continue;
        }
        if record.inode == Some(rt.inode) {
            assert_eq!(
                (record.priority.class, record.priority.level),
                (IoClass::Rt, 0),
                "{record:?}"
            );
            rt_bytes += u64::from(record.bytes);
        } else if record.inode == Some(be.inode) {
            assert_eq!(
                (record.priority.class, record.priority.level),
                (IoClass::Be, 2),
                "{record:?}"
            );
            be_bytes += u64::from(record.bytes);
        }
    }
    assert_eq!(
        rt_bytes, BUFFER,
        "the RT stream's initial fill is exactly its buffer"
    );
}

#[test]
fn the_window_is_resident_and_locked_while_attached_and_nothing_after() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let file = fs.path().join("movie.bin");
    write_cold_file(&file, 16 << 20);
    let pid = daemon.pid();
    assert_eq!(locked_kib(pid), 0);

    let id = daemon.attach_at_1mb(&file);
    let mut client = Client::connect(daemon.socket()).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || client.list().unwrap()[0]
            .locked_bytes
            == BUFFER),
        "window loaded and locked"
    );
    assert_eq!(
        locked_kib(pid),
        BUFFER / 1024,
        "the daemon's locked memory is the window"
    );

    // The test's own view of the page cache: the window's pages are resident, the rest not.
    let data = File::open(&file).unwrap();
    let resident = |offset: u64, len: u64| resident_bytes(&data, offset, len);
    assert_eq!(resident(0, BUFFER), BUFFER);
    assert_eq!(
        resident(8 << 20, 1 << 20),
        0,
        "nothing outside the window was loaded"
    );

    let list = ctl(daemon, &["list", "--json"]);
    let streams: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(streams[0]["id"], id.0);
    assert_eq!(streams[0]["resident_bytes"], BUFFER);

    let output = ctl(daemon, &["detach", &id.to_string()]);
    assert!(output.status.success());
    assert!(
        wait_until(Duration::from_secs(5), || locked_kib(pid) == 0),
        "nothing locked after detach"
    );
    // Readers of a detached file keep working as plain readers.
    assert_eq!(std::fs::read(&file).unwrap().len(), 16 << 20);
}

#[test]
fn a_reader_at_four_times_its_rate_gets_no_more_than_its_rate_from_the_prefetch() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let path = fs.path().join("greedy.bin");
    write_cold_file(&path, 32 << 20);
    let client = Client::connect(daemon.socket()).unwrap();
    let mut file = AbissFile::open_with(
        client,
        &path,
        &StreamOptions::new(ByteRate(MB), ByteSize(BUFFER)),
    )
    .expect("open");
    let id = file.stream_id();
    let started = Instant::now();
    let report = abiss_tests::paced_read(
        &mut file,
        None,
        4 * MB,
        BUFFER,
        64 * 1024,
        Duration::from_secs(4),
    );
    let elapsed = started.elapsed();
    assert!(
        report.bytes >= 15 * MB,
        "the reader got its data ({} bytes)",
        report.bytes
    );
    let streams = Client::connect(daemon.socket()).unwrap().list().unwrap();
    let stream = streams.iter().find(|s| s.id == id).expect("stream listed");
    // The credit limit is two buffers: what the prefetch may take on top of rate × time.
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap();
    let allowed = 2 * BUFFER + MB * elapsed_ms / 1000 + 20 * 4096;
    assert!(
        stream.prefetched_bytes <= allowed,
        "prefetched {} > allowed {allowed} after {elapsed:?}",
        stream.prefetched_bytes
    );
    assert!(
        stream.prefetched_bytes >= MB * 2,
        "but the prefetch kept going at its rate"
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let file = fs.path().join("ok.bin");
    write_cold_file(&file, 2 << 20);
    let path = file.to_str().unwrap();
    let pid = daemon.pid();
    // A fixed buffer, so that what is locked is known (a reader's default is automatic).
    let existing = ctl(
        daemon,
        &["attach", path, "--rate", "1MB/s", "--buffer", "564KiB"],
    );
    assert!(existing.status.success());
    assert!(wait_until(Duration::from_secs(5), || locked_kib(pid) == BUFFER / 1024));

    let other = fs.path().join("other.bin");
    write_cold_file(&other, 1 << 20);
    let other = other.to_str().unwrap();
    refuses_invalid_parameters(daemon, other);
    refuses_wrong_kinds_of_file(daemon, fs.path());
    // A rate that does not fit the 16 MB/s budget (80% of 20 MB/s); 1 MB/s is taken.
    expect_refused(
        daemon,
        &["attach", other, "--rate", "16MB/s"],
        9,
        "15000000 B/s",
    );
    // A second attach of a file makes a second stream (tests/shared_files.rs); one that does
    // not fit next to the first is refused.
    expect_refused(
        daemon,
        &["attach", path, "--rate", "16MB/s"],
        9,
        "15000000 B/s",
    );
    refuses_bad_detaches(daemon);

    // Descriptors the CLI cannot produce: a pipe and a write-only file, through the protocol.
    let mut client = Client::connect(daemon.socket()).unwrap();
    let (reader, _writer) = nix::unistd::pipe().unwrap();
    assert!(
        matches!(client.attach(reader, request(MB, 0)), Err(ClientError::BadRequest { message }) if message.contains("a pipe"))
    );
    let write_only = std::fs::OpenOptions::new().write(true).open(other).unwrap();
    assert!(
        matches!(client.attach(write_only, request(MB, 0)), Err(ClientError::BadRequest { message }) if message.contains("write-only"))
    );

    // The existing stream is untouched and nothing else is locked.
    let streams = client.list().unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].locked_bytes, BUFFER);
    assert_eq!(locked_kib(pid), BUFFER / 1024);
}

/// `abissctl args` fails with exit code `code`, saying `needle`, without a panic.
fn expect_refused(daemon: &Daemon, args: &[&str], code: i32, needle: &str) {
    let output = ctl(daemon, args);
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "{args:?}: {message}");
    assert!(
        message.contains(needle),
        "{args:?}: '{message}' lacks '{needle}'"
    );
    assert!(!message.contains("panicked"));
}

/// Attaching `other` with invalid parameters.
fn refuses_invalid_parameters(daemon: &Daemon, other: &str) {
    let expect =
        |args: &[&str], code: i32, needle: &str| expect_refused(daemon, args, code, needle);
    expect(&["attach", other, "--rate", "0"], 2, "rate");
    expect(&["attach", other, "--rate", "-1MB/s"], 2, "rate");
    expect(&["attach", other, "--rate", "fast"], 2, "rate");
    expect(
        &["attach", other, "--rate", "1MB/s", "--batch", "0"],
        2,
        "batch",
    );
    expect(
        &["attach", other, "--rate", "1MB/s", "--priority", "8"],
        2,
        "priority",
    );
    expect(
        &["attach", other, "--rate", "1MB/s", "--buffer", "100KiB"],
        8,
        "two batches",
    );
}

/// Attaching wrong kinds of file: the managed file system's `root` directory, a device, a file
/// on an unmanaged disk, and one that does not exist.
fn refuses_wrong_kinds_of_file(daemon: &Daemon, root: &Path) {
    let expect =
        |args: &[&str], code: i32, needle: &str| expect_refused(daemon, args, code, needle);
    expect(
        &["attach", root.to_str().unwrap(), "--rate", "1MB/s"],
        8,
        "a directory",
    );
    expect(&["attach", "/dev/null", "--rate", "1MB/s"], 8, "a device");
    let unmanaged = std::env::temp_dir().join(format!("abiss-unmanaged-{}", std::process::id()));
    std::fs::write(&unmanaged, b"not on a managed disk").unwrap();
    expect(
        &["attach", unmanaged.to_str().unwrap(), "--rate", "1MB/s"],
        5,
        "does not manage",
    );
    std::fs::remove_file(&unmanaged).unwrap();
    expect(
        &["attach", "/nonexistent/file", "--rate", "1MB/s"],
        11,
        "cannot open",
    );
}

/// Detach of another user's stream, and of a stream that does not exist: to another user the
/// stream is not there.
fn refuses_bad_detaches(daemon: &Daemon) {
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(binary("abissctl"))
        .arg("--socket")
        .arg(daemon.socket())
        .args(["detach", "1"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(10),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    expect_refused(daemon, &["detach", "999"], 10, "not attached");
}

#[test]
fn run_attaches_for_the_lifetime_of_the_command_and_status_shows_the_budget() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let file = fs.path().join("run.bin");
    write_cold_file(&file, 2 << 20);
    let output = ctl(
        daemon,
        &[
            "run",
            "--rate",
            "2MB/s",
            file.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "test -n \"$(ls /)\" && exit 3",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(3),
        "the command's exit code: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        Client::connect(daemon.socket())
            .unwrap()
            .list()
            .unwrap()
            .is_empty(),
        "stream ended with the command"
    );

    let status = ctl(daemon, &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let device = &status["devices"][0];
    assert_eq!(status["upgrades"]["enabled"], true);
    assert_eq!(device["name"], fs.device().name());
    assert_eq!(device["elevator"], "mq-deadline");
    assert_eq!(device["capacity"], 20 * MB);
    assert_eq!(device["free"], 16 * MB);
    let meta = std::fs::metadata(Path::new(fs.device().path())).unwrap();
    assert!(meta.rdev() != 0);
}

#[test]
fn a_user_cannot_hold_more_than_32_streams_and_root_detaches_them_all() {
    require_root!();
    let setup = setup();
    let (daemon, fs) = (&setup.daemon, &setup.fs);
    let attach_as_nobody = |path: &Path| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(binary("abissctl"))
            .arg("--socket")
            .arg(daemon.socket())
            .args([
                "attach",
                path.to_str().unwrap(),
                "--rate",
                "1000",
                "--buffer",
                "8KiB",
                "--batch",
                "1",
            ])
            .output()
            .unwrap()
    };
    for i in 0..33 {
        let path = fs.path().join(format!("clip-{i}.bin"));
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let output = attach_as_nobody(&path);
        if i < 32 {
            assert!(
                output.status.success(),
                "stream {i}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        } else {
            assert_eq!(
                output.status.code(),
                Some(9),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(String::from_utf8_lossy(&output.stderr).contains("32 streams"));
        }
    }
    let mut client = Client::connect(daemon.socket()).unwrap();
    let streams = client.list().unwrap();
    assert_eq!(streams.len(), 32);
    assert!(streams.iter().all(|s| s.owner_uid == 65534));
    for stream in streams {
        client
            .detach(abiss_proto::StreamTarget::Id(stream.id))
            .expect("root may detach any stream");
    }
    assert!(client.list().unwrap().is_empty());
}

/// A window that lacks pages refills as soon as its credit allows, however often something
/// else wakes abissd meanwhile. The wait used to be counted again from every event, so a
/// client polling `list` every 20 ms (faster than a batch of credit comes back at 1 MB/s) kept
/// the refill back for as long as it polled: the flaky `shared_files` failure, whose check polls.
#[test]
fn a_window_refills_on_time_while_a_client_polls_the_daemon() {
    require_root!();
    let setup = setup();
    let path = setup.fs.path().join("movie.bin");
    write_cold_file(&path, 32 << 20);
    let id = setup.daemon.attach_at_1mb(&path);
    std::thread::sleep(Duration::from_millis(300));
    // A dash through 2 MiB spends the credit, and the window falls behind the reader.
    dd(path.to_str().unwrap(), 0, 32);
    let mut client = Client::connect(setup.daemon.socket()).expect("connect");
    let started = Instant::now();
    let mut seen = None;
    let refilled = loop {
        let stream = client
            .list()
            .expect("list")
            .into_iter()
            .find(|s| s.id == id)
            .expect("the stream");
        if stream.loaded_end >= stream.playout_point + BUFFER / 2 {
            break Some(started.elapsed());
        }
        seen = Some(stream);
        if started.elapsed() > Duration::from_secs(3) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("the window refilled after {refilled:?} of polling every 20 ms");
    // Half a buffer and up to a batch at 1 MB/s: 0.37 s of credit.
    assert!(
        refilled.is_some_and(|took| took < Duration::from_millis(1500)),
        "the window refilled after {refilled:?} of polling: {seen:?}"
    );
}

/// Reads `count` 64 KiB blocks of `path` from block `skip` on, as a player's reader would.
fn dd(path: &str, skip: u64, count: u64) {
    let status = Command::new("dd")
        .args([
            &format!("if={path}"),
            "of=/dev/null",
            "bs=64k",
            &format!("skip={skip}"),
            &format!("count={count}"),
            "status=none",
        ])
        .status()
        .expect("dd");
    assert!(status.success());
}

/// `--preroll`: the head of the file beyond the buffer is loaded at once when the stream
/// starts (not at the rate), and the file's last 512 KiB with it (players read the end for the
/// duration), in large requests. Both are locked until the reader passes the head, a read of the tail is no
/// seek, and they count against the locked-memory budget while they are locked (a preroll
/// that does not fit is refused).
#[test]
fn a_preroll_loads_the_head_and_the_tail_at_once_until_the_reader_passes_the_head() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(
        fs.device().path(),
        &["--capacity", "20MB/s", "--locked-memory", "16MiB"],
    );
    let daemon = &daemon;
    let path = fs.path().join("movie.ts");
    let file_bytes = 32 << 20;
    write_cold_file(&path, file_bytes);
    let file = File::open(&path).expect("open");
    let path = path.to_str().unwrap();
    let (preroll, tail) = (8 << 20, 512 << 10);
    let reads_before = disk_reads(&fs.device().name());
    let started = Instant::now();
    let output = ctl(
        daemon,
        &["attach", path, "--rate", "1MB/s", "--preroll", "8MiB"],
    );
    assert!(output.status.success(), "{output:?}");
    let stream = || daemon.streams().first().cloned().expect("the stream");
    let locked = || stream().locked_bytes;
    assert!(
        wait_until(Duration::from_secs(3), || locked() == preroll + tail),
        "8 MiB of the head and 512 KiB of the tail locked at once ({} after {:?}); at 1 MB/s \
         it would take 8 s",
        locked(),
        started.elapsed()
    );
    assert_eq!(resident_bytes(&file, 0, preroll), preroll);
    assert_eq!(resident_bytes(&file, file_bytes - tail, tail), tail);
    // In large requests: one advice reads no more than the disk's readahead or largest
    // request, and what it left was read a page at a time (1,326 requests before the advice
    // was cut in 128 KiB pieces).
    let reads = disk_reads(&fs.device().name()) - reads_before;
    assert!(
        reads <= (preroll + tail) / (32 << 10),
        "{reads} read requests for 8.5 MiB; at most one per 32 KiB expected"
    );
    // While it is locked, the preroll counts: 8.5 MiB + 12.5 MiB do not fit in 16 MiB.
    expect_refused(
        daemon,
        &["attach", path, "--rate", "1MB/s", "--preroll", "12MiB"],
        9,
        "does not fit",
    );
    // The player's look at the end: no seek, nothing released.
    dd(path, (file_bytes - (256 << 10)) / (64 << 10), 4);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        (stream().window_start, locked()),
        (0, preroll + tail),
        "reading the tail left the window and the preroll alone"
    );
    // A reader that passes 6 MiB releases what it passed; the window stays B ahead of it and
    // the tail stays while the head preroll is ahead.
    dd(path, 0, 96);
    assert!(
        wait_until(Duration::from_secs(3), || locked()
            <= (2 << 20) + 20 * 4096 + tail),
        "the passed part of the preroll is released ({} locked)",
        locked()
    );
    assert_eq!(resident_bytes(&file, file_bytes - tail, tail), tail);
    // Past the head preroll, the tail goes too.
    dd(path, 96, 48);
    assert!(
        wait_until(Duration::from_secs(3), || locked() <= 2 << 20),
        "past the head, the tail is released ({} locked)",
        locked()
    );
    // Now it fits.
    let output = ctl(
        daemon,
        &["attach", path, "--rate", "1MB/s", "--preroll", "12MiB"],
    );
    assert!(output.status.success(), "{output:?}");
    expect_refused(
        daemon,
        &["attach", path, "--rate", "1MB/s", "--preroll", "65MiB"],
        8,
        "64MiB",
    );
    assert_eq!(daemon.streams().len(), 2);
}
