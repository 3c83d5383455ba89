//! Attached files and what tasks do with them: the keys and values of the attached-file
//! maps, the playout ring's events, `io_uring` submissions, and the bounds of those maps.

use crate::COMM_LEN;

/// Files attached as streams at once.
pub const MAX_ATTACHED_FILES: u32 = 1024;

/// Size of the ring buffer that carries reads of attached files to abissd, in bytes.
pub const PLAYOUT_RING_BYTES: u32 = 256 << 10;

/// A file as the kernel names it: filesystem device and inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// Filesystem device (`dev_t` kernel encoding, `s_dev`).
    pub dev: u32,
    /// Padding, always zero so keys compare bytewise.
    pub pad: u32,
    /// Inode number.
    pub ino: u64,
}

/// What the programs know of an attached file. A file may have several streams (viewers of one
/// file, a recording watched while it is recorded); the programs see one entry for all of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttachedFile {
    /// The file's tag: the id of its first stream, kept while any of its streams lives. Block
    /// requests and page-cache events carry it; abissd finds the stream among the file's.
    pub stream: u64,
    /// The most urgent ABISS level among the file's streams (the numerically smallest): a
    /// request queued below it is reported, and abissd decides by the reader's own stream
    /// whether it is low for that stream. The least urgent, as before, let one owner's level-7
    /// stream turn off the reports, and so the raises, of another's level-0 stream.
    pub level: u8,
    /// Padding.
    pub pad: [u8; 3],
    /// The users whose reads and faults of the file are reported (the streams' owners; two
    /// slots, the same user twice when one owns them all), or [`ANY_READER`]. Reads by other
    /// users steer nothing in abissd, so the page-cache programs do not spend the shared
    /// `PLAYOUT` ring on them: one user reading another's attached file in a tight loop would
    /// otherwise crowd every stream's misses out of the ring.
    pub reader_uids: [u32; 2],
    /// Padding.
    pub pad2: u32,
}

/// A [`AttachedFile::reader_uids`] slot under which every reader is reported (root's streams:
/// root attaches files for services that read them under their own users; and files whose
/// streams belong to more than two users).
pub const ANY_READER: u32 = u32::MAX;

impl AttachedFile {
    /// File tag `stream` at ABISS `level`, whose reads by the users `reader_uids` are reported.
    #[must_use]
    pub const fn new(stream: u64, level: u8, reader_uids: [u32; 2]) -> Self {
        Self {
            stream,
            level,
            pad: [0; 3],
            reader_uids,
            pad2: 0,
        }
    }

    /// Whether a read by user `uid` is reported.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
    )]
    #[inline(always)]
    pub const fn reports(&self, uid: u32) -> bool {
        let [first, second] = self.reader_uids;
        first == ANY_READER || second == ANY_READER || first == uid || second == uid
    }
}

/// What a task did with an attached file ([`PlayoutEvent::kind`]).
pub mod playout_kind {
    /// A read(2)-family call asked the page cache for pages.
    pub const READ: u32 = 1;
    /// A fault on a mapping of the file.
    pub const FAULT: u32 = 2;
    /// A read missed the page cache and started synchronous readahead: the reader waits.
    pub const MISS: u32 = 3;
    /// A task queued a read request of the stream's file below the stream's level: it is
    /// about to wait for the disk at a lower priority (direct I/O included, which never
    /// misses the page cache).
    pub const QUEUED_LOW: u32 = 6;
    /// An `io_uring` request on the file completed: the task is its submitter,
    /// [`super::PlayoutEvent::ioprio`] its priority and [`super::PlayoutEvent::latency_ns`] how long it took
    /// from submission.
    pub const URING_COMPLETE: u32 = 5;
    /// The task added pages of the file to the page cache: it missed and reads from the disk
    /// itself. The stand-in for [`MISS`] on kernels without `page_cache_sync_ra` (before
    /// 6.18); the pages may be readahead beyond where the task reads, so they tell no position.
    pub const FILLED: u32 = 7;
}

/// The last `FILLED` report sent from a CPU: a readahead adds many pages in one go, reported
/// once (per task and stream, within [`FILL_REPORT_GAP_NS`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillReport {
    /// When it was sent.
    pub ts_ns: u64,
    /// Its stream.
    pub stream: u64,
    /// Its task (thread id).
    pub pid: u32,
    /// Explicit padding.
    pub pad: u32,
}

/// Pages a task adds to one stream's file within this long of its last `FILLED` report belong
/// to the same miss (a readahead inserts its pages within microseconds).
pub const FILL_REPORT_GAP_NS: u64 = 2_000_000;

/// Reads and faults of one attached file by one user are reported at most one per this long on
/// average, after a burst of [`READ_REPORT_BURST`] (a token bucket per file and user, kept as
/// the time its next token is due): an owner rereading its own file in a tight loop would
/// otherwise send a record per read(2) into the ring every stream shares, and crowd other
/// users' misses out of it. Per user, so a co-owner's loop spends its own bucket, not the
/// other owner's. This bounds reads and faults to 10 000 records a second per attached file
/// and owner. Misses are never
/// left out, and a read left out is followed by the reader's next one (whose position is the
/// newer) or by its miss.
pub const READ_REPORT_GAP_NS: u64 = 100_000;

/// Reads and faults of one file reported at once before [`READ_REPORT_GAP_NS`] paces them: a
/// player's start-up probe (ffmpeg reads 5 MB in 160 reads within milliseconds) and `dd`'s
/// 2 MiB in 64 KiB reads go through whole, so the window follows them to their last read.
pub const READ_REPORT_BURST: u64 = 256;

/// Token buckets of [`READ_REPORT_GAP_NS`] kept at once, one per (attached file, reading
/// user): two owners for each attached file, least recently used forgotten first (a forgotten
/// bucket starts full again).
pub const READ_REPORT_BUCKETS: u32 = 2 * MAX_ATTACHED_FILES;

/// A task's access to an attached file, sent to abissd (the daemon's own reads are left out).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlayoutEvent {
    /// When (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Stream id.
    pub stream: u64,
    /// First page index touched.
    pub first_page: u64,
    /// Last page index touched.
    pub last_page: u64,
    /// Process id.
    pub tgid: u32,
    /// Thread id.
    pub pid: u32,
    /// See [`playout_kind`].
    pub kind: u32,
    /// I/O priority of an `io_uring` submission (encoded), else zero.
    pub ioprio: u32,
    /// Submission to completion of an `io_uring` request, else zero.
    pub latency_ns: u64,
    /// User id of the task.
    pub uid: u32,
    /// Padding.
    pub pad: u32,
    /// Command name.
    pub comm: [u8; COMM_LEN],
}

/// An `io_uring` request between submission and completion.
///
/// The request's file is only known at completion (the kernel assigns it when the request is
/// issued, after the submission tracepoint), so the submissions of processes seen reading an
/// attached file are remembered, and matched to a stream at completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringSubmission {
    /// Submission time (`bpf_ktime_get_ns`).
    pub submitted_ns: u64,
    /// Submitting process (the ring's owner, or its SQPOLL thread's).
    pub tgid: u32,
    /// Submitting thread.
    pub pid: u32,
    /// The submitting task's user, whose [`MAX_URING_INFLIGHT_PER_USER`] the request counts
    /// against until it completes or is dropped.
    pub uid: u32,
    /// Padding.
    pub pad: u32,
}

/// `io_uring` requests of readers of attached files followed at once, between submission and
/// completion: [`MAX_URING_INFLIGHT_PER_USER`] for each of 64 users.
pub const MAX_URING_INFLIGHT: u32 = 16_384;

/// `io_uring` requests one user's readers may have followed at once. Every request of a
/// process seen reading an attached file is followed (its file is only known at completion),
/// and one that never completes (a poll, or a read, on a pipe nobody writes) stays until
/// abissd drops it as stale ([`STALE_URING_NS`]): without a bound per user, one user's 4 096
/// such requests filled the table every user's requests need. Past it only that user's own
/// further requests go unfollowed (and unreported).
pub const MAX_URING_INFLIGHT_PER_USER: u64 = 256;

/// Users whose followed `io_uring` requests, or whose followed readers, are counted at once
/// (the `URING_USERS` and `READER_USERS` maps): as many as readers can be followed.
pub const MAX_URING_USERS: u32 = MAX_FILE_READERS;

/// Age after which abissd drops a followed `io_uring` request (and gives its user's count
/// back): a read of an attached file on a managed disk completes long before; what is left is
/// a request that does not read a stream (a poll on a socket or a pipe), or one whose
/// completion was never seen.
pub const STALE_URING_NS: u64 = 60_000_000_000;

/// Processes followed as readers of attached files at once (only their `io_uring` submissions
/// are followed): [`MAX_FILE_READERS_PER_USER`] for each of 64 users.
pub const MAX_FILE_READERS: u32 = 16_384;

/// Processes of one user followed as readers at once. Past it, that user's further reader
/// processes are not followed (their `io_uring` reads go unreported) until abissd's sweep finds
/// some of the user's followed processes gone and gives their room back. Before, the table was
/// one least-recently-used map of 4 096 for everyone, and one user's short-lived readers pushed
/// every other user's out.
pub const MAX_FILE_READERS_PER_USER: u64 = 256;

/// A process followed as a reader of an attached file (`FILE_READERS`, by process id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileReader {
    /// The tag of the stream it was last seen reading.
    pub stream: u64,
    /// The user it was seen as when it was first followed, whose
    /// [`MAX_FILE_READERS_PER_USER`] it counts against until abissd sweeps it out.
    pub uid: u32,
    /// Padding.
    pub pad: u32,
}
