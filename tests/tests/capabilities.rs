//! The optional parts of abiss degrade as documented when their kernel hooks are missing. A
//! kernel without them is simulated by switching them off (`abissd --disable`), the documented
//! way: the programs are then not attached at all, as on an older kernel.

use std::io::Read;
use std::time::{Duration, Instant};

use abiss_tests::{require_root, write_cold_file, Daemon, Ext4Mount, LoopDevice, OLD_KERNEL_ARGS};

#[test]
fn status_says_which_parts_are_off_and_why() {
    require_root!();
    let daemon = Daemon::start_with(&OLD_KERNEL_ARGS);
    let mut client = abiss_client::Client::connect(daemon.socket()).expect("connect");
    let report = client.status_report().expect("status");
    let by_name = |name: &str| {
        report
            .capabilities
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", report.capabilities))
            .clone()
    };
    for name in ["read-tracking", "uring-reports"] {
        let capability = by_name(name);
        assert!(!capability.on, "{name} is off");
        let why = capability.off_because.expect("a reason");
        assert!(why.contains(&format!("--disable {name}")), "{why}");
        assert!(capability.needs.contains("Linux"), "{}", capability.needs);
    }
    // Without page_cache_sync_ra (as before 6.18), page-cache insertions stand in.
    let misses = by_name("miss-raises");
    assert!(misses.on && misses.off_because.is_none(), "{misses:?}");
    let how = misses.stand_in.expect("a stand-in");
    assert!(
        how.contains("--disable miss-raises") && how.contains("mm_filemap_add_to_page_cache"),
        "{how}"
    );
    // This kernel (6.18) has what direct I/O tagging needs.
    assert!(by_name("direct-io-tagging").on);

    let output = daemon.ctl(["status"]);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("read-tracking") && text.contains("OFF") && text.contains("Linux 6.12"),
        "{text}"
    );
    assert!(text.contains("standing in"), "{text}");
}

/// Without `page_cache_sync_ra` (switched off as on a kernel before 6.18), a reader that
/// misses is still counted and raised: the pages it adds to the page cache stand in.
#[test]
fn misses_are_counted_and_raised_through_the_stand_in() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let path = fs.path().join("movie.bin");
    write_cold_file(&path, 32 << 20);
    let daemon = Daemon::start_managing(fs.device().path(), &["--disable", "miss-upgrades"]);
    // (`miss-upgrades` is the part's earlier name, still taken: a configuration written before
    // keeps working.)
    let _stream = daemon.attach_at_1mb(&path);
    // Far past the window: every read of these cold pages misses.
    let mut file = std::fs::File::open(&path).expect("open");
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(24 << 20)).expect("seek");
    let mut chunk = vec![0u8; 64 << 10];
    for _ in 0..16 {
        let n = file.read(&mut chunk).expect("read");
        assert!(n > 0, "file ended");
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    let stream = loop {
        let stream = daemon.streams().remove(0);
        if (stream.misses > 0 && stream.raises > 0) || Instant::now() > deadline {
            break stream;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(stream.misses > 0, "the misses were counted: {stream:?}");
    assert!(stream.raises > 0, "the reader was raised: {stream:?}");
}

/// Reads `bytes` of `path` in 64 KiB reads, as a player that knows nothing of abiss.
fn read_plainly(path: &std::path::Path, bytes: usize) {
    let mut file = std::fs::File::open(path).expect("open");
    let mut chunk = vec![0u8; 64 << 10];
    let mut done = 0;
    while done < bytes {
        let n = file.read(&mut chunk).expect("read");
        assert!(n > 0, "file ended");
        done += n;
    }
}

/// The playout point the daemon believes, after waiting up to 3 s for it to pass `beyond`.
fn playout_point(daemon: &Daemon, beyond: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let point = daemon.streams()[0].playout_point;
        if point > beyond || Instant::now() > deadline {
            return point;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_unmodified_reader_is_followed_only_with_read_tracking() {
    require_root!();
    let read = 4 << 20;
    for (args, followed) in [(&[][..], true), (&OLD_KERNEL_ARGS[..], false)] {
        let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
        let path = fs.path().join("movie.bin");
        write_cold_file(&path, 16 << 20);
        let daemon = Daemon::start_managing(fs.device().path(), args);
        let _stream = daemon.attach_at_1mb(&path);
        read_plainly(&path, read);
        // Waits for the events of all the reads when they move the window, 3 s when not.
        let point = playout_point(&daemon, (read as u64) / 2 - 1);
        if followed {
            assert!(
                point >= (read as u64) / 2,
                "with read tracking the window follows the reader (playout point {point})"
            );
        } else {
            assert_eq!(
                point, 0,
                "without read tracking the daemon does not see an unmodified reader"
            );
        }
    }
}
