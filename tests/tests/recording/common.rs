//! What the recording tests share: the paced recorder (`abiss-test-recorder`) run and read, a
//! write stream attached, a best-effort writer, the dirty pages of a file, and a small
//! machine's dirty limits. Included by `tests/recording.rs`, `tests/recording_deadlines.rs`,
//! `tests/recording_clients.rs` and `tests/recording_direct.rs`.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use abiss_proto::StreamId;
use abiss_tests::{attached_id, binary, Daemon};

pub(crate) const MIB: u64 = 1 << 20;

pub(crate) const RATE: u64 = MIB;

pub(crate) const BUFFER: u64 = MIB;

pub(crate) const BATCH: u64 = 20 * 4096;

pub(crate) const WRITE: u64 = 64 * 1024;

/// Dirty and under-writeback bytes of `path` in the page cache (`cachestat`, Linux 6.5).
pub(crate) fn dirty_bytes(path: &Path) -> u64 {
    #[repr(C)]
    struct Range {
        offset: u64,
        length: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    let Ok(file) = File::open(path) else {
        return 0;
    };
    let range = Range {
        offset: 0,
        length: 0,
    };
    let mut stat = Stat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, live locals of the kernel's layout.
    let rc = unsafe { libc::syscall(451, file.as_raw_fd(), &raw const range, &raw mut stat, 0u32) };
    assert_eq!(rc, 0, "cachestat: {}", std::io::Error::last_os_error());
    let _ = (stat.cache, stat.evicted, stat.recently_evicted);
    (stat.dirty + stat.writeback) * 4096
}

/// Runs the paced recorder on `file` for `seconds` with a capture buffer of `capture_ms`
/// (under `SCHED_FIFO` with `ABISS_RECORDER_FIFO=1`, for a comparison: the kernel lets
/// real-time tasks dirty a quarter more than others).
pub(crate) fn record(file: &Path, capture_ms: u64, seconds: u64) -> serde_json::Value {
    run_recorder(&[], file, (capture_ms, seconds), &[])
}

/// [`record`], started by the command line `prefix` (a tracer's cgroup), with each write's time
/// and wait for a CPU in the summary (`per-write`).
pub(crate) fn record_per_write(
    prefix: &[String],
    file: &Path,
    capture_ms: u64,
    seconds: u64,
) -> serde_json::Value {
    run_recorder(prefix, file, (capture_ms, seconds), &["per-write"])
}

pub(crate) fn run_recorder(
    prefix: &[String],
    file: &Path,
    (capture_ms, seconds): (u64, u64),
    options: &[&str],
) -> serde_json::Value {
    let mut command = if let Some((first, rest)) = prefix.split_first() {
        let mut command = Command::new(first);
        command.args(rest).arg(binary("abiss-test-recorder"));
        command
    } else if std::env::var_os("ABISS_RECORDER_FIFO").is_some() {
        let mut chrt = Command::new("chrt");
        chrt.args(["-f", "30"]).arg(binary("abiss-test-recorder"));
        chrt
    } else {
        Command::new(binary("abiss-test-recorder"))
    };
    let output = command
        .arg(file)
        .args([
            RATE.to_string(),
            WRITE.to_string(),
            capture_ms.to_string(),
            seconds.to_string(),
        ])
        .args(options)
        .output()
        .expect("run the recorder");
    assert!(
        output.status.success(),
        "recorder: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("recorder summary")
}

pub(crate) fn attach_for_writing(daemon: &Daemon, file: &Path) -> StreamId {
    let output = daemon.ctl([
        "attach".as_ref(),
        file.as_os_str(),
        "--write".as_ref(),
        "--rate".as_ref(),
        "1MiB/s".as_ref(),
        "--buffer".as_ref(),
        "1MiB".as_ref(),
    ]);
    attached_id(&output)
}

/// A best-effort sequential writer of 1 MiB blocks, going round a 512 MiB file; stopped on
/// drop. Returns the bytes written.
pub(crate) struct BestEffortWriter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

/// Bytes a writer to the disk keeps under writeback at most.
const IN_FLIGHT: u64 = 8 * MIB;

impl BestEffortWriter {
    /// A writer into the page cache: what reaches the disk is the machine's dirty limits' to
    /// say (on the lab VM's 23 GiB, none of a 512 MiB file for 30 s unless a test sets small
    /// limits), and the writer runs a CPU flat out.
    pub(crate) fn start(path: PathBuf) -> Self {
        Self::run(path, false)
    }

    /// A writer to the disk: each block's writeback starts once it is written, and the writer
    /// waits for the block 8 MiB behind it, so the disk sets its pace, whatever the machine's
    /// dirty limits.
    pub(crate) fn start_to_disk(path: PathBuf) -> Self {
        Self::run(path, true)
    }

    fn run(path: PathBuf, to_disk: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut file = File::create(&path).expect("create the writer's file");
            let block = vec![0x3c_u8; 1 << 20];
            let mut written = 0u64;
            while !stopping.load(Ordering::Relaxed) {
                let at = written % (512 * MIB);
                if at == 0 {
                    file.seek(SeekFrom::Start(0)).expect("rewind");
                }
                file.write_all(&block).expect("best-effort write");
                written += MIB;
                if to_disk {
                    flush_range(&file, at, libc::SYNC_FILE_RANGE_WRITE);
                    if let Some(behind) = at.checked_sub(IN_FLIGHT) {
                        flush_range(
                            &file,
                            behind,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        );
                    }
                }
            }
            written
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .map_or(0, |thread| thread.join().expect("writer"))
    }
}

/// `sync_file_range` of the MiB of `file` at `at`.
fn flush_range(file: &File, at: u64, flags: libc::c_uint) {
    let offset = libc::off64_t::try_from(at).expect("an offset in the file");
    let length = libc::off64_t::try_from(MIB).expect("a MiB");
    // SAFETY: sync_file_range takes a descriptor this function borrows and integers.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, length, flags) };
    assert_eq!(
        rc,
        0,
        "sync_file_range: {}",
        std::io::Error::last_os_error()
    );
}

impl Drop for BestEffortWriter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `vm.dirty_bytes` and `vm.dirty_background_bytes` of a small machine, put back on drop (also
/// when the test panics).
pub(crate) struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

impl DirtyLimits {
    pub(crate) fn small_box() -> Self {
        let keys = [
            "dirty_ratio",
            "dirty_bytes",
            "dirty_background_ratio",
            "dirty_background_bytes",
        ];
        let saved = keys
            .iter()
            .map(|key| {
                let value = std::fs::read_to_string(format!("/proc/sys/vm/{key}")).expect("read");
                (*key, value.trim().to_owned())
            })
            .collect();
        let limits = Self { saved };
        set_vm("dirty_bytes", &(64 * MIB).to_string());
        set_vm("dirty_background_bytes", &(16 * MIB).to_string());
        limits
    }
}

pub(crate) fn set_vm(key: &str, value: &str) {
    std::fs::write(format!("/proc/sys/vm/{key}"), value)
        .unwrap_or_else(|error| panic!("vm.{key} = {value}: {error}"));
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        // Writing a ratio clears its bytes twin and back: write the one that was in force.
        for (ratio, bytes) in [
            ("dirty_ratio", "dirty_bytes"),
            ("dirty_background_ratio", "dirty_background_bytes"),
        ] {
            let value = |key: &str| {
                self.saved
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            if value(bytes) == "0" {
                let _ = std::fs::write(format!("/proc/sys/vm/{ratio}"), value(ratio));
            } else {
                let _ = std::fs::write(format!("/proc/sys/vm/{bytes}"), value(bytes));
            }
        }
    }
}
