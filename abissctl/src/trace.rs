//! `abissctl trace`: live disk latency by device, operation and I/O priority, or by stream.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use abiss_proto::{DeviceNumber, LatencyGroup, Log2Histogram, RequestRecord, StreamId};
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde::Serialize;

use crate::devices::{self, DeviceNames};
use crate::error::CliError;
use crate::interval::parse_seconds;
use abiss_client::Client;

/// The arguments of `abissctl trace`, as bcc's tools take them: `trace 1 10` reports every
/// second, ten times; `--interval` and `--count` say the same by name.
#[derive(Debug, clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent command-line switches, as clap derives them"
)]
pub struct TraceArgs {
    /// Seconds between reports (as `--interval`; default 1).
    #[arg(value_name = "INTERVAL", value_parser = parse_seconds, conflicts_with = "interval")]
    interval_seconds: Option<Duration>,
    /// Reports before stopping (as `--count`).
    #[arg(value_name = "COUNT", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "count")]
    reports: Option<u64>,
    /// Only this device: NAME (loop0), /dev/NAME or MAJOR:MINOR.
    #[arg(long, short = 'd')]
    device: Option<String>,
    /// Also show the queue time (elevator insert to dispatch) histogram.
    #[arg(long, short = 'Q')]
    queued: bool,
    /// Seconds between reports (default 1).
    #[arg(long, short = 'i', value_parser = parse_seconds, allow_negative_numbers = true)]
    interval: Option<Duration>,
    /// Stop after this many reports (or events with --events).
    #[arg(long, short = 'c', value_parser = clap::value_parser!(u64).range(1..))]
    count: Option<u64>,
    /// Print the local time (HH:MM:SS) above each report; with --events, the TIME column is
    /// the wall-clock time of each completion instead of seconds since the first.
    #[arg(long, short = 'T')]
    timestamp: bool,
    /// One JSON object per report (or event), with its time in RFC 3339.
    #[arg(long, short = 'j')]
    json: bool,
    /// One line per completed request instead of histograms.
    #[arg(long, short = 'e')]
    events: bool,
    /// Only requests of this stream (its pages belong to the stream's file, whoever
    /// submitted them).
    #[arg(long, short = 's')]
    stream: Option<u64>,
    /// Group by I/O priority (all requests) or by stream (only requests of streams).
    #[arg(long, value_enum, default_value_t = Grouping::Priority)]
    by: Grouping,
}

impl TraceArgs {
    /// What to trace, with the device resolved (an unknown one fails before connecting).
    pub fn options(&self) -> Result<TraceOptions, CliError> {
        Ok(TraceOptions {
            device: self.device.as_deref().map(devices::resolve).transpose()?,
            queued: self.queued,
            interval: self
                .interval_seconds
                .or(self.interval)
                .unwrap_or(Duration::from_secs(1)),
            count: self.reports.or(self.count),
            json: self.json,
            timestamp: self.timestamp,
            stream: self.stream.map(StreamId),
            by: self.by,
        })
    }

    /// Traces until `count` reports (or events) are out, or forever.
    pub fn run(&self, client: &mut Client, options: &TraceOptions) -> Result<(), CliError> {
        if self.events {
            events(client, options)
        } else {
            histograms(client, options)
        }
    }
}

/// What to trace and how to print it.
#[derive(Debug)]
pub struct TraceOptions {
    /// Only this device.
    pub device: Option<DeviceNumber>,
    /// Also print the queue-time histogram.
    pub queued: bool,
    /// Seconds between reports.
    pub interval: Duration,
    /// Reports (or events) before stopping; `None` runs until interrupted.
    pub count: Option<u64>,
    /// One JSON object per report (or event).
    pub json: bool,
    /// The local time above each report; wall-clock times of events.
    pub timestamp: bool,
    /// Only requests of this stream.
    pub stream: Option<StreamId>,
    /// How requests are grouped.
    pub by: Grouping,
}

/// How `trace` groups requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Grouping {
    /// By device, operation and I/O priority, whatever stream the requests belong to.
    #[default]
    Priority,
    /// By stream, device, operation and I/O priority; requests of no stream are left out.
    Stream,
}

/// Prints per-interval histograms until `count` reports are out.
fn histograms(client: &mut Client, options: &TraceOptions) -> Result<(), CliError> {
    let mut names = DeviceNames::load();
    // This first request makes abissd trace every disk, not only the managed ones, until the
    // last trace client goes: other disks' first report covers the requests started since.
    let mut previous = snapshot(client, options)?;
    let mut out = std::io::stdout().lock();
    if !options.json {
        let _ = writeln!(
            out,
            "Tracing block I/O latency by device, operation and I/O priority every {:.1} s (disks abissd does not manage: from now)... Hit Ctrl-C to end.",
            options.interval.as_secs_f64()
        );
    }
    let mut reports = 0;
    let mut last = Instant::now();
    while options.count.is_none_or(|count| reports < count) {
        std::thread::sleep(options.interval.saturating_sub(last.elapsed()));
        let current = snapshot(client, options)?;
        let elapsed = last.elapsed();
        last = Instant::now();
        let deltas: Vec<LatencyGroup> = current
            .values()
            .filter_map(|group| {
                let delta = previous
                    .get(&group.key())
                    .map_or_else(|| group.clone(), |before| group.since(before));
                (delta.requests > 0).then_some(delta)
            })
            .collect();
        let deltas = regroup(deltas, options.by);
        let written = if options.json {
            write_json(&mut out, &deltas, elapsed, &mut names)
        } else {
            write_text(&mut out, &deltas, options, &mut names)
        };
        if written.is_err() {
            // stdout closed (e.g. piped into `head`): stop quietly.
            return Ok(());
        }
        previous = current;
        reports += 1;
    }
    Ok(())
}

type GroupKey = (
    DeviceNumber,
    abiss_proto::Operation,
    abiss_proto::IoPriority,
    Option<StreamId>,
);
type Snapshot = BTreeMap<GroupKey, LatencyGroup>;

fn snapshot(client: &mut Client, options: &TraceOptions) -> Result<Snapshot, CliError> {
    let (_, groups) = client.latency()?;
    Ok(groups
        .into_iter()
        .filter(|group| options.device.is_none_or(|device| device == group.device))
        .filter(|group| {
            options
                .stream
                .is_none_or(|stream| group.stream == Some(stream))
        })
        .map(|group| (group.key(), group))
        .collect())
}

/// The daemon keeps one group per (device, operation, priority, stream); by priority, the
/// streams are summed, and by stream, requests of no stream are left out.
fn regroup(deltas: Vec<LatencyGroup>, by: Grouping) -> Vec<LatencyGroup> {
    match by {
        Grouping::Stream => {
            let mut groups: Vec<LatencyGroup> =
                deltas.into_iter().filter(|g| g.stream.is_some()).collect();
            groups.sort_by_key(|g| (g.stream, g.device, g.operation, g.priority));
            groups
        }
        Grouping::Priority => {
            let mut merged: BTreeMap<GroupKey, LatencyGroup> = BTreeMap::new();
            for group in deltas {
                let key = (group.device, group.operation, group.priority, None);
                match merged.get_mut(&key) {
                    Some(sum) => {
                        sum.requests += group.requests;
                        sum.bytes += group.bytes;
                        sum.inversions += group.inversions;
                        sum.queue.merge(&group.queue);
                        sum.service.merge(&group.service);
                    }
                    None => {
                        merged.insert(
                            key,
                            LatencyGroup {
                                stream: None,
                                ..group
                            },
                        );
                    }
                }
            }
            merged.into_values().collect()
        }
    }
}

/// The local time of day, as bcc's tools print it with `-T`.
fn local_time(at: Timestamp) -> String {
    at.to_zoned_datetime(TimeZone::system())
        .strftime("%H:%M:%S")
        .to_string()
}

/// Wall-clock times of `CLOCK_MONOTONIC` instants (the kernel's completion times): the two
/// clocks' difference now, so a later clock step moves only the events after it.
struct WallClock {
    realtime_minus_monotonic_ns: i128,
}

impl WallClock {
    fn now() -> Self {
        let ns = |clock| {
            nix::time::clock_gettime(clock).map_or(0, |t| {
                i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
            })
        };
        let monotonic = ns(nix::time::ClockId::CLOCK_MONOTONIC);
        let realtime = ns(nix::time::ClockId::CLOCK_REALTIME);
        Self {
            realtime_minus_monotonic_ns: realtime - monotonic,
        }
    }

    fn at(&self, monotonic_ns: u64) -> Timestamp {
        Timestamp::from_nanosecond(i128::from(monotonic_ns) + self.realtime_minus_monotonic_ns)
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

fn write_text(
    out: &mut impl Write,
    deltas: &[LatencyGroup],
    options: &TraceOptions,
    names: &mut DeviceNames,
) -> std::io::Result<()> {
    writeln!(out)?;
    if options.timestamp {
        writeln!(out, "{}", local_time(Timestamp::now()))?;
    }
    if deltas.is_empty() {
        writeln!(out, "(no completed requests)")?;
    }
    for group in deltas {
        let stream = group
            .stream
            .map_or_else(String::new, |id| format!("stream = {id}  "));
        let inversions = if group.stream.is_some() {
            format!("  inversions = {}", group.inversions)
        } else {
            String::new()
        };
        writeln!(
            out,
            "\n{stream}disk = {} ({})  op = {}  prio = {}  requests = {}  bytes = {}{inversions}",
            names.name(group.device),
            group.device,
            group.operation,
            group.priority,
            group.requests,
            abiss_proto::ByteSize(group.bytes).readable()
        )?;
        if options.queued {
            write_histogram(out, "queue usecs", &group.queue)?;
        }
        write_histogram(out, "service usecs", &group.service)?;
    }
    out.flush()
}

/// A biolatency-style histogram: one row per bucket from the first to the last non-empty one.
fn write_histogram(
    out: &mut impl Write,
    title: &str,
    histogram: &Log2Histogram,
) -> std::io::Result<()> {
    const WIDTH: u64 = 40;
    let first = histogram.slots.iter().position(|&c| c > 0);
    let last = histogram.slots.iter().rposition(|&c| c > 0);
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(());
    };
    let peak = histogram.slots.iter().copied().max().unwrap_or(1).max(1);
    writeln!(out, "{title:>24}: count    distribution")?;
    for index in first..=last {
        let count = histogram.slots[index];
        let (low, high) = Log2Histogram::bucket_bounds_us(index);
        let stars = usize::try_from(count * WIDTH / peak).unwrap_or(0);
        writeln!(
            out,
            "{low:>10} -> {:<10}: {count:<8} |{:<40}|",
            high - 1,
            "*".repeat(stars)
        )?;
    }
    let quantile = |q| {
        histogram
            .quantile_us(q)
            .map_or_else(|| "-".to_owned(), |v| v.to_string())
    };
    writeln!(
        out,
        "{:>24}  p50 <= {} us  p99 <= {} us  max {}{} us",
        "",
        quantile(0.5),
        quantile(0.99),
        if histogram.max_exact { "" } else { "<= " },
        histogram.max_ns.div_ceil(1000)
    )
}

#[derive(Serialize)]
struct JsonReport<'a> {
    /// When the report was taken, RFC 3339 in UTC.
    time: String,
    interval_s: f64,
    groups: Vec<JsonGroup<'a>>,
}

#[derive(Serialize)]
struct JsonGroup<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<StreamId>,
    device: String,
    dev: String,
    operation: String,
    class: String,
    level: u8,
    requests: u64,
    bytes: u64,
    inversions: u64,
    queue: JsonHistogram<'a>,
    service: JsonHistogram<'a>,
}

#[derive(Serialize)]
struct JsonBucket {
    low_us: u64,
    high_us: u64,
    count: u64,
}

#[derive(Serialize)]
struct JsonHistogram<'a> {
    /// All log2 buckets, bucket i covering [2^(i-1), 2^i) µs (bucket 0: under 1 µs).
    slots: &'a [u64],
    /// The non-empty buckets with their bounds.
    buckets: Vec<JsonBucket>,
    p50_us: Option<u64>,
    p99_us: Option<u64>,
    max_us: f64,
    max_exact: bool,
}

impl<'a> JsonHistogram<'a> {
    fn new(histogram: &'a Log2Histogram) -> Self {
        let buckets = histogram
            .slots
            .iter()
            .enumerate()
            .filter(|(_, &count)| count > 0)
            .map(|(index, &count)| {
                let (low_us, high_us) = Log2Histogram::bucket_bounds_us(index);
                JsonBucket {
                    low_us,
                    high_us,
                    count,
                }
            })
            .collect();
        #[expect(clippy::cast_precision_loss, reason = "microseconds for display")]
        let max_us = histogram.max_ns as f64 / 1000.0;
        Self {
            slots: &histogram.slots,
            buckets,
            p50_us: histogram.quantile_us(0.5),
            p99_us: histogram.quantile_us(0.99),
            max_us,
            max_exact: histogram.max_exact,
        }
    }
}

fn write_json(
    out: &mut impl Write,
    deltas: &[LatencyGroup],
    elapsed: Duration,
    names: &mut DeviceNames,
) -> std::io::Result<()> {
    let report = JsonReport {
        time: format!("{:.3}", Timestamp::now()),
        interval_s: elapsed.as_secs_f64(),
        groups: deltas
            .iter()
            .map(|group| JsonGroup {
                stream: group.stream,
                device: names.name(group.device),
                dev: group.device.to_string(),
                operation: group.operation.to_string(),
                class: group.priority.class.to_string(),
                level: group.priority.level,
                requests: group.requests,
                bytes: group.bytes,
                inversions: group.inversions,
                queue: JsonHistogram::new(&group.queue),
                service: JsonHistogram::new(&group.service),
            })
            .collect(),
    };
    serde_json::to_writer(&mut *out, &report)?;
    writeln!(out)?;
    out.flush()
}

/// An event as `--events --json` prints it: the record with its wall-clock time in RFC 3339
/// (`completed_ns` stays the kernel's monotonic clock).
#[derive(Serialize)]
struct JsonEvent<'a> {
    time: String,
    #[serde(flatten)]
    record: &'a RequestRecord,
}

/// Streams one line per completed request, like biosnoop.
fn events(client: &mut Client, options: &TraceOptions) -> Result<(), CliError> {
    let mut names = DeviceNames::load();
    client.subscribe_events()?;
    let clock = WallClock::now();
    let time_width = if options.timestamp { 15 } else { 11 };
    let mut out = std::io::stdout().lock();
    if !options.json {
        let _ = writeln!(
            out,
            "{:<time_width$} {:<16} {:<7} {:<9} T {:<12} {:<7} {:<7} {:<10} {:<6} {:>8} {:>8}",
            if options.timestamp { "TIME" } else { "TIME(s)" },
            "COMM",
            "PID",
            "DISK",
            "SECTOR",
            "BYTES",
            "PRIO",
            "INODE",
            "STREAM",
            "QUE(ms)",
            "LAT(ms)"
        );
    }
    let mut first_ns = None;
    let mut shown = 0;
    while options.count.is_none_or(|count| shown < count) {
        let record = client.next_event()?;
        if options.device.is_some_and(|device| device != record.device)
            || options
                .stream
                .is_some_and(|stream| record.stream != Some(stream))
            || (options.by == Grouping::Stream && record.stream.is_none())
        {
            continue;
        }
        let start = *first_ns.get_or_insert(record.completed_ns);
        let written = if options.json {
            let event = JsonEvent {
                time: format!("{:.6}", clock.at(record.completed_ns)),
                record: &record,
            };
            serde_json::to_writer(&mut out, &event)
                .map_err(std::io::Error::other)
                .and_then(|()| writeln!(out))
        } else {
            let time = if options.timestamp {
                clock
                    .at(record.completed_ns)
                    .to_zoned_datetime(TimeZone::system())
                    .strftime("%H:%M:%S%.6f")
                    .to_string()
            } else {
                #[expect(clippy::cast_precision_loss, reason = "times for display")]
                let seconds = record.completed_ns.saturating_sub(start) as f64 / 1e9;
                format!("{seconds:.6}")
            };
            write_event(&mut out, &record, &time, &mut names)
        };
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(());
        }
        shown += 1;
    }
    Ok(())
}

#[expect(clippy::cast_precision_loss, reason = "times for display")]
fn write_event(
    out: &mut impl Write,
    record: &RequestRecord,
    time: &str,
    names: &mut DeviceNames,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{time:<11} {:<16} {:<7} {:<9} {} {:<12} {:<7} {:<7} {:<10} {:<6} {:>8.3} {:>8.3}",
        record.comm,
        record.tgid,
        names.name(record.device),
        record.operation.letter(),
        record.sector,
        abiss_proto::ByteSize(u64::from(record.bytes)).readable(),
        record.priority.to_string(),
        record
            .inode
            .map_or_else(|| "-".to_owned(), |ino| ino.to_string()),
        record
            .stream
            .map_or_else(|| "-".to_owned(), |id| id.to_string()),
        record.queue_ns as f64 / 1e6,
        record.service_ns as f64 / 1e6,
    )
}
