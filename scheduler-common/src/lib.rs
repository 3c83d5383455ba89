//! The kernel–user ABI of abiss.
//!
//! Every type that crosses between the eBPF programs (`scheduler-ebpf`) and the daemon (`abissd`)
//! is defined here once, as `#[repr(C)]` plain data. The eBPF side uses the types directly; the
//! user side enables the `user` feature, which implements `aya::Pod` for them.
//!
//! `no_std`, and nothing but the ABI: sizes, keys, values, events, constants and the few
//! `const`/inline functions both sides must compute alike. No policy, no allocation, no I/O.
//! Every layout is pinned by a size assertion, so a change is a deliberate change on both sides.
//!
//! Requires Linux 5.15 or newer with BTF (`/sys/kernel/btf/vmlinux`) for the core; the optional
//! parts need newer kernels (docs/kernels.md). Verified on 6.18.
//!
//! | concern | module or item |
//! | --- | --- |
//! | kernel struct offsets, filled in from BTF by abissd ([`KernelLayout`]) | crate root |
//! | switches abissd flips while the programs run ([`Control`]) | crate root |
//! | latency histograms: [`HistogramKey`], [`LatencyCounters`], [`latency_slot`] | crate root |
//! | requests in flight and completed: [`InflightRequest`], [`RequestOrigin`], [`RequestEvent`] | crate root |
//! | attached files and what tasks do with them: [`FileKey`], [`AttachedFile`], [`PlayoutEvent`], [`UringSubmission`] | crate root |
//! | threads abissd raised, and the tasks they made since ([`RaisedThread`], [`ForkEvent`], [`raised_flags`]) | crate root |
//! | a request record's life cycle | [`request_state`] |
//! | which disks the block programs follow, managed or traced (values of the `DISKS` map) | [`disk_flags`] |
//! | kinds of [`PlayoutEvent`] | [`playout_kind`] |
//! | kernel block operations (`REQ_OP_*`) | [`op`] |
//! | kernel I/O priority encoding | [`ioprio`] |
//! | ABISS levels ↔ kernel I/O priorities | [`abiss_level`] |
//! | `aya::Pod` for every type (`user` feature) | `pod` |
#![no_std]
#![deny(missing_docs)]

pub mod names;

/// Number of log2 buckets in a latency histogram. Bucket `i` counts latencies in
/// `[2^(i-1), 2^i)` microseconds (bucket 0 holds latencies under 1 µs); the last bucket also
/// holds everything longer. 27 buckets reach about 67 s, as bcc's biolatency does.
pub const LATENCY_SLOTS: usize = 27;

/// Length of a task's command name, as in the kernel's `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

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

/// Disks the block programs follow, at most (managed disks, and disks traced on their own).
pub const MAX_DISKS: u32 = 256;

/// What the programs do with a disk's requests (the values of the `DISKS` map, keyed by the
/// disk's `dev_t` in the kernel's encoding). A disk in neither state costs one lookup per
/// block event and nothing else.
pub mod disk_flags {
    /// Managed by abissd: requests are tagged with their stream and checked against its level.
    pub const MANAGED: u32 = 1;
    /// Traced: requests are followed to completion and added to the latency histograms.
    /// Managed disks always are; with [`super::Control::trace_all`] set, every disk is.
    pub const TRACED: u32 = 2;
}

/// Distinct (device, operation, priority, stream) histogram keys kept. abissd folds the keys
/// of an ended stream into their stream-less key, so the map holds the live streams' keys
/// and not those of every stream ever attached.
pub const MAX_HISTOGRAM_KEYS: u32 = 4_096;

/// Size of the ring buffer that carries per-request events to user space, in bytes.
pub const EVENT_RING_BYTES: u32 = 1 << 20;

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

/// Users whose followed `io_uring` requests are counted at once (the `URING_USERS` map): as
/// many as processes remembered as readers.
pub const MAX_URING_USERS: u32 = MAX_FILE_READERS;

/// Age after which abissd drops a followed `io_uring` request (and gives its user's count
/// back): a read of an attached file on a managed disk completes long before; what is left is
/// a request that does not read a stream (a poll on a socket or a pipe), or one whose
/// completion was never seen.
pub const STALE_URING_NS: u64 = 60_000_000_000;

/// Processes remembered as readers of attached files (least recently seen forgotten first):
/// only their `io_uring` submissions are followed.
pub const MAX_FILE_READERS: u32 = 4_096;

/// Offsets of the kernel structure fields the programs read, in bytes.
///
/// The eBPF programs cannot rely on compile-time struct layouts (Rust eBPF has no CO-RE field
/// relocations), so `abissd` resolves these offsets from the running kernel's BTF and writes them
/// into the programs' read-only data before loading them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    /// Non-zero once filled in; the programs do nothing while it is zero.
    pub valid: u32,
    /// `struct request.q`
    pub request_q: u32,
    /// `struct request.cmd_flags`
    pub request_cmd_flags: u32,
    /// `struct request.__data_len`
    pub request_data_len: u32,
    /// `struct request.__sector`
    pub request_sector: u32,
    /// `struct request.bio`
    pub request_bio: u32,
    /// `struct request_queue.disk`
    pub queue_disk: u32,
    /// `struct gendisk.major`
    pub gendisk_major: u32,
    /// `struct gendisk.first_minor`
    pub gendisk_first_minor: u32,
    /// `struct bio.bi_ioprio`
    pub bio_ioprio: u32,
    /// `struct bio.bi_io_vec`
    pub bio_io_vec: u32,
    /// `struct bio_vec.bv_page`
    pub bvec_page: u32,
    /// `struct page.compound_head` (bit 0 set on tail pages of a large folio)
    pub page_compound_head: u32,
    /// `struct page.mapping`
    pub page_mapping: u32,
    /// `struct address_space.host`
    pub mapping_host: u32,
    /// `struct inode.i_ino`
    pub inode_ino: u32,
    /// `struct inode.i_sb`
    pub inode_sb: u32,
    /// `struct super_block.s_dev`
    pub sb_dev: u32,
    /// `struct io_kiocb.file`
    pub io_kiocb_file: u32,
    /// `struct io_kiocb.cmd` (an `io_rw` for read/write requests; its `kiocb` comes first)
    pub io_kiocb_cmd: u32,
    /// `struct kiocb.ki_ioprio`
    pub kiocb_ioprio: u32,
    /// `struct file.f_inode`
    pub file_inode: u32,
    /// `struct bio.bi_end_io`
    pub bio_end_io: u32,
    /// `struct bio.bi_private`
    pub bio_private: u32,
    /// `struct iomap_dio.iocb`
    pub iomap_dio_iocb: u32,
    /// `struct kiocb.ki_filp`
    pub kiocb_filp: u32,
    /// `struct task_struct.flags`
    pub task_flags: u32,
    /// `struct task_struct.pid` (the thread id)
    pub task_pid: u32,
    /// `struct task_struct.io_context` (a child made with `CLONE_IO` shares its parent's)
    pub task_io_context: u32,
    /// `struct task_struct.start_boottime` (ns since boot, as `/proc/PID/stat`'s start time
    /// in clock ticks): with the id, who a task is, as an id comes round again
    pub task_start_boottime: u32,
    /// Address of `iomap_dio_bio_end_io` (from `/proc/kallsyms`), zero if unknown: a bio
    /// that ends there is direct I/O whose `bi_private` leads to the file.
    pub iomap_dio_end_io: u64,
}

impl KernelLayout {
    /// The layout before `abissd` fills it in: all zero, `valid` unset.
    pub const UNSET: Self = Self {
        valid: 0,
        request_q: 0,
        request_cmd_flags: 0,
        request_data_len: 0,
        request_sector: 0,
        request_bio: 0,
        queue_disk: 0,
        gendisk_major: 0,
        gendisk_first_minor: 0,
        bio_ioprio: 0,
        bio_io_vec: 0,
        bvec_page: 0,
        page_compound_head: 0,
        page_mapping: 0,
        mapping_host: 0,
        inode_ino: 0,
        inode_sb: 0,
        sb_dev: 0,
        io_kiocb_file: 0,
        io_kiocb_cmd: 0,
        kiocb_ioprio: 0,
        file_inode: 0,
        bio_end_io: 0,
        bio_private: 0,
        iomap_dio_iocb: 0,
        kiocb_filp: 0,
        task_flags: 0,
        task_pid: 0,
        task_io_context: 0,
        task_start_boottime: 0,
        iomap_dio_end_io: 0,
    };
}

/// Runtime switches the daemon flips while the programs run (index 0 of the `CONTROL` array).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// Non-zero while at least one client streams per-request events; the programs skip the
    /// ring buffer otherwise, so tracing costs nothing extra when nobody watches.
    pub emit_events: u32,
    /// Thread-group id of the daemon itself, so its own I/O can be told apart.
    pub daemon_tgid: u32,
    /// Number of attached files; while zero the programs skip looking up requests' files,
    /// and the page-cache and `io_uring` programs return at once.
    pub attached_files: u32,
    /// Non-zero while some client traces every disk (`Request::Latency`, `Request::Events`):
    /// then every disk's requests are traced, not only those of the disks in `DISKS`.
    pub trace_all: u32,
    /// Number of entries in `DISKS`; while it and `trace_all` are zero the block programs
    /// return without looking up the request's disk.
    pub listed_disks: u32,
    /// Number of threads abissd has raised (its entries in `RAISED`); while zero the fork
    /// program is detached, and returns at once should it run.
    pub raised_threads: u32,
}

/// Threads followed for forks at once: those abissd raised and the tasks they made that it
/// has not put back yet. Sized for abissd's bounds: 256 streams, each with at most 32 raised
/// threads, 32 tasks adopted at a player's start, and 16 tasks sharing their I/O contexts
/// noted (abissd checks the product), 20 480; plain tasks a raised thread makes stay only until
/// abissd puts them back.
pub const MAX_RAISED: u32 = 20_480;

/// Size of the ring buffer that carries tasks made by raised threads to abissd, in bytes:
/// 1170 [`ForkEvent`]s (48 bytes and the ring's 8-byte header each) between two reads by
/// abissd. Beyond that the fork program counts them in `FORK_LOST`, and abissd finds them in
/// `RAISED` (measured: 3000 forks while abissd was stopped, all put back within a second of
/// it going on).
pub const FORK_RING_BYTES: u32 = 64 << 10;

/// What a [`RaisedThread`] entry is.
pub mod raised_flags {
    /// Made by a raised thread (or by such a task) since its raise, and found by the fork
    /// program; abissd writes entries without it, for the threads it raises itself.
    pub const INHERITED: u32 = 1;
    /// Made with `CLONE_IO`: it shares its parent's I/O context, and so its priority, which
    /// goes back when the parent's does (an `io_uring` worker, say). Putting it back alone
    /// would put back the parent too.
    pub const SHARES_IO_CONTEXT: u32 = 2;
    /// On the report of a task ([`super::ForkEvent`]): it passed the bound of
    /// [`super::MAX_SHARED_IO_TASKS_PER_RAISE`] tasks under the raise that share its I/O
    /// context, and is not noted in `RAISED`. abissd then drops the raise at once; putting
    /// back any one task of a shared context puts back all of them, those the map could not
    /// hold included. (The raise's own record of it is [`super::RaiseCounts::over_bound`].)
    pub const OVER_BOUND: u32 = 4;
}

/// Tasks sharing a raised thread's I/O context (made with `CLONE_IO`) that the fork program
/// notes in `RAISED` under one raise. A player's `CLONE_IO` helpers are few (`io_uring`'s
/// workers are not made by a fork at all); past this the raise is dropped. abissd's own bound,
/// per stream, is the same: this one holds while abissd lags behind the fork ring.
pub const MAX_SHARED_IO_TASKS_PER_RAISE: u64 = 16;

/// A thread whose new tasks the fork program follows (the values of the `RAISED` map, keyed by
/// thread id): a thread abissd raised, or a task such a thread made (and so may have
/// inherited the raise) that abissd has not put back yet. The eBPF side never changes an
/// entry in place, and what it counts of a raise is in [`RaiseCounts`]: abissd writes a raised
/// thread's entry whole (again when it raises the thread again), and would lose what the
/// programs wrote into it in between.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaisedThread {
    /// Thread id of the thread abissd raised, whose raise this is.
    pub root: u32,
    /// Its I/O priority before the raise (encoded), what a task made since is put back to.
    pub previous: u16,
    /// The priority abissd set (encoded): a task made since that still has it inherited it.
    pub applied: u16,
    /// See [`raised_flags`].
    pub flags: u32,
    /// Changed by abissd each time it raises the thread for another file than its raise was
    /// for: the count of the stream's own file starts afresh ([`RaiseCounts::stream_count`]).
    pub generation: u32,
    /// The tag of the file the raise is for (the tag is the file's, shared by its streams:
    /// see [`AttachedFile::stream`]).
    pub stream: u64,
    /// For an entry the fork program wrote ([`raised_flags::INHERITED`]): when the task it
    /// is for started (`task_struct.start_boottime`, ns since boot). The entry names that
    /// task, not its id: a task that takes the id once it is gone (ids wrap at `pid_max`, and
    /// any user can make them wrap) is not followed, counted or put back under the raise.
    /// Zero in abissd's own entries (abissd knows its raised threads by id and start time).
    pub started_ns: u64,
}

/// What the eBPF side counts of the raise of one thread abissd raised (the values of the
/// `RAISE_COUNTS` map, keyed by that thread's id). Only the eBPF programs write an entry (they
/// make it at their first count, and add in place); abissd reads it and deletes it when the
/// raise ends. abissd rewrites a raised thread's `RAISED` entry when it raises the thread
/// again with other values; were the counts in it, what the programs added between abissd's
/// read and its write would be lost.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaiseCounts {
    /// KiB of real-time requests the raised thread queued for anything but its stream's file,
    /// as the block program counts them at insert: the thread's user pays for them, and abissd
    /// drops the raise when they cannot be paid for (a raise is for reading the stream, not for
    /// the thread's other I/O). Bytes, not requests: a buffered read of 32 MiB was 30 requests
    /// on a loop device.
    pub stray_kib: u32,
    /// Non-zero once more than [`MAX_SHARED_IO_TASKS_PER_RAISE`] tasks share the raise's I/O
    /// context: abissd then drops the raise.
    pub over_bound: u32,
    /// KiB of real-time requests the raised thread queued for its stream's file (the low
    /// half), and the [`RaisedThread::generation`] they count for (the high half): abissd holds
    /// them against what the stream was admitted for (its buffer and its rate since the raise),
    /// so a 1 B/s stream cannot lend its reader real-time reads of a huge file. One word, written
    /// in one store: whoever reads it (abissd, or the program on another CPU) never sees a
    /// count with another generation's. See [`Self::stream_kib`].
    pub stream_count: u64,
    /// Tasks made under the raise that share its I/O context (`CLONE_IO`, by it or by such a
    /// task), as the fork program counted them (atomically; the BPF target's atomics are
    /// 64-bit). Such a task stays in `RAISED` until the raise ends, so past
    /// [`MAX_SHARED_IO_TASKS_PER_RAISE`] the program notes no more of them and sets
    /// `over_bound` instead: one user's raise cannot fill a map every user's raises need.
    pub shared_io_tasks: u64,
    /// The raised thread's I/O context (`task_struct.io_context`) as the eBPF side last saw
    /// it (0 until then), its key in `RAISED_CONTEXTS`, which abissd deletes with the raise so
    /// that no later task is taken for one sharing it.
    pub io_context: u64,
    /// Once `over_bound` is set: a task past the bound (the last one the fork program saw),
    /// not noted in `RAISED`. abissd puts it back with the raise: should the raised thread and
    /// every noted task be gone, it is still a way to the shared context.
    pub past_bound_task: u32,
    /// Zero: keeps the layout free of padding.
    pub reserved: u32,
    /// When `past_bound_task` started (`task_struct.start_boottime`): abissd puts it back
    /// only if the task under that id is still the one that started then.
    pub past_bound_started_ns: u64,
}

impl RaiseCounts {
    /// KiB of the stream's file counted in [`Self::stream_count`] under the raise's
    /// `generation`; 0 when they were counted under another (the thread's raise for another
    /// file), as the raise has read none of its file since.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
    )]
    #[inline(always)]
    pub fn stream_kib(&self, generation: u32) -> u32 {
        stream_count_for(self.stream_count, generation)
    }
}

/// The KiB in stream count `count` ([`RaiseCounts::stream_count`]) under `generation`.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
)]
#[inline(always)]
#[expect(clippy::cast_possible_truncation, reason = "the halves of the word")]
pub fn stream_count_for(count: u64, generation: u32) -> u32 {
    if (count >> 32) as u32 == generation {
        count as u32
    } else {
        0
    }
}

/// Stream count `count` ([`RaiseCounts::stream_count`]) with `kib` more under `generation`:
/// counted afresh if it counted another generation.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
)]
#[inline(always)]
pub fn stream_count_after(count: u64, generation: u32, kib: u32) -> u64 {
    let kib = stream_count_for(count, generation).saturating_add(kib);
    (u64::from(generation) << 32) | u64::from(kib)
}

/// A real-time request a raised thread queued, as the block program counted it at insert
/// (the values of the `RAISED_REQUESTS` map, keyed by the kernel's `struct request`). Bios
/// that merge into the request while it waits in the disk's queue grow it; at its issue the
/// program counts what it grew by against the same raise, so small `O_DIRECT` reads that
/// back-merge into a queued request are paid for too (issue 33). A request merged into another
/// has what was counted for it taken back, as the other counts it at its issue.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaisedRequest {
    /// Thread id of the raised thread whose raise the request counts against.
    pub root: u32,
    /// That raise's [`RaisedThread::generation`] when it was counted.
    pub generation: u32,
    /// KiB counted so far.
    pub counted_kib: u32,
    /// Non-zero if counted for the raise's own file (its stream count), else as stray.
    pub own_file: u32,
}

/// A task made (fork, vfork, clone, a new thread) by a followed thread, sent to abissd.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForkEvent {
    /// When (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Thread id of the task that made it.
    pub parent: u32,
    /// Thread id of the new task.
    pub child: u32,
    /// Its entry in `RAISED`, as the fork program wrote it ([`raised_flags::INHERITED`] set).
    pub raise: RaisedThread,
}

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

/// Kernel I/O priority encoding (`include/uapi/linux/ioprio.h`).
pub mod ioprio {
    /// No class set: the kernel derives best effort from the task's nice value.
    pub const CLASS_NONE: u8 = 0;
    /// Real time.
    pub const CLASS_RT: u8 = 1;
    /// Best effort.
    pub const CLASS_BE: u8 = 2;
    /// Idle.
    pub const CLASS_IDLE: u8 = 3;
    /// Bits the class is shifted by.
    pub const CLASS_SHIFT: u16 = 13;
    /// Mask of the level within a class.
    pub const LEVEL_MASK: u16 = 0x7;

    /// Splits an encoded ioprio into (class, level).
    #[must_use]
    pub const fn split(ioprio: u16) -> (u8, u8) {
        // Both fit in a u8 by construction: the class is 3 bits, the level 3 bits.
        #[allow(clippy::cast_possible_truncation)]
        (
            ((ioprio >> CLASS_SHIFT) & 0x7) as u8,
            (ioprio & LEVEL_MASK) as u8,
        )
    }

    /// Encodes (class, level) as the kernel's ioprio value.
    #[must_use]
    pub const fn encode(class: u8, level: u8) -> u16 {
        ((class as u16) << CLASS_SHIFT) | (level as u16 & LEVEL_MASK)
    }
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

#[cfg(feature = "user")]
mod pod {
    // SAFETY: every type below is #[repr(C)], Copy, has no padding the kernel leaves
    // uninitialised that user space interprets (explicit pad fields), and any bit pattern is valid.
    unsafe impl aya::Pod for super::KernelLayout {}
    unsafe impl aya::Pod for super::Control {}
    unsafe impl aya::Pod for super::HistogramKey {}
    unsafe impl aya::Pod for super::LatencyCounters {}
    unsafe impl aya::Pod for super::RequestOrigin {}
    unsafe impl aya::Pod for super::InflightRequest {}
    unsafe impl aya::Pod for super::RequestEvent {}
    unsafe impl aya::Pod for super::FileKey {}
    unsafe impl aya::Pod for super::AttachedFile {}
    unsafe impl aya::Pod for super::PlayoutEvent {}
    unsafe impl aya::Pod for super::UringSubmission {}
    unsafe impl aya::Pod for super::RaisedThread {}
    unsafe impl aya::Pod for super::RaiseCounts {}
    unsafe impl aya::Pod for super::ForkEvent {}
    unsafe impl aya::Pod for super::RaisedRequest {}
}

// The layouts are part of the ABI: a change here must be a deliberate change on both sides.
const _: () = assert!(core::mem::size_of::<KernelLayout>() == 30 * 4 + 8);
const _: () = assert!(core::mem::size_of::<RaisedThread>() == 32);
const _: () = assert!(core::mem::size_of::<RaiseCounts>() == 48);
const _: () = assert!(core::mem::size_of::<ForkEvent>() == 48);
const _: () = assert!(core::mem::size_of::<RaisedRequest>() == 16);
const _: () = assert!(core::mem::size_of::<Control>() == 24);
const _: () = assert!(core::mem::size_of::<UringSubmission>() == 24);
const _: () = assert!(core::mem::size_of::<HistogramKey>() == 16);
const _: () = assert!(core::mem::size_of::<FileKey>() == 16);
const _: () = assert!(core::mem::size_of::<AttachedFile>() == 24);
const _: () = assert!(core::mem::size_of::<PlayoutEvent>() == 80);
const _: () = assert!(core::mem::size_of::<LatencyCounters>() == 40 + 2 * 8 * LATENCY_SLOTS);
const _: () = assert!(core::mem::size_of::<RequestOrigin>() == 40);
const _: () = assert!(core::mem::size_of::<InflightRequest>() == 56);
const _: () = assert!(core::mem::size_of::<RequestEvent>() == 128);

/// ABISS priority levels: 0 the highest (real time only) … 7 the default best effort, and
/// the kernel I/O priorities they map to.
///
/// | ABISS level | kernel ioprio |
/// | --- | --- |
/// | 0 | RT/0 |
/// | 1 | RT/2 |
/// | 2 | RT/4 |
/// | 3 | RT/6 |
/// | 4 | BE/0 |
/// | 5 | BE/2 |
/// | 6 | BE/4 |
/// | 7 | BE/7 |
///
/// It lives here because both sides need it: the programs to tell a request that runs below
/// its stream's level (a priority inversion), the daemon to set priorities.
pub mod abiss_level {
    use super::ioprio;

    /// The lowest ABISS level, plain best effort.
    pub const LOWEST: u8 = 7;

    /// Kernel (class, level) of an ABISS level; levels above 7 are treated as 7.
    #[must_use]
    pub const fn to_kernel(level: u8) -> (u8, u8) {
        match level {
            0 => (ioprio::CLASS_RT, 0),
            1 => (ioprio::CLASS_RT, 2),
            2 => (ioprio::CLASS_RT, 4),
            3 => (ioprio::CLASS_RT, 6),
            4 => (ioprio::CLASS_BE, 0),
            5 => (ioprio::CLASS_BE, 2),
            6 => (ioprio::CLASS_BE, 4),
            _ => (ioprio::CLASS_BE, 7),
        }
    }

    /// The ABISS level a request or task at kernel (class, level) is served at: the highest
    /// ABISS level whose kernel priority it does not exceed. No class means the kernel's
    /// default, BE/4; idle is below every level and counts as the lowest.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
    )]
    #[inline(always)]
    pub const fn from_kernel(class: u8, level: u8) -> u8 {
        match class {
            ioprio::CLASS_RT => level / 2,
            ioprio::CLASS_BE => match level {
                0 | 1 => 4,
                2 | 3 => 5,
                4..=6 => 6,
                _ => 7,
            },
            ioprio::CLASS_NONE => 6,
            _ => LOWEST,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_count_adds_up_in_its_generation_and_starts_afresh_in_another() {
        let mut count = 0;
        for kib in [512, 512, 128] {
            count = stream_count_after(count, 0, kib);
        }
        assert_eq!(stream_count_for(count, 0), 1152);
        // Raised for another file: nothing of it read yet, then only what is read under it.
        assert_eq!(stream_count_for(count, 1), 0);
        count = stream_count_after(count, 1, 64);
        assert_eq!(
            (stream_count_for(count, 1), stream_count_for(count, 0)),
            (64, 0)
        );
        // Raised for the first file again: its earlier count does not come back.
        assert_eq!(stream_count_for(count, 2), 0);
        // A count saturates rather than wrap into the generation.
        let full = stream_count_after(u64::from(u32::MAX - 1), 0, 9);
        assert_eq!((stream_count_for(full, 0), full >> 32), (u32::MAX, 0));
        let counts = RaiseCounts {
            stream_count: count,
            ..RaiseCounts::default()
        };
        assert_eq!(counts.stream_kib(1), 64);
    }

    #[test]
    fn slots_follow_log2_microseconds() {
        assert_eq!(latency_slot(0), 0);
        assert_eq!(latency_slot(999), 0);
        assert_eq!(latency_slot(1_000), 1);
        assert_eq!(latency_slot(1_999), 1);
        assert_eq!(latency_slot(2_000), 2);
        assert_eq!(latency_slot(3_999), 2);
        assert_eq!(latency_slot(4_000), 3);
        assert_eq!(latency_slot(u64::MAX), LATENCY_SLOTS - 1);
    }

    #[test]
    fn ioprio_round_trips() {
        for class in 0..4 {
            for level in 0..8 {
                assert_eq!(ioprio::split(ioprio::encode(class, level)), (class, level));
            }
        }
        // A hint in bits 3..13 must not leak into class or level.
        assert_eq!(ioprio::split(ioprio::encode(1, 3) | (5 << 3)), (1, 3));
    }
}
