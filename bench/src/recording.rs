//! Real recorders next to real players under a best-effort writer (issue 10): two ffmpeg
//! recorders, a `GStreamer` one and the project's paced `abiss-test-recorder` each write an
//! 8 Mbit/s MPEG-TS to the lab hdd while four ffmpeg players play 8 Mbit/s files from it,
//! against a sequential writer of 1 MiB blocks and two random 16 KiB readers, with a small
//! machine's dirty limits (`vm.dirty_bytes` 64 MiB, background 16 MiB). Per row: stock
//! mq-deadline, bfq with recorders and players in `ionice -c1`, and abiss (recorders under
//! `abissctl run --write`, players under `abissctl run`), on ext4, ext4 `data=writeback` and
//! xfs; and abiss past the page cache (issue 36), on ext4 and xfs: ffmpeg and gst write into a
//! FIFO that `abissctl record` reads, the test recorder records through the library
//! (`DirectRecording`). The recorders' write(2) calls are timed by `perf trace`, the library
//! recorder's writes (copies into its ring) by itself; overflows are counted against a 1 s
//! capture buffer (see [`writes`]). With `--load greedy` the load is ABISS's eight greedy
//! streams instead ([`load`]).

pub mod content;
mod direct;
pub mod filesystem;
pub mod load;
pub mod recorder;
pub mod session;
mod table;
pub mod throttle;
pub mod tracer_cost;
pub mod writes;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::json;

use crate::players::{media, Class};
use crate::report::{Results, Row};
use crate::row::RowsArg;
use filesystem::{DirtyLimits, FileSystem};
use recorder::RecorderKind;
use session::{Bench, RowPlan};

/// The lab disk: media, the readers' 512 MiB, the writer's up to 2 GiB, the recordings.
const DISK_BYTES: u64 = 6 << 30;
/// The recorders of every row, in order.
const RECORDERS: [RecorderKind; 4] = [
    RecorderKind::Ffmpeg,
    RecorderKind::Ffmpeg,
    RecorderKind::Gstreamer,
    RecorderKind::Test,
];
/// The players of every row (ffmpeg `-re`, one file each).
const PLAYERS: usize = 4;
/// A small machine's dirty limits, as in the issue.
const DIRTY_BYTES: u64 = 64 << 20;
const DIRTY_BACKGROUND_BYTES: u64 = 16 << 20;
/// The goal of issue 10 for the abiss rows: recorder write p99.9, ms.
const GOAL_P999_MS: f64 = 5.0;

/// `abiss-bench recording`.
#[derive(Debug, clap::Args)]
pub struct RecordingArgs {
    /// Seconds each row's recorders and players run.
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Seconds the load runs before they start.
    #[arg(long, default_value_t = 5)]
    pub warmup_secs: u64,
    /// Rows to run, by name (default: all), e.g. `--rows mq-deadline,abiss`.
    #[command(flatten)]
    pub rows: RowsArg,
    /// The capture buffer overflows are counted against, ms.
    #[arg(long, default_value_t = 1000)]
    pub capture_ms: u64,
    /// `abissctl run --write --rate` of each recorder in the abiss rows (they write 1 MB/s).
    #[arg(long, default_value = "1.1MB/s")]
    pub recorder_rate: String,
    /// `abissctl run --write --buffer` of each recorder (the write-behind window).
    #[arg(long, default_value = "1MiB")]
    pub recorder_buffer: String,
    /// `abissctl record --buffer` of each recorder in the direct rows (the ring).
    #[arg(long, default_value = "2MiB")]
    pub record_buffer: String,
    /// `abissctl record --preallocate` in the direct rows: abissd allocates each recording
    /// ahead of its writes.
    #[arg(long)]
    pub record_preallocate: bool,
    /// `abissctl run --rate` of each player in the abiss rows (the media is 1 MB/s).
    #[arg(long, default_value = "1.1MB/s")]
    pub player_rate: String,
    /// `abissctl run --preroll` of each player in the abiss rows, as docs/user-guide.md advises for
    /// players (`0`: none), so their start-up probe is loaded at once.
    #[arg(long, default_value = "6MiB")]
    pub player_preroll: String,
    /// Seconds of each no-load, warm-cache baseline run of the player (three).
    #[arg(long, default_value_t = 8)]
    pub baseline_secs: u64,
    /// Readahead of the lab device in KiB (128 is what the kernel gives a SATA disk).
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
    /// Also keep every recorder's `perf trace` output here (`ROW-N-KIND.trace`).
    #[arg(long)]
    pub traces_dir: Option<PathBuf>,
    /// The best-effort load beside the recorders and players: `seeky` (one writer, two random
    /// readers) or `greedy` (ABISS's 8 greedy streams: 4 writers, 4 readers).
    #[arg(long, value_enum, default_value_t = load::LoadKind::Seeky)]
    pub load: load::LoadKind,
}

/// What one row of the benchmark runs (reported as its [`crate::row::Row`]'s configuration).
#[derive(Clone, Debug, Serialize)]
pub struct Configuration {
    /// Short name (`--rows`).
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// The elevator (abissd keeps mq-deadline in the abiss rows).
    pub elevator: &'static str,
    /// How recorders and players are started.
    pub class: Class,
    /// The file system on the lab disk.
    pub file_system: FileSystem,
    /// The recorders write into a FIFO that `abissctl record FILE` reads and writes past the
    /// page cache (issue 36), rather than into FILE under `abissctl run --write`.
    pub direct: bool,
    /// More abissd options (abiss rows): `--dispatch-depth 8`.
    pub daemon_options: &'static [&'static str],
}

/// Every row, in report order (grouped by file system: each is made once).
#[must_use]
pub fn all_rows() -> Vec<Configuration> {
    use Class::{Abiss, Default, RealTime};
    use FileSystem::{Ext4, Ext4Writeback, Xfs};
    let row = |name, description, elevator, class, file_system| Configuration {
        name,
        description,
        elevator,
        class,
        file_system,
        direct: false,
        daemon_options: &[],
    };
    let direct = |name, description, file_system| Configuration {
        direct: true,
        ..row(name, description, "mq-deadline", Abiss, file_system)
    };
    vec![
        row(
            "mq-deadline",
            "stock mq-deadline, ext4",
            "mq-deadline",
            Default,
            Ext4,
        ),
        row(
            "bfq-rt",
            "bfq, recorders and players in ionice -c1, ext4",
            "bfq",
            RealTime,
            Ext4,
        ),
        row("abiss", "abiss, ext4", "mq-deadline", Abiss, Ext4),
        direct(
            "abiss-direct",
            "abiss, recorders into abissctl record, ext4",
            Ext4,
        ),
        Configuration {
            daemon_options: &["--dispatch-depth", "8"],
            ..direct(
                "abiss-direct-depth-8",
                "abiss at the dispatch depth it gave rotational disks until 2026-12-07 \
                 (abissd --dispatch-depth 8), recorders into abissctl record, ext4",
                Ext4,
            )
        },
        row(
            "mq-deadline-writeback",
            "stock mq-deadline, ext4 data=writeback",
            "mq-deadline",
            Default,
            Ext4Writeback,
        ),
        row(
            "abiss-writeback",
            "abiss, ext4 data=writeback",
            "mq-deadline",
            Abiss,
            Ext4Writeback,
        ),
        row(
            "mq-deadline-xfs",
            "stock mq-deadline, xfs",
            "mq-deadline",
            Default,
            Xfs,
        ),
        row("abiss-xfs", "abiss, xfs", "mq-deadline", Abiss, Xfs),
        direct(
            "abiss-direct-xfs",
            "abiss, recorders into abissctl record, xfs",
            Xfs,
        ),
    ]
}

/// Whether `row` runs when no rows are named: all but the comparisons of abissd's options.
fn by_default(row: &Configuration) -> bool {
    row.daemon_options.is_empty()
}

/// The time of day (UTC), for the row windows in the report.
fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%H:%M:%S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Runs the benchmark and writes recording.{json,md,svg}.
pub fn run(args: &RecordingArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    anyhow::ensure!(args.secs >= 10, "--secs must be at least 10");
    anyhow::ensure!(args.capture_ms > 0, "--capture-ms must be positive");
    let rows = args
        .rows
        .select_present(all_rows(), |r| r.name, by_default, |r| r.elevator)?;
    if let Some(dir) = &args.traces_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let media_secs = u32::try_from(args.secs)? + 30;
    let mut bench = Bench::up(media_secs.max(90), args.read_ahead_kb, args.load)?;
    eprintln!("recording: what timing write(2) costs");
    let tracer_cost = tracer_cost::measure(bench.scratch())?;
    for cost in &tracer_cost {
        eprintln!(
            "  {}: {:.1} µs per loop, +{:.1} µs",
            cost.method, cost.loop_us_per_write, cost.added_us_per_write
        );
    }
    bench.prepare(rows[0].file_system)?;
    eprintln!("recording: no-load, warm-cache baseline of the player");
    let baselines = bench.baseline(args.baseline_secs)?;
    let limits = DirtyLimits::set(DIRTY_BYTES, DIRTY_BACKGROUND_BYTES)?;
    let mut results = Vec::new();
    let mut windows = Vec::new();
    for row in &rows {
        bench.prepare(row.file_system)?;
        eprintln!("running {} …", row.name);
        let started = utc_now();
        let result = bench
            .run_row(
                &RowPlan {
                    row,
                    warmup: Duration::from_secs(args.warmup_secs),
                    secs: args.secs,
                    player_rate: &args.player_rate,
                    player_preroll: &args.player_preroll,
                    recorder_rate: &args.recorder_rate,
                    recorder_buffer: &args.recorder_buffer,
                    record_buffer: &args.record_buffer,
                    record_preallocate: args.record_preallocate,
                    capture_ms: args.capture_ms,
                    traces_dir: args.traces_dir.as_deref(),
                },
                &baselines,
            )
            .with_context(|| format!("row {}", row.name))?;
        eprintln!("  {}", table::progress_line(&result));
        windows.push(json!({"row": row.name, "started": started}));
        results.push(result);
    }
    let saved_vm = limits.saved().clone();
    drop(limits);
    let queue = bench.queue_settings();
    drop(bench);
    write_report(
        args,
        begun,
        &Outcome {
            media_secs: media_secs.max(90),
            windows,
            saved_vm,
            queue,
            tracer_cost,
            baselines,
            results,
        },
    )
}

/// What a run produced, for the report.
struct Outcome {
    media_secs: u32,
    windows: Vec<serde_json::Value>,
    saved_vm: filesystem::SavedSettings,
    queue: crate::lab_disk::QueueSettings,
    tracer_cost: Vec<tracer_cost::MethodCost>,
    baselines: std::collections::BTreeMap<String, crate::players::baseline::Baseline>,
    results: Vec<session::RowResult>,
}

/// Writes recording.{json,md,svg}.
fn write_report(args: &RecordingArgs, begun: Instant, outcome: &Outcome) -> anyhow::Result<()> {
    let results = Results::new(
        "recording",
        begun,
        json!({
            "secs": args.secs,
            "warmup_secs": args.warmup_secs,
            "capture_ms": args.capture_ms,
            "recorders": RECORDERS.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "recorder_rate_bps": recorder::RATE_BPS,
            "abiss_recorder_rate": args.recorder_rate,
            "abiss_recorder_buffer": args.recorder_buffer,
            "abiss_record_buffer": args.record_buffer,
            "abiss_record_preallocate": args.record_preallocate,
            "players": PLAYERS,
            "abiss_player_rate": args.player_rate,
            "abiss_player_preroll": args.player_preroll,
            "media": media::parameters(outcome.media_secs),
            "vm_dirty_bytes": DIRTY_BYTES,
            "vm_dirty_background_bytes": DIRTY_BACKGROUND_BYTES,
            "vm_settings_before": outcome.saved_vm.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>(),
            "goal_p999_ms": GOAL_P999_MS,
            "queue": outcome.queue,
            "disk_bytes": DISK_BYTES,
            "load": args.load,
            "abiss_bound_ns": crate::request_trace::ABISS_BOUND_NS,
        }),
        outcome
            .results
            .iter()
            .map(|result| Row::new(result.row.name, &result.row, result))
            .collect(),
    )
    .with("row_starts_utc", &outcome.windows)?
    .with("tracer_cost", &outcome.tracer_cost)?
    .with("baselines", &outcome.baselines)?;
    let (command, machine) = (&results.command, &results.machine);
    let markdown = table::markdown(&table::Context {
        command,
        machine,
        args,
        queue: &outcome.queue,
        tracer_cost: &outcome.tracer_cost,
        baselines: &outcome.baselines,
        results: &outcome.results,
    });
    results.write(&args.results_dir, "recording", &markdown, |svg| {
        table::chart(svg, args.secs, args.capture_ms, &outcome.results)
    })
}
