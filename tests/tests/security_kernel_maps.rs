//! The kernel maps that every user's requests share hold up against one user who fills them
//! (issue 33, finding 6): a user's `io_uring` requests that never complete take only that
//! user's room in the table of followed requests, and a user's many reader processes take only
//! that user's room in the table of readers whose requests are followed.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use abiss_tests::{
    abissctl_as_nobody, as_nobody, attached_id, binary, chmod, daemon_map_dump, require_root,
    wait_until, write_cold_file, Daemon, Ext4Mount, LoopDevice,
};

const MIB: u64 = 1 << 20;

/// A disk over memory that abissd manages, with a file of 1 MiB that `nobody` may read
/// (`nobodys.bin`) and one of `roots_bytes` that only root may (`roots.bin`).
fn two_users_files(roots_bytes: u64) -> (Ext4Mount, Daemon, PathBuf, PathBuf) {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    chmod(fs.path(), 0o755);
    let nobodys = fs.path().join("nobodys.bin");
    let roots = fs.path().join("roots.bin");
    write_cold_file(&nobodys, MIB);
    write_cold_file(&roots, roots_bytes);
    chmod(&nobodys, 0o644);
    (fs, daemon, nobodys, roots)
}

/// `nobody` attaches a file of its own, reads it (so the programs follow its process's
/// `io_uring` requests) and submits 5 000 polls on a pipe nobody writes, which never complete;
/// then root's reader reads root's attached file through `io_uring`. Before, nobody's polls
/// filled the table of followed requests (4 096 for everyone), root's requests found no room,
/// and abissd heard of none of them. Now nobody holds at most 256 of it.
#[test]
fn one_users_stuck_io_uring_requests_do_not_deny_another_users() {
    require_root!();
    let (_fs, daemon, nobodys, roots) = two_users_files(32 * MIB);
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

/// The processes in the daemon's `FILE_READERS` (readers whose `io_uring` requests are
/// followed), by process id.
fn followed_readers(daemon: &Daemon) -> Vec<u32> {
    daemon_map_dump(daemon.pid(), "FILE_READERS")
        .iter()
        .filter_map(|entry| {
            let key: Vec<u8> = entry["key"]
                .as_array()?
                .iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            Some(u32::from_ne_bytes(key.get(..4)?.try_into().ok()?))
        })
        .collect()
}

/// Root reads its attached file once (so the programs follow its process's `io_uring`
/// requests), then `nobody` makes 5 000 processes that each read a page of its own attached
/// file and stay. Before, the table of followed readers was one least-recently-used map of
/// 4 096 for everyone: nobody's readers pushed root's out, and root's `io_uring` reads went
/// unheard until its next plain read. Now each user holds at most 256 of it (exactly 256 here,
/// while they live), and a user's readers that are gone give their room back at abissd's next
/// sweep (every 10 s). And the stream lists at most 64 of them (issue 33, finding 3).
#[test]
fn one_users_many_readers_do_not_push_another_users_reader_out() {
    use std::os::unix::fs::FileExt;
    require_root!();
    let (_fs, daemon, nobodys, roots) = two_users_files(MIB);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let nobodys_text = nobodys.to_string_lossy().into_owned();
    let theirs_id = attached_id(&abissctl_as_nobody(
        &socket,
        &["attach", &nobodys_text, "--rate", "10kB/s"],
    ));
    let _mine = daemon.attach_at_1mb(&roots);
    let me = std::process::id();
    let mut page = [0u8; 4096];
    std::fs::File::open(&roots)
        .and_then(|file| file.read_at(&mut page, 0))
        .expect("read root's file");
    assert!(
        wait_until(Duration::from_secs(3), || followed_readers(&daemon)
            .contains(&me)),
        "root's reader is followed (the premise)"
    );
    // nobody's readers stay alive until told: what they hold is counted while they live.
    let mut made = as_nobody(&binary("abiss-hostile-client"))
        .args([socket.as_str(), "readers", &nobodys_text, "5000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run nobody's readers");
    let mut line = String::new();
    BufReader::new(made.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read what it says");
    assert_eq!(line.trim(), "readers 5000", "nobody's readers all read");
    let followed = followed_readers(&daemon);
    let theirs = followed.iter().filter(|&&tgid| tgid != me).count();
    println!("after nobody's 5000 readers: {theirs} of theirs followed");
    assert!(
        followed.contains(&me),
        "nobody's 5000 readers pushed root's reader out of the followed readers"
    );
    assert_eq!(
        theirs, 256,
        "nobody's 5000 live readers hold {theirs} entries of the table of followed readers"
    );
    // Finding 3: nobody's stream lists at most 64 of its readers (before, every one seen in
    // the last 10 s, each report going over all of them on abissd's one loop).
    let listed = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == theirs_id)
        .map_or(0, |s| s.readers.len());
    println!("nobody's stream lists {listed} readers");
    assert!(
        (1..=64).contains(&listed),
        "nobody's stream lists {listed} of its 5000 readers"
    );
    // nobody's readers end: the next sweep (every 10 s) gives their room back.
    drop(made.stdin.take());
    assert!(made.wait().expect("nobody's readers").success());
    assert!(
        wait_until(Duration::from_secs(25), || followed_readers(&daemon)
            == [me]),
        "nobody's ended readers are still followed: {} entries",
        followed_readers(&daemon).len()
    );
}
