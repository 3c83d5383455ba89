//! What a client is told of a stream: its rate, buffer and window, and what its recording
//! or automatic buffer is doing ([`StreamInfo`]).

use serde::{Deserialize, Serialize};

use crate::{ByteRate, ByteSize, DeviceNumber, StreamId};

/// A stream as `abissctl list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Stream id.
    pub id: StreamId,
    /// User that attached it.
    pub owner_uid: u32,
    /// The file's path, as the kernel names the attached descriptor.
    pub path: String,
    /// The filesystem device of the file.
    pub file_device: DeviceNumber,
    /// The disk that serves it: the first of `disks`.
    pub disk: DeviceNumber,
    /// Every disk that serves it, sorted: one, or each of a file system over several (a btrfs
    /// over two disks, an md or device-mapper array's members). Absent from daemons before it:
    /// read as empty, and `disk` alone then.
    #[serde(default)]
    pub disks: Vec<DeviceNumber>,
    /// What the file's storage stack costs the stream that abiss cannot take away, as whole
    /// sentences (a dm-crypt device that decrypts in its own workers); `abissctl attach` prints
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
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
