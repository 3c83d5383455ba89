//! A raise is paid for by its stream and its user, not by its thread (issue 33, findings 1 and
//! 7): a stream's raised threads together read its file at real time for what the stream was
//! admitted for, and past that their user pays out of their start-up allowance, then owes; a
//! user holds a bounded number of raises at once. All of it as `nobody`, through the hostile
//! client (`abiss_tests::hostile_raises`).

use std::path::{Path, PathBuf};

use abiss_daemon::policy::raise::{MAX_RAISED_PER_STREAM, MAX_RAISED_PER_USER};
use abiss_tests::{as_nobody, binary, chmod, require_root, write_cold_file, Daemon};
use abiss_tests::{Ext4Mount, LoopDevice};

const MIB: u64 = 1 << 20;

/// A managed disk over memory with a cold file of `bytes` anyone may read, and abissd.
fn setup(bytes: u64) -> (Ext4Mount, PathBuf, Daemon) {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    chmod(fs.path(), 0o755);
    let file = fs.path().join("film.bin");
    write_cold_file(&file, bytes);
    chmod(&file, 0o644);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    (fs, file, daemon)
}

/// The hostile client's `mode` on `file` with `number`, as nobody; what it printed.
fn hostile(daemon: &Daemon, mode: &str, file: &Path, number: u32) -> String {
    let output = as_nobody(&binary("abiss-hostile-client"))
        .arg(daemon.socket())
        .args([mode, &file.to_string_lossy(), &number.to_string()])
        .output()
        .expect("run the hostile client");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A 1 B/s stream of nobody's whose 64 short-lived threads are each announced as its reader
/// and read 4 MiB of its file with `O_DIRECT` (4 at a time, a wave every 500 ms) reads at real
/// time no more than the stream was admitted for (64 KiB of buffer, 4 MiB of slack, a few
/// bytes of rate) and what nobody's start-up allowance pays for (32 MiB and 1 MiB/s back,
/// 1 MiB lent), plus the two waves that may come before abissd's check finds nobody owes;
/// after that, nobody owes and no thread of theirs is raised. Before, each raise was held
/// to 4 MiB of its own, and every thread read its 4 MiB at real time: 256 MiB.
#[test]
fn a_streams_short_lived_raised_threads_read_no_more_at_real_time_than_it_and_its_user_pay_for() {
    require_root!();
    let (_fs, file, daemon) = setup(64 * MIB);
    let said = hostile(&daemon, "direct", &file, 64);
    println!("{said}");
    let words: Vec<&str> = said.split_whitespace().collect();
    let [_, rt_kib, _, raised, _, count, _, then] = words.as_slice() else {
        panic!("unexpected answer: {said}");
    };
    let rt_kib: u64 = rt_kib.parse().expect("KiB");
    assert_eq!(*count, "64");
    assert!(
        raised.parse::<u32>().expect("raised") >= 1,
        "the first threads are raised (the premise): {said}"
    );
    // The stream's 4 MiB + 64 KiB, the user's 32 MiB and what came back in the 2 s before
    // it owed, 1 MiB lent, and two waves of 4 × 4 MiB.
    let bound_kib = (4 * MIB + 64 * 1024 + 35 * MIB + 32 * MIB) >> 10;
    assert!(
        rt_kib <= bound_kib,
        "{rt_kib} KiB read at real time, more than {bound_kib} KiB: {said}"
    );
    assert_eq!(*then, "false", "a user who owes was raised again: {said}");
}

/// Three streams of nobody's, 32 threads announced as readers of each: one stream holds
/// `MAX_RAISED_PER_STREAM` raises, one user `MAX_RAISED_PER_USER` over all their streams.
/// Before, nobody held 32 per stream, 1 024 over their 32 streams (and 32 adopted tasks each).
#[test]
fn a_user_holds_at_most_their_bound_of_raises_over_all_their_streams() {
    require_root!();
    let (_fs, file, daemon) = setup(MIB);
    let said = hostile(&daemon, "users", &file, 3);
    assert_eq!(MAX_RAISED_PER_STREAM, 32, "the test asks for 32 per stream");
    assert_eq!(said, format!("raised {MAX_RAISED_PER_USER} of 96"));
}
