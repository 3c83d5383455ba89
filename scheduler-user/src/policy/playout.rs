//! The playout buffer of one stream: which byte ranges to load, keep locked and release.
//!
//! After the ABISS slides ("Playout buffer", "Credit & moving playout point"): the application
//! playout point is where the reader is; the window `[window_start, window_start + B)` ahead of
//! it is kept loaded and locked. The window follows the reader in batch steps and releases what
//! falls behind; loading what enters it costs credit from the stream's [`CreditTimer`], so the
//! loads follow no faster than the granted rate ("delayed movement"). A jump of the playout
//! point out of the window is a seek: pending loads are cancelled, the old window is released
//! and the new one is filled from the new point.
//!
//! Locked memory never exceeds B plus one batch: at most B is requested ahead of the window
//! start, and the window only moves forward a batch at a time.

use std::ops::Range;

use abiss_proto::PAGE_BYTES as PAGE;
use scheduler_common::MonotonicNs;

use super::credit::CreditTimer;
use super::probe_tail::ProbeTail;
use super::{min_load_bytes, page_ceil, page_floor};

#[path = "playout_preroll.rs"]
mod preroll;
#[cfg(test)]
use preroll::PREROLL_LEAD_BYTES;

/// Shape of a stream's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PlayoutShape {
    /// File size in bytes.
    pub(crate) file_bytes: u64,
    /// Playout buffer B in bytes (rounded up to pages).
    pub(crate) buffer_bytes: u64,
    /// Batch in bytes (pages × page size).
    pub(crate) batch_bytes: u64,
    /// Granted rate.
    pub(crate) rate_bps: u64,
    /// Credit limit in bytes.
    pub(crate) credit_limit_bytes: u64,
}

/// What the daemon has to do for a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WindowAction {
    /// Read these bytes into the page cache at the stream's priority, then lock them.
    Load {
        /// Page-aligned byte range.
        range: Range<u64>,
        /// Seek generation the load belongs to.
        generation: u32,
    },
    /// Unlock these bytes: they fell behind the playout point or out of the window.
    Release {
        /// Page-aligned byte range.
        range: Range<u64>,
    },
    /// Cancel every load of this generation still in flight: a seek made them stale.
    CancelGeneration(u32),
}

/// The window state machine of one stream.
#[derive(Clone, Debug)]
pub(crate) struct PlayoutBuffer {
    shape: PlayoutShape,
    credit: CreditTimer,
    app_point: u64,
    window_start: u64,
    /// Loads have been issued for `[window_start, requested_end)`.
    requested_end: u64,
    /// Completed loads of this generation that are locked, sorted and disjoint.
    locked: Vec<Range<u64>>,
    generation: u32,
    prefetched_bytes: u64,
    seeks: u64,
    /// The rest of a start-up preroll, queued at the stream's next lock (its first window's
    /// or its first piece's, or the window's after a failed load).
    pending_preroll: Option<preroll::PendingPreroll>,
    /// The file's end, loaded with a preroll for the player's probe.
    tail: Option<ProbeTail>,
    /// The first window was loaded and locked. Until then a reader that waits for the disk
    /// waits for the stream's start, which is part of its contract, not a miss.
    started: bool,
    /// A seek moved the window, and the new window is not loaded and locked yet. A reader
    /// that waits for the disk meanwhile waits for the seek's refill (a burst the owner's
    /// allowance pays for), which is not a miss either.
    refilling: bool,
    /// Where the last seek put the reader, until it has read on from there
    /// ([`preroll::SETTLED_BYTES`]). Until then a reader that waits for the disk waits for
    /// the seek: what it reads behind the point it jumped to (ffmpeg 8 KiB, mpv 20 KiB) no
    /// window could have held.
    settling: Option<u64>,
    /// The reader has read on from where it last sought, and a stream with a preroll loads
    /// ahead as at its start ([`Self::preroll_after_seek`]).
    preroll_due: bool,
}

/// What a reader that waited for the disk waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReaderWait {
    /// The stream's first window.
    Start,
    /// The window's refill after a seek.
    Seek,
    /// Data the window should have held: a deadline miss.
    Miss,
}

impl PlayoutBuffer {
    /// A stream at the start of its file with a full credit timer; returns the initial fill.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn new(shape: PlayoutShape, now: MonotonicNs) -> (Self, Vec<WindowAction>) {
        Self::starting_with(shape, shape.credit_limit_bytes, now)
    }

    /// A stream at the start of its file whose credit timer holds `start_credit_bytes`;
    /// returns the initial fill, as far as that credit goes.
    #[must_use]
    pub(crate) fn starting_with(
        shape: PlayoutShape,
        start_credit_bytes: u64,
        now: MonotonicNs,
    ) -> (Self, Vec<WindowAction>) {
        let shape = PlayoutShape {
            buffer_bytes: page_ceil(shape.buffer_bytes.max(PAGE)),
            batch_bytes: page_ceil(shape.batch_bytes.max(PAGE)),
            ..shape
        };
        let mut buffer = Self {
            shape,
            credit: CreditTimer::starting_with(
                shape.rate_bps,
                shape.credit_limit_bytes,
                start_credit_bytes,
                now,
            ),
            app_point: 0,
            window_start: 0,
            requested_end: 0,
            locked: Vec::new(),
            generation: 0,
            prefetched_bytes: 0,
            seeks: 0,
            pending_preroll: None,
            tail: None,
            started: false,
            refilling: false,
            settling: None,
            preroll_due: false,
        };
        let mut actions = Vec::new();
        buffer.fill(now, &mut actions);
        (buffer, actions)
    }

    fn file_end(&self) -> u64 {
        page_ceil(self.shape.file_bytes)
    }

    fn target_end(&self) -> u64 {
        (self.window_start + self.shape.buffer_bytes).min(self.file_end())
    }

    /// Issues loads for what the window lacks, as far as the credit allows.
    fn fill(&mut self, now: MonotonicNs, actions: &mut Vec<WindowAction>) {
        self.credit.accrue(now);
        self.requested_end = self.requested_end.max(self.window_start);
        if !self.wants_load() {
            return;
        }
        // Credit is spent a batch at a time; consecutive batches go out as one request.
        let start = self.requested_end;
        while self.requested_end < self.target_end() {
            let chunk = self
                .shape
                .batch_bytes
                .min(self.target_end() - self.requested_end);
            if !self.credit.try_spend(chunk) {
                break;
            }
            self.requested_end += chunk;
            self.prefetched_bytes += chunk;
        }
        if self.requested_end > start {
            actions.push(WindowAction::Load {
                range: start..self.requested_end,
                generation: self.generation,
            });
        }
    }

    /// Bytes of the window not yet asked for.
    fn lacking(&self) -> u64 {
        self.target_end()
            .saturating_sub(self.requested_end.max(self.window_start))
    }

    /// Whether the window lacks enough to load now: a full request's worth, the end of the
    /// file, or so much that the reader is within half a buffer of what is loaded.
    fn wants_load(&self) -> bool {
        let lacking = self.lacking();
        lacking > 0
            && (lacking >= min_load_bytes(self.shape.buffer_bytes, self.shape.batch_bytes)
                || self.target_end() == self.file_end()
                || self.requested_end < self.app_point + self.shape.buffer_bytes / 2)
    }

    /// Releases locked pages below `limit`.
    fn release_below(&mut self, limit: u64, actions: &mut Vec<WindowAction>) {
        let mut kept = Vec::with_capacity(self.locked.len());
        for range in self.locked.drain(..) {
            if range.end <= limit {
                actions.push(WindowAction::Release { range });
            } else if range.start < limit {
                actions.push(WindowAction::Release {
                    range: range.start..limit,
                });
                kept.push(limit..range.end);
            } else {
                kept.push(range);
            }
        }
        self.locked = kept;
    }

    /// Whether a read of `range` is a jump away from the window rather than reading on.
    ///
    /// Positions arrive from two sources that are not ordered with each other (the client's
    /// position messages and the kernel's record of its reads), so a report up to a buffer
    /// behind the window is late news, not a seek back.
    fn is_jump(&self, range: &Range<u64>) -> bool {
        range.end + self.shape.buffer_bytes <= self.window_start
            || range.start >= self.window_start + self.shape.buffer_bytes + self.shape.batch_bytes
    }

    /// Moves the window to a new point: cancel, release, refill.
    fn seek(&mut self, offset: u64, now: MonotonicNs, actions: &mut Vec<WindowAction>) {
        actions.push(WindowAction::CancelGeneration(self.generation));
        self.release_below(u64::MAX, actions);
        self.let_go_of_tail(actions);
        self.generation = self.generation.wrapping_add(1);
        self.pending_preroll = None;
        self.window_start = page_floor(offset.min(self.file_end()));
        self.requested_end = self.window_start;
        self.app_point = offset;
        self.seeks += 1;
        self.refilling = true;
        self.settling = Some(self.app_point);
        self.preroll_due = false;
        self.fill(now, actions);
    }

    /// Moves the window behind the reader in batch steps, releasing what it leaves.
    fn follow(&mut self, actions: &mut Vec<WindowAction>) {
        let before = self.window_start;
        while self.app_point >= self.window_start + self.shape.batch_bytes
            && self.window_start + self.shape.batch_bytes <= self.file_end()
        {
            self.window_start += self.shape.batch_bytes;
        }
        if self.window_start > before {
            self.release_below(self.window_start, actions);
        }
        if self
            .tail
            .as_ref()
            .is_some_and(|tail| tail.is_passed(self.window_start))
        {
            self.let_go_of_tail(actions);
        }
    }

    /// Releases the probe tail (what of it the window has not loaded itself).
    fn let_go_of_tail(&mut self, actions: &mut Vec<WindowAction>) {
        if let Some(tail) = self.tail.take() {
            let window = self.window_start..self.requested_end;
            for range in tail.release(&window) {
                actions.push(WindowAction::Release { range });
            }
        }
    }

    /// The application is at `offset` (an explicit position message).
    pub(crate) fn on_position(&mut self, offset: u64, now: MonotonicNs) -> Vec<WindowAction> {
        // A client's number: anything past the end of the file is the end of the file.
        let offset = offset.min(self.file_end());
        let mut actions = Vec::new();
        if self.is_jump(&(offset..offset)) {
            self.seek(offset, now, &mut actions);
        } else {
            self.app_point = self.app_point.max(offset);
            self.follow(&mut actions);
            self.fill(now, &mut actions);
        }
        self.note_settled();
        actions
    }

    /// The application read `range` (inferred from the page cache): a read that starts out of
    /// the window is a seek; otherwise the playout point becomes the end of the read.
    pub(crate) fn on_read(&mut self, range: Range<u64>, now: MonotonicNs) -> Vec<WindowAction> {
        let start = range.start.min(self.file_end());
        let range = start..range.end.clamp(start, self.file_end());
        let mut actions = Vec::new();
        if self.tail.as_ref().is_some_and(|tail| tail.holds(&range)) {
            // The player's look at the end of the file: the window stays where it plays.
            self.fill(now, &mut actions);
            return actions;
        }
        if self.is_jump(&range) {
            self.seek(range.start, now, &mut actions);
        }
        let end = range.end.min(self.shape.file_bytes);
        if end > self.app_point {
            self.app_point = end;
            self.follow(&mut actions);
        }
        self.fill(now, &mut actions);
        self.note_settled();
        actions
    }

    /// Whether the stream is still loading its first window: a reader's wait for the disk
    /// now is its start, not a miss.
    #[must_use]
    pub(crate) fn is_starting(&self) -> bool {
        !self.started && !self.window_locked()
    }

    /// What a reader's wait for the disk now is: the start, a seek's (until the window a seek
    /// asked for is locked, and until the reader reads on from where it sought), or a miss.
    /// Call it after the read moved the window: a read that jumped waits for the refill it
    /// caused.
    #[must_use]
    pub(crate) fn reader_wait(&self) -> ReaderWait {
        if self.is_starting() {
            ReaderWait::Start
        } else if (self.refilling && !self.window_locked()) || self.settling.is_some() {
            ReaderWait::Seek
        } else {
            ReaderWait::Miss
        }
    }

    /// Whether everything the window asked for is loaded and locked. A preroll queued with
    /// the first window loads past it: the window is in when its own part is.
    fn window_locked(&self) -> bool {
        let end = self.requested_end.min(self.target_end());
        end <= self.window_start
            || self
                .locked
                .first()
                .is_some_and(|first| first.start <= self.window_start && first.end >= end)
    }

    /// Credit the window lacks to fill up to a full buffer ahead of the reader now: what a
    /// refill after a seek asks of the owner's start-up allowance.
    #[must_use]
    pub(crate) fn refill_shortfall(&self) -> u64 {
        self.lacking().saturating_sub(self.credit.credit_bytes())
    }

    /// Takes `bytes` of credit from outside the rate (see [`Self::refill_shortfall`]) and loads
    /// what it allows.
    pub(crate) fn grant_credit(&mut self, bytes: u64, now: MonotonicNs) -> Vec<WindowAction> {
        self.credit.accrue(now);
        self.credit.grant(bytes);
        let mut actions = Vec::new();
        self.fill(now, &mut actions);
        actions
    }

    /// Whether the window reaches the end of the file: a file that grows (a recording being
    /// watched) has more to load only once its new size is known.
    #[must_use]
    pub(crate) fn reaches_file_end(&self) -> bool {
        self.window_start + self.shape.buffer_bytes >= self.file_end()
    }

    /// The file now holds `file_bytes` (it grew: it is being written); the window extends
    /// into the new data as the credit allows. A file never shrinks under a window: a
    /// truncation fails the loads past its end instead.
    pub(crate) fn file_grew(&mut self, file_bytes: u64, now: MonotonicNs) -> Vec<WindowAction> {
        let mut actions = Vec::new();
        if file_bytes > self.shape.file_bytes {
            self.shape.file_bytes = file_bytes;
            self.fill(now, &mut actions);
        }
        actions
    }

    /// The buffer is now `buffer_bytes` (an automatic buffer that grew; `credit_limit_bytes`
    /// with it): the window reaches further ahead from `now` on, as the credit allows.
    pub(crate) fn set_buffer(
        &mut self,
        buffer_bytes: u64,
        credit_limit_bytes: u64,
        now: MonotonicNs,
    ) -> Vec<WindowAction> {
        self.shape.buffer_bytes = page_ceil(buffer_bytes.max(2 * self.shape.batch_bytes));
        self.shape.credit_limit_bytes = credit_limit_bytes;
        self.credit.set_limit(credit_limit_bytes, now);
        let mut actions = Vec::new();
        self.fill(now, &mut actions);
        actions
    }

    /// The stream's rate changed at `now` (trick play): credit accrues at `rate_bps` from
    /// now on, and the window moves as far as the credit then allows.
    pub(crate) fn set_rate(&mut self, rate_bps: u64, now: MonotonicNs) -> Vec<WindowAction> {
        self.credit.set_rate(rate_bps, now);
        self.shape.rate_bps = rate_bps;
        let mut actions = Vec::new();
        self.fill(now, &mut actions);
        actions
    }

    /// Time passed: credit accrued, so more of the window may be loaded.
    pub(crate) fn on_tick(&mut self, now: MonotonicNs) -> Vec<WindowAction> {
        let mut actions = Vec::new();
        self.fill(now, &mut actions);
        actions
    }

    /// A load finished and its pages are locked. Pages that are no longer in the window (the
    /// reader moved on, or a seek made the load stale) are released at once.
    pub(crate) fn on_loaded(&mut self, range: Range<u64>, generation: u32) -> Vec<WindowAction> {
        let mut actions = Vec::new();
        if generation != self.generation {
            actions.push(WindowAction::Release { range });
            return actions;
        }
        if self
            .tail
            .as_mut()
            .is_some_and(|tail| tail.on_loaded(&range))
        {
            return actions;
        }
        let keep = range.start.max(self.window_start)..range.end.min(self.requested_end);
        if keep.start >= keep.end {
            actions.push(WindowAction::Release { range });
            return actions;
        }
        if range.start < keep.start {
            actions.push(WindowAction::Release {
                range: range.start..keep.start,
            });
        }
        if keep.end < range.end {
            actions.push(WindowAction::Release {
                range: keep.end..range.end,
            });
        }
        self.insert_locked(keep);
        self.started |= self.window_locked();
        self.refilling &= !self.window_locked();
        actions.extend(self.due_preroll());
        actions
    }

    /// A load failed: its part of the window will be asked for again on the next fill.
    pub(crate) fn on_failed(&mut self, range: &Range<u64>, generation: u32) {
        if generation == self.generation
            && range.start < self.requested_end
            && range.start >= self.window_start
        {
            // Re-request from the failed range on; later loads stay issued and will complete.
            let asked = self.requested_end;
            self.requested_end = range.start;
            // The window's refill stops at its end: a preroll past it is asked for again.
            self.repend_preroll(asked);
        }
    }

    fn insert_locked(&mut self, range: Range<u64>) {
        let at = self.locked.partition_point(|r| r.start < range.start);
        self.locked.insert(at, range);
        // Merge neighbours so the list stays short (one entry for a contiguous window).
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(self.locked.len());
        for range in self.locked.drain(..) {
            match merged.last_mut() {
                Some(last) if last.end >= range.start => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        self.locked = merged;
    }

    /// Bytes loaded and locked now.
    #[must_use]
    pub(crate) fn locked_bytes(&self) -> u64 {
        let tail = self.tail.as_ref().map_or(0, ProbeTail::locked_bytes);
        self.locked.iter().map(|r| r.end - r.start).sum::<u64>() + tail
    }

    /// The application's playout point.
    #[must_use]
    pub(crate) fn app_point(&self) -> u64 {
        self.app_point
    }

    /// The window's start (the kernel playout point).
    #[must_use]
    pub(crate) fn window_start(&self) -> u64 {
        self.window_start
    }

    /// End of what is loaded or being loaded.
    #[must_use]
    pub(crate) fn requested_end(&self) -> u64 {
        self.requested_end
    }

    /// Current credit in bytes.
    #[must_use]
    pub(crate) fn credit_bytes(&self) -> u64 {
        self.credit.credit_bytes()
    }

    /// Bytes requested by this stream's prefetch so far.
    #[must_use]
    pub(crate) fn prefetched_bytes(&self) -> u64 {
        self.prefetched_bytes
    }

    /// Seeks seen so far.
    #[must_use]
    pub(crate) fn seeks(&self) -> u64 {
        self.seeks
    }

    /// Whether `offset` is loaded and locked.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn is_resident(&self, offset: u64) -> bool {
        self.locked.iter().any(|r| r.contains(&offset))
    }

    /// Nanoseconds from `now` until the credit allows the next load the window wants (a
    /// third of the buffer, or what it lacks if less), if it wants one. A window that lacks
    /// less than a load's worth waits for its reader, not for time: woken every millisecond
    /// for a batch of credit it would not spend, it only spun.
    #[must_use]
    pub(crate) fn ns_until_next_load(&self, now: MonotonicNs) -> Option<u64> {
        if !self.wants_load() {
            return None;
        }
        let lacking = self.lacking();
        let load = min_load_bytes(self.shape.buffer_bytes, self.shape.batch_bytes).min(lacking);
        Some(self.credit.ns_until(load, now))
    }

    /// Every range still locked (to release when the stream ends).
    #[must_use]
    pub(crate) fn locked_ranges(&self) -> Vec<Range<u64>> {
        let window = self.window_start..self.requested_end;
        let tail = self.tail.clone().map(|tail| tail.release(&window));
        self.locked
            .iter()
            .cloned()
            .chain(tail.into_iter().flatten())
            .collect()
    }
}

#[cfg(test)]
#[path = "playout_tests.rs"]
mod tests;
