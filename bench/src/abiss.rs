//! The ABISS rows: abissd manages the lab disk and every real-time reader's file is attached as
//! a stream with the reader's rate and playout buffer.

use std::path::{Path, PathBuf};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use abiss_client::Client;
use abiss_proto::{
    AdmissionMode, AdmitRequest, AttachRequest, ByteRate, ByteSize, LatencyGroup, StreamId,
};
use anyhow::Context;

use crate::configuration::{
    self, Configuration, DaemonFigures, ReaderContext, ReaderSetup, RunContext, RunHook, RunSetup,
    StreamsPrediction,
};
use crate::daemon::{DaemonCommand, DaemonProcess};
use crate::schedule::StreamSpec;

/// Pages per credit step, as in the ABISS measurement (20-page batches).
pub const BATCH_PAGES: u32 = 20;

/// Runs abissd around a run and attaches each reader's file.
#[derive(Clone, Debug)]
pub struct AbissHook {
    /// Elevator abissd selects (mq-deadline or bfq).
    pub elevator: &'static str,
    /// ABISS level of the streams: 0 is real time; 6 is best effort at the default level, the
    /// slides' "prefetch without real-time priority".
    pub level: u8,
    /// More abissd arguments (e.g. `--admission off`).
    pub daemon_args: Vec<String>,
    /// How each stream's playout buffer is sized.
    pub buffer: StreamBuffer,
    /// abissd's state directory (its `models` holding the disk's model), instead of a fresh
    /// one without a model.
    pub state_dir: Option<std::path::PathBuf>,
}

/// How the ABISS rows size a stream's playout buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamBuffer {
    /// The reader's own buffer as a fixed size (`--buffer 564KiB`, the default before
    /// abissd sized buffers itself).
    Fixed,
    /// abissd sizes it (`--buffer auto`, abissctl's default for a reader).
    Auto,
    /// abissd sizes it on top of the reader's buffer as the application's own part
    /// (`--buffer auto+564KiB`).
    AutoOnReader,
}

impl StreamBuffer {
    /// The attach request's `buffer` and `buffer_auto` for a reader buffering `reader_bytes`.
    #[must_use]
    pub fn request(self, reader_bytes: u64) -> (ByteSize, bool) {
        match self {
            Self::Fixed => (ByteSize(reader_bytes), false),
            Self::Auto => (ByteSize(0), true),
            Self::AutoOnReader => (ByteSize(reader_bytes), true),
        }
    }
}

impl RunHook for AbissHook {
    fn name(&self) -> &'static str {
        "abiss"
    }

    fn start_run(&self, run: &RunContext<'_>) -> anyhow::Result<Box<dyn RunSetup>> {
        let bin_dir = run.bin_dir.context(
            "ABISS rows need ABISS_BIN_DIR (where abissd is); run them through `cargo xtask bench`",
        )?;
        // Capacity well above what any run asks: the benchmarks measure the guarantee, not
        // admission (the admission benchmark switches it off and predicts separately).
        let mut args = vec!["--elevator", self.elevator, "--capacity", "100MB/s"];
        if !self.daemon_args.iter().any(|a| a == "--realtime-share") {
            args.extend(["--realtime-share", "95"]);
        }
        args.extend(self.daemon_args.iter().map(String::as_str));
        let daemon = Daemon::start(bin_dir, run.device, &args, self.state_dir.as_deref())?;
        Ok(Box::new(AbissRun {
            daemon,
            device: run.device.to_string_lossy().into_owned(),
            stream: run.stream,
            predicted: Mutex::default(),
            level: self.level,
            buffer: self.buffer,
            buffers: Arc::default(),
            ended_streams: Arc::default(),
        }))
    }
}

/// An abissd of a benchmark, on its own socket; stopped (SIGTERM) on drop.
#[derive(Debug)]
pub struct Daemon {
    process: DaemonProcess,
    dir: PathBuf,
}

impl Daemon {
    /// Starts abissd from `bin_dir` managing `device` with `args`, with its state in
    /// `state_dir` (a fresh directory, removed on drop, if `None`); waits until it answers.
    pub fn start(
        bin_dir: &Path,
        device: &Path,
        args: &[&str],
        state_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        // On tmpfs, as abissd's default /run/abiss is on a systemd machine: each raise writes its record there, and
        // on the root disk (which holds the lab disk's image) that write waited up to 68 ms.
        let dir = Path::new("/dev/shm").join(format!("abiss-bench-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).context("cannot create the daemon's directory")?;
        let mut command = DaemonCommand::new(bin_dir, &dir)
            .args(["--device", &device.to_string_lossy()])
            .args(args);
        if let Some(state_dir) = state_dir {
            command = command.state_dir_at(state_dir);
        }
        let process = command.start()?;
        Ok(Self { process, dir })
    }

    /// A client connection.
    pub fn connect(&self) -> anyhow::Result<Client> {
        Client::connect(self.process.socket()).context("cannot connect to abissd")
    }

    /// Its control socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        self.process.socket()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.process.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug)]
struct AbissRun {
    daemon: Daemon,
    /// The device it manages.
    device: String,
    /// The run's streams.
    stream: StreamSpec,
    /// What it predicted for the streams when the readers started.
    predicted: Mutex<Option<StreamsPrediction>>,
    level: u8,
    buffer: StreamBuffer,
    /// Each stream's buffer as abissd had it when its reader ended (it may grow a buffer
    /// after the attach).
    buffers: Arc<Mutex<Vec<u64>>>,
    /// Requests and inversions of the streams whose readers ended (abissd folds an ended
    /// stream's figures into its disk's).
    ended_streams: Arc<Mutex<StreamCounts>>,
}

/// Block requests of streams, and those that ran below their stream's level.
#[derive(Clone, Copy, Debug, Default)]
struct StreamCounts {
    requests: u64,
    inversions: u64,
}

impl StreamCounts {
    /// The counts of the groups of `wanted` streams in `groups`.
    fn of(groups: &[LatencyGroup], wanted: impl Fn(StreamId) -> bool) -> Self {
        groups
            .iter()
            .filter(|g| g.stream.is_some_and(&wanted))
            .fold(Self::default(), |sum, g| Self {
                requests: sum.requests + g.requests,
                inversions: sum.inversions + g.inversions,
            })
    }
}

impl RunSetup for AbissRun {
    fn start_reader(&self, reader: &ReaderContext<'_>) -> anyhow::Result<Box<dyn ReaderSetup>> {
        let mut client = Client::connect(self.daemon.socket())?;
        let (buffer, buffer_auto) = self.buffer.request(reader.stream.buffer_bytes);
        let stream = client.attach(
            reader.file,
            AttachRequest {
                rate: ByteRate(reader.stream.rate_bps),
                buffer,
                batch_pages: BATCH_PAGES,
                priority: self.level,
                persistent: false,
                write: false,
                preallocate: false,
                direct: false,
                preroll: None,
                buffer_auto,
            },
        )?;
        // Like ABISS's start-up delay: the reader starts once its buffer is loaded.
        client.wait_loaded(stream.id, Duration::from_secs(30))?;
        Ok(Box::new(AbissReader {
            client,
            stream: stream.id,
            buffers: Arc::clone(&self.buffers),
            ended_streams: Arc::clone(&self.ended_streams),
        }))
    }

    fn readers_ready(&self) {
        let prediction = Client::connect(self.daemon.socket())
            .ok()
            .and_then(|mut client| {
                // Zero more streams: the prediction for those attached, as abissd sized them.
                let plan = client
                    .admit(AdmitRequest {
                        device: self.device.clone(),
                        rate: ByteRate(self.stream.rate_bps),
                        rate_stdev: ByteRate(0),
                        buffer: ByteSize(self.stream.buffer_bytes),
                        batch_pages: None,
                        count: Some(0),
                        mode: Some(AdmissionMode::Statistical),
                        write: false,
                    })
                    .ok()?;
                Some(StreamsPrediction {
                    miss_probability: plan.miss_probability?,
                    work_ms: plan.mean_work_ms?,
                })
            });
        if let Ok(mut predicted) = self.predicted.lock() {
            *predicted = prediction;
        }
    }

    fn daemon_figures(&self) -> Option<DaemonFigures> {
        let mut client = Client::connect(self.daemon.socket()).ok()?;
        let (_, groups) = client.latency().ok()?;
        let (_, raises) = client.status_and_raises().ok()?;
        let buffers = self.buffers.lock().map(|b| b.clone()).unwrap_or_default();
        let live = StreamCounts::of(&groups, |_| true);
        let ended = self.ended_streams.lock().map(|c| *c).unwrap_or_default();
        Some(DaemonFigures {
            stream_requests: live.requests + ended.requests,
            inversions: live.inversions + ended.inversions,
            raises: raises.total,
            raise_latency_p50_us: raises.latency_p50_us,
            raise_latency_p99_us: raises.latency_p99_us,
            buffer_bytes: buffers
                .iter()
                .min()
                .zip(buffers.iter().max())
                .map(|(min, max)| (*min, *max)),
            predicted: self.predicted.lock().ok().and_then(|p| *p),
        })
    }
}

/// An attached reader; its connection ends the stream when dropped.
#[derive(Debug)]
struct AbissReader {
    client: Client,
    stream: StreamId,
    buffers: Arc<Mutex<Vec<u64>>>,
    ended_streams: Arc<Mutex<StreamCounts>>,
}

impl Drop for AbissReader {
    fn drop(&mut self) {
        if let Ok((_, groups)) = self.client.latency() {
            let counts = StreamCounts::of(&groups, |stream| stream == self.stream);
            if let Ok(mut ended) = self.ended_streams.lock() {
                ended.requests += counts.requests;
                ended.inversions += counts.inversions;
            }
        }
        let buffer = self.client.list().ok().and_then(|streams| {
            streams
                .into_iter()
                .find(|s| s.id == self.stream)
                .map(|s| s.buffer.0)
        });
        if let (Some(buffer), Ok(mut buffers)) = (buffer, self.buffers.lock()) {
            buffers.push(buffer);
        }
    }
}

impl ReaderSetup for AbissReader {
    fn after_read(&mut self, offset: u64, len: u64) -> anyhow::Result<()> {
        // The slides' position message (outside the measured latency); the daemon also sees
        // the reads in the kernel.
        self.client.try_position(self.stream, offset + len)?;
        Ok(())
    }
}

/// The ABISS rows: abissd attaches every real-time reader's file as a stream.
#[must_use]
pub fn abiss_configurations() -> Vec<Configuration> {
    use StreamBuffer::{Auto, Fixed};
    let fixed = "fixed buffers of the reader's size (the default before abissd sized buffers)";
    vec![
        abiss_row(
            "abiss-mq-deadline",
            "ABISS over mq-deadline, real-time streams",
            ("mq-deadline", 0, Auto),
            &[],
        ),
        abiss_row(
            "abiss-mq-deadline-fixed",
            &format!("ABISS over mq-deadline, real-time streams, {fixed}"),
            ("mq-deadline", 0, Fixed),
            &[],
        ),
        abiss_row(
            "abiss-mq-deadline-depth-8",
            "ABISS over mq-deadline, real-time streams, at the dispatch depth abissd gave rotational disks until 2026-12-07 (abissd --dispatch-depth 8)",
            ("mq-deadline", 0, Auto),
            &["--dispatch-depth", "8"],
        )
        .on_request(),
        abiss_row(
            "abiss-mq-deadline-no-raises",
            "ABISS over mq-deadline, real-time streams, readers never raised (abissd --no-raises)",
            ("mq-deadline", 0, Auto),
            &["--no-raises"],
        ),
        abiss_row(
            "abiss-bfq",
            "ABISS over bfq, real-time streams",
            ("bfq", 0, Auto),
            &[],
        ),
        abiss_row(
            "abiss-bfq-fixed",
            &format!("ABISS over bfq, real-time streams, {fixed}"),
            ("bfq", 0, Fixed),
            &[],
        )
        .on_request(),
        abiss_row(
            "abiss-be",
            "ABISS at best-effort priority (level 6 = BE/4), over mq-deadline",
            ("mq-deadline", 6, Auto),
            &[],
        ),
        abiss_row(
            "abiss-be-fixed",
            &format!("ABISS at best-effort priority (level 6 = BE/4), over mq-deadline, {fixed}"),
            ("mq-deadline", 6, Fixed),
            &[],
        )
        .on_request(),
    ]
}

/// An ABISS row: abissd over `elevator`, the streams at ABISS `level` with buffers sized as
/// `buffer`, and `daemon_args` for abissd.
fn abiss_row(
    name: &str,
    description: &str,
    (elevator, level, buffer): (&'static str, u8, StreamBuffer),
    daemon_args: &[&str],
) -> Configuration {
    Configuration::new(name, description, elevator).with_hook(AbissHook {
        elevator,
        level,
        daemon_args: daemon_args.iter().map(|&a| a.to_owned()).collect(),
        buffer,
        state_dir: None,
    })
}

/// Every row the benchmarks know, in report order: the stock rows, then the ABISS rows.
/// `--rows` picks from these.
#[must_use]
pub fn all_configurations() -> Vec<Configuration> {
    let mut all = configuration::stock_configurations();
    all.extend(abiss_configurations());
    all
}

/// The configurations of the reference measurement and the sweep named in `--rows` (by
/// default all but those run on request), in report order, less those whose elevator this
/// kernel lacks.
pub fn select(rows: &crate::row::RowsArg) -> anyhow::Result<Vec<Configuration>> {
    rows.select_present(
        all_configurations(),
        |c| &c.name,
        |c| !c.on_request,
        |c| &c.elevator,
    )
}
