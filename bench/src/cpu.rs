//! What the machine's CPUs did while a benchmark row ran: their busy share and the load
//! average (steal, the hypervisor's share, is `abiss_lab::system::stolen_since`).

/// (busy, total) ticks of all CPUs so far (`abiss_lab::system::cpu_ticks`, the one reader of
/// `/proc/stat`).
pub(crate) fn cpu_times() -> anyhow::Result<(u64, u64)> {
    Ok(abiss_lab::system::cpu_ticks()?)
}

/// The busy share of all CPUs between two [`cpu_times`], %.
#[expect(clippy::cast_precision_loss, reason = "jiffies")]
pub(crate) fn busy_pct(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1).max(1);
    after.0.saturating_sub(before.0) as f64 / total as f64 * 100.0
}

/// The 1-minute load average (NaN if /proc does not say).
pub(crate) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}
