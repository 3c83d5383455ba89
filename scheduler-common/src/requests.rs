//! Requests in flight and completed: their records and events, the latency histograms
//! and their slots, the block operations, and the bounds of those maps.

use crate::COMM_LEN;

/// Number of log2 buckets in a latency histogram. Bucket `i` counts latencies in
/// `[2^(i-1), 2^i)` microseconds (bucket 0 holds latencies under 1 µs); the last bucket also
/// holds everything longer. 27 buckets reach about 67 s, as bcc's biolatency does.
pub const LATENCY_SLOTS: usize = 27;

/// Request records kept at once. Records are keyed by the address of the kernel's `struct
/// request`, and blk-mq recycles a fixed pool of those per device (its tags), so a record is
/// reused in place for each new request in the same slot instead of being inserted and deleted
/// (map updates and deletes are the expensive part of tracing). abissd deletes records idle for
/// [`STALE_REQUEST_NS`], so the map holds only the pools of recently active devices.
pub const MAX_INFLIGHT: u32 = 16_384;

/// Age after which abissd drops a request record: an idle slot, or a request that vanished
/// without completing.
pub const STALE_REQUEST_NS: u64 = 60_000_000_000;

/// Life cycle of a request record ([`InflightRequest::state`]).
pub mod request_state {
    /// The slot's last request completed or was merged away; the record is free for reuse.
    pub const DONE: u32 = 0;
    /// Inserted into the elevator, not yet dispatched.
    pub const QUEUED: u32 = 1;
    /// Dispatched to the driver.
    pub const ISSUED: u32 = 2;
    /// Requeued after its dispatch: back to the queue, keeping its queue start, until its
    /// next insert or issue. Only this state survives an insert: any other record found at
    /// insert is left over from an earlier request in the slot (one whose completion was not
    /// traced), and is started afresh.
    pub const REQUEUED: u32 = 3;
}

/// Distinct (device, operation, priority, stream) histogram keys kept. abissd folds the keys
/// of an ended stream into their stream-less key, so the map holds the live streams' keys
/// and not those of every stream ever attached.
pub const MAX_HISTOGRAM_KEYS: u32 = 4_096;

/// Size of the ring buffer that carries per-request events to user space, in bytes.
pub const EVENT_RING_BYTES: u32 = 1 << 20;

/// Kernel block operation (`REQ_OP_*`, the low 8 bits of `cmd_flags`).
pub mod op {
    /// `REQ_OP_READ`
    pub const READ: u8 = 0;
    /// `REQ_OP_WRITE`
    pub const WRITE: u8 = 1;
    /// `REQ_OP_FLUSH`
    pub const FLUSH: u8 = 2;
    /// `REQ_OP_DISCARD`
    pub const DISCARD: u8 = 3;
    /// `REQ_OP_WRITE_ZEROES`
    pub const WRITE_ZEROES: u8 = 9;
    /// Mask of the operation in `cmd_flags` / `bi_opf`.
    pub const MASK: u32 = 0xff;
}

/// Key of the latency histograms: one per device, operation and I/O priority.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistogramKey {
    /// Device number of the disk, in the kernel's `dev_t` encoding (major << 20 | minor).
    pub dev: u32,
    /// Block operation, see [`op`].
    pub op: u8,
    /// I/O priority class of the request, see [`ioprio`].
    pub class: u8,
    /// I/O priority level within the class.
    pub level: u8,
    /// Padding; always zero so keys compare bytewise.
    pub pad: u8,
    /// Stream whose file the request's pages belong to, zero for none.
    pub stream: u64,
}

/// Per-CPU latency histogram of one [`HistogramKey`]. Counters are cumulative since load.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyCounters {
    /// Completed requests.
    pub requests: u64,
    /// Bytes of the completed requests.
    pub bytes: u64,
    /// Longest queue time seen, in ns.
    pub queue_max_ns: u64,
    /// Longest service time seen, in ns.
    pub service_max_ns: u64,
    /// Requests of a stream that ran at a lower priority than the stream's level.
    pub inversions: u64,
    /// Queue time (insert → issue) in log2 µs buckets.
    pub queue_slots: [u64; LATENCY_SLOTS],
    /// Service time (issue → complete) in log2 µs buckets.
    pub service_slots: [u64; LATENCY_SLOTS],
}

impl LatencyCounters {
    /// An all-zero histogram.
    pub const ZERO: Self = Self {
        requests: 0,
        bytes: 0,
        queue_max_ns: 0,
        service_max_ns: 0,
        inversions: 0,
        queue_slots: [0; LATENCY_SLOTS],
        service_slots: [0; LATENCY_SLOTS],
    };
}

impl LatencyCounters {
    /// Adds `other`'s counts to these (and keeps the longer maxima): a histogram that covers
    /// both.
    pub fn add(&mut self, other: &Self) {
        self.requests += other.requests;
        self.bytes += other.bytes;
        self.queue_max_ns = self.queue_max_ns.max(other.queue_max_ns);
        self.service_max_ns = self.service_max_ns.max(other.service_max_ns);
        self.inversions += other.inversions;
        for (sum, slot) in self.queue_slots.iter_mut().zip(other.queue_slots) {
            *sum += slot;
        }
        for (sum, slot) in self.service_slots.iter_mut().zip(other.service_slots) {
            *sum += slot;
        }
    }
}

impl Default for LatencyCounters {
    fn default() -> Self {
        Self::ZERO
    }
}

/// Who a request is for: the submitting task and the file whose pages it carries. Gathered at
/// the request's first sight only while someone reads per-request events, because it costs
/// several helper calls and probe reads per request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestOrigin {
    /// Inode number of the page-cache pages the request carries, zero if none.
    pub ino: u64,
    /// Device of the filesystem holding that inode (`dev_t` encoding).
    pub ino_dev: u32,
    /// Process id (thread group id) of the submitter.
    pub tgid: u32,
    /// Thread id of the submitter.
    pub pid: u32,
    /// Real user id of the submitter.
    pub uid: u32,
    /// Command name of the submitter.
    pub comm: [u8; COMM_LEN],
}

/// A request between its first sight (insert or issue) and its completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InflightRequest {
    /// Start of the queue time: `block_rq_insert`, or the issue time for requests that skip
    /// the elevator (their queue time is zero, as in biolatency).
    pub queued_ns: u64,
    /// `block_rq_issue` time, zero until issued.
    pub issued_ns: u64,
    /// First sector.
    pub sector: u64,
    /// Disk (`dev_t` encoding).
    pub dev: u32,
    /// Bytes.
    pub bytes: u32,
    /// Block operation.
    pub op: u8,
    /// I/O priority class.
    pub class: u8,
    /// I/O priority level.
    pub level: u8,
    /// Non-zero when a [`RequestOrigin`] was recorded for this request.
    pub attributed: u8,
    /// See [`request_state`].
    pub state: u32,
    /// ABISS level of the stream ([`InflightRequest::stream`]), if any.
    pub stream_level: u8,
    /// Padding.
    pub pad: [u8; 7],
    /// Stream whose attached file the request's pages belong to, zero for none.
    pub stream: u64,
}

/// One completed request, sent over the ring buffer while a client streams events.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestEvent {
    /// Completion time (`bpf_ktime_get_ns`, `CLOCK_MONOTONIC`).
    pub completed_ns: u64,
    /// Queue time in ns.
    pub queue_ns: u64,
    /// Service time in ns.
    pub service_ns: u64,
    /// The request as it was tracked.
    pub request: InflightRequest,
    /// Its submitter and file (zero if it was first seen before events were switched on).
    pub origin: RequestOrigin,
    /// Completion status (`blk_status_t`), zero on success.
    pub error: u32,
    /// Padding.
    pub pad: u32,
}

/// Index of the log2 µs bucket for a latency in ns.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called from eBPF programs, where every call that is not inlined costs a BPF-to-BPF call frame"
)]
#[inline(always)]
pub fn latency_slot(ns: u64) -> usize {
    let us = ns / 1000;
    // Bit length of `us`: 0 → 0, 1 → 1, 2..3 → 2, ...
    let bits = (64 - us.leading_zeros()) as usize;
    if bits >= LATENCY_SLOTS {
        LATENCY_SLOTS - 1
    } else {
        bits
    }
}
