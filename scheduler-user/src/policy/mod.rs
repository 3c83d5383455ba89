//! Policy: pure decisions with no I/O. Fed events and time, they answer what to load, lock,
//! release and admit; the daemon carries the decisions out. Unit and property tests pin them.

pub(crate) mod admission;
pub(crate) mod buffer_sizing;
pub(crate) mod burst;
pub(crate) mod credit;
pub(crate) mod memory;
pub(crate) mod playout;
pub(crate) mod probe_tail;
pub mod raise;
pub(crate) mod rate_history;
pub(crate) mod recent_readers;
pub(crate) mod share;
pub(crate) mod shared_file;
pub(crate) mod shared_io;
pub(crate) mod stray;
pub(crate) mod write_behind;

use abiss_proto::PAGE_BYTES;

/// `offset` rounded down to a page boundary: windows load, lock and write back whole pages.
#[must_use]
pub(crate) fn page_floor(offset: u64) -> u64 {
    offset / PAGE_BYTES * PAGE_BYTES
}

/// `offset` rounded up to a page boundary.
#[must_use]
pub(crate) fn page_ceil(offset: u64) -> u64 {
    offset.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// Smallest load worth a request: a disk pays a seek per request, so the window's growth is
/// gathered into loads of a third of the buffer (at least a batch). That keeps the reader two
/// thirds of a buffer ahead and the seeks per stream few.
#[must_use]
pub(crate) fn min_load_bytes(buffer_bytes: u64, batch_bytes: u64) -> u64 {
    page_floor(buffer_bytes / 3).max(batch_bytes.max(PAGE_BYTES))
}

/// What one load of a stream is: credit is spent a batch at a time, so a load is the smallest
/// one worth a request rounded up to whole batches (564 KiB with 20-page batches: three
/// batches, 240 KiB). Admission counts a disk access per load of this size.
#[must_use]
pub(crate) fn load_bytes(buffer_bytes: u64, batch_bytes: u64) -> u64 {
    let batch = batch_bytes.max(PAGE_BYTES);
    min_load_bytes(buffer_bytes, batch)
        .div_ceil(batch)
        .saturating_mul(batch)
}
