//! The names of the eBPF programs and maps, one table for both sides: the daemon and its kernel
//! probes name them only through these constants, and a test of `scheduler-user`
//! (`kernel::tracer`, `the_name_table_is_the_built_objects`) checks the table against the
//! object the eBPF crate built, as libbpf-tools' skeletons check names at build time. The eBPF
//! side names a map by its `static` and a program by its function, so a rename there fails
//! that test, not a load on a user's machine.

/// The maps, by the name of their `static` in `scheduler-ebpf`.
pub mod map {
    /// Attached files, by file key.
    pub const ATTACHED: &str = "ATTACHED";
    /// Whether anything is followed, and what.
    pub const CONTROL: &str = "CONTROL";
    /// Managed disks.
    pub const DISKS: &str = "DISKS";
    /// The request ring of event subscribers.
    pub const EVENTS: &str = "EVENTS";
    /// Processes followed as readers of attached files.
    pub const FILE_READERS: &str = "FILE_READERS";
    /// The ring of tasks raised threads make.
    pub const FORKS: &str = "FORKS";
    /// Tasks of raised threads the fork ring had no room for.
    pub const FORK_LOST: &str = "FORK_LOST";
    /// Requests in flight.
    pub const INFLIGHT: &str = "INFLIGHT";
    /// The last page-cache fill seen per task.
    pub const LAST_FILL: &str = "LAST_FILL";
    /// Latency histograms.
    pub const LATENCY: &str = "LATENCY";
    /// Who queued a request first.
    pub const ORIGINS: &str = "ORIGINS";
    /// The ring of reads, faults and misses of attached files.
    pub const PLAYOUT: &str = "PLAYOUT";
    /// Raised threads.
    pub const RAISED: &str = "RAISED";
    /// I/O contexts of raised threads.
    pub const RAISED_CONTEXTS: &str = "RAISED_CONTEXTS";
    /// What raised threads read at real time.
    pub const RAISE_COUNTS: &str = "RAISE_COUNTS";
    /// Raised threads' requests between insert and issue, as counted at insert.
    pub const RAISED_REQUESTS: &str = "RAISED_REQUESTS";
    /// Followed reader processes per user: added by the programs.
    pub const READER_USERS: &str = "READER_USERS";
    /// Followed reader processes per user: given back by abissd.
    pub const READER_GIVEN: &str = "READER_GIVEN";
    /// When a reader of a file is reported next.
    pub const READ_REPORT_DUE: &str = "READ_REPORT_DUE";
    /// Followed `io_uring` requests.
    pub const URING_INFLIGHT: &str = "URING_INFLIGHT";
    /// Followed `io_uring` requests per user: added and given back by the programs.
    pub const URING_USERS: &str = "URING_USERS";
    /// Followed `io_uring` requests per user: given back by abissd.
    pub const URING_GIVEN: &str = "URING_GIVEN";
    /// A zeroed counter record to copy from.
    pub const ZERO_COUNTERS: &str = "ZERO_COUNTERS";
}

/// The programs, by the name of their function in `scheduler-ebpf`.
pub mod program {
    /// `block_rq_insert`.
    pub const INSERT: &str = "abiss_insert";
    /// `block_rq_issue`.
    pub const ISSUE: &str = "abiss_issue";
    /// `block_rq_complete`.
    pub const COMPLETE: &str = "abiss_complete";
    /// `block_rq_merge`.
    pub const MERGE: &str = "abiss_merge";
    /// `block_rq_requeue`.
    pub const REQUEUE: &str = "abiss_requeue";
    /// `sched_process_fork`.
    pub const FORK: &str = "abiss_fork";
    /// `mm_filemap_get_pages`.
    pub const GET_PAGES: &str = "abiss_get_pages";
    /// `mm_filemap_fault`.
    pub const FAULT: &str = "abiss_fault";
    /// `page_cache_sync_ra`.
    pub const SYNC_RA: &str = "abiss_sync_ra";
    /// `mm_filemap_add_to_page_cache`, standing in for `page_cache_sync_ra`.
    pub const CACHE_FILL: &str = "abiss_cache_fill";
    /// `io_uring_submit_req`.
    pub const URING_SUBMIT: &str = "abiss_uring_submit";
    /// `io_uring_complete`.
    pub const URING_COMPLETE: &str = "abiss_uring_complete";
}

/// Every map.
pub const MAPS: [&str; 23] = [
    map::ATTACHED,
    map::CONTROL,
    map::DISKS,
    map::EVENTS,
    map::FILE_READERS,
    map::FORKS,
    map::FORK_LOST,
    map::INFLIGHT,
    map::LAST_FILL,
    map::LATENCY,
    map::ORIGINS,
    map::PLAYOUT,
    map::RAISED,
    map::RAISED_CONTEXTS,
    map::RAISE_COUNTS,
    map::RAISED_REQUESTS,
    map::READ_REPORT_DUE,
    map::READER_USERS,
    map::READER_GIVEN,
    map::URING_INFLIGHT,
    map::URING_USERS,
    map::URING_GIVEN,
    map::ZERO_COUNTERS,
];

/// Every program.
pub const PROGRAMS: [&str; 12] = [
    program::INSERT,
    program::ISSUE,
    program::COMPLETE,
    program::MERGE,
    program::REQUEUE,
    program::FORK,
    program::GET_PAGES,
    program::FAULT,
    program::SYNC_RA,
    program::CACHE_FILL,
    program::URING_SUBMIT,
    program::URING_COMPLETE,
];
