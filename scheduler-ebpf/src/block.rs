//! The block-request programs: each request on a followed disk (a managed one, or any while a
//! client traces every disk) is followed from its first sight (insert, or issue without an
//! elevator) to its completion, tagged with the stream of the file its pages belong to (on
//! managed disks), attributed to the task that submitted it, and its queue and service times
//! added to the per-CPU `LATENCY` histograms; `EVENTS` gets one record per completion while
//! someone streams them. Every program first decides whether the request's disk is followed
//! (`watched_disk`) and returns at once if not.
//!
//! BTF tracepoints: `block_rq_insert`, `block_rq_issue`, `block_rq_complete`, `block_rq_merge`,
//! `block_rq_requeue`.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_uid_gid,
    },
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use scheduler_common::{
    abiss_level, disk_flags, ioprio, latency_slot, op, playout_kind, raised_flags, request_state,
    stream_count_after, stream_count_for, AttachedFile, Control, HistogramKey, InflightRequest,
    PlayoutEvent, RaisedRequest, RequestEvent, RequestOrigin,
};

use crate::kernel::{
    attached_file, bio_inode, counts_of, current_started_ns, field, layout, now_ns,
    raise_of_shared_context, raised_entry, read, remember_raised_context, report_reader,
    PF_KTHREAD,
};
use crate::maps::{
    CONTROL, DISKS, EVENTS, INFLIGHT, LATENCY, ORIGINS, RAISED, RAISED_REQUESTS, RAISE_COUNTS,
    ZERO_COUNTERS,
};

/// A request's disk, when its requests are followed.
#[derive(Clone, Copy)]
struct Watched {
    /// The disk's `dev_t` (kernel encoding).
    dev: u32,
    /// Its `disk_flags` (`TRACED` always set).
    flags: u32,
    /// The switches, as read for this decision.
    control: Control,
}

/// Whether `rq`'s disk is followed, decided first thing by every block program: one read of
/// `CONTROL` (an array, inlined by the JIT) returns while no disk is listed and nobody traces
/// every disk; otherwise the disk's `dev_t` (three loads from the request) and one `DISKS`
/// lookup, skipped when every disk is traced and none is listed.
#[inline(always)]
fn watched_disk(rq: u64) -> Option<Watched> {
    watched_disk_under(rq, *CONTROL.get(0)?)
}

/// [`watched_disk`] with `CONTROL` already read (the insert program reads it once for both
/// the raised-thread check and this).
#[inline(always)]
fn watched_disk_under(rq: u64, control: Control) -> Option<Watched> {
    if layout!(valid) == 0 {
        return None;
    }
    let trace_all = control.trace_all != 0;
    if !trace_all && control.listed_disks == 0 {
        return None;
    }
    let queue: u64 = field(rq, layout!(request_q));
    if queue == 0 {
        return None;
    }
    let disk: u64 = field(queue, layout!(queue_disk));
    if disk == 0 {
        return None;
    }
    let major: u32 = field(disk, layout!(gendisk_major));
    let minor: u32 = field(disk, layout!(gendisk_first_minor));
    let dev = (major << 20) | minor;
    let listed = if control.listed_disks == 0 {
        0
    } else {
        // SAFETY: pointer to a live map value, copied.
        DISKS.get_ptr(&dev).map_or(0, |flags| unsafe { *flags })
    };
    let flags = if trace_all {
        listed | disk_flags::TRACED
    } else {
        listed
    };
    (flags & disk_flags::TRACED != 0).then_some(Watched {
        dev,
        flags,
        control,
    })
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
/// struct was seen before (the common case, since blk-mq recycles them), else inserted. The
/// file and stream are looked up on managed disks only (no stream lives elsewhere), and for
/// the origin while events are streamed.
#[inline(always)]
fn start_record(rq: u64, slot: Option<*mut InflightRequest>, now: u64, state: u32, disk: &Watched) {
    let cmd_flags: u32 = field(rq, layout!(request_cmd_flags));
    let bio: u64 = field(rq, layout!(request_bio));
    // Since Linux 6.x a request's priority is its first bio's (req_get_ioprio).
    let prio: u16 = if bio == 0 {
        0
    } else {
        field(bio, layout!(bio_ioprio))
    };
    let (class, level) = ioprio::split(prio);
    let wants_origin = disk.control.emit_events != 0;
    let tags_streams = disk.flags & disk_flags::MANAGED != 0 && disk.control.attached_files != 0;
    let file = if wants_origin || tags_streams {
        bio_inode(bio)
    } else {
        (0, 0)
    };
    let attributed = wants_origin && record_origin(rq, file);
    // The stream is found by the file the pages belong to, so readahead, io-wq workers and
    // the daemon's prefetch are all tagged, not only the reader's own task.
    let stream = if tags_streams {
        attached_file(file).unwrap_or_default()
    } else {
        AttachedFile::default()
    };
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
        dev: disk.dev,
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

/// Counts the KiB of a real-time request that a thread abissd raised queues for anything but
/// its stream's file, on any disk with an elevator (where a priority matters at all): itself,
/// a task it made, or a task sharing its I/O context (its `io_uring` workers). Costs
/// nothing beyond the insert program's one `CONTROL` read while nothing is raised.
#[inline(always)]
fn police_raised(rq: u64, control: &Control) {
    if control.raised_threads == 0 || layout!(valid) == 0 {
        return;
    }
    // Only real-time requests are counted: the others cost two field reads.
    let bio: u64 = field(rq, layout!(request_bio));
    if bio == 0 {
        return;
    }
    let (class, _) = ioprio::split(field(bio, layout!(bio_ioprio)));
    if class != ioprio::CLASS_RT {
        return;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the low half is the thread id"
    )]
    let tid = bpf_get_current_pid_tgid() as u32;
    let raise = match raised_entry(tid, current_started_ns) {
        Some(own) => {
            remember_raised_context(tid, own);
            own
        }
        None => {
            let Some(shared) = raise_of_shared_context() else {
                return;
            };
            shared
        }
    };
    // SAFETY: pointer to a live map value of this type, copied.
    let raise = unsafe { *raise };
    // A task the raised thread made counts against that thread's raise (its `root`, as a
    // raised thread's own entry names itself), and for that raise's file: a `CLONE_IO` child
    // shares the thread's I/O context, so its priority, which abissd cannot put back apart
    // from the thread, and uncounted its reads of any file stayed real time for as long as
    // the thread kept its raise.
    let own = if raise.flags & raised_flags::INHERITED == 0 {
        raise
    } else {
        // SAFETY: pointer to a live map value of this type, copied.
        match RAISED.get_ptr(raise.root).map(|root| unsafe { *root }) {
            // Not a task's entry under an id that came round again.
            Some(root) if root.flags & raised_flags::INHERITED == 0 => root,
            _ => return,
        }
    };
    let Some(counts) = counts_of(raise.root) else {
        return;
    };
    // SAFETY: pointer to a live map value of this type; a lost update between two CPUs only
    // undercounts.
    let counts = unsafe { &mut *counts };
    let bytes: u32 = field(rq, layout!(request_data_len));
    let kib = bytes.div_ceil(1024);
    let own_file = attached_file(bio_inode(bio)).map_or(0, |file| file.stream) == own.stream;
    // What bios merge into the request while it waits is counted at its issue.
    let _ = RAISED_REQUESTS.insert(
        rq,
        RaisedRequest {
            root: raise.root,
            generation: own.generation,
            counted_kib: kib,
            own_file: u32::from(own_file),
        },
        0,
    );
    if !own_file {
        counts.stray_kib = counts.stray_kib.saturating_add(kib);
    } else {
        // One load and one store of the word: the count never goes with another generation.
        let word = &raw mut counts.stream_count;
        // SAFETY: an aligned field of a live map value.
        unsafe {
            let count = word.read_volatile();
            word.write_volatile(stream_count_after(count, own.generation, kib));
        }
    }
}

/// A raised thread's real-time request (see [`police_raised`]) is issued, or merged into
/// another (`issued` false): at its issue, what bios merged into it since its insert (small
/// `O_DIRECT` reads back-merge into a queued request; no insert is seen for them) is counted
/// against the same raise; merged away, what was counted for it is taken back, since the
/// request it went into counts it at its issue. Only while that raise goes on, for the file
/// it counted for. One `CONTROL` read while nothing is raised.
#[inline(always)]
fn settle_raised_request(rq: u64, issued: bool) {
    if CONTROL.get(0).map_or(0, |control| control.raised_threads) == 0 {
        return;
    }
    // SAFETY: pointer to a live map value of this type, copied.
    let Some(request) = RAISED_REQUESTS.get_ptr(rq).map(|found| unsafe { *found }) else {
        return;
    };
    let _ = RAISED_REQUESTS.remove(rq);
    // SAFETY: pointer to a live map value of this type, copied.
    let Some(own) = RAISED.get_ptr(request.root).map(|entry| unsafe { *entry }) else {
        return;
    };
    if own.flags & raised_flags::INHERITED != 0 || own.generation != request.generation {
        return;
    }
    // Not made here: a raise without counts has counted nothing to settle.
    let Some(counts) = RAISE_COUNTS.get_ptr_mut(request.root) else {
        return;
    };
    let now_kib = if issued {
        field::<u32>(rq, layout!(request_data_len)).div_ceil(1024)
    } else {
        0
    };
    let settle = |count: u32| {
        if issued {
            count.saturating_add(now_kib.saturating_sub(request.counted_kib))
        } else {
            count.saturating_sub(request.counted_kib)
        }
    };
    // SAFETY: pointer to a live map value of this type; a lost update between two CPUs only
    // miscounts by this request.
    let counts = unsafe { &mut *counts };
    if request.own_file == 0 {
        counts.stray_kib = settle(counts.stray_kib);
    } else {
        let word = &raw mut counts.stream_count;
        // SAFETY: an aligned field of a live map value; one load and one store.
        unsafe {
            let count = word.read_volatile();
            let kib = settle(stream_count_for(count, request.generation));
            word.write_volatile((u64::from(request.generation) << 32) | u64::from(kib));
        }
    }
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn abiss_insert(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let Some(control) = CONTROL.get(0).copied() else {
        return 0;
    };
    police_raised(rq, &control);
    let Some(disk) = watched_disk_under(rq, control) else {
        return 0;
    };
    let slot = INFLIGHT.get_ptr_mut(rq);
    // SAFETY: pointer to a live map value of this type.
    if slot.is_some_and(|s| unsafe { (*s).state } == request_state::REQUEUED) {
        // Re-inserted after a requeue: it keeps its record and queue start.
        return 0;
    }
    start_record(rq, slot, now_ns(), request_state::QUEUED, &disk);
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn abiss_issue(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    settle_raised_request(rq, true);
    let Some(disk) = watched_disk(rq) else {
        return 0;
    };
    let now = now_ns();
    let slot = INFLIGHT.get_ptr_mut(rq);
    if let Some(record) = slot {
        // SAFETY: pointer to a live map value of this type.
        unsafe {
            let state = (*record).state;
            if state == request_state::QUEUED || state == request_state::REQUEUED {
                (*record).issued_ns = now;
                (*record).state = request_state::ISSUED;
                // Merges after insert grow the request; issue is when its size is final.
                (*record).bytes = field(rq, layout!(request_data_len));
                return 0;
            }
        }
    }
    // No elevator (or a flush that bypasses it): the request is first seen here.
    start_record(rq, slot, now, request_state::ISSUED, &disk);
    0
}

#[btf_tracepoint(function = "block_rq_complete")]
pub fn abiss_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let Some(disk) = watched_disk(rq) else {
        return 0;
    };
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
    if disk.control.emit_events != 0 {
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
    settle_raised_request(rq, false);
    if watched_disk(rq).is_none() {
        return 0;
    }
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
    if watched_disk(rq).is_none() {
        return 0;
    }
    if let Some(slot) = INFLIGHT.get_ptr_mut(rq) {
        // SAFETY: pointer to a live map value of this type.
        unsafe {
            if (*slot).state != request_state::DONE {
                (*slot).issued_ns = 0;
                (*slot).state = request_state::REQUEUED;
            }
        }
    }
    0
}

/// Adds a completed request to its (device, operation, priority, stream) histogram, counting
/// it as an inversion when it ran below its stream's level.
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

/// Sends one completed request, with its submitter, to the `EVENTS` ring (dropped when full).
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
    // Other users' requests steer nothing in abissd: they must not fill the shared ring (nor,
    // through the reader it remembers, make their io_uring requests reported).
    #[expect(clippy::cast_possible_truncation, reason = "the low half is the uid")]
    let uid = bpf_get_current_uid_gid() as u32;
    if !stream.reports(uid) {
        return;
    }
    report_reader(PlayoutEvent {
        stream: stream.stream,
        kind: playout_kind::QUEUED_LOW,
        ioprio: u32::from(ioprio),
        ..PlayoutEvent::default()
    });
}
