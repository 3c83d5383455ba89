//! Stall as a viewer sees it, from what a player says about its media time (pure).
//!
//! A player reports media time as it presents it: `GStreamer`'s video sink per rendered frame,
//! mpv per displayed frame (`time-pos`), ffmpeg per progress report (`out_time_us`, about
//! every 20 ms). Between two consecutive reports, wall time W passed and media time M
//! advanced. Playing smoothly, W ≈ M. A player that waited for its data shows one frame for
//! longer: W − M is how much longer, and a viewer sees it as a freeze once it exceeds a frame
//! period ([`FREEZE_TOLERANCE`]). The whole excess of such an interval counts.
//!
//! Players differ after a freeze: ffmpeg `-re` and `GStreamer`'s synchronised sinks catch up
//! (M > W for a while), mpv continues from where it stopped. Catching up gives the viewer
//! nothing back, so an interval with W < M counts zero: the definition is the same for both
//! kinds, and reporting jitter below a frame period never adds up.
//!
//! Start-up: from launching the command (for abiss, `abissctl run`, which attaches and waits
//! for the window before it starts the player) to the first media report. A seek: from the
//! seek to the first report after it, less a frame period (counted if over the tolerance,
//! like a freeze). At the end: from the last report to the player being stopped, less a frame
//! period (a player stuck at the end freezes too).

use serde::Serialize;

/// One report of a player.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Media time `media_ns` was presented at `at_ns` (`CLOCK_MONOTONIC`).
    Frame {
        /// When (`CLOCK_MONOTONIC`, ns).
        at_ns: u64,
        /// Media time, ns (the player's own scale; only differences matter).
        media_ns: i64,
    },
    /// The player was told to seek at `at_ns`.
    Seek {
        /// When (`CLOCK_MONOTONIC`, ns).
        at_ns: u64,
    },
}

/// A frame period at 25 frames/s: intervals whose wall time exceeds their media time by more
/// than this are freezes (a frame shown at least twice).
pub const FREEZE_TOLERANCE_NS: u64 = 40_000_000;
/// [`FREEZE_TOLERANCE_NS`] in seconds, for the reports.
pub const FREEZE_TOLERANCE: f64 = 0.040;
/// The media time a report normally advances: one frame at 25 frames/s.
const FRAME_NS: u64 = 40_000_000;

/// What a player's reports add up to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StallFigures {
    /// Launch to the first media report, s (`None`: the player never presented anything).
    pub startup_s: Option<f64>,
    /// Sum of the freezes after start-up (seeks excluded), s.
    pub freeze_s: f64,
    /// How many intervals were freezes.
    pub freezes: u64,
    /// The longest freeze (or seek stall), s.
    pub longest_s: f64,
    /// Seeks the player was told to make.
    pub seeks: u64,
    /// Sum of the seeks' stalls, s.
    pub seek_stall_s: f64,
    /// Media time presented, s (sum of the advances between reports, seeks excluded).
    pub media_s: f64,
    /// Wall time from the first report to the stop, s.
    pub playing_s: f64,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "ns over minutes fit f64 exactly"
)]
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Adds up `events` (in the order the player reported them) of a player launched at
/// `launched_ns` and stopped at `stopped_ns`.
#[must_use]
pub fn analyse(launched_ns: u64, stopped_ns: u64, events: &[Event]) -> StallFigures {
    let mut figures = StallFigures::default();
    let mut first_at: Option<u64> = None;
    let mut last: Option<(u64, i64)> = None;
    let mut seek_pending = false;
    let add = |figures: &mut StallFigures, excess_ns: u64, seek: bool| {
        if excess_ns > FREEZE_TOLERANCE_NS {
            let excess = secs(excess_ns);
            if seek {
                figures.seek_stall_s += excess;
            } else {
                figures.freeze_s += excess;
                figures.freezes += 1;
            }
            figures.longest_s = figures.longest_s.max(excess);
        }
    };
    for event in events {
        match *event {
            Event::Seek { .. } => {
                figures.seeks += 1;
                seek_pending = true;
            }
            Event::Frame { at_ns, media_ns } => {
                match last {
                    None => {
                        first_at = Some(at_ns);
                        figures.startup_s = Some(secs(at_ns.saturating_sub(launched_ns)));
                    }
                    Some((last_at, last_media)) => {
                        let wall = at_ns.saturating_sub(last_at);
                        if seek_pending {
                            add(&mut figures, wall.saturating_sub(FRAME_NS), true);
                        } else {
                            let advanced = u64::try_from(media_ns - last_media).unwrap_or(0);
                            figures.media_s += secs(advanced);
                            add(&mut figures, wall.saturating_sub(advanced), false);
                        }
                    }
                }
                seek_pending = false;
                last = Some((at_ns, media_ns));
            }
        }
    }
    if let (Some(first_at), Some((last_at, _))) = (first_at, last) {
        let tail = stopped_ns.saturating_sub(last_at).saturating_sub(FRAME_NS);
        add(&mut figures, tail, seek_pending);
        figures.playing_s = secs(stopped_ns.saturating_sub(first_at));
    }
    figures
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Frames every 40 ms of wall and media time from `from_ms` (wall) for `count` frames,
    /// media starting at `media_ms`.
    fn smooth(from_ms: u64, media_ms: i64, count: u64) -> Vec<Event> {
        (0..count)
            .map(|i| Event::Frame {
                at_ns: (from_ms + 40 * i) * MS,
                media_ns: (media_ms + 40 * i64::try_from(i).unwrap()) * 1_000_000,
            })
            .collect()
    }

    #[test]
    fn smooth_playback_has_no_stall_and_start_up_is_the_first_frame() {
        let events = smooth(300, 0, 100);
        let figures = analyse(0, 300 + 40 * 100, &events);
        assert_eq!(figures.startup_s, Some(0.3));
        assert_eq!(figures.freezes, 0);
        assert!(figures.freeze_s.abs() < f64::EPSILON);
        assert!((figures.media_s - 3.96).abs() < 1e-9);
    }

    #[test]
    fn jitter_within_a_frame_does_not_add_up() {
        // Reports alternately 25 ms early and late: |W − M| = 50 ms ± … never over 40 ms
        // beyond what the media advanced.
        let events: Vec<Event> = (0..200u64)
            .map(|i| Event::Frame {
                at_ns: (40 * i + if i % 2 == 0 { 0 } else { 25 }) * MS,
                media_ns: i64::try_from(40 * i * MS).unwrap(),
            })
            .collect();
        let figures = analyse(0, 40 * 200 * MS, &events);
        assert_eq!(figures.freezes, 0);
    }

    #[test]
    fn a_freeze_counts_once_and_catching_up_gives_nothing_back() {
        // 10 frames, a 500 ms hole, then frames delivered at once (catch-up), then smooth.
        let mut events = smooth(0, 0, 10);
        for i in 0..13u64 {
            events.push(Event::Frame {
                at_ns: (360 + 540 + i) * MS,
                media_ns: i64::try_from((400 + 40 * i) * MS).unwrap(),
            });
        }
        events.extend(smooth(960, 920, 10));
        let figures = analyse(0, 1360 * MS, &events);
        assert_eq!(figures.freezes, 1);
        assert!((figures.freeze_s - 0.5).abs() < 1e-9, "{figures:?}");
        assert!((figures.longest_s - 0.5).abs() < 1e-9);
    }

    #[test]
    fn a_seek_stalls_from_the_seek_to_the_next_frame() {
        let mut events = smooth(0, 0, 10);
        events.push(Event::Seek { at_ns: 370 * MS });
        // Next frame 300 ms after the last one, at media time 90 s.
        events.extend(smooth(660, 90_000, 10));
        let figures = analyse(0, 1060 * MS, &events);
        assert_eq!((figures.seeks, figures.freezes), (1, 0));
        assert!((figures.seek_stall_s - 0.26).abs() < 1e-9, "{figures:?}");
    }

    #[test]
    fn a_player_stuck_at_the_end_freezes_until_it_is_stopped() {
        let events = smooth(0, 0, 10);
        let figures = analyse(0, (360 + 1040) * MS, &events);
        assert_eq!(figures.freezes, 1);
        assert!((figures.freeze_s - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_player_that_never_presents_has_no_start_up() {
        let figures = analyse(0, 5_000 * MS, &[]);
        assert_eq!(figures.startup_s, None);
        assert_eq!(figures.freezes, 0);
    }
}
