//! The guarantee itself, on the lab's emulated laptop hdd with a best-effort copy loop running:
//! a 1 MB/s stream read in 64 KiB reads misses no deadline, and every read finds its pages in
//! memory when it begins; a reader through the library and an unmodified one each keep it,
//! side by side on two streams. Those two are what abiss controls, and what the tests assert. How
//! long a read of resident pages takes is the CPU's and the kernel's (locks, scheduling) and is
//! reported as a figure (p50 to max, and the reads over 1 ms), not asserted.
//!
//! With `--disable read-tracking --disable miss-raises --disable uring-reports` (a kernel
//! older than 6.4, as far as abiss can tell) the library reader, which sends position messages,
//! must keep the same guarantee.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use abiss_client::{AbissFile, Client, StreamOptions};
use abiss_proto::{ByteRate, ByteSize, StreamId};
use abiss_tests::{
    guarantee, paced_read, require_root, run_at_realtime_cpu_priority, write_cold_file, CopyLoop,
    Daemon, HddLab, PacedReport, OLD_KERNEL_ARGS,
};

use guarantee::{BUFFER, RATE, READ};

/// Over 60 s, as the issue asks: 66 s make 1007 reads, the fewest for which p99.9 is not
/// simply the maximum. `ABISS_GUARANTEE_SECS` shortens it for a quick look.
fn duration() -> Duration {
    guarantee::read_for(66)
}

struct Bench {
    daemon: Daemon,
    copy: CopyLoop,
    lab: HddLab,
}

/// The lab hdd with `stream.bin` (and `stream-plain.bin` with `plain_too`), abissd managing it
/// with `daemon_args`, and the copy loop running.
fn bench(tag: &str, daemon_args: &[&str], plain_too: bool) -> Bench {
    let lab = HddLab::up(tag, 2, "none");
    let mount = lab.mount().to_path_buf();
    write_cold_file(&mount.join("stream.bin"), 70 << 20);
    if plain_too {
        write_cold_file(&mount.join("stream-plain.bin"), 70 << 20);
    }
    write_cold_file(&mount.join("copy-source.bin"), 175 << 20);
    let mut args = vec!["--capacity", "30MB/s"];
    args.extend_from_slice(daemon_args);
    let daemon = Daemon::start_managing(lab.device(), &args);
    let copy = CopyLoop::start(mount.join("copy-source.bin"), mount.join("copy-target.bin"));
    // Let the copy loop fill the queues before the stream starts.
    std::thread::sleep(Duration::from_secs(2));
    Bench { daemon, copy, lab }
}

/// What `report` of the reader of stream `stream` must show, and what it shows besides.
fn check(
    daemon: &Daemon,
    stream: StreamId,
    report: &PacedReport,
    what: &str,
    copied: u64,
    read_for: Duration,
) {
    let info = daemon.streams().into_iter().find(|s| s.id == stream);
    let p999 = report.quantile_ns(0.999);
    eprintln!(
        "{what}: {} reads, {} misses, p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs; copy loop moved {} MB",
        report.latencies_ns.len(),
        report.misses,
        report.quantile_ns(0.5) / 1000,
        report.quantile_ns(0.99) / 1000,
        p999 / 1000,
        report.quantile_ns(1.0) / 1000,
        copied / 1_000_000
    );
    eprintln!("{what}: reads over 1 ms: {:?}", report.slow);
    eprintln!(
        "{what}: reads that began with pages not resident: {:?}",
        report.not_resident
    );
    eprintln!("{what}: abissd's loop: {:?}", daemon.main_loop());
    assert_eq!(
        info.expect("the stream is attached").misses,
        0,
        "{what}: the daemon saw a page-cache miss"
    );
    let expected = read_for.as_secs() * RATE / READ as u64;
    assert!(
        report.latencies_ns.len() as u64 >= expected * 95 / 100,
        "the reader kept its schedule"
    );
    assert_eq!(report.misses, 0, "{what}: deadline misses");
    assert!(
        report.not_resident.is_empty(),
        "{what}: {} reads began before the window held their pages: {:?}",
        report.not_resident.len(),
        report.not_resident
    );
    assert!(
        copied > 20_000_000,
        "the copy loop really loaded the disk ({copied} bytes)"
    );
}

/// The two kinds of reader side by side, each on its own stream and file: a reader through
/// the library (which sends position messages) and an unmodified reader attached by
/// `abissctl` (whose reads tell the daemon where it is).
#[test]
fn a_library_reader_and_an_unmodified_reader_meet_every_deadline_under_a_copy_loop() {
    require_root!();
    let mut bench = bench("library-and-plain", &[], true);
    let plain_path = bench.lab.mount().join("stream-plain.bin");
    let plain_stream = bench.daemon.attach_at_1mb(&plain_path);
    let plain = std::thread::spawn(move || plain_paced_read(&plain_path, BUFFER, duration()));
    let path = bench.lab.mount().join("stream.bin");
    let (file, report) = library_read(&bench, &path, duration());
    let plain_report = plain.join().expect("the plain reader");
    let copied = bench.copy.stop();
    let plain_info = bench
        .daemon
        .streams()
        .into_iter()
        .find(|s| s.id == plain_stream);
    assert!(
        !plain_info.expect("the plain stream").readers.is_empty(),
        "the plain reader was recognised"
    );
    let id = file.stream_id();
    check(&bench.daemon, id, &report, "library", copied, duration());
    check(
        &bench.daemon,
        plain_stream,
        &plain_report,
        "plain reader",
        copied,
        duration(),
    );
}

#[test]
fn a_library_reader_meets_every_deadline_without_the_newer_kernel_hooks() {
    require_root!();
    // The same prefetch as above, steered by position messages alone: 20 s of it (306 reads)
    // show the path keeps the guarantee; the long run's tail figures are the test above's.
    let read_for = Duration::from_secs(20).min(duration());
    let mut bench = bench("library-old-kernel", &OLD_KERNEL_ARGS, false);
    let path = bench.lab.mount().join("stream.bin");
    let (file, report) = library_read(&bench, &path, read_for);
    let copied = bench.copy.stop();
    let id = file.stream_id();
    check(
        &bench.daemon,
        id,
        &report,
        "library-old-kernel",
        copied,
        read_for,
    );
}

/// Opens `path` through the library at the rate with the reference buffer and reads it on the
/// schedule for `read_for`; the file stays attached for the checks.
fn library_read(bench: &Bench, path: &Path, read_for: Duration) -> (AbissFile, PacedReport) {
    let client = Client::connect(bench.daemon.socket()).expect("connect");
    let mut file = AbissFile::open_with(
        client,
        path,
        &StreamOptions::new(ByteRate(RATE), ByteSize(BUFFER)),
    )
    .expect("attach");
    run_at_realtime_cpu_priority();
    let report = paced_read(
        &mut file,
        Some(&File::open(path).expect("open")),
        RATE,
        BUFFER,
        READ,
        read_for,
    );
    (file, report)
}

/// A plain reader of `path` at the rate with `buffer`: it knows nothing of abiss; its reads
/// tell the daemon where it is.
fn plain_paced_read(path: &Path, buffer: u64, duration: Duration) -> PacedReport {
    let mut file = File::open(path).expect("open");
    run_at_realtime_cpu_priority();
    paced_read(
        &mut file,
        Some(&File::open(path).expect("open")),
        RATE,
        buffer,
        READ,
        duration,
    )
}

/// `--buffer auto`: abissd sizes the buffer from the real-time latency tail its disk shows
/// (estimated from the service time of the copy loop's requests until it has seen enough real-
/// time ones), grows it as the measured tail asks, says why in `list`, and a plain reader on
/// that buffer meets every deadline against the copy loop.
#[test]
fn an_automatic_buffer_follows_the_disks_real_time_tail() {
    require_root!();
    let mut bench = bench("auto", &[], false);
    // Two more seconds of the copy loop, so that the disk has served enough requests (about
    // 80 a second on the lab hdd) to estimate the first buffer from.
    std::thread::sleep(Duration::from_secs(2));
    let path = bench.lab.mount().join("stream.bin");
    let output = bench.daemon.ctl([
        "attach",
        path.to_str().unwrap(),
        "--rate",
        "1MB/s",
        "--buffer",
        "auto",
    ]);
    assert!(output.status.success(), "{output:?}");
    let first = bench.daemon.streams()[0].clone();
    let auto = first.buffer_auto.clone().expect("an automatic buffer");
    eprintln!("at attach: buffer {} ({auto:?})", first.buffer);
    // No real-time request has been served yet, so nothing is measured. The copy loop ran 4 s
    // before the attach: the first buffer is sized from its requests' service p99 where that
    // is above the 100 ms default, which an estimate only raises. Since managed disks take
    // requests of at most 512 KiB, that p99 on the lab hdd is about the default itself (100.7
    // and 101.9 ms in two runs on 2026-12-04, under it in two others), so either may hold.
    assert!(
        !auto.measured && auto.tail_us >= 100_000 && auto.estimated == (auto.tail_us > 100_000),
        "the first buffer is sized from the disk's requests so far, or the default: {auto:?}"
    );
    // The reader keeps to the buffer it was given at the start: its deadlines are the
    // tightest the stream has had.
    let report = plain_paced_read(&path, first.buffer.0, Duration::from_secs(20));
    let copied = bench.copy.stop();
    let after = bench.daemon.streams()[0].clone();
    let auto_after = after.buffer_auto.clone().expect("still automatic");
    eprintln!("after 20 s: buffer {} ({auto_after:?})", after.buffer);
    let list = String::from_utf8_lossy(&bench.daemon.ctl(["list"]).stdout).into_owned();
    eprintln!("{list}");
    assert!(auto_after.measured, "the tail was measured: {auto_after:?}");
    // The buffer covers twice the rate over the latest tail and two batches, within the 10 %
    // it may lag by before it grows (unless the budget stopped it), and it never shrank.
    let needed = 2 * RATE * auto_after.tail_us / 1_000_000 + 2 * 20 * 4096;
    assert!(
        after.buffer.0 * 110 / 100 >= needed || auto_after.capped,
        "{after:?}"
    );
    assert!(after.buffer.0 >= first.buffer.0);
    assert!(
        list.contains("buffer auto: twice the rate over the disk's p99"),
        "{list}"
    );
    check(
        &bench.daemon,
        after.id,
        &report,
        "reader on an automatic buffer",
        copied,
        Duration::from_secs(20),
    );
}
