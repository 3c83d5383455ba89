//! Start-up fills are bounded per user (issue 9, finding 4): an attach/detach loop on a tiny
//! reservation must not buy a full buffer of real-time reads per attach.
//!
//! What is measured is what the product controls: the bytes the disk read while `nobody`
//! attached and detached cold files, from the disk's own counters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use abiss_tests::{abissctl_as_nobody, as_nobody, disk_bytes_read, wait_until};
use abiss_tests::{require_root, write_cold_file, Daemon, Ext4Mount, LoopDevice};

/// What the daemon's per-user start-up allowance holds and gives back (its defaults:
/// `BurstLimits::DEFAULT`).
const USER_BURST_BYTES: u64 = 32 << 20;
const USER_BURST_RATE_BPS: u64 = 1 << 20;

/// Half a second after the loop (for loads already issued to land): the seconds since
/// `started`, the bytes `disk` read since its count was `before`, and what the user's
/// allowance let them read in that time.
fn read_since(started: Instant, disk: &str, before: u64) -> (f64, u64, u64) {
    std::thread::sleep(Duration::from_millis(500));
    let elapsed = started.elapsed().as_secs_f64();
    let read = disk_bytes_read(disk) - before;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a byte bound from seconds"
    )]
    let allowed = USER_BURST_BYTES + (USER_BURST_RATE_BPS as f64 * elapsed) as u64;
    (elapsed, read, allowed)
}

#[test]
fn an_attach_detach_loop_gets_no_more_start_up_reads_than_the_users_allowance() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    std::fs::set_permissions(
        fs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // 60 cold files of 2 MiB: each attach with a 2 MiB buffer wants 4 MiB of start-up credit
    // (a fill and a seek refill) and would read its whole file at once.
    let files: Vec<PathBuf> = (0..60)
        .map(|i| {
            let path = fs.path().join(format!("clip-{i}.bin"));
            write_cold_file(&path, 2 << 20);
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
                .unwrap();
            path
        })
        .collect();
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let disk = fs.device().name();
    let before = disk_bytes_read(&disk);
    let started = Instant::now();
    let mut told = 0;
    for file in &files {
        let path = file.to_string_lossy().into_owned();
        let attached = abissctl_as_nobody(
            daemon.socket(),
            &["attach", &path, "--rate", "1000", "--buffer", "2MiB"],
        );
        assert!(attached.status.success(), "{attached:?}");
        if String::from_utf8_lossy(&attached.stderr).contains("start-up allowance is used up") {
            told += 1;
        }
        let detached = abissctl_as_nobody(daemon.socket(), &["detach", &path]);
        assert!(detached.status.success(), "{detached:?}");
    }
    // Loads already issued finish after their detach; let them land before counting.
    let (elapsed, read, allowed) = read_since(started, &disk, before);
    // Readahead may read up to one window (128 KiB) past a load; allow it per file.
    let slack = 60 * (128 << 10);
    println!(
        "60 attach/detach cycles by nobody in {elapsed:.1} s: the disk read {} MiB \
         (allowance {} MiB; without it 120 MiB); {told} attaches were told the allowance \
         was used up",
        read >> 20,
        allowed >> 20
    );
    // The user is told, and the attach does not hang waiting for a window that fills slowly.
    assert!(
        told > 0,
        "no attach said its start-up allowance was used up"
    );
    assert!(
        elapsed < 60.0,
        "60 attach/detach cycles took {elapsed:.0} s"
    );
    assert!(
        read <= allowed + slack,
        "an attach/detach loop read {read} bytes in {elapsed:.1} s; the allowance is {allowed}"
    );
    // Root's streams are exempt: its attach still fills at once.
    let root_file = fs.path().join("root.bin");
    write_cold_file(&root_file, 2 << 20);
    let before = disk_bytes_read(&disk);
    let out = daemon.ctl([
        "attach",
        root_file.to_str().unwrap(),
        "--rate",
        "1000",
        "--buffer",
        "2MiB",
    ]);
    assert!(out.status.success(), "{out:?}");
    let filled = abiss_tests::wait_until(std::time::Duration::from_secs(5), || {
        disk_bytes_read(&disk) - before >= 2 << 20
    });
    assert!(filled, "root's stream was not filled at once");
}

/// A seek refills the new window at once from the owner's start-up allowance, instead of
/// leaving it thin until the credit comes back at the rate; a seek loop gets no more than
/// that allowance.
#[test]
fn seek_refills_come_from_the_users_allowance_and_a_seek_loop_gets_no_more() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 512));
    std::fs::set_permissions(
        fs.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = fs.path().join("long.bin");
    write_cold_file(&path, 320 << 20);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let path_text = path.to_string_lossy().into_owned();
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let disk = fs.device().name();
    let before = disk_bytes_read(&disk);
    let started = Instant::now();
    // 1 kB/s with a 2 MiB buffer: its credit comes back at 1 kB/s, so a window refilled from
    // the credit alone would take half an hour.
    let attached = abissctl_as_nobody(
        daemon.socket(),
        &["attach", &path_text, "--rate", "1000", "--buffer", "2MiB"],
    );
    assert!(attached.status.success(), "{attached:?}");
    let read_at = |mib: u64| {
        let status = as_nobody(std::path::Path::new("/usr/bin/dd"))
            .arg(format!("if={path_text}"))
            .args(["of=/dev/null", "bs=4k", "count=1", "status=none"])
            .arg(format!("skip={}", mib * 256))
            .status()
            .expect("dd as nobody");
        assert!(status.success());
    };
    let locked = || daemon.streams().first().map_or(0, |s| s.locked_bytes);
    // Two seeks: the first spends the banked credit, the second is refilled from the
    // allowance, at once.
    read_at(40);
    read_at(80);
    assert!(
        wait_until(Duration::from_secs(3), || locked()
            >= (2 << 20) - (80 << 10)),
        "the window after the second seek filled at once: {:?}",
        daemon.streams()
    );
    // A seek loop: 100 seeks of 3 MiB each would refill 200 MiB.
    for i in 0..100 {
        read_at(100 + 3 * i);
    }
    let (elapsed, read, allowed) = read_since(started, &disk, before);
    // Each dd's own read, with the kernel's readahead (up to 128 KiB), is not the stream's.
    let own_reads = 102 * (128 << 10);
    println!(
        "102 seeks by nobody in {elapsed:.1} s: the disk read {} MiB (allowance {} MiB)",
        read >> 20,
        allowed >> 20
    );
    assert!(
        read <= allowed + own_reads,
        "a seek loop read {read} bytes in {elapsed:.1} s; the allowance is {allowed}"
    );
}
