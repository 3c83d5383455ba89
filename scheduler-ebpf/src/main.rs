//! abiss eBPF programs: block-layer request tracing.
//!
//! The programs hold no policy. They follow each block request from its first sight (insert or
//! issue) to its completion, attribute it to the task that submitted its first bio and to the
//! inode whose page-cache pages it carries, and add its queue and service time to per-CPU log2
//! histograms keyed by (device, operation, I/O priority). The daemon reads the maps.
//!
//! Kernel struct offsets come from `KERNEL_LAYOUT`, which `abissd` fills in from the running
//! kernel's BTF before loading (Rust eBPF has no CO-RE field relocations).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_uid_gid,
        bpf_probe_read_kernel, generated::bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map},
    maps::{Array, LruHashMap, PerCpuHashMap, RingBuf},
    programs::BtfTracePointContext,
};
use scheduler_common::{
    ioprio, latency_slot, op, Control, HistogramKey, InflightRequest, KernelLayout,
    LatencyCounters, RequestEvent, TaskOrigin, EVENT_RING_BYTES, MAX_BIO_ORIGINS,
    MAX_HISTOGRAM_KEYS, MAX_INFLIGHT,
};

/// Filled in by abissd (`EbpfLoader::set_global`) before load.
#[no_mangle]
static KERNEL_LAYOUT: KernelLayout = KernelLayout::UNSET;

#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

#[map]
static INFLIGHT: LruHashMap<u64, InflightRequest> = LruHashMap::with_max_entries(MAX_INFLIGHT, 0);

#[map]
static BIO_ORIGINS: LruHashMap<u64, TaskOrigin> = LruHashMap::with_max_entries(MAX_BIO_ORIGINS, 0);

#[map]
static LATENCY: PerCpuHashMap<HistogramKey, LatencyCounters> =
    PerCpuHashMap::with_max_entries(MAX_HISTOGRAM_KEYS, 0);

/// One all-zero histogram: a new histogram key is initialised from it, because the value is
/// too large for the 512-byte eBPF stack.
#[map]
static ZERO_COUNTERS: Array<LatencyCounters> = Array::with_max_entries(1, 0);

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);

macro_rules! layout {
    ($field:ident) => {
        // SAFETY: reading a plain u32 from the program's own read-only data.
        unsafe { core::ptr::read_volatile(&raw const KERNEL_LAYOUT.$field) }
    };
}

/// Reads a `T` at `base + offset` in kernel memory.
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

#[inline(always)]
fn current_origin(queued_ns: u64) -> TaskOrigin {
    let pid_tgid = bpf_get_current_pid_tgid();
    #[expect(clippy::cast_possible_truncation, reason = "the helper packs two u32s")]
    TaskOrigin {
        queued_ns,
        tgid: (pid_tgid >> 32) as u32,
        pid: pid_tgid as u32,
        uid: bpf_get_current_uid_gid() as u32,
        pad: 0,
        comm: bpf_get_current_comm().unwrap_or_default(),
    }
}

/// Inode number and filesystem device of the page-cache page a bio starts with, if any.
#[inline(always)]
fn bio_inode(bio: u64) -> (u64, u32) {
    let Some(vec) = read::<u64>(bio, layout!(bio_io_vec)) else {
        return (0, 0);
    };
    let Some(mut page) = read::<u64>(vec, layout!(bvec_page)) else {
        return (0, 0);
    };
    // A tail page of a large folio points to its head with bit 0 set; the head has the mapping.
    if let Some(head) = read::<u64>(page, layout!(page_compound_head)) {
        if head & 1 == 1 {
            page = head - 1;
        }
    }
    let Some(mapping) = read::<u64>(page, layout!(page_mapping)) else {
        return (0, 0);
    };
    // Anonymous and KSM pages (direct I/O into user memory) tag the low bits: no file.
    if mapping & 3 != 0 {
        return (0, 0);
    }
    let Some(inode) = read::<u64>(mapping, layout!(mapping_host)) else {
        return (0, 0);
    };
    let ino = read::<u64>(inode, layout!(inode_ino)).unwrap_or(0);
    let dev = read::<u64>(inode, layout!(inode_sb))
        .and_then(|sb| read::<u32>(sb, layout!(sb_dev)))
        .unwrap_or(0);
    (ino, dev)
}

/// Builds the tracking record of a request seen for the first time.
#[inline(always)]
fn first_sight(rq: u64, now: u64, inserted: bool) -> Option<InflightRequest> {
    let disk = read::<u64>(rq, layout!(request_q)).and_then(|q| read::<u64>(q, layout!(queue_disk)))?;
    let major = read::<u32>(disk, layout!(gendisk_major))?;
    let minor = read::<u32>(disk, layout!(gendisk_first_minor))?;
    let cmd_flags = read::<u32>(rq, layout!(request_cmd_flags)).unwrap_or(0);
    let bio = read::<u64>(rq, layout!(request_bio)).unwrap_or(0);
    // Since Linux 6.x a request's priority is its first bio's (req_get_ioprio).
    let prio = read::<u16>(bio, layout!(bio_ioprio)).unwrap_or(0);
    let (class, level) = ioprio::split(prio);
    let (ino, ino_dev) = bio_inode(bio);
    let origin = match BIO_ORIGINS.get_ptr(bio) {
        // SAFETY: pointer to a live map value, read once.
        Some(found) => unsafe { *found },
        None => current_origin(now),
    };
    if bio != 0 {
        let _ = BIO_ORIGINS.remove(bio);
    }
    #[expect(clippy::cast_possible_truncation, reason = "REQ_OP_* fits in the low 8 bits")]
    let operation = (cmd_flags & op::MASK) as u8;
    Some(InflightRequest {
        queued_ns: if inserted || origin.queued_ns == 0 {
            now
        } else {
            origin.queued_ns
        },
        issued_ns: 0,
        sector: read::<u64>(rq, layout!(request_sector)).unwrap_or(0),
        ino,
        ino_dev,
        dev: (major << 20) | minor,
        bytes: read::<u32>(rq, layout!(request_data_len)).unwrap_or(0),
        op: operation,
        class,
        level,
        pad: 0,
        origin,
    })
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn abiss_bio_queue(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let bio: u64 = ctx.arg(0);
    let _ = BIO_ORIGINS.insert(bio, current_origin(now_ns()), 0);
    0
}

#[btf_tracepoint(function = "block_rq_insert")]
pub fn abiss_insert(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    if INFLIGHT.get_ptr(rq).is_none() {
        if let Some(tracked) = first_sight(rq, now_ns(), true) {
            let _ = INFLIGHT.insert(rq, tracked, 0);
        }
    }
    0
}

#[btf_tracepoint(function = "block_rq_issue")]
pub fn abiss_issue(ctx: BtfTracePointContext) -> i32 {
    if layout!(valid) == 0 {
        return 0;
    }
    let rq: u64 = ctx.arg(0);
    let now = now_ns();
    if let Some(tracked) = INFLIGHT.get_ptr_mut(rq) {
        // SAFETY: pointer to a live map value of this type.
        unsafe {
            (*tracked).issued_ns = now;
            // Merges after insert grow the request; issue is when its size is final.
            (*tracked).bytes = read::<u32>(rq, layout!(request_data_len)).unwrap_or((*tracked).bytes);
        }
    } else if let Some(mut tracked) = first_sight(rq, now, false) {
        tracked.issued_ns = now;
        let _ = INFLIGHT.insert(rq, tracked, 0);
    }
    0
}

#[btf_tracepoint(function = "block_rq_complete")]
pub fn abiss_complete(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let error: u32 = ctx.arg(1);
    let Some(tracked) = INFLIGHT.get_ptr(rq) else {
        return 0;
    };
    // SAFETY: pointer to a live map value, copied before the entry is removed.
    let tracked = unsafe { *tracked };
    let _ = INFLIGHT.remove(rq);
    if tracked.issued_ns == 0 {
        return 0;
    }
    let now = now_ns();
    let queue_ns = tracked.issued_ns.saturating_sub(tracked.queued_ns);
    let service_ns = now.saturating_sub(tracked.issued_ns);
    account(&tracked, queue_ns, service_ns);
    emit(&tracked, now, queue_ns, service_ns, error);
    0
}

/// A request merged into another one is freed without completing.
#[btf_tracepoint(function = "block_rq_merge")]
pub fn abiss_merge(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    let _ = INFLIGHT.remove(rq);
    0
}

/// A requeued request goes back to the queue: it keeps its queue start, and its service time
/// starts again at the next issue.
#[btf_tracepoint(function = "block_rq_requeue")]
pub fn abiss_requeue(ctx: BtfTracePointContext) -> i32 {
    let rq: u64 = ctx.arg(0);
    if let Some(tracked) = INFLIGHT.get_ptr_mut(rq) {
        // SAFETY: pointer to a live map value of this type.
        unsafe { (*tracked).issued_ns = 0 };
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
fn emit(tracked: &InflightRequest, now: u64, queue_ns: u64, service_ns: u64, error: u32) {
    let wanted = CONTROL.get(0).is_some_and(|control| control.emit_events != 0);
    if !wanted {
        return;
    }
    if let Some(mut entry) = EVENTS.reserve::<RequestEvent>(0) {
        entry.write(RequestEvent {
            completed_ns: now,
            queue_ns,
            service_ns,
            request: *tracked,
            error,
            pad: 0,
        });
        entry.submit(0);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
#[link_section = "license"]
static LICENSE: [u8; 4] = *b"GPL\0";
