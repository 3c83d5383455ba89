//! A stream's start-up preroll: the file's head (and its probe tail) loaded at once, beyond
//! the window, in the order players read them.

use super::{page_ceil, PlayoutBuffer, ProbeTail, WindowAction};

/// A preroll waiting for the first window to be locked; its first piece is queued.
#[derive(Clone, Copy, Debug)]
pub(super) struct PendingPreroll {
    /// The head up to here.
    end: u64,
    /// With the file's tail.
    with_tail: bool,
    /// Where the first window ends (and the first piece begins).
    window_end: u64,
}

/// A preroll's head queued before its probe tail: one request of the usual largest size
/// (`max_sectors_kb` 512), so the piece a player reads next is first in the disk's queue.
pub const PREROLL_LEAD_BYTES: u64 = 512 << 10;

impl PlayoutBuffer {
    /// Loads the file's head up to `end` beyond the window (a start-up preroll, paid by the
    /// caller's start-up allowance, not the credit): locked like the window, and released as
    /// the reader passes it. Only at the start of the file, before any seek. `with_tail`: the
    /// file's end comes with it ([`ProbeTail`]).
    ///
    /// Its first [`PREROLL_LEAD_BYTES`] are queued with the window, the rest once the window
    /// is locked: queued together at the same level, several players' prerolls held every
    /// player's first window behind them (`abissctl run` waited 0.4 to 0.97 s for the window instead of 0.1 s with four
    /// 6 MiB prerolls, bench/results/players-preroll-auto).
    pub fn preroll(&mut self, end: u64, with_tail: bool) -> Vec<WindowAction> {
        let end = page_ceil(end).min(self.file_end());
        if self.generation != 0 || self.window_start != 0 || end <= self.requested_end {
            return Vec::new();
        }
        if !self.window_locked() {
            // Its first piece goes with the window, so the disk still has the stream's work
            // in hand when the window is done: in the few ms abissd takes to queue the rest,
            // an idle real-time queue let four best-effort requests into the lab hdd's
            // queue, and the preroll waited 45 ms for them.
            let window_end = self.requested_end;
            let lead_end = window_end.saturating_add(PREROLL_LEAD_BYTES).min(end);
            self.pending_preroll = Some(PendingPreroll {
                end,
                with_tail,
                window_end,
            });
            self.prefetched_bytes += lead_end - window_end;
            self.requested_end = lead_end;
            return vec![WindowAction::Load {
                range: window_end..lead_end,
                generation: self.generation,
            }];
        }
        self.load_preroll(end, with_tail)
    }

    /// The rest of a pending preroll, once the first window is locked.
    pub(super) fn due_preroll(&mut self) -> Vec<WindowAction> {
        let Some(pending) = self.pending_preroll else {
            return Vec::new();
        };
        let window_locked = self.locked.first().is_some_and(|first| {
            first.start <= self.window_start && first.end >= pending.window_end
        });
        if self.generation != 0 || !window_locked {
            return Vec::new();
        }
        self.pending_preroll = None;
        self.load_preroll(pending.end, pending.with_tail)
    }

    /// Loads the head up to `end` in reading order: its next [`PREROLL_LEAD_BYTES`], the probe
    /// tail, the rest. `GStreamer` reads the tail after 135 kB (in the first window), ffmpeg
    /// after 5 MB. Queued tail first, the head's pieces reached a disk that orders its queue by
    /// position (NCQ, the lab hdd) behind the tail's seek: ffmpeg waited 77 ms for the piece
    /// past the window, served last of six.
    pub(super) fn load_preroll(&mut self, end: u64, with_tail: bool) -> Vec<WindowAction> {
        let mut actions = Vec::new();
        let head = self.requested_end..end.max(self.requested_end);
        let lead_end = head.start.saturating_add(PREROLL_LEAD_BYTES).min(head.end);
        self.prefetched_bytes += head.end - head.start;
        self.requested_end = head.end;
        let generation = self.generation;
        if head.start < lead_end {
            actions.push(WindowAction::Load {
                range: head.start..lead_end,
                generation,
            });
        }
        self.tail = ProbeTail::for_preroll(self.shape.file_bytes, end).filter(|_| with_tail);
        if let Some(tail) = &self.tail {
            let range = tail.range();
            self.prefetched_bytes += range.end - range.start;
            actions.push(WindowAction::Load { range, generation });
        }
        if lead_end < head.end {
            actions.push(WindowAction::Load {
                range: lead_end..head.end,
                generation,
            });
        }
        actions
    }
}
