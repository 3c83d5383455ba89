//! Command-line arguments and dispatch.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::devices;
use crate::error::CliError;
use crate::planning::{self, AdmitQuestion};
use crate::profile::{self, ProfileOptions};
use crate::stats;
use crate::streams::{self, StreamParameters};
use crate::trace::{self, Grouping, TraceOptions};
use abiss_client::Client;
use abiss_proto::{AdmissionMode, ByteRate, ByteSize, DEFAULT_BATCH_PAGES, DEFAULT_BUFFER_BYTES};

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
    ///
    /// Managed disks are always traced. Other disks are measured only while some trace runs
    /// (abissd then traces every disk): from the moment this one starts, so its first report
    /// covers the requests that start after it did.
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
        /// Only requests of this stream (its pages belong to the stream's file, whoever
        /// submitted them).
        #[arg(long, short = 's')]
        stream: Option<u64>,
        /// Group by I/O priority (all requests) or by stream (only requests of streams).
        #[arg(long, value_enum, default_value_t = Grouping::Priority)]
        by: Grouping,
    },
    /// Attach FILE with a guaranteed byterate until `detach`; prints the stream id.
    Attach {
        /// The file (opened by abissctl as you, and handed to abissd).
        file: PathBuf,
        #[command(flatten)]
        stream: StreamArgs,
        /// Print the stream as JSON instead of its id.
        #[arg(long, short = 'j')]
        json: bool,
    },
    /// End a stream, named by its id or its file.
    Detach {
        /// Stream id, or the attached file.
        target: String,
    },
    /// Attach FILE for as long as a command runs: `abissctl run --rate 1MB/s FILE -- CMD ARGS…`.
    Run {
        /// The file.
        file: PathBuf,
        #[command(flatten)]
        stream: StreamArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The streams: file, rate, buffer, playout point, resident and locked bytes, credit,
    /// misses, prefetched bytes and readers.
    List {
        /// Print JSON.
        #[arg(long, short = 'j')]
        json: bool,
    },
    /// The managed devices: elevator, dispatch depth, capacity, reserved and free rate.
    Status {
        /// Print JSON.
        #[arg(long, short = 'j')]
        json: bool,
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
    /// Measure a disk with `O_DIRECT` reads (zone profile, access time by seek distance,
    /// rotation, request size, requests in flight) and fit the device model abissd admits
    /// streams by. Needs root. Reads only, unless --write.
    Profile(ProfileOptions),
    /// Capacity planning: how many streams of a rate fit on a managed disk at abissd's `p_req`,
    /// and the predicted miss probability of N of them. Attaches nothing.
    Admit {
        /// The managed disk: NAME, /dev/NAME or MAJOR:MINOR.
        #[arg(long, short = 'd')]
        device: String,
        /// Mean rate of each stream.
        #[arg(long, short = 'r')]
        rate: ByteRate,
        /// Standard deviation of each stream's rate over a window (variable bit rate).
        #[arg(long, short = 's')]
        stdev: Option<ByteRate>,
        /// Playout buffer of each stream.
        #[arg(long, short = 'b', default_value_t = ByteSize(DEFAULT_BUFFER_BYTES))]
        buffer: ByteSize,
        /// Pages loaded per credit step of each stream (its loads are whole batches).
        #[arg(long, default_value_t = DEFAULT_BATCH_PAGES, value_parser = clap::value_parser!(u32).range(1..))]
        batch: u32,
        /// Evaluate this many more streams.
        #[arg(long, short = 'n', value_parser = clap::value_parser!(u32).range(1..=10_000))]
        count: Option<u32>,
        /// Admission mode to answer for (abissd's own if not given).
        #[arg(long, short = 'm')]
        mode: Option<AdmissionMode>,
        /// Recording (written) streams instead of playback.
        #[arg(long)]
        write: bool,
        /// Print JSON.
        #[arg(long, short = 'j')]
        json: bool,
    },
}

/// How a file is streamed.
#[derive(Debug, clap::Args)]
struct StreamArgs {
    /// Guaranteed byterate: 1MiB/s, 1MB/s (= 1 000 000 B/s), or bytes per second.
    #[arg(long, short = 'r')]
    rate: ByteRate,
    /// Playout buffer: how much is kept loaded ahead of the reader.
    #[arg(long, short = 'b', default_value_t = ByteSize(DEFAULT_BUFFER_BYTES))]
    buffer: ByteSize,
    /// Pages loaded per credit step.
    #[arg(long, default_value_t = DEFAULT_BATCH_PAGES, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// ABISS priority level: 0 (highest, real time) to 7 (best effort).
    #[arg(long, short = 'p', default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=7))]
    priority: u8,
}

impl StreamArgs {
    fn parameters(&self) -> StreamParameters {
        StreamParameters {
            rate: self.rate,
            buffer: self.buffer,
            batch: self.batch,
            priority: self.priority,
        }
    }
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

/// Runs one command; returns the exit code to end with.
pub fn run(cli: Cli) -> Result<u8, CliError> {
    let connect = || Client::connect(&cli.socket).map_err(CliError::from);
    match cli.command {
        Command::Attach { file, stream, json } => {
            streams::attach(&mut connect()?, &file, &stream.parameters(), json)
        }
        Command::Detach { target } => streams::detach(&mut connect()?, &target),
        Command::Run {
            file,
            stream,
            command,
        } => {
            let code = streams::run(&mut connect()?, &file, &stream.parameters(), &command)?;
            return Ok(u8::try_from(code).unwrap_or(1));
        }
        Command::List { json } => streams::list(&mut connect()?, json),
        Command::Status { json } => streams::status(&mut connect()?, json),
        Command::Trace {
            device,
            queued,
            interval,
            count,
            json,
            events,
            stream,
            by,
        } => {
            let device = device.as_deref().map(devices::resolve).transpose()?;
            let options = TraceOptions {
                device,
                queued,
                interval,
                count,
                json,
                stream,
                by,
            };
            let mut client = connect()?;
            if events {
                trace::events(&mut client, &options)
            } else {
                trace::histograms(&mut client, &options)
            }
        }
        Command::Stats { interval, json } => stats::show(&mut connect()?, interval, json),
        Command::Profile(options) => profile::run(&options),
        Command::Admit {
            device,
            rate,
            stdev,
            buffer,
            batch,
            count,
            mode,
            write,
            json,
        } => planning::admit(
            &mut connect()?,
            AdmitQuestion {
                device,
                rate,
                stdev: stdev.unwrap_or_default(),
                buffer,
                batch,
                count,
                mode,
                write,
                json,
            },
        ),
    }
    .map(|()| 0)
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
