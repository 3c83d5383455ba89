//! What abissd keeps in the kernel and in its workers (the latency map, the playout ring, the
//! prefetch workers, the log of failed loads) holds up against other local users and against
//! files that change under a stream (issue 9: findings 7, 8 and 9). Users are `nobody` and
//! a made-up uid through `setpriv`. The state directory's tests are in
//! `tests/security_state_dir.rs`.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, StreamId, StreamTarget};
use abiss_tests::{as_user, attach_as, binary, chmod, direct_reads, read_request, require_root};
use abiss_tests::{shared_fs, wait_until, write_cold_file, Daemon, NOBODY_UID};

/// A user that is neither root nor `nobody`: the owner of streams `nobody` attacks.
const OWNER_UID: u32 = 4242;

/// An attach request at `rate` B/s with `buffer` bytes in batches of `batch_pages`, persistent
/// (it outlives abissctl), at `priority`.
fn request(rate: u64, buffer: u64, batch_pages: u32, priority: u8) -> AttachRequest {
    AttachRequest {
        priority,
        ..read_request(rate, buffer, batch_pages)
    }
}

#[test]
fn streams_that_ended_leave_room_in_the_latency_map_for_new_ones() {
    require_root!();
    let (fs, files) = shared_fs(&[("kept.bin", 4 << 20), ("cycled.bin", 4 << 20)]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    // A stream that stays keeps the page-cache programs attached, so each cycle below is
    // only a map update, not program attachments.
    let kept = File::open(&files[0]).expect("open");
    client
        .attach(&kept, request(1_000_000, 64 << 10, 4, 7))
        .expect("attach the kept stream");
    let reattached = File::open(&files[1]).expect("open");
    // More streams than the map has keys (scheduler_common::MAX_HISTOGRAM_KEYS, 4096), each
    // with one direct read of its file: a request tagged with the stream, so a key of its own.
    let cycles = 4_400;
    let started = Instant::now();
    for i in 0..cycles {
        let info = client
            .attach(&reattached, request(1_000_000, 8 << 10, 1, 7))
            .expect("attach");
        direct_reads(&files[1], 4096, i % 1000, 1);
        client.detach(StreamTarget::Id(info.id)).expect("detach");
    }
    eprintln!(
        "{cycles} attach/read/detach cycles in {:?}",
        started.elapsed()
    );
    let info = client
        .attach(&reattached, request(1_000_000, 8 << 10, 1, 7))
        .expect("attach");
    direct_reads(&files[1], 4096, 256, 1);
    // Before, the map also filled up with ended streams' keys, until the answer was too long
    // to send.
    let (_, groups) = client
        .latency()
        .unwrap_or_else(|error| panic!("latency after {cycles} ended streams: {error}"));
    let ours: Vec<_> = groups
        .iter()
        .filter(|group| group.stream == Some(info.id))
        .collect();
    assert!(
        ours.iter().map(|group| group.requests).sum::<u64>() >= 1,
        "stream {} after {cycles} ended streams is missing from the latency groups ({} groups)",
        info.id,
        groups.len()
    );
    // The ended streams' requests still count for their disk.
    let disk_reads: u64 = groups
        .iter()
        .filter(|group| group.device == fs.device().number())
        .map(|group| group.requests)
        .sum();
    assert!(
        disk_reads > cycles,
        "{disk_reads} requests on the disk after {cycles} direct reads"
    );
}

#[test]
fn another_users_reads_do_not_crowd_the_owners_misses_out_of_the_ring() {
    require_root!();
    let (fs, files) = shared_fs(&[("shared.bin", 64 << 20)]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = files[0].to_string_lossy().into_owned();
    let id = attach_as(OWNER_UID, daemon.socket(), &files[0], "1MB/s");
    // nobody rereads the start of the owner's file (in the loaded window, so from the page
    // cache) one byte per read(2), as fast as two processes go: once a ring record per read.
    let hammer =
        format!("while :; do dd if={path} of=/dev/null bs=1 count=400000 status=none; done");
    let mut hammers: Vec<Child> = (0..2)
        .map(|_| {
            as_user(NOBODY_UID, Path::new("sh"))
                .args(["-c", &hammer])
                .spawn()
                .expect("start the hammer")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Meanwhile the owner reads one page every 2 MiB from 4 MiB on: each read misses the page
    // cache (each a jump away from the window), and abissd must hear of each.
    let reads = owner_reads_a_page_every_2_mib(&files[0]);
    std::thread::sleep(Duration::from_millis(500));
    for hammer in &mut hammers {
        let _ = hammer.kill();
        let _ = hammer.wait();
    }
    let waited = waits_heard(&daemon, id);
    assert!(
        waited >= reads,
        "abissd heard of {waited} of the owner's {reads} reads that waited for the disk while \
         nobody read the file in a loop"
    );
}

/// The reads of stream `id` that abissd heard wait for the disk. Each of
/// [`owner_reads_a_page_every_2_mib`]'s reads jumps 2 MiB past the window, so abissd counts
/// its wait as the seek's rather than as a miss: both count here.
fn waits_heard(daemon: &Daemon, id: StreamId) -> u64 {
    let stream = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .expect("the owner's stream");
    stream.misses + stream.seek_waits
}

/// `OWNER_UID` reads one page of `file` every 2 MiB from 4 MiB on, 50 ms apart: each read
/// misses the page cache. Returns how many reads it made.
fn owner_reads_a_page_every_2_mib(file: &Path) -> u64 {
    let path = file.to_string_lossy();
    let positions: Vec<u64> = (2..31).map(|k| k * 2 * 256).collect();
    let reads: Vec<String> = positions
        .iter()
        .map(|block| format!("dd if={path} of=/dev/null bs=4096 count=1 skip={block} status=none"))
        .collect();
    let owner = as_user(OWNER_UID, Path::new("sh"))
        .args(["-c", &reads.join("; sleep 0.05; ")])
        .output()
        .expect("owner reads");
    assert!(owner.status.success(), "{owner:?}");
    positions.len() as u64
}

/// `nobody` rereads its own attached file in a tight loop (two threads, a read(2) of one
/// byte each time) while another user's reader misses at known places in its own file: each
/// of nobody's reads is an event of nobody's own stream, and unpaced they filled the ring
/// every stream shares, so that the other user's misses found no room in it.
#[test]
fn an_owners_tight_loop_on_its_own_file_does_not_crowd_other_users_misses_out_of_the_ring() {
    require_root!();
    let (fs, files) = shared_fs(&[("owners.bin", 64 << 20)]);
    let nobodys = fs.path().join("nobodys.bin");
    write_cold_file(&nobodys, 1 << 20);
    chmod(&nobodys, 0o644);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let id = attach_as(OWNER_UID, daemon.socket(), &files[0], "1MB/s");
    let socket = daemon.socket().to_string_lossy().into_owned();
    let flood = as_user(NOBODY_UID, &binary("abiss-hostile-client"))
        .args([socket.as_str(), "flood", &nobodys.to_string_lossy(), "5"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood");
    std::thread::sleep(Duration::from_secs(1));
    let reads = owner_reads_a_page_every_2_mib(&files[0]);
    let flooded = flood.wait_with_output().expect("the flood");
    assert!(flooded.status.success(), "{flooded:?}");
    std::thread::sleep(Duration::from_millis(300));
    let waited = waits_heard(&daemon, id);
    println!(
        "nobody's flood: {}; abissd heard of {waited} of the owner's {reads} waits",
        String::from_utf8_lossy(&flooded.stdout).trim()
    );
    assert!(
        waited >= reads,
        "abissd heard of {waited} of the owner's {reads} reads that waited for the disk while \
         nobody reread its own attached file in a loop"
    );
}

/// Sets `kernel.io_uring_disabled`; the old value is put back on drop.
struct UringSwitch {
    old: String,
}

const URING_SWITCH: &str = "/proc/sys/kernel/io_uring_disabled";

impl UringSwitch {
    fn set(value: &str) -> Self {
        let old = std::fs::read_to_string(URING_SWITCH).expect("read the sysctl");
        std::fs::write(URING_SWITCH, value).expect("write the sysctl");
        Self {
            old: old.trim().to_owned(),
        }
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(URING_SWITCH, &self.old);
    }
}

#[test]
fn a_prefetch_worker_that_fails_is_started_again_and_its_level_loads() {
    require_root!();
    let (fs, files) = shared_fs(&[("stream.bin", 16 << 20)]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let file = File::open(&files[0]).expect("open");
    // While io_uring is off for everyone, the first stream at level 3 starts its level's
    // worker, whose ring cannot be set up. Kept short: the switch is machine-wide.
    let info = {
        let _off = UringSwitch::set("2");
        let info = client
            .attach(&file, request(10_000_000, 564 << 10, 20, 3))
            .expect("attach");
        std::thread::sleep(Duration::from_millis(200));
        info
    };
    // Loaded again: the window holds at least half its buffer (it refills in requests of a
    // third of it, so it need not be full).
    let loaded = wait_until(Duration::from_secs(10), || {
        daemon
            .streams()
            .iter()
            .any(|s| s.id == info.id && s.locked_bytes >= 282 << 10)
    });
    let stream = daemon.streams().into_iter().find(|s| s.id == info.id);
    assert!(
        loaded,
        "level 3 never loaded after io_uring came back: {stream:?}"
    );
}

#[test]
fn truncating_an_attached_file_logs_its_failed_loads_once() {
    require_root!();
    let (fs, files) = shared_fs(&[("shrinking.bin", 64 << 20)]);
    let mut daemon = Daemon::start_logging(&["--device", &fs.device().path().to_string_lossy()]);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let file = File::open(&files[0]).expect("open");
    let info = client
        .attach(&file, request(10_000_000, 564 << 10, 20, 0))
        .expect("attach");
    std::thread::sleep(Duration::from_millis(300));
    // Truncated under the stream: every load of the window past the new end fails, and the
    // window keeps asking for them at its rate.
    File::options()
        .write(true)
        .open(&files[0])
        .and_then(|f| f.set_len(1 << 20))
        .expect("truncate");
    for step in 1..=30 {
        client
            .position(info.id, step * (1 << 20))
            .expect("position");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(client);
    daemon.stop();
    let log = daemon.log();
    let lines = log
        .lines()
        .filter(|line| line.contains(&format!("stream {}: loading", info.id)))
        .count();
    assert_eq!(
        lines, 1,
        "a truncated file's failed loads in the log:\n{log}"
    );
}
