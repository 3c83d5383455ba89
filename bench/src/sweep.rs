//! The saturation sweep: under the reference copy load, more and more 1 MB/s readers (the
//! reference streams' reads and buffer) until deadline misses appear, per configuration.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use abiss_proto::ByteSize;
use anyhow::Context as _;
use serde::Serialize;
use serde_json::json;

use crate::chart::{self, MissSeries};
use crate::configuration::{Configuration, ConfigurationInfo};
use crate::lab_disk::{LabDisk, QueueSettings};
use crate::layout::{self, BenchFiles};
use crate::reference::{copy_loop_plan, workload_parameters, COPY_FILE_BYTES, DISK_BYTES, STREAM};
use crate::report::{self, Results, Row};
use crate::row::RowsArg;
use crate::trial::{run_trial, TrialFigures};

/// `abiss-bench sweep`.
#[derive(Debug, clap::Args)]
pub struct SweepArgs {
    /// Seconds the readers read per step.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Seconds the copy loop runs before each step's readers start.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// The configurations to sweep (`crate::abiss::all_configurations`).
    #[command(flatten)]
    pub rows: RowsArg,
    /// The most streams to try.
    #[arg(long, default_value_t = 32)]
    pub max_streams: usize,
    /// Steps to run after the first one with misses (to show how the misses grow).
    #[arg(long, default_value_t = 1)]
    pub steps_after_miss: usize,
    /// Readahead of the lab device in KiB (128 is what the kernel gives a SATA disk).
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// The stream counts a sweep tries up to `max`: one by one to 4, by twos to 16, then by
/// fours (fine where few streams already hurt, coarse where each step costs more).
#[must_use]
pub fn stream_steps(max: usize) -> Vec<usize> {
    let mut steps = Vec::new();
    let mut n = 1;
    while n <= max {
        steps.push(n);
        n += match n {
            ..4 => 1,
            4..16 => 2,
            _ => 4,
        };
    }
    if steps.last().is_some_and(|last| *last < max) {
        steps.push(max);
    }
    steps
}

/// Which steps of a configuration run: all until the first step with misses, then
/// `steps_after_miss` more.
#[derive(Clone, Copy, Debug)]
pub struct EarlyStop {
    steps_after_miss: usize,
    first_miss: Option<usize>,
    steps_seen: usize,
}

impl EarlyStop {
    /// A rule that runs `steps_after_miss` steps past the first with misses.
    #[must_use]
    pub fn new(steps_after_miss: usize) -> Self {
        Self {
            steps_after_miss,
            first_miss: None,
            steps_seen: 0,
        }
    }

    /// Records a step's misses; returns whether to run the next step.
    pub fn record(&mut self, misses: u64) -> bool {
        if misses > 0 && self.first_miss.is_none() {
            self.first_miss = Some(self.steps_seen);
        }
        self.steps_seen += 1;
        self.first_miss
            .is_none_or(|first| self.steps_seen <= first + self.steps_after_miss)
    }
}

/// The headline of a configuration: the most streams of the steps before the first step with
/// misses (`None` if even the first step missed), and the streams of that first step.
#[must_use]
pub fn sustained_streams(steps: &[(usize, u64)]) -> (Option<usize>, Option<usize>) {
    let first_miss = steps.iter().position(|(_, misses)| *misses > 0);
    let clean = &steps[..first_miss.unwrap_or(steps.len())];
    (
        clean.last().map(|(n, _)| *n),
        first_miss.map(|i| steps[i].0),
    )
}

/// What one configuration's sweep measured.
#[derive(Debug, Serialize)]
struct SweepFigures {
    /// The most streams with zero misses (steps before the first with misses).
    sustained_streams: Option<usize>,
    /// The streams of the first step with misses, if any.
    first_streams_with_misses: Option<usize>,
    steps: Vec<TrialFigures>,
}

/// A row of the sweep: a configuration and its steps.
type ConfigurationSweep = Row<ConfigurationInfo, SweepFigures>;

/// Runs the sweep and writes sweep.{json,md,svg}.
pub fn run(args: &SweepArgs) -> anyhow::Result<()> {
    let begun = std::time::Instant::now();
    anyhow::ensure!(args.secs >= 1, "--secs must be at least 1");
    anyhow::ensure!(args.max_streams >= 1, "--max-streams must be at least 1");
    let configurations = crate::abiss::select(&args.rows)?;
    let steps = stream_steps(args.max_streams);
    eprintln!(
        "sweep: {} configurations, streams {:?}, {} s per step after {} s of copy warm-up",
        configurations.len(),
        steps,
        args.secs,
        args.warmup_secs
    );
    // Each stream file holds what a step reads, so all files fit on the disk however many
    // streams there are; the readers start over (from the disk) if a step outlasts it.
    let stream_file_bytes =
        (STREAM.rate_bps * args.secs + STREAM.buffer_bytes).next_multiple_of(1_000_000) + 1_000_000;
    let disk = LabDisk::up("sweep", DISK_BYTES, args.read_ahead_kb)?;
    eprintln!(
        "lab hdd {} with ext4 at {}; writing {} stream files",
        disk.device().display(),
        disk.mount_dir().display(),
        args.max_streams
    );
    let files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        args.max_streams,
        stream_file_bytes,
        COPY_FILE_BYTES,
    )?;

    let mut sweeps = Vec::new();
    for configuration in &configurations {
        sweeps.push(sweep_configuration(
            &disk,
            &files,
            configuration,
            &steps,
            args,
        )?);
    }
    let queue = disk.queue_settings();
    let model = serde_json::to_value(disk.model())?;
    drop(disk);

    let parameters = report::step_parameters(
        args.secs,
        args.warmup_secs,
        args.max_streams,
        &steps,
        args.steps_after_miss,
        json!({}),
    );
    let results = Results::new(
        "sweep",
        begun,
        workload_parameters(parameters, stream_file_bytes, &model, &queue, &files),
        sweeps,
    );
    let markdown = markdown(&results, args, &queue);
    results.write(&args.results_dir, "sweep", &markdown, |svg| {
        draw_chart(svg, args, &results.rows)
    })
}

/// Draws sweep.svg: each configuration's miss fraction by streams.
fn draw_chart(svg: &Path, args: &SweepArgs, sweeps: &[ConfigurationSweep]) -> anyhow::Result<()> {
    let series: Vec<MissSeries<'_>> = sweeps
        .iter()
        .map(|s| MissSeries {
            name: &s.name,
            steps: s
                .figures
                .steps
                .iter()
                .map(|r| (r.streams, r.deadlines.miss_fraction))
                .collect(),
        })
        .collect();
    chart::misses_by_streams(
        svg,
        &format!(
            "Deadline misses of 1 MB/s readers against a copy loop, lab hdd ({} s steps)",
            args.secs
        ),
        &series,
    )
}

/// Runs one configuration's steps until the early stop.
fn sweep_configuration(
    disk: &LabDisk,
    files: &BenchFiles,
    configuration: &Configuration,
    steps: &[usize],
    args: &SweepArgs,
) -> anyhow::Result<ConfigurationSweep> {
    let mut rows = Vec::new();
    let mut early_stop = EarlyStop::new(args.steps_after_miss);
    for &streams in steps {
        eprintln!("running {} with {streams} streams …", configuration.name);
        let row = run_trial(
            disk,
            &copy_loop_plan(
                configuration,
                files,
                streams,
                STREAM,
                (args.warmup_secs, args.secs),
            ),
        )
        .with_context(|| {
            format!(
                "configuration {} with {streams} streams",
                configuration.name
            )
        })?;
        eprintln!("  {}", row.progress_line(&configuration.name));
        let go_on = early_stop.record(row.deadlines.misses);
        rows.push(row);
        if !go_on {
            break;
        }
    }
    let counts: Vec<(usize, u64)> = rows
        .iter()
        .map(|r| (r.streams, r.deadlines.misses))
        .collect();
    let (sustained, first_miss) = sustained_streams(&counts);
    Ok(Row::new(
        &configuration.name,
        configuration.describe(),
        SweepFigures {
            sustained_streams: sustained,
            first_streams_with_misses: first_miss,
            steps: rows,
        },
    ))
}

fn markdown(
    results: &Results<ConfigurationInfo, SweepFigures>,
    args: &SweepArgs,
    queue: &QueueSettings,
) -> String {
    let sweeps = &results.rows;
    let mut text = format!(
        "### Saturation sweep: 1 MB/s readers against the copy loop, lab hdd\n\n\
         `{command}`: steps of {secs} s after {warmup} s of copy warm-up, cold page cache, up to \
         {max} streams, stopping {after} step(s) after the first step with misses. Readers and \
         copy as in the reference measurement (64 KiB reads, 564 KiB buffer, deadline slack \
         {slack:.0} ms; 175 MB copy in 128 KiB calls); stream files spread over the disk. \
         {disk_line} {machine_line}\n\n\
         | configuration | elevator | reader class | most streams with zero misses | first streams with misses |\n\
         | --- | --- | --- | ---: | ---: |\n",
        secs = args.secs,
        warmup = args.warmup_secs,
        max = args.max_streams,
        after = args.steps_after_miss,
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        command = results.command,
        disk_line = report::disk_line(queue, "ext4"),
        machine_line = report::machine_line(&results.machine),
    );
    for Row {
        configuration,
        figures: sweep,
        ..
    } in sweeps
    {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} |",
            configuration.name,
            configuration.elevator,
            configuration.reader_class,
            match (sweep.sustained_streams, sweep.first_streams_with_misses) {
                (None, _) => "0".to_owned(),
                (Some(n), None) => format!("≥ {n}"),
                (Some(n), Some(_)) => n.to_string(),
            },
            sweep.first_streams_with_misses.map_or_else(
                || format!("none up to {}", args.max_streams),
                |n| n.to_string()
            ),
        );
    }
    text.push_str(
        "\n| configuration | streams | reads | misses | p50 ms | p99 ms | max ms | worst overrun ms | BE copy MB/s | disk busy % | playout buffer |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for sweep in sweeps {
        for row in &sweep.figures.steps {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} | {} |",
                sweep.name,
                row.streams,
                row.deadlines.reads,
                row.deadlines.misses,
                report::ms(row.latency.p50_ms),
                report::ms(row.latency.p99_ms),
                report::ms(row.latency.max_ms),
                report::ms(row.deadlines.worst_overrun_ms),
                row.be_copy_mb_s,
                row.device.busy_fraction * 100.0,
                buffer_range(row.daemon.as_ref().and_then(|d| d.buffer_bytes)),
            );
        }
    }
    text.push_str("\nMisses against streams: sweep.svg.\n");
    text
}

/// The smallest to the largest playout buffer abissd gave a step's streams (they differ where
/// it sized them itself), or `-` for the stock rows.
pub(crate) fn buffer_range(bytes: Option<(u64, u64)>) -> String {
    match bytes {
        None => "-".to_owned(),
        Some((low, high)) if low == high => ByteSize(low).to_string(),
        Some((low, high)) => format!("{} to {}", ByteSize(low), ByteSize(high)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_fine_first_then_coarser_and_end_at_the_maximum() {
        assert_eq!(stream_steps(1), [1]);
        assert_eq!(stream_steps(5), [1, 2, 3, 4, 5]);
        assert_eq!(
            stream_steps(32),
            [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32]
        );
        assert_eq!(stream_steps(18), [1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18]);
    }

    #[test]
    fn early_stop_runs_the_given_steps_past_the_first_miss() {
        let mut rule = EarlyStop::new(1);
        assert!(rule.record(0));
        assert!(rule.record(0));
        assert!(rule.record(3)); // first misses: one more step
        assert!(!rule.record(9));

        let mut strict = EarlyStop::new(0);
        assert!(strict.record(0));
        assert!(!strict.record(1));

        // A clean step after the first miss does not reset the count.
        let mut rule = EarlyStop::new(1);
        assert!(rule.record(2));
        assert!(!rule.record(0));
    }

    #[test]
    fn headline_is_the_last_clean_step_before_the_first_miss() {
        assert_eq!(
            sustained_streams(&[(1, 0), (2, 0), (4, 0), (6, 5), (8, 0)]),
            (Some(4), Some(6))
        );
        assert_eq!(sustained_streams(&[(1, 2), (2, 9)]), (None, Some(1)));
        assert_eq!(sustained_streams(&[(1, 0), (2, 0)]), (Some(2), None));
        assert_eq!(sustained_streams(&[]), (None, None));
    }
}
