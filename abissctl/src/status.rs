//! `status`: the daemon's reader raises, locked memory, loop, capabilities and managed devices.

use std::io::Write;

use abiss_client::Client;
use abiss_proto::{ByteRate, ByteSize, LoopReport, RaiseReport};

use crate::error::CliError;

/// One line on reader raises.
fn raise_line(raises: &RaiseReport) -> String {
    if !raises.enabled {
        return "reader raises: off (abissd --no-raises)".to_owned();
    }
    format!(
        "reader raises: {} raised now, {} in all, {} restored, {} dropped for other files' I/O; event to priority p50 {}, p99 {}, max {}",
        raises.active,
        raises.total,
        raises.restored,
        raises.policed,
        micros(raises.latency_p50_us),
        micros(raises.latency_p99_us),
        micros(raises.latency_max_us)
    )
}

/// A figure in µs, or `-` where there is none yet.
fn micros(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |us| format!("{us} µs"))
}

/// One line on how punctual the daemon's loop is.
fn loop_line(main_loop: &LoopReport) -> String {
    format!(
        "main loop: {} credit-timer wakeups late by p50 {}, p99 {}, max {}; {} reader accesses handled after p50 {}, p99 {}, max {}; longest turn {} µs",
        main_loop.timer_wakeups,
        micros(main_loop.late_p50_us),
        micros(main_loop.late_p99_us),
        micros(main_loop.late_max_us),
        main_loop.accesses,
        micros(main_loop.access_p50_us),
        micros(main_loop.access_p99_us),
        micros(main_loop.access_max_us),
        main_loop.longest_turn_us
    )
}

/// Prints the daemon's figures and the managed devices.
pub fn status(client: &mut Client, json: bool) -> Result<(), CliError> {
    let report = client.status_report()?;
    let mut out = std::io::stdout().lock();
    if json {
        crate::json::print(&mut out, &report);
        return Ok(());
    }
    let devices = report.devices;
    let _ = writeln!(out, "{}", raise_line(&report.raises));
    let _ = writeln!(out, "{}", loop_line(&report.main_loop));
    let memory = &report.memory;
    let _ = writeln!(
        out,
        "locked memory: {} locked, {} reserved of {} (yours: {} locked, {} reserved of {} per user)",
        ByteSize(memory.locked_bytes).readable(),
        ByteSize(memory.reserved_bytes).readable(),
        ByteSize(memory.budget_bytes).readable(),
        ByteSize(memory.yours_locked_bytes).readable(),
        ByteSize(memory.yours_reserved_bytes).readable(),
        ByteSize(memory.per_user_budget_bytes).readable(),
    );
    for capability in &report.capabilities {
        let _ = match &capability.off_because {
            None => match &capability.stand_in {
                None => writeln!(out, "{:<18} on   {}", capability.name, capability.gives),
                Some(how) => writeln!(
                    out,
                    "{:<18} on   {} ({how})",
                    capability.name, capability.gives
                ),
            },
            Some(why) => writeln!(
                out,
                "{:<18} OFF  {why} (needs {})",
                capability.name, capability.needs
            ),
        };
    }
    if devices.is_empty() {
        let _ = writeln!(out, "abissd manages no device (start it with --device DEV)");
        return Ok(());
    }
    let _ = writeln!(
        out,
        "{:<10} {:>7} {:<12} {:>5} {:>13} {:>6} {:>13} {:>13} {:>13} {:>13} {:>7}  CAPACITY FROM",
        "DEVICE",
        "DEV",
        "ELEVATOR",
        "DEPTH",
        "CAPACITY",
        "RT %",
        "RESERVED",
        "READ",
        "WRITE",
        "FREE",
        "STREAMS"
    );
    for device in &devices {
        let _ = writeln!(
            out,
            "{:<10} {:>7} {:<12} {:>5} {:>13} {:>6} {:>13} {:>13} {:>13} {:>13} {:>7}  {}",
            device.name,
            device.device.to_string(),
            device.elevator,
            device.dispatch_depth,
            device.capacity.readable(),
            device.realtime_share_percent,
            device.reserved.readable(),
            ByteRate(device.reserved.0.saturating_sub(device.reserved_write.0)).readable(),
            device.reserved_write.readable(),
            device.free.readable(),
            device.streams,
            device.capacity_source
        );
        if !device.built_on.is_empty() {
            let _ = writeln!(out, "{:<10} under {}", "", device.built_on.join(", "));
        }
    }
    Ok(())
}
