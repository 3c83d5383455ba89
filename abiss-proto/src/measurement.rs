//! Measurements the daemon serves: latency histograms per device, operation and priority
//! ([`LatencyGroup`]), one record per request ([`RequestRecord`]), and its own cost
//! ([`StatsReport`]).

use serde::{Deserialize, Serialize};

use crate::{DeviceNumber, IoPriority, Log2Histogram, Operation, StreamId};

/// Cumulative latency figures of one (device, operation, priority).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyGroup {
    /// The disk.
    pub device: DeviceNumber,
    /// The block operation.
    pub operation: Operation,
    /// The I/O priority the requests carried.
    pub priority: IoPriority,
    /// The stream whose attached file the requests' pages belong to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamId>,
    /// Completed requests.
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Requests of the stream that ran below the stream's ABISS level (priority inversions).
    #[serde(default)]
    pub inversions: u64,
    /// Queue time: elevator insert (or bio submission when the request skipped the elevator)
    /// to dispatch to the driver.
    pub queue: Log2Histogram,
    /// Service time: dispatch to completion.
    pub service: Log2Histogram,
}

impl LatencyGroup {
    /// The figures accumulated since `earlier`, a snapshot of the same group.
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            device: self.device,
            operation: self.operation,
            priority: self.priority,
            stream: self.stream,
            requests: self.requests.saturating_sub(earlier.requests),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            inversions: self.inversions.saturating_sub(earlier.inversions),
            queue: self.queue.since(&earlier.queue),
            service: self.service.since(&earlier.service),
        }
    }

    /// The key that identifies this group across snapshots.
    #[must_use]
    pub fn key(&self) -> (DeviceNumber, Operation, IoPriority, Option<StreamId>) {
        (self.device, self.operation, self.priority, self.stream)
    }
}

/// One completed block request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Completion time, `CLOCK_MONOTONIC` ns.
    pub completed_ns: u64,
    /// The disk.
    pub device: DeviceNumber,
    /// The block operation.
    pub operation: Operation,
    /// The request's I/O priority.
    pub priority: IoPriority,
    /// First sector (512 bytes).
    pub sector: u64,
    /// Size in bytes.
    pub bytes: u32,
    /// The stream whose attached file the request's pages belong to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamId>,
    /// Process that submitted the request's first bio.
    pub tgid: u32,
    /// Thread that submitted it.
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its command name.
    pub comm: String,
    /// Inode of the page-cache pages carried, if the request carries file pages.
    pub inode: Option<u64>,
    /// Filesystem device of that inode.
    pub inode_device: Option<DeviceNumber>,
    /// Queue time in ns.
    pub queue_ns: u64,
    /// Service time in ns.
    pub service_ns: u64,
    /// Kernel `blk_status_t`, zero on success.
    pub error: u32,
}

/// Cost of the eBPF programs and of the daemon itself over a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    /// Length of the window, ns.
    pub window_ns: u64,
    /// One entry per loaded program.
    pub programs: Vec<ProgramCost>,
    /// Daemon CPU time (user + system) over the window, ns.
    pub daemon_cpu_ns: u64,
    /// Daemon CPU time since it started, ns.
    pub daemon_cpu_total_ns: u64,
    /// Daemon resident set size at the end of the window, bytes.
    pub daemon_rss_bytes: u64,
    /// Block requests in flight at the end of the window.
    pub tracked_requests: u64,
    /// Request records kept (one per kernel request struct recently used; bounded by the
    /// request pools of the active devices, not by how many requests were made).
    pub request_records: u64,
}

/// Run count and time of one eBPF program over a window (kernel BPF statistics).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProgramCost {
    /// Program name.
    pub name: String,
    /// Kernel program id.
    pub id: u32,
    /// Runs within the window.
    pub run_count: u64,
    /// Total run time within the window, ns.
    pub run_time_ns: u64,
    /// Mean run time per run, ns (zero when it did not run).
    pub avg_ns: f64,
}
