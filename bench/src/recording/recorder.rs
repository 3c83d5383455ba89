//! The recorders: real programs, unmodified, each writing an 8 Mbit/s MPEG-TS at the rate its
//! source produces it, started plainly, under `ionice -c1`, or under `abissctl run --write`,
//! each in a process group and a cgroup of its own, whose write(2) calls `perf trace` times:
//!
//! | recorder | command | source |
//! | --- | --- | --- |
//! | ffmpeg | `ffmpeg -re -f lavfi -i testsrc2 -re -f lavfi -i sine … -c:v mpeg2video -b:v 7M … -f mpegts -muxrate 8M FILE` | generated at native rate (`-re`): constant 1 MB/s (mux rate) |
//! | `GStreamer` | `gst-launch-1.0 -e videotestsrc is-live=true pattern=snow ! … avenc_mpeg4 bitrate=7000000 ! mpegtsmux ! filesink location=FILE` | a live source on the pipeline clock; noise, so the encoder's 7 Mbit/s hold (about 0.95 MB/s with the TS overhead) |
//! | test | `abiss-test-recorder FILE 1000000 65536 1000 SECS` | the project's paced recorder: 64 KiB every 65.5 ms, its own overflow count and write times |
//!
//! `perf trace -a -G CGROUP` times the calls in the kernel (syscall tracepoints, counted for
//! the tasks of the recorder's cgroup only, no ptrace stop). Following the recorder by its
//! cgroup rather than as perf's child (`perf trace -- CMD`) is not a choice: perf 6.1 followed
//! only some of `gst-launch-1.0`'s threads that way, and missed the one that writes. perf needs
//! tracefs, which it gets mounted in a mount namespace of its own (`unshare -m`), so nothing
//! stays mounted. Its events come from one buffer per CPU, and a call that blocks may return
//! on another CPU: `--sort-events` puts them in time order (unsorted, perf printed 3 returns of
//! some 8 500 calls before their entries, and those calls looked still blocked). A marker written from the cgroup when the recorder starts ties perf's clock
//! to `CLOCK_MONOTONIC`, so the stop is known on perf's clock: a write still blocked then
//! counts as lasting until the stop. `GStreamer`'s `mpegtsmux` cannot make a live
//! stream constant-rate here (its `bitrate` padding did not pad) and its `avenc_mpeg2video`
//! refuses the pipeline's time base in this version, hence MPEG-4 part 2 over noise at
//! 480×270 (9 % of a core against 117 % for `mpeg2enc`). It records no sound: with a second
//! live branch, `mpegtsmux` under the rows' load held the video back until the end (it wrote
//! the audio's 31 KB/s, then 14 MB at EOS), which is the muxer's behaviour, not the disk's.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abiss_os::clock::monotonic_ns;
use anyhow::Context as _;
use serde::Serialize;

use super::direct::{RecordSink, RunningRecord};
use super::throttle::{self, ThrottleFigures};
use super::writes::{self, WriteFigures};
use super::GOAL_P999_MS;
use crate::players::media;
use crate::players::player::Wrapper;
use crate::process;

/// The rate every recorder writes at, B/s (8 Mbit/s).
pub const RATE_BPS: u64 = 1_000_000;
/// The test recorder's write size.
pub(super) const TEST_WRITE_BYTES: u64 = 64 << 10;
/// What perf traces: the write calls (the recorders write with write(2), as ffmpeg and the
/// test recorder do, or writev(2), as `GStreamer`'s filesink does), and the kernel's
/// dirty-page throttle met in them ([`throttle`]).
const TRACED: &str = "write,writev,pwrite64,pwritev,writeback:balance_dirty_pages";

/// Which program records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecorderKind {
    /// ffmpeg from lavfi sources at native rate.
    Ffmpeg,
    /// gst-launch-1.0 with live test sources.
    Gstreamer,
    /// `abiss-test-recorder`.
    Test,
}

impl RecorderKind {
    /// Short name for the reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ffmpeg => "ffmpeg",
            Self::Gstreamer => "gst",
            Self::Test => "test",
        }
    }
}

/// The recorder's own command line.
fn command_line(kind: RecorderKind, file: &Path, bin_dir: &Path, secs: u64) -> Vec<String> {
    let file = file.display().to_string();
    let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    match kind {
        RecorderKind::Ffmpeg => {
            let mut line = strings(&["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error"]);
            line.extend(strings(&["-re", "-f", "lavfi", "-i"]));
            line.push(media::video_source());
            line.extend(strings(&["-re", "-f", "lavfi", "-i", media::AUDIO_SOURCE]));
            // As the players' media: MPEG-2 at 7 Mbit/s held, MP2, padded to 8 Mbit/s.
            line.extend(strings(&media::ENCODING));
            line.push("-y".to_owned());
            line.push(file);
            line
        }
        RecorderKind::Gstreamer => {
            let mut line = strings(&["gst-launch-1.0", "-q", "-e"]);
            line.extend(
                "videotestsrc is-live=true pattern=snow ! \
                 video/x-raw,format=I420,width=480,height=270,framerate=25/1 ! \
                 avenc_mpeg4 bitrate=7000000 gop-size=12 ! mpegtsmux ! filesink"
                    .split_whitespace()
                    .map(str::to_owned),
            );
            line.push(format!("location={file}"));
            line
        }
        RecorderKind::Test => vec![
            bin_dir.join("abiss-test-recorder").display().to_string(),
            file,
            RATE_BPS.to_string(),
            TEST_WRITE_BYTES.to_string(),
            "1000".to_owned(),
            secs.to_string(),
        ],
    }
}

/// `perf trace` of one cgroup, and the cgroup: what runs in it is traced, threads and
/// children included, whatever process group or parent they have.
#[derive(Debug)]
pub struct Tracer {
    cgroup: PathBuf,
    perf: Option<Child>,
    output: PathBuf,
    /// When the marker was written, `CLOCK_MONOTONIC` ns.
    marker_ns: Option<u64>,
}

/// Where the cgroup v2 hierarchy is mounted.
fn cgroup2_mount() -> anyhow::Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    mounts
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
        })
        .context("no cgroup2 hierarchy is mounted (perf trace follows the recorders through one)")
}

impl Tracer {
    /// A new cgroup `name` under the cgroup v2 root and `perf trace -a -G name` of the write
    /// calls in it into `scratch/name.trace`. perf needs tracefs: it gets it mounted in a mount
    /// namespace of its own. Give it a second or two before anything is written.
    pub fn start(name: &str, scratch: &Path) -> anyhow::Result<Self> {
        let cgroup = cgroup2_mount()?.join(name);
        std::fs::create_dir_all(&cgroup)
            .with_context(|| format!("cannot create the cgroup {}", cgroup.display()))?;
        let output = scratch.join(format!("{name}.trace"));
        let mut tracer = Self {
            cgroup,
            perf: None,
            output,
            marker_ns: None,
        };
        let perf = Command::new("unshare")
            .args(["-m", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tracefs nodev /sys/kernel/tracing && exec \"$@\"")
            .args(["sh", "perf", "trace", "-a", "--sort-events", "-G", name])
            .args(["-e", TRACED, "-o"])
            .arg(&tracer.output)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start perf trace (linux-perf)")?;
        tracer.perf = Some(perf);
        Ok(tracer)
    }

    /// `sh -c 'move into the cgroup && exec "$@"' sh`: what starts a command in the cgroup.
    #[must_use]
    pub fn enter(&self) -> Vec<String> {
        vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!(
                "echo $$ > {} && exec \"$@\"",
                self.cgroup.join("cgroup.procs").display()
            ),
            "sh".to_owned(),
        ]
    }

    /// Writes the marker from the cgroup (see [`writes::MARKER`]) and notes when.
    pub fn mark(&mut self) -> anyhow::Result<()> {
        let line = self.enter();
        let before = monotonic_ns();
        let status = Command::new(&line[0])
            .args(&line[1..])
            .args([writes::MARKER.0, writes::MARKER.1])
            .stdout(Stdio::null())
            .status()
            .context("cannot write the trace marker")?;
        let after = monotonic_ns();
        anyhow::ensure!(status.success(), "the trace marker failed ({status})");
        self.marker_ns = Some(before / 2 + after / 2);
        Ok(())
    }

    /// The processes in the cgroup.
    fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.cgroup.join("cgroup.procs"))
            .map(|list| list.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn signal_members(&self, signal: libc::c_int) {
        for pid in self.members() {
            // SAFETY: kill(2) of a process we started into our own cgroup.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Waits up to `limit` for the cgroup to empty, then kills what is left.
    fn empty(&self, limit: Duration) {
        let until = Instant::now() + limit;
        while !self.members().is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.members().is_empty() {
            let _ = std::fs::write(self.cgroup.join("cgroup.kill"), "1");
            let until = Instant::now() + Duration::from_secs(5);
            while !self.members().is_empty() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Stops perf (SIGINT: it writes out what it has) and reads its trace; `stopped_ns` is when
    /// the recorder was told to stop, on `CLOCK_MONOTONIC`.
    pub fn finish(
        &mut self,
        stopped_ns: u64,
        keep_as: Option<&Path>,
    ) -> anyhow::Result<(writes::Trace, Vec<throttle::ThrottleEvent>, f64)> {
        if let Some(mut perf) = self.perf.take() {
            if let Ok(pid) = i32::try_from(perf.id()) {
                // SAFETY: killpg(2) of the group perf leads.
                unsafe { libc::killpg(pid, libc::SIGINT) };
            }
            let until = Instant::now() + Duration::from_secs(10);
            while perf.try_wait()?.is_none() {
                if Instant::now() > until {
                    let _ = perf.kill();
                    let _ = perf.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        if let Some(path) = keep_as {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        let trace = writes::parse(&text);
        let throttled = throttle::parse(&text);
        let marker = trace.marker_ms.zip(self.marker_ns).context(
            "perf trace did not see the marker: it was not tracing yet, or not the cgroup",
        )?;
        #[expect(clippy::cast_precision_loss, reason = "ns of a run")]
        let stop_ms = marker.0 + stopped_ns.saturating_sub(marker.1) as f64 / 1e6;
        Ok((trace, throttled, stop_ms))
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        // Killed processes leave the cgroup once reaped (orphans by init): wait for that.
        self.empty(Duration::from_secs(2));
        if let Some(mut perf) = self.perf.take() {
            let _ = perf.kill();
            let _ = perf.wait();
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_file(&self.output);
    }
}

/// A recorder that is recording.
#[derive(Debug)]
pub struct RunningRecorder {
    kind: RecorderKind,
    file: PathBuf,
    tracer: Tracer,
    child: Option<Child>,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    record: Option<RunningRecord>,
    /// The test recorder records through the library and times its writes itself.
    through_library: bool,
}

/// What a recorder did.
#[derive(Clone, Debug, Serialize)]
pub struct RecorderResult {
    /// The program.
    pub kind: RecorderKind,
    /// Its recording.
    pub file: PathBuf,
    /// The recording's size when it ended, bytes.
    pub file_bytes: u64,
    /// Its write calls up to the stop, from `perf trace`.
    pub figures: WriteFigures,
    /// What the kernel's dirty-page throttle cost it.
    pub throttle: ThrottleFigures,
    /// Of its write calls, those still blocked when the recorder was told to stop.
    pub blocked_at_stop: usize,
    /// All bytes its traced write calls wrote, the end of its file included (against
    /// `file_bytes`: a check that the trace saw every write).
    pub traced_bytes: u64,
    /// Calls that returned but whose return perf's report did not show (not timed; their
    /// bytes from the call's `count`).
    pub untimed_writes: usize,
    /// Events `perf trace` lost (0 for a complete trace).
    pub lost_events: u64,
    /// The test recorder's own summary (its overflows and write times, timed by itself).
    pub own_report: Option<serde_json::Value>,
    /// In a direct row, `abissctl record`'s summary (its ring's overflows, its direct
    /// writes' times).
    pub record: Option<serde_json::Value>,
    /// CPU time of the recorder with its wrapper, s.
    pub cpu_s: f64,
    /// How it ended.
    pub ended: String,
    /// What went wrong, if it recorded nothing.
    pub error: Option<String>,
    /// The test recorder's file checked against what it wrote (every 8-byte word holds its
    /// offset): `intact`, or where it is not; `None` for the other recorders.
    pub content: Option<String>,
    /// The duration of each write, ms (for the row's figures over all recorders).
    #[serde(skip)]
    pub durations_ms: Vec<f64>,
}

impl RunningRecorder {
    /// Launches `kind` recording into `file` through `wrapper` into `tracer`'s cgroup (or,
    /// with a `sink`, into the FIFO of an `abissctl record` of `file`), for `secs` (the test
    /// recorder stops by itself then; the others are stopped).
    pub fn launch(
        kind: RecorderKind,
        file: &Path,
        (wrapper, sink): (&Wrapper, Option<&RecordSink>),
        tracer: Tracer,
        bin_dir: &Path,
        secs: u64,
    ) -> anyhow::Result<Self> {
        // In a direct row the test recorder records through the library (what `abiss_fwrite`
        // calls), the others into a FIFO that `abissctl record` reads.
        let through_library = kind == RecorderKind::Test && sink.is_some();
        let record = sink
            .filter(|_| !through_library)
            .map(|sink| sink.start(file))
            .transpose()?;
        let target = record.as_ref().map_or(file, |record| record.fifo.as_path());
        // Plain, the recorder starts under env(1): it is the tracer's cgroup entry that follows.
        let mut command = wrapper.command(file).unwrap_or_else(|| Command::new("env"));
        command
            .args(tracer.enter())
            .args(command_line(kind, target, bin_dir, secs))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(sink) = sink.filter(|_| through_library) {
            command
                .arg("per-write")
                .arg(format!(
                    "library={}:{}{}",
                    sink.rate,
                    sink.buffer,
                    if sink.preallocate { ":preallocate" } else { "" }
                ))
                .env("ABISS_SOCKET", &sink.socket);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start the {} recorder", kind.name()))?;
        let stdout = process::output_of(child.stdout.take().context("no stdout")?);
        let stderr = child.stderr.take().context("no stderr")?;
        let stderr = process::stderr_tail(stderr);
        Ok(Self {
            kind,
            file: file.to_path_buf(),
            tracer,
            child: Some(child),
            stdout: Some(stdout),
            stderr: Some(stderr),
            record,
            through_library,
        })
    }

    /// The program.
    #[must_use]
    pub fn kind(&self) -> RecorderKind {
        self.kind
    }

    /// Waits up to `limit` for the recorder to end by itself (the test recorder); whether it
    /// did.
    pub fn wait_for_end(&mut self, limit: Duration) -> anyhow::Result<bool> {
        let until = Instant::now() + limit;
        let Some(child) = &self.child else {
            return Ok(true);
        };
        let pid = i32::try_from(child.id())?;
        while Instant::now() < until {
            crate::interrupt::check()?;
            if process::is_zombie(pid) {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(false)
    }

    /// Tells the recorder to stop: SIGINT to everything in its cgroup (ffmpeg and
    /// `gst-launch-1.0 -e` end their file) and to its wrapper's group.
    pub fn signal_stop(&self) {
        self.tracer.signal_members(libc::SIGINT);
        if let Some(pid) = self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok()) {
            // SAFETY: killpg(2) of the group this recorder's wrapper leads.
            unsafe { libc::killpg(pid, libc::SIGINT) };
        }
    }

    /// Waits for the recorder to end (killed 10 s after `signalled`), stops its trace and adds
    /// up its writes until `signalled_ns` (`CLOCK_MONOTONIC`) against a capture buffer of
    /// `buffer_ms`; keeps perf's output as `keep_trace_as` if given.
    pub fn collect(
        mut self,
        signalled: Instant,
        signalled_ns: u64,
        buffer_ms: f64,
        keep_trace_as: Option<&Path>,
    ) -> anyhow::Result<RecorderResult> {
        let child = self.child.take().context("collected already")?;
        let pid = i32::try_from(child.id())?;
        let (ended, cpu_s) = process::wait_for(pid, signalled)?;
        self.tracer.empty(Duration::from_secs(5));
        let stdout = self
            .stdout
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let record = self
            .record
            .take()
            .map(|record| record.finish(signalled))
            .transpose()?;
        let (trace, throttled, stop_ms) = self.tracer.finish(signalled_ns, keep_trace_as)?;
        let (own_report, self_timed, library_record) = own_report(&stdout, self.through_library);
        // Through the library perf sees only the writer thread's pieces, never the recorder's
        // writes: without its own times there are none (an error below), not the pieces.
        let recording = match self_timed {
            Some(timed) => timed,
            None if self.through_library => Vec::new(),
            None => writes::recording_writes(&trace, stop_ms),
        };
        let record = record.or(library_record);
        let figures = writes::figures(&recording, buffer_ms);
        let throttle = throttle::figures(&throttled, &recording, GOAL_P999_MS);
        let error = (figures.writes == 0).then(|| {
            if stderr.is_empty() {
                format!("no write traced ({ended})")
            } else {
                format!("{stderr} ({ended})")
            }
        });
        let fd = recording.first().map(|w| w.fd);
        Ok(RecorderResult {
            kind: self.kind,
            file_bytes: std::fs::metadata(&self.file).map_or(0, |m| m.len()),
            file: self.file.clone(),
            blocked_at_stop: trace
                .unfinished
                .iter()
                .filter(|w| Some(w.fd) == fd && w.start_ms <= stop_ms)
                .count(),
            traced_bytes: if self.through_library {
                recording.iter().map(|w| w.bytes).sum()
            } else {
                trace
                    .writes
                    .iter()
                    .filter(|w| Some(w.fd) == fd)
                    .map(|w| w.bytes)
                    .sum()
            },
            untimed_writes: recording.iter().filter(|w| w.duration_ms.is_nan()).count(),
            figures,
            throttle,
            lost_events: trace.lost_events,
            own_report,
            record,
            content: None,
            cpu_s,
            ended,
            error,
            durations_ms: recording
                .iter()
                .map(|w| w.duration_ms)
                .filter(|d| d.is_finite())
                .collect(),
        })
    }
}

/// The recorder's own summary (its last JSON line). Where it recorded through the library
/// (`through_library`), also the writes it timed itself (then dropped from the summary) and
/// the library's summary.
fn own_report(
    stdout: &str,
    through_library: bool,
) -> (
    Option<serde_json::Value>,
    Option<Vec<writes::TracedWrite>>,
    Option<serde_json::Value>,
) {
    let Some(mut report) = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    else {
        return (None, None, None);
    };
    if !through_library {
        return (Some(report), None, None);
    }
    let timed = writes::self_timed(&report, TEST_WRITE_BYTES);
    if let Some(fields) = report.as_object_mut() {
        for key in ["start_us", "write_us", "cpu_wait_us"] {
            fields.remove(key);
        }
    }
    let record = report["record"].clone();
    (Some(report), Some(timed), Some(record))
}

impl Drop for RunningRecorder {
    fn drop(&mut self) {
        // Only on an error or an interrupt: everything goes, and is reaped.
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: killpg(2) of the group this recorder's wrapper leads.
                unsafe { libc::killpg(pid, libc::SIGKILL) };
            }
            self.tracer.signal_members(libc::SIGKILL);
            let _ = child.wait();
        }
    }
}
