//! A paced recorder for the recording tests: it knows nothing of abiss. A capture device hands
//! it `WRITE_BYTES` every `WRITE_BYTES / RATE` seconds; it writes each with write(2) to FILE
//! (opened for writing, created if missing, not truncated) as soon as the previous write
//! returned, and prints one JSON line.
//!
//! `abiss-test-recorder FILE RATE_BPS WRITE_BYTES CAPTURE_BUFFER_MS SECS [per-write]`
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

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

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

/// The thread's time spent waiting on a run queue so far, ns (the second figure of
/// `/proc/thread-self/schedstat`); 0 where the kernel does not say.
fn run_delay_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path: String = arg(&args, 0, "FILE");
    let rate: u64 = arg(&args, 1, "RATE_BPS");
    let write_bytes: u64 = arg(&args, 2, "WRITE_BYTES");
    let capture_ms: u64 = arg(&args, 3, "CAPTURE_BUFFER_MS");
    let seconds: u64 = arg(&args, 4, "SECS");
    let per_write = match args.get(5).map(String::as_str) {
        None => false,
        Some("per-write") => true,
        Some(other) => {
            eprintln!("abiss-test-recorder: unknown option {other:?} (the sixth argument may only be per-write)");
            std::process::exit(2)
        }
    };
    if rate == 0 || write_bytes == 0 || seconds == 0 {
        eprintln!("abiss-test-recorder: the rate, the write size and the time must be positive");
        std::process::exit(2);
    }
    let mut file = File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap_or_else(|error| {
            eprintln!("abiss-test-recorder: cannot open {path}: {error}");
            std::process::exit(1)
        });
    let period_ns = u128::from(write_bytes) * 1_000_000_000 / u128::from(rate);
    let period = Duration::from_nanos(u64::try_from(period_ns).unwrap_or(u64::MAX).max(1));
    let capture = Duration::from_millis(capture_ms);
    let writes =
        u32::try_from((u128::from(seconds) * 1_000_000_000).div_ceil(period.as_nanos().max(1)))
            .unwrap_or(u32::MAX);
    let data = vec![0xa5_u8; usize::try_from(write_bytes).expect("a write in memory")];
    let mut latencies = Vec::with_capacity(writes as usize);
    let mut cpu_waits_us = Vec::with_capacity(writes as usize);
    let (mut overflows, mut worst_overrun) = (0u32, Duration::ZERO);
    let start = Instant::now();
    for k in 0..writes {
        // Chunk k is complete at the end of its period; it is written once the previous
        // write returned and it exists.
        let arrived = start + period * (k + 1);
        if let Some(wait) = arrived.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let delay_before = run_delay_ns();
        let began = Instant::now();
        if let Err(error) = file.write_all(&data) {
            eprintln!("abiss-test-recorder: writing {path}: {error}");
            std::process::exit(1);
        }
        let returned = Instant::now();
        cpu_waits_us.push(run_delay_ns().saturating_sub(delay_before) / 1000);
        latencies.push(returned - began);
        let late = returned.saturating_duration_since(arrived + capture);
        if late > Duration::ZERO {
            overflows += 1;
            worst_overrun = worst_overrun.max(late);
        }
    }
    let per_write = if per_write {
        let write_us: Vec<u128> = latencies.iter().map(Duration::as_micros).collect();
        format!(",\"write_us\":{write_us:?},\"cpu_wait_us\":{cpu_waits_us:?}")
    } else {
        String::new()
    };
    latencies.sort_unstable();
    println!(
        "{{\"writes\":{writes},\"overflows\":{overflows},\"worst_overrun_ms\":{:.1},\"write_p50_ms\":{:.3},\"write_p99_ms\":{:.3},\"write_p999_ms\":{:.3},\"write_max_ms\":{:.3}{per_write}}}",
        worst_overrun.as_secs_f64() * 1000.0,
        quantile_ms(&latencies, 0.5),
        quantile_ms(&latencies, 0.99),
        quantile_ms(&latencies, 0.999),
        quantile_ms(&latencies, 1.0),
    );
}
