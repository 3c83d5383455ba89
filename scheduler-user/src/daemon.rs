//! The daemon's life: preflight, load, the main loop, a reload on SIGHUP, and a clean shutdown
//! on SIGINT/SIGTERM.
//!
//! The main loop is the only task that touches the controller (and so the maps, the streams
//! and the disks). Everything else reaches it over channels: connections send
//! [`Command`]s, the ring-buffer pumps send typed kernel events, the prefetch workers send
//! finished loads, and the credit timer wakes it when some stream's credit allows a load.

use std::path::PathBuf;
use std::time::Duration;

use abiss_model::ModelError;
use abiss_os::clock::monotonic_now;
use abiss_proto::AdmissionMode;
use log::{error, info, warn};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{broadcast, mpsc};

use crate::controller::commands::{handle, Watchers};
use crate::controller::Controller;
use crate::disk::device::{DeviceError, DeviceOptions};
use crate::disk::managed::{AdmissionSettings, Disks, TakeError};
use crate::kernel::capabilities::Feature;
use crate::kernel::events::{decode_fork, Fork, StreamAccess};
use crate::kernel::layout::{self, KernelSupport, LayoutError};
use crate::kernel::preflight;
use crate::kernel::ring_pump::{
    pump_ring, spawn_request_and_access_pumps, ACCESS_QUEUE, FORK_QUEUE,
};
use crate::kernel::tracer::{BlockTracer, LoaderBtf, TracerError};
use crate::policy::memory::LockedMemoryBudget;
use crate::raise::forks::RaisedForks;
use crate::raise::ReaderRaises;
use crate::serve::loop_clock::LoopClock;
use crate::serve::socket::{ControlSocket, SocketError};
use crate::serve::{serve_connection, Command, Context};
use crate::stream::prefetch::{LoadDone, PrefetchEngine};

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub(crate) struct DaemonConfig {
    /// Control socket path.
    pub(crate) socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    pub(crate) btf: PathBuf,
    /// Where device settings to restore are kept (survives a crash, not a reboot).
    pub(crate) state_dir: PathBuf,
    /// Where device models are kept (survives a reboot).
    pub(crate) model_dir: PathBuf,
    /// Devices to manage, as users name them.
    pub(crate) devices: Vec<String>,
    /// Elevator and dispatch depth of managed devices.
    pub(crate) device_options: DeviceOptions,
    /// Sustained capacity assumed for every managed device until it has a measured model, B/s.
    pub(crate) capacity_bps: u64,
    /// Share of the capacity real-time streams may reserve, percent.
    pub(crate) realtime_share_percent: u32,
    /// Whether readers that miss the page cache on an attached file are raised to the
    /// stream's priority.
    pub(crate) raises: bool,
    /// How long a raised reader may go without reading its file before it is put back.
    pub(crate) raise_idle: Duration,
    /// Admission mode for disks with a model.
    pub(crate) admission_mode: AdmissionMode,
    /// Allowed miss probability per service window, in (0, 1).
    pub(crate) p_req: f64,
    /// Optional parts switched off by the operator (`--disable`), whatever the kernel has.
    pub(crate) disabled: Vec<Feature>,
    /// What playout buffers may lock, in all and per user.
    pub(crate) locked_memory: LockedMemoryBudget,
    /// Where and to whom Prometheus metrics are served (`--metrics`), if anywhere.
    pub(crate) metrics: Option<crate::serve::metrics::MetricsSettings>,
}

/// Reads the configuration again (file and command line) for a reload; the error is one
/// sentence saying what is wrong.
pub(crate) type Reload = Box<dyn Fn() -> Result<DaemonConfig, String>>;

/// Why the daemon could not start or had to stop. Each kind has its own exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DaemonError {
    /// Not root and without the capabilities to load tracing programs.
    #[error(
        "abissd needs root (or CAP_BPF and CAP_PERFMON) to load its eBPF programs; run it as root"
    )]
    NotPrivileged,
    /// The kernel lacks what the programs need.
    #[error(transparent)]
    Kernel(#[from] LayoutError),
    /// The control socket could not be taken.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The programs could not be loaded or attached.
    #[error("{0}; abiss needs Linux 5.15 or newer with BTF tracepoints")]
    Tracer(#[from] TracerError),
    /// A device could not be managed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A disk's saved model is corrupt or describes another device.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The metrics address could not be taken.
    #[error(transparent)]
    Metrics(#[from] crate::serve::metrics::MetricsError),
    /// The state directory is missing and cannot be made, or others could write to it.
    #[error("cannot keep state in {path}: {source}")]
    StateDir {
        /// The `--state-dir`.
        path: PathBuf,
        /// Why, one sentence.
        #[source]
        source: std::io::Error,
    },
    /// Anything else.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl DaemonError {
    /// The process exit code for this error (documented in docs/operator-guide.md).
    #[must_use]
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Io(_) => 1,
            Self::NotPrivileged => 10,
            Self::Kernel(_) => 11,
            Self::Socket(SocketError::AlreadyRunning { .. }) => 12,
            Self::Socket(SocketError::NotASocket { .. }) => 13,
            Self::Socket(SocketError::Io { .. }) => 14,
            Self::Tracer(_) => 15,
            Self::Device(_) => 16,
            Self::Model(_) => 17,
            Self::Metrics(_) => 19,
            Self::StateDir { .. } => 20,
        }
    }
}

impl From<TakeError> for DaemonError {
    fn from(error: TakeError) -> Self {
        match error {
            TakeError::Device(error) => Self::Device(error),
            TakeError::Model(error) => Self::Model(error),
        }
    }
}

fn admission_settings(config: &DaemonConfig) -> AdmissionSettings {
    AdmissionSettings {
        mode: config.admission_mode,
        p_req: config.p_req,
        share_percent: config.realtime_share_percent,
        capacity_bps: config.capacity_bps,
        state_dir: config.state_dir.clone(),
        model_dir: config.model_dir.clone(),
    }
}

/// The kernel's layout, and the optional parts that are off: those the kernel lacks, then
/// those the operator switched off.
fn switched_off(
    support: KernelSupport,
    disabled: &[Feature],
) -> (scheduler_common::KernelLayout, Vec<(Feature, String)>) {
    let KernelSupport {
        mut layout,
        mut missing,
    } = support;
    for feature in disabled {
        if !missing.iter().any(|(f, _)| f == feature) {
            missing.push((*feature, format!("switched off (--disable {feature})")));
        }
    }
    if missing.iter().any(|(f, _)| *f == Feature::DirectIoTagging) {
        // The block programs follow a bio to its file only while this address is known.
        layout.iomap_dio_end_io = 0;
    }
    (layout, missing)
}

/// What the main loop listens to, besides the controller it drives.
struct Inputs {
    socket: ControlSocket,
    context: Context,
    commands: mpsc::Receiver<Command>,
    loads: mpsc::UnboundedReceiver<LoadDone>,
    accesses: mpsc::Receiver<StreamAccess>,
    forks: mpsc::Receiver<Fork>,
    pumps: [tokio::task::JoinHandle<()>; 3],
    sigint: Signal,
    sigterm: Signal,
    sighup: Signal,
}

/// Runs the daemon until SIGINT or SIGTERM; on SIGHUP it applies what `reload` reads. Must
/// be called inside a tokio runtime.
pub(crate) async fn run(config: DaemonConfig, reload: Reload) -> Result<(), DaemonError> {
    let (mut controller, inputs) = start(&config)?;
    // Once started: a start that fails says one sentence, its error.
    warn_unless_in_memory(&config.state_dir);
    let parts: Vec<String> = controller
        .tracer()
        .capabilities()
        .iter()
        .map(|c| format!("{} {}", c.name, if c.on { "on" } else { "off" }))
        .collect();
    info!(
        "abissd {} listening on {}; {}",
        env!("CARGO_PKG_VERSION"),
        config.socket.display(),
        parts.join(", ")
    );
    crate::systemd::ready(&format!("managing {} disks", config.devices.len()));
    serve(controller, inputs, config, &reload).await;
    Ok(())
}

/// Applies a new configuration: the admission settings and models of the managed disks take
/// effect at once; what needs the programs or the disks taken again is reported, not applied.
fn reconfigure(controller: &mut Controller, running: &mut DaemonConfig, new: DaemonConfig) {
    let restart_needed: Vec<&str> = [
        ("--socket", running.socket != new.socket),
        ("--btf", running.btf != new.btf),
        ("--state-dir", running.state_dir != new.state_dir),
        ("--device", running.devices != new.devices),
        (
            "--elevator/--dispatch-depth",
            running.device_options != new.device_options,
        ),
        ("--disable", running.disabled != new.disabled),
        (
            "--metrics/--metrics-remote/--metrics-token-file",
            running.metrics != new.metrics,
        ),
        (
            "--locked-memory/--user-locked-memory",
            running.locked_memory != new.locked_memory,
        ),
        (
            "--no-raises/--raise-idle",
            running.raises != new.raises || running.raise_idle != new.raise_idle,
        ),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect();
    if !restart_needed.is_empty() {
        warn!(
            "reload: {} changed, which takes effect only when abissd restarts",
            restart_needed.join(", ")
        );
    }
    let settings = admission_settings(&new);
    controller.disks().reconfigure(settings);
    info!(
        "reloaded: {} admission, p_req {}, real-time share {}%, capacity {} B/s, models from {}",
        new.admission_mode,
        new.p_req,
        new.realtime_share_percent,
        new.capacity_bps,
        new.model_dir.display()
    );
    running.admission_mode = new.admission_mode;
    running.p_req = new.p_req;
    running.realtime_share_percent = new.realtime_share_percent;
    running.capacity_bps = new.capacity_bps;
    running.model_dir = new.model_dir;
}

/// Checks privileges and the kernel, takes the socket and the disks, loads the programs and
/// starts the ring-buffer pumps. On an error, whatever was taken is given back as it drops.
fn start(config: &DaemonConfig) -> Result<(Controller, Inputs), DaemonError> {
    let caps = preflight::effective_capabilities()?;
    if !preflight::can_trace(caps) {
        return Err(DaemonError::NotPrivileged);
    }
    let loader_btf = LoaderBtf::parse_aside(&config.btf);
    let support = layout::resolve(&config.btf)?;
    let (layout, off) = switched_off(support, &config.disabled);
    let metrics = (config.metrics.as_ref())
        .map(crate::serve::metrics::MetricsListener::bind)
        .transpose()?;
    let socket = ControlSocket::bind(&config.socket)?;
    // Everything in the state directory is restored as root: it must be root's alone.
    abiss_os::fs::ensure_private_dir(&config.state_dir).map_err(|source| {
        DaemonError::StateDir {
            path: config.state_dir.clone(),
            source,
        }
    })?;
    // Before the disks: a disk that cannot be taken (exit 16, 17) must not leave the readers
    // a crashed daemon raised at real-time priority.
    crate::raise::restore_leftovers(&config.state_dir);
    let disks = Disks::take(
        &config.devices,
        config.device_options,
        admission_settings(config),
    )?;
    let mut tracer = BlockTracer::load(&layout, loader_btf, &off)?;
    tracer.set_managed_disks(&disks.numbers())?;
    let event_ring = tracer.take_event_ring()?;
    let playout_ring = tracer.take_playout_ring()?;
    let (raises, forks, fork_pump) = reader_raises(config, &mut tracer)?;

    let (command_tx, commands) = mpsc::channel(256);
    if let Some(listener) = metrics {
        let ids = tracer.program_ids().to_vec();
        tokio::spawn(crate::serve::metrics::serve(
            listener,
            command_tx.clone(),
            ids,
        ));
    }
    let (events, _) = broadcast::channel(8192);
    let (load_tx, loads) = mpsc::unbounded_channel();
    let (access_tx, accesses) = mpsc::channel(ACCESS_QUEUE);
    let context = Context::new(
        command_tx,
        events.clone(),
        tracer.program_ids().to_vec(),
        layout::kernel_release(),
    );
    let memory = config.locked_memory;
    let controller = Controller::new(tracer, PrefetchEngine::new(load_tx), disks, raises, memory);
    let [requests, accesses_pump] =
        spawn_request_and_access_pumps(event_ring, playout_ring, events, access_tx);
    let pumps = [requests, accesses_pump, fork_pump];
    let inputs = Inputs {
        socket,
        context,
        commands,
        loads,
        accesses,
        forks,
        pumps,
        sigint: signal(SignalKind::interrupt())?,
        sigterm: signal(SignalKind::terminate())?,
        sighup: signal(SignalKind::hangup())?,
    };
    Ok((controller, inputs))
}

/// Says so if the state directory is not on tmpfs: a raise writes its record there before the
/// next event is handled, and on a disk's file system that waits for the journal (up to 68 ms
/// measured on ext4 under load).
fn warn_unless_in_memory(state_dir: &std::path::Path) {
    if let Ok(false) = abiss_os::fs::is_in_memory(state_dir) {
        warn!(
            "the state directory {} is not on tmpfs: raising a reader writes a record there and waits for that disk's journal; use a tmpfs such as /run/abiss",
            state_dir.display()
        );
    }
}

/// The reader raises, with the tasks raised threads make followed: their reports, and the
/// pump that brings them.
fn reader_raises(
    config: &DaemonConfig,
    tracer: &mut BlockTracer,
) -> Result<
    (
        ReaderRaises,
        mpsc::Receiver<Fork>,
        tokio::task::JoinHandle<()>,
    ),
    DaemonError,
> {
    let maps = tracer.take_raise_maps()?;
    let ring = maps.forks;
    let followed = RaisedForks::new(maps.raised, maps.counts, maps.contexts, maps.lost);
    let (fork_tx, forks) = mpsc::channel(FORK_QUEUE);
    let unqueued = followed.unqueued();
    let pump = tokio::spawn(pump_ring(ring, move |bytes| {
        if let Some(fork) = decode_fork(bytes) {
            if let Err(mpsc::error::TrySendError::Full(_)) = fork_tx.try_send(fork) {
                unqueued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }));
    let raises = ReaderRaises::new(
        &config.state_dir,
        u64::try_from(config.raise_idle.as_nanos()).unwrap_or(u64::MAX),
        config.raises,
        followed,
    );
    Ok((raises, forks, pump))
}

/// The main loop, then shutdown.
async fn serve(
    mut controller: Controller,
    mut inputs: Inputs,
    mut config: DaemonConfig,
    reload: &Reload,
) {
    let mut watchers = Watchers::default();
    let mut clock = LoopClock::default();
    let mut sweep = tokio::time::interval(Duration::from_secs(10));
    // The credit timer wakes the loop only when some window lacks pages its credit will soon
    // cover; a stream whose window is full costs no wakeups at all.
    let idle = Duration::from_secs(3600);
    let mut timer_set_for = tokio::time::Instant::now() + idle;
    let credit_timer = tokio::time::sleep_until(timer_set_for);
    tokio::pin!(credit_timer);
    loop {
        let woke = tokio::select! {
            accepted = inputs.socket.listener().accept() => Woke::Accepted(accepted),
            Some(command) = inputs.commands.recv() => Woke::Command(command),
            Some(done) = inputs.loads.recv() => Woke::Loaded(done),
            Some(access) = inputs.accesses.recv() => Woke::Access(access),
            Some(fork) = inputs.forks.recv() => Woke::Fork(fork),
            () = &mut credit_timer => Woke::CreditTimer,
            _ = sweep.tick() => Woke::Sweep,
            _ = inputs.sigint.recv() => break,
            _ = inputs.sigterm.recv() => break,
            _ = inputs.sighup.recv() => Woke::Reload,
        };
        let turn = std::time::Instant::now();
        match woke {
            Woke::Accepted(Ok((stream, _))) => {
                tokio::spawn(serve_connection(stream, inputs.context.clone()));
            }
            Woke::Accepted(Err(error)) => warn!("accept failed: {error}"),
            Woke::Command(command) => handle(&mut controller, command, &mut watchers, &clock),
            Woke::Loaded(done) => controller.loaded(done),
            Woke::Access(access) => {
                let now = monotonic_now();
                clock.access_handled(access.at, now);
                controller.on_access(access, now);
            }
            Woke::Fork(fork) => controller.on_fork(&fork),
            Woke::CreditTimer => {
                clock.timer_fired(timer_set_for.into_std(), turn);
                controller.tick(monotonic_now());
            }
            Woke::Sweep => match controller.tracer().sweep_stale(monotonic_now()) {
                Ok(0) => {}
                Ok(dropped) => info!("dropped {dropped} idle request records"),
                Err(error) => warn!("cannot sweep request records: {error}"),
            },
            Woke::Reload => {
                crate::systemd::reloading();
                match reload() {
                    Ok(new) => reconfigure(&mut controller, &mut config, new),
                    Err(reason) => error!("reload refused, the configuration stays: {reason}"),
                }
                crate::systemd::ready("reloaded");
            }
        }
        // At least a millisecond, so a timer just short of a page's worth of credit does not spin.
        let wait = controller
            .next_wakeup_ns(monotonic_now())
            .map_or(idle, |ns| {
                Duration::from_nanos(ns).max(Duration::from_millis(1))
            });
        timer_set_for = tokio::time::Instant::now() + wait;
        credit_timer.as_mut().reset(timer_set_for);
        clock.turn(turn.elapsed());
    }
    info!("shutting down: ending streams, restoring devices, detaching programs");
    crate::systemd::stopping();
    for pump in &inputs.pumps {
        pump.abort();
    }
    controller.shutdown();
    drop(inputs);
}

/// What woke the main loop.
enum Woke {
    Accepted(std::io::Result<(tokio::net::UnixStream, tokio::net::unix::SocketAddr)>),
    Command(Command),
    Loaded(LoadDone),
    Access(StreamAccess),
    Fork(Fork),
    CreditTimer,
    Sweep,
    Reload,
}
