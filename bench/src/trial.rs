//! One run: a configuration, N real-time readers and the best-effort copy on the lab disk,
//! from a cold page cache, with everything measured over a common window.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use serde::Serialize;

use crate::configuration::{Configuration, RunContext, RunSetup};
use crate::interrupt;
use crate::lab_disk::{BenchFs, LabDisk, QueueSettings};
use crate::latency::{LatencyHistogram, LatencySummary, PercentilePoint};
use crate::layout::{cached_pages, disk_ranges, drop_cached_pages, BenchFiles};
use crate::schedule::{DeadlineTally, StreamSpec};
use crate::throughput::{mb_per_s, DeviceActivity};
use crate::workload::{run_reader, CopyLoop, ReaderOutcome, ReaderPlan, TailRead};

/// How to run.
#[derive(Debug)]
pub struct TrialPlan<'a> {
    /// The configuration under test.
    pub configuration: &'a Configuration,
    /// The files on the lab disk.
    pub files: &'a BenchFiles,
    /// How many of the stream files are read (the first ones).
    pub streams: usize,
    /// Rate, read size and buffer of every stream.
    pub stream: StreamSpec,
    /// Bytes per read(2) and write(2) of the copy loop.
    pub copy_chunk_bytes: usize,
    /// How long the copy runs before the readers start.
    pub warmup: Duration,
    /// How long the readers read (the measurement window).
    pub measure: Duration,
    /// Each reader seeks to a random position this often (the "seek storm").
    pub seek_every: Option<Duration>,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct TrialFigures {
    /// Real-time readers.
    pub streams: usize,
    /// Length of the measurement window.
    pub window_s: f64,
    /// Latency of the readers' read(2) calls, all readers together.
    pub latency: LatencySummary,
    /// Deadline accounting, all readers together.
    pub deadlines: DeadlineRow,
    /// The copy loop's rate during the window (bytes copied per second).
    pub be_copy_mb_s: f64,
    /// Complete copy passes while the run lasted (warm-up included).
    pub be_copy_passes: u64,
    /// What the disk did during the window.
    pub device: DeviceActivity,
    /// What of it was for the real-time streams: the requests within their files' extents.
    /// Their rate beside the readers' is whether the disk kept up (a large buffer hides a
    /// shortfall from the deadlines for as long as its slack lasts), and their busy fraction
    /// over that rate is the disk time a stream's byte costs, which admission predicts. On
    /// ext4 only: btrfs's extents are at its own logical addresses, not the disk's.
    pub streams_at_disk: Option<DeviceActivity>,
    /// The disk time the streams take per second at the readers' full rate, ms: their busy
    /// time per byte at the disk times that rate (`None` if none of their bytes came from
    /// the disk). Admission's mean work per window is its prediction.
    pub streams_work_ms: Option<f64>,
    /// Each reader on its own.
    pub readers: Vec<ReaderRow>,
    /// The latency percentile curve, all readers together (for the charts).
    pub percentile_curve: Vec<PercentilePoint>,
    /// Pages of the stream files in the page cache when the run started (0: cold).
    pub cached_pages_at_start: u64,
    /// Whether the disk was idle before the run (no request for a second).
    pub idle_before: bool,
    /// The device queue during the run (`nr_requests` depends on the elevator).
    pub queue: QueueSettings,
    /// Wall-clock time of the whole run: settling, warm-up, window and cleanup.
    pub wall_s: f64,
    /// What abissd counted, for the ABISS rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon: Option<crate::configuration::DaemonFigures>,
    /// Seeks of the readers (`--seek-every`), with how long each took to recover.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeks: Option<SeekRow>,
    /// The reads over [`crate::workload::TAIL_READ`], and how much of them was waiting for a CPU.
    pub tail: TailRow,
}

/// The readers' reads over [`crate::workload::TAIL_READ`] (0.5 ms), all readers together: how many, how many
/// spent more than half of their time waiting for a CPU, and the slowest five.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TailRow {
    /// Reads over 0.5 ms.
    pub reads: usize,
    /// Of those, the ones that waited for a CPU for more than half of their time.
    pub mostly_cpu_wait: usize,
    /// The slowest five: (read ms, of which waiting for a CPU ms), slowest first.
    pub slowest_ms: Vec<(f64, f64)>,
}

impl TailRow {
    fn from_outcomes(outcomes: &[ReaderOutcome]) -> Self {
        let mut reads: Vec<TailRead> = outcomes
            .iter()
            .flat_map(|o| o.tail_reads.iter().copied())
            .collect();
        reads.sort_unstable_by_key(|read| std::cmp::Reverse(read.latency));
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        Self {
            reads: reads.len(),
            mostly_cpu_wait: reads
                .iter()
                .filter(|read| read.cpu_wait * 2 > read.latency)
                .count(),
            slowest_ms: reads
                .iter()
                .take(5)
                .map(|read| (ms(read.latency), ms(read.cpu_wait)))
                .collect(),
        }
    }
}

/// The readers' seeks: how many, and how long after each the reader still waited for the disk
/// (the end of the last read over 1 ms before the next seek).
#[derive(Clone, Debug, Serialize)]
pub struct SeekRow {
    /// Seeks, all readers together.
    pub seeks: u64,
    /// Median recovery, ms.
    pub recovery_p50_ms: f64,
    /// Longest recovery, ms.
    pub recovery_max_ms: f64,
    /// Reads that missed their deadline after a seek (each seek restarts the schedule).
    pub misses_after_seeks: u64,
    /// Reads over 1 ms after seeks, by when they completed after their seek: under 0.5 s,
    /// 0.5–1 s, 1–2 s, 2–5 s, 5 s or more.
    pub slow_reads_by_time_after_seek: [u64; 5],
}

/// Deadline accounting in report units.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct DeadlineRow {
    /// Reads completed.
    pub reads: u64,
    /// Reads that completed after their deadline.
    pub misses: u64,
    /// `misses / reads`.
    pub miss_fraction: f64,
    /// Reads issued late because the reader was still waiting for an earlier read.
    pub late_issues: u64,
    /// The largest overrun of a deadline.
    pub worst_overrun_ms: f64,
}

impl From<&DeadlineTally> for DeadlineRow {
    fn from(tally: &DeadlineTally) -> Self {
        #[expect(clippy::cast_precision_loss, reason = "a fraction for the report")]
        let miss_fraction = if tally.reads == 0 {
            0.0
        } else {
            tally.misses as f64 / tally.reads as f64
        };
        Self {
            reads: tally.reads,
            misses: tally.misses,
            miss_fraction,
            late_issues: tally.late_issues,
            worst_overrun_ms: tally.worst_overrun.as_secs_f64() * 1000.0,
        }
    }
}

/// One reader's results.
#[derive(Clone, Debug, Serialize)]
pub struct ReaderRow {
    /// The reader's number.
    pub reader: usize,
    /// Its latency.
    pub latency: LatencySummary,
    /// Its deadlines.
    pub deadlines: DeadlineRow,
    /// Times it started its file over.
    pub wraps: u64,
}

impl SeekRow {
    fn from_outcomes(outcomes: &[ReaderOutcome]) -> Self {
        let mut recoveries: Vec<Duration> = outcomes
            .iter()
            .flat_map(|o| o.recoveries.iter().copied())
            .collect();
        recoveries.sort_unstable();
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let mut slow_reads_by_time_after_seek = [0u64; 5];
        for at in outcomes.iter().flat_map(|o| o.slow_after_seek.iter()) {
            let bucket = match at.as_millis() {
                0..500 => 0,
                500..1000 => 1,
                1000..2000 => 2,
                2000..5000 => 3,
                _ => 4,
            };
            slow_reads_by_time_after_seek[bucket] += 1;
        }
        Self {
            seeks: outcomes.iter().map(|o| o.seeks).sum(),
            recovery_p50_ms: ms(recoveries.get(recoveries.len() / 2)),
            recovery_max_ms: ms(recoveries.last()),
            misses_after_seeks: outcomes.iter().map(|o| o.misses_after_seeks).sum(),
            slow_reads_by_time_after_seek,
        }
    }
}

impl TrialFigures {
    /// A one-line summary of configuration `name`'s run for the progress output.
    #[must_use]
    pub fn progress_line(&self, name: &str) -> String {
        format!(
            "{name} with {} streams: p50 {} ms, p99 {} ms, max {} ms, {} of {} reads missed, BE copy {:.1} MB/s, busy {:.0} %",
            self.streams,
            crate::report::ms(self.latency.p50_ms),
            crate::report::ms(self.latency.p99_ms),
            crate::report::ms(self.latency.max_ms),
            self.deadlines.misses,
            self.deadlines.reads,
            self.be_copy_mb_s,
            self.device.busy_fraction * 100.0
        )
    }
}

/// Runs one configuration: selects its elevator, drops the files' pages, starts its hook and
/// the copy loop, lets the copy warm up, then starts all readers at one instant and measures
/// until the window ends. The copy's destination is removed afterwards.
pub fn run_trial(disk: &LabDisk, plan: &TrialPlan<'_>) -> anyhow::Result<TrialFigures> {
    interrupt::check()?;
    let begun = Instant::now();
    let files = plan.files;
    let configuration = plan.configuration;
    let StartState {
        queue,
        idle_before,
        cached_pages_at_start,
    } = prepare_disk(disk, plan)?;
    let stream_ranges = (disk.fs() == BenchFs::Ext4)
        .then(|| disk_ranges(&plan.files.streams[..plan.streams]))
        .transpose()?;

    let bin_dir = std::env::var_os("ABISS_BIN_DIR").map(PathBuf::from);
    let setup = configuration.hook.start_run(&RunContext {
        configuration: &configuration.name,
        device: disk.device(),
        mount_dir: disk.mount_dir(),
        stream: plan.stream,
        streams: plan.streams,
        bin_dir: bin_dir.as_deref(),
    })?;
    let copy = CopyLoop::start(
        files.copy_source.clone(),
        files.copy_destination.clone(),
        plan.copy_chunk_bytes,
    );
    sleep_interruptibly(plan.warmup)?;

    let measured = measure_readers(disk, plan, &*setup, &copy);
    let daemon = setup.daemon_figures();
    let passes = copy.passes();
    let copy_result = copy.stop();
    drop(setup);
    let cleanup = remove_copy(files);
    let Measurement {
        window,
        copied,
        records,
        outcomes,
    } = measured?;
    copy_result?;
    cleanup?;

    let streams_at_disk = stream_ranges.map(|ranges| {
        DeviceActivity::from_records(records.iter().filter(|r| ranges.holds(r.offset)), window)
    });
    let mut latency = LatencyHistogram::new();
    let mut tally = DeadlineTally::default();
    for outcome in &outcomes {
        latency.merge(&outcome.latency);
        tally.merge(&outcome.tally);
    }
    Ok(TrialFigures {
        streams: plan.streams,
        window_s: window.as_secs_f64(),
        latency: latency.summary(),
        deadlines: DeadlineRow::from(&tally),
        be_copy_mb_s: mb_per_s(copied, window),
        be_copy_passes: passes,
        device: DeviceActivity::from_records(&records, window),
        streams_work_ms: streams_at_disk
            .as_ref()
            .and_then(|at_disk| streams_work_ms(at_disk, plan.streams, plan.stream.rate_bps)),
        streams_at_disk,
        readers: outcomes
            .iter()
            .map(|o| ReaderRow {
                reader: o.reader,
                latency: o.latency.summary(),
                deadlines: DeadlineRow::from(&o.tally),
                wraps: o.wraps,
            })
            .collect(),
        percentile_curve: latency.percentile_curve(),
        cached_pages_at_start,
        idle_before,
        queue,
        wall_s: begun.elapsed().as_secs_f64(),
        daemon,
        seeks: plan.seek_every.map(|_| SeekRow::from_outcomes(&outcomes)),
        tail: TailRow::from_outcomes(&outcomes),
    })
}

/// The disk time `streams` readers of `rate_bps` each take per second, ms, at the price per
/// byte the disk served them at (`None` if it served them nothing).
fn streams_work_ms(at_disk: &DeviceActivity, streams: usize, rate_bps: u64) -> Option<f64> {
    #[expect(clippy::cast_precision_loss, reason = "rates for the report")]
    let demand_mb_s = streams as f64 * rate_bps as f64 / crate::throughput::MB;
    (at_disk.read_mb_s > 0.0)
        .then(|| at_disk.busy_fraction * 1000.0 * demand_mb_s / at_disk.read_mb_s)
}

/// The disk as a run found it, after [`prepare_disk`].
struct StartState {
    queue: QueueSettings,
    idle_before: bool,
    cached_pages_at_start: u64,
}

/// Selects the configuration's elevator, removes a leftover copy, drops the files' pages and
/// waits for the disk to go idle.
fn prepare_disk(disk: &LabDisk, plan: &TrialPlan<'_>) -> anyhow::Result<StartState> {
    let files = plan.files;
    anyhow::ensure!(
        plan.streams <= files.streams.len(),
        "{} streams asked for, {} files made",
        plan.streams,
        files.streams.len()
    );
    disk.select_elevator(&plan.configuration.elevator)?;
    remove_copy(files)?;
    for path in files.read_files() {
        drop_cached_pages(path)?;
    }
    let queue = disk.queue_settings();
    let idle_before = disk.wait_until_idle(Duration::from_secs(1), Duration::from_secs(30))?;
    let streams = &files.streams[..plan.streams];
    let mut cached_pages_at_start = 0;
    for path in streams {
        cached_pages_at_start += cached_pages(path)?;
    }
    Ok(StartState {
        queue,
        idle_before,
        cached_pages_at_start,
    })
}

/// What the measurement window yielded.
struct Measurement {
    window: Duration,
    copied: u64,
    records: Vec<abiss_lab::RequestRecord>,
    outcomes: Vec<ReaderOutcome>,
}

/// Starts the readers, lets them go at one instant t0, and measures the copy and the disk
/// over the window from t0.
fn measure_readers(
    disk: &LabDisk,
    plan: &TrialPlan<'_>,
    setup: &dyn RunSetup,
    copy: &CopyLoop,
) -> anyhow::Result<Measurement> {
    let streams = &plan.files.streams[..plan.streams];
    std::thread::scope(|scope| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut starts = Vec::new();
        let mut readers = Vec::new();
        for (reader, path) in streams.iter().enumerate() {
            let (start_tx, start_rx) = mpsc::channel();
            starts.push(start_tx);
            let ready = ready_tx.clone();
            let reader_plan = ReaderPlan {
                reader,
                path,
                stream: plan.stream,
                class: plan.configuration.reader_class,
                duration: plan.measure,
                seek_every: plan.seek_every,
            };
            let thread = std::thread::Builder::new()
                .name(format!("reader-{reader}"))
                .spawn_scoped(scope, move || {
                    run_reader(&reader_plan, setup, &ready, &start_rx)
                })
                .context("cannot start a reader thread")?;
            readers.push(thread);
        }
        drop(ready_tx);
        for _ in 0..plan.streams {
            // A reader that failed to get ready ends the run: dropping `starts` releases
            // the others.
            ready_rx
                .recv()
                .map_err(|_| anyhow!("a reader ended before it was ready"))??;
        }
        setup.readers_ready();
        // A common start a little ahead, so every reader is waiting for it.
        let t0 = Instant::now() + Duration::from_millis(20);
        for start in starts {
            let _ = start.send(t0);
        }
        std::thread::sleep(t0.saturating_duration_since(Instant::now()));
        let mut requests = disk.requests_from_now()?;
        let copied_before = copy.copied_bytes();
        let interrupted = sleep_interruptibly(plan.measure);
        let window = t0.elapsed();
        let copied = copy.copied_bytes() - copied_before;
        let records = requests.read_new()?;
        let outcomes = readers
            .into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| anyhow!("a reader panicked"))
                    .and_then(|outcome| outcome)
            })
            .collect::<anyhow::Result<Vec<ReaderOutcome>>>()?;
        interrupted?;
        Ok(Measurement {
            window,
            copied,
            records,
            outcomes,
        })
    })
}

/// Removes the copy's destination (its dirty pages go with it) and syncs the file system, so
/// the next run starts without writeback of this one.
fn remove_copy(files: &BenchFiles) -> anyhow::Result<()> {
    match std::fs::remove_file(&files.copy_destination) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("cannot remove the copy"),
    }
    let dir = std::fs::File::open(
        files
            .copy_destination
            .parent()
            .unwrap_or(std::path::Path::new("/")),
    )?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)).context("syncfs")?;
    Ok(())
}

/// Sleeps, waking early (with an error) on Ctrl-C.
pub fn sleep_interruptibly(duration: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + duration;
    loop {
        interrupt::check()?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}
