//! The end of a file that a player reads once at start, to find the media's duration.
//!
//! Players open a file by probing its head and then its tail: measured with `strace` on the
//! players benchmark's MPEG-TS, ffmpeg and mpv read the last 250,000 bytes and `GStreamer` the
//! last 56 kB, between their probe of the head and the start of playback. Under a seeky load
//! that read waited for the disk (a miss at best-effort priority until the reader was raised),
//! and because it lies out of the window, the window jumped to the end of the file and back,
//! dropping the start-up preroll.
//!
//! So a stream started with a preroll also loads its file's last [`PROBE_TAIL_BYTES`] at its
//! level, locks them, and takes a read there for the probe it is, not a seek. The tail is let
//! go when the window passes the end of the head preroll (the player is playing by then), at
//! a seek, or at the end of the stream.

use std::ops::Range;

use abiss_proto::PAGE_BYTES as PAGE;

use super::{page_ceil, page_floor};

/// How much of a file's end a preroll loads: ffmpeg's first look at the end (250,000 bytes),
/// with room for one more of its tries further back, and page rounding.
pub(crate) const PROBE_TAIL_BYTES: u64 = 512 << 10;

/// What a preroll of the head up to `preroll` bytes locks at most in a file of `file_bytes`
/// (`u64::MAX` when it is not known): the head, and the tail unless the head reaches it.
#[must_use]
pub(crate) fn preroll_locked_bytes(preroll: u64, file_bytes: u64) -> u64 {
    if preroll == 0 {
        return 0;
    }
    // Both come from clients: no rounding may overflow.
    let head = page_floor(preroll.min(file_bytes)).saturating_add(PAGE);
    let tail = if file_bytes == u64::MAX {
        PROBE_TAIL_BYTES + PAGE
    } else {
        ProbeTail::for_preroll(file_bytes, head).map_or(0, |tail| {
            let range = tail.range();
            range.end - range.start
        })
    };
    head.saturating_add(tail)
}

/// The tail of a stream's file, loaded for the player's probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ProbeTail {
    /// Page-aligned range, up to the end of the file.
    range: Range<u64>,
    /// Whether its load completed and its pages are locked.
    locked: bool,
    /// Let go once the window starts at or past this (the end of the head preroll).
    until: u64,
}

impl ProbeTail {
    /// The tail of a file of `file_bytes` for a preroll of the head up to `head_end`: none
    /// when the preroll already reaches it.
    #[must_use]
    pub(crate) fn for_preroll(file_bytes: u64, head_end: u64) -> Option<Self> {
        let end = page_ceil(file_bytes);
        let start = page_floor(file_bytes.saturating_sub(PROBE_TAIL_BYTES));
        (start > head_end).then_some(Self {
            range: start..end,
            locked: false,
            until: head_end,
        })
    }

    /// The range to load.
    #[must_use]
    pub(crate) fn range(&self) -> Range<u64> {
        self.range.clone()
    }

    /// Whether a read of `range` is the player's probe of the tail.
    #[must_use]
    pub(crate) fn holds(&self, range: &Range<u64>) -> bool {
        range.start >= self.range.start && range.end <= self.range.end
    }

    /// A load of `range` completed; whether it was the tail's (now locked).
    pub(crate) fn on_loaded(&mut self, range: &Range<u64>) -> bool {
        let ours = *range == self.range;
        self.locked |= ours;
        ours
    }

    /// Whether a window that starts at `window_start` has passed the head preroll.
    #[must_use]
    pub(crate) fn is_passed(&self, window_start: u64) -> bool {
        window_start >= self.until
    }

    /// What to unlock when the tail is let go, leaving alone what the window itself has
    /// loaded from `window_end` on (a short file's window reaches the tail).
    #[must_use]
    pub(crate) fn release(self, window: &Range<u64>) -> Vec<Range<u64>> {
        if !self.locked {
            return Vec::new();
        }
        let Range { start, end } = self.range;
        [start..end.min(window.start), start.max(window.end)..end]
            .into_iter()
            .filter(|part| part.start < part.end)
            .collect()
    }

    /// Bytes it holds locked.
    #[must_use]
    pub(crate) fn locked_bytes(&self) -> u64 {
        if self.locked {
            self.range.end - self.range.start
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn the_tail_is_the_files_end_in_whole_pages_and_none_when_the_preroll_reaches_it() {
        let tail = ProbeTail::for_preroll(90 * MB, 6 << 20).expect("a tail");
        assert_eq!(tail.range().end, page_ceil(90 * MB));
        assert!(
            tail.range().start <= 90 * MB - 250_000,
            "ffmpeg's probe fits"
        );
        assert_eq!(tail.range().start % 4096, 0);
        assert!(tail.range().end - tail.range().start <= PROBE_TAIL_BYTES + 4096);
        assert!(ProbeTail::for_preroll(6 * MB, 6 << 20).is_none());
    }

    #[test]
    fn a_preroll_locks_its_head_and_the_tail_unless_the_head_covers_the_file() {
        assert_eq!(preroll_locked_bytes(0, 90 * MB), 0);
        let head = page_ceil(6 * MB);
        let tail = preroll_locked_bytes(6 * MB, 90 * MB) - head;
        assert!(
            (PROBE_TAIL_BYTES..=PROBE_TAIL_BYTES + PAGE).contains(&tail),
            "{tail}"
        );
        assert!(preroll_locked_bytes(6 * MB, 5 * MB) >= page_ceil(5 * MB));
        assert!(preroll_locked_bytes(6 * MB, 5 * MB) <= page_ceil(5 * MB) + PAGE);
        assert!(preroll_locked_bytes(6 << 20, u64::MAX) >= (6 << 20) + PROBE_TAIL_BYTES);
        assert_eq!(preroll_locked_bytes(u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn only_its_own_load_locks_it_and_a_release_spares_the_window() {
        let mut tail = ProbeTail::for_preroll(90 * MB, 6 << 20).expect("a tail");
        let range = tail.range();
        assert!(tail.holds(&(90 * MB - 250_000..90 * MB)));
        assert!(!tail.holds(&(range.start - 4096..range.start + 4096)));
        assert!(
            tail.clone().release(&(0..0)).is_empty(),
            "nothing locked yet"
        );
        assert!(!tail.on_loaded(&(0..4096)));
        assert_eq!(tail.locked_bytes(), 0);
        assert!(tail.on_loaded(&range));
        assert_eq!(tail.locked_bytes(), range.end - range.start);
        assert_eq!(tail.clone().release(&(0..1 << 20)), vec![range.clone()]);
        // A window that reaches into the tail keeps its own part locked.
        let window = range.start + 8192..range.end;
        assert_eq!(
            tail.clone().release(&window),
            vec![range.start..range.start + 8192]
        );
        assert!(!tail.is_passed(5 << 20));
        assert!(tail.is_passed(6 << 20));
    }
}
