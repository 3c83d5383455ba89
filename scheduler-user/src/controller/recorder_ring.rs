//! The controller's side of a direct recording's ring ([`crate::stream::recorder_ring`]): the
//! client's hand-over, and the lock's end.

use abiss_proto::{Refusal, StreamId, StreamTarget};
use log::{info, warn};
use tokio::sync::oneshot;

use super::Controller;
use crate::serve::closer::ClientFd;
use crate::stream::prefetch::{JobKind, LoadDone, LoadJob, LoadOutcome};
use crate::stream::recorder_ring::RecorderRing;

impl Controller {
    /// `peer_uid` hands over the ring behind `fd` for its direct recording `stream`; `reply`
    /// is answered once it is locked, or at once with why it is not taken.
    pub(crate) fn lock_ring(
        &mut self,
        peer_uid: u32,
        stream: StreamId,
        fd: ClientFd,
        reply: oneshot::Sender<Result<u64, Refusal>>,
    ) {
        let refuse = |reply: oneshot::Sender<_>, refusal| {
            let _ = reply.send(Err(refusal));
        };
        let id = match self.owned_stream(peer_uid, &StreamTarget::Id(stream)) {
            Ok(id) => id,
            Err(refusal) => return refuse(reply, refusal),
        };
        let Some(stream) = self.streams.get_mut(id) else {
            return refuse(
                reply,
                Refusal::NotAttached {
                    what: format!("stream {id}"),
                },
            );
        };
        let reserved = stream.admitted_locked_bytes();
        let Some(recording) = stream.kind.recording_mut().filter(|r| r.is_direct()) else {
            return refuse(
                reply,
                Refusal::BadRequest(format!(
                    "stream {id} is not a direct recording; only a direct recording's ring is locked by abissd"
                )),
            );
        };
        if recording.ring.is_some() {
            return refuse(
                reply,
                Refusal::BadRequest(format!("stream {id} has handed over its ring already")),
            );
        }
        match RecorderRing::map(fd, reserved, reply) {
            Ok(ring) => {
                let (file, bytes) = ring.to_lock();
                recording.ring = Some(ring);
                self.prefetch.lock_ring(LoadJob {
                    stream: id,
                    generation: 0,
                    range: 0..bytes,
                    file,
                    kind: JobKind::LockRing,
                });
            }
            Err((refusal, reply)) => refuse(reply, refusal),
        }
    }

    /// A ring's lock ended: its client is told.
    pub(super) fn ring_locked(&mut self, done: LoadDone) {
        let Some(recording) = self
            .streams
            .get_mut(done.stream)
            .and_then(|stream| stream.kind.recording_mut())
        else {
            return;
        };
        let Some(ring) = &mut recording.ring else {
            return;
        };
        let outcome = match done.outcome {
            LoadOutcome::Loaded => Ok(()),
            LoadOutcome::Cancelled => Err("it was cancelled".to_owned()),
            LoadOutcome::Failed(error) => Err(error.to_string()),
        };
        if ring.on_locked(outcome) {
            info!(
                "stream {}: its recorder's ring of {} bytes is locked",
                done.stream,
                ring.locked_bytes()
            );
        } else {
            warn!(
                "stream {}: its recorder's ring could not be locked",
                done.stream
            );
            recording.ring = None;
        }
    }
}
