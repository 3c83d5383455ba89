//! One scrape's figures rendered in the Prometheus text format (0.0.4), with
//! `prometheus-client`'s encoder.
//!
//! The figures are a snapshot the main loop handed out (latency histograms, the streams, the
//! disks) plus what the metrics task reads itself (the daemon's CPU and memory, the programs'
//! run time); nothing here keeps state between scrapes. Names follow the Prometheus
//! conventions: the `abiss_` prefix, base units (seconds, bytes), `_total` for counters. The
//! eBPF log2 histograms become Prometheus histograms as `ebpf_exporter` exports them: bucket
//! `i` (`[2^(i-1), 2^i)` µs) is counted under `le = 2^i µs` in seconds, the last (open-ended)
//! bucket under `+Inf` only.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use abiss_proto::{
    DeviceNumber, LatencyGroup, Log2Histogram, StatusReport, StreamId, StreamInfo, LATENCY_BUCKETS,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The `Content-Type` of what [`render`] writes.
pub(crate) use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The admission modes a disk can be in, as `abiss_disk_admission_mode{mode}` lists them.
const ADMISSION_MODES: [&str; 4] = ["statistical", "deterministic", "share", "off"];

/// The daemon's own cost, read from the kernel at scrape time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct ProcessFigures {
    /// User plus system CPU time so far, seconds.
    pub(crate) cpu_seconds: f64,
    /// Resident set size, bytes.
    pub(crate) resident_bytes: u64,
}

/// One eBPF program's cumulative cost, while the kernel's BPF statistics are on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProgramRun {
    /// The program's name.
    pub(crate) name: String,
    /// Runs counted so far.
    pub(crate) runs: u64,
    /// Time spent in it so far, seconds.
    pub(crate) run_seconds: f64,
}

/// Everything one scrape shows.
#[derive(Clone, Debug)]
pub(crate) struct Snapshot {
    /// The cumulative latency histograms (`None` when the maps could not be read).
    pub(crate) latency: Option<Vec<LatencyGroup>>,
    /// Every stream.
    pub(crate) streams: Vec<StreamInfo>,
    /// The managed disks, raises, capabilities and locked memory.
    pub(crate) status: StatusReport,
    /// The daemon's CPU and memory.
    pub(crate) process: ProcessFigures,
    /// Per program run time; `None` while `kernel.bpf_stats_enabled` is off.
    pub(crate) programs: Option<Vec<ProgramRun>>,
    /// Kernel names of the disks (`loop3`); a disk without one is labelled `major:minor`.
    pub(crate) device_names: BTreeMap<DeviceNumber, String>,
}

impl Snapshot {
    /// The `device` label of a disk.
    fn device(&self, number: DeviceNumber) -> String {
        self.device_names
            .get(&number)
            .cloned()
            .unwrap_or_else(|| number.to_string())
    }

    /// The names of the disks serving stream `s`, joined by `+` (`loop3+loop4` for a btrfs
    /// over two).
    fn devices(&self, s: &StreamInfo) -> String {
        if s.disks.is_empty() {
            return self.device(s.disk);
        }
        let names: Vec<String> = s.disks.iter().map(|&disk| self.device(disk)).collect();
        names.join("+")
    }
}

/// Renders `snapshot` in the Prometheus text format.
#[must_use]
pub(crate) fn render(snapshot: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(snapshot));
    let mut text = String::new();
    if prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).is_err() {
        // Writing to a String cannot fail; say so in the output rather than panic.
        let _ = writeln!(text, "# abissd could not encode its metrics");
    }
    text
}

type Labels = Vec<(&'static str, String)>;

/// Writes one metric family, or nothing when it has no samples (so an idle daemon lists no
/// empty families).
/// How late the main loop woke, by what woke it, at three quantiles (where it has woken).
#[expect(
    clippy::cast_precision_loss,
    reason = "microseconds well under 2^52, shown in seconds"
)]
fn encode_main_loop(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let main_loop = &snapshot.status.main_loop;
    let mut samples: Vec<(Labels, f64)> = Vec::new();
    for (wakeup, figures) in [
        (
            "credit_timer",
            [
                main_loop.late_p50_us,
                main_loop.late_p99_us,
                main_loop.late_max_us,
            ],
        ),
        (
            "access",
            [
                main_loop.access_p50_us,
                main_loop.access_p99_us,
                main_loop.access_max_us,
            ],
        ),
    ] {
        for (quantile, us) in ["0.5", "0.99", "1"].into_iter().zip(figures) {
            if let Some(us) = us {
                let labels = vec![
                    ("wakeup", wakeup.to_owned()),
                    ("quantile", quantile.to_owned()),
                ];
                samples.push((labels, us as f64 / 1e6));
            }
        }
    }
    gauges(
        encoder,
        "abiss_main_loop_late_seconds",
        "How late abissd's loop woke since it started: for its credit timer, or to handle a reader's access (quantile 1 is the latest).",
        &samples,
    )?;
    gauges(
        encoder,
        "abiss_main_loop_longest_turn_seconds",
        "The longest one wakeup of abissd's loop took to do its work.",
        &[(Vec::new(), main_loop.longest_turn_us as f64 / 1e6)],
    )
}

fn family<T>(
    encoder: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    samples: &[(Labels, T)],
    mut write: impl FnMut(&mut MetricEncoder, &T) -> fmt::Result,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            write(&mut metric, value)?;
        } else {
            write(&mut metric.encode_family(labels)?, value)?;
        }
    }
    Ok(())
}

/// A gauge family.
fn gauges<T: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, T)],
) -> fmt::Result {
    family(encoder, (name, help, MetricType::Gauge), samples, |m, v| {
        m.encode_gauge(v)
    })
}

/// A counter family; the encoder adds `_total` to `name`.
fn counters<T: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, T)],
) -> fmt::Result {
    family(
        encoder,
        (name, help, MetricType::Counter),
        samples,
        |m, v| m.encode_counter::<NoLabelSet, T, f64>(v, None),
    )
}

/// Upper bound of log2 bucket `index`, in seconds.
fn bucket_top_seconds(index: usize) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "powers of two up to 2^26 µs")]
    let top_us = Log2Histogram::bucket_bounds_us(index).1 as f64;
    top_us / 1e6
}

/// Prometheus buckets, the count, and an estimated sum (seconds) of a log2 histogram. The
/// programs keep no sum, so each sample counts as the middle of its bucket.
fn prometheus_buckets(histogram: &Log2Histogram) -> (Vec<(f64, u64)>, u64, f64) {
    let last = LATENCY_BUCKETS - 1;
    let buckets = (0..last)
        .map(|i| {
            (
                bucket_top_seconds(i),
                histogram.slots.get(i).copied().unwrap_or(0),
            )
        })
        .collect();
    let sum = histogram
        .slots
        .iter()
        .enumerate()
        .map(|(i, &count)| {
            let (low, high) = Log2Histogram::bucket_bounds_us(i);
            #[expect(clippy::cast_precision_loss, reason = "an estimate in seconds")]
            let middle = (low + high) as f64 / 2e6;
            #[expect(clippy::cast_precision_loss, reason = "an estimate in seconds")]
            let total = middle * count as f64;
            total
        })
        .sum();
    (buckets, histogram.count(), sum)
}

/// The latency groups merged over streams, by (device, operation, class, level).
fn by_priority(snapshot: &Snapshot) -> BTreeMap<(String, String, String, u8), LatencyGroup> {
    let mut merged: BTreeMap<_, LatencyGroup> = BTreeMap::new();
    for group in snapshot.latency.iter().flatten() {
        let key = (
            snapshot.device(group.device),
            group.operation.to_string(),
            group.priority.class.to_string(),
            group.priority.level,
        );
        match merged.get_mut(&key) {
            Some(total) => {
                total.requests += group.requests;
                total.bytes += group.bytes;
                total.queue.merge(&group.queue);
                total.service.merge(&group.service);
            }
            None => {
                merged.insert(key, group.clone());
            }
        }
    }
    merged
}

fn encode_block(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let merged: Vec<(Labels, LatencyGroup)> = by_priority(snapshot)
        .into_iter()
        .map(|((device, operation, class, level), group)| {
            let labels = vec![
                ("device", device),
                ("operation", operation),
                ("class", class),
                ("level", level.to_string()),
            ];
            (labels, group)
        })
        .collect();
    for (name, help, queue) in [
        (
            "abiss_block_queue_seconds",
            "Block request queue time (elevator insert to driver dispatch), log2 buckets.",
            true,
        ),
        (
            "abiss_block_service_seconds",
            "Block request service time (driver dispatch to completion), log2 buckets.",
            false,
        ),
    ] {
        family(
            encoder,
            (name, help, MetricType::Histogram),
            &merged,
            |metric, group| {
                let histogram = if queue { &group.queue } else { &group.service };
                let (buckets, count, sum) = prometheus_buckets(histogram);
                metric.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
            },
        )?;
    }
    let pick = |f: fn(&LatencyGroup) -> u64| -> Vec<(Labels, u64)> {
        merged.iter().map(|(l, g)| (l.clone(), f(g))).collect()
    };
    counters(
        encoder,
        "abiss_block_requests",
        "Completed block requests.",
        &pick(|g| g.requests),
    )?;
    counters(
        encoder,
        "abiss_block_bytes",
        "Bytes of completed block requests.",
        &pick(|g| g.bytes),
    )
}

/// Priority inversions per stream: its requests that ran below the stream's level.
fn inversions(snapshot: &Snapshot) -> BTreeMap<StreamId, u64> {
    let mut found = BTreeMap::new();
    for group in snapshot.latency.iter().flatten() {
        if let Some(stream) = group.stream {
            *found.entry(stream).or_insert(0) += group.inversions;
        }
    }
    found
}

/// A stream's gauges: name, help, value.
type StreamGauge = (&'static str, &'static str, fn(&StreamInfo) -> f64);

#[expect(
    clippy::cast_precision_loss,
    reason = "byte figures as Prometheus floats"
)]
const STREAM_GAUGES: [StreamGauge; 7] = [
    (
        "abiss_stream_rate_bytes_per_second",
        "Granted rate of the stream.",
        |s| s.rate.0 as f64,
    ),
    (
        "abiss_stream_buffer_bytes",
        "Playout buffer of the stream.",
        |s| s.buffer.0 as f64,
    ),
    (
        "abiss_stream_resident_bytes",
        "Bytes of the stream's window in memory.",
        |s| s.resident_bytes as f64,
    ),
    (
        "abiss_stream_locked_bytes",
        "Bytes the stream has locked in memory.",
        |s| s.locked_bytes as f64,
    ),
    (
        "abiss_stream_credit_bytes",
        "Credit of the stream's timer (negative after a refill charged ahead).",
        |s| s.credit_bytes as f64,
    ),
    (
        "abiss_stream_level",
        "ABISS priority level of the stream (0 is the highest).",
        |s| f64::from(s.priority),
    ),
    (
        "abiss_stream_readers",
        "Tasks seen reading the stream's file recently.",
        |s| s.readers.len() as f64,
    ),
];

/// A stream's counters: name (without `_total`), help, value.
type StreamCounter = (&'static str, &'static str, fn(&StreamInfo) -> u64);

const STREAM_COUNTERS: [StreamCounter; 5] = [
    (
        "abiss_stream_misses",
        "Reads of the stream's file that had to wait for the disk for data its window should have held.",
        |s| s.misses,
    ),
    (
        "abiss_stream_seek_waits",
        "Reads of the stream's file that waited for the window a seek asked for.",
        |s| s.seek_waits,
    ),
    (
        "abiss_stream_upgrades",
        "Reader threads raised to the stream's priority.",
        |s| s.raises,
    ),
    (
        "abiss_stream_prefetched_bytes",
        "Bytes loaded by the stream's prefetch.",
        |s| s.prefetched_bytes,
    ),
    (
        "abiss_stream_uring_requests",
        "io_uring requests readers submitted on the stream's file.",
        |s| s.uring_requests,
    ),
];

fn encode_streams(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let labels = |s: &StreamInfo| -> Labels {
        vec![
            ("stream", s.id.to_string()),
            ("device", snapshot.devices(s)),
            ("uid", s.owner_uid.to_string()),
        ]
    };
    for (name, help, value) in STREAM_GAUGES {
        let samples: Vec<(Labels, f64)> = snapshot
            .streams
            .iter()
            .map(|s| (labels(s), value(s)))
            .collect();
        gauges(encoder, name, help, &samples)?;
    }
    for (name, help, value) in STREAM_COUNTERS {
        let samples: Vec<(Labels, u64)> = snapshot
            .streams
            .iter()
            .map(|s| (labels(s), value(s)))
            .collect();
        counters(encoder, name, help, &samples)?;
    }
    let inverted = inversions(snapshot);
    let samples: Vec<(Labels, u64)> = snapshot
        .streams
        .iter()
        .map(|s| (labels(s), inverted.get(&s.id).copied().unwrap_or(0)))
        .collect();
    counters(
        encoder,
        "abiss_stream_inversions",
        "Block requests of the stream that ran below its level.",
        &samples,
    )
}

/// The admission mode's name: the first word of the status (`statistical (p_req 0.01)`).
fn admission_mode(admission: &str) -> &str {
    admission.split_whitespace().next().unwrap_or("")
}

#[expect(
    clippy::cast_precision_loss,
    reason = "byte rates as Prometheus floats"
)]
fn encode_disks(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let devices = &snapshot.status.devices;
    let labels = |d: &abiss_proto::DeviceStatus| -> Labels { vec![("device", d.name.clone())] };
    let gauge = |f: &dyn Fn(&abiss_proto::DeviceStatus) -> f64| -> Vec<(Labels, f64)> {
        devices.iter().map(|d| (labels(d), f(d))).collect()
    };
    let g = [
        ("abiss_disk_capacity_bytes_per_second", "Capacity admission works with (configured, or from the device model).", gauge(&|d| d.capacity.0 as f64)),
        ("abiss_disk_reserved_bytes_per_second", "Sum of the admitted streams' rates.", gauge(&|d| d.reserved.0 as f64)),
        ("abiss_disk_free_bytes_per_second", "Highest rate one more stream would be admitted at.", gauge(&|d| d.free.0 as f64)),
        ("abiss_disk_realtime_share_ratio", "Share of the disk real-time streams may use.", gauge(&|d| f64::from(d.realtime_share_percent) / 100.0)),
        ("abiss_disk_streams", "Streams on the disk.", gauge(&|d| f64::from(d.streams))),
        ("abiss_disk_miss_probability", "Predicted probability that a service window overruns, for the admitted streams (0 without a model).", gauge(&|d| f64::from(d.miss_probability_ppm) / 1e6)),
    ];
    for (name, help, samples) in &g {
        gauges(encoder, name, help, samples)?;
    }
    let modes: Vec<(Labels, u64)> = devices
        .iter()
        .flat_map(|d| {
            let now = admission_mode(&d.admission);
            ADMISSION_MODES.iter().map(move |&mode| {
                let labels = vec![("device", d.name.clone()), ("mode", mode.to_owned())];
                (labels, u64::from(mode == now))
            })
        })
        .collect();
    gauges(
        encoder,
        "abiss_disk_admission_mode",
        "1 for the disk's admission mode, 0 for the others.",
        &modes,
    )
}

#[expect(
    clippy::cast_precision_loss,
    reason = "byte counts as Prometheus floats"
)]
fn encode_daemon(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let none = Vec::new;
    let version = vec![("version", env!("CARGO_PKG_VERSION").to_owned())];
    gauges(
        encoder,
        "abiss_build_info",
        "The abissd version, always 1.",
        &[(version, 1u64)],
    )?;
    counters(
        encoder,
        "abiss_daemon_cpu_seconds",
        "CPU time (user and system) abissd has used.",
        &[(none(), snapshot.process.cpu_seconds)],
    )?;
    gauges(
        encoder,
        "abiss_daemon_resident_memory_bytes",
        "Resident memory of abissd.",
        &[(none(), snapshot.process.resident_bytes as f64)],
    )?;
    let memory = &snapshot.status.memory;
    let g = [
        (
            "abiss_locked_memory_bytes",
            "Bytes all playout buffers have locked now.",
            memory.locked_bytes,
        ),
        (
            "abiss_locked_memory_reserved_bytes",
            "Bytes all streams may lock at most (buffer plus a batch each).",
            memory.reserved_bytes,
        ),
        (
            "abiss_locked_memory_budget_bytes",
            "Most bytes all playout buffers together may lock.",
            memory.budget_bytes,
        ),
        (
            "abiss_reader_upgrades_active",
            "Reader threads raised to a stream's priority now.",
            snapshot.status.raises.active,
        ),
    ];
    for (name, help, value) in g {
        gauges(encoder, name, help, &[(none(), value)])?;
    }
    let raises = &snapshot.status.raises;
    counters(
        encoder,
        "abiss_reader_upgrades",
        "Reader threads raised since abissd started.",
        &[(none(), raises.total)],
    )?;
    counters(
        encoder,
        "abiss_reader_restores",
        "Raised reader threads put back to their earlier priority.",
        &[(none(), raises.restored)],
    )?;
    encode_main_loop(snapshot, encoder)?;
    let capabilities: Vec<(Labels, u64)> = snapshot
        .status
        .capabilities
        .iter()
        .map(|c| (vec![("capability", c.name.clone())], u64::from(c.on)))
        .collect();
    gauges(
        encoder,
        "abiss_capability_enabled",
        "1 for an optional part that works on this kernel and was not switched off.",
        &capabilities,
    )?;
    encode_programs(snapshot, encoder)
}

fn encode_programs(snapshot: &Snapshot, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let Some(programs) = &snapshot.programs else {
        return Ok(());
    };
    let labels = |p: &ProgramRun| -> Labels { vec![("program", p.name.clone())] };
    let runs: Vec<(Labels, u64)> = programs.iter().map(|p| (labels(p), p.runs)).collect();
    let seconds: Vec<(Labels, f64)> = programs
        .iter()
        .map(|p| (labels(p), p.run_seconds))
        .collect();
    counters(
        encoder,
        "abiss_bpf_program_runs",
        "Runs of the eBPF program counted while kernel.bpf_stats_enabled was on.",
        &runs,
    )?;
    counters(
        encoder,
        "abiss_bpf_program_run_seconds",
        "Time spent in the eBPF program while kernel.bpf_stats_enabled was on.",
        &seconds,
    )
}

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        encode_block(self, &mut encoder)?;
        encode_streams(self, &mut encoder)?;
        encode_disks(self, &mut encoder)?;
        encode_daemon(self, &mut encoder)
    }
}
