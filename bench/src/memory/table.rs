//! What the memory benchmark writes: the summary per row, every step, and the chart of
//! streams against the budget.

use std::fmt::Write as _;
use std::path::Path;

use abiss_proto::ByteSize;
use plotters::prelude::*;

use super::{BudgetRow, BudgetSweep, MemoryArgs, Sizing, FROM_MEMORY_P99_MS};
use crate::abiss::BATCH_PAGES;
use crate::configuration::ConfigurationInfo;
use crate::reference::STREAM;
use crate::report::{self, Results};
use crate::sweep::buffer_range;

pub(super) fn markdown(
    results: &Results<ConfigurationInfo, BudgetSweep>,
    args: &MemoryArgs,
    queue: &crate::lab_disk::QueueSettings,
) -> String {
    let sweeps: Vec<&BudgetSweep> = results.rows.iter().map(|row| &row.figures).collect();
    let mut text = format!(
        "### Streams against memory: 1 MB/s readers against the copy loop, lab hdd\n\n\
         `{command}`: per locked-memory budget, abissd runs with `--locked-memory` set to it. \
         **Equal**: every stream gets an equal share of the budget for {max} streams (the \
         buffer, plus the {batch}-page batch a stream may lock beyond it), and the readers' \
         deadline slack is that buffer's (buffer / rate); admission's n_max is abissd's \
         prediction for that buffer from the disk's model at p_req {p_req} and a 95 % real-time \
         share. **Abissd**: the streams attach with `--buffer auto+{app}` (the application's \
         own part, whose slack the readers' deadlines keep: {slack:.0} ms), abissd has the \
         disk's model and admission on at a real-time share of {share} %, and enlarges the \
         buffers as far as the disk's admission needs, within the budget; a stream it refuses ends the sweep. Readers as in the sweep \
         (1 MB/s in 64 KiB reads, starting once their window is loaded; the {max} files in a fixed \
         random order, so the first n lie at random places over the disk) against the reference \
         copy loop (175 MB in 128 KiB calls); steps of {secs} s after {warmup} s of copy \
         warm-up, from {min} streams, stopping {after} step(s) after the first with misses. The \
         disk's model: `abissctl profile --quick`. {disk_line} {machine_line}\n\n\
         **From memory** counts a step only while its reads' p99 stays under {from_memory} ms as \
         well: a larger buffer is a longer slack, so a read may wait seconds for the disk and \
         still not miss.\n\n\
         | sizing | budget | buffer per stream | admission predicts (statistical / deterministic) | most streams with zero misses | first streams with misses | most streams from memory | abissd refused a stream at | buffers abissd gave at the most streams | BE copy MB/s at the most streams |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        max = args.max_streams,
        share = args.realtime_share,
        batch = BATCH_PAGES,
        app = ByteSize(STREAM.buffer_bytes),
        slack = STREAM.slack().as_secs_f64() * 1000.0,
        secs = args.secs,
        warmup = args.warmup_secs,
        min = args.min_streams,
        after = args.steps_after_miss,
        p_req = args.p_req,
        from_memory = FROM_MEMORY_P99_MS,
        command = results.command,
        disk_line = report::disk_line(queue, "ext4"),
        machine_line = report::machine_line(&results.machine),
    );
    for sweep in &sweeps {
        summary_row(&mut text, sweep, args);
    }
    steps_table(&mut text, &sweeps);
    text.push_str("\nStreams against the budget: memory.svg.\n");
    text
}

/// One budget's line of the summary table.
fn summary_row(text: &mut String, sweep: &BudgetSweep, args: &MemoryArgs) {
    let most = sweep
        .sustained_streams
        .and_then(|n| sweep.steps.iter().find(|r| r.streams == n));
    let clean_copy = most.map_or_else(|| "-".to_owned(), |r| format!("{:.1}", r.be_copy_mb_s));
    let given = buffer_range(
        most.and_then(|r| r.daemon.as_ref())
            .and_then(|d| d.buffer_bytes),
    );
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
fn steps_table(text: &mut String, sweeps: &[&BudgetSweep]) {
    text.push_str(
        "\n**Streams at the disk** is what the disk read of the stream files (within their \
         extents) per second of the step, beside the readers' own rate (1 MB/s each): less means \
         the buffers were draining. **Disk time** is what those requests took, scaled to the \
         readers' full rate (the disk's own price of the streams, ms per second); **admission's \
         price** is the model's mean work per 1000 ms window for the same streams and buffers, \
         and **admission's miss %** its probability that a read waits (with abissd's sizing, \
         both for the streams as abissd sized them when the readers started).\n\n\
         | sizing | budget | streams | reads | misses | p50 ms | p99 ms | max ms | worst overrun ms | buffers abissd gave | BE copy MB/s | disk busy % | streams at the disk MB/s | disk time ms/s | admission's price ms/s | admission's miss % |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for sweep in sweeps {
        for row in &sweep.steps {
            let given = buffer_range(row.daemon.as_ref().and_then(|d| d.buffer_bytes));
            let predicted = sweep
                .predicted_steps
                .iter()
                .find(|(n, _)| *n == row.streams)
                .map(|(_, p)| *p)
                .or_else(|| row.daemon.as_ref().and_then(|d| d.predicted));
            let (miss, price) = predicted.map_or_else(
                || ("-".to_owned(), "-".to_owned()),
                |p| {
                    (
                        report::probability_percent(p.miss_probability),
                        format!("{:.0}", p.work_ms),
                    )
                },
            );
            let _ = writeln!(
                text,
                "| {:?} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.0} | {} | {} | {price} | {miss} |",
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
                row.streams_at_disk
                    .map_or_else(|| "-".to_owned(), |d| format!("{:.1}", d.read_mb_s)),
                row.streams_work_ms
                    .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}")),
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
fn chart_series(sweeps: &[BudgetRow], max_streams: u32) -> [(&'static str, Vec<(f64, f64)>); 4] {
    let measured = |sizing: Sizing, from_memory: bool| -> Vec<(f64, f64)> {
        sweeps
            .iter()
            .map(|row| &row.figures)
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
        .map(|row| &row.figures)
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
pub(super) fn draw(path: &Path, args: &MemoryArgs, sweeps: &[BudgetRow]) -> anyhow::Result<()> {
    let max_mib = sweeps
        .iter()
        .map(|s| mib(s.figures.budget_bytes))
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
