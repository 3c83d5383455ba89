//! The daemon's life: preflight, load, serve, and a clean shutdown on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abiss_proto::{
    decode_line, device_model::ModelError, encode_line, AdmissionMode, AdmissionReport,
    AdmitRequest, AttachRequest, DeviceStatus, Envelope, ErrorKind, LatencyGroup, Request,
    RequestRecord, Response, StreamInfo, StreamTarget, UpgradeReport, PROTOCOL_VERSION,
};
use aya::maps::{MapData, RingBuf};
use log::{info, warn};
use scheduler_common::PlayoutEvent;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::connection::FramedSocket;
use crate::controller::{AdmissionSettings, Controller, ManagedDisk, Refusal};
use crate::device::{self, DeviceConfig, DeviceError, ManagedDevice, RecoveryOutcome};
use crate::kernel_layout::{self, LayoutError};
use crate::prefetch::{LoadDone, PrefetchEngine};
use crate::preflight;
use crate::socket::{ControlSocket, SocketError};
use crate::stats;
use crate::tracer::{decode_event, decode_playout, BlockTracer, TracerError};
use crate::upgrades::ReaderUpgrades;

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Control socket path.
    pub socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    pub btf: PathBuf,
    /// Where device settings to restore are kept (survives a crash, not a reboot).
    pub state_dir: PathBuf,
    /// Devices to manage, as users name them.
    pub devices: Vec<String>,
    /// Elevator and dispatch depth of managed devices.
    pub device_config: DeviceConfig,
    /// Sustained capacity assumed for every managed device until it has a measured model, B/s.
    pub capacity_bps: u64,
    /// Share of the capacity real-time streams may reserve, percent.
    pub realtime_share_percent: u32,
    /// Whether readers that miss the page cache on an attached file are raised to the
    /// stream's priority.
    pub upgrades: bool,
    /// How long a raised reader may go without reading its file before it is put back.
    pub upgrade_idle: Duration,
    /// Admission mode for disks with a model.
    pub admission_mode: AdmissionMode,
    /// Allowed miss probability per service window, in (0, 1).
    pub p_req: f64,
}

/// Why the daemon could not start or had to stop. Each kind has its own exit code.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
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
    #[error("{0}; abiss needs Linux 6.1 or newer with BTF tracepoints")]
    Tracer(#[from] TracerError),
    /// A device could not be managed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A disk's saved model is corrupt or describes another device.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Anything else.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl DaemonError {
    /// The process exit code for this error (documented in the README).
    #[must_use]
    pub fn exit_code(&self) -> u8 {
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
        }
    }
}

type Reply<T> = oneshot::Sender<T>;

/// What connections ask of the main loop, the only place that touches maps and streams.
enum Command {
    Latency(Reply<Result<Vec<LatencyGroup>, String>>),
    RequestRecords(Reply<(u64, u64)>),
    /// A client started (+1) or stopped (-1) streaming events.
    EventSubscribers(i32),
    Attach {
        uid: u32,
        connection: u64,
        fd: std::os::fd::OwnedFd,
        request: AttachRequest,
        reply: Reply<Result<StreamInfo, Refusal>>,
    },
    Detach {
        uid: u32,
        target: StreamTarget,
        reply: Reply<Result<u64, Refusal>>,
    },
    Position {
        uid: u32,
        stream: u64,
        offset: u64,
        at_ns: Option<u64>,
    },
    List {
        uid: u32,
        reply: Reply<Vec<StreamInfo>>,
    },
    Status(Reply<(Vec<DeviceStatus>, UpgradeReport)>),
    Admit {
        request: AdmitRequest,
        reply: Reply<Result<AdmissionReport, Refusal>>,
    },
    ConnectionClosed(u64),
}

/// Shared, read-only context of every connection.
#[derive(Clone)]
struct Context {
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<RequestRecord>,
    program_ids: Arc<Vec<(String, u32)>>,
    kernel: String,
    connections: Arc<AtomicU64>,
}

/// Takes every configured device, restoring first what a crashed daemon left behind.
fn take_devices(config: &DaemonConfig) -> Result<Vec<ManagedDisk>, DaemonError> {
    for outcome in device::recover(&config.state_dir)? {
        match outcome {
            RecoveryOutcome::Restored { disk } => {
                info!("restored {disk}, left managed by a daemon that did not exit cleanly");
            }
            other => warn!("device state from an earlier daemon: {other:?}"),
        }
    }
    let mut disks = Vec::new();
    for spec in &config.devices {
        let device = ManagedDevice::take(spec, &config.device_config, &config.state_dir)?;
        let managed = ManagedDisk::new(device, &admission_settings(config))?;
        let device = &managed.device;
        info!(
            "managing {} with {} at dispatch depth {}",
            device.disk(),
            config.device_config.elevator,
            config.device_config.dispatch_depth
        );
        disks.push(managed);
    }
    Ok(disks)
}

fn admission_settings(config: &DaemonConfig) -> AdmissionSettings {
    AdmissionSettings {
        mode: config.admission_mode,
        p_req: config.p_req,
        share_percent: config.realtime_share_percent,
        capacity_bps: config.capacity_bps,
        state_dir: config.state_dir.clone(),
    }
}

/// Runs the daemon until SIGINT or SIGTERM. Must be called inside a tokio runtime.
pub async fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    let caps = preflight::effective_capabilities()?;
    if !preflight::can_trace(caps) {
        return Err(DaemonError::NotPrivileged);
    }
    let layout = kernel_layout::resolve(&config.btf)?;
    let socket = ControlSocket::bind(&config.socket)?;
    let disks = take_devices(&config)?;
    crate::upgrades::restore_leftovers(&config.state_dir);
    let mut tracer = BlockTracer::load(&layout, &config.btf)?;
    let event_ring = tracer.take_event_ring()?;
    let playout_ring = tracer.take_playout_ring()?;

    let (commands, mut command_rx) = mpsc::channel(256);
    let (events, _) = broadcast::channel(8192);
    let (loads, mut load_rx) = mpsc::unbounded_channel::<LoadDone>();
    let (playout, mut playout_rx) = mpsc::unbounded_channel::<PlayoutEvent>();
    let context = Context {
        commands,
        events: events.clone(),
        program_ids: Arc::new(tracer.program_ids().to_vec()),
        kernel: kernel_layout::kernel_release(),
        connections: Arc::new(AtomicU64::new(0)),
    };
    let upgrades = ReaderUpgrades::new(
        &config.state_dir,
        u64::try_from(config.upgrade_idle.as_nanos()).unwrap_or(u64::MAX),
        config.upgrades,
    );
    let mut controller = Controller::new(
        admission_settings(&config),
        tracer,
        PrefetchEngine::new(loads),
        disks,
        upgrades,
    );
    let event_pump = tokio::spawn(pump_ring(event_ring, move |bytes| {
        if let Some(record) = decode_event(bytes) {
            let _ = events.send(record);
        }
    }));
    let playout_pump = tokio::spawn(pump_ring(playout_ring, move |bytes| {
        if let Some(event) = decode_playout(bytes) {
            let _ = playout.send(event);
        }
    }));
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut subscribers: i32 = 0;
    let mut sweep = tokio::time::interval(Duration::from_secs(10));
    // The credit timer wakes the loop only when some window lacks pages its credit will soon
    // cover; a stream whose window is full costs no wakeups at all.
    let idle = Duration::from_secs(3600);
    let credit_timer = tokio::time::sleep(idle);
    tokio::pin!(credit_timer);
    info!(
        "abissd {} listening on {}",
        env!("CARGO_PKG_VERSION"),
        config.socket.display()
    );

    loop {
        tokio::select! {
            accepted = socket.listener().accept() => match accepted {
                Ok((stream, _)) => { tokio::spawn(serve_connection(stream, context.clone())); }
                Err(error) => warn!("accept failed: {error}"),
            },
            Some(command) = command_rx.recv() => {
                handle(&mut controller, command, &mut subscribers);
            }
            Some(done) = load_rx.recv() => controller.loaded(done),
            Some(event) = playout_rx.recv() => controller.playout_event(&event, monotonic_ns()),
            () = &mut credit_timer => controller.tick(monotonic_ns()),
            _ = sweep.tick() => match controller.tracer().sweep_stale(monotonic_ns()) {
                Ok(0) => {}
                Ok(dropped) => info!("dropped {dropped} idle request records"),
                Err(error) => warn!("cannot sweep request records: {error}"),
            },
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
        // At least a millisecond, so a timer just short of a page's worth of credit does not spin.
        let wait = controller
            .next_wakeup_ns(monotonic_ns())
            .map_or(idle, |ns| {
                Duration::from_nanos(ns).max(Duration::from_millis(1))
            });
        credit_timer
            .as_mut()
            .reset(tokio::time::Instant::now() + wait);
    }
    info!("shutting down: ending streams, restoring devices, detaching programs");
    event_pump.abort();
    playout_pump.abort();
    controller.shutdown();
    drop(socket);
    Ok(())
}

fn handle(controller: &mut Controller, command: Command, subscribers: &mut i32) {
    match command {
        Command::Latency(reply) => {
            let _ = reply.send(controller.tracer().latency().map_err(|e| e.to_string()));
        }
        Command::RequestRecords(reply) => {
            let _ = reply.send(controller.tracer().request_records().unwrap_or((0, 0)));
        }
        Command::EventSubscribers(change) => {
            let before = *subscribers;
            *subscribers = (*subscribers + change).max(0);
            if (before == 0) != (*subscribers == 0) {
                if let Err(error) = controller.tracer().set_emit_events(*subscribers > 0) {
                    warn!("cannot switch request events: {error}");
                }
            }
        }
        Command::Attach {
            uid,
            connection,
            fd,
            request,
            reply,
        } => {
            let _ = reply.send(controller.attach(uid, connection, fd, request, monotonic_ns()));
        }
        Command::Detach { uid, target, reply } => {
            let _ = reply.send(controller.detach(uid, &target));
        }
        Command::Position {
            uid,
            stream,
            offset,
            at_ns,
        } => {
            let now = monotonic_ns();
            controller.position(uid, stream, offset, at_ns.unwrap_or(now), now);
        }
        Command::List { uid, reply } => {
            let _ = reply.send(controller.list(uid));
        }
        Command::Status(reply) => {
            let _ = reply.send((controller.status(), controller.upgrade_report()));
        }
        Command::Admit { request, reply } => {
            let _ = reply.send(controller.plan(&request));
        }
        Command::ConnectionClosed(connection) => controller.connection_closed(connection),
    }
}

/// Hands every record of a ring buffer to `deliver`.
async fn pump_ring(ring: RingBuf<MapData>, mut deliver: impl FnMut(&[u8])) {
    // SAFETY: the ring buffer owns its map descriptor for as long as the AsyncFd owns the ring.
    let Ok(mut ring) = (unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) })
    else {
        warn!("cannot poll a ring buffer");
        return;
    };
    loop {
        let Ok(mut ready) = ring.readable_mut().await else {
            return;
        };
        let buffer = ready.get_inner_mut();
        while let Some(item) = buffer.next() {
            deliver(&item);
        }
        ready.clear_ready();
    }
}

fn error_response(error: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        error,
        message: message.into(),
    }
}

async fn send(socket: &mut FramedSocket, response: &Response) -> bool {
    match encode_line(response) {
        Ok(line) => socket.write_all(&line).await.is_ok(),
        Err(_) => false,
    }
}

/// Asks the main loop and waits for its answer.
async fn ask<T>(context: &Context, make: impl FnOnce(Reply<T>) -> Command) -> Option<T> {
    let (reply, answer) = oneshot::channel();
    context.commands.send(make(reply)).await.ok()?;
    answer.await.ok()
}

fn shutting_down() -> Response {
    error_response(ErrorKind::Internal, "abissd is shutting down")
}

fn refusal((error, message): Refusal) -> Response {
    error_response(error, message)
}

async fn serve_connection(stream: UnixStream, context: Context) {
    let peer_uid = match stream.peer_cred() {
        Ok(cred) => cred.uid(),
        Err(error) => {
            warn!("connection without peer credentials refused: {error}");
            return;
        }
    };
    let connection = context.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let mut socket = FramedSocket::new(stream);
    serve_requests(&mut socket, &context, peer_uid, connection).await;
    let _ = context
        .commands
        .send(Command::ConnectionClosed(connection))
        .await;
}

/// Reads one request after another and answers each, until the client hangs up.
async fn serve_requests(
    socket: &mut FramedSocket,
    context: &Context,
    peer_uid: u32,
    connection: u64,
) {
    loop {
        let envelope = match next_envelope(socket).await {
            Ok(Some(envelope)) => envelope,
            Ok(None) => return,
            Err(response) => {
                let _ = send(socket, &response).await;
                return;
            }
        };
        let response = match envelope.request {
            Request::Events => {
                stream_events(socket, context, peer_uid).await;
                return;
            }
            Request::Position {
                stream,
                offset,
                at_ns,
            } => {
                // A notification: no answer, so a reader never waits for the daemon.
                let _ = context
                    .commands
                    .send(Command::Position {
                        uid: peer_uid,
                        stream,
                        offset,
                        at_ns,
                    })
                    .await;
                continue;
            }
            Request::Attach(request) => match socket.take_fd() {
                None => error_response(
                    ErrorKind::BadRequest,
                    "the attach request carried no file descriptor; open the file and pass it with SCM_RIGHTS",
                ),
                Some(fd) => match ask(context, |reply| Command::Attach {
                    uid: peer_uid,
                    connection,
                    fd,
                    request,
                    reply,
                })
                .await
                {
                    Some(Ok(info)) => Response::Attached(info),
                    Some(Err(refused)) => refusal(refused),
                    None => shutting_down(),
                },
            },
            other => answer(other, context, peer_uid).await,
        };
        if !send(socket, &response).await {
            return;
        }
    }
}

/// The next request of the current protocol version; `Err` carries the answer that ends the
/// connection (a malformed line, another version).
async fn next_envelope(socket: &mut FramedSocket) -> Result<Option<Envelope>, Response> {
    let line = match socket.next_line().await {
        Ok(Some(line)) => line,
        Ok(None) => return Ok(None),
        Err(error) => return Err(error_response(ErrorKind::BadRequest, error.to_string())),
    };
    let envelope: Envelope = decode_line(&line)
        .map_err(|error| error_response(ErrorKind::BadRequest, error.to_string()))?;
    if envelope.version != PROTOCOL_VERSION {
        let message = format!(
            "the client speaks protocol {} but this abissd speaks {PROTOCOL_VERSION}; use matching versions of abissctl and abissd",
            envelope.version
        );
        return Err(error_response(ErrorKind::VersionMismatch, message));
    }
    Ok(Some(envelope))
}

/// Answers the requests that need nothing from the connection but the peer's identity.
async fn answer(request: Request, context: &Context, peer_uid: u32) -> Response {
    match request {
        Request::Hello => Response::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
            kernel: context.kernel.clone(),
        },
        Request::Latency => match ask(context, Command::Latency).await {
            Some(Ok(groups)) => Response::Latency {
                taken_ns: monotonic_ns(),
                groups,
            },
            Some(Err(message)) => error_response(ErrorKind::Internal, message),
            None => shutting_down(),
        },
        Request::Stats { window_ms } => stats_response(context, window_ms).await,
        Request::Detach { target } => match ask(context, |reply| Command::Detach {
            uid: peer_uid,
            target,
            reply,
        })
        .await
        {
            Some(Ok(stream)) => Response::Detached { stream },
            Some(Err(refused)) => refusal(refused),
            None => shutting_down(),
        },
        Request::List => match ask(context, |reply| Command::List {
            uid: peer_uid,
            reply,
        })
        .await
        {
            Some(streams) => Response::Streams { streams },
            None => shutting_down(),
        },
        Request::Status => match ask(context, Command::Status).await {
            Some((devices, upgrades)) => Response::Devices { devices, upgrades },
            None => shutting_down(),
        },
        Request::Admit(request) => {
            match ask(context, |reply| Command::Admit { request, reply }).await {
                Some(Ok(report)) => Response::Admission(report),
                Some(Err(refused)) => refusal(refused),
                None => shutting_down(),
            }
        }
        Request::Events | Request::Position { .. } | Request::Attach(_) => {
            error_response(ErrorKind::Internal, "request routed to the wrong handler")
        }
    }
}

async fn stats_response(context: &Context, window_ms: u64) -> Response {
    if !(1..=60_000).contains(&window_ms) {
        return error_response(
            ErrorKind::BadRequest,
            format!("a stats window of {window_ms} ms is outside 1 ms to 60 s"),
        );
    }
    let mut report =
        match stats::measure(&context.program_ids, Duration::from_millis(window_ms)).await {
            Ok(report) => report,
            Err(error) => {
                return error_response(
                    ErrorKind::Internal,
                    format!("cannot switch on BPF statistics: {error}"),
                );
            }
        };
    if let Some((in_flight, records)) = ask(context, Command::RequestRecords).await {
        report.tracked_requests = in_flight;
        report.request_records = records;
    }
    Response::Stats(report)
}

async fn stream_events(socket: &mut FramedSocket, context: &Context, peer_uid: u32) {
    let mut receiver = context.events.subscribe();
    if context
        .commands
        .send(Command::EventSubscribers(1))
        .await
        .is_err()
    {
        return;
    }
    loop {
        match receiver.recv().await {
            Ok(record) => {
                // Per-request details of other users' tasks are for root only.
                if peer_uid != 0 && record.uid != peer_uid {
                    continue;
                }
                if !send(socket, &Response::Event(record)).await {
                    break;
                }
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                warn!("an event client fell behind and missed {missed} events");
            }
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
    let _ = context.commands.send(Command::EventSubscribers(-1)).await;
}

/// `CLOCK_MONOTONIC` in ns: the clock of the eBPF programs' timestamps.
#[must_use]
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}
