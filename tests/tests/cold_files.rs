//! `write_cold_file` on the lab hdd puts the file on the disk with the model off: afterwards the
//! file is on the emulated disk with the right bytes, not in the page cache, and reading it
//! takes the disk's modelled time; the lab's statistics show those reads and not the writes.

use std::io::Read;
use std::time::{Duration, Instant};

use abiss_lab::{Op, StatsSummary};
use abiss_tests::{
    cold_file_bytes, file_extents, on_extents, require_root, resident_bytes, wait_until,
    write_cold_file, HddLab,
};

const MIB: u64 = 1 << 20;

/// The lab's summary as rewritten at least a second after this call: it counts every request
/// completed before the call.
fn fresh_summary(lab: &HddLab) -> StatsSummary {
    let seen = lab.lab().summary().expect("summary").elapsed_ns;
    let mut summary = None;
    let rewritten = wait_until(Duration::from_secs(5), || {
        let now = lab.lab().summary().expect("summary");
        let fresh = now.elapsed_ns >= seen + 2_000_000_000;
        summary = Some(now);
        fresh
    });
    assert!(rewritten, "the lab's summary was not rewritten");
    summary.expect("a summary")
}

#[test]
fn a_cold_file_on_the_lab_is_written_unmodelled_and_read_modelled() {
    require_root!();
    let lab = HddLab::up("cold-file", 1, "none");
    let path = lab.mount().join("cold.bin");
    let bytes = 8 * MIB;

    let before = fresh_summary(&lab);
    let mut cursor = lab.lab().stats_cursor().expect("stats");
    let started = Instant::now();
    write_cold_file(&path, bytes);
    let fill_took = started.elapsed();
    assert!(
        !lab.lab().unmodelled().expect("the lab's switch"),
        "the model is back on"
    );
    let filled = fresh_summary(&lab);
    let fill_records = cursor.read_new().expect("stats");
    let extents = file_extents(&path);
    let written: u64 = on_extents(&fill_records, &extents, Op::Write)
        .map(|r| r.len)
        .sum();
    println!(
        "filled {} MiB in {:.0} ms; the lab recorded {} requests, {} KiB, meanwhile ({} KiB \
         written to the file's extents {extents:?})",
        bytes / MIB,
        fill_took.as_secs_f64() * 1e3,
        filled.requests - before.requests,
        (filled.bytes - before.bytes) >> 10,
        written >> 10,
    );
    assert_eq!(written, 0, "the fill's writes were modelled");
    // At the disk's fastest rate, reading (or writing) the file takes this long under the model.
    let outer_rate = lab.lab().state().model.hdd.outer_rate_mb_s * 1e6;
    #[expect(clippy::cast_precision_loss, reason = "megabytes")]
    let modelled = Duration::from_secs_f64(bytes as f64 / outer_rate);

    let mut file = std::fs::File::open(&path).expect("open");
    assert_eq!(resident_bytes(&file, 0, bytes), 0, "evicted");
    let mut cursor = lab.lab().stats_cursor().expect("stats");
    let started = Instant::now();
    let mut contents = Vec::new();
    file.read_to_end(&mut contents).expect("read");
    let read_took = started.elapsed();
    assert!(
        contents == cold_file_bytes(bytes),
        "the bytes read back differ"
    );
    let read_summary = fresh_summary(&lab);
    let read_records = cursor.read_new().expect("stats");
    let read: u64 = on_extents(&read_records, &extents, Op::Read)
        .map(|r| r.len)
        .sum();
    println!(
        "read it back cold in {:.0} ms (at the outer zone's rate: {:.0} ms); the lab recorded \
         {} KiB of reads of it, {} KiB in all",
        read_took.as_secs_f64() * 1e3,
        modelled.as_secs_f64() * 1e3,
        read >> 10,
        (read_summary.bytes - filled.bytes) >> 10,
    );
    assert!(read >= bytes, "the cold read was recorded: {read} bytes");
    assert!(read_summary.bytes - filled.bytes >= bytes);
    assert!(
        read_took >= modelled * 9 / 10,
        "a cold read of {bytes} bytes took {read_took:?}, the model at least {modelled:?}"
    );
}

#[test]
fn the_model_is_back_on_when_writing_a_cold_file_fails() {
    require_root!();
    let lab = HddLab::up("cold-file-fails", 1, "none");
    let path = lab.mount().join("cold.bin");
    // A file in the way of the directory the file would be made in.
    std::fs::write(&path, b"").expect("a file");
    let result = std::panic::catch_unwind(|| write_cold_file(&path.join("no"), MIB));
    assert!(result.is_err(), "writing into a file succeeded");
    assert!(
        !lab.lab().unmodelled().expect("the lab's switch"),
        "the model was left off"
    );
}
