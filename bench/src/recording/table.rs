//! The recording benchmark's Markdown and its chart (recorder write p99.9 and max per row).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use super::recorder::{RecorderKind, RecorderResult};
use super::session::RowResult;
use super::tracer_cost::MethodCost;
use super::{RecordingArgs, DIRTY_BACKGROUND_BYTES, DIRTY_BYTES, GOAL_P999_MS, RECORDERS};
use crate::lab_disk::QueueSettings;
use crate::players::baseline::Baseline;
use crate::players::watch::{self, StreamFigures};
use crate::players::Class;
use crate::report;

/// What the report is made of.
pub struct Context<'a> {
    /// The command that ran.
    pub command: &'a str,
    /// The machine.
    pub machine: &'a serde_json::Value,
    /// The arguments.
    pub args: &'a RecordingArgs,
    /// The lab disk's queue.
    pub queue: &'a QueueSettings,
    /// What timing write(2) costs.
    pub tracer_cost: &'a [MethodCost],
    /// The player's no-load start-up.
    pub baselines: &'a BTreeMap<String, Baseline>,
    /// The rows.
    pub results: &'a [RowResult],
}

fn of_kind(result: &RowResult, kind: RecorderKind) -> impl Iterator<Item = &RecorderResult> {
    result.recorders.iter().filter(move |r| r.kind == kind)
}

/// Overflows per recorder kind, `ffmpeg / gst / test` (a recorder that recorded nothing:
/// `failed`).
fn overflows(result: &RowResult) -> String {
    [
        RecorderKind::Ffmpeg,
        RecorderKind::Gstreamer,
        RecorderKind::Test,
    ]
    .iter()
    .map(|kind| {
        if of_kind(result, *kind).any(|r| r.error.is_some()) {
            "failed".to_owned()
        } else {
            of_kind(result, *kind)
                .map(|r| r.figures.overflows)
                .sum::<usize>()
                .to_string()
        }
    })
    .collect::<Vec<_>>()
    .join(" / ")
}

fn total_overflows(result: &RowResult) -> usize {
    result.recorders.iter().map(|r| r.figures.overflows).sum()
}

/// The abissd read misses of the players' streams (abiss rows).
fn player_misses(result: &RowResult) -> Option<u64> {
    result.streams.as_ref().map(|streams| {
        streams
            .iter()
            .filter(|s| !s.path.contains("recording-"))
            .map(|s| s.misses)
            .sum()
    })
}

/// Whether a row meets issue 10's goal: no overflow, recorder write p99.9 under 5 ms, no
/// player freeze, every recorder and player ran.
fn goal_met(result: &RowResult) -> bool {
    total_overflows(result) == 0
        && result.recorders.iter().all(|r| r.error.is_none())
        && result.recorder_writes.p999_ms < GOAL_P999_MS
        && result.player_freezes == 0
        && result.failed_players == 0
}

/// One line per row while the benchmark runs.
#[must_use]
pub fn progress_line(result: &RowResult) -> String {
    format!(
        "overflows {} (ffmpeg / gst / test), recorder write p99 {} p99.9 {} max {} ms, player freezes {}, stall {:.2} s, BE write {:.1} MB/s read {:.2} MB/s, CPU {:.0} %",
        overflows(result),
        report::ms(result.recorder_writes.p99_ms),
        report::ms(result.recorder_writes.p999_ms),
        report::ms(result.recorder_writes.max_ms),
        result.player_freezes,
        result.total_stall_s,
        result.load.write_mb_s,
        result.load.read_mb_s,
        result.cpu_busy_pct,
    )
}

/// The player's cold and warm no-load start-ups, as the method text gives them.
fn baseline_startups(ffmpeg: Option<&Baseline>) -> String {
    ffmpeg.map_or_else(
        || "-".to_owned(),
        |b| {
            format!(
                "{:.3} s; warm {:.3} s",
                b.cold_startup_s.unwrap_or(b.startup_s),
                b.startup_s
            )
        },
    )
}

/// What the direct rows run (issue 36).
fn direct_rows(args: &RecordingArgs) -> String {
    let (rate, ring) = (&args.recorder_rate, &args.record_buffer);
    format!(
        "**Direct rows** (issue 36): ffmpeg and gst write into a FIFO that `abissctl record FILE \
         --rate {rate} --buffer {ring}` reads and writes past the page cache; the test recorder \
         records through the library (`abiss-test-recorder … library={rate}:{ring}`: the Rust \
         `DirectRecording` that the C library's `abiss_fwrite` calls under `ABISS_DIRECT`), each \
         write a copy into the ring, which it times itself (no system call for perf to see)."
    )
}

/// The report.
#[must_use]
pub fn markdown(context: &Context<'_>) -> String {
    let args = context.args;
    let ffmpeg = context.baselines.get("ffmpeg");
    let mut text = format!(
        "### Real recorders next to real players under a best-effort load, lab hdd (issues 10 and 36)\n\n\
         `{command}`: {secs} s per row, recorders and players launched together after {warmup} s \
         of load, from a cold page cache, on a fresh file system per file-system group. \
         **Recorders** ({recorders}), unmodified, each writing an 8 Mbit/s MPEG-TS at its \
         source's rate into a new file: `ffmpeg -re -f lavfi -i testsrc2 … -c:v mpeg2video -b:v 7M \
         … -f mpegts -muxrate 8M FILE` (256 KiB write(2) calls, 4 a second); `gst-launch-1.0 -e \
         videotestsrc is-live=true pattern=snow ! … avenc_mpeg4 bitrate=7000000 ! mpegtsmux ! \
         filesink`, video only (writev(2) calls of about 77 KB, 12 a second; see recorder.rs for \
         why MPEG-4 and no sound); `abiss-test-recorder FILE 1000000 65536 1000 {secs}` (64 KiB every 65.5 ms). \
         **Players**: {players} × `ffmpeg -re -i FILE -f null -`, each on its own 8 Mbit/s file \
         (the players benchmark's media and player). **Best-effort load** {load}. **Dirty limits** of a small machine while the rows run: \
         `vm.dirty_bytes` = {dirty} MiB, `vm.dirty_background_bytes` = {background} MiB (the \
         previous values are put back at the end, also after an error or Ctrl-C). **abiss rows**: \
         abissd with its defaults; each recorder under `abissctl run --write --rate {rrate} \
         --buffer {rbuffer} FILE -- …`, each player under `abissctl run {pargs} FILE -- …`. \
         {direct} bfq-rt: recorders and players under `ionice -c1 -n4`. {disk_line} {machine_line}\n\n",
        command = context.command,
        secs = args.secs,
        warmup = args.warmup_secs,
        recorders = RECORDERS.map(RecorderKind::name).join(", "),
        players = super::PLAYERS,
        dirty = DIRTY_BYTES >> 20,
        background = DIRTY_BACKGROUND_BYTES >> 20,
        rrate = args.recorder_rate,
        rbuffer = args.recorder_buffer,
        direct = direct_rows(args),
        pargs = super::session::player_args(&args.player_rate, &args.player_preroll).join(" "),
        load = args.load.describe(),
        disk_line = report::disk_line(context.queue, "the file system per row"),
        machine_line = report::machine_line(context.machine),
    );
    let _ = write!(
        text,
        "**Goal** (issue 10), for abiss: 0 overflows with a {capture} ms capture buffer, recorder \
         write p99.9 < {GOAL_P999_MS} ms, 0 player freezes; best-effort throughput reported. \
         The last column says whether a row meets it.\n\n\
         **Method.** *Write time*: every write(2)/writev(2) of each recorder, entry to return, \
         timed in the kernel by `perf trace -a --sort-events -G CGROUP -e \
         write,writev,pwrite64,pwritev,writeback:balance_dirty_pages` (the last: the kernel's \
         dirty-page throttle, in the per-recorder table): each recorder runs in a cgroup of its own, so perf \
         follows all its threads whatever their parent (syscall tracepoints, counted for that \
         cgroup's tasks only; tracefs is mounted for perf in a private mount namespace, \
         `unshare -m`, so nothing stays mounted; a marker written from the cgroup ties perf's \
         clock to the row's, and a call still blocked at the stop counts until the stop); the \
         recording's calls are those on \
         the descriptor that got the most bytes. *Overflow*: a capture device hands the recorder \
         its data at a constant rate and holds what is not yet written for {capture} ms; a \
         write's *lag* is how long the data it completes waited (return time less the time the \
         bytes written so far were complete, at the recorder's long-run rate, from the recorder \
         at its most ahead), and an overflow is a write whose lag exceeds the buffer. Slow writes \
         in a row add up in the lag although none alone took the buffer (`slow writes` counts \
         writes that alone took longer). The test recorder also counts its own overflows against \
         its schedule (`own` columns): they agree with the traced ones if the method does. \
         *Players*: the players benchmark's stall measure (ffmpeg's `-progress` media time \
         against wall time); a freeze is an interval whose wall time exceeded the media time by \
         more than 40 ms (a frame); stall = start-up beyond the no-load start-up from a cold \
         page cache (ffmpeg {startup}) + freezes. *BE MB/s*: what fio's writer wrote (into the page cache; over a row what the \
         dirty limit let through, ± 64 MB) and its readers read.\n\n",
        capture = args.capture_ms,
        startup = baseline_startups(ffmpeg),
    );
    tracer_cost_table(&mut text, context.tracer_cost);
    rows_table(&mut text, context.results);
    goal_summary(&mut text, context.results);
    deadline_table(&mut text, context.results);
    recorders_table(&mut text, context.results);
    let streams: Vec<(&str, Option<&[StreamFigures]>)> = context
        .results
        .iter()
        .map(|r| (r.row.name, r.streams.as_deref()))
        .collect();
    watch::streams_table(&mut text, STREAMS_INTRO, &streams);
    errors(&mut text, context.results);
    text
}

fn tracer_cost_table(text: &mut String, costs: &[MethodCost]) {
    text.push_str(
        "What timing costs, measured on this machine (`dd bs=64k` to /dev/null, 20 000 writes, \
         fastest of 3; the plain loop is a read and a write). `perf trace` takes its timestamps \
         in the kernel at the syscall's entry and exit and stops nothing; what it adds runs \
         inside the traced call, so its times include it (the last column against the plain \
         loop). `strace -T` stops the thread at each entry and exit and times the call from \
         strace's side, so on a busy 2-CPU machine its times also carry strace's own scheduling; \
         and it follows threads as children, as `perf trace -- CMD` does, which missed \
         `gst-launch-1.0`'s writing thread (recorder.rs). The third line: a task outside the \
         traced cgroup while perf runs. A recorder here makes 4 to 16 write calls a second: \
         either method costs it well under 0.1 % of a CPU, and tens of µs per call against a \
         5 ms goal.\n\n\
         | method | µs per loop (read + write) | added µs per write | median write as timed, µs |\n\
         | --- | ---: | ---: | ---: |\n",
    );
    for cost in costs {
        let _ = writeln!(
            text,
            "| {} | {:.1} | {:+.1} | {} |",
            cost.method,
            cost.loop_us_per_write,
            cost.added_us_per_write,
            cost.timed_write_p50_us
                .map_or_else(|| "-".to_owned(), |t| format!("{t:.1}")),
        );
    }
}

fn rows_table(text: &mut String, results: &[RowResult]) {
    text.push_str(
        "\n| row | file system | elevator | recorders, players | overflows ffmpeg / gst / test | recorder write p99 ms | p99.9 ms | max ms | worst lag ms | player freezes | player stall s | abiss player misses | BE write MB/s | BE read MB/s | CPU busy % | goal met |\n\
         | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for result in results {
        let class = if result.row.direct {
            "abissctl record, abissctl run"
        } else {
            result.row.class.label()
        };
        let worst_lag = result
            .recorders
            .iter()
            .map(|r| r.figures.worst_lag_ms)
            .fold(0.0, f64::max);
        let _ = writeln!(
            text,
            "| {} | {} | {} | {class} | **{}** | {} | **{}** | {} | {} | {} | {:.2}{} | {} | {:.1} | {:.2} | {:.0} | {} |",
            result.row.name,
            result.row.file_system.name(),
            result.row.elevator,
            overflows(result),
            report::ms(result.recorder_writes.p99_ms),
            report::ms(result.recorder_writes.p999_ms),
            report::ms(result.recorder_writes.max_ms),
            report::ms(worst_lag),
            result.player_freezes,
            result.total_stall_s,
            if result.failed_players > 0 {
                format!(" ({} failed)", result.failed_players)
            } else {
                String::new()
            },
            player_misses(result).map_or_else(|| "-".to_owned(), |m| m.to_string()),
            result.load.write_mb_s,
            result.load.read_mb_s,
            result.cpu_busy_pct,
            if goal_met(result) { "yes" } else { "no" },
        );
    }
}

/// The abiss rows' real-time write requests against ABISS's bound, from abissd's tracer.
fn deadline_table(text: &mut String, results: &[RowResult]) {
    let _ = write!(
        text,
        "\nReal-time write requests on the lab disk, insert to completion, against ABISS's bound of \
         {} ms (abissd's tracer through `abissctl trace --events --json`; abiss rows):\n\n\
         | row | real-time writes | over the bound | p50 ms | queued p50 ms | p99 ms | slowest ms | its queue ms |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        crate::request_trace::ABISS_BOUND_NS / 1_000_000
    );
    for result in results {
        if let Some(w) = &result.real_time_writes {
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                result.row.name,
                w.requests,
                w.over_bound,
                report::ms(w.p50_ms),
                report::ms(w.queue_p50_ms),
                report::ms(w.p99_ms),
                report::ms(w.slowest_ms),
                report::ms(w.slowest_queue_ms)
            );
        }
    }
}

#[expect(clippy::cast_precision_loss, reason = "bytes of a recording")]
fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Which rows meet the goal, and what the abiss rows miss it by.
fn goal_summary(text: &mut String, results: &[RowResult]) {
    let met: Vec<&str> = results
        .iter()
        .filter(|r| goal_met(r))
        .map(|r| r.row.name)
        .collect();
    let _ = writeln!(
        text,
        "\nRows that meet the goal: {}.",
        if met.is_empty() {
            "none".to_owned()
        } else {
            met.join(", ")
        }
    );
    for result in results.iter().filter(|r| r.row.class == Class::Abiss) {
        if goal_met(result) {
            continue;
        }
        let mut misses = Vec::new();
        let overflows = total_overflows(result);
        if overflows > 0 {
            misses.push(format!("{overflows} overflows"));
        }
        if result.recorder_writes.p999_ms >= GOAL_P999_MS {
            let slow: usize = result
                .recorders
                .iter()
                .map(|r| r.throttle.slow_writes)
                .sum();
            let throttled: usize = result
                .recorders
                .iter()
                .map(|r| r.throttle.slow_writes_throttled)
                .sum();
            misses.push(format!(
                "write p99.9 {} ms ({throttled} of the {slow} writes over {GOAL_P999_MS} ms \
                 slept in the kernel's dirty-page throttle)",
                report::ms(result.recorder_writes.p999_ms)
            ));
        }
        if result.player_freezes > 0 {
            misses.push(format!("{} player freezes", result.player_freezes));
        }
        if result.failed_players > 0 || result.recorders.iter().any(|r| r.error.is_some()) {
            misses.push("a recorder or player that did not run".to_owned());
        }
        let _ = writeln!(
            text,
            "- {} ({}): {}.",
            result.row.name,
            result.row.file_system.name(),
            misses.join(", ")
        );
    }
}

fn recorders_table(text: &mut String, results: &[RowResult]) {
    let _ = write!(
        text,
        "\nPer recorder (write times from `perf trace`; `untimed`: calls whose return perf's \
         report did not show, counted with their bytes but not timed; `blocked at stop`: calls \
         that had not returned when the recorder was told to stop, timed until then; `own`: the \
         test recorder's own count and times, taken around its write(2) calls (in a direct row, \
         its library writes, which are also the row's write times), with the part of its \
         slowest write it spent waiting for a CPU (the kernel's run-queue delay); `throttle \
         sleeps`: sleeps of its threads in the kernel's dirty-page throttle, `balance_dirty_pages` \
         (how many, at the hard limit, ms in all), and how many of its writes over the \
         {GOAL_P999_MS} ms goal held such a sleep):\n\n\
         | row | recorder | writes | untimed | blocked at stop | rate MB/s | traced / file MB | write p50 ms | p99 ms | p99.9 ms | max ms | slow writes | overflows | worst lag ms | throttle sleeps (at limit) | slept ms | writes over goal, throttled | own overflows | own p99.9 ms | own max ms (CPU wait) | lost events | CPU s | ended |\n\
         | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for result in results {
        for recorder in &result.recorders {
            let f = &recorder.figures;
            let own = |key: &str| {
                recorder
                    .own_report
                    .as_ref()
                    .and_then(|r| r[key].as_f64())
                    .map_or_else(|| "-".to_owned(), |v| format!("{v}"))
            };
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {:.3} | {:.1} / {:.1} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {:.0} | {} / {} | {} | {} | {} | {} | {:.1} | {} |",
                result.row.name,
                recorder.kind.name(),
                f.writes,
                recorder.untimed_writes,
                recorder.blocked_at_stop,
                f.rate_bps / 1e6,
                mb(recorder.traced_bytes),
                mb(recorder.file_bytes),
                report::ms(f.p50_ms),
                report::ms(f.p99_ms),
                report::ms(f.p999_ms),
                report::ms(f.max_ms),
                f.slow_writes,
                f.overflows,
                report::ms(f.worst_lag_ms),
                recorder.throttle.pauses,
                recorder.throttle.at_limit,
                recorder.throttle.paused_ms,
                recorder.throttle.slow_writes_throttled,
                recorder.throttle.slow_writes,
                own("overflows"),
                own("write_p999_ms"),
                match own("write_max_cpu_wait_ms").as_str() {
                    "-" => own("write_max_ms"),
                    wait => format!("{} ({wait})", own("write_max_ms")),
                },
                recorder.lost_events,
                recorder.cpu_s,
                recorder.ended,
            );
        }
    }
    record_table(text, results);
}

/// The direct rows' `abissctl record` per recorder: the ring (its overflows: input that
/// waited for room) and its direct writes.
fn record_table(text: &mut String, results: &[RowResult]) {
    let direct: Vec<&RowResult> = results.iter().filter(|r| r.row.direct).collect();
    if direct.is_empty() {
        return;
    }
    text.push_str(
        "\nIn the direct rows, what each `abissctl record` reported (`--json`; for the test \
         recorder, the library's summary with the same keys): the bytes it \
         wrote, its ring's overflows (input that waited for room), its direct writes (pieces) \
         and their times, submission to completion, whether abissd raised its writer, and the \
         test recorder's file read back once the load stopped (each 8-byte word must hold its \
         own offset, as written):\n\n\
         | row | recorder | bytes | ring overflows | pieces | piece p99.9 ms | piece max ms | raised | file as written |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n",
    );
    for result in direct {
        for recorder in &result.recorders {
            let Some(record) = &recorder.record else {
                let _ = writeln!(
                    text,
                    "| {} | {} | - | - | - | - | - | - | {} |",
                    result.row.name,
                    recorder.kind.name(),
                    recorder.content.as_deref().unwrap_or("-"),
                );
                continue;
            };
            let ms = |key: &str| {
                record[key]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), report::ms)
            };
            let _ = writeln!(
                text,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                result.row.name,
                recorder.kind.name(),
                record["bytes"],
                record["overflows"],
                record["pieces"],
                ms("piece_p999_ms"),
                ms("piece_max_ms"),
                record["raised"],
                recorder.content.as_deref().unwrap_or("-"),
            );
        }
    }
}

/// The head of the per-stream table, what abissd counted ([`watch::streams_table`]).
const STREAMS_INTRO: &str = "\nWhat abissd counted per stream (before the players were stopped): misses = reads that \
     waited for the disk for data the window should have held (read streams); seek waits = \
     reads that waited for the window a seek asked for; raises = readers raised; inversions = the \
     stream's block requests that ran below its level (a recording's: pages the kernel's \
     flushers wrote back at best effort before abissd did); service = dispatch to completion \
     and queue = insert to dispatch of the stream's block requests (log2 bucket bounds):\n\n\
     | row | stream | file | misses | seek waits | raises | requests | inversions | service p99 ms | queue p99 ms | queue max ms | suggestion |\n\
     | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";

fn errors(text: &mut String, results: &[RowResult]) {
    let mut lines = Vec::new();
    for result in results {
        for (i, r) in result.recorders.iter().enumerate() {
            if let Some(error) = &r.error {
                lines.push(format!(
                    "- {} recorder {i} ({}): {}",
                    result.row.name,
                    r.kind.name(),
                    error.replace('\n', " ")
                ));
            }
        }
        for (i, p) in result.players.iter().enumerate() {
            if let Some(error) = &p.error {
                lines.push(format!(
                    "- {} player {i}: {}",
                    result.row.name,
                    error.replace('\n', " ")
                ));
            }
        }
    }
    if !lines.is_empty() {
        text.push_str("\nRecorders and players that did not run:\n\n");
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    }
}

/// A series of bars: its label, its value per row and where it sits in a row's slot.
type Bar = (&'static str, fn(&RowResult) -> f64, f64);

/// Recorder write p99.9 and max per row as bars on a log scale, with the goal and the capture
/// buffer.
pub fn chart(path: &Path, secs: u64, capture_ms: u64, results: &[RowResult]) -> anyhow::Result<()> {
    const FLOOR: f64 = 0.01;
    #[expect(clippy::cast_precision_loss, reason = "ms of a capture buffer")]
    let capture = capture_ms as f64;
    let top = results
        .iter()
        .map(|r| r.recorder_writes.max_ms)
        .fold(capture * 2.0, f64::max)
        * 2.0;
    #[expect(clippy::cast_precision_loss, reason = "a handful of rows")]
    let width = results.len() as f64;
    let names: Vec<&str> = results.iter().map(|r| r.row.name).collect();
    crate::chart::row_bars(
        path,
        format!(
            "Recorders' write(2) time next to players and a best-effort writer, lab hdd ({secs} s)"
        ),
        18,
        &names,
        (FLOOR, top),
        "write(2) time of the recorders, ms (log scale)",
        |chart| {
            let bars: [Bar; 2] = [
                ("p99.9", |r| r.recorder_writes.p999_ms, 0.1),
                ("max", |r| r.recorder_writes.max_ms, 0.5),
            ];
            for (index, (label, value, offset)) in bars.into_iter().enumerate() {
                let color = Palette99::pick(index).to_rgba();
                chart
                    .draw_series(results.iter().enumerate().map(|(i, r)| {
                        #[expect(clippy::cast_precision_loss, reason = "a bar index")]
                        let x = i as f64 + offset;
                        Rectangle::new(
                            [(x, FLOOR), (x + 0.38, value(r).max(FLOOR))],
                            color.filled(),
                        )
                    }))?
                    .label(format!("recorder write {label}, all recorders"))
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                    });
            }
            for (y, label, style) in [
                (
                    GOAL_P999_MS,
                    format!("goal: p99.9 < {GOAL_P999_MS} ms"),
                    BLACK,
                ),
                (capture, format!("capture buffer: {capture_ms} ms"), RED),
            ] {
                chart
                    .draw_series(LineSeries::new(
                        [(0.0, y), (width, y)],
                        style.stroke_width(1),
                    ))?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            }
            Ok(())
        },
    )
}
