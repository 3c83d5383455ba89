//! The capacity of a disk as a matter of memory: the saturation sweep's 1 MB/s readers under
//! the reference copy loop, attached to abissd with playout buffers sized from a locked-memory
//! budget, one sweep per budget.
//!
//! A stream's window is refilled in loads of a third of its buffer, one disk access each
//! (`policy::playout::load_bytes`), so a larger buffer buys fewer seeks per second of media: at
//! 564 KiB most of the disk's time goes to seeks, at megabytes most of it goes to transfer. Each
//! budget is sized out in one of two ways (`--sizing`):
//!
//! - **equal**: the benchmark gives each stream an equal share for the most streams the sweep
//!   tries: buffer = budget / streams, less the batch a stream may lock beyond its buffer, and
//!   the readers' deadlines have that buffer's slack. Admission's prediction for the same
//!   buffer comes from the disk's measured model (`abissctl profile --quick`).
//! - **abissd**: the streams attach with `--buffer auto` on top of the reference 564 KiB as the
//!   application's own part (the readers' deadlines keep that part's slack), and abissd, with
//!   the disk's model and admission on, makes the buffers as large as the disk needs to admit
//!   them (`policy::buffer_sizing::smallest_fitting_buffer`). A stream it refuses ends the
//!   budget's sweep.
//!
//! abissd runs with the budget as its `--locked-memory` either way, so the budget is enforced,
//! not only assumed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use abiss_client::{Client, ClientError};
use abiss_proto::{AdmissionMode, AdmitRequest, ByteRate, ByteSize, PAGE_BYTES};
use anyhow::Context as _;
use plotters::prelude::*;
use serde::Serialize;
use serde_json::json;

use crate::abiss::{AbissHook, Daemon, StreamBuffer, BATCH_PAGES};
use crate::configuration::Configuration;
use crate::lab_disk::LabDisk;
use crate::layout::{self, BenchFiles};
use crate::reference::{
    workload_parameters, COPY_CHUNK_BYTES, COPY_FILE_BYTES, DISK_BYTES, STREAM,
};
use crate::report;
use crate::schedule::StreamSpec;
use crate::sweep::{stream_steps, sustained_streams, EarlyStop};
use crate::trial::{run_trial, TrialPlan, TrialRow};

/// Who shares a budget out among the streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Sizing {
    /// The benchmark: equal shares for `--max-streams` streams.
    Equal,
    /// abissd: `--buffer auto`, grown for the disk's admission.
    Abissd,
}

/// `abiss-bench memory`.
#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// Locked-memory budgets to sweep, each shared equally by `--max-streams` streams
    /// (20MiB gives about the reference's 564 KiB buffers).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "20MiB,64MiB,128MiB,256MiB"
    )]
    pub budgets: Vec<ByteSize>,
    /// Who sizes the buffers out of each budget: the benchmark in equal shares, abissd, or
    /// both (one sweep each).
    #[arg(long, value_delimiter = ',', default_value = "equal,abissd")]
    pub sizing: Vec<Sizing>,
    /// Seconds the readers read per step.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Seconds the copy loop runs before each step's readers start.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// The most streams to try; each budget is divided by this.
    #[arg(long, default_value_t = 32)]
    pub max_streams: usize,
    /// The fewest streams to try: the sweep's steps below it are skipped (the reference
    /// buffers already serve 16 without a miss).
    #[arg(long, default_value_t = 8)]
    pub min_streams: usize,
    /// Steps to run after the first one with misses.
    #[arg(long, default_value_t = 1)]
    pub steps_after_miss: usize,
    /// Allowed miss probability per window, for admission's prediction.
    #[arg(long, default_value_t = 0.01)]
    pub p_req: f64,
    /// Readahead of the lab device in KiB.
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// The buffer each of `streams` streams gets from `budget_bytes`: an equal share, less the
/// batch a stream may lock beyond its buffer, in whole pages.
#[must_use]
pub fn buffer_for(budget_bytes: u64, streams: usize) -> u64 {
    let batch = u64::from(BATCH_PAGES) * PAGE_BYTES;
    let share = budget_bytes / (streams.max(1) as u64);
    share.saturating_sub(batch) / PAGE_BYTES * PAGE_BYTES
}

/// One budget's sweep.
#[derive(Debug, Serialize)]
struct BudgetSweep {
    sizing: Sizing,
    budget_bytes: u64,
    /// The buffer of every stream (equal shares), or the application's own part (abissd).
    buffer_bytes: u64,
    /// What admission predicts for streams with this buffer, from the measured model (equal
    /// shares: with abissd's sizing admission decides as the streams come).
    predicted_n_max_statistical: Option<u32>,
    predicted_n_max_deterministic: Option<u32>,
    /// abissd's sizing: the first step with a stream abissd refused, and its sentence.
    refused_at: Option<(usize, String)>,
    /// The most streams with zero misses (steps before the first with misses).
    sustained_streams: Option<usize>,
    first_streams_with_misses: Option<usize>,
    /// The most streams whose reads came from memory: zero misses and a read p99 under
    /// [`FROM_MEMORY_P99_MS`], in every step up to it. A larger buffer is a longer deadline
    /// slack, so misses alone would let a read wait seconds for the disk unseen.
    from_memory_streams: Option<usize>,
    steps: Vec<TrialRow>,
}

/// A read p99 under this means at least 99 % of the reads found their pages in memory: a
/// 64 KiB read from the page cache takes well under a millisecond, one from the lab hdd at
/// least a seek and a rotation.
pub const FROM_MEMORY_P99_MS: f64 = 10.0;

/// The most streams of the steps before the first with a miss or a read p99 of
/// [`FROM_MEMORY_P99_MS`] or more; `steps` are (streams, misses, read p99 ms) in order.
#[must_use]
pub fn from_memory_streams(steps: &[(usize, u64, f64)]) -> Option<usize> {
    steps
        .iter()
        .take_while(|(_, misses, p99_ms)| *misses == 0 && *p99_ms < FROM_MEMORY_P99_MS)
        .last()
        .map(|(n, _, _)| *n)
}

/// Runs the benchmark and writes memory.{json,md,svg}.
pub fn run(args: &MemoryArgs) -> anyhow::Result<()> {
    let begun = std::time::Instant::now();
    anyhow::ensure!(args.secs >= 1, "--secs must be at least 1");
    anyhow::ensure!(!args.budgets.is_empty(), "--budgets names no budget");
    anyhow::ensure!(
        args.min_streams >= 1 && args.min_streams <= args.max_streams,
        "--min-streams must be between 1 and --max-streams"
    );
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd and abissctl are); run it through `cargo xtask bench memory`")?;
    for budget in &args.budgets {
        anyhow::ensure!(
            buffer_for(budget.0, args.max_streams) >= PAGE_BYTES,
            "a budget of {budget} leaves no buffer for {} streams: give at least {} per stream",
            args.max_streams,
            ByteSize(u64::from(BATCH_PAGES + 1) * PAGE_BYTES)
        );
    }
    let steps: Vec<usize> = stream_steps(args.max_streams)
        .into_iter()
        .filter(|n| *n >= args.min_streams)
        .collect();
    let largest = args
        .budgets
        .iter()
        .map(|b| buffer_for(b.0, args.max_streams))
        .max()
        .unwrap_or(STREAM.buffer_bytes);
    let stream_file_bytes =
        (STREAM.rate_bps * args.secs + largest).next_multiple_of(1_000_000) + 1_000_000;
    let disk = LabDisk::up("memory", DISK_BYTES, args.read_ahead_kb)?;
    // On tmpfs, as abissd's default /run/abiss is on a systemd machine (see bench::abiss).
    let state_dir =
        std::path::Path::new("/dev/shm").join(format!("abiss-bench-memory-{}", std::process::id()));
    let result = run_on(args, &bin_dir, &disk, &state_dir, &steps, stream_file_bytes);
    let _ = std::fs::remove_dir_all(&state_dir);
    let (model, sweeps, files) = result?;
    let queue = disk.queue_settings();
    let lab_model = serde_json::to_value(disk.model())?;
    drop(disk);

    let command = report::command_line("memory");
    let machine = report::machine();
    let parameters = report::step_parameters(
        args.secs,
        args.warmup_secs,
        args.max_streams,
        &steps,
        args.steps_after_miss,
        json!({ "p_req": args.p_req, "batch_pages": BATCH_PAGES }),
    );
    let report = report::document(
        "memory",
        &command,
        &machine,
        begun,
        json!({
            "parameters": workload_parameters(
                parameters,
                stream_file_bytes,
                &lab_model,
                &queue,
                &files,
            ),
            "device_model": model,
            "budgets": sweeps,
        }),
    );
    let markdown = markdown(&command, &machine, args, &queue, &sweeps);
    report::write_results(&args.results_dir, "memory", &report, &markdown)?;
    let svg = args.results_dir.join("memory.svg");
    draw(&svg, args, &sweeps).context("cannot draw memory.svg")?;
    println!("written: {}", svg.display());
    Ok(())
}

type Outcome = (serde_json::Value, Vec<BudgetSweep>, BenchFiles);

fn run_on(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    steps: &[usize],
    stream_file_bytes: u64,
) -> anyhow::Result<Outcome> {
    eprintln!("profiling {} (quick) …", disk.device().display());
    let model = crate::admission::profile(bin_dir, disk.device(), state_dir)?;
    let files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        args.max_streams,
        stream_file_bytes,
        COPY_FILE_BYTES,
    )?;
    let mut sweeps = Vec::new();
    for sizing in &args.sizing {
        for budget in &args.budgets {
            sweeps.push(sweep_budget(
                args, bin_dir, disk, state_dir, steps, &files, *sizing, *budget,
            )?);
        }
    }
    Ok((model, sweeps, files))
}

/// One budget's sweep, sized by `sizing`.
#[expect(
    clippy::too_many_arguments,
    reason = "the sweep's fixed parts (disk, files, model) and the row's two (sizing, budget)"
)]
fn sweep_budget(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    steps: &[usize],
    files: &BenchFiles,
    sizing: Sizing,
    budget: ByteSize,
) -> anyhow::Result<BudgetSweep> {
    let (buffer, predicted, configuration) =
        row_setup(args, bin_dir, disk, state_dir, sizing, budget)?;
    let name = &configuration.name;
    let stream = StreamSpec {
        buffer_bytes: buffer,
        ..STREAM
    };
    let mut rows = Vec::new();
    let mut refused_at = None;
    let mut early_stop = EarlyStop::new(args.steps_after_miss);
    for &streams in steps {
        eprintln!("running {name} with {streams} streams …");
        let row = match run_trial(
            disk,
            &TrialPlan {
                configuration: &configuration,
                files,
                streams,
                stream,
                copy_chunk_bytes: COPY_CHUNK_BYTES,
                warmup: Duration::from_secs(args.warmup_secs),
                measure: Duration::from_secs(args.secs),
                seek_every: None,
            },
        ) {
            Ok(row) => row,
            Err(error) if refused(&error) => {
                eprintln!("  abissd refused a stream: {error:#}");
                refused_at = Some((streams, format!("{error:#}")));
                break;
            }
            Err(error) => return Err(error.context(format!("{name} with {streams} streams"))),
        };
        eprintln!("  {}", row.progress_line());
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
    let from_memory = from_memory_streams(
        &rows
            .iter()
            .map(|r| (r.streams, r.deadlines.misses, r.latency.p99_ms))
            .collect::<Vec<_>>(),
    );
    Ok(BudgetSweep {
        sizing,
        budget_bytes: budget.0,
        buffer_bytes: buffer,
        predicted_n_max_statistical: predicted.map(|p| p.0),
        predicted_n_max_deterministic: predicted.map(|p| p.1),
        refused_at,
        sustained_streams: sustained,
        first_streams_with_misses: first_miss,
        from_memory_streams: from_memory,
        steps: rows,
    })
}

/// A row's readers' buffer, admission's `n_max` (statistical, deterministic) for it, and its
/// configuration.
type RowSetup = (u64, Option<(u32, u32)>, Configuration);

/// The row of `sizing` and `budget`: the readers' buffer, admission's prediction (equal
/// shares), and the configuration that runs abissd for it.
fn row_setup(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    sizing: Sizing,
    budget: ByteSize,
) -> anyhow::Result<RowSetup> {
    let (buffer, predicted, hook) = match sizing {
        Sizing::Equal => {
            let buffer = buffer_for(budget.0, args.max_streams);
            let predicted = predict(bin_dir, disk.device(), state_dir, args, buffer)?;
            eprintln!(
                "budget {budget}: {} per stream; admission predicts {} (statistical), {} \
                 (deterministic)",
                ByteSize(buffer),
                predicted.0,
                predicted.1
            );
            let hook = AbissHook {
                elevator: "mq-deadline",
                level: 0,
                daemon_args: vec!["--locked-memory".to_owned(), budget.to_string()],
                buffer: StreamBuffer::Fixed,
                state_dir: None,
            };
            (buffer, Some(predicted), hook)
        }
        Sizing::Abissd => {
            let p_req = args.p_req.to_string();
            let hook = AbissHook {
                elevator: "mq-deadline",
                level: 0,
                // abissd's default share: a fifth of the disk stays for best effort.
                daemon_args: vec![
                    "--locked-memory".to_owned(),
                    budget.to_string(),
                    "--p-req".to_owned(),
                    p_req,
                    "--realtime-share".to_owned(),
                    "80".to_owned(),
                ],
                buffer: StreamBuffer::AutoOnReader,
                state_dir: Some(state_dir.to_path_buf()),
            };
            (STREAM.buffer_bytes, None, hook)
        }
    };
    let name = match sizing {
        Sizing::Equal => format!("abiss-{budget}"),
        Sizing::Abissd => format!("abiss-auto-{budget}"),
    };
    let description = match sizing {
        Sizing::Equal => format!(
            "ABISS over mq-deadline, --locked-memory {budget}, {} buffers",
            ByteSize(buffer)
        ),
        Sizing::Abissd => format!(
            "ABISS over mq-deadline, --locked-memory {budget}, --buffer auto+{}, admission by \
             the disk's model",
            ByteSize(buffer)
        ),
    };
    let configuration = Configuration::new(&name, &description, "mq-deadline").with_hook(hook);
    Ok((buffer, predicted, configuration))
}

/// Whether a trial ended because abissd's admission refused a stream.
fn refused(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ClientError>(),
            Some(ClientError::Refused { .. })
        )
    })
}

/// Admission's `n_max` (statistical, deterministic) for streams of `buffer_bytes`, from the
/// model saved in `state_dir`, at the benchmark's share of 95 % (what its abissd runs with).
fn predict(
    bin_dir: &Path,
    device: &Path,
    state_dir: &Path,
    args: &MemoryArgs,
    buffer_bytes: u64,
) -> anyhow::Result<(u32, u32)> {
    let p_req = args.p_req.to_string();
    let daemon = Daemon::start(
        bin_dir,
        device,
        &[
            "--admission",
            "off",
            "--realtime-share",
            "95",
            "--p-req",
            &p_req,
        ],
        Some(state_dir),
    )?;
    let mut client = Client::connect(daemon.socket())?;
    let device_name = device.to_string_lossy().into_owned();
    let mut ask = |mode| {
        client.admit(AdmitRequest {
            device: device_name.clone(),
            rate: ByteRate(STREAM.rate_bps),
            rate_stdev: ByteRate(0),
            buffer: ByteSize(buffer_bytes),
            batch_pages: Some(BATCH_PAGES),
            count: None,
            mode: Some(mode),
            write: false,
        })
    };
    let statistical = ask(AdmissionMode::Statistical)?;
    anyhow::ensure!(
        statistical.current_miss_probability.is_some(),
        "abissd did not take up the model: {}",
        statistical.model_source
    );
    let deterministic = ask(AdmissionMode::Deterministic)?;
    Ok((
        statistical.n_max.unwrap_or(0),
        deterministic.n_max.unwrap_or(0),
    ))
}

fn markdown(
    command: &str,
    machine: &serde_json::Value,
    args: &MemoryArgs,
    queue: &crate::lab_disk::QueueSettings,
    sweeps: &[BudgetSweep],
) -> String {
    let mut text = format!(
        "### Streams against memory: 1 MB/s readers against the copy loop, lab hdd\n\n\
         `{command}`: per locked-memory budget, abissd runs with `--locked-memory` set to it. \
         **Equal**: every stream gets an equal share of the budget for {max} streams (the \
         buffer, plus the {batch}-page batch a stream may lock beyond it), and the readers' \
         deadline slack is that buffer's (buffer / rate); admission's n_max is abissd's \
         prediction for that buffer from the disk's model at p_req {p_req} and a 95 % real-time \
         share. **Abissd**: the streams attach with `--buffer auto+{app}` (the application's \
         own part, whose slack the readers' deadlines keep: {slack:.0} ms), abissd has the \
         disk's model and admission on, and enlarges the buffers as far as the disk's admission \
         needs, within the budget; a stream it refuses ends the sweep. Readers as in the sweep \
         (1 MB/s in 64 KiB reads, starting once their window is loaded) against the reference \
         copy loop (175 MB in 128 KiB calls); steps of {secs} s after {warmup} s of copy \
         warm-up, from {min} streams, stopping {after} step(s) after the first with misses. The \
         disk's model: `abissctl profile --quick`. {disk_line} {machine_line}\n\n\
         **From memory** counts a step only while its reads' p99 stays under {from_memory} ms as \
         well: a larger buffer is a longer slack, so a read may wait seconds for the disk and \
         still not miss.\n\n\
         | sizing | budget | buffer per stream | admission predicts (statistical / deterministic) | most streams with zero misses | first streams with misses | most streams from memory | abissd refused a stream at | buffers abissd gave at the most streams | BE copy MB/s at the most streams |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        max = args.max_streams,
        batch = BATCH_PAGES,
        app = ByteSize(STREAM.buffer_bytes),
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        secs = args.secs,
        warmup = args.warmup_secs,
        min = args.min_streams,
        after = args.steps_after_miss,
        p_req = args.p_req,
        from_memory = FROM_MEMORY_P99_MS,
        disk_line = report::disk_line(queue),
        machine_line = report::machine_line(machine),
    );
    for sweep in sweeps {
        summary_row(&mut text, sweep, args);
    }
    steps_table(&mut text, sweeps);
    text.push_str("\nStreams against the budget: memory.svg.\n");
    text
}

/// One budget's line of the summary table.
fn summary_row(text: &mut String, sweep: &BudgetSweep, args: &MemoryArgs) {
    let most = sweep
        .sustained_streams
        .and_then(|n| sweep.steps.iter().find(|r| r.streams == n));
    let clean_copy = most.map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r.be_copy_mb_s));
    let given = most
        .and_then(|r| r.daemon.as_ref())
        .and_then(|d| d.buffer_bytes)
        .map_or_else(|| "-".to_owned(), buffer_range);
    let predicted = sweep
        .predicted_n_max_statistical
        .zip(sweep.predicted_n_max_deterministic)
        .map_or_else(|| "-".to_owned(), |(s, d)| format!("{s} / {d}"));
    let buffer = match sweep.sizing {
        Sizing::Equal => ByteSize(sweep.buffer_bytes).to_string(),
        Sizing::Abissd => format!("auto+{}", ByteSize(sweep.buffer_bytes)),
    };
    let _ = writeln!(
        text,
        "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        sweep.sizing,
        ByteSize(sweep.budget_bytes),
        buffer,
        predicted,
        match (sweep.sustained_streams, sweep.first_streams_with_misses) {
            (None, _) => format!("none from {}", args.min_streams),
            (Some(n), None) => format!("≥ {n}"),
            (Some(n), Some(_)) => n.to_string(),
        },
        sweep.first_streams_with_misses.map_or_else(
            || format!("none up to {}", args.max_streams),
            |n| n.to_string()
        ),
        sweep.from_memory_streams.map_or_else(
            || format!("none from {}", args.min_streams),
            |n| n.to_string()
        ),
        sweep
            .refused_at
            .as_ref()
            .map_or_else(|| "-".to_owned(), |(n, _)| n.to_string()),
        given,
        clean_copy,
    );
}

/// Every step of every sweep, a line each.
fn steps_table(text: &mut String, sweeps: &[BudgetSweep]) {
    text.push_str(
        "\n| sizing | budget | streams | reads | misses | p50 ms | p99 ms | max ms | worst overrun ms | buffers abissd gave | BE copy MB/s | disk busy % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for sweep in sweeps {
        for row in &sweep.steps {
            let given = row
                .daemon
                .as_ref()
                .and_then(|d| d.buffer_bytes)
                .map_or_else(|| "-".to_owned(), buffer_range);
            let _ = writeln!(
                text,
                "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
                sweep.sizing,
                ByteSize(sweep.budget_bytes),
                row.streams,
                row.deadlines.reads,
                row.deadlines.misses,
                report::ms(row.latency.p50_ms),
                report::ms(row.latency.p99_ms),
                report::ms(row.latency.max_ms),
                report::ms(row.deadlines.worst_overrun_ms),
                given,
                row.be_copy_mb_s,
                row.device.busy_fraction * 100.0,
            );
        }
    }
    for sweep in sweeps {
        if let Some((n, sentence)) = &sweep.refused_at {
            let _ = writeln!(
                text,
                "\n{:?}, {}: at {n} streams abissd refused one: {sentence}",
                sweep.sizing,
                ByteSize(sweep.budget_bytes)
            );
        }
    }
}

/// The smallest and largest buffer abissd gave, as the tables show them.
fn buffer_range((min, max): (u64, u64)) -> String {
    if min == max {
        ByteSize(min).to_string()
    } else {
        format!("{} to {}", ByteSize(min), ByteSize(max))
    }
}

/// A budget in MiB, for the chart's axis.
fn mib(bytes: u64) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "budgets in MiB are far below 2^52"
    )]
    let mib = bytes as f64 / f64::from(1 << 20);
    mib
}

/// The chart's lines: (name, points of budget MiB and streams).
fn chart_series(sweeps: &[BudgetSweep], max_streams: u32) -> [(&'static str, Vec<(f64, f64)>); 4] {
    let measured = |sizing: Sizing, from_memory: bool| -> Vec<(f64, f64)> {
        sweeps
            .iter()
            .filter(|s| s.sizing == sizing)
            .map(|s| {
                let n = if from_memory {
                    s.from_memory_streams
                } else {
                    s.sustained_streams
                }
                .unwrap_or(0);
                (
                    mib(s.budget_bytes),
                    f64::from(u32::try_from(n).unwrap_or(0)),
                )
            })
            .collect()
    };
    let predicted: Vec<(f64, f64)> = sweeps
        .iter()
        .filter_map(|s| {
            s.predicted_n_max_statistical
                .map(|n| (mib(s.budget_bytes), f64::from(n.min(max_streams + 1))))
        })
        .collect();
    [
        (
            "equal shares: most streams with zero misses",
            measured(Sizing::Equal, false),
        ),
        (
            "equal shares: most streams from memory (read p99 < 10 ms)",
            measured(Sizing::Equal, true),
        ),
        (
            "equal shares: admission predicts (statistical n_max)",
            predicted,
        ),
        (
            "abissd sizes --buffer auto: most streams with zero misses",
            measured(Sizing::Abissd, false),
        ),
    ]
}

/// memory.svg: zero-miss streams (measured) and admission's `n_max` against the budget.
fn draw(path: &Path, args: &MemoryArgs, sweeps: &[BudgetSweep]) -> anyhow::Result<()> {
    let max_mib = sweeps
        .iter()
        .map(|s| mib(s.budget_bytes))
        .fold(1.0, f64::max);
    let max_streams = u32::try_from(args.max_streams).unwrap_or(u32::MAX);
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Zero-miss 1 MB/s streams against the locked-memory budget, lab hdd under a copy loop",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_mib * 1.05, 0f64..f64::from(max_streams + 2))?;
    chart
        .configure_mesh()
        .x_desc("locked-memory budget (MiB), shared by the streams")
        .y_desc("streams")
        .draw()?;
    let series = chart_series(sweeps, max_streams);
    for (index, (name, points)) in series
        .into_iter()
        .filter(|(_, points)| !points.is_empty())
        .enumerate()
    {
        crate::chart::marked_line(&mut chart, index, name, points, 4)?;
    }
    crate::chart::finish(&mut chart, &root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_memory_ends_at_the_first_step_with_a_miss_or_a_slow_p99() {
        let steps = [(12, 0, 0.05), (16, 0, 0.07), (20, 0, 101.0), (24, 0, 0.06)];
        assert_eq!(from_memory_streams(&steps), Some(16));
        assert_eq!(from_memory_streams(&[(12, 1, 0.05)]), None);
        assert_eq!(
            from_memory_streams(&[(12, 0, 0.05), (16, 0, 9.9)]),
            Some(16)
        );
        assert_eq!(from_memory_streams(&[]), None);
    }

    #[test]
    fn each_stream_gets_an_equal_share_less_its_batch_in_pages() {
        // 20 MiB for 32 streams: 640 KiB each, 560 KiB of it buffer (the reference's 564 KiB).
        assert_eq!(buffer_for(20 << 20, 32), 560 << 10);
        assert_eq!(buffer_for(256 << 20, 32), (8 << 20) - (80 << 10));
        assert_eq!(buffer_for(1 << 20, 32), 0);
        assert_eq!(buffer_for(64 << 20, 0), (64 << 20) - (80 << 10));
        assert_eq!(buffer_for((64 << 20) + 5, 3) % PAGE_BYTES, 0);
    }
}
