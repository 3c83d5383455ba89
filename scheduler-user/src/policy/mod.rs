//! Policy: pure decisions with no I/O. Fed events and time, they answer what to load, lock,
//! release and admit; the daemon carries the decisions out. Unit and property tests pin them.

pub mod admission;
pub mod buffer_sizing;
pub mod burst;
pub mod credit;
pub mod memory;
pub mod playout;
pub mod priority;
pub mod probe_tail;
pub mod rate_history;
pub mod share;
pub mod shared_file;
pub mod upgrade;
pub mod write_behind;

use abiss_proto::PAGE_BYTES;

/// `offset` rounded down to a page boundary: windows load, lock and write back whole pages.
#[must_use]
pub fn page_floor(offset: u64) -> u64 {
    offset / PAGE_BYTES * PAGE_BYTES
}

/// `offset` rounded up to a page boundary.
#[must_use]
pub fn page_ceil(offset: u64) -> u64 {
    offset.div_ceil(PAGE_BYTES) * PAGE_BYTES
}
