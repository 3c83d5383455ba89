//! Issue 36: a direct recording's ring is abissd's to lock. `abissctl record` hands its ring
//! (a sealed memfd) to abissd, which locks it against the stream's locked-memory budget, so a
//! user whose own `RLIMIT_MEMLOCK` is far below the ring records from locked memory all the
//! same, and abissd lets it go when the stream ends. The refusals (a ring that is not a
//! sealed, touched memfd within the stream's budget) are unit-tested in
//! `scheduler-user/src/stream/recorder_ring.rs`; the fuzz test sends rings with hostile requests.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use abiss_tests::{
    as_nobody, binary, chmod, locked_bytes_of, require_root, wait_until, Daemon, Ext4Mount,
    LoopDevice,
};

const MIB: u64 = 1 << 20;

#[test]
fn abissd_locks_a_recorders_ring_beyond_the_users_own_limit_and_lets_it_go_at_the_end() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    chmod(fs.path(), 0o777);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let before = locked_bytes_of(daemon.pid());
    let file = fs.path().join("rec.ts");
    // nobody, allowed to lock 64 KiB of its own, records with a 4 MiB ring.
    let mut recorder = as_nobody(Path::new("prlimit"))
        .args(["--memlock=65536:65536", "--"])
        .arg(binary("abissctl"))
        .arg("--socket")
        .arg(daemon.socket())
        .arg("record")
        .arg(&file)
        .args(["--rate", "2MB/s", "--buffer", "4MiB", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run abissctl record as nobody");
    let mut input = recorder.stdin.take().expect("the recorder's input");
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| u8::try_from(i % 251).unwrap_or(0))
        .collect();
    input
        .write_all(&bytes[..500_000])
        .expect("feed the recorder");
    let pid = daemon.pid();
    let locked = wait_until(Duration::from_secs(10), || {
        locked_bytes_of(pid) >= before + 4 * MIB
    });
    let while_recording = locked_bytes_of(pid);
    input
        .write_all(&bytes[500_000..])
        .expect("feed the recorder");
    drop(input);
    let output = recorder.wait_with_output().expect("abissctl record");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr).trim());
    let summary = abiss_tests::json_of(&output);
    assert!(
        locked,
        "abissd held {while_recording} bytes locked while nobody recorded with a 4 MiB ring, against {before} before"
    );
    assert_eq!(summary["locked_by_abissd"], true, "{summary}");
    assert!(summary["ring_refusal"].is_null(), "{summary}");
    assert_eq!(summary["locked"], true, "{summary}");
    assert_eq!(summary["bytes"], bytes.len(), "{summary}");
    assert!(
        std::fs::read(&file).expect("the recording") == bytes,
        "the file is what was recorded"
    );
    let let_go = wait_until(Duration::from_secs(5), || locked_bytes_of(pid) <= before);
    assert!(
        let_go,
        "abissd still held {} bytes locked after the recording ended, against {before} before",
        locked_bytes_of(pid)
    );
}
