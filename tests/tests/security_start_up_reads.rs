//! A player's start-up reads other files than its stream's at real time (its libraries, when
//! the system reclaimed them): those reads are paid for out of its user's start-up allowance
//! (32 MiB at once, 1 MiB/s back), and past that the raise is dropped (issue 12's false
//! positive; issue 9, finding 2). All of it as `nobody`, who owns the streams and runs the
//! players with `abissctl run`.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use abiss_os::ioprio;
use abiss_tests::write_cold_file;
use abiss_tests::{as_nobody, binary, children_of, chmod, require_root, wait_for_ioprio};
use abiss_tests::{nobody_waiting_to_run, Daemon, Ext4Mount, LoopDevice};

const RT0: u16 = 1 << 13;
const BE5: u16 = (2 << 13) | 5;
const MIB: u64 = 1 << 20;

/// What the player reads of other files in its start-up: 16 MiB, more than the 4 MiB a raise
/// could read before (the lab's `GStreamer` read 8 to 12 MiB of libraries after a reclaim).
const LIBRARIES: u64 = 16 * MIB;

/// A managed disk over memory with a cold file to stream and cold "libraries" for `nobody`.
struct Setup {
    fs: Ext4Mount,
    daemon: Daemon,
}

impl Setup {
    fn new() -> Self {
        let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
        chmod(fs.path(), 0o755);
        let daemon = Daemon::start_managing(fs.device().path(), &[]);
        Self { fs, daemon }
    }

    /// A cold file of `bytes` that nobody may read.
    fn file(&self, name: &str, bytes: u64) -> PathBuf {
        let path = self.fs.path().join(name);
        write_cold_file(&path, bytes);
        chmod(&path, 0o644);
        path
    }

    /// `abissctl run` as nobody: attaches `stream` at 1 MB/s and runs the test reader under its
    /// start raise, which reads the stream for 1 s from its start (loaded at attach), then
    /// `libraries` whole as fast as it can, and stays 3 s.
    fn player(&self, stream: &Path, libraries: &Path) -> Player {
        self.player_lingering(stream, libraries, "3")
    }

    /// [`Self::player`], staying `linger` seconds after its libraries.
    fn player_lingering(&self, stream: &Path, libraries: &Path, linger: &str) -> Player {
        self.player_with(stream, libraries, ("1", linger), &[])
    }

    /// [`Self::player_lingering`], reading the stream for `reading` seconds, with more options
    /// of `abissctl run`.
    fn player_with(
        &self,
        stream: &Path,
        libraries: &Path,
        (reading, linger): (&str, &str),
        options: &[&str],
    ) -> Player {
        // BE/5 from the start (ionice execs abissctl, which passes it on), so that a drop of
        // the raise is told from the kernel's default.
        let mut run = as_nobody(Path::new("ionice"))
            .args(["-c2", "-n5"])
            .arg(binary("abissctl"))
            .arg("--socket")
            .arg(self.daemon.socket())
            .args(["run", "--rate", "1MB/s", "--buffer", "1MiB"])
            .args(options)
            .arg(stream)
            .arg("--")
            .arg(binary("abiss-test-reader"))
            .arg(stream)
            .args(["1000000", "65536", "1048576", reading])
            .args(["--linger", linger, "--stray"])
            .arg(libraries)
            .stdout(Stdio::piped())
            .spawn()
            .expect("abissctl run as nobody");
        let found = abiss_tests::wait_until(Duration::from_secs(15), || {
            !children_of(run.id()).is_empty()
        });
        assert!(found, "abissctl run started no player");
        let pid = children_of(run.id())[0];
        let stdout = run.stdout.take().expect("the player's stdout");
        Player { run, pid, stdout }
    }

    /// What `status` says of policed raises.
    fn policed(&self) -> u64 {
        let mut client = abiss_client::Client::connect(self.daemon.socket()).expect("connect");
        client.status_report().expect("status").raises.policed
    }
}

/// A player under `abissctl run`.
struct Player {
    run: Child,
    pid: u32,
    stdout: std::process::ChildStdout,
}

impl Player {
    /// Waits until the player has read its libraries (it prints how many bytes) and returns its
    /// I/O priority then, and 600 ms later (two of abissd's checks), and how much it read. The
    /// first is the premise that the reads were made at real time: raised before them and still
    /// raised after, it was raised throughout, since a thread that loses its raise is never
    /// raised again for the stream.
    fn after_libraries(self) -> (Option<u16>, Option<u16>, u64) {
        let mut lines = std::io::BufReader::new(self.stdout).lines();
        let line = lines
            .find_map(|line| {
                let line = line.ok()?;
                line.starts_with("{\"stray_bytes\"").then_some(line)
            })
            .expect("the player says what it read of its libraries");
        let read: serde_json::Value = serde_json::from_str(&line).expect("json");
        let right_after = ioprio::get(self.pid).ok();
        std::thread::sleep(Duration::from_millis(600));
        let later = ioprio::get(self.pid).ok();
        lines.for_each(drop);
        let mut run = self.run;
        let status = run.wait().expect("abissctl run");
        assert!(status.success(), "the player failed: {status:?}");
        (
            right_after,
            later,
            read["stray_bytes"].as_u64().expect("bytes"),
        )
    }
}

/// The false positive mended: a player that reads 16 MiB of other files in its start-up keeps
/// its raise, the reads paid from its user's 32 MiB start-up allowance.
#[test]
fn a_player_keeps_its_start_raise_while_it_loads_its_libraries() {
    require_root!();
    let setup = Setup::new();
    let stream = setup.file("film.ts", 8 * MIB);
    let libraries = setup.file("libraries.so", LIBRARIES);
    let player = setup.player(&stream, &libraries);
    let pid = player.pid;
    assert!(
        wait_for_ioprio(pid, RT0, Duration::from_secs(2)).is_some(),
        "the player is raised at its start (the premise of the test)"
    );
    let (right_after, later, read) = player.after_libraries();
    println!("ioprio after the libraries: {right_after:?}, 600 ms later {later:?}; read {read} B");
    assert_eq!(read, LIBRARIES);
    assert_eq!(
        right_after,
        Some(RT0),
        "the libraries were read at real time"
    );
    assert_eq!(later, Some(RT0), "the player lost its start raise");
    assert_eq!(setup.policed(), 0, "a raise was policed");
}

/// The bound is the user's: a first player reads 64 MiB of other files in its start-up, more
/// than the whole 32 MiB allowance, and loses its raise; what it read beyond the allowance is
/// owed (about 32 MiB, 32 s of the allowance coming back), so a second player of the same
/// user, a few seconds later, is not raised at all and reads its 16 MiB at its own priority.
/// (This pins the bound; the test above shows the payment.)
#[test]
fn raised_threads_pay_for_other_files_only_out_of_their_users_allowance() {
    require_root!();
    let setup = Setup::new();
    let first_stream = setup.file("first.ts", 8 * MIB);
    let second_stream = setup.file("second.ts", 8 * MIB);
    let much = setup.file("much.bin", 64 * MIB);
    let libraries = setup.file("libraries.so", LIBRARIES);

    let started = std::time::Instant::now();
    let first = setup.player(&first_stream, &much);
    assert!(
        wait_for_ioprio(first.pid, RT0, Duration::from_secs(2)).is_some(),
        "the first player is raised at its start (the premise of the test)"
    );
    let (_, later, read) = first.after_libraries();
    assert_eq!(read, 64 * MIB);
    assert_eq!(later, Some(BE5), "64 MiB of other files kept the raise");
    assert_eq!(setup.policed(), 1);

    let second = setup.player(&second_stream, &libraries);
    let raised = wait_for_ioprio(second.pid, RT0, Duration::from_secs(2)).is_some();
    let (right_after, later, read) = second.after_libraries();
    let elapsed = started.elapsed();
    println!(
        "second player raised: {raised}; its ioprio after its libraries: {right_after:?}, \
         {later:?}; {elapsed:?} after the first"
    );
    assert!(
        elapsed < Duration::from_secs(20),
        "the allowance had time to come back: {elapsed:?}"
    );
    assert_eq!(read, LIBRARIES);
    assert!(!raised, "a user who owes for real-time reads was raised");
    assert_eq!((right_after, later), (Some(BE5), Some(BE5)));
    assert_eq!(setup.policed(), 1);
}

/// The gap of the check interval: a player that reads its libraries and exits before abissd's
/// next check of its raise (every 250 ms) used to read them at real time for free, as often as
/// its user started one. Now a raise that ends is charged for what it read, and a user who owes
/// has no thread raised until the allowance has come back that far. Six players in a row, each
/// reading 24 MiB of other files and exiting at once (the allowance is 32 MiB and comes back at
/// 1 MiB/s; a player takes about 2 s): the first two are raised (the first leaves 8 MiB or less,
/// and the user owes nothing yet); the second reads far more than is left, its user owes the
/// rest, and the last two are not raised. (With 16 MiB each, whether the third player was
/// raised, and so whether its user still owed by the fifth, depended on how fast the players
/// ran: a suite failed so.)
#[test]
fn raises_that_end_between_checks_are_charged_and_a_user_who_owes_is_not_raised() {
    const OTHER_FILES: u64 = 24 * MIB;
    require_root!();
    let setup = Setup::new();
    let mut raised = Vec::new();
    for round in 0..6 {
        let stream = setup.file(&format!("film-{round}.ts"), 4 * MIB);
        let libraries = setup.file(&format!("libraries-{round}.so"), OTHER_FILES);
        let player = setup.player_lingering(&stream, &libraries, "0");
        raised.push(wait_for_ioprio(player.pid, RT0, Duration::from_secs(1)).is_some());
        let (_, _, read) = player.after_libraries();
        assert_eq!(read, OTHER_FILES);
    }
    println!("raised at their start: {raised:?}");
    assert!(
        raised[0],
        "the first player is raised (the premise of the test)"
    );
    assert_eq!(
        &raised[4..],
        &[false, false],
        "a user who read more than the allowance at real time was raised again: {raised:?}"
    );
}

/// A user whose start-up allowance is empty (here: the player's own preroll took what was
/// left of it) is lent a little for a raised thread's reads of other files: a player that reads
/// 768 KiB of another file (a font, subtitles, an index) at once keeps its raise, and its user
/// owes what the allowance could not pay. Before, the raise was dropped for its first KiB, and the thread barred from the
/// stream. What a user's raises may owe together is bounded (`STRAY_CREDIT_KIB`, 1 MiB): a second player, raised
/// at its start, that reads 8 MiB of another file with the allowance nearly empty again (its
/// preroll too takes what came back) loses its raise.
#[test]
fn an_empty_allowance_lends_a_raise_a_little_for_other_files_and_no_more() {
    require_root!();
    let setup = Setup::new();
    let film = setup.file("film.ts", 48 * MIB);
    let subtitles = setup.file("subtitles.srt", 768 << 10);
    // At once after its start, before much of the allowance comes back (1 MiB/s; abissd
    // settles at its next check, within 250 ms).
    let player = setup.player_with(&film, &subtitles, ("0", "3"), &["--preroll", "40MiB"]);
    assert!(
        wait_for_ioprio(player.pid, RT0, Duration::from_secs(2)).is_some(),
        "the player is raised at its start (the premise of the test)"
    );
    let (right_after, later, read) = player.after_libraries();
    println!("ioprio after the subtitles: {right_after:?}, 600 ms later {later:?}; read {read} B");
    assert_eq!(read, 768 << 10);
    assert_eq!(right_after, Some(RT0), "read at real time (the premise)");
    assert_eq!(later, Some(RT0), "the player lost its raise for 768 KiB");
    assert_eq!(setup.policed(), 0, "a raise was policed");

    let second_film = setup.file("second.ts", 8 * MIB);
    let index = setup.file("index.bin", 8 * MIB);
    let second = setup.player_with(&second_film, &index, ("0", "3"), &["--preroll", "40MiB"]);
    let raised = wait_for_ioprio(second.pid, RT0, Duration::from_secs(2)).is_some();
    let (right_after, later, read) = second.after_libraries();
    println!("second player raised: {raised}; after its 8 MiB: {right_after:?}, {later:?}");
    assert!(
        raised,
        "the second player is raised at its start (the premise)"
    );
    assert_eq!(read, 8 * MIB);
    assert_eq!(later, Some(BE5), "a raise owed more than it is lent");
    assert_eq!(setup.policed(), 1);
}

/// A thread id that comes round again while the raise of the thread that had it is still in
/// abissd's table (it goes when it idles out, 5 s) is a new thread: it does not inherit what
/// the kernel counted for the earlier raise. Here the earlier thread reads 24 MiB of another
/// file at real time (paid out of the 32 MiB allowance, 8 MiB left) and exits; a new thread of
/// the same user is given its id (`ns_last_pid`, as any user gets it by forking until the ids
/// wrap) and is raised for the stream. Had it inherited the 24 MiB, abissd would have asked
/// its user for them again, found 8 MiB, and dropped its raise.
#[test]
fn a_thread_that_takes_a_raised_threads_id_does_not_pay_for_its_reads() {
    use std::io::Write as _;
    require_root!();
    let setup = Setup::new();
    let stream = setup.file("film.ts", 8 * MIB);
    let much = setup.file("much.bin", 24 * MIB);
    let mut owner = as_nobody(&binary("abiss-hostile-client"))
        .arg(setup.daemon.socket())
        .arg("raises")
        .arg(&stream)
        .arg("0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the stream's owner as nobody");
    let mut said = std::io::BufReader::new(owner.stdout.take().expect("stdout")).lines();
    let mut tell = owner.stdin.take().expect("stdin");
    let mut next = || said.next().expect("the owner answers").expect("a line");
    assert_eq!(next(), "attached");
    let mut name = |tid: u32| {
        writeln!(tell, "{tid}").expect("name the thread");
        next()
    };

    let mut first = nobody_waiting_to_run(&format!("dd if={} of=/dev/null bs=1M", much.display()));
    let id = first.id();
    assert_eq!(name(id), format!("raised {id} true"), "the premise");
    writeln!(first.stdin.take().expect("stdin"), "go").expect("go");
    assert!(first.wait().expect("dd").success());
    // Two of abissd's checks: the 24 MiB are paid.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(setup.policed(), 0, "the first raise was policed");

    let second = abiss_tests::spawn_with_id(id, || nobody_waiting_to_run("sleep 5"));
    let mut second = second.expect("a new thread with the earlier one's id");
    assert_eq!(name(id), format!("raised {id} true"));
    std::thread::sleep(Duration::from_millis(700));
    let kept = ioprio::get(id).ok();
    let policed = setup.policed();
    println!("the new thread's ioprio 700 ms after its raise: {kept:?}; policed {policed}");
    let _ = second.kill();
    let _ = second.wait();
    drop(tell);
    let _ = owner.wait();
    assert_eq!(kept, Some(RT0), "the new thread lost its raise");
    assert_eq!(policed, 0, "the new thread's raise was policed");
}
