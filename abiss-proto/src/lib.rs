//! The protocol between `abissd` and its clients (`abissctl`, the client libraries).
//!
//! Messages are JSON objects, one per line, on the daemon's Unix stream socket. Every request
//! carries the protocol version; the daemon answers a request of another version with an
//! [`ErrorKind::VersionMismatch`] error and nothing else. The CLI never links the kernel side:
//! everything it knows about the daemon is in this crate.
//!
//! The protocol only: message types, their encoding, and the units and histogram arithmetic
//! both sides share. No file system access, no sockets, nothing of the kernel side or of the
//! device model (`abiss-model`).
//!
//! | concern | module |
//! | --- | --- |
//! | requests, responses, error kinds, the version, defaults, one JSON line per message ([`encode_line`], [`decode_line`]) | crate root (`lib.rs`) |
//! | log2 latency histograms, as bcc's biolatency prints them ([`Log2Histogram`]) | `histogram` |
//! | byte sizes and rates as people write them, `564KiB`, `1MiB/s` ([`ByteSize`], [`ByteRate`]) | re-exported from the `abiss-units` crate |
//! | why abissd said no: each refusal's error kind and sentence in one place ([`Refusal`]) | `refusal` |
//! | devices, operations and I/O priorities as users name them ([`DeviceNumber`], [`IoPriority`]) | `units` |
#![deny(missing_docs)]

mod histogram;
mod refusal;
mod units;

pub use abiss_units::{ByteRate, ByteSize, QuantityError};
pub use histogram::{Log2Histogram, LATENCY_BUCKETS};
pub use refusal::Refusal;
pub use units::{DeviceNumber, IoClass, IoPriority, Operation};

use serde::{Deserialize, Serialize};

/// Version of this protocol. Bump on any incompatible change of [`Request`] or [`Response`].
pub const PROTOCOL_VERSION: u32 = 4;

/// ABISS priority levels: 0 is the highest (real time only), 7 the default best effort.
pub const ABISS_LEVELS: u8 = 8;

/// Default ABISS level of a stream: real time.
pub const DEFAULT_LEVEL: u8 = 0;

/// Page size the playout window is managed in: the unit of `batch_pages`, of loading and of
/// locking.
pub const PAGE_BYTES: u64 = 4096;

/// Playout buffer of a stream when the client names none: the ABISS measurement's 564 KiB.
pub const DEFAULT_BUFFER_BYTES: u64 = 564 * 1024;

/// Pages per credit step of a stream when the client names none (80 KiB).
pub const DEFAULT_BATCH_PAGES: u32 = 20;

/// Where `abissd` listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/abiss/abiss.sock";

/// Environment variable that overrides [`DEFAULT_SOCKET`] for the daemon and its clients.
pub const SOCKET_ENV: &str = "ABISS_SOCKET";

/// Longest accepted message line, in bytes; longer lines are refused unread.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A request with its protocol version, as sent on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// What is asked.
    pub request: Request,
}

impl Envelope {
    /// Wraps a request in the current protocol version.
    #[must_use]
    pub fn new(request: Request) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            request,
        }
    }
}

/// What a client can ask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Who is there: answered with [`Response::Hello`].
    Hello,
    /// The cumulative latency histograms of every (device, operation, priority) seen since the
    /// daemon started; clients compute per-interval figures as differences.
    Latency,
    /// Answered with [`Response::Subscribed`] once the programs record request events, then
    /// one [`Response::Event`] per completed block request until the client hangs up.
    /// Unprivileged clients only see requests submitted by their own user.
    Events,
    /// eBPF program cost and daemon resource use, measured over `window_ms`. Kernel BPF run-time
    /// statistics are switched on only for that window.
    Stats {
        /// Length of the measurement window, in milliseconds (1 ms to 60 s).
        window_ms: u64,
    },
    /// Attach the file whose descriptor travels with this message (`SCM_RIGHTS`) as a stream.
    /// The daemon never opens a path for a client: the descriptor proves the client may read
    /// the file. Answered with [`Response::Attached`].
    Attach(AttachRequest),
    /// End a stream. Only its owner or root may. Answered with [`Response::Detached`].
    Detach {
        /// Which stream.
        target: StreamTarget,
    },
    /// Give a stream another rate (trick play: fast-forward, slow motion), if its disk admits
    /// it; its buffer and window stay. Only its owner or root may. Answered with
    /// [`Response::RateChanged`]; when refused, the stream keeps its rate.
    SetRate {
        /// Which stream.
        target: StreamTarget,
        /// The new rate.
        rate: ByteRate,
    },
    /// Thread `tid` of the caller's (its user's) is about to read stream `stream`: raise it
    /// to the stream's level now, as a miss would, so its first reads are not queued below the
    /// stream (`abissctl run` for the player it starts; the client library for its reading
    /// thread). Only the stream's owner or root may ask, and only for a thread of the same
    /// user; the raise is policed and put back like any other. Answered with
    /// [`Response::ReaderRaised`].
    ReaderStarts {
        /// The stream.
        stream: u64,
        /// The thread (a process id names its main thread).
        tid: u32,
    },
    /// The application's playout point moved to `offset` (ABISS's "position" message). A
    /// notification: the daemon does not answer it, so readers never wait for the daemon.
    Position {
        /// The stream.
        stream: u64,
        /// Byte offset the application has consumed up to.
        offset: u64,
        /// When the application was there (`CLOCK_MONOTONIC` ns): the daemon also sees the
        /// reads in the kernel, and orders the two kinds of evidence by time, so a message that
        /// arrives after the reader has moved on (a seek) does not pull the window back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// The streams (all for root, the caller's own otherwise). Answered with
    /// [`Response::Streams`].
    List,
    /// The managed devices and their budgets. Answered with [`Response::Devices`].
    Status,
    /// Capacity planning: how many streams of a kind fit on a managed device, and what miss
    /// probability a number of them would have. Attaches nothing. Answered with
    /// [`Response::Admission`].
    Admit(AdmitRequest),
}

/// A capacity-planning question for one managed device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmitRequest {
    /// The device: NAME, /dev/NAME or MAJOR:MINOR. abissd looks up no other path for a client
    /// (abissctl resolves paths to MAJOR:MINOR itself).
    pub device: String,
    /// Mean rate of each stream.
    pub rate: ByteRate,
    /// Standard deviation of each stream's rate over a service window (variable bit rate);
    /// 0 for a constant rate.
    #[serde(default)]
    pub rate_stdev: ByteRate,
    /// Playout buffer of each stream (its loads are a third of it).
    pub buffer: ByteSize,
    /// Pages per credit step of each stream ([`DEFAULT_BATCH_PAGES`] if not given): loads
    /// are whole batches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_pages: Option<u32>,
    /// Streams of this kind to evaluate next to those already admitted.
    pub count: Option<u32>,
    /// Admission mode to answer for (the daemon's own if not given).
    pub mode: Option<AdmissionMode>,
    /// Recording streams (written) instead of playback (read).
    #[serde(default)]
    pub write: bool,
}

/// How abissd decides whether streams fit a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdmissionMode {
    /// The worst-case service time of a window (longest seek, whole revolution, slowest zone)
    /// must fit: no miss is possible.
    Deterministic,
    /// The probability that a window's work overruns (TRAC) must stay at most `p_req`.
    Statistical,
    /// Everything is admitted (for measurements only).
    Off,
}

impl std::fmt::Display for AdmissionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Deterministic => "deterministic",
            Self::Statistical => "statistical",
            Self::Off => "off",
        })
    }
}

impl std::str::FromStr for AdmissionMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "deterministic" => Ok(Self::Deterministic),
            "statistical" => Ok(Self::Statistical),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "'{s}' is not an admission mode (deterministic, statistical or off)"
            )),
        }
    }
}

/// The answer to [`AdmitRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmissionReport {
    /// The device's name.
    pub device: String,
    /// The mode answered for.
    pub mode: AdmissionMode,
    /// The miss probability admission allows per service window.
    pub p_req: f64,
    /// The service window, ms.
    pub window_ms: u64,
    /// Share of the device's time real-time streams may use, percent.
    pub realtime_share_percent: u32,
    /// Where the figures come from (a measured model, or the configured capacity).
    pub model_source: String,
    /// Streams already admitted on the device.
    pub admitted_streams: u32,
    /// Their predicted miss probability (`None` without a model).
    pub current_miss_probability: Option<f64>,
    /// How many streams of the kind asked about fit next to them (`None`: admission is off).
    pub n_max: Option<u32>,
    /// The streams asked about (`count`).
    pub count: Option<u32>,
    /// Predicted probability that a read waits with `count` more such streams: that the
    /// real-time backlog outgrows the least buffered stream's slack (`None` without a model).
    /// In deterministic mode a bound: 0 while the worst case fits, else 1.
    pub miss_probability: Option<f64>,
    /// Whether `count` more such streams would be admitted.
    pub fits: Option<bool>,
    /// TRAC's per-window overcommit probability with `count` more such streams: that a
    /// service window's work exceeds the real-time share (`None` without a model). The miss
    /// probability above also counts what the playout buffers absorb.
    #[serde(default)]
    pub window_overrun_probability: Option<f64>,
}

/// Parameters of a new stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent wire flags, each absent for older clients; no two form a state machine"
)]
pub struct AttachRequest {
    /// Guaranteed byterate.
    pub rate: ByteRate,
    /// Playout buffer: how far ahead of the application's playout point data is kept loaded.
    pub buffer: ByteSize,
    /// Pages loaded per credit step.
    pub batch_pages: u32,
    /// ABISS priority level, 0 (highest, real time) to 7 (best effort).
    pub priority: u8,
    /// Whether the stream outlives the connection (until an explicit detach). Otherwise it ends
    /// when the client's connection closes.
    pub persistent: bool,
    /// A recording: the application writes the file at the rate, and abissd writes its dirty
    /// pages back behind it (the write-behind window of `buffer`) instead of reading ahead.
    /// The descriptor must then be open for writing. Absent (older clients): a read stream.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write: bool,
    /// For a write stream: allocate the file a few seconds of the rate ahead of the writer
    /// (`fallocate` with `KEEP_SIZE`, at most 64 MiB), so it is laid out in large extents.
    /// Off by default: on ext4 it delays the writer's writes (docs/user-guide.md, "Recordings").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preallocate: bool,
    /// For a write stream: the client writes the file past the page cache itself (`O_DIRECT`,
    /// from a ring it owns, `abissctl record`), so abissd runs no write-behind and allocates
    /// nothing for it; it admits the stream and raises the thread that writes
    /// ([`Request::ReaderStarts`] with the writer's id), whose real-time writes of the file are
    /// policed against the stream's rate and buffer like a reader's reads. Absent (older
    /// clients): the page-cache write stream. An older daemon ignores it and writes back
    /// pages the direct writes never dirty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// For a read stream: load this much of the file's head at once when the stream starts,
    /// beyond its buffer (a player's start-up probe), locked until the reader passes it, and
    /// the file's last 512 KiB with it (players read the end for the duration). It comes out
    /// of the start-up allowance and counts against the locked-memory budgets.
    /// Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preroll: Option<ByteSize>,
    /// Size the buffer from the disk (`--buffer auto`): `buffer` is then the application's
    /// own part (it may be 0), and abissd adds what the disk's measured latency tail in the
    /// stream's priority class takes at the stream's rate, growing it as the tail grows, within the locked-memory
    /// budgets. Absent: `buffer` is the whole buffer, fixed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub buffer_auto: bool,
}

/// A stream named by id, or by the file it streams.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamTarget {
    /// By stream id.
    Id(u64),
    /// By file identity.
    File {
        /// Filesystem device.
        device: DeviceNumber,
        /// Inode number.
        inode: u64,
    },
}

/// A stream as `abissctl list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Stream id.
    pub id: u64,
    /// User that attached it.
    pub owner_uid: u32,
    /// The file's path, as the kernel names the attached descriptor.
    pub path: String,
    /// The filesystem device of the file.
    pub file_device: DeviceNumber,
    /// The disk that serves it.
    pub disk: DeviceNumber,
    /// Inode number.
    pub inode: u64,
    /// File size in bytes.
    pub file_bytes: u64,
    /// Granted rate.
    pub rate: ByteRate,
    /// Playout buffer.
    pub buffer: ByteSize,
    /// Pages per credit step.
    pub batch_pages: u32,
    /// ABISS level.
    pub priority: u8,
    /// Outlives its connection.
    pub persistent: bool,
    /// Where the application is (bytes).
    pub playout_point: u64,
    /// Start of the loaded window (the kernel playout point), bytes.
    pub window_start: u64,
    /// End of what is loaded or being loaded, bytes.
    pub loaded_end: u64,
    /// Bytes of the window in memory (loaded).
    pub resident_bytes: u64,
    /// Bytes locked in memory.
    pub locked_bytes: u64,
    /// Credit in bytes (negative after a refill charged ahead).
    pub credit_bytes: i64,
    /// Tasks seen reading the file recently.
    pub readers: Vec<ReaderInfo>,
    /// Reads that had to wait for the disk for data the window should have held (deadline
    /// misses).
    pub misses: u64,
    /// Reads that waited for the window a seek asked for, while it was being loaded: the
    /// seek's own cost, not a miss.
    #[serde(default)]
    pub seek_waits: u64,
    /// Bytes loaded by the stream's prefetch.
    pub prefetched_bytes: u64,
    /// Reader threads raised to the stream's priority after a page-cache miss, so far. (On the
    /// wire by its name from before the code said "raise".)
    #[serde(default, rename = "upgrades")]
    pub raises: u64,
    /// `io_uring` requests readers submitted on the file, so far.
    #[serde(default)]
    pub uring_requests: u64,
    /// Advice when the stream keeps missing: a larger buffer, say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// The owner's start-up allowance could not cover the first fill: the window fills at
    /// the stream's rate, so waiting for it to be loaded is pointless.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub start_limited: bool,
    /// Readers whose raise was dropped because they used it for other files.
    #[serde(default)]
    pub policed: u64,
    /// What a write stream has done, `None` for a read stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recording: Option<RecordingInfo>,
    /// Why the buffer has its size, for a buffer abissd sizes (`--buffer auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_auto: Option<AutoBufferInfo>,
}

/// How abissd sized a stream's buffer from its disk (`--buffer auto`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoBufferInfo {
    /// The application's own part.
    pub app_bytes: u64,
    /// The latency tail the buffer covers: the disk's measured p99 of queue plus service time
    /// of the requests in the stream's priority class over the last seconds; while too few
    /// such requests were seen, an estimate from the p99 of service time of all the disk's
    /// requests where that is longer than the default, else the default.
    pub tail_us: u64,
    /// Whether `tail_us` was measured in the stream's class.
    pub measured: bool,
    /// Whether `tail_us`, not measured in the stream's class, was estimated from the disk's
    /// other requests (else it is the default); absent from older daemons.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// The buffer would be larger but the locked-memory budgets have no room.
    pub capped: bool,
    /// The buffer was made larger than the tail asks so that the disk's admission holds the
    /// stream next to the others: fewer, larger loads spend less of the disk on seeks. The
    /// size it was given for that (the owner's other automatic streams on the disk were grown
    /// to it too); absent from older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_capacity_bytes: Option<u64>,
}

/// A write stream's write-behind window, as `abissctl list` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordingInfo {
    /// How far the application has written (the file's size when abissd last looked).
    pub written_end: u64,
    /// Up to where abissd has written the file back and released its pages.
    pub written_back_end: u64,
    /// Bytes abissd wrote back so far.
    pub written_back_bytes: u64,
    /// Dirty and under-writeback bytes of the file in the page cache (`cachestat`), if the
    /// kernel can say (Linux 6.5); else what the application wrote beyond the written-back end.
    pub dirty_bytes: u64,
    /// Room left in the write-behind window before the application has written more than its
    /// buffer ahead of what is written back (negative: it is ahead of its reservation, and its
    /// writes may be throttled with everyone else's).
    pub headroom_bytes: i64,
    /// Space allocated ahead of the application's end (`fallocate` with `KEEP_SIZE`).
    pub preallocated_end: u64,
    /// Bytes abissd allocated for the stream so far.
    pub preallocated_bytes: u64,
    /// Its client writes it past the page cache (`abissctl record`): nothing is dirty or
    /// written back by abissd; `written_end` is the file's size.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
}

/// A task that reads a stream's file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderInfo {
    /// Process id.
    pub pid: u32,
    /// Command name.
    pub comm: String,
    /// Whether a thread of it runs at the stream's priority after a miss (on the wire by its
    /// earlier name).
    #[serde(default, rename = "upgraded")]
    pub raised: bool,
}

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

/// What [`Request::Status`] answers: the managed devices, the reader raises, what the daemon
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
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello {
        /// The daemon's [`PROTOCOL_VERSION`].
        version: u32,
        /// The daemon's process id.
        pid: u32,
        /// The running kernel's release.
        kernel: String,
    },
    /// Answer to [`Request::Latency`].
    Latency {
        /// Monotonic time of the snapshot, in ns.
        taken_ns: u64,
        /// One group per (device, operation, priority) seen so far.
        groups: Vec<LatencyGroup>,
    },
    /// The first answer to [`Request::Events`]: request events are recorded from now on, so
    /// a client may start the I/O it wants to see.
    Subscribed,
    /// One completed block request (a stream of these follows [`Response::Subscribed`]).
    Event(RequestRecord),
    /// Answer to [`Request::Stats`].
    Stats(StatsReport),
    /// Answer to [`Request::Attach`].
    Attached(StreamInfo),
    /// Answer to [`Request::Detach`].
    Detached {
        /// The stream that ended.
        stream: u64,
    },
    /// Answer to [`Request::ReaderStarts`].
    ReaderRaised {
        /// Whether the thread is at the stream's level now (false: it was already, or reader
        /// raises are off, or it cannot be raised; the stream works either way).
        raised: bool,
    },
    /// Answer to [`Request::SetRate`]: the stream as it is now.
    RateChanged(StreamInfo),
    /// Answer to [`Request::List`].
    Streams {
        /// The streams.
        streams: Vec<StreamInfo>,
    },
    /// Answer to [`Request::Admit`].
    Admission(AdmissionReport),
    /// Answer to [`Request::Status`].
    Devices(StatusReport),
    /// The request failed; nothing was changed.
    Error {
        /// What kind of failure, for the client's exit code.
        error: ErrorKind,
        /// One sentence for a person: what is wrong and what to do.
        message: String,
    },
}

/// Failure classes a client can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request could not be parsed or has invalid arguments.
    BadRequest,
    /// The client speaks another protocol version.
    VersionMismatch,
    /// The peer may not do this.
    PermissionDenied,
    /// Something failed inside the daemon.
    Internal,
    /// Admission control refused: the rate does not fit, or too many streams.
    Refused,
    /// No such stream.
    NotFound,
    /// No such device, or the daemon does not manage it.
    UnknownDevice,
    /// The device's saved model is corrupt or describes another device.
    ModelUnusable,
}

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
    pub stream: Option<u64>,
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
    pub fn key(&self) -> (DeviceNumber, Operation, IoPriority, Option<u64>) {
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
    pub stream: Option<u64>,
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

/// Errors of reading or writing a protocol line.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The line is not a valid message.
    #[error("malformed message: {source}")]
    Malformed {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("message longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
}

/// Encodes a message as one line (with the trailing newline).
pub fn encode_line<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let mut line = serde_json::to_vec(message).map_err(|source| WireError::Malformed { source })?;
    line.push(b'\n');
    Ok(line)
}

/// Decodes one line (with or without its newline).
pub fn decode_line<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, WireError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(WireError::TooLong);
    }
    serde_json::from_slice(line.trim_ascii_end()).map_err(|source| WireError::Malformed { source })
}

/// Why a request line is not a request of this protocol version.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The line is not a message, or not a request.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The client speaks another protocol version (whatever its request looks like).
    #[error("the client speaks protocol {0} but this abissd speaks {PROTOCOL_VERSION}; use matching versions of abissctl and abissd")]
    OtherVersion(u32),
}

/// Decodes a request line, checking its version before its request: a request kind or
/// field of another protocol version is that version's, not a malformed message.
pub fn decode_envelope(line: &[u8]) -> Result<Envelope, EnvelopeError> {
    /// Only the version; serde skips the rest, whatever it is.
    #[derive(Deserialize)]
    struct VersionOnly {
        version: u32,
    }
    let VersionOnly { version } = decode_line(line)?;
    if version != PROTOCOL_VERSION {
        return Err(EnvelopeError::OtherVersion(version));
    }
    Ok(decode_line(line)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_is_told_before_its_request_is_read() {
        let line = br#"{"version":999,"request":{"kind":"teleport","to":"mars"}}"#;
        assert!(matches!(
            decode_envelope(line),
            Err(EnvelopeError::OtherVersion(999))
        ));
        let line = format!(r#"{{"version":{PROTOCOL_VERSION},"request":{{"kind":"teleport"}}}}"#);
        assert!(matches!(
            decode_envelope(line.as_bytes()),
            Err(EnvelopeError::Wire(WireError::Malformed { .. }))
        ));
        let hello = encode_line(&Envelope::new(Request::Hello)).unwrap();
        assert_eq!(decode_envelope(&hello).unwrap().request, Request::Hello);
        assert!(matches!(
            decode_envelope(br#"{"request":{"kind":"hello"}}"#),
            Err(EnvelopeError::Wire(_))
        ));
    }

    #[test]
    fn requests_round_trip_through_a_line() {
        for request in [
            Request::Hello,
            Request::Latency,
            Request::Events,
            Request::Stats { window_ms: 1000 },
        ] {
            let line = encode_line(&Envelope::new(request.clone())).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let back: Envelope = decode_line(&line).unwrap();
            assert_eq!(back.request, request);
            assert_eq!(back.version, PROTOCOL_VERSION);
        }
    }

    /// A direct recording's flag travels, and is absent from a request without it, so an
    /// older daemon reads such a request as before.
    #[test]
    fn a_direct_recording_round_trips_and_is_absent_by_default() {
        let request = AttachRequest {
            rate: ByteRate(1_000_000),
            buffer: ByteSize(2 << 20),
            batch_pages: DEFAULT_BATCH_PAGES,
            priority: DEFAULT_LEVEL,
            persistent: false,
            write: true,
            preallocate: false,
            direct: true,
            preroll: None,
            buffer_auto: false,
        };
        let line = encode_line(&Envelope::new(Request::Attach(request.clone()))).unwrap();
        assert!(String::from_utf8_lossy(&line).contains(r#""direct":true"#));
        let back: Envelope = decode_line(&line).unwrap();
        assert_eq!(back.request, Request::Attach(request.clone()));
        let plain = AttachRequest {
            direct: false,
            ..request
        };
        let line = encode_line(&Envelope::new(Request::Attach(plain))).unwrap();
        assert!(!String::from_utf8_lossy(&line).contains("direct"));
    }

    #[test]
    fn garbage_and_oversized_lines_are_refused() {
        assert!(matches!(
            decode_line::<Envelope>(b"{not json"),
            Err(WireError::Malformed { .. })
        ));
        let long = vec![b' '; MAX_LINE_BYTES + 1];
        assert!(matches!(
            decode_line::<Envelope>(&long),
            Err(WireError::TooLong)
        ));
    }
}
