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
//! | latency histograms: [`HistogramKey`], [`LatencyCounters`], [`latency_slot`] | `requests` |
//! | requests in flight and completed: [`InflightRequest`], [`RequestOrigin`], [`RequestEvent`] | `requests` |
//! | attached files and what tasks do with them: [`FileKey`], [`AttachedFile`], [`PlayoutEvent`], [`UringSubmission`], [`FileReader`] | `files` |
//! | threads abissd raised, and the tasks they made since ([`RaisedThread`], [`ForkEvent`], [`raised_flags`]) | crate root |
//! | a request record's life cycle | [`request_state`] (in `requests`) |
//! | which disks the block programs follow, managed or traced (values of the `DISKS` map) | [`disk_flags`] |
//! | kinds of [`PlayoutEvent`] | [`playout_kind`] (in `files`) |
//! | kernel block operations (`REQ_OP_*`) | [`op`] (in `requests`) |
//! | kernel I/O priority encoding | [`ioprio`] (in `priority`) |
//! | ABISS levels ↔ kernel I/O priorities: [`AbissLevel`], and [`abiss_level`] for the programs | `priority` |
//! | times on the kernel's monotonic clock ([`MonotonicNs`]) | `time` |
//! | `aya::Pod` for every type (`user` feature) | `pod` |
#![no_std]
#![deny(missing_docs)]

mod files;
pub mod names;
mod priority;
mod requests;
mod time;

pub use files::{
    playout_kind, AttachedFile, FileKey, FileReader, FillReport, PlayoutEvent, UringSubmission,
    ANY_READER, FILL_REPORT_GAP_NS, MAX_ATTACHED_FILES, MAX_FILE_READERS,
    MAX_FILE_READERS_PER_USER, MAX_URING_INFLIGHT, MAX_URING_INFLIGHT_PER_USER, MAX_URING_USERS,
    PLAYOUT_RING_BYTES, READ_REPORT_BUCKETS, READ_REPORT_BURST, READ_REPORT_GAP_NS, STALE_URING_NS,
};
pub use priority::{abiss_level, ioprio, AbissLevel};
pub use requests::{
    latency_slot, op, request_state, HistogramKey, InflightRequest, LatencyCounters, RequestEvent,
    RequestOrigin, EVENT_RING_BYTES, LATENCY_SLOTS, MAX_HISTOGRAM_KEYS, MAX_INFLIGHT,
    STALE_REQUEST_NS,
};
pub use time::MonotonicNs;

/// Length of a task's command name, as in the kernel's `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

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
    /// On the report of a task: the fork program could not note it in `RAISED` (the map was
    /// full). abissd puts back a noted task only while its entry is still there (a new task
    /// that takes its id deletes it), and one not noted by its start time alone.
    pub const UNNOTED: u32 = 8;
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
    unsafe impl aya::Pod for super::FileReader {}
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
const _: () = assert!(core::mem::size_of::<FileReader>() == 16);
const _: () = assert!(core::mem::size_of::<HistogramKey>() == 16);
const _: () = assert!(core::mem::size_of::<FileKey>() == 16);
const _: () = assert!(core::mem::size_of::<AttachedFile>() == 24);
const _: () = assert!(core::mem::size_of::<PlayoutEvent>() == 80);
const _: () = assert!(core::mem::size_of::<LatencyCounters>() == 40 + 2 * 8 * LATENCY_SLOTS);
const _: () = assert!(core::mem::size_of::<RequestOrigin>() == 40);
const _: () = assert!(core::mem::size_of::<InflightRequest>() == 56);
const _: () = assert!(core::mem::size_of::<RequestEvent>() == 128);

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
