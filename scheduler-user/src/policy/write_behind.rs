//! The write-behind window of one write stream (a recording): which of the application's
//! written bytes to write back when, and how far to allocate ahead of it.
//!
//! The mirror of the playout buffer. The application writes the file at its rate R into the
//! page cache; everything it wrote beyond the *written-back end* is dirty and is the window.
//! Writing back costs credit from the stream's [`CreditTimer`] (rate R, the same limit as for
//! reading), and it is gathered into requests of a third of the buffer (at least a batch), as a
//! read stream's loads are, so a recording costs few seeks. One write-back is in flight at a
//! time; once it is on the disk, its pages are released (dropped from the page cache). So a
//! writer that keeps to its rate has at most a third of the buffer plus what it writes during
//! one write-back dirty, and never more than its buffer unless it writes faster than it
//! reserved; then it is ahead of its reservation and the kernel's flushers take the rest.
//!
//! A writer that stops with less than a request dirty has it written back once it has been
//! idle for [`IDLE_FLUSH_NS`].
//!
//! Allocation, if the stream asked for it: the file is allocated ahead of the written end by a
//! few seconds of the rate ([`PREALLOCATE_SECONDS`], at most [`MAX_PREALLOCATE_AHEAD`]), in
//! steps of at least half of that, so the file system lays the recording out in large extents.
//! It is asked for, not the default: on ext4 it costs the writer (the allocation holds the
//! inode's lock while it waits for the journal, and every write into allocated blocks then
//! updates the on-disk size through the journal), while ext4's delayed allocation of the
//! window's large sequential write-backs already keeps the recording in few extents.

use std::ops::Range;

use scheduler_common::MonotonicNs;

use super::credit::CreditTimer;
use super::min_load_bytes;
use super::page_floor;

/// A writer that has not written for this long has its last partial request written back.
pub(crate) const IDLE_FLUSH_NS: u64 = 1_000_000_000;
/// Seconds of the rate allocated ahead of the writer.
pub(crate) const PREALLOCATE_SECONDS: u64 = 4;
/// Most a stream allocates ahead of its writer (it counts against the owner's quota: the
/// allocation runs without abissd's capabilities).
pub(crate) const MAX_PREALLOCATE_AHEAD: u64 = 64 << 20;
/// Most one user's recordings together hold allocated ahead of their writers (root exempt):
/// one stream's most. Each stream's own bound holds too, so a user's 32 streams could
/// otherwise hold 32 × 64 MiB of blocks nobody wrote.
pub(crate) const MAX_PREALLOCATED_AHEAD_PER_USER: u64 = MAX_PREALLOCATE_AHEAD;
/// Allocation is in whole mebibytes.
const ALLOCATION_UNIT: u64 = 1 << 20;

/// How much a recording of user `uid` may hold allocated ahead of its writer, when the user's
/// other recordings hold `others_ahead`.
#[must_use]
pub(crate) fn allocation_room(uid: u32, others_ahead: u64) -> u64 {
    if uid == 0 {
        u64::MAX
    } else {
        MAX_PREALLOCATED_AHEAD_PER_USER.saturating_sub(others_ahead)
    }
}

/// Shape of a write stream's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WriteBehindShape {
    /// The write-behind buffer B in bytes.
    pub(crate) buffer_bytes: u64,
    /// Batch in bytes.
    pub(crate) batch_bytes: u64,
    /// Granted rate.
    pub(crate) rate_bps: u64,
    /// Credit limit in bytes.
    pub(crate) credit_limit_bytes: u64,
    /// Whether to allocate ahead of the writer.
    pub(crate) preallocate: bool,
}

impl WriteBehindShape {
    /// Bytes of one write-back request (a third of the buffer, at least a batch): the unit the
    /// window is written back in, as a read stream's loads.
    #[must_use]
    pub(crate) fn request_bytes(&self) -> u64 {
        min_load_bytes(self.buffer_bytes, self.batch_bytes)
    }

    /// How far ahead of the written end the file is allocated.
    #[must_use]
    pub(crate) fn preallocate_ahead(&self) -> u64 {
        let ahead = self
            .rate_bps
            .saturating_mul(PREALLOCATE_SECONDS)
            .clamp(self.request_bytes(), MAX_PREALLOCATE_AHEAD);
        ahead.div_ceil(ALLOCATION_UNIT) * ALLOCATION_UNIT
    }
}

/// What the daemon has to do for a write stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WriteAction {
    /// Write these bytes back at the stream's priority, wait for them, then drop them from
    /// the page cache.
    WriteBack(Range<u64>),
    /// Allocate these bytes of the file without changing its size.
    Preallocate(Range<u64>),
}

/// A write stream's window state.
#[derive(Clone, Debug)]
pub(crate) struct WriteBehind {
    shape: WriteBehindShape,
    credit: CreditTimer,
    /// How far the application has written.
    written_end: u64,
    /// When `written_end` last grew.
    grew_at: MonotonicNs,
    /// Written back and released up to here (page aligned).
    written_back_end: u64,
    /// The write-back on the disk now.
    in_flight: Option<Range<u64>>,
    /// Allocated up to here.
    allocated_end: u64,
    /// Whether allocating ahead failed (no room, or a file system without it): not tried again.
    allocation_off: bool,
    /// What the stream may still allocate: twice its allocation ahead at once (the first
    /// allocation, and a writer that starts with a burst), then its rate. The writer moves the
    /// written end, and `ftruncate` moves it without writing: before, each move up had another
    /// allocation ahead made at once, at the stream's priority, so a stream allocated as fast
    /// as its writer could truncate (issue 33). Now a stream allocates at most twice its
    /// allocation ahead plus its rate times the time, in whole mebibytes.
    allocation_credit: CreditTimer,
    /// Most this stream may hold allocated ahead of its writer now: what its user's budget
    /// leaves it ([`allocation_room`]), set before each look at the writer.
    allocation_room: u64,
    written_back_bytes: u64,
    preallocated_bytes: u64,
}

impl WriteBehind {
    /// A window over a file of `file_bytes` (written back from its last whole page on: what is
    /// there already is the kernel's), with `start_credit_bytes` of credit.
    #[must_use]
    pub(crate) fn new(
        shape: WriteBehindShape,
        file_bytes: u64,
        start_credit_bytes: u64,
        now: MonotonicNs,
    ) -> Self {
        Self {
            shape,
            credit: CreditTimer::starting_with(
                shape.rate_bps,
                shape.credit_limit_bytes,
                start_credit_bytes,
                now,
            ),
            written_end: file_bytes,
            grew_at: now,
            written_back_end: page_floor(file_bytes),
            in_flight: None,
            allocated_end: file_bytes,
            allocation_off: !shape.preallocate,
            allocation_credit: CreditTimer::starting_with(
                shape.rate_bps,
                2 * shape.preallocate_ahead(),
                2 * shape.preallocate_ahead(),
                now,
            ),
            allocation_room: u64::MAX,
            written_back_bytes: 0,
            preallocated_bytes: 0,
        }
    }

    /// Bytes allocated past the writer's end now.
    #[must_use]
    pub(crate) fn allocated_ahead(&self) -> u64 {
        self.allocated_end.saturating_sub(self.written_end)
    }

    /// The stream may hold at most `room` bytes allocated ahead from now on (what its user's
    /// budget leaves it).
    pub(crate) fn set_allocation_room(&mut self, room: u64) {
        self.allocation_room = room;
    }

    /// The application has written up to `file_bytes` (the file's size now).
    pub(crate) fn on_size(&mut self, file_bytes: u64, now: MonotonicNs) -> Vec<WriteAction> {
        self.note_size(file_bytes, now);
        self.on_tick(now)
    }

    /// A direct recording's client has written up to `file_bytes` past the page cache: none of
    /// it is dirty, so nothing is written back, and only the allocation ahead moves.
    pub(crate) fn on_written_directly(
        &mut self,
        file_bytes: u64,
        now: MonotonicNs,
    ) -> Vec<WriteAction> {
        self.note_size(file_bytes, now);
        self.written_back_end = page_floor(self.written_end);
        self.in_flight = None;
        self.allocation_credit.accrue(now);
        self.allocate().into_iter().collect()
    }

    fn note_size(&mut self, file_bytes: u64, now: MonotonicNs) {
        if file_bytes > self.written_end {
            self.written_end = file_bytes;
            self.grew_at = now;
        } else if file_bytes < self.written_end {
            // Truncated: what was beyond is gone; write back from the new end.
            self.written_end = file_bytes;
            self.grew_at = now;
            self.written_back_end = self.written_back_end.min(page_floor(file_bytes));
            self.allocated_end = self.allocated_end.min(file_bytes);
        }
    }

    /// Time passed: credit accrued.
    pub(crate) fn on_tick(&mut self, now: MonotonicNs) -> Vec<WriteAction> {
        self.credit.accrue(now);
        self.allocation_credit.accrue(now);
        let mut actions = Vec::new();
        if let Some(range) = self.next_write_back(now) {
            self.in_flight = Some(range.clone());
            actions.push(WriteAction::WriteBack(range));
        }
        actions.extend(self.allocate());
        actions
    }

    /// The next allocation ahead, if one is due, as spent.
    fn allocate(&mut self) -> Option<WriteAction> {
        let range = self.next_allocation()?;
        let spent = self.allocation_credit.try_spend(range.end - range.start);
        debug_assert!(
            spent,
            "next_allocation asks only for what the credit covers"
        );
        self.allocated_end = range.end;
        self.preallocated_bytes += range.end - range.start;
        Some(WriteAction::Preallocate(range))
    }

    /// Whole pages written and not yet written back (or on their way).
    fn pending(&self) -> Range<u64> {
        let start = self
            .in_flight
            .as_ref()
            .map_or(self.written_back_end, |r| r.end);
        start..page_floor(self.written_end).max(start)
    }

    fn next_write_back(&mut self, now: MonotonicNs) -> Option<Range<u64>> {
        if self.in_flight.is_some() {
            return None;
        }
        let pending = self.pending();
        let length = pending.end - pending.start;
        let request = self.shape.request_bytes();
        let idle = now.saturating_since(self.grew_at) >= IDLE_FLUSH_NS;
        if length == 0 || (length < request && !idle) {
            return None;
        }
        // At most a buffer per request, and only what the credit covers, in whole pages (a
        // full request whenever the credit has one: a third of a buffer per seek).
        let affordable = page_floor(self.credit.credit_bytes());
        let mut bytes = length.min(self.shape.buffer_bytes.max(request));
        if bytes > affordable {
            bytes = affordable;
            if bytes < request.min(length) {
                return None;
            }
        }
        if !self.credit.try_spend(bytes) {
            return None;
        }
        Some(pending.start..pending.start + bytes)
    }

    fn next_allocation(&self) -> Option<Range<u64>> {
        if self.allocation_off {
            return None;
        }
        let ahead = self.shape.preallocate_ahead();
        let target = self.written_end.saturating_add(ahead);
        // Allocate again once half of what is ahead has been written into.
        if self.allocated_end.saturating_add(ahead / 2) > target {
            return None;
        }
        let start = self.allocated_end.max(self.written_end);
        let end = (target.div_ceil(ALLOCATION_UNIT) * ALLOCATION_UNIT).min(start.saturating_add(
            self.allocation_credit.credit_bytes() / ALLOCATION_UNIT * ALLOCATION_UNIT,
        ));
        let room_end = self.written_end.saturating_add(self.allocation_room);
        if room_end < end {
            // Not in slivers as the writer moves on while the user's budget is spent: a
            // whole unit or nothing.
            return (room_end >= start.saturating_add(ALLOCATION_UNIT)).then_some(start..room_end);
        }
        (end > start).then_some(start..end)
    }

    /// A write-back is on the disk: its pages can go.
    pub(crate) fn on_written_back(
        &mut self,
        range: &Range<u64>,
        now: MonotonicNs,
    ) -> Vec<WriteAction> {
        if self.in_flight.as_ref() == Some(range) {
            self.in_flight = None;
            if range.start <= self.written_back_end {
                self.written_back_end = self.written_back_end.max(range.end);
            }
            self.written_back_bytes += range.end - range.start;
        }
        self.on_tick(now)
    }

    /// A write-back failed: it is tried again (its credit is spent; a disk that keeps failing
    /// must not be asked faster than the rate).
    pub(crate) fn on_failed(&mut self, range: &Range<u64>) {
        if self.in_flight.as_ref() == Some(range) {
            self.in_flight = None;
        }
    }

    /// Allocating ahead failed: it is not tried again for this stream.
    pub(crate) fn allocation_failed(&mut self) {
        self.allocation_off = true;
    }

    /// Nanoseconds until the window may write something back, if anything is waiting.
    #[must_use]
    pub(crate) fn ns_until_next_write_back(&self, now: MonotonicNs) -> Option<u64> {
        if self.in_flight.is_some() {
            return None;
        }
        let pending = self.pending();
        let length = pending.end - pending.start;
        if length == 0 {
            return None;
        }
        let request = self.shape.request_bytes();
        let credit = self.credit.ns_until(length.min(request), now);
        if length >= request {
            return Some(credit);
        }
        let idle_at = self.grew_at.saturating_add(IDLE_FLUSH_NS);
        Some(credit.max(idle_at.saturating_since(now)))
    }

    /// How far the application has written.
    #[must_use]
    pub(crate) fn written_end(&self) -> u64 {
        self.written_end
    }

    /// Written back and released up to here.
    #[must_use]
    pub(crate) fn written_back_end(&self) -> u64 {
        self.written_back_end
    }

    /// Bytes written back so far.
    #[must_use]
    pub(crate) fn written_back_bytes(&self) -> u64 {
        self.written_back_bytes
    }

    /// What the application wrote beyond the written-back end: the stream's dirty bytes, as
    /// far as the stream knows (the kernel may have written some of them back itself).
    #[must_use]
    pub(crate) fn behind_bytes(&self) -> u64 {
        self.written_end.saturating_sub(self.written_back_end)
    }

    /// Room in the window before the application is a buffer ahead of the written-back end.
    #[must_use]
    pub(crate) fn headroom_bytes(&self) -> i64 {
        let buffer = i128::from(self.shape.buffer_bytes);
        let behind = i128::from(self.behind_bytes());
        i64::try_from(buffer - behind).unwrap_or(i64::MIN)
    }

    /// Allocated up to here.
    #[must_use]
    pub(crate) fn allocated_end(&self) -> u64 {
        self.allocated_end
    }

    /// Bytes allocated ahead so far.
    #[must_use]
    pub(crate) fn preallocated_bytes(&self) -> u64 {
        self.preallocated_bytes
    }

    /// Credit now, in bytes.
    #[must_use]
    pub(crate) fn credit_bytes(&self) -> u64 {
        self.credit.credit_bytes()
    }

    /// The granted rate changes from `now` on.
    pub(crate) fn set_rate(&mut self, rate_bps: u64, now: MonotonicNs) {
        self.shape.rate_bps = rate_bps;
        self.credit.set_rate(rate_bps, now);
        self.allocation_credit.set_rate(rate_bps, now);
        self.allocation_credit
            .set_limit(2 * self.shape.preallocate_ahead(), now);
    }
}

#[cfg(test)]
#[path = "write_behind_tests.rs"]
mod tests;
