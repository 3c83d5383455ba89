//! Bad input gets one clear sentence and its own exit code, and changes nothing.

use std::os::unix::net::UnixListener;
use std::process::{Command, Output};

use abiss_proto::{ErrorKind, Response};
use abiss_tests::{assert_fails, binary, require_root, stderr, Daemon, Scratch};

fn abissd(args: &[&str]) -> Output {
    Command::new(binary("abissd"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run abissd")
}

fn abissctl(socket: &std::path::Path, args: &[&str]) -> Output {
    Command::new(binary("abissctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run abissctl")
}

#[test]
fn daemon_refuses_an_unprivileged_user() {
    require_root!();
    let dir = Scratch::new_in("/tmp", "unpriv");
    let socket = dir.path().join("s.sock");
    let output = abiss_tests::as_nobody(&binary("abissd"))
        .arg("--socket")
        .arg(&socket)
        .output()
        .expect("run setpriv");
    assert_fails(&output, 10, "needs root");
    assert!(!socket.exists());
}

#[test]
fn daemon_refuses_a_kernel_without_btf() {
    require_root!();
    let dir = Scratch::new_in("/tmp", "nobtf");
    let socket = dir.path().join("s.sock");
    let socket_arg = socket.to_string_lossy().into_owned();
    let output = abissd(&["--socket", &socket_arg, "--btf", "/nonexistent/vmlinux"]);
    assert_fails(&output, 11, "no BTF");
    assert!(!socket.exists(), "nothing bound");
}

#[test]
fn a_second_daemon_on_the_same_socket_refuses() {
    require_root!();
    let daemon = Daemon::start();
    let socket = daemon.socket().to_string_lossy().into_owned();
    let output = abissd(&["--socket", &socket]);
    assert_fails(&output, 12, "already serving");
    // The first one still serves.
    assert!(matches!(
        daemon.connect().call(abiss_proto::Request::Hello),
        Response::Hello { .. }
    ));
}

#[test]
fn a_socket_path_that_is_not_a_socket_is_refused_by_both_sides() {
    require_root!();
    let dir = Scratch::new_in("/tmp", "notsock");
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"keep me").unwrap();
    let path = file.to_string_lossy().into_owned();
    assert_fails(&abissd(&["--socket", &path]), 13, "not a socket");
    assert_fails(&abissctl(&file, &["stats"]), 4, "not a socket");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"keep me",
        "the file is untouched"
    );
}

#[test]
fn clients_say_when_no_daemon_runs() {
    let dir = Scratch::new_in("/tmp", "nodaemon");
    let missing = dir.path().join("absent.sock");
    assert_fails(
        &abissctl(&missing, &["trace", "--count", "1"]),
        3,
        "not running",
    );
    // A socket file left by a dead daemon: nobody answers.
    let stale = dir.path().join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    assert_fails(&abissctl(&stale, &["stats"]), 3, "not running");
}

#[test]
fn unknown_devices_and_bad_intervals_are_refused_before_anything_runs() {
    let dir = Scratch::new_in("/tmp", "badargs");
    let socket = dir.path().join("absent.sock");
    for device in ["nosuchdisk", "250:250", "/dev/null", "/nonexistent"] {
        assert_fails(
            &abissctl(&socket, &["trace", "--device", device]),
            5,
            "no block device",
        );
    }
    for interval in ["0", "-1", "abc", "nan"] {
        let output = abissctl(&socket, &["trace", "--interval", interval]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "usage error for --interval {interval}"
        );
        assert!(stderr(&output).contains("interval"), "{}", stderr(&output));
    }
    let output = abissctl(&socket, &["trace", "--count", "0"]);
    assert_eq!(output.status.code(), Some(2));
}

#[test]
fn the_daemon_refuses_other_protocol_versions_and_garbage() {
    require_root!();
    let daemon = Daemon::start();
    let mut connection = daemon.connect();
    connection.send_raw(b"{\"version\":999,\"request\":{\"kind\":\"hello\"}}\n");
    match connection.receive() {
        Response::Error { error, message } => {
            assert_eq!(error, ErrorKind::VersionMismatch);
            assert!(message.contains("999"));
        }
        other => panic!("unexpected {other:?}"),
    }
    let mut connection = daemon.connect();
    connection.send_raw(b"this is not json\n");
    assert!(matches!(
        connection.receive(),
        Response::Error {
            error: ErrorKind::BadRequest,
            ..
        }
    ));
    let mut connection = daemon.connect();
    connection.send(abiss_proto::Request::Stats { window_ms: 0 });
    assert!(matches!(
        connection.receive(),
        Response::Error {
            error: ErrorKind::BadRequest,
            ..
        }
    ));
    // The daemon is still healthy.
    assert!(matches!(
        daemon.connect().call(abiss_proto::Request::Hello),
        Response::Hello { .. }
    ));
}

#[test]
fn unprivileged_clients_only_see_their_own_requests() {
    require_root!();
    let daemon = Daemon::start();
    let device = abiss_tests::LoopDevice::new_in("/dev/shm", 32);
    let watch = |as_nobody: bool| {
        let mut command = if as_nobody {
            let mut setpriv = Command::new("setpriv");
            setpriv
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(binary("abissctl"));
            setpriv
        } else {
            Command::new(binary("abissctl"))
        };
        command
            .arg("--socket")
            .arg(daemon.socket())
            .args(["trace", "--events", "--json", "--device"])
            .arg(device.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start watcher")
    };
    let mut nobody = watch(true);
    let mut root = watch(false);
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Root's requests: root's watcher sees them, nobody's does not.
    abiss_tests::direct_reads(device.path(), 65536, 0, 20);
    std::thread::sleep(std::time::Duration::from_millis(500));
    nobody.kill().unwrap();
    root.kill().unwrap();
    let seen_by_nobody = nobody.wait_with_output().unwrap();
    let seen_by_root = root.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&seen_by_nobody.stdout);
    assert!(text.trim().is_empty(), "nobody saw root's requests: {text}");
    let lines = String::from_utf8_lossy(&seen_by_root.stdout)
        .lines()
        .count();
    assert!(lines >= 20, "root saw its {lines} requests");
}
