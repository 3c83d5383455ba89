//! The page-cache programs: reads, page faults and page-cache misses on attached files are
//! reported to abissd (the `PLAYOUT` ring) with the pages they touch, for its playout tracking.
//! While no file is attached they return at once, before reading anything of the event.
//!
//! BTF tracepoints: `mm_filemap_get_pages`, `mm_filemap_fault`, `page_cache_sync_ra`.

use aya_ebpf::{
    helpers::bpf_get_current_uid_gid, macros::btf_tracepoint, programs::BtfTracePointContext,
};
use scheduler_common::{playout_kind, PlayoutEvent};

use crate::kernel::{attached_stream, field, files_attached, layout, report_reader};

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
    report_reader(PlayoutEvent {
        stream: attached.stream,
        first_page,
        last_page,
        kind,
        ..PlayoutEvent::default()
    });
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
