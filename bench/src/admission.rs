//! The admission benchmark: how well abissd's admission control predicts deadline misses.
//!
//! On the lab hdd, `abissctl profile --quick --save` measures the device model; abissd then
//! predicts, per number n of 1 MB/s readers (the reference streams: 64 KiB reads, 564 KiB
//! buffer), the miss probability per service window in both modes, the disk time a window
//! takes, and `n_max` at `p_req`. Then the readers run for real, attached to abissd with
//! admission switched off, from 1 past saturation, against the reference copy loop, each n
//! `--repeat` times with the stream files in another random order over the disk; the measured
//! deadline-miss ratio and the disk time the streams' requests took are set against the
//! predictions, as means with their 95 % intervals.

use std::path::{Path, PathBuf};
use std::process::Command;

use abiss_client::Client;
use abiss_proto::{AdmissionMode, AdmitRequest, ByteRate, ByteSize};
use anyhow::{bail, Context as _};
use serde::Serialize;
use serde_json::json;

use crate::abiss::{AbissHook, Daemon, StreamBuffer};
use crate::configuration::Configuration;
use crate::lab_disk::LabDisk;
use crate::layout::{self, BenchFiles};
use crate::reference::{copy_loop_plan, workload_parameters, COPY_FILE_BYTES, DISK_BYTES, STREAM};
use crate::repeats::Spread;
use crate::report::{self, Results, Row};
use crate::row::{self, RowsArg};
use crate::trial::{run_trial, TrialFigures};

mod table;

/// `abiss-bench admission`.
#[derive(Debug, clap::Args)]
pub struct AdmissionArgs {
    /// Seconds the readers read per step.
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Seconds the copy loop runs before each step's readers start.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// The most streams to try.
    #[arg(long, default_value_t = 24)]
    pub max_streams: usize,
    /// Runs per stream count, each with the stream files in another random order over the
    /// disk; the tables give the mean and its 95 % interval.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Steps to run after the first one whose mean miss ratio exceeds `p_req`.
    #[arg(long, default_value_t = 2)]
    pub steps_after_miss: usize,
    /// Allowed miss probability per window.
    #[arg(long, default_value_t = 0.01)]
    pub p_req: f64,
    /// Share of the disk admission gives real-time streams, percent (1 to 95).
    #[arg(long, default_value_t = 95)]
    pub realtime_share: u32,
    /// Readahead of the lab device in KiB (128 is what the kernel gives a SATA disk).
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Its one row, `abiss-admission-off`: abissd with admission off, steps of more readers.
    #[command(flatten)]
    pub rows: RowsArg,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// The benchmark's one row: abissd measures, with admission off, what admission predicted.
fn admission_off() -> Configuration {
    Configuration::new(
        "abiss-admission-off",
        "ABISS over mq-deadline, real-time streams, admission off",
        "mq-deadline",
    )
    .with_hook(AbissHook {
        elevator: "mq-deadline",
        level: 0,
        daemon_args: vec!["--admission".to_owned(), "off".to_owned()],
        buffer: StreamBuffer::Fixed,
        state_dir: None,
    })
}

/// What the row measured: `n_max` per mode and measured, and each step.
#[derive(Debug, Serialize)]
struct AdmissionFigures {
    n_max: serde_json::Value,
    steps: Vec<Step>,
}

/// The stream counts tried: coarse to 8, then every count (where `n_max` is decided).
#[must_use]
pub fn admission_steps(max: usize) -> Vec<usize> {
    let mut steps: Vec<usize> = [1, 2, 4, 6].into_iter().filter(|n| *n <= max).collect();
    steps.extend(8..=max);
    if steps.last().is_some_and(|last| *last < max) {
        steps.push(max);
    }
    steps
}

/// The largest n of a run of steps all at or below `p_req` from the start (`None` if the first
/// is above).
#[must_use]
pub fn measured_n_max(steps: &[(usize, f64)], p_req: f64) -> Option<usize> {
    steps
        .iter()
        .take_while(|(_, ratio)| *ratio <= p_req)
        .last()
        .map(|(n, _)| *n)
}

/// One step: predictions and the measurements of its runs.
#[derive(Debug, Serialize)]
pub(crate) struct Step {
    streams: usize,
    predicted_deterministic: f64,
    predicted_statistical: f64,
    predicted_window_overrun: f64,
    /// The model's mean disk time of a 1000 ms window for these streams, ms.
    predicted_work_ms: Option<f64>,
    /// The fraction of reads that missed, over the runs.
    measured_miss_ratio: Spread,
    /// The disk time the streams took per second at their full rate, over the runs, ms.
    measured_work_ms: Option<Spread>,
    runs: Vec<TrialFigures>,
}

/// What abissd predicts for one stream count.
#[derive(Clone, Copy, Debug)]
struct Predicted {
    streams: usize,
    /// 0 while the worst case fits, else 1.
    deterministic: f64,
    /// That the backlog outgrows the buffers' slack.
    statistical: f64,
    /// TRAC's: that a window's work overruns the share.
    window_overrun: f64,
    /// The mean work of a window, ms.
    work_ms: Option<f64>,
}

/// Profiles the lab disk with abissctl and saves the model in `state_dir/models` (where the
/// bench's abissd looks); returns the model.
pub(crate) fn profile(
    bin_dir: &Path,
    device: &Path,
    state_dir: &Path,
) -> anyhow::Result<serde_json::Value> {
    let output = Command::new(bin_dir.join("abissctl"))
        .arg("profile")
        .arg(device)
        .args(["--quick", "--json", "--save", "--model-dir"])
        .arg(state_dir.join("models"))
        .output()
        .context("cannot run abissctl profile")?;
    if !output.status.success() {
        bail!(
            "abissctl profile failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    serde_json::from_slice(&output.stdout).context("abissctl profile printed no model")
}

/// What abissd predicts per n and mode, and `n_max` per mode.
struct Predictions {
    per_n: Vec<Predicted>,
    n_max_deterministic: u32,
    n_max_statistical: u32,
    /// From the per-n table: the last n before the first whose window overrun exceeds `p_req`.
    n_max_window_overrun: Option<usize>,
}

fn predict(
    bin_dir: &Path,
    device: &Path,
    state_dir: &Path,
    args: &AdmissionArgs,
    steps: &[usize],
) -> anyhow::Result<Predictions> {
    let share = args.realtime_share.to_string();
    let p_req = args.p_req.to_string();
    let daemon = Daemon::start(
        bin_dir,
        device,
        &[
            "--admission",
            "off",
            "--realtime-share",
            &share,
            "--p-req",
            &p_req,
        ],
        Some(state_dir),
    )?;
    let mut client = Client::connect(daemon.socket())?;
    let device_name = device.to_string_lossy().into_owned();
    let mut ask = |count: Option<u32>, mode| {
        client.admit(AdmitRequest {
            device: device_name.clone(),
            rate: ByteRate(STREAM.rate_bps),
            rate_stdev: ByteRate(0),
            buffer: ByteSize(STREAM.buffer_bytes),
            batch_pages: None,
            count,
            mode: Some(mode),
            write: false,
        })
    };
    let mut per_n = Vec::new();
    for &n in steps {
        let count = Some(u32::try_from(n)?);
        let det = ask(count, AdmissionMode::Deterministic)?;
        let stat = ask(count, AdmissionMode::Statistical)?;
        per_n.push(Predicted {
            streams: n,
            deterministic: det.miss_probability.unwrap_or(f64::NAN),
            statistical: stat.miss_probability.unwrap_or(f64::NAN),
            window_overrun: stat.window_overrun_probability.unwrap_or(f64::NAN),
            work_ms: stat.mean_work_ms,
        });
    }
    let overruns: Vec<(usize, f64)> = per_n
        .iter()
        .map(|p| (p.streams, p.window_overrun))
        .collect();
    let n_max_window_overrun = measured_n_max(&overruns, args.p_req);
    let det = ask(None, AdmissionMode::Deterministic)?;
    let stat = ask(None, AdmissionMode::Statistical)?;
    anyhow::ensure!(
        stat.current_miss_probability.is_some(),
        "abissd did not take up the model: {}",
        stat.model_source
    );
    Ok(Predictions {
        per_n,
        n_max_deterministic: det.n_max.unwrap_or(0),
        n_max_statistical: stat.n_max.unwrap_or(0),
        n_max_window_overrun,
    })
}

/// Runs the benchmark and writes admission.{json,md,svg}.
pub fn run(args: &AdmissionArgs) -> anyhow::Result<()> {
    let begun = std::time::Instant::now();
    anyhow::ensure!(args.secs >= 1, "--secs must be at least 1");
    anyhow::ensure!(args.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(
        args.p_req > 0.0 && args.p_req < 1.0,
        "--p-req must be between 0 and 1"
    );
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd and abissctl are); run it through `cargo xtask bench admission`")?;
    let mut rows = args
        .rows
        .select(vec![admission_off()], |c| &c.name, row::always)?;
    let configuration = rows.pop().context("no row to run")?;
    let steps = admission_steps(args.max_streams);
    let stream_file_bytes =
        (STREAM.rate_bps * args.secs + STREAM.buffer_bytes).next_multiple_of(1_000_000) + 1_000_000;
    let disk = LabDisk::up("admission", DISK_BYTES, args.read_ahead_kb)?;
    // On tmpfs, as abissd's default /run/abiss is on a systemd machine (see bench::abiss).
    let state_dir = std::path::Path::new("/dev/shm")
        .join(format!("abiss-bench-admission-{}", std::process::id()));
    let result = run_on(
        args,
        &bin_dir,
        &disk,
        &state_dir,
        &configuration,
        stream_file_bytes,
    );
    let _ = std::fs::remove_dir_all(&state_dir);
    let (model, predictions, rows, files) = result?;
    let queue = disk.queue_settings();
    let lab_model = serde_json::to_value(disk.model())?;
    drop(disk);

    let measured: Vec<(usize, f64)> = rows
        .iter()
        .map(|s| (s.streams, s.measured_miss_ratio.mean))
        .collect();
    let n_max_measured = measured_n_max(&measured, args.p_req);
    let parameters = report::step_parameters(
        args.secs,
        args.warmup_secs,
        args.max_streams,
        &steps,
        args.steps_after_miss,
        json!({
            "p_req": args.p_req,
            "realtime_share_percent": args.realtime_share,
            "daemon_admission": "off",
            "file_order": "random: another fixed permutation for each run",
            "repeat": args.repeat,
        }),
    );
    let n_max = json!({
        "deterministic": predictions.n_max_deterministic,
        "statistical": predictions.n_max_statistical,
        "trac_window_overrun": predictions.n_max_window_overrun,
        "measured": n_max_measured,
    });
    let results = Results::new(
        "admission",
        begun,
        workload_parameters(parameters, stream_file_bytes, &lab_model, &queue, &files),
        vec![Row::new(
            &configuration.name,
            configuration.describe(),
            AdmissionFigures { n_max, steps: rows },
        )],
    )
    .with("device_model", model)?;
    let steps = &results.rows[0].figures.steps;
    let markdown = table::markdown(&results, args, &predictions, n_max_measured, &queue);
    results.write(&args.results_dir, "admission", &markdown, |svg| {
        table::draw(svg, args, steps)
    })
}

type Outcome = (serde_json::Value, Predictions, Vec<Step>, BenchFiles);

fn run_on(
    args: &AdmissionArgs,
    bin_dir: &Path,
    disk: &LabDisk,
    state_dir: &Path,
    configuration: &Configuration,
    stream_file_bytes: u64,
) -> anyhow::Result<Outcome> {
    let steps = &admission_steps(args.max_streams);
    eprintln!("profiling {} (quick) …", disk.device().display());
    let model = profile(bin_dir, disk.device(), state_dir)?;
    let predictions = predict(bin_dir, disk.device(), state_dir, args, steps)?;
    eprintln!(
        "predicted n_max at p_req {}: deterministic {}, statistical {}",
        args.p_req, predictions.n_max_deterministic, predictions.n_max_statistical
    );
    let files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        args.max_streams,
        stream_file_bytes,
        COPY_FILE_BYTES,
    )?;
    // Each run its own order of the files: the first n land elsewhere on the disk.
    let orders: Vec<BenchFiles> = (0..args.repeat as u64)
        .map(|run| {
            let mut files = files.clone();
            files.shuffle(layout::SHUFFLE_SEED + run);
            files
        })
        .collect();
    let mut rows = Vec::new();
    let mut after_miss: Option<usize> = None;
    for predicted in &predictions.per_n {
        let streams = predicted.streams;
        let mut runs = Vec::new();
        for (run, files) in orders.iter().enumerate() {
            eprintln!(
                "running {streams} streams (run {} of {}) …",
                run + 1,
                args.repeat
            );
            let trial = run_trial(
                disk,
                &copy_loop_plan(
                    configuration,
                    files,
                    streams,
                    STREAM,
                    (args.warmup_secs, args.secs),
                ),
            )
            .with_context(|| format!("{streams} streams"))?;
            eprintln!(
                "  {} (predicted: deterministic {:.4}, statistical {:.4})",
                trial.progress_line(&configuration.name),
                predicted.deterministic,
                predicted.statistical
            );
            runs.push(trial);
        }
        let measured_miss_ratio =
            Spread::of(runs.iter().map(|r| r.deadlines.miss_fraction).collect()).within(0.0, 1.0);
        let work: Vec<f64> = runs.iter().filter_map(|r| r.streams_work_ms).collect();
        let ratio = measured_miss_ratio.mean;
        rows.push(Step {
            streams,
            predicted_deterministic: predicted.deterministic,
            predicted_statistical: predicted.statistical,
            predicted_window_overrun: predicted.window_overrun,
            predicted_work_ms: predicted.work_ms,
            measured_miss_ratio,
            measured_work_ms: (work.len() == runs.len())
                .then(|| Spread::of(work).within(0.0, f64::INFINITY)),
            runs,
        });
        if ratio > args.p_req && after_miss.is_none() {
            after_miss = Some(0);
        } else if let Some(done) = after_miss.as_mut() {
            *done += 1;
        }
        if after_miss.is_some_and(|done| done >= args.steps_after_miss) {
            break;
        }
    }
    Ok((model, predictions, rows, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_coarse_then_every_count() {
        assert_eq!(admission_steps(3), [1, 2, 3]);
        assert_eq!(admission_steps(10), [1, 2, 4, 6, 8, 9, 10]);
    }

    #[test]
    fn measured_n_max_is_the_last_step_of_the_clean_start() {
        assert_eq!(
            measured_n_max(&[(1, 0.0), (2, 0.005), (4, 0.02), (6, 0.0)], 0.01),
            Some(2)
        );
        assert_eq!(measured_n_max(&[(1, 0.5)], 0.01), None);
    }
}
