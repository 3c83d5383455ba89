//! Serving clients: one task per connection reads protocol lines (and the descriptors passed
//! with them), asks the main loop for what only it may touch, and writes the answers. Event
//! subscriptions (`trace --events`) and BPF statistics are served here too.
//!
//! This module knows the protocol and the main loop's [`Command`]s, never the controller: the
//! daemon's main loop answers the commands (as console-subscriber keeps its server apart from
//! its aggregator). What one client may hold (connections, idle time) is in [`limits`].

pub(crate) mod client_file;
pub(crate) mod closer;
pub(crate) mod connection;
mod hand_over;
pub(crate) mod keyed_threads;
pub mod limits;
pub(crate) mod loop_clock;
pub(crate) mod metrics;
pub(crate) mod socket;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use abiss_os::clock::monotonic_ns;
use abiss_proto::{
    decode_envelope, encode_line, AdmissionReport, AdmitRequest, AttachRequest, ByteRate, Envelope,
    EnvelopeError, ErrorKind, LatencyGroup, Refusal, Request, RequestRecord, Response,
    StatusReport, StreamId, StreamInfo, StreamTarget, PROTOCOL_VERSION,
};
use log::warn;
use scheduler_common::MonotonicNs;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};

use crate::kernel::stats;
use crate::serve::connection::FramedSocket;
use closer::Closer;
use limits::{ConnectionLimits, PLANS_AT_ONCE, REFUSAL_WRITE_TIMEOUT};

/// Where the main loop sends its answer.
pub(crate) type Reply<T> = oneshot::Sender<T>;

/// What connections ask of the main loop, the only place that touches maps and streams. Each
/// carries the asking peer's uid where the answer depends on who asks.
#[derive(Debug)]
pub(crate) enum Command {
    /// The cumulative latency histograms.
    Latency(Reply<Result<Vec<LatencyGroup>, String>>),
    /// Requests in flight and records kept, for `stats`.
    RequestRecords(Reply<(u64, u64)>),
    /// A connection becomes a trace client (its first `Latency` or `Events`): every disk is
    /// traced while there is one; the answer comes once the programs trace them.
    StartTracing(Reply<()>),
    /// A trace client's connection ended.
    StopTracing,
    /// A client starts streaming events; the answer comes once the programs record them.
    Subscribe(Reply<()>),
    /// A client stopped streaming events.
    Unsubscribe,
    /// Attach the file behind `fd`.
    Attach {
        /// The peer.
        uid: u32,
        /// Its connection (non-persistent streams end with it).
        connection: u64,
        /// The descriptor it passed.
        fd: closer::ClientFd,
        /// The stream's parameters.
        request: AttachRequest,
        /// The answer.
        reply: Reply<Result<StreamInfo, Refusal>>,
    },
    /// End a stream.
    Detach {
        /// The peer.
        uid: u32,
        /// Which stream.
        target: StreamTarget,
        /// The answer: the stream ended.
        reply: Reply<Result<StreamId, Refusal>>,
    },
    /// Lock the ring of a direct recording, behind `fd`.
    LockRing {
        /// The peer.
        uid: u32,
        /// The stream.
        stream: StreamId,
        /// The descriptor it passed.
        fd: closer::ClientFd,
        /// The answer, once it is locked: the bytes locked.
        reply: Reply<Result<u64, Refusal>>,
    },
    /// Give a stream another rate.
    SetRate {
        /// The peer.
        uid: u32,
        /// Which stream.
        target: StreamTarget,
        /// The new rate.
        rate: ByteRate,
        /// The answer: the stream as it is now.
        reply: Reply<Result<StreamInfo, Refusal>>,
    },
    /// A thread of the peer's is about to read a stream.
    ReaderStarts {
        /// The peer.
        uid: u32,
        /// The stream.
        stream: StreamId,
        /// The thread.
        tid: u32,
        /// The answer: whether it was raised now.
        reply: Reply<Result<bool, Refusal>>,
    },
    /// The application's playout point (a notification: no answer).
    Position {
        /// The peer.
        uid: u32,
        /// The stream.
        stream: StreamId,
        /// Byte offset consumed up to.
        offset: u64,
        /// When the application was there, if it said (the wire's `CLOCK_MONOTONIC` ns).
        at: Option<MonotonicNs>,
    },
    /// The streams the peer may see.
    List {
        /// The peer.
        uid: u32,
        /// The answer.
        reply: Reply<Vec<StreamInfo>>,
    },
    /// The managed devices, the reader raises and the capabilities.
    Status {
        /// The peer, whose own locked memory the answer shows.
        uid: u32,
        /// The answer.
        reply: Reply<StatusReport>,
    },
    /// Capacity planning.
    Admit {
        /// The question.
        request: AdmitRequest,
        /// The answer.
        reply: Reply<Result<AdmissionReport, Refusal>>,
    },
    /// A connection ended.
    ConnectionClosed(u64),
}

/// Shared, read-only context of every connection.
#[derive(Clone, Debug)]
pub(crate) struct Context {
    commands: mpsc::Sender<Command>,
    events: broadcast::Sender<RequestRecord>,
    program_ids: Arc<Vec<(String, u32)>>,
    kernel: String,
    connections: Arc<AtomicU64>,
    limits: ConnectionLimits,
    idle_timeout: Duration,
    plans: Arc<Semaphore>,
    closer: Closer,
}

impl Context {
    /// What connections share: the way to the main loop, the request events to fan out, the
    /// programs whose costs `stats` measures, and the kernel release `hello` reports.
    #[must_use]
    pub(crate) fn new(
        commands: mpsc::Sender<Command>,
        events: broadcast::Sender<RequestRecord>,
        program_ids: Vec<(String, u32)>,
        kernel: String,
    ) -> Self {
        Self {
            commands,
            events,
            program_ids: Arc::new(program_ids),
            kernel,
            connections: Arc::new(AtomicU64::new(0)),
            limits: ConnectionLimits::default(),
            idle_timeout: limits::idle_timeout(),
            plans: Arc::new(Semaphore::new(PLANS_AT_ONCE)),
            closer: Closer::new(),
        }
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

/// Serves one client until it hangs up; its non-persistent streams end then. A connection
/// over the [`limits`] is told why and closed.
pub(crate) async fn serve_connection(stream: UnixStream, context: Context) {
    let peer_uid = match stream.peer_cred() {
        Ok(cred) => cred.uid(),
        Err(error) => {
            warn!("connection without peer credentials refused: {error}");
            // Whatever it holds in flight is closed off the loop, as anyone's (no user's
            // closing thread is the root's one).
            if let Ok(stream) = stream.into_std() {
                context.closer.close_connection(u32::MAX, stream.into());
            }
            return;
        }
    };
    // Out-of-band data is read inline: a reader that skips the out-of-band byte has the
    // kernel drop the descriptors it carried in the reader's thread, the main loop, whose
    // close of a lingering socket would then wait there.
    if let Err(error) =
        nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::OobInline, &true)
    {
        warn!("connection refused: cannot read its out-of-band data inline: {error}");
        if let Ok(stream) = stream.into_std() {
            context.closer.close_connection(peer_uid, stream.into());
        }
        return;
    }
    let mut socket = FramedSocket::new(stream, peer_uid, context.closer.clone());
    // Counted until this function returns, and the socket closes with it (on the user's
    // closing thread if it holds anything).
    let admitted = if context.closer.is_stalled(peer_uid) {
        Err(stalled_message(&context.closer, peer_uid))
    } else {
        context.limits.admit(peer_uid)
    };
    let _slot = match admitted {
        Ok(slot) => slot,
        Err(message) => {
            let refusal = error_response(ErrorKind::Refused, message);
            let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, send(&mut socket, &refusal)).await;
            return;
        }
    };
    let connection = context.connections.fetch_add(1, Ordering::Relaxed) + 1;
    let mut tracing = false;
    serve_requests(&mut socket, &context, peer_uid, connection, &mut tracing).await;
    if tracing {
        let _ = context.commands.send(Command::StopTracing).await;
    }
    let _ = context
        .commands
        .send(Command::ConnectionClosed(connection))
        .await;
}

/// Reads one request after another and answers each, until the client hangs up. A
/// connection that asks for latency or events becomes a trace client (`tracing`) first: disks
/// abissd does not manage are traced from then on, until the last such connection ends.
async fn serve_requests(
    socket: &mut FramedSocket,
    context: &Context,
    peer_uid: u32,
    connection: u64,
    tracing: &mut bool,
) {
    // The non-persistent streams attached here: they live as long as the connection, so
    // while there is one the connection is never idle.
    let mut held = HashSet::new();
    loop {
        // A user whose passed descriptors are still being closed passes no more: nothing of
        // theirs is read until the closer has caught up (their own wait, nobody else's).
        while context.closer.is_stalled(peer_uid) {
            tokio::time::sleep(STALLED_POLL).await;
        }
        let next = if held.is_empty() {
            let Ok(next) = tokio::time::timeout(context.idle_timeout, next_envelope(socket)).await
            else {
                let _ = send(socket, &idle(context.idle_timeout)).await;
                return;
            };
            next
        } else {
            next_envelope(socket).await
        };
        let envelope = match next {
            Ok(Some(envelope)) => envelope,
            Ok(None) => return,
            Err(response) => {
                let _ = send(socket, &response).await;
                return;
            }
        };
        // Tracing every disk puts the block programs on every request of the machine: root's
        // `trace` and `events` switch it on; another user's see the disks traced anyway
        // (the managed ones), so no user can make every disk's I/O pay for their watching.
        if !*tracing
            && peer_uid == 0
            && matches!(envelope.request, Request::Latency | Request::Events)
        {
            if ask(context, Command::StartTracing).await.is_none() {
                let _ = send(socket, &shutting_down()).await;
                return;
            }
            *tracing = true;
        }
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
                        at: at_ns.map(MonotonicNs),
                    })
                    .await;
                continue;
            }
            Request::Attach(request) => {
                hand_over::attach(socket, context, peer_uid, connection, request, &mut held).await
            }
            Request::LockRing { stream } => {
                hand_over::lock_ring(socket, context, peer_uid, stream).await
            }
            other => answer(other, context, peer_uid).await,
        };
        if let Response::Detached { stream } = &response {
            held.remove(stream);
        }
        if !send(socket, &response).await {
            return;
        }
    }
}

/// How often a connection of a stalled user looks whether its closes caught up.
const STALLED_POLL: Duration = Duration::from_millis(50);

/// Why a connection of `uid`'s is refused while their descriptors are still being closed.
fn stalled_message(closer: &Closer, uid: u32) -> String {
    format!(
        "abissd is still closing {} descriptors you passed it (a close of a lingering socket or of a file whose file system does not answer waits); it takes no more from you until they are closed",
        closer.pending(uid)
    )
}

/// The answer that closes a connection that sent nothing for `timeout`.
fn idle(timeout: Duration) -> Response {
    error_response(
        ErrorKind::Refused,
        format!(
            "abissd closes a connection that holds no stream and sends nothing for {} s; connect again when there is something to ask",
            timeout.as_secs_f64()
        ),
    )
}

/// The next request of the current protocol version; `Err` carries the answer that ends the
/// connection (a malformed line, another version). The version is read first, so a request
/// kind this daemon does not know is another version's when the version differs.
async fn next_envelope(socket: &mut FramedSocket) -> Result<Option<Envelope>, Response> {
    let line = match socket.next_line().await {
        Ok(Some(line)) => line,
        Ok(None) => return Ok(None),
        Err(error) => return Err(error_response(ErrorKind::BadRequest, error.to_string())),
    };
    match decode_envelope(&line) {
        Ok(envelope) => Ok(Some(envelope)),
        Err(error @ EnvelopeError::OtherVersion(_)) => Err(error_response(
            ErrorKind::VersionMismatch,
            error.to_string(),
        )),
        Err(EnvelopeError::Wire(error)) => {
            Err(error_response(ErrorKind::BadRequest, error.to_string()))
        }
    }
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
        Request::Detach { .. } | Request::SetRate { .. } | Request::ReaderStarts { .. } => {
            stream_request(request, context, peer_uid).await
        }
        Request::List => match ask(context, |reply| Command::List {
            uid: peer_uid,
            reply,
        })
        .await
        {
            Some(streams) => Response::Streams { streams },
            None => shutting_down(),
        },
        Request::Status => match ask(context, |reply| Command::Status {
            uid: peer_uid,
            reply,
        })
        .await
        {
            Some(report) => Response::Devices(report),
            None => shutting_down(),
        },
        Request::Admit(request) => {
            // The main loop computes plans; they queue here, never in front of other requests.
            let Ok(_turn) = context.plans.acquire().await else {
                return shutting_down();
            };
            match ask(context, |reply| Command::Admit { request, reply }).await {
                Some(Ok(report)) => Response::Admission(report),
                Some(Err(refused)) => Response::from(refused),
                None => shutting_down(),
            }
        }
        Request::Events
        | Request::Position { .. }
        | Request::Attach(_)
        | Request::LockRing { .. } => {
            error_response(ErrorKind::Internal, "request routed to the wrong handler")
        }
    }
}

/// The requests that change one of the peer's streams.
async fn stream_request(request: Request, context: &Context, peer_uid: u32) -> Response {
    match request {
        Request::Detach { target } => match ask(context, |reply| Command::Detach {
            uid: peer_uid,
            target,
            reply,
        })
        .await
        {
            Some(Ok(stream)) => Response::Detached { stream },
            Some(Err(refused)) => Response::from(refused),
            None => shutting_down(),
        },
        Request::SetRate { target, rate } => match ask(context, |reply| Command::SetRate {
            uid: peer_uid,
            target,
            rate,
            reply,
        })
        .await
        {
            Some(Ok(stream)) => Response::RateChanged(stream),
            Some(Err(refused)) => Response::from(refused),
            None => shutting_down(),
        },
        Request::ReaderStarts { stream, tid } => match ask(context, |reply| Command::ReaderStarts {
            uid: peer_uid,
            stream,
            tid,
            reply,
        })
        .await
        {
            Some(Ok(raised)) => Response::ReaderRaised { raised },
            Some(Err(refused)) => Response::from(refused),
            None => shutting_down(),
        },
        _ => error_response(ErrorKind::Internal, "request routed to the wrong handler"),
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

/// Streams request events to the client until it hangs up. The socket is watched all the
/// while, so a client that hangs up is let go at once, even one that is never sent an event
/// (an unprivileged client with no I/O of its own): its task, socket, non-persistent streams
/// and the programs' event switch are not held for it (issue 9, finding 5).
async fn stream_events(socket: &mut FramedSocket, context: &Context, peer_uid: u32) {
    let mut receiver = context.events.subscribe();
    if ask(context, Command::Subscribe).await.is_none() {
        return;
    }
    // From here the programs record events: the client may start the I/O it wants to see.
    let mut subscribed = send(socket, &Response::Subscribed).await;
    while subscribed {
        tokio::select! {
            event = receiver.recv() => match event {
                Ok(record) => {
                    // Per-request details of other users' tasks are for root only.
                    if peer_uid == 0 || record.uid == peer_uid {
                        subscribed = send(socket, &Response::Event(record)).await;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    warn!("an event client fell behind and missed {missed} events");
                }
                Err(broadcast::error::RecvError::Closed) => subscribed = false,
            },
            // A subscriber has nothing more to ask: what it sends is read and dropped (within
            // the line and descriptor limits); the end of its input is the end of it.
            line = socket.next_line() => subscribed = matches!(line, Ok(Some(_))),
        }
    }
    let _ = context.commands.send(Command::Unsubscribe).await;
}
