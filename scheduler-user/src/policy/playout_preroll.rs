//! A stream's start-up preroll: the file's head (and its probe tail) loaded at once, beyond
//! the window, in the order players read them; and the preroll again where the player settles
//! after a seek.

use super::{page_ceil, page_floor, PlayoutBuffer, ProbeTail, WindowAction};

/// A preroll waiting for the stream's first load to complete; its first piece is queued.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingPreroll {
    /// The head up to here.
    end: u64,
    /// With the file's tail.
    with_tail: bool,
}

/// A preroll's head queued before its probe tail: one request of the usual largest size
/// (`max_sectors_kb` 512), so the piece a player reads next is first in the disk's queue.
pub(crate) const PREROLL_LEAD_BYTES: u64 = 512 << 10;

/// How far a reader reads on from where a seek put it before it counts as playing from there:
/// more than one probe of a player that looks for its start by bisection (ffmpeg reads
/// 132 KiB at each point it tries, then jumps again), less than the smallest automatic window
/// (376 KiB on the lab hdd), which a player's start burst read past: `GStreamer` and ffmpeg
/// viewers that started 30 and 50 s into a file missed 385 and 876 KiB after their jump.
pub(crate) const SETTLED_BYTES: u64 = 192 << 10;

impl PlayoutBuffer {
    /// Loads the file's head up to `end` beyond the window (a start-up preroll, paid by the
    /// caller's start-up allowance, not the credit): locked like the window, and released as
    /// the reader passes it. Only at the start of the file, before any seek. `with_tail`: the
    /// file's end comes with it ([`ProbeTail`]).
    ///
    /// It is queued with the first window, unless `others_starting` (another stream on the
    /// disk is loading its first window): then only its first [`PREROLL_LEAD_BYTES`] are, and
    /// the rest once the window or that piece is locked. Queued together at the same level,
    /// several players' prerolls held every player's first window behind them (`abissctl
    /// run` waited 0.4 to 0.97 s for the window instead of 0.1 s with four 6 MiB prerolls,
    /// bench/results/players-preroll-auto). For one player, holding it back cost more than it
    /// gave: in the few ms abissd took to queue it, the stream's real-time queue was empty,
    /// four best-effort requests went into the lab hdd's queue, and the preroll waited 45 ms
    /// for them. The first piece keeps the disk on the stream's work meanwhile, though a disk
    /// that orders its queue by position may serve it before the window.
    pub(crate) fn preroll(
        &mut self,
        end: u64,
        with_tail: bool,
        others_starting: bool,
    ) -> Vec<WindowAction> {
        let end = page_ceil(end).min(self.file_end());
        if self.generation != 0 || self.window_start != 0 || end <= self.requested_end {
            return Vec::new();
        }
        if others_starting && !self.window_locked() {
            self.pending_preroll = Some(PendingPreroll { end, with_tail });
            let lead_end = self.requested_end.saturating_add(PREROLL_LEAD_BYTES);
            return self.load_head(lead_end.min(end)).into_iter().collect();
        }
        self.load_preroll(end, with_tail)
    }

    /// The rest of a pending preroll: call it when a load of the stream's first window or of
    /// the preroll's first piece was locked.
    pub(super) fn due_preroll(&mut self) -> Vec<WindowAction> {
        // A seek clears it, so it is always of the first generation.
        let Some(pending) = self.pending_preroll.take() else {
            return Vec::new();
        };
        self.load_preroll(pending.end, pending.with_tail)
    }

    /// After a failed load rewound the window to before `asked`: the preroll's part past the
    /// window's end waits for the stream's next lock. Its tail is not asked for again: it was
    /// queued apart, and a read of a tail whose load failed goes to the disk.
    pub(super) fn repend_preroll(&mut self, asked: u64) {
        if self.generation == 0 && self.pending_preroll.is_none() && asked > self.target_end() {
            self.pending_preroll = Some(PendingPreroll {
                end: asked,
                with_tail: false,
            });
        }
    }

    /// Loads the head up to `end` in reading order: its next [`PREROLL_LEAD_BYTES`], the probe
    /// tail, the rest. `GStreamer` reads the tail after 135 kB (in the first window), ffmpeg
    /// after 5 MB. Queued tail first, the head's pieces reached a disk that orders its queue by
    /// position (NCQ, the lab hdd) behind the tail's seek: ffmpeg waited 77 ms for the piece
    /// past the window, served last of six.
    fn load_preroll(&mut self, end: u64, with_tail: bool) -> Vec<WindowAction> {
        let lead_end = self.requested_end.saturating_add(PREROLL_LEAD_BYTES);
        let mut actions: Vec<WindowAction> =
            self.load_head(lead_end.min(end)).into_iter().collect();
        self.tail = ProbeTail::for_preroll(self.shape.file_bytes, end).filter(|_| with_tail);
        if let Some(tail) = &self.tail {
            let range = tail.range();
            self.prefetched_bytes += range.end - range.start;
            actions.push(WindowAction::Load {
                range,
                generation: self.generation,
            });
        }
        actions.extend(self.load_head(end));
        actions
    }

    /// A preroll after a seek: once the reader has read on [`SETTLED_BYTES`] from where the
    /// last seek put it (once per seek), loads ahead up to `preroll` bytes from the window's
    /// start, as far as `grant` (asked for the bytes wanted, answering the bytes paid for)
    /// allows. A player that sought reads its start burst there as at the file's start, past
    /// a window sized for its rate. Locked like the window, released as the reader passes it,
    /// and let go by the next seek; it locks no more than a start-up preroll, whose room the
    /// stream holds.
    pub(crate) fn preroll_after_seek(
        &mut self,
        preroll: u64,
        grant: impl FnOnce(u64) -> u64,
    ) -> Vec<WindowAction> {
        if !std::mem::take(&mut self.preroll_due) {
            return Vec::new();
        }
        let end = page_ceil(self.window_start.saturating_add(preroll)).min(self.file_end());
        let wanted = end.saturating_sub(self.requested_end);
        if wanted == 0 {
            return Vec::new();
        }
        let granted = grant(wanted).min(wanted);
        self.load_head(page_floor(self.requested_end + granted))
            .into_iter()
            .collect()
    }

    /// Notes a reader that has read on [`SETTLED_BYTES`] from where it last sought.
    pub(super) fn note_settled(&mut self) {
        if self
            .settling
            .is_some_and(|point| self.app_point >= point.saturating_add(SETTLED_BYTES))
        {
            self.settling = None;
            self.preroll_due = true;
        }
    }

    /// Loads the head from what was asked for so far up to `end`, if that is further.
    fn load_head(&mut self, end: u64) -> Option<WindowAction> {
        let range = self.requested_end..end;
        if range.is_empty() {
            return None;
        }
        self.prefetched_bytes += range.end - range.start;
        self.requested_end = end;
        Some(WindowAction::Load {
            range,
            generation: self.generation,
        })
    }
}
