//! What the admission benchmark writes: `n_max` predicted and measured, every step with its
//! runs' spread, and the chart of predicted against measured misses and disk time.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use plotters::coord::types::{RangedCoordf64, RangedCoordusize};
use plotters::prelude::*;

use super::{AdmissionArgs, AdmissionFigures, Predictions, Step};
use crate::chart::{legend, marked_line};
use crate::configuration::ConfigurationInfo;
use crate::reference::STREAM;
use crate::repeats::Spread;
use crate::report::{self, probability_percent as percent, Results};

/// A spread of fractions in percent: the mean, and its interval when the runs differ.
fn percent_spread(spread: &Spread) -> String {
    if spread.high - spread.low <= f64::EPSILON {
        percent(spread.mean)
    } else {
        format!(
            "{} ({} to {})",
            percent(spread.mean),
            percent(spread.low),
            percent(spread.high)
        )
    }
}

/// A spread of milliseconds: the mean and its interval.
fn ms_spread(spread: &Spread) -> String {
    if spread.runs.len() < 2 {
        format!("{:.0}", spread.mean)
    } else {
        format!(
            "{:.0} ({:.0} to {:.0})",
            spread.mean, spread.low, spread.high
        )
    }
}

pub(super) fn markdown(
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
         work overruns that share, the statistical miss probability admission uses (that the \
         real-time backlog outgrows the playout buffers' slack), and the mean disk time the \
         streams take per window (**admission's price**); then n readers at 1 MB/s (64 KiB \
         reads, 564 KiB buffer, deadline slack {slack:.0} ms) run attached to abissd with \
         admission off, for {secs} s after {warmup} s of the reference copy loop, {repeat} \
         run(s) per n, each with the stream files in another random order over the disk. \
         Measured: the fraction of reads that missed their deadline, and the disk time the \
         stream files' requests took, scaled to the readers' full rate (**the disk's price**, ms \
         per second); each as the mean of the runs with its 95 % interval (Student's t). \
         {disk_line} {machine_line}\n\n\
         | n_max at p_req = {p}% | streams |\n| --- | ---: |\n\
         | predicted, deterministic | {det} |\n| predicted, statistical (admission) | {stat} |\n\
         | TRAC per-window overrun, buffers ignored | {trac} |\n\
         | measured (mean miss ratio at or under p_req) | {measured} |\n\n\
         | streams | deterministic bound % | statistical miss % | TRAC window overrun % | measured miss %, mean (95 % interval) | admission's price ms/s | the disk's price ms/s, mean (95 % interval) | reads per run | misses per run | p99 ms, worst run | BE copy MB/s, mean | disk busy %, mean |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        window = 1000,
        share = args.realtime_share,
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        secs = args.secs,
        warmup = args.warmup_secs,
        repeat = args.repeat,
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
        step_row(&mut text, row);
    }
    text.push_str(
        "\nPredicted and measured misses, and the two prices, against streams: admission.svg.\n",
    );
    text
}

/// One step's line.
fn step_row(text: &mut String, row: &Step) {
    #[expect(clippy::cast_precision_loss, reason = "a handful of runs")]
    let mean = |figure: &dyn Fn(&crate::trial::TrialFigures) -> f64| {
        row.runs.iter().map(figure).sum::<f64>() / row.runs.len().max(1) as f64
    };
    let joined = |figure: &dyn Fn(&crate::trial::TrialFigures) -> u64| {
        row.runs
            .iter()
            .map(|r| figure(r).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        text,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
        row.streams,
        percent(row.predicted_deterministic),
        percent(row.predicted_statistical),
        percent(row.predicted_window_overrun),
        percent_spread(&row.measured_miss_ratio),
        row.predicted_work_ms
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}")),
        row.measured_work_ms
            .as_ref()
            .map_or_else(|| "-".to_owned(), ms_spread),
        joined(&|r| r.deadlines.reads),
        joined(&|r| r.deadlines.misses),
        report::ms(
            row.runs
                .iter()
                .map(|r| r.latency.p99_ms)
                .fold(0.0, f64::max)
        ),
        mean(&|r| r.be_copy_mb_s),
        mean(&|r| r.device.busy_fraction * 100.0),
    );
}

/// The chart: misses (left) and disk time per second (right) against streams, predicted as
/// lines, measured as the runs' mean with its 95 % interval.
pub(super) fn draw(svg: &Path, args: &AdmissionArgs, rows: &[Step]) -> anyhow::Result<()> {
    let root = SVGBackend::new(svg, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "Admission on the lab hdd: predicted and measured, 1 MB/s readers (p_req {}%, {} run(s) per n)",
            args.p_req * 100.0,
            args.repeat
        ),
        ("sans-serif", 20),
    )?;
    let (left, right) = root.split_horizontally(700);
    let most = rows.iter().map(|r| r.streams).max().unwrap_or(1) + 1;
    draw_misses(&left, rows, most).context("cannot draw the misses")?;
    draw_prices(&right, rows, most, args.realtime_share).context("cannot draw the prices")?;
    root.present()?;
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A panel with streams across (to `most`) and `y_desc` up (to `top`).
fn axes<'a, 'b>(
    area: &'a Area<'b>,
    most: usize,
    top: f64,
    y_desc: &str,
) -> anyhow::Result<ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordusize, RangedCoordf64>>>
{
    let mut chart = ChartBuilder::on(area)
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0..most, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("real-time streams at 1 MB/s")
        .y_desc(y_desc)
        .draw()?;
    Ok(chart)
}

fn draw_misses(area: &Area<'_>, rows: &[Step], most: usize) -> anyhow::Result<()> {
    let top = rows
        .iter()
        .map(|r| r.measured_miss_ratio.high * 100.0)
        .fold(1.0, f64::max);
    let mut chart = axes(
        area,
        most,
        top * 1.1,
        "reads that missed their deadline (%)",
    )?;
    let series = |figure: fn(&Step) -> f64| -> Vec<(usize, f64)> {
        rows.iter()
            .map(|r| (r.streams, (figure(r) * 100.0).min(top * 1.1)))
            .collect()
    };
    marked_line(
        &mut chart,
        0,
        "measured: reads that missed (mean, 95 % interval)",
        series(|r| r.measured_miss_ratio.mean),
        3,
    )?;
    let color = Palette99::pick(0).to_rgba();
    chart.draw_series(rows.iter().map(|r| {
        ErrorBar::new_vertical(
            r.streams,
            r.measured_miss_ratio.low * 100.0,
            r.measured_miss_ratio.mean * 100.0,
            r.measured_miss_ratio.high * 100.0,
            color.stroke_width(1),
            8,
        )
    }))?;
    marked_line(
        &mut chart,
        1,
        "predicted, statistical: P(backlog > buffer slack)",
        series(|r| r.predicted_statistical),
        3,
    )?;
    marked_line(
        &mut chart,
        2,
        "TRAC per window, buffers ignored: P(window overruns)",
        series(|r| r.predicted_window_overrun),
        3,
    )?;
    marked_line(
        &mut chart,
        3,
        "predicted, deterministic: worst case overruns",
        series(|r| r.predicted_deterministic),
        3,
    )?;
    legend(&mut chart)
}

fn draw_prices(area: &Area<'_>, rows: &[Step], most: usize, share: u32) -> anyhow::Result<()> {
    let top = rows
        .iter()
        .flat_map(|r| {
            [
                r.predicted_work_ms.unwrap_or(0.0),
                r.measured_work_ms.as_ref().map_or(0.0, |s| s.high),
            ]
        })
        .fold(1000.0, f64::max);
    let mut chart = axes(
        area,
        most,
        top * 1.1,
        "disk time per second of the streams (ms)",
    )?;
    let measured: Vec<(usize, f64, &Spread)> = rows
        .iter()
        .filter_map(|r| r.measured_work_ms.as_ref().map(|s| (r.streams, s.mean, s)))
        .collect();
    marked_line(
        &mut chart,
        0,
        "the disk's price: the streams' requests (mean, 95 % interval)",
        measured.iter().map(|(n, mean, _)| (*n, *mean)).collect(),
        3,
    )?;
    let color = Palette99::pick(0).to_rgba();
    chart.draw_series(measured.iter().map(|(n, mean, spread)| {
        ErrorBar::new_vertical(*n, spread.low, *mean, spread.high, color.stroke_width(1), 8)
    }))?;
    marked_line(
        &mut chart,
        1,
        "admission's price: the model's mean work per window",
        rows.iter()
            .filter_map(|r| r.predicted_work_ms.map(|ms| (r.streams, ms)))
            .collect(),
        3,
    )?;
    let budget = f64::from(share.clamp(1, 95)) * 10.0;
    chart
        .draw_series(LineSeries::new(
            [(0, budget), (most, budget)],
            BLACK.stroke_width(1),
        ))?
        .label(format!("the real-time share: {budget:.0} ms"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    legend(&mut chart)
}
