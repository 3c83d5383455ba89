//! A stream's window reaches the disk in requests as large as the disk takes: abissd advises
//! its loads in pieces of the disk's largest request (`queue/max_sectors_kb`, or fewer bytes
//! where `queue/max_segments` pages are fewer), which the kernel reads whole from one advice.
//! With pieces of the kernel's default readahead (128 KiB) a window cost four times the
//! requests on a disk that takes 512 KiB, wherever the elevator did not merge them back (it
//! cannot under `none` while the driver takes every request at once).

use std::fs::File;
use std::time::Duration;

use abiss_lab::Op;
use abiss_tests::{
    file_extents, on_extents, require_root, resident_bytes, wait_until, write_cold_file, Daemon,
    HddLab,
};

const MIB: u64 = 1 << 20;
const BUFFER: u64 = 8 * MIB;

#[test]
fn a_window_is_loaded_in_requests_as_large_as_the_disk_takes() {
    require_root!();
    let lab = HddLab::up("load-requests", 1, "none");
    let name = lab
        .device()
        .file_name()
        .expect("a device name")
        .to_string_lossy()
        .into_owned();
    let queue = |setting: &str| -> u64 {
        std::fs::read_to_string(format!("/sys/block/{name}/queue/{setting}"))
            .expect(setting)
            .trim()
            .parse()
            .expect("a number")
    };
    // A request of page-cache pages is bounded by its bytes and by its segments: a page
    // apart from its neighbours in memory takes a segment of its own.
    let largest = (queue("max_sectors_kb") * 1024).min(queue("max_segments") * 4096);
    let largest_kib = largest >> 10;
    assert!(
        largest > 128 << 10,
        "the lab disk takes {largest_kib} KiB requests: the test needs more than 128 KiB"
    );
    let path = lab.mount().join("stream.bin");
    write_cold_file(&path, 3 * BUFFER);
    let extents = file_extents(&path);
    let file = File::open(&path).expect("open");
    assert_eq!(resident_bytes(&file, 0, BUFFER), 0, "cold");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    let mut cursor = lab.lab().stats_cursor().expect("stats");
    let output = daemon.attach_1mb_output(&path, "8MiB");
    assert!(output.status.success(), "{output:?}");
    assert!(
        wait_until(Duration::from_secs(20), || resident_bytes(&file, 0, BUFFER)
            == BUFFER),
        "the window is loaded: {} bytes resident",
        resident_bytes(&file, 0, BUFFER)
    );
    // The lab writes its records as it completes requests; give the last ones a moment.
    std::thread::sleep(Duration::from_millis(500));
    let records = cursor.read_new().expect("stats");
    let reads: Vec<u64> = on_extents(&records, &extents, Op::Read)
        .map(|r| r.len)
        .collect();
    let bytes: u64 = reads.iter().sum();
    let requests = u64::try_from(reads.len()).expect("a count");
    let sizes_kib: Vec<u64> = reads.iter().map(|len| len >> 10).collect();
    eprintln!(
        "the 8 MiB window: {requests} read requests, {} KiB, {} KiB on average (KiB: {sizes_kib:?}); the disk takes {largest_kib} KiB; the file's extents: {extents:?}",
        bytes >> 10,
        (bytes / requests.max(1)) >> 10
    );
    assert!(bytes >= BUFFER, "the window's reads were recorded: {bytes}");
    // A piece is cut short only where one of the file's extents ends. Pieces of 128 KiB went
    // out one by one while the idle disk took each at once (5 requests of 128 KiB, measured).
    let short = reads.iter().filter(|&&len| len < largest).count();
    assert!(
        short <= extents.len(),
        "{short} requests shorter than the disk's largest, for a file in {} extents",
        extents.len()
    );
    assert!(
        requests <= bytes.div_ceil(largest) + u64::try_from(extents.len()).expect("a count"),
        "{requests} requests for {bytes} bytes on a disk that takes {largest} at once"
    );
}
