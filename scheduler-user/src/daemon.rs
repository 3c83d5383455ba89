//! The daemon's life: preflight, load, serve, and a clean shutdown on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::time::Duration;

use abiss_proto::{
    decode_line, encode_line, Envelope, ErrorKind, LatencyGroup, Request, RequestRecord, Response,
    MAX_LINE_BYTES, PROTOCOL_VERSION,
};
use aya::maps::{MapData, RingBuf};
use log::{info, warn};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::kernel_layout::{self, LayoutError};
use crate::preflight;
use crate::socket::{ControlSocket, SocketError};
use crate::stats;
use crate::tracer::{decode_event, BlockTracer, TracerError};

/// How the daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Control socket path.
    pub socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    pub btf: PathBuf,
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
        }
    }
}

/// What connections ask of the main loop, the only place that touches the maps.
enum Command {
    Latency(oneshot::Sender<Result<Vec<LatencyGroup>, String>>),
    RequestRecords(oneshot::Sender<(u64, u64)>),
    /// A client started (+1) or stopped (-1) streaming events.
    EventSubscribers(i32),
}

/// Shared, read-only context of every connection.
#[derive(Clone)]
struct Context {
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<RequestRecord>,
    program_ids: std::sync::Arc<Vec<(String, u32)>>,
    kernel: String,
}

/// Runs the daemon until SIGINT or SIGTERM. Must be called inside a tokio runtime.
pub async fn run(config: DaemonConfig) -> Result<(), DaemonError> {
    let caps = preflight::effective_capabilities()?;
    if !preflight::can_trace(caps) {
        return Err(DaemonError::NotPrivileged);
    }
    let layout = kernel_layout::resolve(&config.btf)?;
    let socket = ControlSocket::bind(&config.socket)?;
    let mut tracer = BlockTracer::load(&layout, &config.btf)?;
    let ring = tracer.take_event_ring()?;

    let (commands, mut command_rx) = mpsc::channel(64);
    let (events, _) = broadcast::channel(8192);
    let context = Context {
        commands,
        events: events.clone(),
        program_ids: std::sync::Arc::new(tracer.program_ids().to_vec()),
        kernel: kernel_layout::kernel_release(),
    };
    let pump = tokio::spawn(pump_events(ring, events));
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut subscribers: i32 = 0;
    let mut sweep = tokio::time::interval(Duration::from_secs(10));
    info!(
        "abissd {} listening on {} (programs: {})",
        env!("CARGO_PKG_VERSION"),
        config.socket.display(),
        tracer.program_ids().len()
    );

    loop {
        tokio::select! {
            accepted = socket.listener().accept() => match accepted {
                Ok((stream, _)) => { tokio::spawn(serve_connection(stream, context.clone())); }
                Err(error) => warn!("accept failed: {error}"),
            },
            Some(command) = command_rx.recv() => match command {
                Command::Latency(reply) => {
                    let _ = reply.send(tracer.latency().map_err(|e| e.to_string()));
                }
                Command::RequestRecords(reply) => {
                    let _ = reply.send(tracer.request_records().unwrap_or((0, 0)));
                }
                Command::EventSubscribers(change) => {
                    let before = subscribers;
                    subscribers = (subscribers + change).max(0);
                    if (before == 0) != (subscribers == 0) {
                        if let Err(error) = tracer.set_emit_events(subscribers > 0) {
                            warn!("cannot switch request events: {error}");
                        }
                    }
                }
            },
            _ = sweep.tick() => match tracer.sweep_stale(monotonic_ns()) {
                Ok(0) => {}
                Ok(dropped) => info!("dropped {dropped} tracked requests that never completed"),
                Err(error) => warn!("cannot sweep tracked requests: {error}"),
            },
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
        }
    }
    info!("shutting down: detaching programs");
    pump.abort();
    drop(tracer);
    drop(socket);
    Ok(())
}

/// Moves per-request events from the ring buffer to every subscribed connection.
async fn pump_events(ring: RingBuf<MapData>, events: broadcast::Sender<RequestRecord>) {
    // SAFETY: the ring buffer owns its map descriptor for as long as the AsyncFd owns the ring.
    let Ok(mut ring) = (unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) })
    else {
        warn!("cannot poll the event ring buffer");
        return;
    };
    loop {
        let Ok(mut ready) = ring.readable_mut().await else {
            return;
        };
        let buffer = ready.get_inner_mut();
        while let Some(item) = buffer.next() {
            if let Some(record) = decode_event(&item) {
                let _ = events.send(record);
            }
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

async fn send(stream: &mut (impl AsyncWriteExt + Unpin), response: &Response) -> bool {
    match encode_line(response) {
        Ok(line) => stream.write_all(&line).await.is_ok(),
        Err(_) => false,
    }
}

async fn serve_connection(stream: UnixStream, context: Context) {
    let peer_uid = match stream.peer_cred() {
        Ok(cred) => cred.uid(),
        Err(error) => {
            warn!("connection without peer credentials refused: {error}");
            return;
        }
    };
    let (read_half, mut write_half) = stream.into_split();
    let mut lines = BufReader::new(read_half);
    let mut line = Vec::new();
    loop {
        line.clear();
        // Bound what one client can make the daemon buffer.
        let mut limited = (&mut lines).take(MAX_LINE_BYTES as u64 + 1);
        match limited.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let envelope: Envelope = match decode_line(&line) {
            Ok(envelope) => envelope,
            Err(error) => {
                let _ = send(
                    &mut write_half,
                    &error_response(ErrorKind::BadRequest, error.to_string()),
                )
                .await;
                return;
            }
        };
        if envelope.version != PROTOCOL_VERSION {
            let message = format!(
                "the client speaks protocol {} but this abissd speaks {PROTOCOL_VERSION}; use matching versions of abissctl and abissd",
                envelope.version
            );
            let _ = send(
                &mut write_half,
                &error_response(ErrorKind::VersionMismatch, message),
            )
            .await;
            return;
        }
        let response = match envelope.request {
            Request::Hello => Response::Hello {
                version: PROTOCOL_VERSION,
                pid: std::process::id(),
                kernel: context.kernel.clone(),
            },
            Request::Latency => latency(&context).await,
            Request::Stats { window_ms } => stats_response(&context, window_ms).await,
            Request::Events => {
                stream_events(&mut write_half, &context, peer_uid).await;
                return;
            }
            _ => error_response(ErrorKind::BadRequest, "streams are not served yet"),
        };
        if !send(&mut write_half, &response).await {
            return;
        }
    }
}

async fn latency(context: &Context) -> Response {
    let (reply, answer) = oneshot::channel();
    if context
        .commands
        .send(Command::Latency(reply))
        .await
        .is_err()
    {
        return error_response(ErrorKind::Internal, "abissd is shutting down");
    }
    match answer.await {
        Ok(Ok(groups)) => Response::Latency {
            taken_ns: monotonic_ns(),
            groups,
        },
        Ok(Err(message)) => error_response(ErrorKind::Internal, message),
        Err(_) => error_response(ErrorKind::Internal, "abissd is shutting down"),
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
                )
            }
        };
    let (reply, answer) = oneshot::channel();
    if context
        .commands
        .send(Command::RequestRecords(reply))
        .await
        .is_ok()
    {
        (report.tracked_requests, report.request_records) = answer.await.unwrap_or((0, 0));
    }
    Response::Stats(report)
}

async fn stream_events(
    stream: &mut (impl AsyncWriteExt + Unpin),
    context: &Context,
    peer_uid: u32,
) {
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
                if !send(stream, &Response::Event(record)).await {
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

fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}
