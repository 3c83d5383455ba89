//! `abissctl stats`: what the eBPF programs and the daemon cost.

use std::io::Write;
use std::time::Duration;

use abiss_proto::StatsReport;

use crate::error::CliError;
use abiss_client::Client;

/// Asks the daemon to measure over `window` and prints the report.
pub fn show(client: &mut Client, window: Duration, json: bool) -> Result<(), CliError> {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    let report = client.stats(window_ms)?;
    let mut out = std::io::stdout().lock();
    let written = if json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out))
    } else {
        write_text(&mut out, &report)
    };
    // A closed stdout (`| head`) is not an error worth reporting.
    let _ = written;
    Ok(())
}

#[expect(clippy::cast_precision_loss, reason = "rates and shares for display")]
fn write_text(out: &mut impl Write, report: &StatsReport) -> std::io::Result<()> {
    let window_s = report.window_ns as f64 / 1e9;
    writeln!(
        out,
        "{:<18} {:>6} {:>12} {:>12} {:>10} {:>7}",
        "PROGRAM", "ID", "RUNS", "RUNS/s", "AVG ns", "CPU%"
    )?;
    let (mut runs, mut time) = (0u64, 0u64);
    for program in &report.programs {
        runs += program.run_count;
        time += program.run_time_ns;
        writeln!(
            out,
            "{:<18} {:>6} {:>12} {:>12.0} {:>10.0} {:>7.3}",
            program.name,
            program.id,
            program.run_count,
            program.run_count as f64 / window_s,
            program.avg_ns,
            program.run_time_ns as f64 / report.window_ns as f64 * 100.0
        )?;
    }
    let average = if runs == 0 {
        0.0
    } else {
        time as f64 / runs as f64
    };
    writeln!(
        out,
        "{:<18} {:>6} {:>12} {:>12.0} {:>10.0}",
        "all programs",
        "",
        runs,
        runs as f64 / window_s,
        average
    )?;
    writeln!(
        out,
        "daemon: cpu {:.3} ms in {:.2} s ({:.3}%), {:.1} s in all; rss {}; {} requests in flight, {} request records",
        report.daemon_cpu_ns as f64 / 1e6,
        window_s,
        report.daemon_cpu_ns as f64 / report.window_ns as f64 * 100.0,
        report.daemon_cpu_total_ns as f64 / 1e9,
        abiss_proto::ByteSize(report.daemon_rss_bytes).readable(),
        report.tracked_requests,
        report.request_records
    )
}
