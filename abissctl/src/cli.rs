//! Command-line arguments and dispatch.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::devices;
use crate::error::CliError;
use crate::stats;
use crate::trace::{self, TraceOptions};
use abiss_client::Client;

/// Guaranteed-rate file streaming and block I/O tracing by priority (ABISS).
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    /// abissd's control socket.
    #[arg(long, global = true, env = abiss_proto::SOCKET_ENV, default_value = abiss_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Live block I/O latency by device, operation and I/O priority (like biolatency -D), or one
    /// line per request with --events (like biosnoop).
    Trace {
        /// Only this device: NAME (loop0), /dev/NAME or MAJOR:MINOR.
        #[arg(long, short = 'd')]
        device: Option<String>,
        /// Also show the queue time (elevator insert to dispatch) histogram.
        #[arg(long, short = 'Q')]
        queued: bool,
        /// Seconds between reports.
        #[arg(long, short = 'i', default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
        interval: Duration,
        /// Stop after this many reports (or events with --events).
        #[arg(long, short = 'c', value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// One JSON object per report (or event).
        #[arg(long, short = 'j')]
        json: bool,
        /// One line per completed request instead of histograms.
        #[arg(long, short = 'e')]
        events: bool,
    },
    /// Cost of each eBPF program (runs and mean ns per run) and of the daemon (CPU, RSS),
    /// measured over an interval with kernel BPF statistics switched on only meanwhile.
    Stats {
        /// Seconds to measure.
        #[arg(long, short = 'i', default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
        interval: Duration,
        /// Print JSON.
        #[arg(long, short = 'j')]
        json: bool,
    },
}

/// Seconds as a positive number up to a day.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !seconds.is_finite() || seconds <= 0.0 || seconds > 86_400.0 {
        return Err(format!("{text} s is not between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Runs one command.
pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Trace {
            device,
            queued,
            interval,
            count,
            json,
            events,
        } => {
            let device = device.as_deref().map(devices::resolve).transpose()?;
            let options = TraceOptions {
                device,
                queued,
                interval,
                count,
                json,
            };
            let mut client = Client::connect(&cli.socket)?;
            if events {
                trace::events(&mut client, &options)
            } else {
                trace::histograms(&mut client, &options)
            }
        }
        Command::Stats { interval, json } => {
            let mut client = Client::connect(&cli.socket)?;
            stats::show(&mut client, interval, json)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_must_be_positive_finite_seconds() {
        assert_eq!(parse_seconds("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("nan").is_err());
        assert!(parse_seconds("inf").is_err());
        assert!(parse_seconds("1s").is_err());
        assert!(parse_seconds("100000").is_err());
    }
}
