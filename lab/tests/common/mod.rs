//! Helpers for the lab's integration tests: they run on the real kernel as root, one at a
//! time (`--test-threads=1`), each with its own state directory.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::Command;

use abiss_lab::{system, Lab, LabOptions, ModelFile, ModelKind};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_abiss-lab");
/// Where the tests keep backing files.
pub const BACKING_DIR: &str = "/var/tmp/abiss-lab-test";

/// Whether the machine can run lab tests; prints why not.
pub fn lab_possible() -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the lab tests need root");
        return false;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is missing");
        return false;
    }
    true
}

/// The state directory of test `name`.
pub fn state_dir(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/abiss-lab-test-{name}"))
}

/// A lab that is taken down when dropped, also when the test panics.
pub struct TestLab {
    pub lab: Lab,
    pub state_dir: PathBuf,
}

impl Drop for TestLab {
    fn drop(&mut self) {
        if let Err(e) = Lab::down(&self.state_dir) {
            eprintln!("taking the test lab down failed: {e}");
        }
    }
}

/// Options for test `name` with the default parameters of `kind`.
pub fn options(name: &str, kind: ModelKind, size_bytes: u64) -> LabOptions {
    let mut options = LabOptions::new(ModelFile::default().spec(kind)).expect("options");
    options.size_bytes = size_bytes;
    options.state_dir = state_dir(name);
    options.backing_dir = PathBuf::from(BACKING_DIR);
    options.emulator_exe = PathBuf::from(BIN);
    options
}

/// The elevator that serves the real-time I/O class first: bfq, or mq-deadline (which has
/// priority classes since Linux 5.14) on a kernel built without bfq.
pub fn priority_elevator() -> &'static str {
    if abiss_lab::system::elevator_available("bfq") {
        "bfq"
    } else {
        eprintln!("this kernel has no bfq: mq-deadline instead");
        "mq-deadline"
    }
}

/// Brings a lab up, clearing what a crashed earlier run of the same test left.
pub fn up(options: &LabOptions) -> TestLab {
    Lab::down(&options.state_dir).expect("clearing leftovers");
    let lab = Lab::up(options).expect("lab up");
    TestLab {
        lab,
        state_dir: options.state_dir.clone(),
    }
}

/// Asserts that nothing of the lab in `state_dir` remains: no loop device over its image, no
/// FUSE mount, no mount of `mount_dir`, no emulator process, no state directory.
pub fn assert_nothing_left(state_dir: &Path, mount_dir: Option<&Path>) {
    let fuse = state_dir.join("fuse");
    let loops: Vec<_> = system::loop_devices()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(&fuse))
        .collect();
    assert!(loops.is_empty(), "loop devices left: {loops:?}");
    let mounts: Vec<_> = system::mounts()
        .into_iter()
        .filter(|(mp, _)| mp.starts_with(state_dir) || mount_dir.is_some_and(|d| mp == d))
        .collect();
    assert!(mounts.is_empty(), "mounts left: {mounts:?}");
    let dir = state_dir.to_string_lossy();
    let processes = system::find_processes(&["serve", "--state-dir", &dir]);
    assert!(
        processes.is_empty(),
        "emulator processes left: {processes:?}"
    );
    assert!(!state_dir.exists(), "state directory left");
}

/// Runs the binary; returns exit code, stdout and stderr.
pub fn run_cli(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .args(args)
        .output()
        .expect("running abiss-lab");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// An `O_DIRECT` reader of a block device with an aligned buffer.
pub struct DirectReader {
    file: std::fs::File,
    buf: Vec<u8>,
    start: usize,
}

impl DirectReader {
    pub fn open(device: &Path, max_len: usize) -> Self {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .expect("open O_DIRECT");
        let buf = vec![0; max_len + 4096];
        let start = buf.as_ptr().align_offset(4096);
        Self { file, buf, start }
    }

    /// Like [`DirectReader::open`], also for writing.
    pub fn open_writable(device: &Path, max_len: usize) -> Self {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(device)
            .expect("open O_DIRECT for writing");
        let buf = vec![0; max_len + 4096];
        let start = buf.as_ptr().align_offset(4096);
        Self { file, buf, start }
    }

    /// The bytes of the last read, or of the next write.
    pub fn buffer(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.start..self.start + len]
    }

    /// Writes the first `len` bytes of [`DirectReader::buffer`] at `offset`; returns how long
    /// it took.
    pub fn write(&mut self, offset: u64, len: usize) -> std::time::Duration {
        use std::os::unix::fs::FileExt;
        let slice = &self.buf[self.start..self.start + len];
        let started = std::time::Instant::now();
        self.file
            .write_all_at(slice, offset)
            .expect("O_DIRECT write");
        started.elapsed()
    }

    /// Reads `len` bytes at `offset`; returns how long it took.
    pub fn read(&mut self, offset: u64, len: usize) -> std::time::Duration {
        use std::os::unix::fs::FileExt;
        let slice = &mut self.buf[self.start..self.start + len];
        let started = std::time::Instant::now();
        self.file
            .read_exact_at(slice, offset)
            .expect("O_DIRECT read");
        started.elapsed()
    }
}
