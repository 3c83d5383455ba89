//! What a stream's window has passed is let go: unlocked, and no longer mapped by abissd. The
//! pages stay in the page cache as anyone's would, so abissd's resident set holds the windows
//! only, and a reader can drop what it played (`POSIX_FADV_DONTNEED` skips mapped pages).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::Duration;

use abiss_client::Client;

use abiss_tests::{
    read_request, require_root, resident_bytes, wait_until, write_cold_file, Daemon, Ext4Mount,
    LoopDevice,
};

const BUFFER: u64 = 512 << 10;
const FILE_BYTES: u64 = 64 << 20;
/// How far the player moves: many windows' worth.
const PLAYED: u64 = 32 << 20;

/// The bytes of `path`'s mappings resident in `pid`'s address space (`/proc/PID/smaps`).
fn mapped_resident_bytes(pid: u32, path: &std::path::Path) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("read smaps");
    let wanted = path.to_string_lossy();
    let mut in_mapping = false;
    let mut total_kib = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        // A mapping's header starts with its address range; its fields start with a name.
        if first.contains('-') && !first.ends_with(':') {
            in_mapping = line.ends_with(wanted.as_ref());
        } else if in_mapping && first == "Rss:" {
            let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
            total_kib += kib;
        }
    }
    total_kib << 10
}

#[test]
fn pages_behind_the_window_are_neither_locked_nor_mapped_by_abissd() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(
        fs.device().path(),
        &["--capacity", "400MB/s", "--realtime-share", "50"],
    );
    let path = fs.path().join("movie.bin");
    write_cold_file(&path, FILE_BYTES);
    let mut client = Client::connect(daemon.socket()).expect("connect");
    let request = read_request(10_000_000, BUFFER, 16);
    let id = client
        .attach(File::open(&path).expect("open"), request)
        .expect("attach")
        .id;
    client
        .wait_loaded(id, Duration::from_secs(10))
        .expect("the first window loads");

    // The player moves through 32 MiB, a window at a time, as fast as the credit lets it.
    let mut point = 0;
    while point < PLAYED {
        point += BUFFER / 2;
        client.position(id, point).expect("position");
        std::thread::sleep(Duration::from_millis(30));
    }
    let streams = client.list().expect("list");
    let stream = streams.iter().find(|s| s.id == id).expect("listed");
    assert!(
        stream.window_start >= PLAYED / 2,
        "the window followed the player: it starts at {} after {point} bytes",
        stream.window_start
    );

    // abissd maps the windows only: a window and a batch or two in flight, not what was played.
    let held = mapped_resident_bytes(daemon.pid(), &path);
    let bound = 2 * BUFFER + (2 << 20);
    assert!(
        held <= bound,
        "abissd keeps {held} bytes of the file mapped after the player moved {point} bytes \
         (its window is {BUFFER}); at most {bound} expected"
    );

    // And a reader can drop what it played: nothing of it is mapped or locked any more.
    let file = File::open(&path).expect("open");
    let played = stream.window_start.min(PLAYED) / 2;
    assert!(
        resident_bytes(&file, 0, played) > 0,
        "the played pages are in the page cache before they are dropped"
    );
    nix::fcntl::posix_fadvise(
        file.as_raw_fd(),
        0,
        i64::try_from(played).unwrap(),
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .expect("fadvise");
    assert!(
        wait_until(Duration::from_secs(2), || resident_bytes(&file, 0, played)
            == 0),
        "{} of the first {played} played bytes stayed resident after POSIX_FADV_DONTNEED",
        resident_bytes(&file, 0, played)
    );
}
