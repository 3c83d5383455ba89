//! Closes that wait as long as their owner likes (issue 33): a TCP socket with unsent data and
//! `SO_LINGER`, a FUSE file whose server never answers a flush. A user passes one to abissd,
//! as `nobody`, and hangs up, so that abissd's close is the last; root's `status` must still be
//! answered within 100 ms, and the user who did it is the only one who waits.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use abiss_proto::{Request, Response};
use abiss_tests::hostile::{stalling_fs, KillOnDrop};
use abiss_tests::{binary, open_fds, require_root, Connection, Daemon};

/// Runs `program` with `args` as `nobody`, without capabilities.
fn as_nobody(program: &Path, args: &[&str]) -> std::process::Output {
    abiss_tests::as_nobody(program)
        .args(args)
        .output()
        .expect("run setpriv")
}

/// Threads of abissd's that close what users passed it (`serve::closer`).
fn closing_threads(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm"))
                .is_ok_and(|comm| comm.trim() == "abiss-close")
        })
        .count()
}

/// Root's `status`, each on a new connection, answered within 100 ms every time for `during`.
fn assert_answers_root_in_time(daemon: &Daemon, during: Duration) {
    let until = Instant::now() + during;
    let mut slowest = Duration::ZERO;
    let mut asked = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let mut root = Connection::open(daemon.socket());
        root.set_timeout(Duration::from_secs(5));
        let answer = root.call(Request::Status);
        assert!(matches!(answer, Response::Devices(_)), "{answer:?}");
        slowest = slowest.max(started.elapsed());
        asked += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("root's status: {asked} asked, slowest {slowest:?}");
    assert!(
        slowest < Duration::from_millis(100),
        "root's status took {slowest:?}"
    );
}

/// The hostile client passing `count` lingering sockets (linger `secs`), as `nobody`; waits
/// until it has, and frees them (closes their listeners) when it drops. How many abissd
/// received: one sent on a connection abissd had already refused never arrives.
struct LingeringSockets(std::process::Child, u32);

impl LingeringSockets {
    fn hand(daemon: &Daemon, secs: u32, count: u32) -> Self {
        Self::hand_as(daemon, "linger", secs, count)
    }
    /// The same with the hostile client's `mode` (`linger`, `linger-oob`).
    fn hand_as(daemon: &Daemon, mode: &str, secs: u32, count: u32) -> Self {
        let socket = daemon.socket().to_string_lossy().into_owned();
        let mut child = abiss_tests::as_nobody(&binary("abiss-hostile-client"))
            .args([socket.as_str(), mode, &secs.to_string(), &count.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the hostile client");
        let mut said = String::new();
        BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut said)
            .expect("read the hostile client");
        let handed: u32 = said
            .trim()
            .strip_prefix("handed ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the hostile client said {said:?}"));
        Self(child, handed)
    }
}

impl Drop for LingeringSockets {
    fn drop(&mut self) {
        if let Some(input) = self.0.stdin.as_mut() {
            let _ = input.write_all(b"done\n");
        }
        let _ = self.0.wait();
    }
}

/// One lingering socket passed by nobody with `mode`: root's `status` is answered in time while
/// its close waits on a closing thread, and once the linger ends abissd holds nothing of it.
fn one_lingering_socket_holds_up_nothing(mode: &str) {
    let daemon = Daemon::start();
    let before = open_fds(daemon.pid());
    let attack = LingeringSockets::hand_as(&daemon, mode, 60, 1);
    assert_eq!(attack.1, 1, "the socket was passed");
    assert_answers_root_in_time(&daemon, Duration::from_secs(2));
    assert_eq!(
        closing_threads(daemon.pid()),
        1,
        "the close still waits; abissd closes the socket on a closing thread"
    );
    // The listener goes, the connection is reset, the linger ends, and so does the close.
    drop(attack);
    assert!(
        abiss_tests::wait_until(Duration::from_secs(5), || open_fds(daemon.pid()) <= before),
        "abissd still holds {} descriptors, {before} before",
        open_fds(daemon.pid())
    );
}

/// Before: abissd's one thread waited out the linger in its close (18.8 s of root's `status`
/// with a 20 s linger). Now the close waits on nobody's closing thread, and ends with the wait.
#[test]
fn a_lingering_socket_passed_with_a_hello_holds_up_nothing() {
    require_root!();
    one_lingering_socket_holds_up_nothing("linger");
}

/// The same socket on the `hello`'s newline, sent as a byte of out-of-band data: a reader that
/// skips such a byte has the kernel drop what it carried in the reader's own thread, so abissd
/// reads it inline (`SO_OOBINLINE`), and the socket reaches the closing thread as any other.
#[test]
fn a_lingering_socket_passed_out_of_band_holds_up_nothing() {
    require_root!();
    one_lingering_socket_holds_up_nothing("linger-oob");
}

/// A user with 16 closes waiting is served no more until they end: their new connections are
/// refused in one sentence, while root (and everyone else) is answered as before.
#[test]
fn a_user_whose_closes_wait_is_refused_and_nobody_else_waits() {
    require_root!();
    let daemon = Daemon::start();
    let before = open_fds(daemon.pid());
    let attack = LingeringSockets::hand(&daemon, 60, 20);
    assert!(attack.1 >= 16, "{} of 20 passed", attack.1);
    let socket = daemon.socket().to_string_lossy().into_owned();
    // The client has sent them all; abissd takes them in as its loop comes round.
    let mut status = None;
    let refused = abiss_tests::wait_until(Duration::from_secs(3), || {
        let output = as_nobody(&binary("abissctl"), &["--socket", &socket, "status"]);
        let said = !output.status.success()
            && String::from_utf8_lossy(&output.stderr).contains("still closing");
        status = Some(output);
        said
    });
    assert!(
        refused,
        "nobody's status while 20 of their closes wait: {status:?}"
    );
    assert_answers_root_in_time(&daemon, Duration::from_secs(1));
    // What abissd holds of theirs meanwhile: the sockets, and no more than one connection each.
    let held = open_fds(daemon.pid()).saturating_sub(before);
    assert!(held <= 2 * 20 + 2, "abissd holds {held} more descriptors");
    drop(attack);
    assert!(
        abiss_tests::wait_until(Duration::from_secs(10), || open_fds(daemon.pid()) <= before),
        "abissd still holds {} descriptors, {before} before",
        open_fds(daemon.pid())
    );
    let status = as_nobody(&binary("abissctl"), &["--socket", &socket, "status"]);
    assert!(
        status.status.success(),
        "nobody is served again: {status:?}"
    );
}

/// The lines `child` prints, as they come.
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if sender.send(line.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    receiver
}

/// A user's FUSE server that never answers a request for attributes or a flush: neither an
/// attach of its file, nor abissd's close of the descriptor it refused, nor a capacity plan for
/// a path in it waits on it, and root is answered within 100 ms meanwhile.
#[test]
fn a_file_system_that_never_answers_holds_up_nothing() {
    require_root!();
    let daemon = Daemon::start();
    let attacker_slot = &mut None;
    let fs = stalling_fs(None);
    let mountpoint = fs.mountpoint();
    let file = mountpoint.join("media.ts");
    let socket = daemon.socket().to_string_lossy().into_owned();
    let mut attacker = abiss_tests::as_nobody(&binary("abiss-hostile-client"));
    attacker
        .args([socket.as_str(), "attach", &file.to_string_lossy(), "0"])
        .stdout(std::process::Stdio::piped());
    // Its own close of the file waits for the server's flush, which never comes, so it is
    // declared before the server: the server goes first when they drop, and frees it.
    *attacker_slot = Some(KillOnDrop(
        attacker.spawn().expect("start the hostile client"),
    ));
    let attacker = attacker_slot.as_mut().expect("just set");
    let said = lines_of(&mut attacker.0);
    assert_eq!(
        said.recv_timeout(Duration::from_secs(10)).as_deref(),
        Ok("attaching")
    );
    // The attach is refused at once, for what the descriptor says without asking the server:
    // its file system is on no disk abissd manages.
    let answer = said
        .recv_timeout(Duration::from_secs(5))
        .expect("no answer to the attach within 5 s: abissd waits on the user's file system");
    assert!(answer.contains("which is on no block device"), "{answer}");
    // A capacity plan for a "device" at a path in the same file system: abissd looks up no
    // client's path, so it is refused as given (abissctl resolves paths itself, as the user).
    let planned = as_nobody(
        Path::new("/usr/bin/timeout"),
        &[
            "5",
            &binary("abiss-hostile-client").to_string_lossy(),
            &socket,
            "admit",
            &file.to_string_lossy(),
            "1",
        ],
    );
    let plan = String::from_utf8_lossy(&planned.stdout);
    assert!(
        planned.status.success() && plan.contains("does not look up"),
        "the plan for a path in the user's file system: {planned:?}"
    );
    // The close of the refused descriptor waits for the server's flush, on nobody's closing
    // thread; root is answered meanwhile.
    assert_answers_root_in_time(&daemon, Duration::from_secs(2));
    assert_eq!(
        closing_threads(daemon.pid()),
        1,
        "the close still waits; abissd closes the FUSE file on a closing thread of nobody's"
    );
}
