//! Command-line arguments and dispatch.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::doctor;
use crate::error::CliError;
use crate::interval::parse_seconds;
use crate::planning::{self, AdmitQuestion};
use crate::profile::{self, ProfileOptions};
use crate::stats;
use crate::status;
use crate::streams::{self, StreamParameters};
use crate::top;
use crate::trace::TraceArgs;
use abiss_client::Client;
use abiss_proto::{AdmissionMode, ByteRate, ByteSize, DEFAULT_BATCH_PAGES, DEFAULT_BUFFER_BYTES};
use abiss_units::{Quantity, Written};

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
    ///
    /// `trace 1 10` reports every second, ten times, as bcc's tools do; `-T` prints the time
    /// with each report.
    Trace(TraceArgs),
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
    /// Give a stream another rate (fast-forward, slow motion), if its disk admits it; its
    /// buffer and window stay. Refused, the stream keeps its rate.
    SetRate {
        /// Stream id, or the attached file.
        target: String,
        /// The new rate (units as for attach --rate).
        rate: Written<ByteRate>,
    },
    /// Attach FILE for as long as a command runs: `abissctl run --rate 1MB/s FILE -- CMD ARGS…`.
    ///
    /// SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on to the command; exits
    /// with the command's code, or 128 + N if signal N killed it.
    Run {
        /// The file.
        file: PathBuf,
        #[command(flatten)]
        stream: StreamArgs,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Record standard input into FILE at a guaranteed rate, past the page cache:
    /// `ffmpeg … -f mpegts - | abissctl record rec.ts --rate 8Mbit/s`.
    ///
    /// FILE is created (or emptied once abissd admits the stream) and written with `O_DIRECT`,
    /// in aligned pieces, from a ring of --buffer of locked memory in this
    /// process, by a thread abissd raises to the stream's level. A recorder faster than the
    /// rate fills the ring: the pipe then waits (counted as an overflow, never dropped). At the
    /// end of input the tail is written and FILE truncated to exactly what was read. If
    /// abissd stops, the recording goes on at best effort. A pipe or FIFO on standard input is
    /// grown to 1 MiB, so that a recorder's large writes fit whole. A file system without
    /// direct I/O (tmpfs) exits with 17, a full one with 18.
    Record {
        /// The file to record into.
        file: PathBuf,
        /// Guaranteed byterate (units as for attach --rate).
        #[arg(long, short = 'r')]
        rate: Written<ByteRate>,
        /// The ring of locked memory the input waits in before it is written: how far the
        /// disk may fall behind the recorder. By default 2 s of the rate and at least 2 MiB
        /// (a write on a busy disk can wait over a second for the file system's metadata).
        #[arg(long, short = 'b')]
        buffer: Option<Written<ByteSize>>,
        /// ABISS priority level: 0 (highest, real time) to 7 (best effort).
        #[arg(long, short = 'p', default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=7))]
        priority: u8,
        /// Have abissd allocate the file a few seconds of the rate ahead of the writes (at most
        /// 64 MiB, within your quota), so that a write finds its blocks allocated; what is left
        /// past the end is given back when the recording ends.
        #[arg(long)]
        preallocate: bool,
        /// Print what it did as JSON on standard output at the end.
        #[arg(long, short = 'j')]
        json: bool,
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
    /// A live view of the streams and the managed disks, refreshed every interval; `q` quits.
    ///
    /// Per stream: rate, buffer, loaded window, resident bytes, credit, misses, raised readers
    /// and readers. Per managed disk: reserved and free rate, and the service time (p50, p99)
    /// of its real-time and best-effort requests completed in the last interval. `q`, Esc or
    /// Ctrl-C quits. Needs a terminal; nothing shown depends on colour.
    Top {
        /// Seconds between refreshes.
        #[arg(long, short = 'i', default_value = "1", value_parser = parse_seconds, allow_negative_numbers = true)]
        interval: Duration,
        /// No colours (also when `NO_COLOR` is set); nothing shown depends on colour.
        #[arg(long)]
        no_color: bool,
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
    /// What this machine allows abiss, and whether abiss can serve PATH: one line per finding.
    ///
    /// The kernel: BTF, the block programs' fields, each optional part (with what a running
    /// abissd made of it: `off` is switched off there, e.g. `abissd --disable`), `io_uring`,
    /// I/O priorities, the cgroup memory and io controllers, device mapper and md, and the
    /// elevators each disk offers. Then whether abissd answers (on --socket), the disks it
    /// manages, and its locked-memory room. With PATH: its file system, the block devices
    /// under it down to the physical disks (partitions, dm-crypt, LVM, md, loop, the members
    /// of a btrfs), whether abissd manages the disk it would serve PATH from, that disk's
    /// model and admission, and the rate admission would give a stream now.
    ///
    /// Runs as any user (as root it can also tell whether the kernel has direct-io-tagging,
    /// which needs /proc/kallsyms' addresses); reads no debugfs and mounts nothing.
    ///
    /// Exit codes: 0 when PATH can be served now (or without PATH); 16 when PATH cannot be
    /// served now (not on a block device, on btrfs, on a disk abissd does not manage, abissd
    /// not running, the disk full, or not readable to you); 11 when PATH cannot be examined.
    Doctor {
        /// A file (or a directory of files) to check.
        path: Option<PathBuf>,
        /// Print JSON: the findings, PATH's file system, stack and disk, and the exit code.
        #[arg(long, short = 'j')]
        json: bool,
    },
    /// Capacity planning: how many streams of a rate fit on a managed disk at abissd's `p_req`,
    /// and the predicted miss probability of N of them. Attaches nothing.
    Admit {
        /// The managed disk, or a device over several (an md or device-mapper array, whose
        /// fullest disk answers): NAME, /dev/NAME or MAJOR:MINOR.
        #[arg(long, short = 'd')]
        device: String,
        /// Mean rate of each stream (units as for attach --rate).
        #[arg(long, short = 'r')]
        rate: Written<ByteRate>,
        /// Standard deviation of each stream's rate over a window (variable bit rate).
        #[arg(long, short = 's')]
        stdev: Option<Written<ByteRate>>,
        /// Playout buffer of each stream.
        #[arg(long, short = 'b', default_value_t = Written::from(ByteSize(DEFAULT_BUFFER_BYTES)))]
        buffer: Written<ByteSize>,
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
    /// Guaranteed byterate: 1MiB/s (= 1 048 576 B/s, as 1M/s), 1MB/s (= 1 000 000 B/s),
    /// 8Mbit/s (= 1 000 000 B/s), or bytes per second; a fraction (1.1MiB/s) is rounded up to
    /// whole bytes.
    #[arg(long, short = 'r')]
    rate: Written<ByteRate>,
    /// Playout buffer: how much is kept loaded ahead of the reader, `auto` or a size (564KiB;
    /// 64k is 64 KiB). Without --buffer a reader's is `auto` and a recording's 564KiB (a
    /// recording takes a size only). With `auto`, abissd sizes it from the latency its disk
    /// shows at the stream's priority and grows it with that latency, and on a disk with a
    /// model makes your automatic buffers there as large as the disk's admission needs to take
    /// the stream, within the locked-memory budgets; `auto+256KiB` adds your own part (what
    /// your player buffers itself).
    #[arg(long, short = 'b')]
    buffer: Option<BufferArg>,
    /// Pages loaded per credit step.
    #[arg(long, default_value_t = DEFAULT_BATCH_PAGES, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// ABISS priority level: 0 (highest, real time) to 7 (best effort).
    #[arg(long, short = 'p', default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=7))]
    priority: u8,
    /// Record: FILE is opened for writing (created if missing, never truncated), and abissd
    /// writes what is written back to the disk at the stream's priority, at most --buffer
    /// behind the writer, and allocates the file a few seconds of the rate ahead.
    #[arg(long, short = 'w')]
    write: bool,
    /// With --write: allocate the file a few seconds of the rate ahead of the writer (at most
    /// 64 MiB), so the recording is laid out in large extents. On ext4 this delays writes
    /// while the journal is busy; see docs/user-guide.md, "Recordings".
    #[arg(long, requires = "write")]
    preallocate: bool,
    /// Load this much of the file's head at once when the stream starts, beyond --buffer (a
    /// player's start-up probe: ffmpeg reads about 5 MB), locked until the reader passes it,
    /// and with it the file's last 512 KiB, which players read to find the duration. It comes
    /// out of your start-up allowance and counts against your locked memory. After a seek,
    /// the head from the new point is loaded again once the reader reads on from there. With
    /// `run`, the command starts at once instead of after the first window: it waits for the
    /// pages it probes as they load.
    #[arg(long, conflicts_with = "write")]
    preroll: Option<Written<ByteSize>>,
}

/// `--buffer`: a size, or `auto` with an optional application part (`auto+256KiB`).
#[derive(Clone, Debug)]
enum BufferArg {
    /// A fixed buffer.
    Size(Written<ByteSize>),
    /// Sized by abissd, on top of the application's own part.
    Auto(Option<Written<ByteSize>>),
}

impl std::str::FromStr for BufferArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        let Some(rest) = trimmed
            .get(..4)
            .filter(|head| head.eq_ignore_ascii_case("auto"))
            .map(|_| trimmed[4..].trim())
        else {
            return trimmed
                .parse()
                .map(Self::Size)
                .map_err(|error| format!("{error}; or give auto"));
        };
        if rest.is_empty() {
            return Ok(Self::Auto(None));
        }
        let Some(app) = rest.strip_prefix('+') else {
            return Err(format!(
                "'{trimmed}' is not auto, auto+SIZE or a size such as 564KiB"
            ));
        };
        app.trim()
            .parse()
            .map(|size| Self::Auto(Some(size)))
            .map_err(|error| format!("{error} (after auto+)"))
    }
}

impl StreamArgs {
    fn parameters(&self) -> StreamParameters {
        let (buffer, buffer_auto) = match &self.buffer {
            Some(BufferArg::Size(size)) => (rounded(size), false),
            Some(BufferArg::Auto(app)) => (app.as_ref().map_or(ByteSize(0), rounded), true),
            // abissd sizes a reader's buffer unless told a size; a recording's is a size (it
            // bounds the dirty memory, and the latency tail of reads says nothing of that).
            None if self.write => (ByteSize(DEFAULT_BUFFER_BYTES), false),
            None => (ByteSize(0), true),
        };
        StreamParameters {
            rate: rounded(&self.rate),
            buffer,
            buffer_auto,
            batch: self.batch,
            priority: self.priority,
            write: self.write,
            preallocate: self.preallocate,
            preroll: self.preroll.as_ref().map(rounded),
        }
    }
}

/// The value of a size or a rate from the command line; one with a fraction of a byte is
/// rounded up, and that is said once on stderr.
fn rounded<T: Quantity>(written: &Written<T>) -> T {
    if let Some(note) = written.rounding_note() {
        eprintln!("abissctl: {note}");
    }
    written.value()
}

/// Runs one command; returns the exit code to end with.
pub fn run(cli: Cli) -> Result<u8, CliError> {
    let connect = || Client::connect(&cli.socket).map_err(CliError::from);
    match cli.command {
        Command::Attach { file, stream, json } => {
            let parameters = stream.parameters();
            streams::attach(&mut connect()?, &file, &parameters, json)
        }
        Command::Detach { target } => streams::detach(&mut connect()?, &target),
        Command::SetRate { target, rate } => {
            streams::set_rate(&mut connect()?, &target, rounded(&rate))
        }
        Command::Run {
            file,
            stream,
            command,
        } => {
            let parameters = stream.parameters();
            let code = streams::run(&mut connect()?, &file, &parameters, &command)?;
            return Ok(u8::try_from(code).unwrap_or(1));
        }
        Command::Record {
            file,
            rate,
            buffer,
            priority,
            preallocate,
            json,
        } => crate::record::record(
            &cli.socket,
            &file,
            {
                let rate = rounded(&rate);
                let ring = buffer
                    .as_ref()
                    .map_or_else(|| crate::record::default_ring(rate), rounded);
                (rate, ring, priority)
            },
            (preallocate, json),
        ),
        Command::List { json } => streams::list(&mut connect()?, json),
        Command::Status { json } => status::status(&mut connect()?, json),
        Command::Top { interval, no_color } => top::run(interval, no_color, connect),
        Command::Trace(args) => {
            let options = args.options()?;
            args.run(&mut connect()?, &options)
        }
        Command::Stats { interval, json } => stats::show(&mut connect()?, interval, json),
        Command::Profile(options) => profile::run(&options),
        Command::Doctor { path, json } => return doctor::run(&cli.socket, path.as_ref(), json),
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
        } => {
            let question = AdmitQuestion {
                device,
                rate: rounded(&rate),
                stdev: stdev.as_ref().map(rounded).unwrap_or_default(),
                buffer: rounded(&buffer),
                batch,
                count,
                mode,
                write,
                json,
            };
            planning::admit(&mut connect()?, &question)
        }
    }
    .map(|()| 0)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// The long help of `abissctl SUBCOMMAND`.
    fn help(subcommand: &str) -> String {
        Cli::command()
            .find_subcommand_mut(subcommand)
            .expect("a subcommand")
            .render_long_help()
            .to_string()
    }

    #[test]
    fn the_buffer_help_names_the_defaults_the_code_applies() {
        let recording = ByteSize(DEFAULT_BUFFER_BYTES).readable();
        for subcommand in ["attach", "run"] {
            let text = help(subcommand);
            let buffer = &text[text.find("--buffer").expect("--buffer")..];
            let buffer = &buffer[..buffer.find("--batch").expect("--batch after it")];
            assert!(
                buffer.contains(&format!(
                    "a reader's is `auto` and a recording's {recording}"
                )),
                "{buffer}"
            );
            assert!(!buffer.contains("[default"), "no single default: {buffer}");
        }
        let admit = help("admit");
        assert!(
            admit.contains(&format!("[default: {recording}]")),
            "{admit}"
        );
        let parameters = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).expect("parses");
            match cli.command {
                Command::Attach { stream, .. } => stream.parameters(),
                _ => unreachable!(),
            }
        };
        let reader = parameters(&["abissctl", "attach", "-r", "1MB/s", "f"]);
        assert!(reader.buffer_auto);
        let writer = parameters(&["abissctl", "attach", "-r", "1MB/s", "-w", "f"]);
        assert_eq!(
            (writer.buffer_auto, writer.buffer.readable()),
            (false, recording)
        );
    }
}
