//! The capacity of a disk as a matter of memory: the saturation sweep's 1 MB/s readers under
//! the reference copy loop, attached to abissd with playout buffers sized from a locked-memory
//! budget, one sweep per budget.
//!
//! A stream's window is refilled in loads of a third of its buffer, one disk access each
//! (`policy::playout::load_bytes`), so a larger buffer buys fewer seeks per second of media: at
//! 564 KiB most of the disk's time goes to seeks, at megabytes most of it goes to transfer. Each
//! budget is sized out in one of two ways, its row says which (`abiss-BUDGET`, `abiss-auto-BUDGET`):
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

use std::path::{Path, PathBuf};

use abiss_client::{Client, ClientError};
use abiss_proto::{AdmissionMode, AdmitRequest, ByteRate, ByteSize, PAGE_BYTES};
use anyhow::Context as _;
use serde::Serialize;
use serde_json::json;

use crate::abiss::{AbissHook, Daemon, StreamBuffer, BATCH_PAGES};
use crate::configuration::{Configuration, ConfigurationInfo, StreamsPrediction};
use crate::lab_disk::LabDisk;
use crate::layout::{self, BenchFiles};
use crate::reference::{copy_loop_plan, workload_parameters, COPY_FILE_BYTES, DISK_BYTES, STREAM};
use crate::report::{self, Results, Row};
use crate::row::RowsArg;
use crate::schedule::StreamSpec;
use crate::sweep::{stream_steps, sustained_streams, EarlyStop};
use crate::trial::{run_trial, TrialFigures};

mod table;

/// Who shares a budget out among the streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sizing {
    /// The benchmark: equal shares for `--max-streams` streams.
    Equal,
    /// abissd: `--buffer auto`, grown for the disk's admission.
    Abissd,
}

/// The budgets of the default rows (20MiB gives about the reference's 564 KiB buffers).
const DEFAULT_BUDGETS: [u64; 4] = [20 << 20, 64 << 20, 128 << 20, 256 << 20];

/// `abiss-bench memory`.
#[derive(Debug, clap::Args)]
pub struct MemoryArgs {
    /// A row is a locked-memory budget and who sizes the buffers out of it: `abiss-BUDGET`
    /// shares it equally among `--max-streams` streams, `abiss-auto-BUDGET` lets abissd size
    /// them (`--buffer auto`); e.g. `--rows abiss-64MiB,abiss-auto-64MiB`. Default: both
    /// sizings of 20MiB, 64MiB, 128MiB and 256MiB.
    #[command(flatten)]
    pub rows: RowsArg,
    /// Seconds the readers read per step. A minute: a large buffer is a long slack, and a
    /// disk that falls a little short of the streams' rate drains it for longer than 20 s
    /// before a read misses (40 streams of 6.3 MiB on the lab hdd missed nothing in 20 s,
    /// 5 to 13 % of their reads in 60 s).
    #[arg(long, default_value_t = 60)]
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
    /// The real-time share abissd admits by in the rows it sizes (`abiss-auto-…`), percent;
    /// 80 is abissd's own default, which keeps a fifth of the disk for best effort. The
    /// equal-share rows' prediction is at 95 %, the most abissd gives.
    #[arg(long, default_value_t = 80)]
    pub realtime_share: u32,
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

/// A row: who sizes the buffers out of which budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRow {
    /// Who sizes the buffers.
    pub sizing: Sizing,
    /// The locked-memory budget.
    pub budget: ByteSize,
}

impl MemoryRow {
    /// The row's name: `abiss-BUDGET` (equal shares) or `abiss-auto-BUDGET` (abissd).
    #[must_use]
    pub fn name(self) -> String {
        match self.sizing {
            Sizing::Equal => format!("abiss-{}", self.budget),
            Sizing::Abissd => format!("abiss-auto-{}", self.budget),
        }
    }

    /// The row named `name`.
    pub fn parse(name: &str) -> anyhow::Result<Self> {
        let (sizing, budget) = if let Some(budget) = name.strip_prefix("abiss-auto-") {
            (Sizing::Abissd, budget)
        } else if let Some(budget) = name.strip_prefix("abiss-") {
            (Sizing::Equal, budget)
        } else {
            anyhow::bail!(
                "unknown row {name:?}; rows are abiss-BUDGET (equal shares) and \
                 abiss-auto-BUDGET (abissd sizes), e.g. abiss-64MiB"
            );
        };
        let budget = budget
            .parse()
            .map_err(|error| anyhow::anyhow!("row {name:?}: {error}"))?;
        Ok(Self { sizing, budget })
    }

    /// The rows `--rows` names, in its order, or the default rows.
    pub fn selected(rows: &RowsArg) -> anyhow::Result<Vec<Self>> {
        if rows.rows.is_empty() {
            return Ok([Sizing::Equal, Sizing::Abissd]
                .into_iter()
                .flat_map(|sizing| {
                    DEFAULT_BUDGETS.map(|budget| Self {
                        sizing,
                        budget: ByteSize(budget),
                    })
                })
                .collect());
        }
        rows.rows.iter().map(|name| Self::parse(name)).collect()
    }
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
    /// Equal shares: per step, what admission's model predicts for its streams.
    predicted_steps: Vec<(usize, StreamsPrediction)>,
    /// abissd's sizing: the first step with a stream abissd refused, and its sentence.
    refused_at: Option<(usize, String)>,
    /// The most streams with zero misses (steps before the first with misses).
    sustained_streams: Option<usize>,
    first_streams_with_misses: Option<usize>,
    /// The most streams whose reads came from memory: zero misses and a read p99 under
    /// [`FROM_MEMORY_P99_MS`], in every step up to it. A larger buffer is a longer deadline
    /// slack, so misses alone would let a read wait seconds for the disk unseen.
    from_memory_streams: Option<usize>,
    steps: Vec<TrialFigures>,
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
    anyhow::ensure!(
        (1..=95).contains(&args.realtime_share),
        "--realtime-share must be between 1 and 95"
    );
    let rows = MemoryRow::selected(&args.rows)?;
    anyhow::ensure!(
        args.min_streams >= 1 && args.min_streams <= args.max_streams,
        "--min-streams must be between 1 and --max-streams"
    );
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd and abissctl are); run it through `cargo xtask bench memory`")?;
    for MemoryRow { budget, .. } in &rows {
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
    let largest = rows
        .iter()
        .map(|row| buffer_for(row.budget.0, args.max_streams))
        .max()
        .unwrap_or(STREAM.buffer_bytes);
    let stream_file_bytes =
        (STREAM.rate_bps * args.secs + largest).next_multiple_of(1_000_000) + 1_000_000;
    let disk = LabDisk::up("memory", DISK_BYTES, args.read_ahead_kb)?;
    // On tmpfs, as abissd's default /run/abiss is on a systemd machine (see bench::abiss).
    let state_dir =
        std::path::Path::new("/dev/shm").join(format!("abiss-bench-memory-{}", std::process::id()));
    let result = run_on(
        args,
        &bin_dir,
        &disk,
        &state_dir,
        (&steps, &rows),
        stream_file_bytes,
    );
    let _ = std::fs::remove_dir_all(&state_dir);
    let (model, sweeps, files) = result?;
    let queue = disk.queue_settings();
    let lab_model = serde_json::to_value(disk.model())?;
    drop(disk);

    let parameters = report::step_parameters(
        args.secs,
        args.warmup_secs,
        args.max_streams,
        &steps,
        args.steps_after_miss,
        json!({
            "p_req": args.p_req,
            "batch_pages": BATCH_PAGES,
            "abissd_sized_realtime_share_percent": args.realtime_share,
        }),
    );
    let results = Results::new(
        "memory",
        begun,
        workload_parameters(parameters, stream_file_bytes, &lab_model, &queue, &files),
        sweeps,
    )
    .with("device_model", model)?;
    let markdown = table::markdown(&results, args, &queue);
    results.write(&args.results_dir, "memory", &markdown, |svg| {
        table::draw(svg, args, &results.rows)
    })
}

/// A row of the benchmark: the configuration of a budget and sizing, and its sweep.
type BudgetRow = Row<ConfigurationInfo, BudgetSweep>;

type Outcome = (serde_json::Value, Vec<BudgetRow>, BenchFiles);

fn run_on(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    (steps, rows): (&[usize], &[MemoryRow]),
    stream_file_bytes: u64,
) -> anyhow::Result<Outcome> {
    eprintln!("profiling {} (quick) …", disk.device().display());
    let model = crate::admission::profile(bin_dir, disk.device(), state_dir)?;
    let mut files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        args.max_streams,
        stream_file_bytes,
        COPY_FILE_BYTES,
    )?;
    // The first n streams at random places over the disk, as admission's model has them (in
    // disk order, a few streams sat close together on the fast outer tracks, and the model
    // priced them 10 to 18 % high).
    files.shuffle(layout::SHUFFLE_SEED);
    let mut sweeps = Vec::new();
    for row in rows {
        sweeps.push(sweep_budget(
            args, bin_dir, disk, state_dir, steps, &files, *row,
        )?);
    }
    Ok((model, sweeps, files))
}

/// One budget's sweep, sized by `sizing`.
fn sweep_budget(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    steps: &[usize],
    files: &BenchFiles,
    MemoryRow { sizing, budget }: MemoryRow,
) -> anyhow::Result<BudgetRow> {
    let (buffer, predicted, configuration) =
        row_setup(args, bin_dir, disk, state_dir, (sizing, budget), steps)?;
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
            &copy_loop_plan(
                &configuration,
                files,
                streams,
                stream,
                (args.warmup_secs, args.secs),
            ),
        ) {
            Ok(row) => row,
            Err(error) if refused(&error) => {
                eprintln!("  abissd refused a stream: {error:#}");
                refused_at = Some((streams, format!("{error:#}")));
                break;
            }
            Err(error) => return Err(error.context(format!("{name} with {streams} streams"))),
        };
        eprintln!("  {}", row.progress_line(name));
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
    let sweep = BudgetSweep {
        sizing,
        budget_bytes: budget.0,
        buffer_bytes: buffer,
        predicted_n_max_statistical: predicted.as_ref().map(|p| p.0),
        predicted_n_max_deterministic: predicted.as_ref().map(|p| p.1),
        predicted_steps: predicted.map(|p| p.2).unwrap_or_default(),
        refused_at,
        sustained_streams: sustained,
        first_streams_with_misses: first_miss,
        from_memory_streams: from_memory,
        steps: rows,
    };
    Ok(Row::new(name, configuration.describe(), sweep))
}

/// A row's readers' buffer, admission's prediction for it (equal shares), and its
/// configuration.
type RowSetup = (u64, Option<Predicted>, Configuration);

/// Admission's `n_max` (statistical, deterministic) for a buffer, and its prediction for each
/// step's streams.
type Predicted = (u32, u32, Vec<(usize, StreamsPrediction)>);

/// The row of `sizing` and `budget`: the readers' buffer, admission's prediction (equal
/// shares), and the configuration that runs abissd for it.
fn row_setup(
    args: &MemoryArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    (sizing, budget): (Sizing, ByteSize),
    steps: &[usize],
) -> anyhow::Result<RowSetup> {
    let (buffer, predicted, hook) = match sizing {
        Sizing::Equal => {
            let buffer = buffer_for(budget.0, args.max_streams);
            let predicted = predict(bin_dir, disk.device(), state_dir, args, (buffer, steps))?;
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
                daemon_args: vec![
                    "--locked-memory".to_owned(),
                    budget.to_string(),
                    "--p-req".to_owned(),
                    p_req,
                    "--realtime-share".to_owned(),
                    args.realtime_share.to_string(),
                ],
                buffer: StreamBuffer::AutoOnReader,
                state_dir: Some(state_dir.to_path_buf()),
            };
            (STREAM.buffer_bytes, None, hook)
        }
    };
    let name = MemoryRow { sizing, budget }.name();
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
/// model saved in `state_dir`, at the benchmark's share of 95 % (what its abissd runs with),
/// and what it predicts for each of `steps`' stream counts.
fn predict(
    bin_dir: &Path,
    device: &Path,
    state_dir: &Path,
    args: &MemoryArgs,
    (buffer_bytes, steps): (u64, &[usize]),
) -> anyhow::Result<Predicted> {
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
    let mut ask = |mode, count| {
        client.admit(AdmitRequest {
            device: device_name.clone(),
            rate: ByteRate(STREAM.rate_bps),
            rate_stdev: ByteRate(0),
            buffer: ByteSize(buffer_bytes),
            batch_pages: Some(BATCH_PAGES),
            count,
            mode: Some(mode),
            write: false,
        })
    };
    let mut work = Vec::new();
    for &n in steps {
        let plan = ask(AdmissionMode::Statistical, Some(u32::try_from(n)?))?;
        work.extend(plan.miss_probability.zip(plan.mean_work_ms).map(
            |(miss_probability, work_ms)| {
                (
                    n,
                    StreamsPrediction {
                        miss_probability,
                        work_ms,
                    },
                )
            },
        ));
    }
    let statistical = ask(AdmissionMode::Statistical, None)?;
    anyhow::ensure!(
        statistical.current_miss_probability.is_some(),
        "abissd did not take up the model: {}",
        statistical.model_source
    );
    let deterministic = ask(AdmissionMode::Deterministic, None)?;
    Ok((
        statistical.n_max.unwrap_or(0),
        deterministic.n_max.unwrap_or(0),
        work,
    ))
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
