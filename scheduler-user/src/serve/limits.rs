//! What one client may hold of the daemon: connections in all and per user, and how long a
//! connection may sit idle. Each connection costs a task, its socket and up to
//! [`MAX_PENDING_FDS`](crate::serve::connection::MAX_PENDING_FDS) passed descriptors; the socket is
//! open to every local user (mode 0666), so without these bounds one user could take them all
//! (issue 9, finding 6). The longest line is `abiss_proto::MAX_LINE_BYTES`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Connections open at once, all users together. Each holds at most one socket and four
/// waiting descriptors, so the most they hold is 2 560 descriptors, well inside the
/// descriptor limit abissd raises itself to (and far more clients than a machine streams
/// to).
pub(crate) const MAX_CONNECTIONS: usize = 512;

/// Of [`MAX_CONNECTIONS`], how many only root may take: however many users fill the rest,
/// the administrator can still run `abissctl status` and `detach`.
pub(crate) const ROOT_RESERVED_CONNECTIONS: usize = 32;

/// Connections open at once by one user other than root. A player needs one per open
/// stream and a user has at most 32 streams; the rest is room for `abissctl` and `top`.
pub const MAX_USER_CONNECTIONS: usize = 64;

/// How long a connection that holds no stream may send nothing before abissd closes it:
/// every client asks at once after it connects, and `top` and `trace` ask every interval.
/// Connections with a stream (its lifetime is the connection's) and event subscriptions
/// (which wait for the daemon) are never idle.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Environment variable, in milliseconds, that replaces [`IDLE_TIMEOUT`]: for the tests, so
/// they need not wait a minute. Only whoever starts abissd sets its environment.
pub const IDLE_TIMEOUT_ENV: &str = "ABISSD_IDLE_TIMEOUT_MS";

/// Capacity plans (`admit`) the main loop is asked for at once, all clients together; the
/// others wait in their connections. The costliest plan the bounds admit (10 000 streams of
/// 1 B/s on a disk with a model, statistical mode) took 28 ms on the main loop of a debug
/// build on the 2-core development machine (`tests/security.rs`; 40 to 49 ms before the
/// model's access times were built once): under the 50 ms
/// at which it would move off the loop. Yet 32 connections asking for it back to back once
/// kept root's `status` waiting 1.3 to 2.5 s behind the queued plans; one at a time, a
/// request waits for at most one plan.
pub(crate) const PLANS_AT_ONCE: usize = 1;

/// How long a refusal may take to write before the connection is simply closed.
pub(crate) const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The idle timeout in force: [`IDLE_TIMEOUT`] unless [`IDLE_TIMEOUT_ENV`] names another.
#[must_use]
pub(crate) fn idle_timeout() -> Duration {
    std::env::var(IDLE_TIMEOUT_ENV)
        .ok()
        .and_then(|ms| ms.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(IDLE_TIMEOUT, Duration::from_millis)
}

/// Open connections, counted in all and per user.
#[derive(Clone, Debug, Default)]
pub(crate) struct ConnectionLimits {
    counts: Arc<Mutex<Counts>>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// A connection counted against the limits until it drops.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    counts: Arc<Mutex<Counts>>,
    uid: u32,
}

impl ConnectionLimits {
    /// Counts a new connection of `uid`, or says in one sentence why it may not open.
    pub(crate) fn admit(&self, uid: u32) -> Result<ConnectionSlot, String> {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let (room, whose) = if uid == 0 {
            (MAX_CONNECTIONS, "")
        } else {
            (
                MAX_CONNECTIONS - ROOT_RESERVED_CONNECTIONS,
                " (the rest are kept for root)",
            )
        };
        if counts.total >= room {
            return Err(format!(
                "abissd already serves {} connections, its most{whose}; close one or try again later",
                counts.total
            ));
        }
        let mine = counts.per_uid.get(&uid).copied().unwrap_or(0);
        if uid != 0 && mine >= MAX_USER_CONNECTIONS {
            return Err(format!(
                "user {uid} already has {mine} connections to abissd, the most one user may have; close one first"
            ));
        }
        counts.total += 1;
        *counts.per_uid.entry(uid).or_insert(0) += 1;
        Ok(ConnectionSlot {
            counts: Arc::clone(&self.counts),
            uid,
        })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.total = counts.total.saturating_sub(1);
        if let Some(mine) = counts.per_uid.get_mut(&self.uid) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                counts.per_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_held_to_its_share_and_root_keeps_its_reserve() {
        let limits = ConnectionLimits::default();
        let mine: Vec<ConnectionSlot> = (0..MAX_USER_CONNECTIONS)
            .map(|_| limits.admit(65534).expect("within the user's share"))
            .collect();
        let refused = limits.admit(65534).expect_err("one over the user's share");
        assert!(refused.contains("user 65534"), "{refused}");
        assert!(limits.admit(1000).is_ok(), "another user still connects");
        drop(mine);
        assert!(limits.admit(65534).is_ok(), "dropped slots are free again");

        // Many users fill everything but root's reserve; root still connects.
        let others: Vec<ConnectionSlot> = (0..MAX_CONNECTIONS - ROOT_RESERVED_CONNECTIONS)
            .map(|i| limits.admit(2000 + u32::try_from(i).unwrap()).unwrap())
            .collect();
        assert!(limits.admit(3).unwrap_err().contains("kept for root"));
        let roots: Vec<ConnectionSlot> = (0..ROOT_RESERVED_CONNECTIONS)
            .map(|_| limits.admit(0).expect("root's reserve"))
            .collect();
        assert!(limits.admit(0).is_err(), "root too has a ceiling");
        drop((others, roots));
        assert_eq!(limits.counts.lock().unwrap().total, 0);
        assert!(limits.counts.lock().unwrap().per_uid.is_empty());
    }
}
