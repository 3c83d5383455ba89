//! abiss eBPF programs: block-layer request tracing and stream tagging.
//!
//! The programs hold no policy. They follow each block request from its first sight (insert or
//! issue) to its completion, tag it with the stream whose attached file its pages belong to
//! (whichever task submits it), attribute it to the task that submitted its first bio, and add
//! its queue and service time to per-CPU log2 histograms keyed by (device, operation, I/O
//! priority, stream). They report reads, faults, page-cache misses and `io_uring` requests on
//! attached files to the daemon. The daemon reads the maps and decides.
//!
//! Kernel struct offsets come from `KERNEL_LAYOUT`, which `abissd` fills in from the running
//! kernel's BTF before loading (Rust eBPF has no CO-RE field relocations).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_uid_gid,
        bpf_probe_read_kernel, generated::bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, LruHashMap, PerCpuHashMap, RingBuf},
    programs::BtfTracePointContext,
};
use scheduler_common::{
    abiss_level, ioprio, latency_slot, op, playout_kind, request_state, AttachedFile, Control,
    FileKey, HistogramKey, InflightRequest, KernelLayout, LatencyCounters, PlayoutEvent,
    RequestEvent, RequestOrigin, UringSubmission, EVENT_RING_BYTES, MAX_ATTACHED_FILES,
    MAX_FILE_READERS, MAX_HISTOGRAM_KEYS, MAX_INFLIGHT, MAX_URING_INFLIGHT, PLAYOUT_RING_BYTES,
};

/// Filled in by abissd (`EbpfLoader::set_global`) before load.
#[no_mangle]
static KERNEL_LAYOUT: KernelLayout = KernelLayout::UNSET;

#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

/// One record per `struct request` seen (see `MAX_INFLIGHT`): reused in place by the next
/// request in the same slot, so the hot path does lookups and stores, not map updates.
#[map]
static INFLIGHT: HashMap<u64, InflightRequest> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Submitter and file of each tracked request, while events are wanted (reused like INFLIGHT).
#[map]
static ORIGINS: HashMap<u64, RequestOrigin> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

#[map]
static LATENCY: PerCpuHashMap<HistogramKey, LatencyCounters> =
    PerCpuHashMap::with_max_entries(MAX_HISTOGRAM_KEYS, 0);

/// One all-zero histogram: a new histogram key is initialised from it, because the value is
/// too large for the 512-byte eBPF stack.
#[map]
static ZERO_COUNTERS: Array<LatencyCounters> = Array::with_max_entries(1, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

/// Files attached as streams, written by abissd.
#[map]
static ATTACHED: HashMap<FileKey, AttachedFile> = HashMap::with_max_entries(MAX_ATTACHED_FILES, 0);

/// Reads, faults and misses of attached files, for abissd's playout tracking.
#[map]
static PLAYOUT: RingBuf = RingBuf::with_byte_size(PLAYOUT_RING_BYTES, 0);

/// Processes (tgid) seen reading an attached file, with the stream: their `io_uring` requests
/// are followed, nobody else's, so other rings pay one lookup per submission.
#[map]
static FILE_READERS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_FILE_READERS, 0);

/// `io_uring` requests on attached files between submission and completion, by request address.
#[map]
static URING_INFLIGHT: HashMap<u64, UringSubmission> =
    HashMap::with_max_entries(MAX_URING_INFLIGHT, 0);

macro_rules! layout {
    ($field:ident) => {
        // SAFETY: reading a plain u32 from the program's own read-only data.
        unsafe { core::ptr::read_volatile(&raw const KERNEL_LAYOUT.$field) }
    };
}

/// Loads a field of a BTF-typed kernel pointer (a tracepoint argument, or a pointer loaded from
/// one). The offsets live in frozen read-only data, so the verifier knows them as constants and
/// checks each access against the kernel's BTF; the load is a plain instruction with fault
/// handling, several times cheaper than a `bpf_probe_read_kernel` call.
#[inline(always)]
fn field<T: Copy>(base: u64, offset: u32) -> T {
    // SAFETY: verified by the kernel against BTF; faults read as zero.
    unsafe { core::ptr::read_volatile((base + u64::from(offset)) as *const T) }
}

/// Reads a `T` at `base + offset` where `base` was computed (not loaded from a typed field), so
/// the verifier cannot type it.
#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely on bad addresses and returns an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// Inode number and filesystem device of the page-cache page a bio starts with, if any.
#[inline(always)]
fn bio_inode(bio: u64) -> (u64, u32) {
    if bio == 0 {
        return (0, 0);
    }
    let vec: u64 = field(bio, layout!(bio_io_vec));
    if vec == 0 {
        return (0, 0);
    }
    let mut page: u64 = field(vec, layout!(bvec_page));
    if page == 0 {
        return (0, 0);
    }
    // A tail page of a large folio points to its head with bit 0 set; the head has the mapping.
    // Read as a number: the verifier types this union slot as `lru.next`, a pointer.
    let head = read::<u64>(page, layout!(page_compound_head)).unwrap_or(0);
    if head & 1 == 1 {
        page = head - 1;
    }
    // From here on the pointers are read as plain numbers: the mapping's low bits must be
    // tested, which the verifier forbids on typed pointers.
    let Some(mapping) = read::<u64>(page, layout!(page_mapping)) else {
        return (0, 0);
    };
    // Anonymous and KSM pages (direct I/O into user memory) tag the low bits: their file, if
    // any, is found through the direct I/O's kiocb.
    if mapping == 0 || mapping & 3 != 0 {
        return direct_io_inode(bio);
    }
    let Some(inode) = read::<u64>(mapping, layout!(mapping_host)) else {
        return (0, 0);
    };
    inode_key(inode)
}

/// Inode number and filesystem device of an inode (an untyped pointer).
#[inline(always)]
fn inode_key(inode: u64) -> (u64, u32) {
    let ino = read::<u64>(inode, layout!(inode_ino)).unwrap_or(0);
    let dev = read::<u64>(inode, layout!(inode_sb))
        .and_then(|sb| read::<u32>(sb, layout!(sb_dev)))
        .unwrap_or(0);
    (ino, dev)
}

/// The file of a direct I/O bio: iomap's direct I/O (ext4, xfs, btrfs …) completes its bios
/// in `iomap_dio_bio_end_io` with `bi_private` pointing at its `iomap_dio`, whose kiocb names
/// the file, whether read(2) or `io_uring` issued it.
#[inline(always)]
fn direct_io_inode(bio: u64) -> (u64, u32) {
    let end_io = layout!(iomap_dio_end_io);
    if end_io == 0 || read::<u64>(bio, layout!(bio_end_io)) != Some(end_io) {
        return (0, 0);
    }
    let inode = read::<u64>(bio, layout!(bio_private))
        .and_then(|dio| read::<u64>(dio, layout!(iomap_dio_iocb)))
        .and_then(|iocb| read::<u64>(iocb, layout!(kiocb_filp)))
        .and_then(|file| read::<u64>(file, layout!(file_inode)));
    match inode {
        Some(inode) => inode_key(inode),
        None => (0, 0),
    }
}

/// Whether per-request attribution is wanted (someone streams events).
#[inline(always)]
fn attributing() -> bool {
    CONTROL
        .get(0)
        .is_some_and(|control| control.emit_events != 0)
}

/// Whether any file is attached, so requests' files are worth looking up.
#[inline(always)]
fn files_attached() -> bool {
    CONTROL
        .get(0)
        .is_some_and(|control| control.attached_files != 0)
}

/// Records the submitter and file of a request seen for the first time. The current task is
/// the submitter: requests are inserted (or, without an elevator, issued) from the submitting
/// task's plug, and requeues keep their record.
#[inline(always)]
fn record_origin(rq: u64, (ino, ino_dev): (u64, u32)) -> bool {
    let pid_tgid = bpf_get_current_pid_tgid();
    #[expect(clippy::cast_possible_truncation, reason = "the helpers pack two u32s")]
    let origin = RequestOrigin {
        ino,
        ino_dev,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        uid: bpf_get_current_uid_gid() as u32,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    match ORIGINS.get_ptr_mut(rq) {
        Some(slot) => {
            // SAFETY: pointer to a live map value of this type.
            unsafe { *slot = origin };
            true
        }
        None => ORIGINS.insert(rq, origin, 0).is_ok(),
    }
}

/// Starts a new request's record: in place in the slot's existing record when the request's
/// struct was seen before (the common case, since blk-mq recycles them), else inserted.
#[inline(always)]
fn start_record(rq: u64, slot: Option<*mut InflightRequest>, now: u64, state: u32) {
    let queue: u64 = field(rq, layout!(request_q));
    if queue == 0 {
        return;
    }
    let disk: u64 = field(queue, layout!(queue_disk));
    if disk == 0 {
        return;
    }
    let major: u32 = field(disk, layout!(gendisk_major));
    let minor: u32 = field(disk, layout!(gendisk_first_minor));
    let cmd_flags: u32 = field(rq, layout!(request_cmd_flags));
    let bio: u64 = field(rq, layout!(request_bio));
    // Since Linux 6.x a request's priority is its first bio's (req_get_ioprio).
    let prio: u16 = if bio == 0 {
        0
    } else {
        field(bio, layout!(bio_ioprio))
    };
    let (class, level) = ioprio::split(prio);
    // One look at the switches for both questions.
    let control = CONTROL.get(0).copied().unwrap_or_default();
    let wants_origin = control.emit_events != 0;
    let file = if wants_origin || control.attached_files != 0 {
        bio_inode(bio)
    } else {
        (0, 0)
    };
    let attributed = wants_origin && record_origin(rq, file);
    // The stream is found by the file the pages belong to, so readahead, io-wq workers and
    // the daemon's prefetch are all tagged, not only the reader's own task.
    let stream = attached_file(file).unwrap_or_default();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "REQ_OP_* fits in the low 8 bits"
    )]
    let operation = (cmd_flags & op::MASK) as u8;
    if stream.stream != 0
        && operation == op::READ
        && abiss_level::from_kernel(class, level) > stream.level
    {
        report_queued_low(&stream, prio);
    }
    let record = InflightRequest {
        queued_ns: now,
        issued_ns: if state == request_state::ISSUED {
            now
        } else {
            0
        },
        sector: field(rq, layout!(request_sector)),
        dev: (major << 20) | minor,
        bytes: field(rq, layout!(request_data_len)),
        op: operation,
        class,
        level,
        attributed: u8::from(attributed),
        state,
        stream_level: stream.level,
        pad: [0; 7],
        stream: stream.stream,
    };
    match slot {
        // SAFETY: pointer to a live map value of this type.
        Some(slot) => unsafe { *slot = record },
        None => {
            let _ = INFLIGHT.insert(rq, record, 0);
        }
    }
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn abiss_insert(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    let slot = INFLIGHT.get_ptr_mut(rq);
    // SAFETY: pointer to a live map value of this type.
    if let Some(existing) = slot.map(|s| unsafe { (*s).state }) {
        if existing != request_state::DONE {
            // Re-inserted after a requeue: it keeps its record and queue start.
            return 0;
        }
    }
    start_record(rq, slot, now_ns(), request_state::QUEUED);
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn abiss_issue(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    let now = now_ns();
    let slot = INFLIGHT.get_ptr_mut(rq);
    if let Some(record) = slot {
        // SAFETY: pointer to a live map value of this type.
        unsafe {
            if (*record).state == request_state::QUEUED {
                (*record).issued_ns = now;
                (*record).state = request_state::ISSUED;
                // Merges after insert grow the request; issue is when its size is final.
                (*record).bytes = field(rq, layout!(request_data_len));
                return 0;
            }
        }
    }
    // No elevator (or a flush that bypasses it): the request is first seen here.
    start_record(rq, slot, now, request_state::ISSUED);
    0
}

#[btf_tracepoint(function = "block_rq_complete")]
pub fn abiss_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let error: u32 = ctx.arg(1);
    let Some(slot) = INFLIGHT.get_ptr_mut(rq) else {
        return 0;
    };
    // SAFETY: pointer to a live map value, copied, then marked free for the slot's next request.
    let record = unsafe {
        let record = *slot;
        (*slot).state = request_state::DONE;
        record
    };
    if record.state != request_state::ISSUED {
        return 0;
    }
    let now = now_ns();
    let queue_ns = record.issued_ns.saturating_sub(record.queued_ns);
    let service_ns = now.saturating_sub(record.issued_ns);
    account(&record, queue_ns, service_ns);
    if attributing() {
        let origin = if record.attributed == 0 {
            None
        } else {
            // SAFETY: pointer to a live map value of this type, copied.
            ORIGINS.get_ptr(rq).map(|found| unsafe { *found })
        };
        emit(
            &record,
            origin.unwrap_or_default(),
            now,
            queue_ns,
            service_ns,
            error,
        );
    }
    0
}

/// A request merged into another one is freed without completing.
#[btf_tracepoint(function = "block_rq_merge")]
pub fn abiss_merge(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    if let Some(slot) = INFLIGHT.get_ptr_mut(rq) {
        // SAFETY: pointer to a live map value of this type.
        unsafe { (*slot).state = request_state::DONE };
    }
    0
}

/// A requeued request goes back to the queue: it keeps its queue start, and its service time
/// starts again at the next issue.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn abiss_requeue(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    if let Some(slot) = INFLIGHT.get_ptr_mut(rq) {
        // SAFETY: pointer to a live map value of this type.
        unsafe {
            if (*slot).state != request_state::DONE {
                (*slot).issued_ns = 0;
                (*slot).state = request_state::QUEUED;
            }
        }
    }
    0
}

#[inline(always)]
fn account(tracked: &InflightRequest, queue_ns: u64, service_ns: u64) {
    let key = HistogramKey {
        dev: tracked.dev,
        op: tracked.op,
        class: tracked.class,
        level: tracked.level,
        pad: 0,
        stream: tracked.stream,
    };
    let counters = match LATENCY.get_ptr_mut(key) {
        Some(found) => found,
        None => {
            let Some(zero) = ZERO_COUNTERS.get(0) else {
                return;
            };
            let _ = LATENCY.insert(key, zero, u64::from(BPF_NOEXIST));
            let Some(found) = LATENCY.get_ptr_mut(key) else {
                return;
            };
            found
        }
    };
    let queue_slot = latency_slot(queue_ns);
    let service_slot = latency_slot(service_ns);
    // SAFETY: per-CPU value of this CPU; nothing else writes it while this program runs.
    unsafe {
        let counters = &mut *counters;
        counters.requests += 1;
        counters.bytes += u64::from(tracked.bytes);
        if tracked.stream != 0
            && abiss_level::from_kernel(tracked.class, tracked.level) > tracked.stream_level
        {
            counters.inversions += 1;
        }
        if queue_ns > counters.queue_max_ns {
            counters.queue_max_ns = queue_ns;
        }
        if service_ns > counters.service_max_ns {
            counters.service_max_ns = service_ns;
        }
        if let Some(slot) = counters.queue_slots.get_mut(queue_slot) {
            *slot += 1;
        }
        if let Some(slot) = counters.service_slots.get_mut(service_slot) {
            *slot += 1;
        }
    }
}

#[inline(always)]
fn emit(
    tracked: &InflightRequest,
    origin: RequestOrigin,
    now: u64,
    queue_ns: u64,
    service_ns: u64,
    error: u32,
) {
    if let Some(mut entry) = EVENTS.reserve::<RequestEvent>(0) {
        entry.write(RequestEvent {
            completed_ns: now,
            queue_ns,
            service_ns,
            request: *tracked,
            origin,
            error,
            pad: 0,
        });
        entry.submit(0);
    }
}

/// The stream an inode belongs to, if its file is attached. `inode` is a BTF-typed pointer.
#[inline(always)]
fn attached_stream(inode: u64) -> Option<AttachedFile> {
    if inode == 0 {
        return None;
    }
    let sb: u64 = field(inode, layout!(inode_sb));
    if sb == 0 {
        return None;
    }
    attached_file((field(inode, layout!(inode_ino)), field(sb, layout!(sb_dev))))
}

/// The stream of file (inode number, filesystem device), if it is attached.
#[inline(always)]
fn attached_file((ino, dev): (u64, u32)) -> Option<AttachedFile> {
    if ino == 0 {
        return None;
    }
    let key = FileKey { dev, pad: 0, ino };
    // SAFETY: pointer to a live map value, copied.
    ATTACHED.get_ptr(key).map(|found| unsafe { *found })
}

/// `PF_KTHREAD`: the task is a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

/// Tells abissd that the current task queued a read of a stream's file below the stream's
/// level: the task is a reader about to wait at the wrong priority. Kernel threads (a
/// workqueue flushing a plug) and abissd itself are not readers.
#[inline(always)]
fn report_queued_low(stream: &AttachedFile, ioprio: u16) {
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    if read::<u32>(task, layout!(task_flags)).unwrap_or(PF_KTHREAD) & PF_KTHREAD != 0 {
        return;
    }
    report_reader(PlayoutEvent {
        stream: stream.stream,
        kind: playout_kind::QUEUED_LOW,
        ioprio: u32::from(ioprio),
        ..PlayoutEvent::default()
    });
}

/// Sends `event` about the current task, a reader of the event's stream, and remembers its
/// process as one; abissd's own tasks are no readers.
#[inline(always)]
fn report_reader(event: PlayoutEvent) {
    let Some((tgid, pid)) = current_task_unless_daemon() else {
        return;
    };
    remember_reader(tgid, event.stream);
    report(PlayoutEvent {
        ts_ns: now_ns(),
        tgid,
        pid,
        ..event
    });
}

/// The current task as (tgid, pid), unless it is abissd itself.
#[inline(always)]
fn current_task_unless_daemon() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    #[expect(clippy::cast_possible_truncation, reason = "the helper packs two u32s")]
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let daemon = CONTROL
        .get(0)
        .is_some_and(|control| control.daemon_tgid == tgid);
    (!daemon).then_some((tgid, pid))
}

/// Sends one event about an attached file to abissd.
#[inline(always)]
fn report(event: PlayoutEvent) {
    if let Some(mut entry) = PLAYOUT.reserve::<PlayoutEvent>(0) {
        #[expect(clippy::cast_possible_truncation, reason = "the helper packs two u32s")]
        entry.write(PlayoutEvent {
            comm: bpf_get_current_comm().unwrap_or_default(),
            uid: bpf_get_current_uid_gid() as u32,
            ..event
        });
        entry.submit(0);
    }
}

/// Tells abissd that a task other than abissd touched pages of an attached file.
#[inline(always)]
fn report_access(inode: u64, first_page: u64, last_page: u64, kind: u32) {
    if layout!(valid) == 0 {
        return;
    }
    let Some(attached) = attached_stream(inode) else {
        return;
    };
    report_reader(PlayoutEvent {
        stream: attached.stream,
        first_page,
        last_page,
        kind,
        ..PlayoutEvent::default()
    });
}

/// Notes process `tgid` as a reader of `stream`'s file (a lookup, and an update only when new).
#[inline(always)]
fn remember_reader(tgid: u32, stream: u64) {
    // SAFETY: pointer to a live map value of this type, read once.
    if FILE_READERS.get_ptr(tgid).map(|found| unsafe { *found }) != Some(stream) {
        let _ = FILE_READERS.insert(tgid, stream, 0);
    }
}

/// `io_uring_submit_req(req)`: a request leaves the submission queue, in the submitting task
/// (the ring's owner, or its SQPOLL thread). Its file is not assigned yet, so the submissions
/// of processes seen reading attached files are remembered until their completion.
#[btf_tracepoint(function = "io_uring_submit_req")]
pub fn abiss_uring_submit(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 || !files_attached() {
        return 0;
    }
    let req: u64 = ctx.arg(0);
    let Some((tgid, pid)) = current_task_unless_daemon() else {
        return 0;
    };
    // SAFETY: a lookup; the value is not used.
    if unsafe { FILE_READERS.get(&tgid) }.is_none() {
        return 0;
    }
    let _ = URING_INFLIGHT.insert(
        req,
        UringSubmission {
            submitted_ns: now_ns(),
            tgid,
            pid,
        },
        0,
    );
    0
}

/// `io_uring_complete(ctx, req, cqe)`: a request posts its completion. Requests on attached
/// files are reported with their submitter, priority and latency.
#[btf_tracepoint(function = "io_uring_complete")]
pub fn abiss_uring_complete(ctx: BtfTracePointContext) -> i32 {
    // Nothing was remembered while no file was attached (abissd empties the map when the last
    // file goes).
    if !files_attached() {
        return 0;
    }
    let req: u64 = ctx.arg(1);
    // SAFETY: pointer to a live map value, copied before the entry is deleted.
    let Some(submission) = URING_INFLIGHT.get_ptr(req).map(|found| unsafe { *found }) else {
        return 0;
    };
    let _ = URING_INFLIGHT.remove(req);
    // `req` is untyped here (`void *` in the tracepoint), so the chain is probe-read.
    let Some(file) = read::<u64>(req, layout!(io_kiocb_file)) else {
        return 0;
    };
    let Some(inode) = read::<u64>(file, layout!(file_inode)) else {
        return 0;
    };
    let Some(attached) = attached_file(inode_key(inode)) else {
        return 0;
    };
    // The priority sits in the request's kiocb, at the start of its command area (read and
    // write requests; for other operations it reads as whatever is there, and is only shown).
    let ioprio = read::<u16>(req, layout!(io_kiocb_cmd) + layout!(kiocb_ioprio)).unwrap_or(0);
    let now = now_ns();
    report(PlayoutEvent {
        ts_ns: now,
        stream: attached.stream,
        tgid: submission.tgid,
        pid: submission.pid,
        kind: playout_kind::URING_COMPLETE,
        ioprio: u32::from(ioprio),
        latency_ns: now.saturating_sub(submission.submitted_ns),
        ..PlayoutEvent::default()
    });
    0
}

/// `mm_filemap_get_pages(mapping, index, last_index)`: a read(2)-family call on a file.
#[btf_tracepoint(function = "mm_filemap_get_pages")]
pub fn abiss_get_pages(ctx: BtfTracePointContext) -> i32 {
    let mapping: u64 = ctx.arg(0);
    let index: u64 = ctx.arg(1);
    let last_index: u64 = ctx.arg(2);
    if mapping != 0 {
        let inode: u64 = field(mapping, layout!(mapping_host));
        report_access(inode, index, last_index, playout_kind::READ);
    }
    0
}

/// `mm_filemap_fault(mapping, index)`: a page fault on a mapped file.
#[btf_tracepoint(function = "mm_filemap_fault")]
pub fn abiss_fault(ctx: BtfTracePointContext) -> i32 {
    let mapping: u64 = ctx.arg(0);
    let index: u64 = ctx.arg(1);
    if mapping != 0 {
        let inode: u64 = field(mapping, layout!(mapping_host));
        report_access(inode, index, index, playout_kind::FAULT);
    }
    0
}

/// `page_cache_sync_ra(inode, index, ra, req_count)`: a read missed the page cache.
#[btf_tracepoint(function = "page_cache_sync_ra")]
pub fn abiss_sync_ra(ctx: BtfTracePointContext) -> i32 {
    let inode: u64 = ctx.arg(0);
    let index: u64 = ctx.arg(1);
    let count: u64 = ctx.arg(3);
    report_access(
        inode,
        index,
        index + count.saturating_sub(1),
        playout_kind::MISS,
    );
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
#[link_section = "license"]
static LICENSE: [u8; 4] = *b"GPL\0";
