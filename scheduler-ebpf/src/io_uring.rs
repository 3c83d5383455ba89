//! The `io_uring` programs: requests submitted by processes seen reading an attached file are
//! remembered (`URING_INFLIGHT`) until they complete, and those on attached files are reported
//! to abissd (the `PLAYOUT` ring) with their submitter, priority and latency.
//!
//! Every request of such a process is remembered (its file is not known yet), so one that never
//! completes (a poll on a pipe) stays; each user may have `MAX_URING_INFLIGHT_PER_USER` at
//! once (counted in `URING_USERS`), so one user's stuck requests take only that user's room.
//!
//! BTF tracepoints: `io_uring_submit_req`, `io_uring_complete`.

use aya_ebpf::{
    helpers::bpf_get_current_uid_gid, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use scheduler_common::{playout_kind, PlayoutEvent, UringSubmission, MAX_URING_INFLIGHT_PER_USER};

use crate::kernel::{
    add_to, attached_file, current_task_unless, files_attached, inode_key, layout,
    note_raised_context, now_ns, read, report, take_room,
};
use crate::maps::{CONTROL, FILE_READERS, URING_GIVEN, URING_INFLIGHT, URING_USERS};

/// Gives back one of user `uid`'s followed requests (its entry was taken out). A count at what
/// abissd gave back stays there: one an emptying of the maps reset is not taken below it.
#[inline(always)]
fn give_back(uid: u32) {
    // SAFETY: a lookup of a plain u64, copied.
    let given = unsafe { URING_GIVEN.get(&uid) }.copied().unwrap_or(0);
    if let Some(count) = URING_USERS.get_ptr_mut(uid) {
        // SAFETY: an aligned u64 of a live map value.
        if unsafe { count.read_volatile() } > given {
            add_to(count, u64::MAX);
        }
    }
}

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
    #[expect(clippy::cast_possible_truncation, reason = "the low half is the uid")]
    let uid = bpf_get_current_uid_gid() as u32;
    // Past the user's room (full of requests that have not completed), this one is not
    // followed, and nobody else's room is taken.
    let Some(count) = take_room(&URING_USERS, &URING_GIVEN, uid, MAX_URING_INFLIGHT_PER_USER)
    else {
        return 0;
    };
    // A request at the address of one whose completion was not seen replaces it: that one's
    // user gets its room back.
    // SAFETY: pointer to a live map value, one field copied.
    if let Some(earlier) = URING_INFLIGHT
        .get_ptr(req)
        .map(|found| unsafe { (*found).uid })
    {
        if URING_INFLIGHT.remove(req).is_ok() {
            give_back(earlier);
        }
    }
    let submission = UringSubmission {
        submitted_ns: now_ns(),
        tgid,
        pid,
        uid,
        pad: 0,
    };
    if URING_INFLIGHT.insert(req, submission, 0).is_err() {
        add_to(count, u64::MAX);
    }
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
    // Whoever takes the entry out gives its user's room back (abissd may be dropping it as
    // stale at the same moment).
    if URING_INFLIGHT.remove(req).is_ok() {
        give_back(submission.uid);
    }
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
