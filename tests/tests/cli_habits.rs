//! abissctl keeps the habits of the tools it sits beside: bcc's `[interval [count]]` and `-T`,
//! fio's and dd's `64k` = 64 KiB with fractions and bit rates, RFC 3339 times in JSON, and a
//! `run` that passes signals on to its command and reports a death by signal N as 128 + N.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use abiss_tests::{
    assert_fails, binary, require_root, stderr, wait_until, write_cold_file, Daemon, Ext4Mount,
    LoopDevice, Scratch,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A managed ext4 loop device with a file to stream. Field order: the daemon (which holds the
/// streamed files open) goes before the filesystem is unmounted.
struct Managed {
    daemon: Daemon,
    fs: Ext4Mount,
    file: PathBuf,
}

fn managed() -> Managed {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    let daemon = Daemon::start_managing(fs.device().path(), &["--capacity", "20MB/s"]);
    let file = fs.path().join("movie.bin");
    write_cold_file(&file, 4 << 20);
    Managed { daemon, fs, file }
}

fn abissctl(socket: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(binary("abissctl"));
    command.arg("--socket").arg(socket).args(args);
    command
}

/// Whether `line` is a time of day as `-T` prints it: `HH:MM:SS`.
fn is_clock_time(line: &str) -> bool {
    let bytes = line.as_bytes();
    bytes.len() == 8
        && bytes[2] == b':'
        && bytes[5] == b':'
        && [0, 1, 3, 4, 6, 7]
            .iter()
            .all(|&i| bytes[i].is_ascii_digit())
}

#[test]
fn trace_with_a_positional_interval_and_count_prints_that_many_reports_and_ends() {
    require_root!();
    let daemon = Daemon::start();
    let started = Instant::now();
    let output = abissctl(daemon.socket(), &["trace", "0.5", "2", "--json"])
        .output()
        .expect("run abissctl");
    let elapsed = started.elapsed();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let reports: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON report per line"))
        .collect();
    assert_eq!(reports.len(), 2, "two reports: {stdout}");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(10),
        "two half-second intervals took {elapsed:?}"
    );
    for report in &reports {
        // RFC 3339 in UTC: 2026-05-01T12:34:56.789Z.
        let time = report["time"].as_str().expect("time is a string");
        assert!(
            time.len() >= 20 && time.as_bytes()[10] == b'T' && time.ends_with('Z'),
            "RFC 3339 time: {time}"
        );
        let interval = report["interval_s"]
            .as_f64()
            .expect("interval_s is a number");
        assert!(interval > 0.3 && interval < 5.0, "interval {interval}");
    }

    // The text form without -T prints no clock time; two reports still end the run.
    let output = abissctl(daemon.socket(), &["trace", "0.2", "2"])
        .output()
        .expect("run abissctl");
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        !stdout.lines().any(is_clock_time),
        "no time without -T: {stdout}"
    );
}

#[test]
fn trace_dash_t_prints_the_time_of_each_report() {
    require_root!();
    let daemon = Daemon::start();
    let output = abissctl(daemon.socket(), &["trace", "-T", "0.3", "3"])
        .output()
        .expect("run abissctl");
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let times = stdout.lines().filter(|line| is_clock_time(line)).count();
    assert_eq!(times, 3, "one time per report: {stdout}");
}

#[test]
fn trace_interval_given_twice_is_a_usage_error() {
    let dir = Scratch::new_in("/tmp", "habits-usage");
    let socket = dir.path().join("absent.sock");
    let cases: [&[&str]; 3] = [
        &["trace", "1", "--interval", "2"],
        &["trace", "1", "2", "--count", "3"],
        &["trace", "1", "0", "--json"],
    ];
    for args in cases {
        let output = abissctl(&socket, args).output().expect("run abissctl");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));
    }
}

/// Starts `abissctl run` on the managed file with `command`, and waits until the stream is
/// attached and `ready` exists (the command made it once its signal handling was in place).
fn start_run(setup: &Managed, ready: &Path, command: &str) -> Child {
    let child = abissctl(
        setup.daemon.socket(),
        &["run", "--rate", "1MB/s", setup.file.to_str().unwrap(), "--"],
    )
    .args(["sh", "-c", command])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start abissctl run");
    assert!(
        wait_until(Duration::from_secs(15), || ready.exists()),
        "the command under abissctl run did not start"
    );
    assert_eq!(
        setup.daemon.streams().len(),
        1,
        "the run's stream is attached"
    );
    child
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("poll abissctl") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("abissctl run did not end within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).unwrap())
}

/// The command starts with no signal blocked, as from a shell: abissctl blocks the signals
/// it forwards only in itself. A player started with SIGTERM blocked would never see the
/// SIGTERM abissctl passes on. `grep` reads its own status (sh would clear the mask first).
#[test]
fn run_starts_its_command_with_no_signal_blocked() {
    require_root!();
    let setup = managed();
    let output = abissctl(
        setup.daemon.socket(),
        &["run", "--rate", "1MB/s", setup.file.to_str().unwrap(), "--"],
    )
    .args(["grep", "^SigBlk:", "/proc/self/status"])
    .output()
    .expect("abissctl run grep");
    assert!(output.status.success(), "{}", stderr(&output));
    let line = String::from_utf8_lossy(&output.stdout);
    let mask = line.trim().trim_start_matches("SigBlk:").trim();
    assert!(
        !mask.is_empty() && mask.chars().all(|c| c == '0'),
        "the command's blocked signals: {line}"
    );
}

#[test]
fn run_passes_sigterm_to_its_command_and_exits_with_128_plus_the_signal() {
    require_root!();
    let setup = managed();
    let dir = Scratch::new_in("/tmp", "habits-term");
    let ready = dir.path().join("ready");
    let pid_file = dir.path().join("pid");
    // The shell execs sleep, so the process that gets the signal is the command itself, with
    // the default action: it dies of SIGTERM.
    let mut run = start_run(
        &setup,
        &ready,
        &format!(
            "echo $$ > {pid}; touch {ready}; exec sleep 60",
            pid = pid_file.display(),
            ready = ready.display()
        ),
    );
    let command_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(pid_of(&run), Signal::SIGTERM).unwrap();
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert_eq!(status.code(), Some(143), "128 + SIGTERM (15)");
    assert!(
        kill(Pid::from_raw(command_pid), None).is_err(),
        "the command is gone"
    );
    assert!(
        wait_until(Duration::from_secs(5), || setup.daemon.streams().is_empty()),
        "the run's stream ended with it"
    );
}

#[test]
fn run_passes_sigusr1_on_and_keeps_waiting_for_its_command() {
    require_root!();
    let setup = managed();
    let dir = Scratch::new_in("/tmp", "habits-usr1");
    let ready = dir.path().join("ready");
    let got = dir.path().join("got-usr1");
    // SIGUSR1 would kill abissctl by default: that it exits with the command's own code shows
    // it passed the signal on and stayed.
    let mut run = start_run(
        &setup,
        &ready,
        &format!(
            "trap 'touch {got}; exit 7' USR1; touch {ready}; while :; do sleep 0.1; done",
            got = got.display(),
            ready = ready.display()
        ),
    );
    kill(pid_of(&run), Signal::SIGUSR1).unwrap();
    let status = wait_with_timeout(&mut run, Duration::from_secs(10));
    assert!(got.exists(), "the command got SIGUSR1");
    assert_eq!(status.code(), Some(7), "the command's own exit code");
}

#[test]
fn fractional_and_bit_rates_are_accepted_and_the_rounding_is_told_once() {
    require_root!();
    let setup = managed();
    let file = setup.file.to_str().unwrap();
    let output = setup.daemon.ctl(["attach", file, "--rate", "1.1MiB/s"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let message = stderr(&output);
    assert_eq!(
        message
            .matches("rate 1.1MiB/s rounded up to 1153434 bytes/s")
            .count(),
        1,
        "one rounding note: {message}"
    );
    let other = setup.fs.path().join("other.bin");
    write_cold_file(&other, 2 << 20);
    let output = setup.daemon.ctl([
        "attach",
        other.to_str().unwrap(),
        "--rate",
        "8Mbit/s",
        "--buffer",
        "1M",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("rounded"), "8Mbit/s is exact");
    let mut rates: Vec<(u64, Option<u64>)> = setup
        .daemon
        .streams()
        .iter()
        .map(|info| {
            // A reader attached without --buffer has abissd size it (auto, no part of its own).
            let fixed = info.buffer_auto.is_none().then_some(info.buffer.0);
            (info.rate.0, fixed)
        })
        .collect();
    rates.sort_unstable();
    assert_eq!(
        rates,
        [(1_000_000, Some(1 << 20)), (1_153_434, None)],
        "8Mbit/s is 1 000 000 B/s, 1M is 1 MiB, and no --buffer is auto"
    );
    // A recording's buffer bounds its dirty memory, so without --buffer it is the fixed
    // default, not auto (which abissd refuses for a recording).
    let recording = setup.fs.path().join("recording.ts");
    let output = setup.daemon.ctl([
        "attach",
        recording.to_str().unwrap(),
        "--write",
        "--rate",
        "1MB/s",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let streams = setup.daemon.streams();
    let recorded = streams
        .iter()
        .find(|info| info.recording.is_some())
        .expect("the recording is listed");
    assert_eq!(
        (recorded.buffer.0, recorded.buffer_auto.is_some()),
        (abiss_proto::DEFAULT_BUFFER_BYTES, false)
    );

    let output = setup.daemon.ctl([
        "admit",
        "--device",
        &setup.fs.device().name(),
        "--rate",
        "0.5MiB/s",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains("rounded"), "0.5MiB/s is exact");
}

#[test]
fn a_rate_with_an_unknown_unit_is_a_usage_error_in_one_sentence() {
    let dir = Scratch::new_in("/tmp", "habits-units");
    let socket = dir.path().join("absent.sock");
    let run = |args: &[&str]| abissctl(&socket, args).output().expect("run abissctl");
    assert_fails(
        &run(&["attach", "/etc/hostname", "--rate", "1XB/s"]),
        2,
        "'1XB/s' is not a valid rate ('XB/s' is not a unit)",
    );
    assert_fails(
        &run(&["admit", "--device", "loop0", "--rate", "1mb/s"]),
        2,
        "Mbit/s",
    );
    assert_fails(
        &run(&[
            "attach",
            "/etc/hostname",
            "--rate",
            "1MB/s",
            "--buffer=-64k",
        ]),
        2,
        "negative",
    );
    assert_fails(
        &run(&["attach", "/etc/hostname", "--rate", "0Mbit/s"]),
        2,
        "zero",
    );
}

/// Sizes as people read them: `status` printed the locked-memory budget as `6170948KiB` (a
/// quarter of this machine's RAM), where `top` prints 5.9GiB. Now every figure of its line
/// is the one parser's readable form (it parses back, three significant digits at most), for
/// `nobody` as for root; and `--buffer`'s help names the default of each kind of stream
/// instead of a single `[default: 564KiB]` beside "`auto` (the default when reading)".
#[test]
fn status_shows_sizes_as_people_read_them_and_help_agrees_with_the_defaults() {
    require_root!();
    let daemon = Daemon::start_with(&["--locked-memory", "6170948KiB"]);
    let output = abiss_tests::abissctl_as_nobody(daemon.socket(), &["status"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("locked memory:"))
        .unwrap_or_else(|| panic!("no locked memory line in\n{text}"));
    assert!(
        line.contains("of 5.88GiB") && line.contains("of 1.47GiB per user"),
        "{line}"
    );
    for figure in line
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter(|word| word.starts_with(|c: char| c.is_ascii_digit()))
        // Nothing locked yet: the parser takes no zero, and this says it plainly.
        .filter(|word| *word != "0B")
    {
        assert!(
            figure.parse::<abiss_proto::ByteSize>().is_ok(),
            "{figure} in {line}"
        );
        let digits = figure
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .filter(char::is_ascii_digit)
            .count();
        assert!(digits <= 3, "{figure} in {line}");
    }
    for subcommand in ["run", "attach"] {
        let help = abissctl(daemon.socket(), &[subcommand, "--help"])
            .output()
            .expect("run abissctl --help");
        let help = String::from_utf8_lossy(&help.stdout);
        assert!(
            help.contains("a reader's is `auto` and a recording's 564KiB"),
            "{help}"
        );
        assert!(!help.contains("[default: 564KiB]"), "{help}");
    }
}
