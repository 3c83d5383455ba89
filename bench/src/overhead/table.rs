//! What the overhead benchmark writes: a row per situation, the table and the chart.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::{json, Value};

use super::{OverheadArgs, OverheadRow, Situation, WindowCost, ELEVATOR, GOALS};
use crate::chart::{self, CostBar};
use crate::report::{self, Results, Row};

/// One row of the report; `reads` is the I/Os completed on the loaded disk in the window.
pub(super) fn row(
    situation: Situation,
    baseline: f64,
    iops: f64,
    reads: f64,
    floor_ns: f64,
    cost: &WindowCost,
) -> OverheadRow {
    #[expect(clippy::cast_precision_loss, reason = "means for the report")]
    let (runs, time) = (cost.runs as f64, cost.run_time_ns as f64);
    let per_io = |value: f64| if reads > 0.0 { value / reads } else { 0.0 };
    let configuration = json!({
        "situation": situation.description(),
        "scheduler": ELEVATOR,
        "file_attached": situation == Situation::ManagedStream,
        "trace_client": situation == Situation::Traced,
    });
    let figures = json!({
        "iops_untraced": baseline,
        "iops_traced": iops,
        "ios_in_window": reads,
        "events": cost.runs,
        "avg_ns_per_event": if runs > 0.0 { time / runs } else { 0.0 },
        "runs_per_io": per_io(runs),
        "ns_per_io": per_io(time),
        "ns_per_io_less_floor": per_io((time - floor_ns * runs).max(0.0)),
        "programs": cost.programs,
        "daemon_cpu_ns": cost.stats["daemon_cpu_ns"],
        "daemon_rss_bytes": cost.stats["daemon_rss_bytes"],
        "window_ns": cost.stats["window_ns"],
    });
    Row::new(situation.row(), configuration, figures)
}

/// Writes overhead.json, overhead.md and overhead.svg.
pub(super) fn write(
    args: &OverheadArgs,
    begun: Instant,
    window: u64,
    floor_ns: f64,
    rows: Vec<OverheadRow>,
) -> anyhow::Result<()> {
    let results = Results::new(
        "overhead",
        begun,
        json!({
            "secs": args.secs, "window_s": window, "block": "4k", "iodepth": 32,
            "engine": "io_uring", "direct": true, "elevator": ELEVATOR,
        }),
        rows,
    )
    .with("floor_ns_per_run", floor_ns)?
    .with(
        "goals_ns_per_io",
        GOALS
            .iter()
            .map(|(row, _, ns)| json!({"row": row, "ns": ns}))
            .collect::<Vec<_>>(),
    )?;
    let markdown = markdown(&results, window, floor_ns);
    results.write(&args.results_dir, "overhead", &markdown, |svg| {
        let bars: Vec<CostBar<'_>> = results
            .rows
            .iter()
            .filter(|row| row.name != "a")
            .map(|row| CostBar {
                name: &row.name,
                ns_per_io: row.figures["ns_per_io"].as_f64().unwrap_or(0.0),
                net_ns_per_io: row.figures["ns_per_io_less_floor"].as_f64().unwrap_or(0.0),
            })
            .collect();
        let goals: Vec<(&str, f64)> = GOALS.iter().map(|(_, name, ns)| (*name, *ns)).collect();
        chart::cost_per_io(
            svg,
            "eBPF run time per 4 KiB read (fio io_uring, iodepth 32, loop device over memory)",
            &bars,
            &goals,
        )
    })
}

/// The Markdown report: the table, the command, the machine, what the columns mean.
fn markdown(results: &Results<Value, Value>, window: u64, floor_ns: f64) -> String {
    let command = &results.command;
    let mut markdown = format!(
        "### Tracer overhead: 4 KiB random reads, fio io_uring iodepth 32, O_DIRECT, loop devices over memory\n\n\
         `{command}`; stats window {window} s, elevator {ELEVATOR}.\n{}\n\n\
         ns per I/O: the run time of all abiss programs in the window (the kernel's BPF \
         statistics) over the reads completed on the loaded disk. The kernel charges every run \
         its clock reads too: an empty program costs {floor_ns:.0} ns per run here (row floor), \
         so \"less floor\" takes that off each run. Programs with nothing to do are detached \
         (row b runs none; \"–\": the program did not run). IOPS vary by a few percent from \
         run to run.\n\n\
         | row | situation | IOPS without abissd | IOPS | runs per I/O | ns per I/O | less floor | insert ns | issue ns | complete ns | uring submit ns | uring complete ns | abissd CPU % |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        report::machine_line(&results.machine)
    );
    for Row {
        name,
        configuration,
        figures: row,
    } in &results.rows
    {
        let program_ns = |name: &str| {
            row["programs"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == name))
                .filter(|p| p["run_count"].as_u64().unwrap_or(0) > 0)
                .and_then(|p| p["avg_ns"].as_f64())
                .map_or_else(|| "–".to_owned(), |ns| format!("{ns:.0}"))
        };
        #[expect(clippy::cast_precision_loss, reason = "a share for the report")]
        let cpu_percent = row["window_ns"].as_u64().map_or_else(
            || "–".to_owned(),
            |window_ns| {
                let cpu = row["daemon_cpu_ns"].as_u64().unwrap_or(0) as f64;
                format!("{:.3}", cpu / window_ns.max(1) as f64 * 100.0)
            },
        );
        let number = |field: &str, decimals: usize| {
            format!("{:.*}", decimals, row[field].as_f64().unwrap_or(0.0))
        };
        let _ = writeln!(
            markdown,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {cpu_percent} |",
            name,
            configuration["situation"].as_str().unwrap_or(""),
            number("iops_untraced", 0),
            number("iops_traced", 0),
            number("runs_per_io", 2),
            number("ns_per_io", 0),
            number("ns_per_io_less_floor", 0),
            program_ns("abiss_insert"),
            program_ns("abiss_issue"),
            program_ns("abiss_complete"),
            program_ns("abiss_uring_submit"),
            program_ns("abiss_uring_complete"),
        );
    }
    let _ = writeln!(
        markdown,
        "\nGoals: row b under {:.0} ns per I/O, row c at most {:.0} ns.",
        GOALS[0].2, GOALS[1].2
    );
    markdown
}
