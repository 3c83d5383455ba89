//! The kernel maps that every user's requests share hold up against one user who fills them
//! (issue 33, finding 6): a user's `io_uring` requests that never complete take only that
//! user's room in the table of followed requests.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use abiss_tests::{
    as_nobody, binary, chmod, daemon_map_dump, require_root, write_cold_file, Daemon, Ext4Mount,
    LoopDevice,
};

const MIB: u64 = 1 << 20;

/// `nobody` attaches a file of its own, reads it (so the programs follow its process's
/// `io_uring` requests) and submits 5 000 polls on a pipe nobody writes, which never complete;
/// then root's reader reads root's attached file through `io_uring`. Before, nobody's polls
/// filled the table of followed requests (4 096 for everyone), root's requests found no room,
/// and abissd heard of none of them. Now nobody holds at most 256 of it.
#[test]
fn one_users_stuck_io_uring_requests_do_not_deny_another_users() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    chmod(fs.path(), 0o755);
    let nobodys = fs.path().join("nobodys.bin");
    let roots = fs.path().join("roots.bin");
    write_cold_file(&nobodys, MIB);
    write_cold_file(&roots, 32 * MIB);
    chmod(&nobodys, 0o644);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let mut stuck = as_nobody(&binary("abiss-stuck-uring"))
        .args([socket.as_str(), &nobodys.to_string_lossy(), "5000", "8"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the stuck requests");
    let mut line = String::new();
    BufReader::new(stuck.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read what it says");
    assert_eq!(line.trim(), "stuck 5000", "nobody's polls are submitted");
    let followed = daemon_map_dump(daemon.pid(), "URING_INFLIGHT").len();
    println!("nobody's 5000 stuck polls: {followed} followed");

    let id = daemon.attach_at_1mb(&roots);
    let reader = Command::new(binary("abiss-test-reader"))
        .arg(&roots)
        .args(["1000000", "65536", "577536", "2", "--uring"])
        .args(["--start", &(8 * MIB).to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("run the io_uring reader");
    assert!(reader.success(), "the io_uring reader");
    let heard = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .map_or(0, |s| s.uring_requests);
    let _ = stuck.kill();
    let _ = stuck.wait();
    println!("root's io_uring requests abissd heard of: {heard}");
    assert!(
        followed <= 256,
        "nobody holds {followed} entries of the table of followed io_uring requests"
    );
    assert!(
        heard > 0,
        "abissd heard of none of root's io_uring reads while nobody's polls were stuck"
    );
    // Once no file is attached, the maps users filled are emptied: nothing of theirs stays.
    let detached = daemon.ctl(["detach", &id.to_string()]);
    assert!(detached.status.success(), "{detached:?}");
    let maps = [
        "URING_INFLIGHT",
        "URING_USERS",
        "FILE_READERS",
        "READ_REPORT_DUE",
    ];
    let left = || -> Vec<(&str, usize)> {
        maps.iter()
            .map(|&map| (map, daemon_map_dump(daemon.pid(), map).len()))
            .filter(|&(_, entries)| entries > 0)
            .collect()
    };
    // nobody's stream ends with its connection, which the main loop hears of in a moment.
    abiss_tests::wait_until(Duration::from_secs(3), || left().is_empty());
    assert_eq!(left(), Vec::new(), "entries kept with no file attached");
}
