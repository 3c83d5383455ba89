//! The reference measurement of the ABISS slides ("Measurements, description"), on the lab
//! hdd: four real-time readers at 1 MB/s in 64 kB reads from 105 MB files, against a
//! best-effort loop copying a 175 MB file in 128 kB reads, for each configuration.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::json;

use crate::chart::{self, LatencySeries};
use crate::configuration::{Configuration, ConfigurationInfo};
use crate::lab_disk::{BenchFs, LabDisk, QueueSettings};
use crate::layout::{self, BenchFiles};
use crate::report::{self, Results, Row};
use crate::row::RowsArg;
use crate::schedule::StreamSpec;
use crate::trial::{run_trial, TrialFigures, TrialPlan};

/// A row of the reference measurement: a configuration and what its run measured.
type TrialRow = Row<ConfigurationInfo, TrialFigures>;
use crate::workload::WRITEBACK_WINDOW;

/// A stream of the slides: 1 MB/s, 64 kB reads, a 564 kB playout buffer.
pub const STREAM: StreamSpec = StreamSpec {
    rate_bps: 1_000_000,
    read_bytes: 64 << 10,
    buffer_bytes: 564 << 10,
};
/// The slides' stream files: 105 MB.
pub const STREAM_FILE_BYTES: u64 = 105_000_000;
/// The slides' copy loop: a 175 MB file in 128 kB reads.
pub const COPY_FILE_BYTES: u64 = 175_000_000;
/// Bytes per read(2) and write(2) of the copy.
pub const COPY_CHUNK_BYTES: usize = 128 << 10;
/// Real-time streams in the reference measurement.
pub const REFERENCE_STREAMS: usize = 4;
/// ABISS's read batch in the slides (pages); used by ABISS rows once they exist.
pub const ABISS_BATCH_PAGES: u32 = 20;
/// The emulated disk's size: room for the files, spread out, and a 4 GiB zone map.
pub const DISK_BYTES: u64 = 4 << 30;

/// The run parameters both benchmarks record: `specific` ones merged with the shared workload
/// (streams, copy loop, disk, files).
#[must_use]
pub fn workload_parameters(
    specific: serde_json::Value,
    stream_file_bytes: u64,
    model: &serde_json::Value,
    queue: &QueueSettings,
    files: &BenchFiles,
) -> serde_json::Value {
    let mut parameters = json!({
        "stream": STREAM,
        "deadline_slack_ms": STREAM.slack().as_secs_f64() * 1000.0,
        "stream_file_bytes": stream_file_bytes,
        "copy_file_bytes": COPY_FILE_BYTES,
        "copy_chunk_bytes": COPY_CHUNK_BYTES,
        "copy_writeback_window_bytes": WRITEBACK_WINDOW,
        "disk_bytes": DISK_BYTES,
        "filesystem": "ext4",
        "model": model,
        "queue": queue,
        "files": files,
        "rt_class_level": "ionice -c1 default: level 4",
    });
    if let (Some(all), serde_json::Value::Object(extra)) = (parameters.as_object_mut(), specific) {
        all.extend(extra);
    }
    parameters
}

/// `abiss-bench reference`.
#[derive(Debug, clap::Args)]
pub struct ReferenceArgs {
    /// Seconds the readers read per configuration (the files last 105 s at 1 MB/s; longer
    /// runs start them over from a cold cache).
    #[arg(long, default_value_t = 85)]
    pub secs: u64,
    /// Seconds the copy loop runs before the readers start.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// The configurations to run (`crate::abiss::all_configurations`).
    #[command(flatten)]
    pub rows: RowsArg,
    /// Readahead of the lab device in KiB (128 is what the kernel gives a SATA disk).
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
    /// The "seek storm": every reader seeks to a random position this often (seconds); the
    /// results are written as seek-storm.{json,md,svg} instead of reference.*.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seek_every: Option<u64>,
    /// The lab disk's file system; results on btrfs are written as reference-btrfs.* and
    /// reference-btrfs-zstd.*.
    #[arg(long, value_enum, default_value_t = BenchFs::Ext4)]
    pub fs: BenchFs,
}

impl ReferenceArgs {
    /// The name of the result files.
    fn results_name(&self) -> &'static str {
        match (self.seek_every, self.fs) {
            (Some(_), _) => "seek-storm",
            (None, BenchFs::Ext4) => "reference",
            (None, BenchFs::Btrfs) => "reference-btrfs",
            (None, BenchFs::BtrfsZstd) => "reference-btrfs-zstd",
        }
    }
}

/// Runs the reference measurement and writes reference.{json,md,svg}.
pub fn run(args: &ReferenceArgs) -> anyhow::Result<()> {
    let begun = std::time::Instant::now();
    anyhow::ensure!(args.secs >= 1, "--secs must be at least 1");
    let configurations = crate::abiss::select(&args.rows)?;
    let names: Vec<&str> = configurations.iter().map(|c| c.name.as_str()).collect();
    eprintln!(
        "reference: {} configurations ({}), {} s each after {} s of copy warm-up",
        configurations.len(),
        names.join(", "),
        args.secs,
        args.warmup_secs
    );
    let disk = LabDisk::up_with("reference", DISK_BYTES, args.read_ahead_kb, args.fs, None)?;
    eprintln!(
        "lab hdd {} with {:?} at {}; writing the files",
        disk.device().display(),
        args.fs,
        disk.mount_dir().display()
    );
    let make_files = if args.fs == BenchFs::Ext4 {
        layout::make_files
    } else {
        layout::make_files_in_order
    };
    let files = make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        REFERENCE_STREAMS,
        STREAM_FILE_BYTES,
        COPY_FILE_BYTES,
    )?;
    let rows = run_configurations(&disk, &files, &configurations, args)?;
    let queue = disk.queue_settings();
    let model = serde_json::to_value(disk.model())?;
    drop(disk);

    let mut parameters = workload_parameters(
        json!({
            "secs": args.secs,
            "warmup_secs": args.warmup_secs,
            "streams": REFERENCE_STREAMS,
            "abiss_batch_pages": ABISS_BATCH_PAGES,
            "seek_every_s": args.seek_every,
        }),
        STREAM_FILE_BYTES,
        &model,
        &queue,
        &files,
    );
    parameters["filesystem"] = json!(args.fs.name());
    let results = Results::new("reference", begun, parameters, rows);
    let markdown = markdown(&results, args, &queue);
    results.write(&args.results_dir, args.results_name(), &markdown, |svg| {
        chart(svg, args, &results.rows)
    })
}

/// The latency percentile curves of every row.
fn chart(svg: &std::path::Path, args: &ReferenceArgs, rows: &[TrialRow]) -> anyhow::Result<()> {
    let series: Vec<LatencySeries<'_>> = rows
        .iter()
        .map(|r| LatencySeries {
            name: &r.name,
            curve: &r.figures.percentile_curve,
        })
        .collect();
    // Each chart names its own run: the seek storm is not the reference measurement.
    let readers = args.seek_every.map_or_else(
        || "4 readers at 1 MB/s".to_owned(),
        |every| format!("4 readers at 1 MB/s seeking every {every} s"),
    );
    chart::latency_percentiles(
        svg,
        &format!(
            "read(2) latency of {readers} against a 175 MB copy loop, lab hdd ({} s)",
            args.secs
        ),
        &series,
        STREAM.slack().as_secs_f64() * 1000.0,
    )
}

fn run_configurations(
    disk: &LabDisk,
    files: &BenchFiles,
    configurations: &[Configuration],
    args: &ReferenceArgs,
) -> anyhow::Result<Vec<TrialRow>> {
    let mut rows = Vec::new();
    for configuration in configurations {
        eprintln!("running {} …", configuration.name);
        let row = run_trial(
            disk,
            &TrialPlan {
                seek_every: args.seek_every.map(Duration::from_secs),
                ..copy_loop_plan(
                    configuration,
                    files,
                    REFERENCE_STREAMS,
                    STREAM,
                    (args.warmup_secs, args.secs),
                )
            },
        )
        .with_context(|| format!("configuration {}", configuration.name))?;
        eprintln!("  {}", row.progress_line(&configuration.name));
        rows.push(Row::new(&configuration.name, configuration.describe(), row));
    }
    Ok(rows)
}

fn markdown(
    results: &Results<ConfigurationInfo, TrialFigures>,
    args: &ReferenceArgs,
    queue: &QueueSettings,
) -> String {
    let rows = &results.rows;
    let mut text = format!(
        "### Reference measurement (ABISS slides): 4 readers at 1 MB/s vs a copy loop, lab hdd\n\n\
         `{command}`: {secs} s per configuration after {warmup} s of copy warm-up, cold page cache. \
         Readers: buffered read(2) of 64 KiB every 65.5 ms from 105 MB files; a read misses if it \
         completes after t0 + B/R + i·S/R (buffer B = 564 KiB, slack {slack:.0} ms). Copy loop: \
         175 MB in 128 KiB read(2)/write(2), writeback kept going in 8 MiB windows. {disk_line} \
         {machine_line}\n\n\
         | configuration | elevator | reader class | reads | p50 ms | p99 ms | p99.9 ms | max ms | deadline misses | BE copy MB/s | disk busy % |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        secs = args.secs,
        warmup = args.warmup_secs,
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        command = results.command,
        disk_line = report::disk_line(queue, args.fs.name()),
        machine_line = report::machine_line(&results.machine),
    );
    for Row {
        configuration,
        figures: row,
        ..
    } in rows
    {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({:.2} %) | {:.1} | {:.0} |",
            configuration.name,
            configuration.elevator,
            configuration.reader_class,
            row.deadlines.reads,
            report::ms(row.latency.p50_ms),
            report::ms(row.latency.p99_ms),
            report::ms(row.latency.p99_9_ms),
            report::ms(row.latency.max_ms),
            row.deadlines.misses,
            row.deadlines.miss_fraction * 100.0,
            row.be_copy_mb_s,
            row.device.busy_fraction * 100.0,
        );
    }
    let _ = write!(
        text,
        "\nReader class `rt/4` is `ionice -c1` (real-time, level 4, its default), set per reader \
         thread with ioprio_set; `default` leaves best effort. Latency chart: {}.svg.\n",
        args.results_name()
    );
    tail_table(&mut text, rows);
    daemon_table(&mut text, rows);
    seek_table(&mut text, rows, args.seek_every);
    text
}

/// The readers' reads over 0.5 ms, and how much of each was waiting for a CPU.
fn tail_table(text: &mut String, rows: &[TrialRow]) {
    text.push_str(
        "
The tail: the readers' reads over 0.5 ms; those that spent more than half of their time \
         runnable but not running (the kernel's run-queue delay, `/proc/thread-self/schedstat`, \
         read around each read), which is the machine's CPU load rather than the disk or the \
         page cache; and the slowest five, each as read ms (of which waiting for a CPU):\n\n\
         | configuration | reads over 0.5 ms | mostly waiting for a CPU | slowest five, ms (CPU wait) |\n\
         | --- | ---: | ---: | --- |\n",
    );
    for row in rows {
        let tail = &row.figures.tail;
        let slowest: Vec<String> = tail
            .slowest_ms
            .iter()
            .map(|(read, wait)| format!("{} ({})", report::ms(*read), report::ms(*wait)))
            .collect();
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} |",
            row.configuration.name,
            tail.reads,
            tail.mostly_cpu_wait,
            slowest.join(", "),
        );
    }
}

/// What abissd counted in the ABISS rows.
fn daemon_table(text: &mut String, rows: &[TrialRow]) {
    let counted: Vec<(&TrialRow, &crate::configuration::DaemonFigures)> = rows
        .iter()
        .filter_map(|r| r.figures.daemon.as_ref().map(|d| (r, d)))
        .collect();
    if counted.is_empty() {
        return;
    }
    text.push_str(
        "\nWhat abissd counted (requests tagged with a stream; priority inversions = those that ran \
         below the stream's level; readers raised after a page-cache miss, and the time from the \
         kernel event to the raised priority):\n\n\
         | configuration | stream requests | priority inversions | raises | raise p50 µs | raise p99 µs |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let micros = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |us| us.to_string());
    for (row, daemon) in counted {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            row.name,
            daemon.stream_requests,
            daemon.inversions,
            daemon.raises,
            micros(daemon.raise_latency_p50_us),
            micros(daemon.raise_latency_p99_us)
        );
    }
}

/// The readers' seeks, in a seek storm.
fn seek_table(text: &mut String, rows: &[TrialRow], every: Option<u64>) {
    let Some(every) = every else {
        return;
    };
    let _ = write!(
        text,
        "\nSeek storm: every reader seeks to a random position every {every} s; each seek restarts \
         its schedule (deadlines count from the seek with the buffer's slack again). Recovery = \
         from the seek to the end of the last read over 1 ms before the next seek.\n\n\
         | configuration | seeks | deadline misses after seeks | recovery p50 ms | recovery max ms | reads over 1 ms, by time after the seek: <0.5 s / 0.5–1 / 1–2 / 2–5 / ≥5 s |\n\
         | --- | ---: | ---: | ---: | ---: | --- |\n"
    );
    for row in rows {
        if let Some(seeks) = &row.figures.seeks {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {:.1} | {:.1} | {} |",
                row.name,
                seeks.seeks,
                seeks.misses_after_seeks,
                seeks.recovery_p50_ms,
                seeks.recovery_max_ms,
                seeks
                    .slow_reads_by_time_after_seek
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
        }
    }
}
/// The plan of a step against the reference copy loop (its 128 KiB calls): `streams` readers
/// of `stream` start after `warmup_secs` of copying and read for `secs`, without seeks.
#[must_use]
pub fn copy_loop_plan<'a>(
    configuration: &'a Configuration,
    files: &'a BenchFiles,
    streams: usize,
    stream: StreamSpec,
    (warmup_secs, secs): (u64, u64),
) -> TrialPlan<'a> {
    TrialPlan {
        configuration,
        files,
        streams,
        stream,
        copy_chunk_bytes: COPY_CHUNK_BYTES,
        warmup: Duration::from_secs(warmup_secs),
        measure: Duration::from_secs(secs),
        seek_every: None,
    }
}
