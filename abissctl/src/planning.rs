//! `abissctl admit`: capacity planning on a managed device, answered by abissd from its
//! admission control; nothing is attached.

use std::io::Write;

use abiss_client::Client;
use abiss_proto::{AdmissionMode, AdmissionReport, AdmitRequest, ByteRate, ByteSize};

use crate::error::CliError;

/// The question.
#[derive(Debug)]
pub struct AdmitQuestion {
    /// The device.
    pub device: String,
    /// Mean rate per stream.
    pub rate: ByteRate,
    /// Standard deviation of the rate.
    pub stdev: ByteRate,
    /// Playout buffer per stream.
    pub buffer: ByteSize,
    /// Pages per credit step.
    pub batch: u32,
    /// Streams to evaluate.
    pub count: Option<u32>,
    /// Mode to answer for.
    pub mode: Option<AdmissionMode>,
    /// Recording streams.
    pub write: bool,
    /// Print JSON.
    pub json: bool,
}

fn percent(p: f64) -> String {
    if p == 0.0 {
        "0%".to_owned()
    } else if p < 1e-6 {
        "< 0.0001%".to_owned()
    } else {
        format!("{:.4}%", p * 100.0)
    }
}

/// Asks abissd and prints the answer.
pub fn admit(client: &mut Client, question: &AdmitQuestion) -> Result<(), CliError> {
    let kind = stream_kind(question);
    let json = question.json;
    // The daemon looks up no path for a client: a path is resolved here, as the user.
    let device = crate::devices::resolve(&question.device)?.to_string();
    let report = client.admit(AdmitRequest {
        device,
        rate: question.rate,
        rate_stdev: question.stdev,
        buffer: question.buffer,
        batch_pages: Some(question.batch),
        count: question.count,
        mode: question.mode,
        write: question.write,
    })?;
    let mut out = std::io::stdout().lock();
    if json {
        crate::json::print(&mut out, &report);
        return Ok(());
    }
    print_state(&mut out, &report);
    print_answer(&mut out, &report, &kind);
    Ok(())
}

/// What the question's streams are, for the answer: "`RATE` playback streams (σ `STDEV`)".
fn stream_kind(question: &AdmitQuestion) -> String {
    format!(
        "{} {} streams{}",
        question.rate.readable(),
        if question.write {
            "recording"
        } else {
            "playback"
        },
        if question.stdev.0 > 0 {
            format!(" (σ {})", question.stdev.readable())
        } else {
            String::new()
        }
    )
}

/// The device's admission settings and what it has admitted now.
fn print_state(out: &mut impl Write, report: &AdmissionReport) {
    let _ = writeln!(
        out,
        "{}: {} admission, p_req {}, {} ms windows, {}% real time; {}",
        report.device,
        report.mode,
        percent(report.p_req),
        report.window_ms,
        report.realtime_share_percent,
        report.model_source
    );
    let _ = writeln!(
        out,
        "admitted now: {} streams{}",
        report.admitted_streams,
        report
            .current_miss_probability
            .map_or_else(String::new, |p| format!(
                ", predicted miss probability {}",
                percent(p)
            ))
    );
}

/// How many more `kind` streams fit, and whether the asked-for count does.
fn print_answer(out: &mut impl Write, report: &AdmissionReport, kind: &str) {
    match report.n_max {
        Some(n) => {
            let _ = writeln!(out, "n_max: {n} more {kind} fit");
        }
        None => {
            let _ = writeln!(out, "n_max: no limit (admission is off)");
        }
    }
    if let (Some(count), Some(fits)) = (report.count, report.fits) {
        let _ = writeln!(
            out,
            "{count} more: {}{}",
            if fits { "fit" } else { "do not fit" },
            report
                .miss_probability
                .map_or_else(String::new, |p| format!(
                    ", predicted miss probability {}",
                    percent(p)
                )),
        );
        if let Some(work_ms) = report.mean_work_ms {
            let _ = writeln!(
                out,
                "  with them the disk's streams would take {work_ms:.0} ms of every {} ms window on average, by its model ({} ms are for real time)",
                report.window_ms,
                report.window_ms * u64::from(report.realtime_share_percent) / 100
            );
        }
        if let Some(overrun) = report.window_overrun_probability {
            let _ = writeln!(
                out,
                "  (TRAC's probability that a window overruns the share, buffers ignored: {})",
                percent(overrun)
            );
        }
    }
}
