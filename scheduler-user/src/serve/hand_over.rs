//! The requests that come with a descriptor: an attach (the file to stream) and a direct
//! recording's ring. The descriptor is the oldest the connection received and did not yet
//! take; one that can never be a stream was already given back to the closer, with its reason.

use std::collections::HashSet;
use std::time::Duration;

use abiss_proto::{AttachRequest, ErrorKind, Response, StreamId};

use super::closer::ClientFd;
use super::connection::{FramedSocket, Received};
use super::{ask, error_response, shutting_down, Command, Context};

/// Attaches the file whose descriptor came with the request; a non-persistent stream is
/// added to those the connection `held`s.
pub(super) async fn attach(
    socket: &mut FramedSocket,
    context: &Context,
    peer_uid: u32,
    connection: u64,
    request: AttachRequest,
    held: &mut HashSet<StreamId>,
) -> Response {
    let fd = match descriptor(socket.take_fd(), "attach") {
        Ok(fd) => fd,
        Err(reason) => return error_response(ErrorKind::BadRequest, reason),
    };
    let persistent = request.persistent;
    let answer = ask(context, |reply| Command::Attach {
        uid: peer_uid,
        connection,
        fd,
        request,
        reply,
    })
    .await;
    match answer {
        Some(Ok(info)) => {
            if !persistent {
                held.insert(info.id);
            }
            Response::Attached(info)
        }
        Some(Err(refused)) => Response::from(refused),
        None => shutting_down(),
    }
}

/// Hands the ring that came with the request to the main loop, which locks it for stream
/// `stream`; answered once it is locked.
pub(super) async fn lock_ring(
    socket: &mut FramedSocket,
    context: &Context,
    peer_uid: u32,
    stream: StreamId,
) -> Response {
    let fd = match descriptor(socket.take_fd(), "lock_ring") {
        Ok(fd) => fd,
        Err(reason) => return error_response(ErrorKind::BadRequest, reason),
    };
    let locked = ask(context, |reply| Command::LockRing {
        uid: peer_uid,
        stream,
        fd,
        reply,
    });
    // The lock runs on the user's ring-locking thread; should that thread never answer (it
    // could not be started), the connection is not held waiting for it.
    match tokio::time::timeout(RING_LOCK_TIMEOUT, locked).await {
        Ok(Some(Ok(bytes))) => Response::RingLocked { stream, bytes },
        Ok(Some(Err(refused))) => Response::from(refused),
        Ok(None) => shutting_down(),
        Err(_) => error_response(
            ErrorKind::Internal,
            format!(
                "abissd did not lock the ring within {} s; lock it yourself",
                RING_LOCK_TIMEOUT.as_secs()
            ),
        ),
    }
}

/// The longest a connection waits for its ring to be locked.
const RING_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// The descriptor a `what` request came with, or why there is none (a bad request).
fn descriptor(received: Option<Received>, what: &str) -> Result<ClientFd, String> {
    match received {
        Some(Ok(fd)) => Ok(fd),
        Some(Err(reason)) => Err(reason),
        None => Err(format!(
            "the {what} request carried no file descriptor; pass it with SCM_RIGHTS in the same message"
        )),
    }
}
