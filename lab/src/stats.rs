//! Per-request statistics: one JSON object per line in the lab's stats file, and a summary
//! file rewritten every second.
//!
//! Benchmarks read the requests of a run with a [`StatsCursor`], which returns only the lines
//! appended since it last looked.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::LabError;
use crate::model::Op;

/// One request as the emulated device served it. Times are nanoseconds since the emulator
/// started (a monotonic clock).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Sequence number in arrival order.
    pub seq: u64,
    /// Read or write.
    pub op: Op,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// When the request reached the emulator.
    pub arrival_ns: u64,
    /// When the actuator started on it (virtual clock: the later of arrival and the end of the
    /// previous request's occupancy).
    pub start_ns: u64,
    /// When the model says it completes.
    pub end_ns: u64,
    /// When the reply was actually sent: due at `end_ns - transport_ns`.
    pub replied_ns: u64,
    /// How much earlier than `end_ns` the reply was due: the lab's measured delay between the
    /// kernel and the emulator, so that the kernel sees the request complete at `end_ns`.
    #[serde(default)]
    pub transport_ns: u64,
    /// Seek component.
    pub seek_ns: u64,
    /// Rotational latency component.
    pub rotation_ns: u64,
    /// Transfer component (cloud: time in the throttle).
    pub transfer_ns: u64,
    /// Fixed latency component (cloud).
    pub latency_ns: u64,
    /// How long the request kept the actuator busy.
    pub occupancy_ns: u64,
    /// Requests in the emulator (queued or in service) when this one arrived, itself included.
    pub outstanding: u32,
    /// How long moving the data to or from the backing file took (inside the modelled time;
    /// if it exceeds the service time the reply is late).
    #[serde(default)]
    pub backing_ns: u64,
    /// Whether the backing file I/O failed (the request was answered with an error).
    pub failed: bool,
}

impl RequestRecord {
    /// Latency seen by the kernel, from arrival to reply.
    #[must_use]
    pub fn latency_ns(&self) -> u64 {
        self.replied_ns.saturating_sub(self.arrival_ns)
    }

    /// Timing error: how late the reply went out compared with when it was due.
    #[must_use]
    pub fn late_ns(&self) -> i64 {
        let replied = i128::from(self.replied_ns);
        let end = i128::from(self.end_ns) - i128::from(self.transport_ns);
        i64::try_from(replied - end).unwrap_or(i64::MAX)
    }
}

/// Running totals of the emulator, rewritten to the summary file every second.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsSummary {
    /// Requests completed.
    pub requests: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Time since the emulator started.
    pub elapsed_ns: u64,
    /// Sum of the actuator occupancy of all requests.
    pub busy_ns: u64,
    /// `busy_ns / elapsed_ns`: the device busy fraction.
    pub busy_fraction: f64,
    /// Mean timing error (reply time minus deadline).
    pub late_mean_ns: f64,
    /// Largest timing error.
    pub late_max_ns: i64,
    /// 99th percentile of the timing error over the last 10 000 requests.
    pub late_p99_ns: i64,
    /// Most requests ever outstanding in the emulator at once.
    pub max_outstanding: u32,
}

/// Reads the stats lines appended to a stats file since the last call.
#[derive(Debug)]
pub struct StatsCursor {
    path: PathBuf,
    offset: u64,
    /// The cursor was made while the emulator had written part of a line: the rest of that
    /// line belongs to a request from before, and is skipped once it is complete.
    mid_line: bool,
}

impl StatsCursor {
    /// A cursor at the current end of `path`: the next read returns only new requests.
    pub fn at_end(path: &Path) -> Result<Self, LabError> {
        let mut file = File::open(path).map_err(LabError::io(path))?;
        let offset = file.metadata().map_err(LabError::io(path))?.len();
        // The emulator's buffered writer may have flushed part of a line (even all of it but
        // its newline): the end of the file is then not where a line starts.
        let mut last = [b'\n'];
        if offset > 0 {
            file.seek(SeekFrom::Start(offset - 1))
                .and_then(|_| file.read_exact(&mut last))
                .map_err(LabError::io(path))?;
        }
        Ok(Self {
            path: path.to_owned(),
            offset,
            mid_line: last[0] != b'\n',
        })
    }

    /// A cursor at the start of `path`: the next read returns every request.
    #[must_use]
    pub fn at_start(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            offset: 0,
            mid_line: false,
        }
    }

    /// The complete lines appended since the last call. The emulator flushes its stats
    /// whenever it goes idle and at least every 100 ms.
    pub fn read_new(&mut self) -> Result<Vec<RequestRecord>, LabError> {
        let mut file = File::open(&self.path).map_err(LabError::io(&self.path))?;
        file.seek(SeekFrom::Start(self.offset))
            .map_err(LabError::io(&self.path))?;
        let mut reader = BufReader::new(file);
        let mut records = Vec::new();
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .map_err(LabError::io(&self.path))?;
            if n == 0 || !line.ends_with('\n') {
                break; // end, or a line still being written
            }
            self.offset += n as u64;
            if std::mem::take(&mut self.mid_line) {
                continue;
            }
            let record = serde_json::from_str(&line).map_err(|e| LabError::Io {
                path: self.path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?;
            records.push(record);
        }
        Ok(records)
    }
}

/// Reads a summary file.
pub fn read_summary(path: &Path) -> Result<StatsSummary, LabError> {
    let text = std::fs::read_to_string(path).map_err(LabError::io(path))?;
    serde_json::from_str(&text).map_err(|e| LabError::Io {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

/// The `p` percentile (0 to 100, nearest rank) of how late the emulator replied to `records`,
/// ns: how far the emulated medium strayed from its model. The emulator sleeps and spins in
/// user space, so CPU time the hypervisor takes from it shows here as replies past their due
/// time; a benchmark or test run whose medium strayed did not measure the modelled disk.
#[must_use]
pub fn late_percentile_ns(records: &[RequestRecord], p: f64) -> Option<i64> {
    let mut late: Vec<i64> = records.iter().map(RequestRecord::late_ns).collect();
    late.sort_unstable();
    quantile(&late, p / 100.0)
}

/// The one sample quantile (nearest rank), kept here for the tests and the benchmarks that
/// name it as the lab's; it lives in `abiss-units`, which the product crates share.
pub use abiss_units::quantile;

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> RequestRecord {
        RequestRecord {
            seq,
            op: Op::Read,
            offset: 0,
            len: 4096,
            arrival_ns: 1,
            start_ns: 2,
            end_ns: 3,
            transport_ns: 0,
            replied_ns: 4,
            seek_ns: 0,
            rotation_ns: 0,
            transfer_ns: 1,
            latency_ns: 0,
            occupancy_ns: 1,
            outstanding: 1,
            backing_ns: 0,
            failed: false,
        }
    }

    #[test]
    fn cursor_returns_only_complete_new_lines() {
        let dir = std::env::temp_dir().join(format!("abiss-lab-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.jsonl");
        let record = record(0);
        let line = serde_json::to_string(&record).unwrap();
        std::fs::write(&path, format!("{line}\n")).unwrap();
        let mut cursor = StatsCursor::at_end(&path).unwrap();
        assert!(cursor.read_new().unwrap().is_empty());
        std::fs::write(&path, format!("{line}\n{line}\n{{\"seq\"")).unwrap();
        assert_eq!(cursor.read_new().unwrap(), vec![record]);
        assert_eq!(StatsCursor::at_start(&path).read_new().unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_cursor_made_mid_line_skips_the_rest_of_that_line() {
        let dir = std::env::temp_dir().join(format!("abiss-lab-mid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stats.jsonl");
        let record = record(7);
        let line = serde_json::to_string(&record).unwrap();
        // Everything of an old line but its newline, as a buffered writer may flush it.
        std::fs::write(&path, &line).unwrap();
        let mut cursor = StatsCursor::at_end(&path).unwrap();
        assert!(cursor.read_new().unwrap().is_empty());
        std::fs::write(&path, format!("{line}\n{line}\n")).unwrap();
        assert_eq!(cursor.read_new().unwrap(), vec![record]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
