//! Attacks on abissd's connections by an unprivileged local user (`nobody`, through
//! `setpriv`): subscriptions that hang up, too many connections, connections that sit idle,
//! requests of another protocol version, and costly requests back to back (issue 9, findings
//! 5 and 6, the late version check and the expensive-request rule); metrics scrapes that never
//! read their answers (issue 33, finding 5). After each, the daemon
//! must hold no more than before and still answer root.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use abiss_proto::{ErrorKind, Response};
use abiss_tests::{
    binary, require_root, wait_until, write_cold_file, Daemon, Ext4Mount, LoopDevice,
};
use abiss_tests::{chmod, open_fds};

/// Runs the hostile client with `args` as `nobody`, without capabilities.
fn hostile(socket: &Path, args: &[&str]) -> std::process::Output {
    abiss_tests::as_nobody(&binary("abiss-hostile-client"))
        .arg(socket)
        .args(args)
        .output()
        .expect("run setpriv")
}

/// Root's `abissctl status` answers, and within a second.
fn root_is_served(daemon: &Daemon) {
    let started = Instant::now();
    let status = daemon.ctl(["status"]);
    assert!(status.status.success(), "{status:?}");
    eprintln!("root's status answered in {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "root's status took {:?}",
        started.elapsed()
    );
}

/// `emit_events` and `trace_all` of the daemon's `CONTROL` map (the programs' system-wide
/// switches), read with bpftool through the map descriptors the daemon holds.
fn control_switches(pid: u32) -> (u64, u64) {
    let dump = abiss_tests::daemon_map_dump(pid, "CONTROL");
    // `Control` is six u32s, emit_events first and trace_all fourth.
    (
        abiss_tests::control_field(&dump[0], "emit_events", 0),
        abiss_tests::control_field(&dump[0], "trace_all", 3),
    )
}

#[test]
fn subscriptions_that_hang_up_are_let_go_at_once() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let file = fs.path().join("nobodys.bin");
    write_cold_file(&file, 1 << 20);
    chmod(fs.path(), 0o755);
    chmod(&file, 0o644);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let pid = daemon.pid();
    let baseline = open_fds(pid);
    // A subscriber without I/O of its own is never sent an event: before, only a failed send
    // noticed a hang-up, so each of these kept its task and socket (issue 9, finding 5).
    let output = hostile(daemon.socket(), &["subscribe", "1000", "-"]);
    assert!(output.status.success(), "{output:?}");
    eprintln!("{}", String::from_utf8_lossy(&output.stdout).trim());
    // Subscribers that hold a non-persistent stream each.
    let output = hostile(
        daemon.socket(),
        &["subscribe", "40", &file.to_string_lossy()],
    );
    assert!(output.status.success(), "{output:?}");
    let report = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", report.trim());
    assert!(
        !report.contains("attached 0 "),
        "no stream was attached: {report}"
    );

    let settled = wait_until(Duration::from_secs(5), || open_fds(pid) <= baseline + 2);
    let after = open_fds(pid);
    assert!(
        settled,
        "abissd held {baseline} descriptors before 1040 subscriptions that hung up and {after} after"
    );
    let ended = wait_until(Duration::from_secs(5), || daemon.streams().is_empty());
    assert!(
        ended,
        "streams of hung-up subscribers remain: {:?}",
        daemon.streams()
    );
    assert_eq!(
        control_switches(pid),
        (0, 0),
        "events and tracing of every disk stay on for nobody"
    );
    root_is_served(&daemon);
}

#[test]
fn one_user_cannot_take_every_connection() {
    require_root!();
    let daemon = Daemon::start();
    let limit = abiss_daemon::serve::limits::MAX_USER_CONNECTIONS;
    let mut holder = abiss_tests::as_nobody(&binary("abiss-hostile-client"))
        .arg(daemon.socket())
        .args(["hold", &(limit + 4).to_string(), "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the hostile client");
    let mut lines = BufReader::new(holder.stdout.take().expect("stdout")).lines();
    let counts = lines.next().expect("counts").expect("read");
    let refusal = lines.next().expect("refusal").expect("read");
    assert_eq!(counts, format!("answered {limit} refused 4"), "{refusal}");
    assert!(
        refusal.contains("the most one user may have") && refusal.contains("\"refused\""),
        "the refusal says why: {refusal}"
    );
    // nobody holds its most; root is still served, at once.
    root_is_served(&daemon);
    let mut connection = daemon.connect();
    assert!(matches!(
        connection.call(abiss_proto::Request::Hello),
        Response::Hello { .. }
    ));
    holder
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("let the client go");
    assert!(holder.wait().expect("wait").success());
    // Hung up, nobody's connections are free again.
    let freed = wait_until(Duration::from_secs(5), || {
        let output = abiss_tests::as_nobody(&binary("abiss-hostile-client"))
            .arg(daemon.socket())
            .args(["hold", "1", "0"])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        String::from_utf8_lossy(&output.stdout).starts_with("answered 1 refused 0")
    });
    assert!(freed, "nobody's hung-up connections are still counted");
}

#[test]
fn an_idle_connection_is_closed_and_one_holding_a_stream_is_not() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let file = fs.path().join("held.bin");
    write_cold_file(&file, 1 << 20);
    // The daemon reads the timeout once, at start: the variable is gone again before any
    // other daemon of this file starts.
    let timeout_ms = 1500;
    std::env::set_var(
        abiss_daemon::serve::limits::IDLE_TIMEOUT_ENV,
        timeout_ms.to_string(),
    );
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    std::env::remove_var(abiss_daemon::serve::limits::IDLE_TIMEOUT_ENV);

    // A non-persistent stream lives as long as its connection: that connection is never idle.
    let mut holder = abiss_client::Client::connect(daemon.socket()).expect("connect");
    let stream = holder
        .attach(
            std::fs::File::open(&file).expect("open"),
            abiss_proto::AttachRequest::read(
                abiss_proto::ByteRate(1000),
                abiss_proto::ByteSize(64 << 10),
                1,
                0,
            ),
        )
        .expect("attach");

    let output = hostile(daemon.socket(), &["idle", "10", "0"]);
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "nobody's idle connection was not closed: {said}"
    );
    let closed_ms: u64 = said
        .strip_prefix("closed after ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        (timeout_ms - 100..timeout_ms + 2000).contains(&closed_ms),
        "closed after {closed_ms} ms with a timeout of {timeout_ms} ms"
    );
    assert!(
        said.contains("sends nothing"),
        "the daemon says why: {said}"
    );

    // The stream's connection, silent for longer than the timeout, still holds it.
    let listed = holder
        .list()
        .expect("the stream's connection is still served");
    assert!(listed.iter().any(|s| s.id == stream.id), "{listed:?}");
}

#[test]
fn another_versions_unknown_request_is_told_the_version() {
    require_root!();
    let daemon = Daemon::start();
    let mut connection = daemon.connect();
    connection.send_raw(b"{\"version\":999,\"request\":{\"kind\":\"teleport\",\"to\":\"mars\"}}\n");
    match connection.receive() {
        Response::Error { error, message } => {
            assert_eq!(error, ErrorKind::VersionMismatch, "{message}");
            assert!(message.contains("999"), "{message}");
        }
        other => panic!("unexpected answer {other:?}"),
    }
    // An unknown kind in this version is still a bad request.
    let mut connection = daemon.connect();
    let line = format!(
        "{{\"version\":{},\"request\":{{\"kind\":\"teleport\"}}}}\n",
        abiss_proto::PROTOCOL_VERSION
    );
    connection.send_raw(line.as_bytes());
    assert!(matches!(
        connection.receive(),
        Response::Error {
            error: ErrorKind::BadRequest,
            ..
        }
    ));
}

#[test]
fn capacity_plans_back_to_back_never_keep_root_waiting() {
    require_root!();
    let device = LoopDevice::new_in("/dev/shm", 64);
    let daemon = Daemon::start_managing(device.path(), &[]);
    // A model for the disk, so plans run the statistical model (the costly path).
    abiss_tests::save_laptop_model(&daemon, &device);
    // Each plan is tens of ms; 32 of them queued at the main loop once kept root waiting
    // over a second.
    let mut flood = abiss_tests::as_nobody(&binary("abiss-hostile-client"))
        .arg(daemon.socket())
        .args(["plans", &device.name(), "32"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the hostile client");
    let mut lines = BufReader::new(flood.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().expect("started").expect("read"), "planning");
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        root_is_served(&daemon);
    }
    flood
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"go\n")
        .expect("stop the flood");
    assert!(flood.wait().expect("wait").success());
}

/// Only root's `trace` switches tracing of every disk on (issue 33): it puts the block programs
/// on every request of the machine, and before, any user's `trace` or `events` did it for as
/// long as they watched. nobody's trace shows the managed disks, which are traced anyway. Both
/// kinds: reports (`trace --count 1`, one second), and one line per request (`trace --events`,
/// watched for 1.5 s and then stopped).
#[test]
fn only_roots_trace_follows_every_disk() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let pid = daemon.pid();
    let socket = daemon.socket().to_string_lossy().into_owned();
    // Whether tracing of every disk was on while `trace` ran; `--events` runs until stopped,
    // after 1.5 s.
    let watch = |trace: &mut std::process::Child, events: bool| {
        let (mut switched, started) = (false, Instant::now());
        while trace.try_wait().expect("wait").is_none() {
            switched |= control_switches(pid).1 == 1;
            if events && started.elapsed() > Duration::from_millis(1500) {
                let _ = trace.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        switched
    };
    let reports = ["trace", "--json", "--interval", "1", "--count", "1"];
    let events = ["trace", "--json", "--events"];
    for args in [&reports[..], &events[..]] {
        let is_events = args == events;
        let trace = |mut abissctl: std::process::Command| {
            abissctl
                .arg("--socket")
                .arg(&socket)
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start abissctl trace")
        };
        let mut nobodys = trace(abiss_tests::as_nobody(&binary("abissctl")));
        assert!(
            !watch(&mut nobodys, is_events),
            "nobody's {args:?} switched every disk on"
        );
        let output = nobodys.wait_with_output().expect("nobody's trace");
        // Reports end by themselves; events run until killed (an `--events` that ended early
        // was refused, and proves nothing).
        let ran = if is_events {
            std::os::unix::process::ExitStatusExt::signal(&output.status) == Some(libc::SIGKILL)
        } else {
            output.status.success()
        };
        assert!(ran, "{args:?}: {output:?}");
        let mut roots = trace(std::process::Command::new(binary("abissctl")));
        assert!(
            watch(&mut roots, is_events),
            "root's {args:?} follows every disk"
        );
        let _ = roots.wait();
        assert!(
            wait_until(Duration::from_secs(2), || control_switches(pid).1 == 0),
            "off once root's {args:?} ended"
        );
    }
}

/// Eight scrapes of `nobody`'s that send their request heads and never read the answers (with
/// the smallest receive buffer, so that an answer does not fit in the sockets' buffers): they
/// hold every metrics slot while abissd writes to them, and a scraper is answered 503. abissd
/// gives up writing an answer after `WRITE_TIMEOUT`, so the scraper is answered within it
/// (and a little). Before, the writes were bounded only by the whole exchange's 20 s.
#[test]
fn scrapes_that_never_read_their_answers_free_their_slots_within_the_write_timeout() {
    require_root!();
    let address = abiss_tests::http::free_address();
    // Root's streams, so that an answer is larger than the sockets' buffers.
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    let daemon = Daemon::start_managing(fs.device().path(), &["--metrics", &address.to_string()]);
    for index in 0..48 {
        let file = fs.path().join(format!("film-{index}.bin"));
        write_cold_file(&file, 1 << 20);
        let attached = daemon.ctl(["attach", &file.to_string_lossy(), "--rate", "10kB/s"]);
        assert!(attached.status.success(), "{attached:?}");
    }
    let (status, body) = abiss_tests::http::get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    let mut hostile = abiss_tests::as_nobody(&binary("abiss-hostile-client"))
        .args([&address.to_string(), "unread-metrics", "8", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the hostile client as nobody");
    let mut said = String::new();
    BufReader::new(hostile.stdout.take().expect("stdout"))
        .read_line(&mut said)
        .expect("read");
    assert_eq!(said.trim(), "sent 8", "{said}");
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut kept_out = 0;
    let answered = loop {
        let (status, _) = abiss_tests::http::get(address, "/metrics");
        if status == 200 {
            break Some(started.elapsed());
        }
        kept_out += 1;
        if started.elapsed() > Duration::from_secs(25) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = hostile.stdin.take().expect("stdin").write_all(b"\n");
    let _ = hostile.wait();
    println!(
        "an answer of {} bytes; a scraper answered after {answered:?} ({kept_out} times 503 before)",
        body.len()
    );
    assert!(
        kept_out > 0,
        "the unread scrapes held no slot (the premise of the test)"
    );
    let bound = WRITE_TIMEOUT + Duration::from_secs(1);
    assert!(
        answered.is_some_and(|after| after < bound),
        "8 unread scrapes kept a scraper out for {answered:?}, past {bound:?}"
    );
    root_is_served(&daemon);
}

/// How long abissd writes one metrics answer at most (`WRITE_TIMEOUT`,
/// `scheduler-user/src/serve/metrics/mod.rs`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
