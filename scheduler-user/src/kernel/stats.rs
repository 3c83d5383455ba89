//! What the eBPF programs and the daemon cost, measured rather than guessed.
//!
//! Kernel BPF run-time statistics slow every program a little, so they are switched on only for
//! the window a client asks about: the `enable_stats` descriptor is held for that window and
//! closing it switches them off again (as bpftop does).

use std::time::{Duration, Instant};

use abiss_proto::{ProgramCost, StatsReport};
use aya::programs::loaded_programs;
use aya::sys::{enable_stats, Stats};

/// Run count and time per program id at one instant.
fn sample(ids: &[(String, u32)]) -> Vec<(u64, u64)> {
    let mut found = vec![(0, 0); ids.len()];
    for info in loaded_programs().flatten() {
        if let Some(index) = ids.iter().position(|(_, id)| *id == info.id()) {
            let run_ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            found[index] = (info.run_count(), run_ns);
        }
    }
    found
}

/// Total CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// This process's resident set size, in bytes.
fn rss_bytes() -> u64 {
    procfs::process::Process::myself()
        .and_then(|me| me.status())
        .ok()
        .and_then(|status| status.vmrss)
        .map_or(0, |kib| kib * 1024)
}

/// Measures the programs in `ids` over `window`. Waits for the window to pass.
pub(crate) async fn measure(
    ids: &[(String, u32)],
    window: Duration,
) -> std::io::Result<StatsReport> {
    let stats_on = enable_stats(Stats::RunTime).map_err(std::io::Error::other)?;
    let started = Instant::now();
    let cpu_before = cpu_time();
    let before = sample(ids);
    tokio::time::sleep(window).await;
    let after = sample(ids);
    let cpu_after = cpu_time();
    let elapsed = started.elapsed();
    drop(stats_on);

    let programs = ids
        .iter()
        .zip(before.iter().zip(&after))
        .map(|((name, id), (&(count0, time0), &(count1, time1)))| {
            let run_count = count1.saturating_sub(count0);
            let run_time_ns = time1.saturating_sub(time0);
            #[expect(clippy::cast_precision_loss, reason = "a mean for display")]
            let avg_ns = if run_count == 0 {
                0.0
            } else {
                run_time_ns as f64 / run_count as f64
            };
            ProgramCost {
                name: name.clone(),
                id: *id,
                run_count,
                run_time_ns,
                avg_ns,
            }
        })
        .collect();
    let as_ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    Ok(StatsReport {
        window_ns: as_ns(elapsed),
        programs,
        daemon_cpu_ns: as_ns(cpu_after.saturating_sub(cpu_before)),
        daemon_cpu_total_ns: as_ns(cpu_after),
        daemon_rss_bytes: rss_bytes(),
        tracked_requests: 0,
        request_records: 0,
    })
}
