//! What a client is told of the daemon: its managed devices and their budgets, the kernel's
//! optional parts, locked memory and raised readers ([`StatusReport`]).

use serde::{Deserialize, Serialize};

use crate::{ByteRate, DeviceNumber};

/// One part of abiss that needs kernel hooks some kernels lack, and whether it is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// Its name, as `abissd --disable` takes it (`read-tracking`, …).
    pub name: String,
    /// Whether it works in this daemon.
    pub on: bool,
    /// What it gives.
    pub gives: String,
    /// The kernel hooks it needs and the first Linux release that has them.
    pub needs: String,
    /// Why it is off, and what still works without it; `None` while on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_because: Option<String>,
    /// While it is on through an older hook that stands in for a missing one: why, which
    /// hook, and what it does less.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stand_in: Option<String>,
}

/// What [`Request::Status`](crate::Request::Status) answers: the managed devices, the reader raises, what the daemon
/// can do on this kernel, and locked memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The managed devices.
    pub devices: Vec<DeviceStatus>,
    /// Reader raises.
    #[serde(default, rename = "upgrades")]
    pub raises: RaiseReport,
    /// What this daemon can do on this kernel.
    #[serde(default)]
    pub capabilities: Vec<Capability>,
    /// Locked memory against its budgets (the asking user's own included).
    #[serde(default)]
    pub memory: MemoryReport,
    /// How late the daemon's loop woke for its credit timer, and its longest turn.
    #[serde(default)]
    pub main_loop: LoopReport,
}

/// How punctual the daemon's loop is: a load starts when the loop wakes for it (its credit
/// timer, or a reader's access), so a wakeup late by more than a buffer's slack is a miss the
/// disk did not cause. Lateness is from the time the credit timer was set for, or the kernel's
/// time of the access, to the time the loop handled it; a turn is one wakeup's work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopReport {
    /// Credit-timer wakeups since the daemon started.
    pub timer_wakeups: u64,
    /// Median lateness of those wakeups, µs.
    pub late_p50_us: Option<u64>,
    /// 99th percentile of the same, µs.
    pub late_p99_us: Option<u64>,
    /// Latest wakeup, µs.
    pub late_max_us: Option<u64>,
    /// Longest turn of the loop (one wakeup's work, whatever woke it), µs.
    pub longest_turn_us: u64,
    /// Readers' accesses to streamed files the loop has handled.
    pub accesses: u64,
    /// Median time from a reader's access (the kernel's event) to the loop handling it, µs.
    pub access_p50_us: Option<u64>,
    /// 99th percentile of the same, µs.
    pub access_p99_us: Option<u64>,
    /// Longest, µs.
    pub access_max_us: Option<u64>,
}

/// Memory locked for playout buffers, against its budgets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Most bytes all streams together may lock.
    pub budget_bytes: u64,
    /// Most bytes one user's streams may lock (root's count only against the total).
    pub per_user_budget_bytes: u64,
    /// What all streams may lock at most (buffer plus a batch each): what the budget counts.
    pub reserved_bytes: u64,
    /// What all streams have locked now.
    pub locked_bytes: u64,
    /// What the asking user's streams may lock at most.
    pub yours_reserved_bytes: u64,
    /// What the asking user's streams have locked now.
    pub yours_locked_bytes: u64,
}

/// Automatic priority raises of readers, daemon-wide.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaiseReport {
    /// Whether the daemon raises readers at all.
    pub enabled: bool,
    /// Threads raised now.
    pub active: u64,
    /// Raises since the daemon started.
    pub total: u64,
    /// Threads put back to their earlier priority.
    pub restored: u64,
    /// Median time from the kernel's miss event to the priority being set, µs.
    pub latency_p50_us: Option<u64>,
    /// 99th percentile of the same, µs.
    pub latency_p99_us: Option<u64>,
    /// Longest, µs.
    pub latency_max_us: Option<u64>,
    /// Raises dropped because the thread used real-time priority for other files.
    #[serde(default)]
    pub policed: u64,
}

/// A managed device and its real-time budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// Kernel name (`sda`).
    pub name: String,
    /// Its number.
    pub device: DeviceNumber,
    /// Elevator now in use.
    pub elevator: String,
    /// Driver dispatch depth now in use.
    pub dispatch_depth: u32,
    /// Capacity the admission works with.
    pub capacity: ByteRate,
    /// Where the capacity figure comes from (configured, or a measured model).
    pub capacity_source: String,
    /// Share of the capacity that real-time streams may take, in percent; the rest is kept
    /// for best-effort traffic.
    pub realtime_share_percent: u32,
    /// Sum of the admitted streams' rates.
    pub reserved: ByteRate,
    /// The part of `reserved` that write streams (recordings) hold.
    #[serde(default)]
    pub reserved_write: ByteRate,
    /// What is left for new streams: with a model, the highest rate one more stream (with the
    /// default buffer) would be admitted at.
    pub free: ByteRate,
    /// Streams on the device.
    pub streams: u32,
    /// The admission mode (`share` without a model: the configured capacity times the share).
    #[serde(default)]
    pub admission: String,
    /// The admitted streams' predicted miss probability per service window, in parts per
    /// million (0 without a model).
    #[serde(default)]
    pub miss_probability_ppm: u32,
    /// The devices built on it (on it or its partitions, every level up), as
    /// `md0 (9:0, md raid1)`: the stacks whose files it serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub built_on: Vec<String>,
}
