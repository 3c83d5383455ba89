//! Fixtures of the integration tests: a real `abissd`, real loop devices, real files.
//!
//! The tests run as root on the real kernel, one at a time (`cargo xtask test` passes
//! `--test-threads=1`), because they share kernel state. Every fixture undoes what it made in
//! `Drop`, so a failing test leaves no loop device, mount or daemon behind. Fixtures panic
//! rather than return errors, for backtraces. The fixtures are in this file and its modules, by concept,
//! and each concern's tests in one file under `tests/tests/`.
//!
//! | concern | file |
//! | --- | --- |
//! | fixtures every test uses: [`binary`], [`Scratch`], [`require_root!`], [`wait_until`] | `src/lib.rs` |
//! | the daemon: [`Daemon`], [`Connection`], [`abissd_command`], [`read_request`] | `src/daemon.rs` |
//! | what a command printed: [`json_of`], [`assert_fails`], [`attached_id`] | `src/output.rs` |
//! | devices and mounts: [`LoopDevice`], [`Ext4Mount`], [`disk_reads`], [`file_extents`] | `src/devices.rs` |
//! | the lab's hdd and cold files: [`HddLab`], [`write_cold_file`], [`CopyLoop`] | `src/lab_disk.rs` |
//! | users and processes: [`as_nobody`], [`spawn_with_id`], [`wait_for_ioprio`] | `src/users.rs` |
//! | files and the page cache: [`evict`], [`resident_bytes`], [`paced_read`] | `src/page_cache.rs` |
//! | abissd's eBPF maps and programs through `bpftool`: [`daemon_map_dump`], [`program_loaded`] | `src/kernel_maps.rs` |
//! | the C API built and its examples compiled: [`abiss_c_library`], [`compile_c_example`] | `src/c_api.rs` |
//! | a systemd of the test's own, booted in namespaces: [`systemd::ServiceManager`] | `src/systemd.rs` |
//! | objects whose close waits: [`hostile::lingering_socket`] | `src/hostile.rs` |
//! | the hostile client's attacks on raises: [`hostile_raises`] | `src/hostile_raises.rs` |
//! | the soak's hostile user, every attack at once: [`harass`] | `src/harass.rs` |
//! | a stream `nobody` owns, with raised readers: [`raises::NobodysStream`] | `src/raises.rs` |
//! | a paced reader that knows nothing of abiss (read(2) or `io_uring`) | `src/bin/abiss-test-reader.rs` |
//! | a paced recorder that knows nothing of abiss (write(2), overflows counted) | `src/bin/abiss-test-recorder.rs` |
//! | an unprivileged user who means harm, run as `nobody` by the security tests | `src/bin/abiss-hostile-client.rs` |
//! | the protocol fuzzer's hands: does to the socket what each generated case says | `src/bin/abiss-fuzz-client.rs` |
//! | a FUSE file system `nobody` mounts to stall whoever examines its file | `src/bin/abiss-stalling-fs.rs` |
//! | `io_uring` polls that never complete, submitted by a reader of an attached file | `src/bin/abiss-stuck-uring.rs` |
//! | **the guarantee and the window** | |
//! | the guarantee: no missed deadline, pages resident when a read begins | `tests/stream_guarantee.rs` |
//! | streams: prefetch priority, resident and locked window, rate conformance | `tests/streams.rs` |
//! | what the window has passed is unlocked and unmapped | `tests/window_release.rs` |
//! | loads reach the disk in requests as large as the disk takes | `tests/load_requests.rs` |
//! | abissd's own use of a file leaves its access time alone | `tests/access_time.rs` |
//! | a rate change on a live stream (fast-forward, slow motion) | `tests/trick_play.rs` |
//! | several streams of one file; a reader behind a recording | `tests/shared_files.rs` |
//! | write streams (recordings): write-back at the stream's level, allocation ahead, refusals (helpers shared in `tests/recording/`) | `tests/recording.rs` |
//! | a paced recorder against a best-effort writer on the lab hdd (ext4, xfs) | `tests/recording_deadlines.rs` |
//! | btrfs: the guarantee on the lab hdd (plain and `compress=zstd`) and over two lab hdds, requests tagged at each disk; subvolumes; a btrfs over two disks served only with both managed, each charged the stream | `tests/btrfs.rs` |
//! | the Rust client and the C example record; a recording watched while recorded | `tests/recording_clients.rs` |
//! | recording past the page cache (`abissctl record`, C `ABISS_DIRECT`): ffmpeg against ABISS's eight greedy streams on the lab hdd, exact, no overflow, every write at real time (its writes over 6 ms printed); abissd killed mid-recording; bad file systems | `tests/recording_direct.rs` |
//! | a recorder's ring locked by abissd against the stream's budget, beyond the user's own `RLIMIT_MEMLOCK`, and let go at the end (as `nobody`) | `tests/recorder_ring.rs` |
//! | a real player (`ffmpeg`) under `abissctl run --preroll` and a load | `tests/players.rs` |
//! | [`write_cold_file`] on the lab hdd: written without the model's time, read under it | `tests/cold_files.rs` |
//! | **priorities and admission** | |
//! | automatic raises (readers that miss raised to the stream's priority), and putting them back | `tests/automatic_raises.rs` |
//! | admission refuses exactly at the capacity `abissctl admit` predicts | `tests/admission_capacity.rs` |
//! | automatic buffers enlarged for the disk's admission, within the memory budgets | `tests/capacity_buffers.rs` |
//! | **devices, kernels, tracing** | |
//! | managed devices: elevator, driver depth (4 on rotational disks, 8 on others), restore, `recover`; the disk's own readahead kept | `tests/managed_device.rs` |
//! | which devices may be managed: partitions resolve to their disk; unknown devices, other files, bad settings refused | `tests/managed_device_specs.rs` |
//! | `abissctl profile` recovers the emulated disk; bad devices and model files | `tests/device_profile.rs` |
//! | the tracer counts every request, in the right class, on the right device | `tests/trace_counts.rs` |
//! | requests attributed to their submitting task and their file | `tests/attribution.rs` |
//! | optional parts switched off as on older kernels (`--disable`) | `tests/capabilities.rs` |
//! | `abissctl doctor`: the kernel's parts, a path's stack and disk, served or not (exit 16), as root and `nobody` | `tests/doctor.rs` |
//! | this build on the distributions' own kernels, in qemu (`cargo xtask kernels`), with LVM on LUKS, md raid1 and striped LVM | `tests/kernels.rs` |
//! | **interfaces** | |
//! | the C API from real C programs | `tests/c_example.rs` |
//! | abissctl's habits: bcc's `[interval [count]]`, `64k`, RFC 3339 times | `tests/cli_habits.rs` |
//! | `abissctl top` in a real terminal (tmux) | `tests/top.rs` |
//! | man pages and completions from `cargo xtask man` | `tests/man_pages.rs` |
//! | `--metrics` scraped by a real Prometheus; the Grafana dashboard's names | `tests/metrics.rs` |
//! | abissd as a systemd service under a real systemd (`cargo xtask install`) | `tests/service.rs` |
//! | the Debian package (`cargo xtask deb`) under a real systemd: installed, serving, upgraded over itself, purged without a trace | `tests/deb_package.rs` |
//! | bad input: one sentence, its exit code, nothing changed | `tests/bad_input.rs` |
//! | **security: an unprivileged user (`nobody`) against abissd** | |
//! | attacks with `src/bin/abiss-hostile-client.rs` | `tests/security.rs` |
//! | start-up fills and seek refills bounded per user | `tests/security_burst.rs` |
//! | closes that wait as long as their owner likes stay off the main loop | `tests/security_closes.rs` |
//! | what one user learns of others: answers, log lines | `tests/security_privacy.rs` |
//! | kernel maps one user can fill (`io_uring` requests never completed) deny no other | `tests/security_kernel_maps.rs` |
//! | connections: hung-up subscribers, too many, idle; metrics scrapes that never read | `tests/security_connections.rs` |
//! | a raise never outlives what it is for, nor passes to a forked task, nor lends more than its rate | `tests/security_raises.rs` |
//! | tasks sharing a raised reader's I/O context (`CLONE_IO`) bounded, and put back with the raise | `tests/security_raises_clone_io.rs` |
//! | a raised reader's small `O_DIRECT` reads that merge into queued requests are charged | `tests/security_raise_merges.rs` |
//! | a stream's raises, every thread together, read no more at real time than it and its user pay for; raises per user | `tests/security_raise_allowance.rs` |
//! | a raised player's reads of other files are paid for by its user | `tests/security_start_up_reads.rs` |
//! | kernel maps, the playout ring, prefetch workers against users and failing files | `tests/security_state.rs` |
//! | the state directory against users, a full disk and a crash | `tests/security_state_dir.rs` |
//! | the protocol fuzzer (hostile requests and descriptor sets; its generator and harness in `tests/fuzz_protocol/`) | `tests/fuzz_protocol.rs` |
//! | nothing left behind: bounded records, nothing in flight, no programs | `tests/teardown.rs` |
//!
//! `xtask/tests/doc_index.rs` fails when a file of `tests/` is missing from this table.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod c_api;
mod daemon;
mod devices;
pub mod harass;
pub mod hostile;
pub mod hostile_raises;
pub mod http;
mod kernel_maps;
mod lab_disk;
mod output;
mod page_cache;
pub mod raises;
pub mod systemd;
mod users;

pub use c_api::{abiss_c_library, compile_c_example};
pub use daemon::{
    abissd_command, read_request, save_laptop_model, Connection, Daemon, OLD_KERNEL_ARGS,
};
pub use devices::{
    attach_loop, direct_reads, disk_bytes_read, disk_reads, file_extents, on_extents, Ext4Mount,
    LoopDevice,
};
pub use kernel_maps::{control_field, daemon_map_dump, daemon_map_id, map_dump, program_loaded};
pub use lab_disk::{
    cold_file_bytes, shared_fs, write_cold_compressible_file, write_cold_file, CopyLoop, HddLab,
};
pub use output::{assert_fails, attached_id, json_of, stderr};
pub use page_cache::{evict, guarantee, paced_read, resident_bytes, PacedReport, SlowRead};
pub use users::{
    abissctl_as, abissctl_as_nobody, as_nobody, as_user, attach_as, children_of, chmod,
    locked_bytes_of, nobody_waiting_to_run, open_fds, run_at_realtime_cpu_priority,
    set_thread_ioprio, spawn_with_id, wait_for_ioprio, BE5, NOBODY_UID, RT0,
};

/// The path of built binary `name` (in `ABISS_BIN_DIR`, set by `cargo xtask test`), its pages
/// read into the page cache first: on the lab VM the reclaim takes a test program's pages
/// between tests, and a program raised at real time at its start then reads them at real time,
/// which abissd rightly charges to its user. A test of the start-up allowance saw 4 MiB of
/// `abiss-test-reader`'s own pages charged beside the 768 KiB it read, and its raise dropped.
#[must_use]
pub fn binary(name: &str) -> PathBuf {
    let dir = std::env::var_os("ABISS_BIN_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug"),
        PathBuf::from,
    );
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build with `cargo xtask build` (or run `cargo xtask test`)",
        path.display()
    );
    let _bytes = abiss_bench::players::program::warm_file(&path);
    path
}

/// Whether this process runs as root; tests that need it print why they skip otherwise.
#[must_use]
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Skips the calling test (returns) with a printed reason unless running as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::is_root() {
            eprintln!("skipped: needs root (loads eBPF programs, creates loop devices)");
            return;
        }
    };
}

/// A scratch directory removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// A new directory under `base` (e.g. /tmp, or /dev/shm for memory-backed images).
    #[must_use]
    pub fn new_in(base: &str, tag: &str) -> Self {
        let path = Path::new(base).join(format!("abiss-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch dir");
        Self { path }
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Waits until `condition` holds, up to `timeout`.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        // Often enough that a condition met is seen within 10 ms; 50 ms before, paid by
        // every wait of every test.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long a fixture's step took (a lab hdd's bring-up, a cold file, abissd's start), printed
/// when it ends if `ABISS_FIXTURE_TIMES` is set: where a test's time goes besides what it
/// measures, for whoever makes the suite faster.
pub(crate) struct FixtureTimer {
    step: String,
    started: Instant,
}

impl FixtureTimer {
    pub(crate) fn start(step: impl Into<String>) -> Self {
        Self {
            step: step.into(),
            started: Instant::now(),
        }
    }
}

impl Drop for FixtureTimer {
    fn drop(&mut self) {
        if std::env::var_os("ABISS_FIXTURE_TIMES").is_some() {
            let ms = self.started.elapsed().as_secs_f64() * 1000.0;
            eprintln!("fixture time: {} {ms:.0} ms", self.step);
        }
    }
}

/// The workspace's root directory.
#[must_use]
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}
