//! What the soak writes: the Markdown tables (users, kills, leftovers) and the chart of the
//! daemon's footprint over the cycles.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::worker::float;
use super::USERS;
use crate::report::{self, Results};

/// The Markdown report.
pub(super) fn markdown(results: &Results<Value, Value>) -> String {
    let report = &results.parameters;
    let figures = &results.rows[0].figures;
    let end = &figures["end"];
    let base = &end["baseline"];
    let at_end = &end["at_end"];
    let mut md = format!(
        "### Soak: {} attach/detach cycles by 4 users, abissd killed every {} cycles\n\n\
         `{}`: root and {} (unprivileged{}) each loop: attach their own file (500 kB/s, \
         256 KiB buffer, level 0), drop 64 KiB of it from the page cache and read it (a miss: \
         the reader is raised), end the stream (detach, or hang up). abissd (from {}) \
         manages a loop device over /dev/shm with ext4; it is killed with SIGKILL every {} \
         cycles, an abissd without disks then recovers what it left, and the managing abissd \
         starts again. {}\n\n",
        report["cycles"],
        report["kill_every"],
        results.command,
        USERS.join(", "),
        if report["users_created"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            ", made by the soak with useradd"
        } else {
            ""
        },
        report["abissd"].as_str().unwrap_or("?"),
        report["kill_every"],
        report::machine_line(&results.machine),
    );
    let cycles = &figures["cycles"];
    let _ = writeln!(
        md,
        "{} cycles in {:.0} s ({:.0} per second); per user:\n\n\
         | user | cycles | refused | retried while abissd was down | raised after the miss | raised at the end |\n\
         | --- | ---: | ---: | ---: | ---: | --- |",
        cycles["done"],
        cycles["wall_s"].as_f64().unwrap_or(0.0),
        cycles["per_s"].as_f64().unwrap_or(0.0),
    );
    for worker in cycles["workers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            worker["user"].as_str().unwrap_or("?"),
            worker["cycles"],
            worker["refused"],
            worker["retried"],
            worker["raised_during_cycles"],
            if worker["raised_at_end"].as_bool() == Some(false) {
                "no"
            } else {
                "YES"
            },
        );
    }
    md.push_str(&super::hostile::markdown(&cycles["hostile"]));
    md.push_str(&kills_table(figures));
    md.push_str(&leftovers_table(figures));
    md.push_str(&by_kind(&base["process"], &at_end["process"]));
    let _ = writeln!(
        md,
        "Hash map entries by map, baseline → end: {} (`INFLIGHT` keeps a record per kernel \
         request structure seen, reused in place: bounded by the disk's tags, not by cycles).\n\nThe last abissd exited with {} on \
         SIGTERM; the disk's settings after it: {} (before the soak: {}). The last abissd \
         raised readers {} times and put {} back.",
        map_changes(&base["hash_map_entries"], &at_end["hash_map_entries"]),
        end["exit_code"],
        settings_text(&end["disk_after_stop"]),
        settings_text(&end["disk_original"]),
        end["raises_total"],
        end["raises_restored"],
    );
    md
}

/// The last abissd's descriptors by kind and threads by name, its baseline against its end.
fn by_kind(base: &Value, at_end: &Value) -> String {
    format!(
        "Descriptors by kind, baseline → end: {}.\n\nThreads by name (closing and locking \
         threads, which end 5 s after their last work, and io_uring's workers aside), baseline \
         → end: {}.\n\n",
        map_changes(&base["fd_kinds"], &at_end["fd_kinds"]),
        map_changes(&base["thread_kinds"], &at_end["thread_kinds"]),
    )
}

/// What is left over: the last abissd against its baseline, the machine against before.
fn leftovers_table(figures: &Value) -> String {
    let end = &figures["end"];
    let base = &end["baseline"];
    let at_end = &end["at_end"];
    let fd = |v: &Value| v["process"]["fds"].as_u64().unwrap_or(0);
    let th = |v: &Value| v["process"]["threads"].as_u64().unwrap_or(0);
    let maps = |v: &Value| -> u64 {
        v["hash_map_entries"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };
    let before = &figures["system_before"];
    let after = &figures["system_after_teardown"];
    let mut md = String::new();
    let _ = write!(
        md,
        "\nAfterwards: the last abissd, its users gone, against the first one quiet after its \
         warm-up (one stream at each level and back, and one recording allocated ahead; the same program and options); then the \
         machine against before the soak:\n\n\
         | what | baseline | at the end | left over |\n| --- | ---: | ---: | ---: |\n\
         | abissd descriptors | {} | {} | {} |\n\
         | abissd threads (io-wq workers, closing and locking threads aside) | {} | {} | {} |\n\
         | entries of abissd's eBPF hash maps | {} | {} | {} |\n\
         | abissd locked memory (VmLck, kB) | {} | {} | {} |\n\
         | streams | 0 | {} | {} |\n\
         | raised threads | 0 | {} | {} |\n\
         | Mlocked on the machine (kB, after the soak's disk is gone) | {} | {} | {} |\n\
         | loop devices | {} | {} | {} |\n\
         | mounts (debugfs among them: {} → {}) | {} | {} | {} |\n\n",
        fd(base),
        fd(at_end),
        fd(at_end).saturating_sub(fd(base)),
        th(base),
        th(at_end),
        th(at_end).saturating_sub(th(base)),
        maps(base),
        maps(at_end),
        maps(at_end).saturating_sub(maps(base)),
        base["process"]["locked_kib"],
        at_end["process"]["locked_kib"],
        at_end["process"]["locked_kib"],
        end["streams_left"],
        end["streams_left"],
        end["raised_threads"],
        end["raised_threads"],
        before["mlocked_kib"],
        after["mlocked_kib"],
        after["mlocked_kib"].as_i64().unwrap_or(0) - before["mlocked_kib"].as_i64().unwrap_or(0),
        before["loop_devices"]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(1),
        after["loop_devices"],
        i128::from(after["loop_devices"].as_u64().unwrap_or(0))
            - i128::from(
                before["loop_devices"]
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_sub(1)
            ),
        before["debugfs_mounts"],
        after["debugfs_mounts"],
        before["mounts"].as_u64().unwrap_or(0).saturating_sub(1),
        after["mounts"],
        i128::from(after["mounts"].as_u64().unwrap_or(0))
            - i128::from(before["mounts"].as_u64().unwrap_or(0).saturating_sub(1)),
    );
    md
}

fn kills_table(figures: &Value) -> String {
    let mut md = String::from(
        "\nAfter each kill -9:\n\n\
         | at cycle | abissd fds before the kill | disk after the kill | after recovery | restored | restart s |\n\
         | ---: | ---: | --- | --- | --- | ---: |\n",
    );
    for kill in figures["kills"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} |",
            kill["at_cycle"],
            kill["daemon_before_kill"]["process"]["fds"],
            settings_text(&kill["disk_after_kill"]),
            settings_text(&kill["disk_after_recovery"]),
            if kill["restored"].as_bool() == Some(true) {
                "yes"
            } else {
                "NO"
            },
            kill["restart_s"].as_f64().unwrap_or(0.0),
        );
    }
    md
}

fn settings_text(settings: &Value) -> String {
    if settings.is_null() {
        return "?".to_owned();
    }
    format!(
        "{}, nr_requests {}, depth {}",
        settings["elevator"].as_str().unwrap_or("?"),
        settings["nr_requests"].as_str().unwrap_or("?"),
        settings["driver_depth"]
            .as_u64()
            .map_or_else(|| "?".to_owned(), |d| d.to_string()),
    )
}

fn map_changes(before: &Value, after: &Value) -> String {
    let names: std::collections::BTreeSet<&String> = before
        .as_object()
        .into_iter()
        .chain(after.as_object())
        .flat_map(|m| m.keys())
        .collect();
    if names.is_empty() {
        return "none (bpftool names no map held by abissd's pid)".to_owned();
    }
    names
        .into_iter()
        .map(|name| {
            format!(
                "{name} {} → {}",
                before[name.as_str()],
                after[name.as_str()]
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Cycles done and abissd's descriptors over time, the kills marked.
pub(super) fn chart_samples(
    path: &Path,
    samples: &[(f64, u64, Value)],
    kills: &[Value],
) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let last_t = samples.last().map_or(1.0, |s| s.0).max(1.0);
    let max_cycles = float(samples.last().map_or(1, |s| s.1).max(1));
    let max_fds = float(
        samples
            .iter()
            .filter_map(|s| s.2["fds"].as_u64())
            .max()
            .unwrap_or(1),
    );
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Soak: cycles done and abissd's descriptors; kill -9 marked",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(0f64..last_t, 0f64..max_cycles * 1.05)?
        .set_secondary_coord(0f64..last_t, 0f64..max_fds * 1.2);
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("cycles done")
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("abissd descriptors")
        .draw()?;
    let blue = Palette99::pick(0).to_rgba();
    let red = Palette99::pick(1).to_rgba();
    chart
        .draw_series(LineSeries::new(
            samples.iter().map(|s| (s.0, float(s.1))),
            blue.stroke_width(2),
        ))?
        .label("cycles done")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart
        .draw_secondary_series(LineSeries::new(
            samples
                .iter()
                .filter_map(|s| s.2["fds"].as_u64().map(|f| (s.0, float(f)))),
            red.stroke_width(1),
        ))?
        .label("abissd descriptors (0 while it is down)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
    let kill_times: Vec<f64> = kills
        .iter()
        .filter_map(|k| k["at_cycle"].as_u64())
        .filter_map(|cycle| samples.iter().find(|s| s.1 >= cycle).map(|s| s.0))
        .collect();
    chart
        .draw_series(kill_times.iter().map(|&t| {
            PathElement::new(
                vec![(t, 0.0), (t, max_cycles * 1.05)],
                BLACK.stroke_width(1),
            )
        }))?
        .label("kill -9")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    crate::chart::finish(&mut chart, &root)
}
