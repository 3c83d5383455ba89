//! Every map the programs share with `abissd`, and the `KERNEL_LAYOUT` global.
//!
//! `abissd` finds the maps by their static names (the `#[map]` macro exports each under its
//! identifier) and fills `KERNEL_LAYOUT` by that symbol name (`EbpfLoader::set_global`), so
//! neither may be renamed. No tracepoints here: the programs live in `block`, `page_cache` and
//! `io_uring`.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use scheduler_common::{
    AttachedFile, Control, FileKey, FileReader, FillReport, HistogramKey, InflightRequest,
    KernelLayout, LatencyCounters, RaiseCounts, RaisedRequest, RaisedThread, RequestOrigin,
    UringSubmission, EVENT_RING_BYTES, FORK_RING_BYTES, MAX_ATTACHED_FILES, MAX_DISKS,
    MAX_FILE_READERS, MAX_HISTOGRAM_KEYS, MAX_INFLIGHT, MAX_RAISED, MAX_URING_INFLIGHT,
    MAX_URING_USERS, PLAYOUT_RING_BYTES, READ_REPORT_BUCKETS,
};

/// Filled in by abissd (`EbpfLoader::set_global`) before load.
#[no_mangle]
pub(crate) static KERNEL_LAYOUT: KernelLayout = KernelLayout::UNSET;

#[map]
pub(crate) static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

/// The disks whose requests the block programs follow, by `dev_t` (kernel encoding), with
/// their `disk_flags`; written by abissd. Every block program looks the request's disk up here
/// first (unless `CONTROL` says nothing is listed or traced) and returns if it is neither.
#[map]
pub(crate) static DISKS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_DISKS, 0);

/// One record per `struct request` seen (see `MAX_INFLIGHT`): reused in place by the next
/// request in the same slot, so the hot path does lookups and stores, not map updates.
#[map]
pub(crate) static INFLIGHT: HashMap<u64, InflightRequest> =
    HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Submitter and file of each tracked request, while events are wanted (reused like INFLIGHT).
#[map]
pub(crate) static ORIGINS: HashMap<u64, RequestOrigin> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

#[map]
pub(crate) static LATENCY: PerCpuHashMap<HistogramKey, LatencyCounters> =
    PerCpuHashMap::with_max_entries(MAX_HISTOGRAM_KEYS, 0);

/// One all-zero histogram: a new histogram key is initialised from it, because the value is
/// too large for the 512-byte eBPF stack.
#[map]
pub(crate) static ZERO_COUNTERS: Array<LatencyCounters> = Array::with_max_entries(1, 0);

#[map]
pub(crate) static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

/// Files attached as streams, written by abissd.
#[map]
pub(crate) static ATTACHED: HashMap<FileKey, AttachedFile> =
    HashMap::with_max_entries(MAX_ATTACHED_FILES, 0);

/// Reads, faults and misses of attached files, for abissd's playout tracking.
#[map]
pub(crate) static PLAYOUT: RingBuf = RingBuf::with_byte_size(PLAYOUT_RING_BYTES, 0);

/// When the next read or fault report of each (attached file, reading user) is due, by
/// `[file tag, uid]`: the token bucket of `READ_REPORT_GAP_NS` and `READ_REPORT_BURST`, one per
/// owner, so that a co-owner rereading the file in a loop spends only its own. LRU: buckets of
/// files detached long ago fall out, and a bucket pushed out (by the readers of a root's file,
/// who are many) comes back full, which costs ring space, never a report.
#[map]
pub(crate) static READ_REPORT_DUE: LruHashMap<[u64; 2], u64> =
    LruHashMap::with_max_entries(READ_REPORT_BUCKETS, 0);

/// Processes (tgid) seen reading an attached file, with the stream and the user they count
/// against: their `io_uring` requests are followed, nobody else's, so other rings pay one
/// lookup per submission. A plain hash, at most `MAX_FILE_READERS_PER_USER` of one user's
/// (`READER_USERS`): a least-recently-used map let one user's short-lived readers push every
/// other user's out. abissd sweeps out the processes that are gone and gives their room back.
#[map]
pub(crate) static FILE_READERS: HashMap<u32, FileReader> =
    HashMap::with_max_entries(MAX_FILE_READERS, 0);

/// How many entries of `FILE_READERS` each user was given, by uid (added to atomically by the
/// programs); what the user holds is this less `READER_GIVEN`.
#[map]
pub(crate) static READER_USERS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_URING_USERS, 0);

/// How many entries of `FILE_READERS` abissd took out for each user (processes gone), by uid:
/// written by abissd alone, so its read-and-write never races with the programs' atomic adds
/// to `READER_USERS` (one shared count lost the adds that came between abissd's read and its
/// write, and the bound wore away).
#[map]
pub(crate) static READER_GIVEN: HashMap<u32, u64> = HashMap::with_max_entries(MAX_URING_USERS, 0);

/// `io_uring` requests of readers of attached files between submission and completion, by
/// request address; at most `MAX_URING_INFLIGHT_PER_USER` of one user's (`URING_USERS`).
/// Whoever takes an entry out (the completion program, or abissd dropping it as stale) gives
/// its user's count back.
#[map]
pub(crate) static URING_INFLIGHT: HashMap<u64, UringSubmission> =
    HashMap::with_max_entries(MAX_URING_INFLIGHT, 0);

/// How many entries of `URING_INFLIGHT` each user has, by uid (added to and taken from
/// atomically by the programs), less `URING_GIVEN`.
#[map]
pub(crate) static URING_USERS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_URING_USERS, 0);

/// How many entries of `URING_INFLIGHT` abissd dropped as stale for each user, by uid: written
/// by abissd alone (see `READER_GIVEN`).
#[map]
pub(crate) static URING_GIVEN: HashMap<u32, u64> = HashMap::with_max_entries(MAX_URING_USERS, 0);

/// Threads whose new tasks the fork program follows, by thread id: those abissd raised
/// (written by abissd) and the tasks they made that abissd has not put back yet (written by
/// the fork program, deleted by abissd).
#[map]
pub(crate) static RAISED: HashMap<u32, RaisedThread> = HashMap::with_max_entries(MAX_RAISED, 0);

/// What the programs count of each raise, by the raised thread's id: written only here (made
/// at the first count, for a thread with its own `RAISED` entry), read and deleted by abissd.
/// Only abissd's raised threads have one, so `MAX_RAISED` bounds it with room to spare.
#[map]
pub(crate) static RAISE_COUNTS: HashMap<u32, RaiseCounts> =
    HashMap::with_max_entries(MAX_RAISED, 0);

/// Real-time requests of raised threads between insert and issue, with what was counted for
/// each at insert, by request address: at issue (or a merge into another request) the
/// program counts what merges added. Least recently used entries go first (a request whose
/// issue was not seen).
#[map]
pub(crate) static RAISED_REQUESTS: LruHashMap<u64, RaisedRequest> =
    LruHashMap::with_max_entries(MAX_INFLIGHT, 0);

/// The I/O context (`task_struct.io_context`) of each raised thread, as seen when it read an
/// attached file, with its thread id: the tasks that share that context (`io_uring` workers
/// and its `SQPOLL` thread, which no fork event announces) queue real-time requests in its
/// name, and the block program counts them against its raise. Least recently used entries
/// go first; an entry whose thread is no longer raised counts nothing.
#[map]
pub(crate) static RAISED_CONTEXTS: LruHashMap<u64, u32> =
    LruHashMap::with_max_entries(MAX_RAISED, 0);

/// Tasks made by followed threads, for abissd to put back.
#[map]
pub(crate) static FORKS: RingBuf = RingBuf::with_byte_size(FORK_RING_BYTES, 0);

/// Tasks made by followed threads that could not be reported (the ring was full): abissd
/// then looks for them in `RAISED`.
#[map]
pub(crate) static FORK_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The last page-cache fill report sent from each CPU (see `FillReport`).
#[map]
pub(crate) static LAST_FILL: PerCpuArray<FillReport> = PerCpuArray::with_max_entries(1, 0);
