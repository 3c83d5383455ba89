//! A recorder's write(2) calls as `perf trace` printed them, and what they add up to (pure).
//!
//! `perf trace -e write,writev,pwrite64,pwritev` prints one line per call, timed in the kernel
//! at the syscall's entry and exit:
//!
//! ```text
//!    273.580 ( 0.111 ms): ffmpeg/2781 write(fd: 4, buf: 0x7fe2…, count: 262144)   = 262144
//! ```
//!
//! A call that blocks while another thread's call is printed comes in two lines: its start
//! (`(         ): … write(fd: 7, …) ...`) and, once it returns, `( 250.885 ms): …  ...
//! [continued]: write()) = 70000` with the start's timestamp.
//!
//! **Lag and overflows.** A capture device hands a recorder its data at a constant rate R and
//! holds what the recorder has not taken in a buffer of B seconds. When the recorder's write
//! returns at `e` with `c` bytes written in all, the data written so far was complete at
//! `t0 + c / R`: the write's lag is `e − c / R − t0`, the time its data waited. An overflow is a
//! write whose lag exceeds B: a capture device with that buffer would have dropped data. The
//! recorders here (ffmpeg `-re`, a live `GStreamer` pipeline, the paced test recorder) catch up
//! after a stall, so the lag falls back to its floor; R is the slope of that floor (the
//! recorder's own long-run rate: exact for the constant-rate ones, measured for the others) and
//! `t0` the floor itself (the recorder at its most ahead). Several slow writes in a row
//! overflow the buffer together although none alone took B: the lag counts that, a write's
//! duration does not (both are reported).

use serde::Serialize;

/// One write-like call of the traced process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TracedWrite {
    /// The calling thread.
    pub tid: u32,
    /// The descriptor written.
    pub fd: i32,
    /// Entry, ms on perf's clock.
    pub start_ms: f64,
    /// Entry to return, ms (NaN: it returned, but perf's report of the return was not found).
    pub duration_ms: f64,
    /// Bytes written (the return value).
    pub bytes: u64,
}

/// What a trace held.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The calls that returned a byte count, in the order they returned.
    pub writes: Vec<TracedWrite>,
    /// Events perf says it lost (`LOST n events!`).
    pub lost_events: u64,
    /// Calls that had started but not returned when the trace ended (duration 0 here).
    pub unfinished: Vec<TracedWrite>,
    /// When the marker was written (see [`parse`]), ms on perf's clock.
    pub marker_ms: Option<f64>,
    /// Calls whose return was not found although their thread made calls after them (in
    /// `writes` with a NaN duration and their `count` as bytes).
    pub unmatched: usize,
}

impl TracedWrite {
    /// When it returned (its start if that is unknown).
    #[must_use]
    pub fn returned_ms(&self) -> f64 {
        if self.duration_ms.is_finite() {
            self.start_ms + self.duration_ms
        } else {
            self.start_ms
        }
    }
}

const SYSCALLS: [&str; 4] = ["write", "writev", "pwrite64", "pwritev"];

/// The command that writes the marker, and what it writes: `printf abiss-mark` run in the
/// traced cgroup ties perf's clock to `CLOCK_MONOTONIC`.
pub const MARKER: (&str, &str) = ("printf", "abiss-mark");

/// One line of `perf trace` output that matters here.
#[derive(Debug, PartialEq)]
enum Line<'a> {
    /// `LOST n events!`
    Lost(u64),
    /// A call: returned (`duration_ms`, and `bytes` if it did not fail) or only started.
    Call {
        tid: u32,
        comm: &'a str,
        fd: i32,
        start_ms: f64,
        duration_ms: Option<f64>,
        bytes: Option<u64>,
        count: Option<u64>,
    },
    /// The return of a call whose start was printed earlier.
    Continued {
        tid: u32,
        duration_ms: f64,
        bytes: Option<u64>,
    },
}

fn parse_line(line: &str) -> Option<Line<'_>> {
    if let Some(lost) = lost_events(line) {
        return Some(Line::Lost(lost));
    }
    let (head, rest) = line.split_once("): ")?;
    let (start, duration) = head.split_once('(')?;
    let start_ms = start.trim().parse::<f64>().ok()?;
    let duration_ms = duration
        .trim()
        .trim_end_matches("ms")
        .trim()
        .parse::<f64>()
        .ok();
    if let Some(at) = rest.find("... [continued]: ") {
        return Some(Line::Continued {
            tid: thread_id(&rest[..at])?,
            duration_ms: duration_ms?,
            bytes: returned(rest),
        });
    }
    let (at, name) = SYSCALLS
        .iter()
        .filter_map(|name| rest.find(&format!(" {name}(fd: ")).map(|at| (at, *name)))
        .min_by_key(|(at, _)| *at)?;
    let task = rest[..at].trim();
    let fd = rest[at + name.len() + 6..]
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()?
        .parse::<i32>()
        .ok()?;
    Some(Line::Call {
        tid: thread_id(task)?,
        comm: task.rsplit_once('/').map_or("", |(c, _)| c),
        fd,
        start_ms,
        duration_ms,
        bytes: duration_ms.and_then(|_| returned(rest)),
        count: rest
            .split_once("count: ")
            .and_then(|(_, after)| after.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok()),
    })
}

/// Parses `perf trace` output; a write of [`MARKER`]'s bytes by its command is the marker.
#[must_use]
pub fn parse(text: &str) -> Trace {
    let mut trace = Trace::default();
    // Started, not yet returned.
    let mut pending: Vec<TracedWrite> = Vec::new();
    for line in text.lines() {
        match parse_line(line) {
            Some(Line::Lost(lost)) => trace.lost_events += lost,
            Some(Line::Call {
                tid,
                comm,
                fd,
                start_ms,
                duration_ms,
                bytes,
                count,
            }) => {
                let write = TracedWrite {
                    tid,
                    fd,
                    start_ms,
                    duration_ms: duration_ms.unwrap_or(0.0),
                    bytes: bytes.or(count).unwrap_or(0),
                };
                match (duration_ms, bytes) {
                    (None, _) => pending.push(write),
                    (Some(_), Some(bytes))
                        if comm == MARKER.0 && bytes == MARKER.1.len() as u64 =>
                    {
                        trace.marker_ms.get_or_insert(start_ms);
                    }
                    (Some(_), Some(_)) => trace.writes.push(write),
                    (Some(_), None) => {}
                }
            }
            Some(Line::Continued {
                tid,
                duration_ms,
                bytes,
            }) => {
                if let Some(index) = pending.iter().position(|p| p.tid == tid) {
                    let started = pending.swap_remove(index);
                    if let Some(bytes) = bytes {
                        trace.writes.push(TracedWrite {
                            duration_ms,
                            bytes,
                            ..started
                        });
                    }
                }
            }
            None => {}
        }
    }
    // A thread makes one call at a time: a call followed by a later one of its thread has
    // returned, though its return was not found (perf printed it before the entry, or lost it).
    let (unmatched, unfinished): (Vec<TracedWrite>, Vec<TracedWrite>) =
        pending.into_iter().partition(|p| {
            trace
                .writes
                .iter()
                .any(|w| w.tid == p.tid && w.start_ms > p.start_ms)
        });
    trace.unmatched = unmatched.len();
    trace
        .writes
        .extend(unmatched.into_iter().map(|w| TracedWrite {
            duration_ms: f64::NAN,
            ..w
        }));
    trace.unfinished = unfinished;
    trace
}

fn lost_events(line: &str) -> Option<u64> {
    let rest = line.trim().strip_prefix("LOST ")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The thread id at the end of `COMM/TID` (the command name may hold anything).
pub(super) fn thread_id(task: &str) -> Option<u32> {
    task.trim().rsplit_once('/')?.1.parse().ok()
}

/// The byte count after the last ` = `, if the call did not fail.
fn returned(rest: &str) -> Option<u64> {
    let (_, value) = rest.rsplit_once(" = ")?;
    value.split_whitespace().next()?.parse::<u64>().ok()
}

/// The writes of the recording up to `stop_ms` (perf's clock): those on the descriptor above
/// stderr that got the most bytes (the recorders write nothing else of size), in the order they
/// returned. A write still blocked when the trace ended counts as returning at `stop_ms`
/// (with its bytes unknown: 0); writes begun after `stop_ms` (a recorder ending its file) do
/// not count.
#[must_use]
pub fn recording_writes(trace: &Trace, stop_ms: f64) -> Vec<TracedWrite> {
    let mut totals: Vec<(i32, u64)> = Vec::new();
    for write in trace.writes.iter().filter(|w| w.fd > 2) {
        match totals.iter_mut().find(|(fd, _)| *fd == write.fd) {
            Some((_, total)) => *total += write.bytes,
            None => totals.push((write.fd, write.bytes)),
        }
    }
    let Some((fd, _)) = totals.into_iter().max_by_key(|(_, total)| *total) else {
        return Vec::new();
    };
    let mut writes: Vec<TracedWrite> = trace
        .writes
        .iter()
        .filter(|w| w.fd == fd && w.start_ms <= stop_ms)
        .copied()
        .chain(
            trace
                .unfinished
                .iter()
                .filter(|w| w.fd == fd && w.start_ms <= stop_ms)
                .map(|w| TracedWrite {
                    duration_ms: stop_ms - w.start_ms,
                    ..*w
                }),
        )
        .collect();
    writes.sort_by(|a, b| a.returned_ms().total_cmp(&b.returned_ms()));
    writes
}

/// What a recorder's writes add up to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WriteFigures {
    /// write(2) calls of the recording.
    pub writes: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The recorder's long-run rate (slope of the lag's floor), B/s.
    pub rate_bps: f64,
    /// Duration of a write, ms: median, 99th and 99.9th percentile (nearest rank), most.
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub p999_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
    /// Writes that alone took longer than the capture buffer.
    pub slow_writes: usize,
    /// Writes whose lag exceeded the capture buffer.
    pub overflows: usize,
    /// The largest lag, ms.
    pub worst_lag_ms: f64,
}

/// The writes a recorder timed itself (the test recorder through the library, whose writes are
/// copies into a ring, no system call for perf to see), from its `per-write` summary: each
/// write's start and duration, µs from its start, and `write_bytes` each; in order.
#[must_use]
pub fn self_timed(report: &serde_json::Value, write_bytes: u64) -> Vec<TracedWrite> {
    let list = |key: &str| -> Vec<f64> {
        report[key]
            .as_array()
            .map(|values| {
                values
                    .iter()
                    .filter_map(serde_json::Value::as_f64)
                    .collect()
            })
            .unwrap_or_default()
    };
    list("start_us")
        .into_iter()
        .zip(list("write_us"))
        .map(|(start_us, write_us)| TracedWrite {
            tid: 0,
            fd: 0,
            start_ms: start_us / 1000.0,
            duration_ms: write_us / 1000.0,
            bytes: write_bytes,
        })
        .collect()
}

/// `quantile` of `sorted` (ascending), 0 for none: the one sample quantile
/// ([`abiss_lab::stats::quantile`]) as the reports give it.
#[must_use]
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    abiss_lab::stats::quantile(sorted, q).unwrap_or(0.0)
}

/// Adds up `writes` (in the order they returned) against a capture buffer of `buffer_ms`.
#[must_use]
pub fn figures(writes: &[TracedWrite], buffer_ms: f64) -> WriteFigures {
    if writes.is_empty() {
        return WriteFigures::default();
    }
    let mut durations: Vec<f64> = writes
        .iter()
        .map(|w| w.duration_ms)
        .filter(|d| d.is_finite())
        .collect();
    durations.sort_by(f64::total_cmp);
    let lags = lags_ms(writes);
    let rate_bps = floor_rate(writes) * 1000.0;
    WriteFigures {
        writes: writes.len(),
        bytes: writes.iter().map(|w| w.bytes).sum(),
        rate_bps,
        p50_ms: quantile(&durations, 0.5),
        p99_ms: quantile(&durations, 0.99),
        p999_ms: quantile(&durations, 0.999),
        max_ms: quantile(&durations, 1.0),
        slow_writes: durations.iter().filter(|d| **d > buffer_ms).count(),
        overflows: lags.iter().filter(|l| **l > buffer_ms).count(),
        worst_lag_ms: lags.iter().copied().fold(0.0, f64::max),
    }
}

/// (return time ms, bytes written in all by then) of each write.
#[expect(clippy::cast_precision_loss, reason = "bytes of a recording")]
fn progress(writes: &[TracedWrite]) -> Vec<(f64, f64)> {
    let mut total = 0u64;
    writes
        .iter()
        .map(|w| {
            total += w.bytes;
            (w.returned_ms(), total as f64)
        })
        .collect()
}

/// Buckets the floor is taken from, s: longer than a stall the recorder catches up from, short
/// enough to give several over a run.
const FLOOR_BUCKET_MS: f64 = 5000.0;

/// The slope of the lag's floor, bytes per ms: from the mean rate R0, the most-ahead write of
/// each 5 s (the largest `c − R0·e`), then the median of the rates between those points at
/// least a bucket apart. A stall that is not caught up by the end does not lower it, as it
/// would lower the mean rate.
fn floor_rate(writes: &[TracedWrite]) -> f64 {
    let points = progress(writes);
    let (first, last) = (points[0], points[points.len() - 1]);
    if last.0 <= first.0 {
        return 0.0;
    }
    let mean = (last.1 - first.1) / (last.0 - first.0);
    let mut floors: Vec<(f64, f64)> = Vec::new();
    for &(at, bytes) in &points {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a bucket index"
        )]
        let bucket = ((at - first.0) / FLOOR_BUCKET_MS) as usize;
        if floors.len() <= bucket {
            floors.resize(bucket + 1, (f64::NAN, f64::NAN));
        }
        let ahead = |p: (f64, f64)| p.1 - mean * p.0;
        let slot = &mut floors[bucket];
        if slot.0.is_nan() || ahead((at, bytes)) > ahead(*slot) {
            *slot = (at, bytes);
        }
    }
    floors.retain(|p| !p.0.is_nan());
    let mut slopes: Vec<f64> = Vec::new();
    for (i, a) in floors.iter().enumerate() {
        for b in &floors[i + 1..] {
            if b.0 - a.0 >= FLOOR_BUCKET_MS {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() {
        return mean;
    }
    slopes.sort_by(f64::total_cmp);
    slopes[slopes.len() / 2]
}

/// Each write's lag, ms (see the module's description).
#[must_use]
pub fn lags_ms(writes: &[TracedWrite]) -> Vec<f64> {
    if writes.is_empty() {
        return Vec::new();
    }
    let rate = floor_rate(writes);
    if rate <= 0.0 {
        return vec![0.0; writes.len()];
    }
    let behind: Vec<f64> = progress(writes)
        .into_iter()
        .map(|(at, bytes)| at - bytes / rate)
        .collect();
    let floor = behind.iter().copied().fold(f64::INFINITY, f64::min);
    behind.into_iter().map(|b| b - floor).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
     0.000 ( 0.113 ms): :2781/2781 write(fd: 4, buf: 0x7fe28fcf9040, count: 262144)      = 262144
   273.580 ( 0.111 ms): ffmpeg/2781 write(fd: 4, buf: 0x7fe28fcf9040, count: 262144)     = 262144
   274.000 ( 0.020 ms): ffmpeg/2781 write(fd: 2, buf: 0x7fe28fcf9040, count: 12)         = 12
   250.000 ( 0.010 ms): printf/2790 write(fd: 1, buf: 0x1, count: 10)                      = 10
   300.000 (         ): mux:src/5307 writev(fd: 7, vec: 0x7f13041f9790, vlen: 352)        ...
   301.000 ( 0.050 ms): queue 0/5308 write(fd: 9, buf: 0x1, count: 8)                     = -1 EAGAIN (Resource temporarily unavailable)
   300.000 (250.885 ms): mux:src/5307  ... [continued]: writev())                         = 66176
LOST 3 events!
   900.000 (         ): mux:src/5307 writev(fd: 7, vec: 0x7f13041f9790, vlen: 352)        ...
";

    #[test]
    fn parses_calls_continuations_losses_and_unfinished_calls() {
        let trace = parse(TRACE);
        assert_eq!(trace.lost_events, 3);
        assert_eq!(trace.unfinished.len(), 1);
        assert_eq!(trace.marker_ms, Some(250.0));
        assert_eq!(trace.writes.len(), 4, "{:?}", trace.writes);
        assert_eq!(trace.unmatched, 0);
        assert_eq!(
            trace.writes[1],
            TracedWrite {
                tid: 2781,
                fd: 4,
                start_ms: 273.58,
                duration_ms: 0.111,
                bytes: 262_144
            }
        );
        assert_eq!(
            trace.writes[3],
            TracedWrite {
                tid: 5307,
                fd: 7,
                start_ms: 300.0,
                duration_ms: 250.885,
                bytes: 66176
            }
        );
    }

    #[test]
    fn a_call_followed_by_another_of_its_thread_returned_untimed() {
        let trace = parse(
            "   100.000 (         ): ffmpeg/9 write(fd: 3, buf: 0x1, count: 262144)   ...\n\
             \x20  ? (         ): ffmpeg/9  ... [continued]: write())   = 262144\n\
             \x20  400.000 ( 0.100 ms): ffmpeg/9 write(fd: 3, buf: 0x1, count: 262144)   = 262144\n",
        );
        assert_eq!((trace.unmatched, trace.unfinished.len()), (1, 0));
        let writes = recording_writes(&trace, 1000.0);
        assert_eq!(writes.len(), 2);
        assert!(writes[0].duration_ms.is_nan() && writes[0].bytes == 262_144);
        let figures = figures(&writes, 1000.0);
        assert_eq!(figures.bytes, 2 * 262_144);
        assert!(
            (figures.max_ms - 0.1).abs() < 1e-9,
            "untimed calls are not timed"
        );
    }

    #[test]
    fn the_recording_is_the_descriptor_with_the_most_bytes() {
        let writes = recording_writes(&parse(TRACE), 1000.0);
        assert_eq!(writes.len(), 2);
        assert!(writes.iter().all(|w| w.fd == 4));
    }

    #[test]
    fn a_write_blocked_at_the_end_lasts_until_the_stop_and_later_ones_do_not_count() {
        let trace = parse(TRACE);
        let mut gst = trace.clone();
        gst.writes.retain(|w| w.fd == 7);
        let writes = recording_writes(&gst, 1400.0);
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert!((writes[1].start_ms - 900.0).abs() < 1e-9);
        assert!((writes[1].duration_ms - 500.0).abs() < 1e-9);
        assert_eq!(recording_writes(&gst, 800.0).len(), 1);
    }

    /// A recorder writing `bytes` every `period_ms`, its writes taking `durations` (cycled),
    /// each write starting when its data is complete or when the previous one returned.
    fn paced(count: usize, period_ms: f64, bytes: u64, durations: &[f64]) -> Vec<TracedWrite> {
        let mut free_at = 0.0f64;
        (0..count)
            .map(|k| {
                #[expect(clippy::cast_precision_loss, reason = "a test's index")]
                let arrived = (k + 1) as f64 * period_ms;
                let start = arrived.max(free_at);
                let duration_ms = durations[k % durations.len()];
                free_at = start + duration_ms;
                TracedWrite {
                    tid: 1,
                    fd: 3,
                    start_ms: start,
                    duration_ms,
                    bytes,
                }
            })
            .collect()
    }

    #[test]
    fn a_steady_recorder_has_no_lag_and_its_own_rate() {
        let writes = paced(960, 62.5, 62_500, &[0.1]);
        let figures = figures(&writes, 1000.0);
        assert!((figures.rate_bps - 1e6).abs() < 1.0, "{figures:?}");
        assert!(figures.worst_lag_ms < 0.01, "{figures:?}");
        assert_eq!((figures.overflows, figures.slow_writes), (0, 0));
    }

    #[test]
    fn slow_writes_in_a_row_overflow_although_none_alone_took_the_buffer() {
        // 60 s at 1 MB/s; at 30 s three writes of 600 ms in a row, then the recorder catches up.
        let mut durations = vec![0.1; 960];
        durations[480..483].fill(600.0);
        let writes = paced(960, 62.5, 62_500, &durations);
        let figures = figures(&writes, 1000.0);
        assert_eq!(figures.slow_writes, 0);
        assert!(figures.overflows >= 1, "{figures:?}");
        // The third write completes data that was complete two periods after the first's.
        assert!(
            (figures.worst_lag_ms - (3.0 * 600.0 - 2.0 * 62.5)).abs() < 1.0,
            "lag after three 600 ms writes: {figures:?}"
        );
        assert!((figures.rate_bps - 1e6).abs() < 1.0, "{figures:?}");
        assert!((figures.max_ms - 600.0).abs() < 1e-9);
    }

    #[test]
    fn a_stall_at_the_end_does_not_lower_the_rate() {
        let mut durations = vec![0.1; 960];
        durations[955] = 3000.0;
        let writes = paced(960, 62.5, 62_500, &durations);
        let figures = figures(&writes, 1000.0);
        assert!((figures.rate_bps - 1e6).abs() < 1.0, "{figures:?}");
        // Only the writes during and after the stall lag.
        assert_eq!(figures.slow_writes, 1);
        assert!(figures.overflows <= 5, "{figures:?}");
    }

    #[test]
    fn nearest_rank_quantiles() {
        let sorted: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert!((quantile(&sorted, 0.99) - 990.0).abs() < 1e-9);
        assert!((quantile(&sorted, 0.999) - 999.0).abs() < 1e-9);
        assert!((quantile(&sorted, 1.0) - 1000.0).abs() < 1e-9);
        assert!((quantile(&[], 0.5)).abs() < 1e-9);
    }
}
