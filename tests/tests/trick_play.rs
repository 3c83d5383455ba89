//! A rate change is a request on the stream (fast-forward, slow motion), not a detach and an
//! attach: from then on the window moves at the new rate. The disk's admission decides, only
//! the owner (or root) may ask, and a refusal changes nothing. A seek is the player's own
//! jump: its first read waits for the new window, which abissd counts apart from misses.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, Instant};

use abiss_client::{Client, ClientError};
use abiss_proto::{ByteRate, StreamId, StreamTarget};
use abiss_tests::{
    abissctl_as_nobody, read_request, require_root, resident_bytes, wait_until, write_cold_file,
    Daemon, Ext4Mount, LoopDevice,
};

const BUFFER: u64 = 512 * 1024;

/// Moves the application's playout point forward at `bytes_per_sec` for `secs` seconds (a
/// position message every 50 ms, as the client library sends them) and returns the new point
/// and how many bytes the daemon prefetched meanwhile.
fn play(client: &mut Client, id: StreamId, from: u64, bytes_per_sec: u64, secs: u64) -> (u64, u64) {
    let before = prefetched(client, id);
    let start = Instant::now();
    let mut point = from;
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(50));
        point = from + bytes_per_sec * u64::try_from(start.elapsed().as_millis()).unwrap() / 1000;
        client.position(id, point).expect("position");
    }
    // Loads already queued finish within a few ms on a memory-backed disk.
    std::thread::sleep(Duration::from_millis(200));
    (point, prefetched(client, id) - before)
}

fn prefetched(client: &mut Client, id: StreamId) -> u64 {
    stream(client, id).prefetched_bytes
}

fn stream(client: &mut Client, id: StreamId) -> abiss_proto::StreamInfo {
    client
        .list()
        .expect("list")
        .into_iter()
        .find(|s| s.id == id)
        .expect("the stream is listed")
}

#[test]
fn a_rate_change_moves_the_window_at_the_new_rate_and_refusals_change_nothing() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    // 10 MB/s for real-time streams.
    let daemon = Daemon::start_managing(
        fs.device().path(),
        &["--capacity", "20MB/s", "--realtime-share", "50"],
    );
    let path = fs.path().join("movie.bin");
    write_cold_file(&path, 128 << 20);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let request = read_request(100_000, BUFFER, 16);
    let id = client
        .attach(File::open(&path).expect("open"), request)
        .expect("attach")
        .id;
    std::thread::sleep(Duration::from_millis(300));

    // A player at 2 MB/s on a 100 kB/s stream: after the credit left from the start (one
    // buffer), the window moves at 100 kB/s.
    let (point, slow) = play(&mut client, id, 0, 2_000_000, 2);
    let slow_bound = BUFFER + 2 * 100_000 + 128 * 1024;
    assert!(
        slow <= slow_bound,
        "at 100 kB/s the window moved {slow} B in 2 s (at most {slow_bound})"
    );

    // Fast-forward: 4 MB/s, admitted on the disk; the window now keeps up with the player.
    let info = client
        .set_rate(StreamTarget::Id(id), ByteRate(4_000_000))
        .expect("4 MB/s fits in the disk's 10 MB/s");
    assert_eq!(info.rate, ByteRate(4_000_000));
    let (_, fast) = play(&mut client, id, point, 2_000_000, 2);
    eprintln!("prefetched in 2 s: {slow} B at 100 kB/s, {fast} B at 4 MB/s");
    assert!(
        fast >= 3_000_000,
        "at 4 MB/s the window followed a 2 MB/s player: {fast} B in 2 s"
    );

    // More than the disk's real-time share: refused, and the stream keeps 4 MB/s.
    match client.set_rate(StreamTarget::Id(id), ByteRate(20_000_000)) {
        Err(ClientError::Refused { message }) => {
            assert!(message.contains("B/s"), "{message}");
        }
        other => panic!("20 MB/s must be refused: {other:?}"),
    }
    assert_eq!(stream(&mut client, id).rate, ByteRate(4_000_000));

    // Another user may not change root's stream (to them it is not there); nor may anyone
    // ask for nothing.
    let output = abissctl_as_nobody(daemon.socket(), &["set-rate", &id.to_string(), "1MB/s"]);
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not attached"), "{stderr}");
    let output = daemon.ctl(["set-rate", &id.to_string(), "0B/s"]);
    assert!(!output.status.success(), "{output:?}");
    assert_eq!(stream(&mut client, id).rate, ByteRate(4_000_000));

    // The owner's command line: by file, in bit rates.
    let output = daemon.ctl(["set-rate", path.to_str().unwrap(), "8Mbit/s"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stream(&mut client, id).rate, ByteRate(1_000_000));
}

/// Reads `reads` pieces of 64 KiB from `file`'s current offset, one every 64 ms (1 MB/s).
fn read_at_the_rate(file: &mut File, reads: u32) {
    let mut piece = vec![0u8; 64 * 1024];
    let start = Instant::now();
    for k in 1..=reads {
        file.read_exact(&mut piece).expect("read");
        let due = start + Duration::from_millis(64) * k;
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
}

/// An unmodified player reads on at the stream's rate, jumps 60 MiB ahead and reads on: the
/// read at the new point waits for the disk (nothing can have loaded it), and abissd counts it
/// as the seek's wait, not a deadline miss. Reading on from there at the rate, the refilled
/// window holds every read: no miss at all. Before seek waits were counted apart, the jump's
/// read counted as a miss and `list` advised a larger buffer for it.
#[test]
fn a_jumps_own_wait_is_the_seeks_and_reading_on_misses_nothing() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = fs.path().join("movie.bin");
    write_cold_file(&path, 128 << 20);
    let id = daemon.attach_at_1mb(&path);
    std::thread::sleep(Duration::from_millis(300));
    let mut file = File::open(&path).expect("open");
    read_at_the_rate(&mut file, 8);
    file.seek(SeekFrom::Start(64 << 20)).expect("seek");
    read_at_the_rate(&mut file, 24);
    // The kernel's records of the last reads arrive within a few ms.
    std::thread::sleep(Duration::from_millis(300));
    let info = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .expect("the stream");
    assert!(
        info.seek_waits >= 1,
        "the read after the jump waited for the disk: {info:?}"
    );
    assert_eq!(info.misses, 0, "{info:?}");
    assert!(info.suggestion.is_none(), "{info:?}");
    let list = daemon.ctl(["list"]);
    let out = String::from_utf8_lossy(&list.stdout);
    assert!(
        out.contains("waited for the window to refill after a seek"),
        "{out}"
    );
}

/// A player looking for its start by bisection (ffmpeg: 132 KiB at each point, then a jump)
/// loads one window per point, no preroll; once it reads on from the point it settles on, the
/// stream's preroll is loaded and locked at once (at the rate, 8 MiB would take 8 s) and the
/// player plays through it without a miss; the next seek lets it go. Before, a viewer's start
/// burst after its jump read past the window and missed.
#[test]
fn a_preroll_follows_the_player_to_where_it_settles_after_its_seeks() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = fs.path().join("movie.ts");
    write_cold_file(&path, 128 << 20);
    let (window, preroll) = (BUFFER, 8u64 << 20);
    let output = daemon.ctl([
        "attach",
        path.to_str().unwrap(),
        "--rate",
        "1MB/s",
        "--buffer",
        "512KiB",
        "--preroll",
        "8MiB",
    ]);
    assert!(output.status.success(), "{output:?}");
    let stream = || daemon.streams().first().cloned().expect("the stream");
    assert!(wait_until(Duration::from_secs(3), || stream().locked_bytes >= preroll));
    let mut file = File::open(&path).expect("open");
    let mut probe = vec![0u8; 132 << 10];
    for point in [64u64 << 20, 32 << 20, 48 << 20, 40 << 20] {
        file.seek(SeekFrom::Start(point)).expect("seek");
        file.read_exact(&mut probe).expect("probe");
        std::thread::sleep(Duration::from_millis(100));
        let locked = stream().locked_bytes;
        assert!(
            locked <= window + (512 << 10),
            "a probe at {point} locked {locked} bytes: no preroll while the player looks"
        );
    }
    // The player settles on 44 MiB and plays from there at 1 MB/s.
    let settled = 44u64 << 20;
    file.seek(SeekFrom::Start(settled)).expect("seek");
    read_at_the_rate(&mut file, 5);
    // Past the window, short of the preroll's end (the window's start moved with the reads).
    let ahead = preroll - window - (1 << 20);
    assert!(
        wait_until(Duration::from_secs(2), || resident_bytes(
            &file,
            settled + window,
            ahead
        ) == ahead),
        "the preroll after the seek is loaded at once ({} of {ahead} bytes resident)",
        resident_bytes(&file, settled + window, ahead),
    );
    read_at_the_rate(&mut file, 32);
    std::thread::sleep(Duration::from_millis(300));
    let info = stream();
    assert_eq!(info.misses, 0, "{info:?}");
    assert!(
        info.locked_bytes >= preroll - (3 << 20),
        "what it has not passed stays locked: {info:?}"
    );
    // The next seek lets the preroll go.
    file.seek(SeekFrom::Start(100 << 20)).expect("seek");
    file.read_exact(&mut probe).expect("read");
    assert!(
        wait_until(Duration::from_secs(2), || stream().locked_bytes
            <= window + (512 << 10)),
        "a seek lets the preroll go ({} locked)",
        stream().locked_bytes
    );
}
