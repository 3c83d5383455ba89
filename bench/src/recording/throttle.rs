//! The kernel's dirty-page throttle as a recorder met it (pure): the
//! `writeback:balance_dirty_pages` events `perf trace` printed next to the recorder's write
//! calls, and which of its slow writes they explain.
//!
//! A task that dirties page-cache pages is paced in `balance_dirty_pages`. Every task that
//! writes through one disk's writeback context (without cgroup writeback: every task) is paced
//! by the same figures: the dirty and under-writeback pages of the whole machine against
//! `vm.dirty_bytes`, and the disk's share of them. When they reach the limit, the task's rate
//! is 0 and it sleeps the longest pause (up to 200 ms, less when little is dirty), whoever
//! dirtied the pages. The event is printed when the pause is decided (`pause: 0` when the task
//! runs on), in milliseconds:
//!
//! ```text
//!     17.646 (         ): dd/8941 writeback:balance_dirty_pages(bdi: "254:0", limit: 16384,
//!     setpoint: 14336, dirty: 12296, …, task_ratelimit: 50964, …, pause: 20, period: 20, …)
//! ```
//!
//! (one line in perf's output; `limit` and `dirty` in pages).

use serde::Serialize;

use super::writes::{self, TracedWrite};

/// The tracepoint, as `perf trace -e` takes it.
pub const TRACEPOINT: &str = "writeback:balance_dirty_pages";

/// One decision of the throttle for a thread of the recorder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ThrottleEvent {
    /// The thread.
    pub tid: u32,
    /// When, ms on perf's clock.
    pub at_ms: f64,
    /// The sleep decided, ms (0: none).
    pub pause_ms: f64,
    /// Whether the machine's dirty and under-writeback pages had reached the hard limit (the
    /// task's rate was 0).
    pub at_limit: bool,
}

/// The throttle's events in `perf trace` output.
#[must_use]
pub fn parse(text: &str) -> Vec<ThrottleEvent> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<ThrottleEvent> {
    let (head, rest) = line.split_once(&format!(" {TRACEPOINT}("))?;
    let (time, task) = head.split_once('(')?;
    let at_ms = time.trim().parse::<f64>().ok()?;
    let tid = writes::thread_id(task.split_once("): ")?.1)?;
    let field = |name: &str| -> Option<f64> {
        let (_, after) = rest.split_once(&format!(" {name}: "))?;
        after.split([',', ')']).next()?.trim().parse().ok()
    };
    Some(ThrottleEvent {
        tid,
        at_ms,
        pause_ms: field("pause")?,
        at_limit: field("dirty")? >= field("limit")?,
    })
}

/// What the throttle cost one recorder.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThrottleFigures {
    /// Sleeps of its threads in the throttle.
    pub pauses: usize,
    /// Their sum, ms.
    pub paused_ms: f64,
    /// Of those, sleeps at the hard limit (rate 0, the longest pause).
    pub at_limit: usize,
    /// Recording writes that took longer than the goal.
    pub slow_writes: usize,
    /// Of those, writes that slept in the throttle.
    pub slow_writes_throttled: usize,
}

/// Adds up `events` against the recording's `writes`; a write is slow past `goal_ms`.
#[must_use]
pub fn figures(events: &[ThrottleEvent], writes: &[TracedWrite], goal_ms: f64) -> ThrottleFigures {
    let pauses: Vec<&ThrottleEvent> = events.iter().filter(|e| e.pause_ms > 0.0).collect();
    let slow: Vec<&TracedWrite> = writes
        .iter()
        .filter(|w| w.duration_ms.is_finite() && w.duration_ms > goal_ms)
        .collect();
    ThrottleFigures {
        pauses: pauses.len(),
        paused_ms: pauses.iter().fold(0.0, |sum, e| sum + e.pause_ms),
        at_limit: pauses.iter().filter(|e| e.at_limit).count(),
        slow_writes: slow.len(),
        slow_writes_throttled: slow
            .iter()
            .filter(|w| {
                pauses
                    .iter()
                    .any(|e| e.tid == w.tid && e.at_ms >= w.start_ms && e.at_ms <= w.returned_ms())
            })
            .count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAUSED: &str = "    17.646 (         ): ffmpeg/8941 writeback:balance_dirty_pages(bdi: \
        \"7:0\", limit: 19988, setpoint: 15114, dirty: 20234, wb_setpoint: 6027, wb_dirty: \
        17996, dirty_ratelimit: 28992, task_ratelimit: 0, dirtied: 16, dirtied_pause: 64, \
        pause: 200, period: 200, cgroup_ino: 1)";
    const RAN_ON: &str = "    55.125 (         ): mpegtsmux0:src/8950 \
        writeback:balance_dirty_pages(bdi: \"7:0\", limit: 16384, setpoint: 14336, dirty: \
        12298, wb_setpoint: 14301, wb_dirty: 12298, dirty_ratelimit: 31572, task_ratelimit: \
        82412, dirtied: 256, dirtied_pause: 64, pause: 0, period: 12, cgroup_ino: 1)";
    const WRITE: &str = "     0.461 ( 0.289 ms): dd/8941 write(fd: 1, buf: 0x7f52, count: \
        1048576)                     = 1048576";

    #[test]
    fn reads_the_thread_the_pause_and_whether_the_limit_was_reached() {
        let events = parse(&[PAUSED, RAN_ON, WRITE].join("\n"));
        assert_eq!(
            events,
            vec![
                ThrottleEvent {
                    tid: 8941,
                    at_ms: 17.646,
                    pause_ms: 200.0,
                    at_limit: true,
                },
                ThrottleEvent {
                    tid: 8950,
                    at_ms: 55.125,
                    pause_ms: 0.0,
                    at_limit: false,
                },
            ]
        );
    }

    #[test]
    fn a_slow_write_is_explained_only_by_a_pause_of_its_own_thread_inside_it() {
        let event = |tid, at_ms, pause_ms| ThrottleEvent {
            tid,
            at_ms,
            pause_ms,
            at_limit: false,
        };
        let write = |tid, start_ms, duration_ms| TracedWrite {
            tid,
            fd: 4,
            start_ms,
            duration_ms,
            bytes: 65536,
        };
        let events = [
            event(1, 100.5, 200.0),
            event(2, 400.5, 150.0),
            event(1, 700.0, 0.0),
        ];
        let writes = [
            write(1, 100.0, 201.0), // slept inside: explained
            write(1, 400.0, 160.0), // another thread slept then: not explained
            write(1, 699.0, 30.0),  // the throttle let it run on
            write(1, 900.0, 0.1),   // fast
        ];
        let figures = figures(&events, &writes, 5.0);
        assert_eq!(
            figures,
            ThrottleFigures {
                pauses: 2,
                paused_ms: 350.0,
                at_limit: 0,
                slow_writes: 3,
                slow_writes_throttled: 1,
            }
        );
    }
}
