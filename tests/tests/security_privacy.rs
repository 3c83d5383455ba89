//! What one user learns of others (issue 33, finding 5), asked as `nobody`: another user's
//! stream is answered as a missing one, word for word, by id and by file, for `detach` and
//! `set-rate`; a second recording is refused without the id of another user's; and a file
//! name that holds a newline forges no line of abissd's log.

use abiss_tests::{
    abissctl_as_nobody, attached_id, chmod, require_root, stderr, write_cold_file, Daemon,
    Ext4Mount, LoopDevice,
};

/// A managed ext4 file system whose files `nobody` may read (and, for `writable`, write).
fn files(names: &[&str], writable: &[&str]) -> Ext4Mount {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    chmod(fs.path(), 0o755);
    for name in names {
        let path = fs.path().join(name);
        write_cold_file(&path, 4 << 20);
        chmod(
            &path,
            if writable.contains(name) {
                0o666
            } else {
                0o644
            },
        );
    }
    fs
}

/// What `nobody` is answered to `args`, refused: the exit code and the message.
fn nobodys_refusal(daemon: &Daemon, args: &[&str]) -> (Option<i32>, String) {
    let output = abissctl_as_nobody(daemon.socket(), args);
    assert!(!output.status.success(), "{args:?} was carried out");
    (output.status.code(), stderr(&output))
}

#[test]
fn another_users_stream_is_answered_as_a_missing_one() {
    require_root!();
    let fs = files(&["roots.bin", "quiet.bin"], &[]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let roots = fs.path().join("roots.bin");
    let quiet = fs.path().join("quiet.bin");
    let id = daemon.attach_at_1mb(&roots).to_string();
    // An id no stream has: ids count up from 1.
    let missing = "987654";
    let (roots, quiet) = (roots.to_str().unwrap(), quiet.to_str().unwrap());
    for verb in [&["detach"][..], &["set-rate", "1kB/s"]] {
        // The answer about `target`, which it names as `name`.
        let ask = |target: &str, name: &str| {
            let mut args = vec![verb[0], target];
            args.extend_from_slice(&verb[1..]);
            let (code, message) = nobodys_refusal(&daemon, &args);
            (code, message.replace(target, name))
        };
        let by_id = ask(&id, "N");
        assert_eq!(
            by_id,
            ask(missing, "N"),
            "{verb:?}: root's stream {id} and no stream are told apart"
        );
        assert!(by_id.1.contains("stream N is not attached"), "{by_id:?}");
        let by_file = ask(roots, "FILE");
        assert_eq!(
            by_file,
            ask(quiet, "FILE"),
            "{verb:?}: root's file and a file without a stream are told apart"
        );
        assert!(!by_file.1.contains(&id), "{by_file:?}");
    }
    // Nothing changed, and root is still told what there is.
    let streams = daemon.streams();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].rate.0, 1_000_000, "nobody changed root's rate");
    let root = daemon.ctl(["set-rate", &id, "2MB/s"]);
    assert!(root.status.success(), "{}", stderr(&root));
}

#[test]
fn a_second_recording_is_not_told_another_users_stream_id() {
    require_root!();
    let fs = files(&["recorded.ts"], &["recorded.ts"]);
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let path = fs.path().join("recorded.ts");
    let path = path.to_str().unwrap();
    let record = [
        "attach", path, "--write", "--rate", "1MB/s", "--buffer", "1MiB",
    ];
    let id = attached_id(&daemon.ctl(record));
    let (code, message) = nobodys_refusal(&daemon, &record);
    assert_eq!(code, Some(9), "{message}");
    assert!(
        message.contains("is already being recorded; a file has one recording at most"),
        "{message}"
    );
    assert!(
        !message.contains(&format!("stream {id}")),
        "nobody was told root's stream: {message}"
    );
    // Root, whose recording it is, is told which stream records it.
    let root = daemon.ctl(record);
    assert!(
        stderr(&root).contains(&format!("already being recorded by stream {id}")),
        "{}",
        stderr(&root)
    );
}

#[test]
fn a_file_name_with_a_newline_forges_no_log_line() {
    require_root!();
    let forged = "[2026-01-01T00:00:00Z WARN  abiss_daemon] forged by nobody";
    let name = format!("evil\n{forged}\r\u{1b}[2K.bin");
    let fs = files(&[&name], &[]);
    let device = fs.device().path().to_string_lossy().into_owned();
    let daemon = Daemon::start_logging(&["--device", &device]);
    let path = fs.path().join(&name);
    let path = path.to_str().unwrap();
    let attached = abissctl_as_nobody(
        daemon.socket(),
        &["attach", path, "--rate", "1MB/s", "--buffer", "564KiB"],
    );
    let id = attached_id(&attached).to_string();
    let detached = abissctl_as_nobody(daemon.socket(), &["detach", &id]);
    assert!(detached.status.success(), "{}", stderr(&detached));
    let log = daemon.log();
    let naming: Vec<&str> = log.lines().filter(|l| l.contains("forged")).collect();
    // The attach and the detach are logged, each on its own line, with the name escaped.
    assert!(naming.len() >= 2, "{log}");
    for line in naming {
        assert!(
            line.contains(&format!("evil\\n{forged}\\r\\u{{1b}}[2K.bin")),
            "a line naming the file is not abissd's own: {line:?}\n{log}"
        );
    }
    assert!(log.contains(&format!("stream {id}: detached")), "{log}");
    assert!(
        !log.contains('\r') && !log.contains('\u{1b}'),
        "control characters reached the log: {log:?}"
    );
}

/// Two files of nobody's, one named with a newline and one with a backslash and an `n` in
/// its place: their log lines must tell them apart. (Before, the backslash was logged as it
/// is, so `twin\n.bin` written by a user read exactly as an escaped newline.)
#[test]
fn a_file_name_with_a_backslash_is_told_apart_from_one_with_a_newline() {
    require_root!();
    let newline = "twin\n.bin";
    let backslash = "twin\\n.bin";
    let fs = files(&[newline, backslash], &[]);
    let device = fs.device().path().to_string_lossy().into_owned();
    let daemon = Daemon::start_logging(&["--device", &device]);
    let mut ids = Vec::new();
    for name in [newline, backslash] {
        let path = fs.path().join(name);
        let attached = abissctl_as_nobody(
            daemon.socket(),
            &[
                "attach",
                path.to_str().unwrap(),
                "--rate",
                "1MB/s",
                "--buffer",
                "564KiB",
            ],
        );
        ids.push(attached_id(&attached));
    }
    let log = daemon.log();
    // What each stream's attach line shows of its file's name.
    let shown: Vec<String> = ids
        .iter()
        .map(|id| {
            let line = log
                .lines()
                .find(|l| l.contains(&format!("stream {id}: ")) && l.contains("twin"))
                .unwrap_or_else(|| panic!("stream {id}'s attach is logged: {log}"));
            let from = line.find("twin").expect("the name");
            let to = from + line[from..].find(".bin").expect("the name's end");
            line[from..to].to_owned()
        })
        .collect();
    println!("logged as {shown:?}");
    assert_ne!(
        shown[0], shown[1],
        "a backslash and an n read as an escaped newline: {log}"
    );
    assert_eq!(shown[0], "twin\\n", "{log}");
}
