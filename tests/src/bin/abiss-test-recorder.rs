//! A paced recorder for the recording tests: it knows nothing of abiss. A capture device hands
//! it `WRITE_BYTES` every `WRITE_BYTES / RATE` seconds; it writes each with write(2) to FILE
//! (opened for writing, created if missing, not truncated) as soon as the previous write
//! returned, and prints one JSON line. Every 8-byte word of what it writes holds its own file
//! offset (little-endian, [`offset_pattern`]), so a reader can tell that each byte of the file
//! is the one written there.
//!
//! `abiss-test-recorder FILE RATE_BPS WRITE_BYTES CAPTURE_BUFFER_MS SECS [per-write] [library=RATE:RING[:preallocate]]`
//!
//! An **overflow** is a write that returned after the capture buffer (`CAPTURE_BUFFER_MS` of
//! data) would have been full: its data arrived at `t_k` and was still not in the page cache at
//! `t_k + CAPTURE_BUFFER_MS`, so a real capture device would have dropped frames. The summary
//! has the writes, the overflows, the worst overrun (how late past the buffer), and the time
//! each write(2) took (p50, p99, p99.9, max). With `per-write` it also says, for each write in
//! order, how long it took (`write_us`) and how long of it the thread waited for a CPU (`cpu_wait_us`, the
//! run-queue delay the kernel counts in `/proc/thread-self/schedstat`, read just before and
//! after the call): that part of a write's time is the machine's CPU load, not the disk or the
//! page cache.
//!
//! With `library=RATE:RING` (e.g. `library=1.1MB/s:2MiB`) it records through the Rust
//! library's `DirectRecording` instead (what the C library's `abiss_fwrite` calls under
//! `ABISS_DIRECT`): attached at RATE with a ring of RING through the abissd at `ABISS_SOCKET`,
//! each write a copy into the ring unless the ring is full. The summary then also holds
//! `record`, what the library reported at the end (the ring's overflows, the direct writes and
//! their times, whether abissd raised the writer). With `per-write` it also gives each write's
//! start (`start_us`, from the recorder's start): a benchmark computes its figures from these
//! times as it does from traced write(2) calls.

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use abiss_client::{DirectRecording, StreamOptions};

fn arg<T: std::str::FromStr>(args: &[String], index: usize, name: &str) -> T {
    args.get(index)
        .and_then(|text| text.parse().ok())
        .unwrap_or_else(|| {
            eprintln!(
                "usage: abiss-test-recorder FILE RATE_BPS WRITE_BYTES CAPTURE_BUFFER_MS SECS ({name} missing or not a number)"
            );
            std::process::exit(2)
        })
}

fn quantile_ms(sorted: &[Duration], quantile: f64) -> f64 {
    abiss_lab::stats::quantile(sorted, quantile)
        .map_or(0.0, |latency| latency.as_secs_f64() * 1000.0)
}

/// Fills `chunk`, to be written at file offset `offset`, with the file's pattern
/// (`abiss_bench::recording::content::pattern_byte`, which the benchmark checks recordings
/// against).
fn offset_pattern(chunk: &mut [u8], offset: u64) {
    for (index, byte) in chunk.iter_mut().enumerate() {
        *byte = abiss_bench::recording::content::pattern_byte(offset + index as u64);
    }
}

/// `RATE:RING[:preallocate]` of `library=`, as abissctl reads them (`1.1MB/s:2MiB`), and
/// whether abissd allocates the file ahead (`abissctl record --preallocate`).
fn library_options(text: &str) -> Option<StreamOptions> {
    let mut parts = text.split(':');
    let (rate, ring) = (parts.next()?, parts.next()?);
    let preallocate = match parts.next() {
        None => false,
        Some("preallocate") => true,
        Some(_) => return None,
    };
    Some(StreamOptions {
        preallocate,
        ..StreamOptions::new(rate.parse().ok()?, ring.parse().ok()?)
    })
}

/// The options after SECS: `per-write`, and `library=RATE:RING`; exits on any other.
fn options(args: &[String]) -> (bool, Option<StreamOptions>) {
    let (mut per_write, mut library) = (false, None);
    for option in args {
        if option == "per-write" {
            per_write = true;
        } else if let Some(options) = option.strip_prefix("library=").and_then(library_options) {
            library = Some(options);
        } else {
            eprintln!(
                "abiss-test-recorder: unknown option {option:?} (after SECS: per-write, library=RATE:RING[:preallocate])"
            );
            std::process::exit(2)
        }
    }
    (per_write, library)
}

/// Where the recorder writes: its file through the page cache, or the library's ring.
enum Sink {
    File(File),
    Library(Box<DirectRecording>),
}

impl Sink {
    /// Opens `path` (created if missing; through the page cache not truncated, through the
    /// library emptied once abissd took the stream), or exits with one sentence.
    fn open(path: &str, library: Option<&StreamOptions>) -> Self {
        let opened = match library {
            None => File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map(Self::File)
                .map_err(|error| error.to_string()),
            Some(options) => DirectRecording::start(path, options)
                .map(|recording| Self::Library(Box::new(recording)))
                .map_err(|error| error.to_string()),
        };
        opened.unwrap_or_else(|error| {
            eprintln!("abiss-test-recorder: cannot open {path}: {error}");
            std::process::exit(1)
        })
    }

    fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Self::File(file) => file.write_all(data),
            Self::Library(recording) => recording.write_all(data),
        }
    }

    /// Ends the recording; through the library, its summary as the JSON field `record`
    /// (`abissctl record --json`'s keys but its file and ring size, and with the stream), or
    /// exits with one sentence.
    fn finish(self, path: &str) -> String {
        let Self::Library(recording) = self else {
            return String::new();
        };
        let stream = recording.stream().id.0;
        let summary = recording.finish().unwrap_or_else(|error| {
            eprintln!("abiss-test-recorder: cannot finish {path}: {error}");
            std::process::exit(1)
        });
        let mut record = serde_json::to_value(&summary).unwrap_or_default();
        if let Some(fields) = record.as_object_mut() {
            fields.insert("stream".into(), serde_json::json!(stream));
        }
        format!(",\"record\":{record}")
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path: String = arg(&args, 0, "FILE");
    let rate: u64 = arg(&args, 1, "RATE_BPS");
    let write_bytes: u64 = arg(&args, 2, "WRITE_BYTES");
    let capture_ms: u64 = arg(&args, 3, "CAPTURE_BUFFER_MS");
    let seconds: u64 = arg(&args, 4, "SECS");
    let (per_write, library) = options(&args[5.min(args.len())..]);
    if rate == 0 || write_bytes == 0 || seconds == 0 {
        eprintln!("abiss-test-recorder: the rate, the write size and the time must be positive");
        std::process::exit(2);
    }
    let mut sink = Sink::open(&path, library.as_ref());
    let period_ns = u128::from(write_bytes) * 1_000_000_000 / u128::from(rate);
    let period = Duration::from_nanos(u64::try_from(period_ns).unwrap_or(u64::MAX).max(1));
    let capture = Duration::from_millis(capture_ms);
    let writes =
        u32::try_from((u128::from(seconds) * 1_000_000_000).div_ceil(period.as_nanos().max(1)))
            .unwrap_or(u32::MAX);
    let mut data = vec![0_u8; usize::try_from(write_bytes).expect("a write in memory")];
    let mut latencies = Vec::with_capacity(writes as usize);
    let mut starts_us = Vec::with_capacity(writes as usize);
    let mut cpu_waits_us = Vec::with_capacity(writes as usize);
    let (mut overflows, mut worst_overrun) = (0u32, Duration::ZERO);
    let start = Instant::now();
    for k in 0..writes {
        // Chunk k is complete at the end of its period; it is written once the previous
        // write returned and it exists.
        let arrived = start + period * (k + 1);
        offset_pattern(&mut data, u64::from(k) * write_bytes);
        if let Some(wait) = arrived.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let delay_before = abiss_os::clock::thread_run_delay_ns();
        let began = Instant::now();
        starts_us.push((began - start).as_micros());
        if let Err(error) = sink.write_all(&data) {
            eprintln!("abiss-test-recorder: writing {path}: {error}");
            std::process::exit(1);
        }
        let returned = Instant::now();
        // Read just outside the timed write, so never counted as more than the write.
        let waited_ns = abiss_os::clock::thread_run_delay_ns().saturating_sub(delay_before);
        let took = returned - began;
        cpu_waits_us.push(u128::from(waited_ns / 1000).min(took.as_micros()));
        latencies.push(took);
        let late = returned.saturating_duration_since(arrived + capture);
        if late > Duration::ZERO {
            overflows += 1;
            worst_overrun = worst_overrun.max(late);
        }
    }
    let per_write = if per_write {
        let write_us: Vec<u128> = latencies.iter().map(Duration::as_micros).collect();
        format!(
            ",\"start_us\":{starts_us:?},\"write_us\":{write_us:?},\"cpu_wait_us\":{cpu_waits_us:?}"
        )
    } else {
        String::new()
    };
    let record = sink.finish(&path);
    // The slowest write, and how much of it the thread waited for a CPU.
    let slowest = (0..latencies.len()).max_by_key(|&index| latencies[index]);
    #[expect(clippy::cast_precision_loss, reason = "µs of a write")]
    let slowest_cpu_wait_ms = slowest.map_or(0.0, |index| cpu_waits_us[index] as f64 / 1000.0);
    latencies.sort_unstable();
    println!(
        "{{\"writes\":{writes},\"overflows\":{overflows},\"worst_overrun_ms\":{:.1},\"write_p50_ms\":{:.3},\"write_p99_ms\":{:.3},\"write_p999_ms\":{:.3},\"write_max_ms\":{:.3},\"write_max_cpu_wait_ms\":{slowest_cpu_wait_ms:.3}{per_write}{record}}}",
        worst_overrun.as_secs_f64() * 1000.0,
        quantile_ms(&latencies, 0.5),
        quantile_ms(&latencies, 0.99),
        quantile_ms(&latencies, 0.999),
        quantile_ms(&latencies, 1.0),
    );
}
