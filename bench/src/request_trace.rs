//! Every block request abissd's tracer saw while a row ran: `abissctl trace --events --json`
//! into a file (the user's own tool, so the benchmark reads what a user would), read back as
//! [`RequestRecord`]s; and what they say of a row's real-time writes against ABISS's bound.

use std::io::BufRead as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use abiss_proto::{DeviceNumber, IoClass, Operation, RequestRecord};
use anyhow::Context as _;
use serde::Serialize;

/// ABISS's published bound (Philips Research): every real-time read and write completed
/// within 6 ms of its submission, against 8 greedy best-effort streams.
pub const ABISS_BOUND_NS: u64 = 6_000_000;

/// `abissctl trace --events --json` into a file while a row runs. Ended on drop.
#[derive(Debug)]
pub struct RequestTrace(std::process::Child);

impl RequestTrace {
    /// Starts tracing abissd at `socket` into `output` with `bin_dir`'s abissctl.
    pub fn start(bin_dir: &Path, socket: &Path, output: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = output.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let child = std::process::Command::new(bin_dir.join("abissctl"))
            .args(["trace", "--events", "--json"])
            .env("ABISS_SOCKET", socket)
            .stdout(std::fs::File::create(output)?)
            .spawn()
            .context("cannot start abissctl trace")?;
        Ok(Self(child))
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The records of a finished trace; a last line cut short by the kill is left out.
pub fn records(path: &Path) -> anyhow::Result<Vec<RequestRecord>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str(&line).ok())
        .collect())
}

/// The number of the block device at `path` (its `st_rdev`).
pub fn device_number(path: &Path) -> anyhow::Result<DeviceNumber> {
    let rdev = std::fs::metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?
        .rdev();
    Ok(DeviceNumber {
        major: nix::sys::stat::major(rdev).try_into()?,
        minor: nix::sys::stat::minor(rdev).try_into()?,
    })
}

/// A row's real-time write requests on one disk, from insert to completion (queue and
/// service), against [`ABISS_BOUND_NS`].
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RealTimeWrites {
    /// Write requests at the real-time class.
    pub requests: usize,
    /// Of them, completed later than the bound after their insert.
    pub over_bound: usize,
    /// Median insert to completion, ms.
    pub p50_ms: f64,
    /// Median queue time (insert to dispatch), ms.
    pub queue_p50_ms: f64,
    /// 99th percentile insert to completion, ms.
    pub p99_ms: f64,
    /// The slowest, ms.
    pub slowest_ms: f64,
    /// Its queue part (insert to dispatch), ms.
    pub slowest_queue_ms: f64,
}

impl RealTimeWrites {
    /// Of `records`, the real-time writes on `device`.
    #[must_use]
    pub fn of(records: &[RequestRecord], device: DeviceNumber) -> Self {
        let mut figures = Self::default();
        let mut slowest = 0;
        let (mut took_ms, mut queued_ms) = (Vec::new(), Vec::new());
        for record in records.iter().filter(|r| {
            r.device == device && r.operation == Operation::Write && r.priority.class == IoClass::Rt
        }) {
            let took = record.queue_ns + record.service_ns;
            figures.requests += 1;
            if took > ABISS_BOUND_NS {
                figures.over_bound += 1;
            }
            if took > slowest {
                slowest = took;
                figures.slowest_queue_ms = ms(record.queue_ns);
            }
            took_ms.push(ms(took));
            queued_ms.push(ms(record.queue_ns));
        }
        took_ms.sort_by(f64::total_cmp);
        queued_ms.sort_by(f64::total_cmp);
        figures.p50_ms = abiss_lab::stats::quantile(&took_ms, 0.5).unwrap_or(0.0);
        figures.p99_ms = abiss_lab::stats::quantile(&took_ms, 0.99).unwrap_or(0.0);
        figures.queue_p50_ms = abiss_lab::stats::quantile(&queued_ms, 0.5).unwrap_or(0.0);
        figures.slowest_ms = ms(slowest);
        figures
    }
}

#[expect(clippy::cast_precision_loss, reason = "a time in ms")]
fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use abiss_proto::IoPriority;

    fn record(
        device: DeviceNumber,
        operation: Operation,
        class: IoClass,
        queue_ms: u64,
        service_ms: u64,
    ) -> RequestRecord {
        RequestRecord {
            completed_ns: 0,
            device,
            operation,
            priority: IoPriority { class, level: 0 },
            sector: 0,
            bytes: 4096,
            stream: None,
            tgid: 1,
            pid: 1,
            uid: 0,
            comm: "w".into(),
            inode: None,
            inode_device: None,
            queue_ns: queue_ms * 1_000_000,
            service_ns: service_ms * 1_000_000,
            error: 0,
        }
    }

    #[test]
    fn only_real_time_writes_on_the_disk_count_and_the_bound_is_on_queue_and_service_together() {
        let disk = DeviceNumber { major: 7, minor: 0 };
        let other = DeviceNumber { major: 8, minor: 0 };
        let records = [
            record(disk, Operation::Write, IoClass::Rt, 1, 4),
            record(disk, Operation::Write, IoClass::Rt, 4, 3),
            record(disk, Operation::Write, IoClass::Rt, 9, 2),
            record(disk, Operation::Write, IoClass::Be, 90, 9),
            record(disk, Operation::Read, IoClass::Rt, 90, 9),
            record(other, Operation::Write, IoClass::Rt, 90, 9),
        ];
        let figures = RealTimeWrites::of(&records, disk);
        assert_eq!((figures.requests, figures.over_bound), (3, 2));
        assert!((figures.p50_ms - 7.0).abs() < 1e-9);
        assert!((figures.queue_p50_ms - 4.0).abs() < 1e-9);
        assert!((figures.slowest_ms - 11.0).abs() < 1e-9);
        assert!((figures.slowest_queue_ms - 9.0).abs() < 1e-9);
    }
}
