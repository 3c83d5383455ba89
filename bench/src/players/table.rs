//! The players benchmark's Markdown and its chart (total stall per row).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use super::baseline::Baseline;
use super::session::{PlayerResult, RowResult};
use super::watch::{self, StreamFigures};
use super::{Class, PlayersArgs};
use crate::lab_disk::QueueSettings;
use crate::report;

/// The goal of issue 12: total stall of the four players.
const GOAL_S: f64 = 0.1;

fn seconds(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

/// Per player, in order, `what` of it (or why it did not play).
fn per_player(result: &RowResult, what: impl Fn(&PlayerResult) -> Option<f64>) -> String {
    result
        .players
        .iter()
        .map(|p| {
            if p.error.is_some() {
                "failed".to_owned()
            } else {
                seconds(what(p))
            }
        })
        .collect::<Vec<_>>()
        .join(" / ")
}

/// The most a row's streams waited, from abissd: (misses, service p99 ms, queue p99 ms).
fn daemon_figures(result: &RowResult) -> (String, String, String) {
    let Some(streams) = &result.streams else {
        return ("-".into(), "-".into(), "-".into());
    };
    let misses: u64 = streams.iter().map(|s| s.misses).sum();
    let worst = |f: &dyn Fn(&StreamFigures) -> Option<f64>| {
        streams
            .iter()
            .filter_map(f)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
            .map_or_else(|| "-".to_owned(), report::ms)
    };
    (
        misses.to_string(),
        worst(&|s| s.service_p99_ms),
        worst(&|s| s.queue_p99_ms),
    )
}

/// One line per row while the benchmark runs.
#[must_use]
pub fn progress_line(result: &RowResult) -> String {
    let (misses, service, _) = daemon_figures(result);
    format!(
        "stall {} s (per player {}), failed {}, BE {:.2} MB/s, CPU {:.0} %, steal {} ms, disk late p99.9 {} ms, abiss misses {misses}, RT service p99 {service} ms",
        seconds(Some(result.total_stall_s)),
        per_player(result, |p| p.stall_s),
        result.failed_players,
        result.load.total_mb_s,
        result.cpu_busy_pct,
        result.stolen_ms.unwrap_or(0),
        result
            .medium_late_p999_ms
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}")),
    )
}

/// The report.
#[must_use]
pub fn markdown(
    command: &str,
    machine: &serde_json::Value,
    args: &PlayersArgs,
    queue: &QueueSettings,
    baselines: &BTreeMap<String, Baseline>,
    results: &[RowResult],
) -> String {
    let mut text = format!(
        "### Real players under a seeky best-effort load, lab hdd (issue 12)\n\n\
         `{command}`: {secs} s per row, players launched together after {warmup} s of load (the arriving rows: \
         one every {spacing} s, each stopped when the row's time from the first launch is up), \
         from a cold page cache (the no-load rows: no load, the floor a cold start costs the disk; the warm no-load row: \
         no load and the files in memory, the floor starting the players at once costs the two CPUs); before each launch, \
         in the baselines too, the player's own program files (those it mapped in its baseline) are read into memory, \
         since the machine may have reclaimed them since its last launch and reading them from the root disk is not the load's doing. Media: 8 Mbit/s MPEG-TS (MPEG-2 640×360 25 fps, MP2), one file per \
         player. Players, unmodified: GStreamer `playbin` with `fakesink sync=true` sinks \
         (bench/players/gst_player.py), `ffmpeg -re … -f null -`, `mpv --vo=null --ao=null \
         --cache=no`; order gst / ffmpeg / mpv / ffmpeg (8-player rows: the same twice, 8 files; \
         8-viewer rows: gst, ffmpeg, mpv, … of one file from 0, 10, … 70 s). Load (fio): random 16 KiB `O_DIRECT` reads at iodepth 16, \
         4 buffered random 16 KiB readers (one 1 GiB file), one random 64 KiB `O_DIRECT` writer. \
         abiss rows: abissd with its defaults, each player under `abissctl run --rate {rate}` \
         (default buffer; the rows' own options are in their players column). {disk_line} {machine_line}\n\n\
         **Stall** (per player) = start-up beyond the player's no-load *cold* start-up + freezes + \
         seek stalls: what the load made the viewer wait. A cold start reads the player's probe \
         (ffmpeg's 5 MB) from the disk, which takes the disk time with nothing else on it; the \
         cold baseline measures that floor for one player alone (file dropped from the page \
         cache, no load, stock mq-deadline). Players launched together in a row also share the \
         disk and the two CPUs among themselves, which no baseline takes out. *Beyond warm* is \
         the same sum with the start-up counted beyond the warm start-up (file in memory): \
         what the viewer waited beyond a player with nothing to read. Start-up: launch of the command (`abissctl run` included) to the first \
         media time the player reports (for abiss: `abissctl run` attaches, waits for the window \
         to be loaded, then starts the player; the column after it shows that part). Freeze: an interval between two reports in which wall \
         time exceeded the media time advanced by more than {tol:.0} ms (one frame); its whole \
         excess counts, catching up counts nothing. Seek stall: seek to the first report after \
         it, less a frame, beyond the no-load mean per seek (gst-seeking baseline). Media time: gst the video sink's frame PTS at render, ffmpeg \
         `out_time_us` of `-progress` (every 20 ms), mpv `time-pos` events over JSON IPC. \
         Steal: CPU time the hypervisor took from this machine while the players played; disk late: \
         the p99.9 of how late the lab's emulator (a user-space process) replied against its model \
         meanwhile, so a row with a large figure there was not played on the modelled disk.\n\n",
        secs = args.secs,
        warmup = args.warmup_secs,
        spacing = super::ARRIVAL_SPACING_S,
        rate = args.rate,
        tol = super::stall::FREEZE_TOLERANCE * 1000.0,
        disk_line = report::disk_line(queue, "ext4"),
        machine_line = report::machine_line(machine),
    );
    baselines_table(&mut text, baselines);
    rows_table(&mut text, results);
    repeats_table(&mut text, results);
    streams_section(&mut text, results);
    errors(&mut text, results);
    text
}

/// The no-load baselines.
fn baselines_table(text: &mut String, baselines: &BTreeMap<String, Baseline>) {
    text.push_str(
        "No-load baselines (mq-deadline, one player alone; warm: file in the page cache; cold: \
         file dropped from it before each run):\n\n\
         | player | warm start-ups s | median warm s | cold start-ups s | median cold s | stall after start-up s | per seek s |\n\
         | --- | --- | ---: | --- | ---: | ---: | ---: |\n",
    );
    for baseline in baselines.values() {
        let startups: Vec<String> = baseline
            .startups_s
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect();
        let cold: Vec<String> = baseline
            .cold_startups_s
            .iter()
            .map(|s| format!("{s:.3}"))
            .collect();
        let _ = writeln!(
            text,
            "| {} | {} | {:.3} | {} | {} | {:.3} | {} |",
            baseline.player,
            startups.join(", "),
            baseline.startup_s,
            if cold.is_empty() {
                "-".to_owned()
            } else {
                cold.join(", ")
            },
            baseline
                .cold_startup_s
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
            baseline.stall_after_startup_s,
            baseline
                .per_seek_s
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.3}")),
        );
    }
}

fn rows_table(text: &mut String, results: &[RowResult]) {
    text.push_str(
        "\n| row | elevator | players | stall per player s | total stall s | beyond warm s | start-up per player s | of which abissctl run s | freezes | abiss misses | stream service p99 ms | stream queue p99 ms | BE MB/s (direct / buffered / write) | BE vs mq-deadline | CPU busy % | steal ms | disk late p99.9 ms | players' CPU % | load 1 min |\n\
         | --- | --- | --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let attach = |result: &RowResult| {
        if result.row.class == Class::Abiss {
            per_player(result, |p| p.attach_s)
        } else {
            "-".to_owned()
        }
    };
    let reference = results
        .iter()
        .find(|r| r.row.name == "mq-deadline")
        .map(|r| r.load.total_mb_s);
    for result in results {
        let (misses, service, queue) = daemon_figures(result);
        let class = result.row.class.label();
        let class = if result.row.run_options.is_empty() {
            class.to_owned()
        } else {
            format!("{class} {}", result.row.run_options.join(" "))
        };
        let relative = reference
            .filter(|r| *r > 0.0 && !result.row.no_load)
            .map_or_else(
                || "-".to_owned(),
                |r| format!("{:+.0} %", (result.load.total_mb_s / r - 1.0) * 100.0),
            );
        let _ = writeln!(
            text,
            "| {} | {} | {class} | {} | **{:.2}**{} | {:.2} | {} | {} | {} | {misses} | {service} | {queue} | {:.2} ({:.2} / {:.2} / {:.2}) | {relative} | {:.0} | {} | {} | {:.1} | {:.2} |",
            result.label(),
            result.row.elevator,
            per_player(result, |p| p.stall_s),
            result.total_stall_s,
            if result.failed_players > 0 {
                format!(" ({} failed)", result.failed_players)
            } else {
                String::new()
            },
            result.total_stall_beyond_warm_s,
            per_player(result, |p| p.figures.startup_s),
            attach(result),
            result.players.iter().map(|p| p.figures.freezes).sum::<u64>(),
            result.load.total_mb_s,
            result.load.direct_read_mb_s,
            result.load.buffered_read_mb_s,
            result.load.write_mb_s,
            result.cpu_busy_pct,
            result
                .stolen_ms
                .map_or_else(|| "-".to_owned(), |ms| ms.to_string()),
            result
                .medium_late_p999_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1}")),
            result.players_cpu_pct,
            result.load_average_1m,
        );
    }
}

/// The head of the per-stream table, what abissd counted ([`watch::streams_table`]).
const STREAMS_INTRO: &str = "\nWhat abissd counted per stream (before the players were stopped): misses = reads that \
     waited for the disk for data the window should have held; seek waits = reads that waited \
     for the window a seek (a player's jump) asked for, while it loaded; service = dispatch to completion and queue = insert to dispatch of \
     the stream's block requests (log2 bucket bounds):\n\n\
     | row | stream | file | misses | seek waits | raises | requests | inversions | service p99 ms | queue p99 ms | queue max ms | suggestion |\n\
     | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";

/// What abissd counted per stream, per row (and run).
fn streams_section(text: &mut String, results: &[RowResult]) {
    let labels: Vec<String> = results.iter().map(RowResult::label).collect();
    let streams: Vec<(&str, Option<&[StreamFigures]>)> = results
        .iter()
        .zip(&labels)
        .map(|(r, label)| (label.as_str(), r.streams.as_deref()))
        .collect();
    watch::streams_table(text, STREAMS_INTRO, &streams);
}

/// With `--repeat`: each row's total stall over its runs, its median and worst, and how
/// many runs met the goal.
fn repeats_table(text: &mut String, results: &[RowResult]) {
    if results.iter().all(|r| r.run.1 <= 1) {
        return;
    }
    let _ = write!(
        text,
        "\nRuns of each row (`--repeat`): total stall per run in order, median, worst, and the runs at or under the goal of {GOAL_S} s:\n\n\
         | row | runs | total stall per run s | median s | worst s | runs ≤ {GOAL_S} s |\n\
         | --- | ---: | --- | ---: | ---: | ---: |\n"
    );
    let mut names: Vec<&str> = results.iter().map(|r| r.row.name).collect();
    names.dedup();
    for name in names {
        let totals: Vec<f64> = results
            .iter()
            .filter(|r| r.row.name == name)
            .map(|r| r.total_stall_s)
            .collect();
        let mut sorted = totals.clone();
        sorted.sort_by(f64::total_cmp);
        let median = abiss_lab::stats::quantile(&sorted, 0.5).unwrap_or(0.0);
        let per_run: Vec<String> = totals.iter().map(|t| format!("{t:.2}")).collect();
        let _ = writeln!(
            text,
            "| {name} | {} | {} | {median:.2} | {:.2} | {} |",
            totals.len(),
            per_run.join(" / "),
            sorted.last().copied().unwrap_or(0.0),
            totals.iter().filter(|t| **t <= GOAL_S).count(),
        );
    }
}

fn errors(text: &mut String, results: &[RowResult]) {
    let failed: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.players.iter().enumerate().filter_map(move |(i, p)| {
                p.error.as_ref().map(|e| {
                    format!(
                        "- {} player {i} ({}, from {} s): {}",
                        r.label(),
                        p.spec.kind.name(),
                        p.spec.start_s,
                        e.replace('\n', " ")
                    )
                })
            })
        })
        .collect();
    if !failed.is_empty() {
        text.push_str("\nPlayers that never played:\n\n");
        for line in failed {
            text.push_str(&line);
            text.push('\n');
        }
    }
}

/// Total stall per row as bars on a log scale, with the goal.
pub fn chart(path: &Path, secs: u64, results: &[RowResult]) -> anyhow::Result<()> {
    const FLOOR: f64 = 0.01;
    let top = results.iter().map(|r| r.total_stall_s).fold(1.0, f64::max) * 2.0;
    #[expect(clippy::cast_precision_loss, reason = "a handful of rows")]
    let width = results.len() as f64;
    let labels: Vec<String> = results.iter().map(RowResult::label).collect();
    let names: Vec<&str> = labels.iter().map(String::as_str).collect();
    crate::chart::row_bars(
        path,
        format!("Total stall of real players under a seeky best-effort load, lab hdd ({secs} s)"),
        20,
        &names,
        (FLOOR, top),
        "total stall of the players (s, log scale)",
        |chart| {
            let color = Palette99::pick(0).to_rgba();
            chart
                .draw_series(results.iter().enumerate().map(|(i, r)| {
                    #[expect(clippy::cast_precision_loss, reason = "a bar index")]
                    let x = i as f64;
                    Rectangle::new(
                        [(x + 0.15, FLOOR), (x + 0.85, r.total_stall_s.max(FLOOR))],
                        color.filled(),
                    )
                }))?
                .label("total stall (start-up beyond a cold start + freezes + seek stalls)")
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                });
            crate::chart::reference_line(chart, width, GOAL_S, format!("goal: {GOAL_S} s"))
        },
    )
}
