//! A lab brought up from inside a small memory cgroup serves writes past the cgroup's limit:
//! its emulator leaves that cgroup (`emulator::apart`), so the cgroup's reclaim never waits for
//! a page of the lab disk that only the emulator can write. Before, such a run hung for good,
//! the emulator in `folio_wait_writeback` under `try_charge_memcg` (cgroup v1's reclaim waits
//! on writeback).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abiss_lab::emulator::apart::memory_cgroup_of;
use abiss_lab::Lab;

/// The cgroup's limit, and what the writer writes through it.
const LIMIT_BYTES: u64 = 160 << 20;
const WRITE_MIB: u64 = 480;

/// How long the write may take: the lab hdd writes sequentially at tens of MB/s.
const WRITE_WITHIN: Duration = Duration::from_secs(90);

/// A memory cgroup of its own with a small limit, removed on drop; `None` where this machine
/// has neither a v1 memory hierarchy nor the v2 memory controller.
struct SmallMemoryCgroup {
    dir: PathBuf,
}

impl SmallMemoryCgroup {
    fn new(name: &str, limit: u64) -> Option<Self> {
        let (parent, limit_file) = if Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists() {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else if std::fs::read_to_string("/sys/fs/cgroup/cgroup.subtree_control")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            ("/sys/fs/cgroup", "memory.max")
        } else {
            return None;
        };
        let dir = Path::new(parent).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("make the cgroup");
        std::fs::write(dir.join(limit_file), limit.to_string()).expect("set its limit");
        Some(Self { dir })
    }

    /// `program` with `args`, run inside the cgroup.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let procs = self.dir.join("cgroup.procs");
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("echo $$ > {} && exec \"$@\"", procs.display()))
            .arg("sh")
            .arg(program)
            .args(args);
        command
    }
}

impl Drop for SmallMemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("cannot remove {}", self.dir.display());
    }
}

/// The FUSE connection behind `mountpoint`: the minor number of its device, from the mount
/// table (a `stat` of a hung FUSE mount would hang too).
fn fuse_connection(mountpoint: &Path) -> Option<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mountpoint = mountpoint.to_str()?;
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4) == Some(&mountpoint))
            .then(|| fields.get(2)?.split(':').nth(1).map(str::to_owned))
            .flatten()
    })
}

/// Aborts the FUSE connection behind `mountpoint`, so that a hung emulator's waiters get
/// errors and the lab can be taken down (the connections' file system is mounted for it and
/// taken down again if it was not).
fn abort_fuse(mountpoint: &Path) {
    let Some(connection) = fuse_connection(mountpoint) else {
        eprintln!("no FUSE mount at {}", mountpoint.display());
        return;
    };
    let control = Path::new("/sys/fs/fuse/connections");
    let mounted_here = std::fs::read_dir(control).map_or(0, Iterator::count) == 0
        && Command::new("mount")
            .args(["-t", "fusectl", "none", "/sys/fs/fuse/connections"])
            .status()
            .is_ok_and(|s| s.success());
    let aborted = std::fs::write(control.join(&connection).join("abort"), "1");
    eprintln!("aborted FUSE connection {connection}: {aborted:?}");
    if mounted_here {
        let _ = Command::new("umount")
            .arg("/sys/fs/fuse/connections")
            .status();
    }
}

/// Waits for `child` up to `within`; whether it ended, and how.
fn wait_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

#[test]
fn a_lab_brought_up_in_a_small_memory_cgroup_serves_writes_past_its_limit() {
    if !common::lab_possible() {
        return;
    }
    let Some(cgroup) = SmallMemoryCgroup::new("abiss-lab-test-memory", LIMIT_BYTES) else {
        eprintln!("skipped: no memory cgroup controller on this machine");
        return;
    };
    let state_dir = common::state_dir("memory-cgroup");
    let mount = PathBuf::from(format!("/run/abiss-lab-test-memory-{}", std::process::id()));
    let state = state_dir.to_str().expect("a path");
    let output = cgroup
        .command(
            common::BIN,
            &[
                "up",
                "--model",
                "hdd",
                "--size",
                "1G",
                "--mkfs",
                "ext4",
                "--mount",
                mount.to_str().expect("a path"),
                "--state-dir",
                state,
                "--backing-dir",
                common::BACKING_DIR,
            ],
        )
        .output()
        .expect("run abiss-lab up");
    assert!(output.status.success(), "up: {output:?}");
    let lab = Lab::open(&state_dir).expect("the lab's state");
    let emulator = lab.state().emulator.expect("an emulator").pid;
    let fuse = lab.state().fuse_mountpoint.clone();
    let emulator_cgroup =
        memory_cgroup_of(emulator.unsigned_abs()).expect("the emulator's memory cgroup");

    let target = mount.join("big");
    let mut writer = cgroup
        .command(
            "dd",
            &[
                "if=/dev/zero",
                &format!("of={}", target.display()),
                "bs=1M",
                &format!("count={WRITE_MIB}"),
                "conv=fsync",
                "status=none",
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("run dd");
    let started = Instant::now();
    let ended = wait_within(&mut writer, WRITE_WITHIN);
    let took = started.elapsed();
    if ended.is_none() {
        abort_fuse(&fuse);
        let _ = writer.kill();
        let _ = writer.wait();
    }
    let removed = Lab::down(&state_dir);
    eprintln!(
        "the emulator's memory cgroup: {emulator_cgroup:?}; {WRITE_MIB} MiB through a cgroup of {} MiB: {ended:?} after {took:.1?}; down: {removed:?}",
        LIMIT_BYTES >> 20
    );
    assert_eq!(
        emulator_cgroup, "/",
        "the emulator left the cgroup it was started in"
    );
    assert!(
        ended.is_some_and(|status| status.success()),
        "the write did not end within {WRITE_WITHIN:?}: the lab disk hung in the cgroup's reclaim"
    );
    removed.expect("down");
    common::assert_nothing_left(&state_dir, Some(&mount));
}
