//! The page-cache programs: reads, page faults and page-cache misses on attached files are
//! reported to abissd (the `PLAYOUT` ring) with the pages they touch, for its playout tracking.
//!
//! BTF tracepoints: `mm_filemap_get_pages`, `mm_filemap_fault`, `page_cache_sync_ra`.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use scheduler_common::{playout_kind, PlayoutEvent};

use crate::kernel::{attached_stream, field, layout, report_reader};

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
