//! The `io_uring` programs: requests submitted by processes seen reading an attached file are
//! remembered (`URING_INFLIGHT`) until they complete, and those on attached files are reported
//! to abissd (the `PLAYOUT` ring) with their submitter, priority and latency.
//!
//! BTF tracepoints: `io_uring_submit_req`, `io_uring_complete`.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use scheduler_common::{playout_kind, PlayoutEvent, UringSubmission};

use crate::kernel::{
    attached_file, current_task_unless, files_attached, inode_key, layout, note_raised_context,
    now_ns, read, report,
};
use crate::maps::{CONTROL, FILE_READERS, URING_INFLIGHT};

/// `io_uring_submit_req(req)`: a request leaves the submission queue, in the submitting task
/// (the ring's owner, or its SQPOLL thread). Its file is not assigned yet, so the submissions
/// of processes seen reading attached files are remembered until their completion.
#[btf_tracepoint(function = "io_uring_submit_req")]
pub fn abiss_uring_submit(ctx: BtfTracePointContext) -> i32 {
    // One read of the switches: whether any file is attached, and which process is abissd.
    let Some(control) = CONTROL.get(0) else {
        return 0;
    };
    if control.attached_files == 0 || layout!(valid) == 0 {
        return 0;
    }
    let Some((tgid, pid)) = current_task_unless(control.daemon_tgid) else {
        return 0;
    };
    // SAFETY: a lookup; the value is not used.
    if unsafe { FILE_READERS.get(&tgid) }.is_none() {
        return 0;
    }
    // A raised reader whose reads all go to its ring's workers (`IOSQE_ASYNC`) is seen here
    // only: its I/O context is what they share.
    note_raised_context();
    let req: u64 = ctx.arg(0);
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
