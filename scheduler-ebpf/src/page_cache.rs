//! The page-cache programs: reads, page faults and page-cache misses on attached files are
//! reported to abissd (the `PLAYOUT` ring) with the pages they touch, for its playout tracking.
//! While no file is attached they return at once, before reading anything of the event.
//!
//! BTF tracepoints: `mm_filemap_get_pages`, `mm_filemap_fault`, `page_cache_sync_ra`, and
//! `mm_filemap_add_to_page_cache` where the kernel lacks `page_cache_sync_ra`.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_uid_gid},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use scheduler_common::{
    playout_kind, FillReport, PlayoutEvent, FILL_REPORT_GAP_NS, READ_REPORT_BURST,
    READ_REPORT_GAP_NS,
};

use crate::kernel::{
    attached_stream, field, files_attached, layout, note_raised_context, now_ns, read,
    report_reader, PF_KTHREAD,
};
use crate::maps::{LAST_FILL, READ_REPORT_DUE};

/// Whether the programs have anything to look for: the layout is filled in and some file is
/// attached. Checked first, so every other buffered read and fault costs one array read.
#[inline(always)]
fn watching_files() -> bool {
    layout!(valid) != 0 && files_attached()
}

/// Tells abissd that a task other than abissd touched pages of an attached file, if the
/// task's user is the one the stream follows (its owner; anyone for root's streams). Other
/// users' reads steer nothing, and one of them reading in a tight loop would otherwise fill
/// the shared ring with a record per read(2), so that other streams' misses find no room.
#[inline(always)]
fn report_access(inode: u64, first_page: u64, last_page: u64, kind: u32) {
    let Some(attached) = attached_stream(inode) else {
        return;
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the helper packs uid and gid"
    )]
    let uid = bpf_get_current_uid_gid() as u32;
    if !attached.reports(uid) {
        return;
    }
    // A raised reader is seen here: its I/O context is what its io_uring workers share.
    note_raised_context();
    if kind != playout_kind::MISS && !read_report_due(attached.stream, uid) {
        return;
    }
    report_reader(PlayoutEvent {
        stream: attached.stream,
        first_page,
        last_page,
        kind,
        ..PlayoutEvent::default()
    });
}

/// Whether a read or fault of the file tagged `stream` by user `uid` is reported now: that
/// user's token bucket for the file (`READ_REPORT_GAP_NS`, `READ_REPORT_BURST`) holds a token.
/// Per user, not per file: with one bucket per file, a co-owner rereading one cached byte in a
/// loop emptied it, and the other owner's reads went unreported (its window stopped following
/// it, and it missed). The map keeps when the next token is due; a due time more than a burst
/// ahead of now means the bucket is empty. Two CPUs racing here at worst both report.
#[inline(always)]
fn read_report_due(stream: u64, uid: u32) -> bool {
    let now = now_ns();
    let bucket = [stream, u64::from(uid)];
    if let Some(due) = READ_REPORT_DUE.get_ptr_mut(&bucket) {
        // SAFETY: a live map value, read and written as one aligned u64.
        unsafe {
            let next = (*due).max(now);
            if next - now >= READ_REPORT_BURST * READ_REPORT_GAP_NS {
                return false;
            }
            *due = next + READ_REPORT_GAP_NS;
        }
        return true;
    }
    let _ = READ_REPORT_DUE.insert(&bucket, now + READ_REPORT_GAP_NS, 0);
    true
}

/// `mm_filemap_get_pages(mapping, index, last_index)`: a read(2)-family call on a file.
#[btf_tracepoint(function = "mm_filemap_get_pages")]
pub fn abiss_get_pages(ctx: BtfTracePointContext) -> i32 {
    if !watching_files() {
        return 0;
    }
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
    if !watching_files() {
        return 0;
    }
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
    if !watching_files() {
        return 0;
    }
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

/// `mm_filemap_add_to_page_cache(folio)` (a `struct page` before 5.16, with `mapping` at the
/// same place): a task added a page of a file to the page cache. The stand-in for
/// `page_cache_sync_ra` on kernels before 6.18: a reader that adds pages of an attached file
/// missed and reads from the disk itself. It fires for every page added anywhere, so it is
/// attached only where the kernel lacks `page_cache_sync_ra`; one burst of pages (a readahead)
/// is reported once.
#[btf_tracepoint(function = "mm_filemap_add_to_page_cache")]
pub fn abiss_cache_fill(ctx: BtfTracePointContext) -> i32 {
    if !watching_files() {
        return 0;
    }
    let folio: u64 = ctx.arg(0);
    if folio == 0 {
        return 0;
    }
    let mapping: u64 = field(folio, layout!(page_mapping));
    if mapping == 0 {
        return 0;
    }
    let Some(attached) = attached_stream(field(mapping, layout!(mapping_host))) else {
        return 0;
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the helper packs uid and gid"
    )]
    let uid = bpf_get_current_uid_gid() as u32;
    if !attached.reports(uid) {
        return 0;
    }
    // Kernel threads (a flusher, khugepaged) fill pages for nobody's read.
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    if read::<u32>(task, layout!(task_flags)).unwrap_or(PF_KTHREAD) & PF_KTHREAD != 0 {
        return 0;
    }
    // A raised reader is seen here on kernels without the read tracepoints.
    note_raised_context();
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the low half is the thread id"
    )]
    let pid = bpf_get_current_pid_tgid() as u32;
    let now = now_ns();
    let Some(last) = LAST_FILL.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; nothing else writes it while this program runs here.
    unsafe {
        let same_burst = (*last).pid == pid
            && (*last).stream == attached.stream
            && now.saturating_sub((*last).ts_ns) < FILL_REPORT_GAP_NS;
        if same_burst {
            return 0;
        }
        *last = FillReport {
            ts_ns: now,
            stream: attached.stream,
            pid,
            pad: 0,
        };
    }
    report_reader(PlayoutEvent {
        stream: attached.stream,
        kind: playout_kind::FILLED,
        ..PlayoutEvent::default()
    });
    0
}
