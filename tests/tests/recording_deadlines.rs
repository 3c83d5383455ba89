//! A paced recorder on the lab's emulated hdd meets its deadlines against a best-effort writer
//! under a small machine's dirty limits (ext4 and xfs), and what its slow writes waited for.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use abiss_bench::recording::recorder::Tracer;
use abiss_tests::{require_root, Daemon, HddLab, Scratch};

// A test file is the root of its crate, so a module it shares is named by its path; each
// file uses part of it.
#[path = "recording/common.rs"]
#[allow(dead_code)]
mod common;

use common::*;

fn recorder_seconds() -> u64 {
    std::env::var("ABISS_RECORDING_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// One run of the recorder against the best-effort writer on the lab hdd; with a `tracer`, the
/// recorder runs in its cgroup and its trace says what its slow writes waited for.
fn recorder_against_writer(
    lab: &HddLab,
    daemon: &Daemon,
    name: &str,
    stream: bool,
    tracer: Option<&mut Tracer>,
) -> (serde_json::Value, u64, Option<SlowWrites>) {
    let file = lab.mount().join(name);
    let id = stream.then(|| attach_for_writing(daemon, &file));
    let mut writer = BestEffortWriter::start(lab.mount().join(format!("{name}.be")));
    // Let the writer reach the dirty limit first (and perf start tracing).
    std::thread::sleep(Duration::from_secs(3));
    let (summary, slow) = match tracer {
        Some(tracer) => {
            tracer.mark().expect("the trace marker");
            let summary = record_per_write(&tracer.enter(), &file, 1000, recorder_seconds());
            let (trace, throttle, stop_ms) = tracer
                .finish(abiss_os::clock::monotonic_ns(), None)
                .expect("perf trace of the recorder");
            let recording = abiss_bench::recording::writes::recording_writes(&trace, stop_ms);
            let slow = SlowWrites::of(&recording, &throttle, &summary);
            (summary, Some(slow))
        }
        None => (record(&file, 1000, recorder_seconds()), None),
    };
    let written = writer.stop();
    if let Some(id) = id {
        let _ = daemon.ctl(["detach", &id.to_string()]);
    }
    let _ = std::fs::remove_file(lab.mount().join(format!("{name}.be")));
    (summary, written, slow)
}

/// The write-time goal: a recorder's write(2) returns within this, ms.
const WRITE_GOAL_MS: f64 = 5.0;

/// What a recorder's writes over [`WRITE_GOAL_MS`] waited for. A write that slept in the
/// kernel's dirty-page throttle was paced by the machine's dirty pages, which every writer of
/// the disk shares (docs/user-guide.md, "Recordings"); one whose time less its wait for a CPU is within
/// the goal waited for the machine's CPUs. Neither is the disk, nor the recording's own pages:
/// what is left is, and that is what a write stream must keep off a recorder.
#[derive(Debug, Default)]
struct SlowWrites {
    /// Writes over the goal.
    slow: usize,
    /// Of those, writes that slept in `balance_dirty_pages`.
    throttled: usize,
    /// Of the rest, writes within the goal without their wait for a CPU.
    cpu_bound: usize,
    /// The rest: (ms, of which waiting for a CPU).
    unexplained: Vec<(f64, f64)>,
    /// Time the recorder waited for a CPU inside its writes, ms: the most, and the sum.
    cpu_wait_max_ms: f64,
    cpu_wait_ms: f64,
}

impl SlowWrites {
    /// Sorts the recorder's writes by its `summary` (each write's time and its wait for a CPU,
    /// on the recorder's clock) with the throttle's `events` during the traced `writes` (the
    /// same writes in the same order, on perf's clock). The times are the recorder's
    /// (`CLOCK_MONOTONIC`): in one run perf timed a write at 6.4 ms while bpftrace, on the
    /// same global clock as the recorder, saw no write between 3.8 and 15 ms. Why perf's time
    /// differed was not established.
    fn of(
        writes: &[abiss_bench::recording::writes::TracedWrite],
        events: &[abiss_bench::recording::throttle::ThrottleEvent],
        summary: &serde_json::Value,
    ) -> Self {
        let per_write_ms = |key: &str| -> Vec<f64> {
            summary[key]
                .as_array()
                .unwrap_or_else(|| panic!("the recorder's {key}"))
                .iter()
                .map(|us| us.as_f64().unwrap_or(0.0) / 1000.0)
                .collect()
        };
        let (times_ms, cpu_waits_ms) = (per_write_ms("write_us"), per_write_ms("cpu_wait_us"));
        assert_eq!(
            writes.len(),
            times_ms.len(),
            "perf traced as many recording writes as the recorder made"
        );
        let mut figures = Self {
            cpu_wait_max_ms: cpu_waits_ms.iter().copied().fold(0.0, f64::max),
            cpu_wait_ms: cpu_waits_ms.iter().sum(),
            ..Self::default()
        };
        for ((write, &ms), &cpu_ms) in writes.iter().zip(&times_ms).zip(&cpu_waits_ms) {
            if ms <= WRITE_GOAL_MS {
                continue;
            }
            figures.slow += 1;
            let throttled = events.iter().any(|e| {
                e.pause_ms > 0.0
                    && e.tid == write.tid
                    && (write.start_ms..=write.returned_ms()).contains(&e.at_ms)
            });
            if throttled {
                figures.throttled += 1;
            } else if ms - cpu_ms <= WRITE_GOAL_MS {
                figures.cpu_bound += 1;
            } else {
                figures.unexplained.push((ms, cpu_ms));
            }
        }
        figures
    }
}

/// One run of [`recorder_against_writer`] on a lab and file system of its own, with abissd
/// managing the disk, and the comparisons asked for by environment variables.
fn recorder_on_a_fresh_lab(name: &str, stream: bool) -> (serde_json::Value, u64) {
    let lab = HddLab::up("recording", 2, "none");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    if std::env::var_os("ABISS_LAZYTIME").is_some() {
        // For a comparison: timestamps kept in memory, so a write(2) needs no journal handle.
        let status = Command::new("mount")
            .args(["-o", "remount,lazytime"])
            .arg(lab.mount())
            .status()
            .expect("mount");
        assert!(status.success(), "remount lazytime");
    }
    // For a comparison: a per-disk dirty limit (`ABISS_BDI_MAX_BYTES`, with strict_limit).
    let _bdi = std::env::var("ABISS_BDI_MAX_BYTES")
        .ok()
        .map(|bytes| BdiLimit::set(lab.device(), &bytes));
    let (summary, written, _) = recorder_against_writer(&lab, &daemon, name, stream, None);
    (summary, written)
}

/// The measurement: a 1 MiB/s recorder (64 KiB every 62.5 ms, a 1 s capture buffer)
/// on the lab hdd against a best-effort sequential writer of 1 MiB blocks, with a small box's
/// dirty limits (64 MiB, background 16 MiB). Without abiss it overflowed (14 of 481 in the
/// issue); with a write stream it must not.
///
/// Each run has a new lab and file system. On one file system, whichever run came second had
/// the longest write (1.15 to 1.18 s, over the 1 s buffer, in 5 of 6 runs with or without
/// abiss, also after a `syncfs` between them), while the first stayed under 1 s: the runs
/// were not measured from the same start.
///
/// The recorder's long writes sleep in the kernel's dirty-page throttle
/// (`balance_dirty_pages`), which paces every writer of the disk by the best-effort writer's
/// backlog whether or not it has a stream, and wait for ext4's journal (`wait_transaction_locked`
/// and `do_get_write_access` from the mtime update of each write, `ext4_da_get_block_prep`),
/// although the journal thread is raised with the recording (docs/user-guide.md, "Recordings").
/// The same recorder through the direct path (`abissctl record`, issue 36) meets it and runs in
/// the suite: `tests/recording_direct.rs`,
/// `the_paced_recorder_through_abissctl_record_meets_its_deadlines_against_a_best_effort_writer`.
/// This one, the page-cache write stream, stays ignored.
/// `ABISS_RECORDING_SECS` shortens it, `ABISS_RECORDER_FIFO=1` runs the recorder
/// under `SCHED_FIFO`, `ABISS_BDI_MAX_BYTES` sets a strict per-disk dirty limit,
/// `ABISS_LAZYTIME=1` remounts the lab's file system `lazytime`.
#[test]
#[ignore = "0 overflows not reliable: in 3 runs on fresh labs (2026-12-01) with abiss 0, 2 and 10 \
            overflows of 480 (write p99 61, 742 and 784 ms), without 0, 0 and 1 (p99 715, 737 and \
            426 ms); the long writes sleep in the kernel's dirty-page throttle, paced by the \
            best-effort writer's backlog, and wait for ext4's journal (issue 10)"]
fn a_recorder_meets_its_deadlines_against_a_best_effort_writer() {
    require_root!();
    let _limits = DirtyLimits::small_box();
    let (without, be_without) = recorder_on_a_fresh_lab("plain.ts", false);
    eprintln!(
        "without abiss: {without}; best-effort writer wrote {} MiB",
        be_without / MIB
    );
    let (with, be_with) = recorder_on_a_fresh_lab("stream.ts", true);
    eprintln!(
        "with abiss: {with}; best-effort writer wrote {} MiB",
        be_with / MIB
    );
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
}

/// The same recorder on xfs: no overflow with a 1 s capture buffer, with a write stream,
/// against the best-effort writer under a small box's dirty limits. On ext4 the recorder's
/// slow writes wait for the inode's allocation lock and the journal (the test above); on xfs
/// they did not.
///
/// The goal is write p99.9 under 5 ms, and on this kernel build (6.18.44-fc-v1147,
/// 2026-12-03) 6 of 11 runs missed it: 156, 10.9, 7.4, 7.0, 5.8 and 5.2 ms. In six runs traced
/// for it, off-CPU stacks of the recorder inside write(2) (bpftrace on `sched_switch`) showed
/// the slow writes (the 156 ms one was not traced; a 7.0 ms one spent no time off the CPU
/// inside write(2), so it was slow around the call, in the recorder) either asleep in
/// `balance_dirty_pages`, the kernel's dirty-page throttle that paces every writer of the disk
/// by the machine's dirty pages (10.7 ms), or runnable and waiting for one of the 2 CPUs at
/// `cond_resched` in `iomap_file_buffered_write` (2 to 7 ms). Neither is the disk or the
/// recording's pages, which the write stream controls. So the test prints the p99.9 and what
/// each write over 5 ms waited for (perf traces the throttle, the recorder counts its own wait
/// for a CPU); the next test asserts that those two explain every one. Before, with a
/// write-back that waited for nothing (`sync_file_range(WRITE)` alone), one of two runs had a
/// 484 ms write (`bench/results/recording-write-ahead/`).
///
/// Ignored since 2026-12-07, as its ext4 sibling is: in a fresh-clone run of the suite (it runs
/// alone there) the recorder overflowed 35 times in 480 writes, its writes asleep 120 to 200 ms
/// each, many in a row, the pace of the dirty-page throttle; 5 runs alone after passed. The
/// throttle paces every writer by the machine's dirty pages, which the write stream does not
/// control: the guaranteed recording is `abissctl record`, past the page cache, whose test
/// (`recording_direct.rs`) runs in the suite under a heavier load.
#[test]
#[ignore = "0 overflows not reliable: 35 overflows of 480 in 1 of 3 fresh-clone suite runs \
            (2026-12-07), the writes asleep 120-200 ms each in the kernel's dirty-page \
            throttle, which paces every writer by the machine's dirty pages; 0 in 5 runs alone \
            after; the guaranteed path is abissctl record (recording_direct.rs)"]
fn a_recorder_on_xfs_meets_its_deadlines_against_a_best_effort_writer() {
    require_root!();
    let (with, be_with, _) = xfs_recorder_against_writer();
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
    assert!(
        be_with > 64 * MIB,
        "the best-effort writer kept writing: {be_with}"
    );
}

/// The goal's other half, every write over 5 ms explained by the throttle or a CPU, on its
/// own while one write in the suite was not (see the reason).
/// (A direct recording, `abissctl record`, never enters the throttle: see
/// `tests/recording_direct.rs`.)
#[test]
#[ignore = "1 of 6 runs on 2026-12-03 had a 9.4 ms write that neither slept in the throttle nor \
            waited for a CPU (0.7 ms of it); what it waited for is not found yet (issue 10)"]
fn a_recorders_slow_writes_on_xfs_wait_only_for_the_throttle_or_a_cpu() {
    require_root!();
    let (with, _, slow) = xfs_recorder_against_writer();
    assert_eq!(with["overflows"], 0, "with abiss: {with}");
    assert!(
        slow.unexplained.is_empty(),
        "{} writes over {WRITE_GOAL_MS} ms waited neither for the throttle nor for a CPU: {:?}",
        slow.unexplained.len(),
        slow.unexplained
    );
}

/// The recorder with a write stream on a fresh xfs lab against the best-effort writer, under a
/// small box's dirty limits, traced: its summary, what the writer wrote, and what its slow
/// writes waited for (printed).
fn xfs_recorder_against_writer() -> (serde_json::Value, u64, SlowWrites) {
    let _limits = DirtyLimits::small_box();
    let lab = HddLab::up_xfs("recording-xfs", 2, "none");
    let daemon = Daemon::start_managing(lab.device(), &["--capacity", "30MB/s"]);
    let scratch = Scratch::new_in("/tmp", "recording-xfs-trace");
    let mut tracer = Tracer::start(
        &format!("abiss-test-recorder-{}", std::process::id()),
        scratch.path(),
    )
    .expect("perf trace (linux-perf; `cargo xtask setup` installs it)");
    let (with, be_with, slow) =
        recorder_against_writer(&lab, &daemon, "stream.ts", true, Some(&mut tracer));
    let slow = slow.expect("traced");
    let mut shown = with.clone();
    // The per-write figures are in `slow`, summed up.
    if let Some(summary) = shown.as_object_mut() {
        summary.remove("start_us");
        summary.remove("write_us");
        summary.remove("cpu_wait_us");
    }
    eprintln!(
        "with abiss on xfs: {shown}; best-effort writer wrote {} MiB",
        be_with / MIB
    );
    eprintln!(
        "write p99.9 {} ms; {} writes over {WRITE_GOAL_MS} ms: {} slept in the dirty-page \
         throttle, {} within it without their wait for a CPU, {} waited for something else \
         {:?} (ms, of which CPU); CPU wait in writes {:.1} ms in all, {:.1} ms at most",
        with["write_p999_ms"],
        slow.slow,
        slow.throttled,
        slow.cpu_bound,
        slow.unexplained.len(),
        slow.unexplained,
        slow.cpu_wait_ms,
        slow.cpu_wait_max_ms,
    );
    (with, be_with, slow)
}

/// A per-disk dirty limit (`max_bytes`, `strict_limit` of the disk's bdi), put back on drop.
struct BdiLimit {
    dir: PathBuf,
    saved: Vec<(&'static str, String)>,
}

impl BdiLimit {
    fn set(device: &Path, max_bytes: &str) -> Self {
        let rdev = std::fs::metadata(device).expect("stat device").rdev();
        let dir = PathBuf::from(format!(
            "/sys/class/bdi/{}:{}",
            libc::major(rdev),
            libc::minor(rdev)
        ));
        let saved = ["max_bytes", "strict_limit"]
            .into_iter()
            .map(|key| {
                let value = std::fs::read_to_string(dir.join(key)).expect("read bdi setting");
                (key, value.trim().to_owned())
            })
            .collect();
        std::fs::write(dir.join("strict_limit"), "1").expect("strict_limit");
        std::fs::write(dir.join("max_bytes"), max_bytes).expect("max_bytes");
        Self { dir, saved }
    }
}

impl Drop for BdiLimit {
    fn drop(&mut self) {
        for (key, value) in &self.saved {
            let _ = std::fs::write(self.dir.join(key), value);
        }
    }
}
