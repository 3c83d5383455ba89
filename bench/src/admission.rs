//! The admission benchmark: how well abissd's admission control predicts deadline misses.
//!
//! On the lab hdd, `abissctl profile --quick --save` measures the device model; abissd then
//! predicts, per number n of 1 MB/s readers (the reference streams: 64 KiB reads, 564 KiB
//! buffer), the miss probability per service window in both modes, and `n_max` at `p_req`. Then
//! the readers run for real, attached to abissd with admission switched off, from 1 past
//! saturation, against the reference copy loop, with the stream files in random order over
//! the disk; the measured deadline-miss ratio is set against the predictions.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use abiss_client::Client;
use abiss_proto::{AdmissionMode, AdmitRequest, ByteRate, ByteSize};
use anyhow::{bail, Context as _};
use serde::Serialize;
use serde_json::json;

use crate::abiss::{AbissHook, Daemon, StreamBuffer};
use crate::chart::{self, MissSeries};
use crate::configuration::{Configuration, ConfigurationInfo};
use crate::lab_disk::LabDisk;
use crate::layout::{self, BenchFiles};
use crate::reference::{
    workload_parameters, COPY_CHUNK_BYTES, COPY_FILE_BYTES, DISK_BYTES, STREAM,
};
use crate::report::{self, Results, Row};
use crate::row::{self, RowsArg};
use crate::trial::{run_trial, TrialFigures, TrialPlan};

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
    /// Steps to run after the first one whose miss ratio exceeds `p_req`.
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

/// One step: predictions and the measurement.
#[derive(Debug, Serialize)]
struct Step {
    streams: usize,
    predicted_deterministic: f64,
    predicted_statistical: f64,
    predicted_window_overrun: f64,
    measured_miss_ratio: f64,
    trial: TrialFigures,
}

/// A fixed permutation (xorshift Fisher–Yates): the first n stream files land at random places
/// over the disk rather than packed at its start.
fn shuffle(files: &mut BenchFiles, seed: u64) {
    let mut state = seed | 1;
    for i in (1..files.streams.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = usize::try_from(state % (i as u64 + 1)).unwrap_or(0);
        files.streams.swap(i, j);
        files.stream_positions.swap(i, j);
    }
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
    /// (n, deterministic bound, statistical miss probability, TRAC window overrun).
    per_n: Vec<(usize, f64, f64, f64)>,
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
        per_n.push((
            n,
            det.miss_probability.unwrap_or(f64::NAN),
            stat.miss_probability.unwrap_or(f64::NAN),
            stat.window_overrun_probability.unwrap_or(f64::NAN),
        ));
    }
    let overruns: Vec<(usize, f64)> = per_n.iter().map(|p| (p.0, p.3)).collect();
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
        .map(|s| (s.streams, s.measured_miss_ratio))
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
            "file_order": "random (fixed permutation)",
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
    let markdown = markdown(&results, args, &predictions, n_max_measured, &queue);
    results.write(&args.results_dir, "admission", &markdown, |svg| {
        draw(svg, args, steps, measured)
    })
}

/// The chart: measured and predicted misses against streams.
fn draw(
    svg: &Path,
    args: &AdmissionArgs,
    rows: &[Step],
    measured: Vec<(usize, f64)>,
) -> anyhow::Result<()> {
    let series = [
        MissSeries {
            name: "measured: reads that missed",
            steps: measured,
        },
        MissSeries {
            name: "predicted, statistical: P(backlog > buffer slack)",
            steps: rows
                .iter()
                .map(|s| (s.streams, s.predicted_statistical))
                .collect(),
        },
        MissSeries {
            name: "TRAC per window, buffers ignored: P(window overruns)",
            steps: rows
                .iter()
                .map(|s| (s.streams, s.predicted_window_overrun))
                .collect(),
        },
        MissSeries {
            name: "predicted, deterministic: worst case overruns",
            steps: rows
                .iter()
                .map(|s| (s.streams, s.predicted_deterministic))
                .collect(),
        },
    ];
    chart::misses_by_streams(
        svg,
        &format!(
            "Admission: predicted and measured misses of 1 MB/s readers, lab hdd (p_req {}%)",
            args.p_req * 100.0
        ),
        &series,
    )
    .context("cannot draw admission.svg")?;
    Ok(())
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
    let mut files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        args.max_streams,
        stream_file_bytes,
        COPY_FILE_BYTES,
    )?;
    shuffle(&mut files, 0x5eed_ab15);
    let mut rows = Vec::new();
    let mut after_miss: Option<usize> = None;
    for &(streams, det, stat, overrun) in &predictions.per_n {
        eprintln!("running {streams} streams …");
        let trial = run_trial(
            disk,
            &TrialPlan {
                configuration,
                files: &files,
                streams,
                stream: STREAM,
                copy_chunk_bytes: COPY_CHUNK_BYTES,
                warmup: Duration::from_secs(args.warmup_secs),
                measure: Duration::from_secs(args.secs),
                seek_every: None,
            },
        )
        .with_context(|| format!("{streams} streams"))?;
        eprintln!(
            "  {} (predicted: deterministic {:.4}, statistical {:.4})",
            trial.progress_line(&configuration.name),
            det,
            stat
        );
        let ratio = trial.deadlines.miss_fraction;
        rows.push(Step {
            streams,
            predicted_deterministic: det,
            predicted_statistical: stat,
            predicted_window_overrun: overrun,
            measured_miss_ratio: ratio,
            trial,
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

fn percent(p: f64) -> String {
    if p == 0.0 {
        "0".to_owned()
    } else if p < 1e-4 {
        format!("{:.1e}", p * 100.0)
    } else {
        format!("{:.2}", p * 100.0)
    }
}

fn markdown(
    results: &Results<ConfigurationInfo, AdmissionFigures>,
    args: &AdmissionArgs,
    predictions: &Predictions,
    n_max_measured: Option<usize>,
    queue: &crate::lab_disk::QueueSettings,
) -> String {
    let rows = &results.rows[0].figures.steps;
    let mut text = format!(
        "### Admission control: predicted against measured misses, lab hdd\n\n\
         `{command}`: the lab hdd profiled with `abissctl profile --quick`; abissd predicts per \
         n, from the model: the deterministic bound (0 while the worst case of a {window} ms \
         window fits the real-time share of {share}%, else 1), TRAC's probability that a window's \
         work overruns that share, and the statistical miss probability admission uses (that the \
         real-time backlog outgrows the playout buffers' slack); then n readers at 1 MB/s (64 KiB reads, 564 KiB buffer, \
         deadline slack {slack:.0} ms) run attached to abissd with admission off, for {secs} s \
         after {warmup} s of the reference copy loop, with the stream files in random order over \
         the disk. The measured figure is the fraction of reads that missed their deadline. \
         {disk_line} {machine_line}\n\n\
         | n_max at p_req = {p}% | streams |\n| --- | ---: |\n\
         | predicted, deterministic | {det} |\n| predicted, statistical (admission) | {stat} |\n\
         | TRAC per-window overrun, buffers ignored | {trac} |\n| measured | {measured} |\n\n\
         | streams | deterministic bound % | statistical miss % | TRAC window overrun % | measured miss % | reads | misses | p99 ms | max ms | BE copy MB/s | disk busy % |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        window = 1000,
        share = args.realtime_share,
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        secs = args.secs,
        warmup = args.warmup_secs,
        command = results.command,
        disk_line = report::disk_line(queue, "ext4"),
        machine_line = report::machine_line(&results.machine),
        p = args.p_req * 100.0,
        det = predictions.n_max_deterministic,
        stat = predictions.n_max_statistical,
        trac = predictions
            .n_max_window_overrun
            .map_or_else(|| "0".to_owned(), |n| n.to_string()),
        measured = n_max_measured.map_or_else(|| "0".to_owned(), |n| n.to_string()),
    );
    for row in rows {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
            row.streams,
            percent(row.predicted_deterministic),
            percent(row.predicted_statistical),
            percent(row.predicted_window_overrun),
            percent(row.measured_miss_ratio),
            row.trial.deadlines.reads,
            row.trial.deadlines.misses,
            report::ms(row.trial.latency.p99_ms),
            report::ms(row.trial.latency.max_ms),
            row.trial.be_copy_mb_s,
            row.trial.device.busy_fraction * 100.0,
        );
    }
    text.push_str("\nPredicted and measured misses against streams: admission.svg.\n");
    text
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
