//! The main loop's answers to connections' commands, and the connections that watch the
//! disks.

use abiss_os::clock::monotonic_now;
use log::warn;

use crate::controller::Controller;
use crate::serve::loop_clock::LoopClock;
use crate::serve::Command;

/// What a connection watches.
#[derive(Clone, Copy, Debug)]
enum Watch {
    /// Every disk's latency (it asked for latency or events).
    Disks,
    /// Per-request events.
    Events,
}

/// Connections that watch the disks: they set what the programs record.
#[derive(Debug, Default)]
pub(crate) struct Watchers {
    /// Trace clients: while there is one, every disk is traced, not only the managed ones.
    tracers: u32,
    /// Connections that stream per-request events.
    subscribers: u32,
}

impl Watchers {
    /// One more (`joins`) or one fewer watcher of `what`; the programs are told when the
    /// first one joins and when the last one leaves.
    fn change(&mut self, controller: &mut Controller, what: Watch, joins: bool) {
        let count = match what {
            Watch::Disks => &mut self.tracers,
            Watch::Events => &mut self.subscribers,
        };
        let before = *count;
        *count = if joins {
            before.saturating_add(1)
        } else {
            before.saturating_sub(1)
        };
        if (before == 0) == (*count == 0) {
            return;
        }
        let on = *count != 0;
        let result = match what {
            Watch::Disks => controller.tracer().set_trace_all(on),
            Watch::Events => controller.tracer().set_emit_events(on),
        };
        if let Err(error) = result {
            let state = if on { "on" } else { "off" };
            warn!("cannot switch {what:?} watching {state}: {error}");
        }
    }
}

/// Answers one command of a connection.
pub(crate) fn handle(
    controller: &mut Controller,
    command: Command,
    watchers: &mut Watchers,
    clock: &LoopClock,
) {
    match command {
        Command::Latency(reply) => {
            let _ = reply.send(controller.tracer().latency().map_err(|e| e.to_string()));
        }
        Command::RequestRecords(reply) => {
            let _ = reply.send(controller.tracer().request_records().unwrap_or((0, 0)));
        }
        Command::StartTracing(reply) => {
            watchers.change(controller, Watch::Disks, true);
            let _ = reply.send(());
        }
        Command::StopTracing => watchers.change(controller, Watch::Disks, false),
        Command::Subscribe(reply) => {
            watchers.change(controller, Watch::Events, true);
            let _ = reply.send(());
        }
        Command::Unsubscribe => watchers.change(controller, Watch::Events, false),
        Command::Attach {
            uid,
            connection,
            fd,
            request,
            reply,
        } => {
            let _ = reply.send(controller.attach(uid, connection, fd, request, monotonic_now()));
        }
        Command::Detach { uid, target, reply } => {
            let _ = reply.send(controller.detach(uid, &target));
        }
        Command::ReaderStarts {
            uid,
            stream,
            tid,
            reply,
        } => {
            let _ = reply.send(controller.reader_starts(uid, stream, tid, monotonic_now()));
        }
        Command::LockRing {
            uid,
            stream,
            fd,
            reply,
        } => controller.lock_ring(uid, stream, fd, reply),
        Command::SetRate {
            uid,
            target,
            rate,
            reply,
        } => {
            let _ = reply.send(controller.set_rate(uid, &target, rate, monotonic_now()));
        }
        Command::Position {
            uid,
            stream,
            offset,
            at,
        } => {
            let now = monotonic_now();
            controller.position(uid, stream, offset, at.unwrap_or(now), now);
        }
        Command::List { uid, reply } => {
            let _ = reply.send(controller.list(uid));
        }
        Command::Status { uid, reply } => {
            let mut status = controller.status(uid);
            status.main_loop = clock.report();
            let _ = reply.send(status);
        }
        Command::Admit { request, reply } => {
            let _ = reply.send(controller.plan(&request));
        }
        Command::ConnectionClosed(connection) => controller.connection_closed(connection),
    }
}
