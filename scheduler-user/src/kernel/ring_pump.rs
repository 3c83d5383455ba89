//! Handing the kernel programs' ring buffers to the main loop: a bounded queue, and turns.
//!
//! abissd runs its main loop and the pumps on one thread, and every read of an attached file
//! by its owner is a record in a ring: neither the queue behind a pump nor a pump's time may
//! grow with what a user does.

use std::time::Duration;

use abiss_proto::RequestRecord;
use aya::maps::{MapData, RingBuf};
use log::warn;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{broadcast, mpsc};
use tokio::task::JoinHandle;

use crate::kernel::events::{decode_access, decode_request, StreamAccess};

/// Reads and accesses of attached files waiting for the main loop, at most. An owner may
/// read its own attached file in a loop, and every read is an event: unbounded, that queue
/// took abissd from 27 MB to 906 MB in 10 s of two threads reading one byte, and root's
/// `status` waited 4.6 s behind it. Beyond this many, events are dropped as when the ring
/// itself is full (each is position evidence, and a miss is seen again at the next read).
pub(crate) const ACCESS_QUEUE: usize = 4096;

/// Tasks made by raised threads waiting for the main loop, at most: a user can fork in a loop.
/// Beyond this many they are dropped and counted, and the main loop looks for them in the
/// kernel's table of raised threads, as when the fork ring itself was full.
pub(crate) const FORK_QUEUE: usize = 4096;

/// Records a ring buffer's pump hands on before it lets the main loop run: with one thread
/// for both, a pump that drained a ring someone keeps full never gave the loop a turn.
const RECORDS_PER_TURN: usize = 64;

/// Accesses dropped for a full queue: counted, and said at most once a minute.
#[derive(Debug, Default)]
pub(crate) struct DroppedAccesses {
    count: u64,
    said: Option<std::time::Instant>,
}

impl DroppedAccesses {
    /// One more dropped.
    pub(crate) fn one_more(&mut self) {
        self.count += 1;
        if self
            .said
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60))
        {
            warn!(
                "{} accesses of attached files dropped so far: they come faster than abissd handles them",
                self.count
            );
            self.said = Some(std::time::Instant::now());
        }
    }
}

/// Starts the pumps of the request ring (`EVENTS`: every record to the event subscribers,
/// `events`) and of the access ring (`PLAYOUT`: reads and misses of attached files to the main
/// loop, `accesses`, dropped and counted when its queue is full).
#[must_use]
pub(crate) fn spawn_request_and_access_pumps(
    request_ring: RingBuf<MapData>,
    access_ring: RingBuf<MapData>,
    events: broadcast::Sender<RequestRecord>,
    accesses: mpsc::Sender<StreamAccess>,
) -> [JoinHandle<()>; 2] {
    let mut dropped = DroppedAccesses::default();
    [
        tokio::spawn(pump_ring(request_ring, move |bytes| {
            if let Some(record) = decode_request(bytes) {
                let _ = events.send(record);
            }
        })),
        tokio::spawn(pump_ring(access_ring, move |bytes| {
            if let Some(access) = decode_access(bytes) {
                if let Err(mpsc::error::TrySendError::Full(_)) = accesses.try_send(access) {
                    dropped.one_more();
                }
            }
        })),
    ]
}

/// Hands every record of a ring buffer to `deliver`.
pub(crate) async fn pump_ring(ring: RingBuf<MapData>, mut deliver: impl FnMut(&[u8])) {
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
        let mut handed = 0;
        {
            let buffer = ready.get_inner_mut();
            while let Some(item) = buffer.next() {
                deliver(&item);
                handed += 1;
                if handed == RECORDS_PER_TURN {
                    break;
                }
            }
        }
        if handed == RECORDS_PER_TURN {
            // More may be waiting: let the loop run, and come back without waiting for the
            // ring to say it is readable again.
            drop(ready);
            tokio::task::yield_now().await;
            continue;
        }
        ready.clear_ready();
    }
}
