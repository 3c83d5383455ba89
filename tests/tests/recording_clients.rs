//! Clients that record through a write stream (the Rust client, the C example), and a recording
//! watched by a reader while it is recorded.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use abiss_client::{AbissFile, Client, StreamOptions};
use abiss_proto::{ByteRate, ByteSize};
use abiss_tests::{
    abiss_c_library, compile_c_example, evict, paced_read, require_root, resident_bytes,
    run_at_realtime_cpu_priority, Daemon, Ext4Mount, HddLab, LoopDevice, PacedReport, Scratch,
};

// A test file is the root of its crate, so a module it shares is named by its path; each
// file uses part of it.
#[path = "recording/common.rs"]
#[allow(dead_code)]
mod common;

use common::*;

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
/// at its attach (the window follows the file as it grows); a reader 14 s behind, whose data
/// is no longer in memory (dropped from the page cache, as the write-behind and a busy
/// machine do), reads against a best-effort writer whose writes reach the disk (paced by
/// `sync_file_range`, whatever the machine's dirty limits). Both meet every deadline with
/// every page resident before it is read.
#[test]
fn a_recording_is_watched_while_it_is_recorded() {
    // Past the first reader's 3 + 8 s, with 14 MB recorded: the far reader's 8 s of reads
    // from the head never reach the recorder.
    const BEHIND: u64 = 14;
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
    let mut writer = BestEffortWriter::start_to_disk(lab.mount().join("be.bin"));
    let (far, _, _) = watch_recording(&daemon, &path, WATCH);
    let written = writer.stop();
    eprintln!(
        "{BEHIND} s behind, against a best-effort writer (it wrote {} MiB to the disk): {} misses, {} reads not resident, p99 {} µs",
        written / MIB,
        far.misses,
        far.not_resident.len(),
        far.quantile_ns(0.99) / 1000
    );
    eprintln!("abissd's loop: {:?}", daemon.main_loop());
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
