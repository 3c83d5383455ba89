//! The C API (`abiss-c`: `libabiss.so` with `include/abiss.h`) from real C programs: the
//! example player `play.c` reads a file on a managed loop device at its byterate, and
//! `probe.c` checks the API's errors (errno and message) and stdio semantics against a real
//! abissd, and the options of `abiss_fopen_opts` (a preroll) as the daemon applies them.
//!
//! The programs are compiled here with `cc` against the freshly built library. Tests that
//! create loop devices take [`SERIAL`]: the fixtures name their scratch directories by
//! process id, so two at once in one process would share an image.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use abiss_proto::{Request, Response, StreamId};
use abiss_tests::{
    abiss_c_library, compile_c_example, require_root, resident_bytes, wait_until, workspace,
    Daemon, Ext4Mount, LoopDevice, Scratch,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const PLAY_RATE_BPS: u64 = 4_000_000;
/// 8 MiB at 4 MB/s: about 2.1 s of playing.
const PLAY_FILE_BYTES: usize = 8 << 20;

/// `play` and `probe`, compiled into a scratch directory against the header and library.
struct Programs {
    dir: Scratch,
}

impl Programs {
    fn build(tag: &str) -> Self {
        let dir = Scratch::new_in("/tmp", tag);
        let library = abiss_c_library();
        for name in ["play", "probe"] {
            let _ = compile_c_example(name, &library, dir.path());
        }
        Self { dir }
    }

    fn command(&self, name: &str, socket: &Path) -> Command {
        let mut command = Command::new(self.dir.path().join(name));
        command.env("ABISS_SOCKET", socket);
        command
    }
}

/// The streams abissd serves now.
fn streams(daemon: &Daemon) -> usize {
    match daemon.connect().call(Request::List) {
        Response::Streams { streams } => streams.len(),
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Runs `command` to completion, killing it after `timeout`.
fn run(mut command: Command, timeout: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("poll child").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("collect output");
            panic!(
                "{command:?} did not finish within {timeout:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collect output")
}

/// The `key=value` fields of the program's line starting with `prefix`.
fn fields(output: &Output, prefix: &str) -> HashMap<String, String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|line| line.starts_with(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' line in: {stdout}"));
    line[prefix.len()..]
        .split_whitespace()
        .filter_map(|field| field.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

fn number(fields: &HashMap<String, String>, key: &str) -> u64 {
    fields
        .get(key)
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no number {key} in {fields:?}"))
}

/// A file of `bytes` on the mount, written through and dropped from the page cache, so every
/// byte `play` reads was brought in by abissd or the disk.
fn write_cold_file(path: &Path, bytes: usize) {
    let mut file = std::fs::File::create(path).expect("create file");
    let pattern: Vec<u8> = (0..=255_u8).cycle().take(1 << 20).collect();
    for _ in 0..bytes.div_ceil(pattern.len()) {
        file.write_all(&pattern).expect("write file");
    }
    file.set_len(bytes as u64).expect("trim file");
    file.sync_all().expect("sync file");
    // SAFETY: fadvise on a descriptor we own; no memory is passed.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise failed");
}

/// What `probe` reports for an `abiss_fopen` that fails: (errno, message).
fn probe_failure(programs: &Programs, socket: &Path, args: &[&str]) -> (i32, String) {
    let mut command = programs.command("probe", socket);
    command.args(args);
    let output = run(command, Duration::from_secs(10));
    assert_eq!(
        output.status.code(),
        Some(3),
        "probe {args:?} should fail to open; stdout: {} stderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("probe: errno="))
        .unwrap_or_else(|| panic!("no errno in {stdout}"));
    let (errno, message) = line.split_once(" message=").expect("errno and message");
    let message = message.to_owned();
    assert!(
        !message.is_empty() && !message.contains('\n'),
        "one sentence: {message:?}"
    );
    (errno.parse().expect("errno number"), message)
}

#[test]
fn play_reads_a_managed_file_at_its_byterate() {
    require_root!();
    let _serial = serial();
    let programs = Programs::build("c-play-programs");
    let mount = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(mount.device().path(), &[]);
    let file = mount.path().join("movie.ts");
    write_cold_file(&file, PLAY_FILE_BYTES);

    let mut command = programs.command("play", daemon.socket());
    command.arg(&file).arg(PLAY_RATE_BPS.to_string());
    let started = Instant::now();
    let output = run(command, Duration::from_secs(30));
    let wall = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "play failed: {stderr}");
    let report = fields(&output, "play:");
    println!("play: {report:?} in {wall:?}");

    assert!(number(&report, "stream") > 0, "{report:?}");
    assert_eq!(number(&report, "bytes"), PLAY_FILE_BYTES as u64);
    assert_eq!(
        number(&report, "reads"),
        (PLAY_FILE_BYTES / (64 << 10)) as u64
    );
    // The last read (the one that finds the end) is due at size / rate: never earlier, and
    // paced reads of memory-resident data end soon after.
    let expected_ms = PLAY_FILE_BYTES as u64 * 1000 / PLAY_RATE_BPS;
    let elapsed_ms = number(&report, "elapsed_ms");
    assert!(
        (expected_ms.saturating_sub(20)..=expected_ms + 500).contains(&elapsed_ms),
        "played in {elapsed_ms} ms, expected about {expected_ms} ms: {report:?}"
    );
    // abiss_fclose detached the stream.
    assert_eq!(streams(&daemon), 0, "the stream outlived abiss_fclose");
}

#[test]
fn fopen_fails_with_errno_and_a_sentence() {
    require_root!();
    let _serial = serial();
    let programs = Programs::build("c-fopen-programs");
    let mount = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(mount.device().path(), &[]);
    let file = mount.path().join("clip.ts");
    write_cold_file(&file, 1 << 20);
    let empty = mount.path().join("empty.ts");
    std::fs::File::create(&empty).expect("create empty file");
    let elsewhere = Scratch::new_in("/tmp", "c-unmanaged");
    let unmanaged = elsewhere.path().join("clip.ts");
    write_cold_file(&unmanaged, 1 << 20);
    let socket = daemon.socket();
    let text = |path: &Path| path.to_string_lossy().into_owned();

    let cases: [(String, &str, &str, i32, &str); 7] = [
        (
            text(&file),
            "w+",
            "1000000",
            libc::EINVAL,
            "not a stream mode",
        ),
        (
            text(&file),
            "r+",
            "1000000",
            libc::EINVAL,
            "not a stream mode",
        ),
        (
            text(mount.path()),
            "r",
            "1000000",
            libc::EISDIR,
            "is a directory",
        ),
        (
            text(&unmanaged),
            "r",
            "1000000",
            libc::ENODEV,
            "does not manage",
        ),
        (text(&empty), "rb", "1000000", libc::EINVAL, "is empty"),
        (
            text(&mount.path().join("missing.ts")),
            "r",
            "1000000",
            libc::ENOENT,
            "cannot open",
        ),
        // Far above the loop device's real-time share: admission control refuses.
        (text(&file), "r", "1000000000", libc::EBUSY, ""),
    ];
    for (path, mode, rate, errno, words) in &cases {
        let (got, message) = probe_failure(&programs, socket, &[path.as_str(), mode, rate]);
        assert_eq!(
            got, *errno,
            "abiss_fopen({path}, {mode}, {rate}): {message}"
        );
        assert!(
            message.contains(words),
            "abiss_fopen({path}, {mode}): {message}"
        );
    }
    // A refused stream left nothing behind, and the same file streams fine at a fair rate.
    assert_eq!(streams(&daemon), 0);
    let mut command = programs.command("probe", socket);
    command.arg(&file).args(["r", "1000000", "0"]);
    let output = run(command, Duration::from_secs(10));
    assert!(
        output.status.success(),
        "probe on a managed file: {} {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report = fields(&output, "probe:");
    assert_eq!(number(&report, "size"), 1 << 20, "{report:?}");
    assert_eq!(streams(&daemon), 0, "the stream outlived abiss_fclose");
}

/// `abiss_fopen_opts` with a preroll: abissd loads and locks the file's head beyond the
/// buffer, and its tail, at once (at 1 MB/s the 8 MiB would take 8 s), and a second preroll that does not fit
/// in the locked-memory budget next to it is refused with `EBUSY`, attaching nothing. With
/// `ABISS_BUFFER_AUTO` abissd sizes the buffer on top of the application's part.
#[test]
fn fopen_opts_prerolls_the_head_of_the_file() {
    require_root!();
    let _serial = serial();
    let programs = Programs::build("c-preroll-programs");
    let mount = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(mount.device().path(), &["--locked-memory", "16MiB"]);
    let path = mount.path().join("movie.ts");
    write_cold_file(&path, 12 << 20);
    let file = File::open(&path).expect("open the file");
    let path_text = path.to_str().expect("a UTF-8 path");
    let socket = daemon.socket();
    let preroll: u64 = 8 << 20;

    let preroll_text = preroll.to_string();
    let (mut child, id) = holding_probe(
        &programs,
        socket,
        &[
            "--preroll",
            preroll_text.as_str(),
            "--hold",
            path_text,
            "r",
            "1000000",
        ],
    );
    let stream = || daemon.streams().into_iter().find(|s| s.id == id);
    let locked = || stream().map_or(0, |s| s.locked_bytes);
    let started = Instant::now();
    // The file's last 512 KiB come with it (the player's look at the duration).
    let tail = 512 << 10;
    assert!(
        wait_until(Duration::from_secs(3), || locked() == preroll + tail),
        "the 8 MiB preroll and the tail locked at once ({} bytes locked after {:?})",
        locked(),
        started.elapsed()
    );
    assert_eq!(resident_bytes(&file, 0, preroll), preroll);
    assert_eq!(resident_bytes(&file, (12 << 20) - tail, tail), tail);
    let info = stream().expect("the stream");
    assert_eq!(
        info.buffer.0,
        abiss_proto::DEFAULT_BUFFER_BYTES,
        "app_buffer 0 is the default buffer, the preroll lies beyond it"
    );

    // 8 MiB locked + 12 MiB do not fit in 16 MiB.
    let (errno, message) = probe_failure(
        &programs,
        socket,
        &["--preroll", "12582912", path_text, "r", "1000000"],
    );
    assert_eq!(errno, libc::EBUSY, "{message}");
    assert!(message.contains("abissd may lock"), "{message}");
    assert_eq!(streams(&daemon), 1, "the refused stream was attached");

    // Closing probe's stdin lets it check the stream and close it.
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("probe");
    assert!(
        output.status.success(),
        "probe after the preroll: {} {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(streams(&daemon), 0, "the stream outlived abiss_fclose");

    // The example player's --preroll.
    let mut command = programs.command("play", socket);
    command.args(["--preroll", "2097152", path_text, "4000000"]);
    let output = run(command, Duration::from_secs(30));
    assert!(
        output.status.success(),
        "play --preroll: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(number(&fields(&output, "play:"), "bytes"), 12 << 20);

    abissd_sizes_the_buffer(&programs, &daemon, path_text);
}

/// `probe ARGS` (with `--hold`), started and read up to the line that says its stream is open:
/// the running probe and its stream's id.
fn holding_probe(programs: &Programs, socket: &Path, args: &[&str]) -> (Child, StreamId) {
    let mut child = programs
        .command("probe", socket)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn probe");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("probe's stdout"))
        .read_line(&mut line)
        .expect("read probe's first line");
    let id = line
        .trim()
        .strip_prefix("probe: opened stream=")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("probe did not open the file: {line}"));
    (child, id)
}

/// `ABISS_BUFFER_AUTO`: abissd sizes the buffer, and `app_buffer` is the application's part.
fn abissd_sizes_the_buffer(programs: &Programs, daemon: &Daemon, path_text: &str) {
    let socket = daemon.socket();
    let (mut child, id) = holding_probe(
        programs,
        socket,
        &["--flags", "1", "--hold", path_text, "r", "1000000", "65536"],
    );
    let info = daemon
        .streams()
        .into_iter()
        .find(|s| s.id == id)
        .expect("the stream");
    let auto = info.buffer_auto.clone().expect("an automatic buffer");
    assert_eq!(auto.app_bytes, 65536, "{auto:?}");
    assert!(info.buffer.0 > 65536, "{info:?}");
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("probe");
    assert!(
        output.status.success(),
        "probe with ABISS_BUFFER_AUTO: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `abiss_fopen_opts` refuses options out of range with `EINVAL` and a sentence, attaching
/// nothing; a refused recording, by the library or by abissd, neither creates nor truncates
/// its file.
#[test]
fn fopen_opts_refuses_options_out_of_range() {
    require_root!();
    let _serial = serial();
    let programs = Programs::build("c-options-programs");
    let mount = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let daemon = Daemon::start_managing(mount.device().path(), &[]);
    let file = mount.path().join("clip.ts");
    write_cold_file(&file, 1 << 20);
    let recording = mount.path().join("recording.ts");
    let socket = daemon.socket();
    let file_text = file.to_str().expect("a UTF-8 path");
    let recording_text = recording.to_str().expect("a UTF-8 path");

    let cases: [(&[&str], &str); 12] = [
        (&["--preroll", "-1", file_text, "r", "1000000"], "negative"),
        (
            &["--preroll", "1048576", recording_text, "w", "1000000"],
            "recording has no preroll",
        ),
        (
            &["--preroll", "1048576", recording_text, "a", "1000000"],
            "recording has no preroll",
        ),
        // An existing file given "w": not truncated.
        (
            &["--preroll", "1", file_text, "w", "1000000"],
            "recording has no preroll",
        ),
        (&["--flags", "4", file_text, "r", "1000000"], "unknown"),
        (
            &["--flags", "2", file_text, "r", "1000000"],
            "ABISS_DIRECT records a file from its start",
        ),
        (
            &["--flags", "1", recording_text, "w", "1000000"],
            "ABISS_BUFFER_AUTO",
        ),
        (&["--flags", "0x80", file_text, "w", "1000000"], "unknown"),
        // Refused by the daemon: more than it loads ahead, a buffer under two batches.
        (
            &["--preroll", "67108865", file_text, "r", "1000000"],
            "more than the",
        ),
        (
            &["--preroll", "0", file_text, "r", "1000000", "4096"],
            "smaller than two batches",
        ),
        // Recordings abissd refuses: the existing file keeps its bytes, the missing one is
        // not left behind.
        (
            &["--preroll", "0", file_text, "w", "1000000", "4096"],
            "smaller than two batches",
        ),
        (
            &["--preroll", "0", recording_text, "w", "1000000", "4096"],
            "smaller than two batches",
        ),
    ];
    for (args, words) in cases {
        let (errno, message) = probe_failure(&programs, socket, args);
        assert_eq!(errno, libc::EINVAL, "probe {args:?}: {message}");
        assert!(message.contains(words), "probe {args:?}: {message}");
        assert_eq!(streams(&daemon), 0, "probe {args:?} attached a stream");
    }
    assert!(!recording.exists(), "a refused recording created its file");
    assert_eq!(
        std::fs::metadata(&file).expect("the file").len(),
        1 << 20,
        "a refused recording truncated its file"
    );
    // Options in range: the whole probe passes through abiss_fopen_opts.
    let mut command = programs.command("probe", socket);
    command
        .args(["--preroll", "0", "--flags", "0"])
        .arg(&file)
        .args(["r", "1000000", "0"]);
    let output = run(command, Duration::from_secs(10));
    assert!(
        output.status.success(),
        "probe with default options: {} {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(streams(&daemon), 0, "the stream outlived abiss_fclose");
}

#[test]
fn null_arguments_and_a_missing_daemon_fail_cleanly() {
    let programs = Programs::build("c-null-programs");
    let nowhere = Path::new("/nonexistent-abiss-c-test/abiss.sock");
    let mut command = programs.command("probe", nowhere);
    command.arg("--null");
    let output = run(command, Duration::from_secs(10));
    assert!(
        output.status.success(),
        "NULL arguments: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let manifest = workspace().join("Cargo.toml");
    let (errno, message) = probe_failure(
        &programs,
        nowhere,
        &[&manifest.to_string_lossy(), "r", "1000"],
    );
    assert_eq!(errno, libc::ECONNREFUSED, "{message}");
    assert!(message.contains("abissd is not running"), "{message}");
}

#[test]
fn header_compiles_as_cpp() {
    let dir = Scratch::new_in("/tmp", "c-header-cpp");
    let source = dir.path().join("use.cpp");
    std::fs::write(
        &source,
        "#include \"abiss.h\"\n\
         int main() { ABISS_FILE *fp = abiss_fopen(nullptr, \"r\", 1, 0); \
         struct abiss_options opts = ABISS_OPTIONS_INIT; opts.preroll = 1; \
         ABISS_FILE *with_opts = abiss_fopen_opts(nullptr, \"r\", 1, &opts); \
         return fp == nullptr && with_opts == nullptr && abiss_strerror() != nullptr ? 0 : 1; }\n",
    )
    .expect("write source");
    let library = abiss_c_library();
    let output = Command::new("c++")
        .args(["-std=c++11", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(workspace().join("abiss-c/include"))
        .arg(&source)
        .arg("-o")
        .arg(dir.path().join("use"))
        .arg("-L")
        .arg(&library)
        .arg("-labiss")
        .arg(format!("-Wl,-rpath,{}", library.display()))
        .output()
        .expect("run c++");
    assert!(
        output.status.success(),
        "the header does not build as C++: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let status = Command::new(dir.path().join("use"))
        .status()
        .expect("run the C++ program");
    assert!(
        status.success(),
        "abiss_fopen(NULL) from C++ did not fail cleanly"
    );
}
