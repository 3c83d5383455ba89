//! Several streams of one file, on the real kernel: viewers of one popular file at different
//! points each get their own window, which follows their own reads; a viewer leaving keeps the
//! others served; a second user's stream on the same file takes only that user's reads; and a
//! file has one recording and a bounded number of streams. And what one co-owner of a file can
//! do to another (issue 33, finding 4): not silence the other's reads with a loop of its own,
//! not turn off the other's raises with a stream of a low level, not take every slot.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use abiss_proto::StreamId;
use abiss_tests::{
    abissctl_as_nobody, as_nobody, assert_fails, attached_id, binary, chmod, require_root,
    resident_bytes, wait_for_ioprio, wait_until, write_cold_file, Daemon, Ext4Mount, LoopDevice,
};

const MIB: u64 = 1 << 20;
const BUFFER: u64 = 564 * 1024;
/// The window moves in batches of 20 pages.
const BATCH: u64 = 20 * 4096;

/// Reads `mib` MiB of `path` from MiB `from` in a process of its own (as a player is), as root
/// or as `nobody`.
fn read_in_a_process(path: &Path, from: u64, mib: u64, nobody: bool) {
    let dd = Path::new("/usr/bin/dd");
    let mut command = if nobody {
        as_nobody(dd)
    } else {
        Command::new(dd)
    };
    let status = command
        .arg(format!("if={}", path.display()))
        .args([
            "of=/dev/null",
            "bs=64k",
            "status=none",
            &format!("skip={}", from * 16),
            &format!("count={}", mib * 16),
        ])
        .status()
        .expect("run dd");
    assert!(status.success(), "dd from MiB {from}");
}

/// The stream's playout point.
fn point(daemon: &Daemon, id: StreamId) -> u64 {
    daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .map_or(0, |s| s.playout_point)
}

#[test]
fn viewers_of_one_file_each_have_their_own_window() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &["--capacity", "40MB/s"]);
    chmod(fs.path(), 0o755);
    let path = fs.path().join("popular.ts");
    write_cold_file(&path, 32 * MIB);
    chmod(&path, 0o644);
    let file = std::fs::File::open(&path).expect("open");

    // Two viewers: two streams of one file (it was refused as "already attached" before).
    let first = daemon.attach_at_1mb(&path);
    let second = daemon.attach_at_1mb(&path);
    assert_ne!(first, second);
    read_in_a_process(&path, 0, 2, false);
    read_in_a_process(&path, 16, 2, false);
    assert!(
        wait_until(Duration::from_secs(5), || point(&daemon, first) == 2 * MIB
            && point(&daemon, second) == 18 * MIB),
        "each window follows its own viewer: {:?}",
        daemon.streams()
    );
    // Each holds what its window promises ahead of its own viewer, resident: at least half a
    // buffer (a window asks for more before its reader comes that close to what is loaded).
    // A full buffer past the point is not promised: the window starts at a batch boundary
    // behind the reader, and it loads in thirds of the buffer as the credit comes back.
    assert!(
        wait_until(Duration::from_secs(5), || daemon.streams().iter().all(
            |s| {
                let ahead = s.loaded_end.saturating_sub(s.playout_point);
                ahead >= BUFFER / 2 && resident_bytes(&file, s.playout_point, ahead) == ahead
            }
        )),
        "both windows loaded ahead of their viewers: {:?}",
        daemon.streams()
    );
    // And locked, once the credit a dash through 2 MiB spent has come back at the rate: all
    // but less than a load's worth (a third of the buffer), which the window loads once its
    // reader moves on (it gathers its growth into loads of a third of the buffer).
    assert!(
        wait_until(Duration::from_secs(5), || daemon.streams().iter().all(
            |s| s.locked_bytes + BUFFER / 3 > BUFFER
                && s.window_start <= s.playout_point
                && s.playout_point - s.window_start < BATCH
        )),
        "each window locked from its own viewer on: {:?}",
        daemon.streams()
    );

    // The first viewer leaves; the second keeps its window, and its reads still steer it.
    assert!(daemon.ctl(["detach", &first.to_string()]).status.success());
    read_in_a_process(&path, 18, 2, false);
    assert!(
        wait_until(Duration::from_secs(5), || point(&daemon, second)
            == 20 * MIB),
        "the remaining stream still follows its reader: {:?}",
        daemon.streams()
    );

    // Another user attaches the same file with a descriptor of their own: their stream takes
    // their reads, and root's stream is not moved by them.
    let socket = daemon.socket().to_string_lossy().into_owned();
    let path_text = path.to_string_lossy().into_owned();
    let theirs = attached_id(&abissctl_as_nobody(
        &socket,
        &[
            "attach", &path_text, "--rate", "1MB/s", "--buffer", "564KiB",
        ],
    ));
    read_in_a_process(&path, 8, 1, true);
    read_in_a_process(&path, 20, 1, true);
    assert!(
        wait_until(Duration::from_secs(5), || point(&daemon, theirs)
            == 21 * MIB),
        "nobody's reads steer nobody's stream: {:?}",
        daemon.streams()
    );
    assert_eq!(point(&daemon, second), 20 * MIB, "root's stream stayed");
    // Nobody cannot end root's stream through the shared file (to nobody it is not there).
    let refused = abissctl_as_nobody(&socket, &["detach", &second.to_string()]);
    assert_eq!(refused.status.code(), Some(10), "{refused:?}");

    refuses_a_second_recording_and_a_seventeenth_stream(&daemon, &path_text);
}

#[test]
fn a_viewer_under_abissctl_run_steers_its_own_window_from_its_first_read() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &["--capacity", "40MB/s"]);
    let path = fs.path().join("popular.ts");
    write_cold_file(&path, 32 * MIB);
    // A viewer whose player has not read yet (its window is at the start of the file).
    let waiting = daemon.attach_at_1mb(&path);
    // Another viewer starts playing 16 MiB in, as a player does after a seek or a resume:
    // its first read is a jump. `run` said which process is its reader before it read.
    let skip = format!("skip={}", 16 * 16);
    let path_text = path.to_string_lossy().into_owned();
    let input = format!("if={path_text}");
    let output = daemon.ctl([
        "run",
        "--rate",
        "1MB/s",
        "--buffer",
        "564KiB",
        &path_text,
        "--",
        "/usr/bin/dd",
        &input,
        "of=/dev/null",
        "bs=64k",
        &skip,
        "count=32",
        "status=none",
    ]);
    assert!(output.status.success(), "{output:?}");
    // The jump was the second viewer's: the waiting viewer's window did not follow it.
    assert_eq!(
        point(&daemon, waiting),
        0,
        "the waiting viewer's window stays at the start: {:?}",
        daemon.streams()
    );
}

/// One recording per file; several of one's own streams are named by id, not by file; at most
/// 16 streams of one file, and a refusal changes nothing.
fn refuses_a_second_recording_and_a_seventeenth_stream(daemon: &Daemon, path_text: &str) {
    let recording = daemon.ctl([
        "attach", path_text, "--write", "--rate", "1MB/s", "--buffer", "1MiB",
    ]);
    let recording = attached_id(&recording);
    assert_fails(
        &daemon.ctl([
            "attach", path_text, "--write", "--rate", "1MB/s", "--buffer", "1MiB",
        ]),
        9,
        &format!("already being recorded by stream {recording}"),
    );
    assert_fails(&daemon.ctl(["detach", path_text]), 8, "name one by its id");

    // At most 16 streams of one file: the 17th is refused and nothing changes.
    let before = daemon.streams().len();
    for _ in before..16 {
        let _ = attached_id(&daemon.ctl([
            "attach", path_text, "--rate", "10kB/s", "--buffer", "160KiB",
        ]));
    }
    assert_fails(
        &daemon.ctl([
            "attach", path_text, "--rate", "10kB/s", "--buffer", "160KiB",
        ]),
        9,
        "the most one file may",
    );
    assert_eq!(daemon.streams().len(), 16);
}

/// A managed ext4 file system with one cold file of `mib` MiB everybody may read.
fn one_shared_file(mib: u64) -> (Ext4Mount, Daemon, std::path::PathBuf) {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &["--capacity", "40MB/s"]);
    chmod(fs.path(), 0o755);
    let path = fs.path().join("popular.ts");
    write_cold_file(&path, mib * MIB);
    chmod(&path, 0o644);
    (fs, daemon, path)
}

/// `nobody` rereads one cached byte of the file in a tight loop (two threads) through a stream
/// of its own, while root, the other owner, reads 2 MiB of it that are in the page cache: each
/// of root's reads is a report from the kernel, and with one token bucket per file nobody's
/// loop spent all of it, so that root's reads went unreported and its window stayed behind.
#[test]
fn a_co_owners_tight_loop_does_not_silence_the_other_owners_reads() {
    require_root!();
    let (_fs, daemon, path) = one_shared_file(32);
    // MiB 8 to 10 in the page cache before anything is attached: root's reads of them hit.
    read_in_a_process(&path, 8, 2, false);
    let id = daemon.attach_at_1mb(&path);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let flood = as_nobody(&binary("abiss-hostile-client"))
        .args([socket.as_str(), "flood", &path.to_string_lossy(), "4"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood");
    std::thread::sleep(Duration::from_secs(1));
    read_in_a_process(&path, 8, 2, false);
    let followed = wait_until(Duration::from_secs(2), || point(&daemon, id) == 10 * MIB);
    let flooded = flood.wait_with_output().expect("the flood");
    assert!(flooded.status.success(), "{flooded:?}");
    println!(
        "nobody's flood: {}; root's point {} MiB",
        String::from_utf8_lossy(&flooded.stdout).trim(),
        point(&daemon, id) / MIB
    );
    assert!(
        followed,
        "root's window follows its own cached reads while nobody rereads the file in a loop: \
         {:?}",
        daemon.streams()
    );
}

/// Best effort 5, encoded; and real time 0, what a level-0 raise sets.
const BE5: u16 = (2 << 13) | 5;
const RT0: u16 = 1 << 13;

/// `nobody` attaches the file at level 7, the least urgent, and root at level 0; root's reader
/// reads it with `O_DIRECT` at best effort 5, so its requests never miss the page cache and
/// only their queueing below the file's level tells abissd to raise it. The file's level was
/// the least urgent of its streams' (7), and nothing is queued below 7: root's reader was
/// never raised.
#[test]
fn a_co_owners_level_7_stream_does_not_turn_off_the_other_owners_raises() {
    require_root!();
    let (_fs, daemon, path) = one_shared_file(32);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let path_text = path.to_string_lossy().into_owned();
    let _theirs = attached_id(&abissctl_as_nobody(
        &socket,
        &["attach", &path_text, "--rate", "10kB/s", "--priority", "7"],
    ));
    let _root = daemon.attach_at_1mb(&path);
    let reader = Command::new(binary("abiss-test-reader"))
        .arg(&path)
        .args([
            "1000000", "65536", "577536", "3", "--direct", "--ioprio", "2/5",
        ])
        .args(["--start", &(16 * MIB).to_string()])
        .stdout(Stdio::null())
        .spawn()
        .expect("start the test reader");
    let raised = wait_for_ioprio(reader.id(), RT0, Duration::from_secs(2));
    let output = reader.wait_with_output().expect("the test reader");
    assert!(output.status.success(), "{output:?}");
    assert!(
        raised.is_some(),
        "root's direct reader is raised to its level 0 (it stayed at {BE5:#x}) although nobody \
         has a level-7 stream of the file"
    );
}

/// `nobody` attaches the file four times (persistent, 1 kB/s each): the fifth is refused with
/// one sentence and changes nothing, and another user (root) still has the file's other slots.
/// Before, one user could take all 16 and lock everyone else out of a popular file.
#[test]
fn one_user_cannot_take_every_slot_of_a_file() {
    require_root!();
    let (_fs, daemon, path) = one_shared_file(8);
    let socket = daemon.socket().to_string_lossy().into_owned();
    let path_text = path.to_string_lossy().into_owned();
    let attach = [
        "attach", &path_text, "--rate", "1kB/s", "--buffer", "160KiB",
    ];
    for _ in 0..4 {
        let _ = attached_id(&abissctl_as_nobody(&socket, &attach));
    }
    assert_fails(
        &abissctl_as_nobody(&socket, &attach),
        9,
        "the most one user may have of one file",
    );
    assert_eq!(daemon.streams().len(), 4, "the refusal changed nothing");
    for _ in 0..4 {
        let _ = attached_id(&daemon.ctl(attach));
    }
    assert_eq!(daemon.streams().len(), 8);
}
