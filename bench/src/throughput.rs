//! Throughput and device-activity accounting over a measurement window (pure).

use std::time::Duration;

use abiss_lab::{Op, RequestRecord};
use serde::Serialize;

/// Bytes per megabyte: the slides' and the lab's MB is 10^6 bytes.
pub const MB: f64 = 1e6;

/// `bytes` moved in `window`, in MB/s (0 for an empty window).
#[must_use]
pub fn mb_per_s(bytes: u64, window: Duration) -> f64 {
    let secs = window.as_secs_f64();
    if secs > 0.0 {
        #[expect(clippy::cast_precision_loss, reason = "a rate for the report")]
        let bytes = bytes as f64;
        bytes / MB / secs
    } else {
        0.0
    }
}

/// What the emulated disk did during a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DeviceActivity {
    /// Fraction of the window the actuator was busy.
    pub busy_fraction: f64,
    /// Read requests served.
    pub read_requests: u64,
    /// Write requests served.
    pub write_requests: u64,
    /// Bytes read per second at the device.
    pub read_mb_s: f64,
    /// Bytes written per second at the device.
    pub write_mb_s: f64,
}

impl DeviceActivity {
    /// From the requests the emulator recorded during a window (all of them, or a selection,
    /// such as those within some files' extents): the busy fraction is the actuator occupancy
    /// they add up to over the window's length.
    #[must_use]
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a RequestRecord>,
        window: Duration,
    ) -> Self {
        let (mut reads, mut writes, mut read_bytes, mut write_bytes) = (0, 0, 0, 0);
        let mut busy_ns = 0u64;
        for record in records {
            busy_ns += record.occupancy_ns;
            match record.op {
                Op::Read => {
                    reads += 1;
                    read_bytes += record.len;
                }
                Op::Write => {
                    writes += 1;
                    write_bytes += record.len;
                }
            }
        }
        let window_ns = window.as_nanos();
        #[expect(clippy::cast_precision_loss, reason = "a fraction for the report")]
        let busy_fraction = if window_ns == 0 {
            0.0
        } else {
            busy_ns as f64 / window_ns as f64
        };
        Self {
            busy_fraction,
            read_requests: reads,
            write_requests: writes,
            read_mb_s: mb_per_s(read_bytes, window),
            write_mb_s: mb_per_s(write_bytes, window),
        }
    }
}

/// Byte ranges of the disk, merged and in order: where some files' blocks lie, to tell their
/// requests from the rest of a window's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskRanges(Vec<(u64, u64)>);

impl DiskRanges {
    /// The ranges `(start, length)` of `extents`, in bytes of the disk.
    #[must_use]
    pub fn new(extents: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut spans: Vec<(u64, u64)> = extents
            .into_iter()
            .filter(|(_, length)| *length > 0)
            .map(|(start, length)| (start, start.saturating_add(length)))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        Self(merged)
    }

    /// Whether the request starting at `offset` falls within the ranges.
    #[must_use]
    pub fn holds(&self, offset: u64) -> bool {
        let after = self.0.partition_point(|(start, _)| *start <= offset);
        after > 0 && offset < self.0[after - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(op: Op, len: u64, occupancy_ns: u64) -> RequestRecord {
        RequestRecord {
            seq: 0,
            op,
            offset: 0,
            len,
            arrival_ns: 0,
            start_ns: 0,
            end_ns: 0,
            transport_ns: 0,
            replied_ns: 0,
            seek_ns: 0,
            rotation_ns: 0,
            transfer_ns: 0,
            latency_ns: 0,
            occupancy_ns,
            outstanding: 1,
            backing_ns: 0,
            failed: false,
        }
    }

    #[test]
    fn rate_is_bytes_over_seconds_in_decimal_megabytes() {
        assert!((mb_per_s(35_000_000, Duration::from_secs(2)) - 17.5).abs() < 1e-9);
        assert!(mb_per_s(1, Duration::ZERO).abs() < f64::EPSILON);
    }

    #[test]
    fn activity_splits_reads_and_writes_and_adds_up_occupancy() {
        let records = [
            record(Op::Read, 4_000_000, 2_000_000_000),
            record(Op::Read, 1_000_000, 500_000_000),
            record(Op::Write, 10_000_000, 5_000_000_000),
        ];
        let activity = DeviceActivity::from_records(&records, Duration::from_secs(10));
        assert!((activity.busy_fraction - 0.75).abs() < 1e-9);
        assert_eq!((activity.read_requests, activity.write_requests), (2, 1));
        assert!((activity.read_mb_s - 0.5).abs() < 1e-9);
        assert!((activity.write_mb_s - 1.0).abs() < 1e-9);
    }

    #[test]
    fn activity_of_an_empty_window_is_zero() {
        let activity = DeviceActivity::from_records(&[], Duration::ZERO);
        assert_eq!(activity, DeviceActivity::default());
    }

    #[test]
    fn ranges_merge_and_hold_what_lies_within_them() {
        let ranges = DiskRanges::new([(100, 50), (0, 10), (120, 100), (300, 0)]);
        assert_eq!(ranges, DiskRanges(vec![(0, 10), (100, 220)]));
        for (offset, held) in [
            (0, true),
            (9, true),
            (10, false),
            (99, false),
            (100, true),
            (219, true),
            (220, false),
            (300, false),
        ] {
            assert_eq!(ranges.holds(offset), held, "{offset}");
        }
        assert!(!DiskRanges::default().holds(0));
    }
}
