//! The readers a stream lists: the processes seen reading its file lately.
//!
//! Every report of a read notes its process, on abissd's main loop. A user can read their own
//! stream's file from as many short-lived processes as they like (the kernel reports 10 000
//! reads a second per file), and before, every report went over every process seen in the last
//! 10 s to forget the idle ones: a user-sized scan per event, on the one thread every stream
//! and client waits for (issue 33). Now a stream lists at most [`MAX_READERS`], and forgets
//! idle ones at most every [`PRUNE_EVERY_NS`], or when the list is full, where the reader seen
//! longest ago goes: a report costs a hash lookup, and at worst one pass over the bounded list.
//! A reader stays listed while fewer than [`MAX_READERS`] new ones arrive between its reads.

use std::collections::HashMap;

use scheduler_common::MonotonicNs;

/// Most readers one stream lists. A player is one process, a few with helpers; a user who
/// reads from more at once still has them read, and raised if they miss, but not all listed.
pub(crate) const MAX_READERS: usize = 64;
/// Readers not seen reading for this long are forgotten.
pub(crate) const READER_IDLE_NS: u64 = 10_000_000_000;
/// Idle readers are looked for at most this often (and when the list is full).
pub(crate) const PRUNE_EVERY_NS: u64 = 1_000_000_000;

/// A stream's recent readers: process id → (command, last seen).
#[derive(Clone, Debug, Default)]
pub(crate) struct RecentReaders {
    readers: HashMap<u32, (String, MonotonicNs)>,
    pruned_at: MonotonicNs,
}

impl RecentReaders {
    /// Process `pid` (running `comm`) read the stream's file at `now`.
    pub(crate) fn saw(&mut self, pid: u32, comm: String, now: MonotonicNs) {
        if now.saturating_since(self.pruned_at) >= PRUNE_EVERY_NS {
            self.prune(now);
        }
        if let Some(entry) = self.readers.get_mut(&pid) {
            *entry = (comm, now);
            return;
        }
        if self.readers.len() >= MAX_READERS {
            self.prune(now);
        }
        if self.readers.len() >= MAX_READERS {
            if let Some(oldest) = self
                .readers
                .iter()
                .min_by_key(|(_, (_, seen))| *seen)
                .map(|(pid, _)| *pid)
            {
                self.readers.remove(&oldest);
            }
        }
        self.readers.insert(pid, (comm, now));
    }

    fn prune(&mut self, now: MonotonicNs) {
        self.pruned_at = now;
        self.readers
            .retain(|_, (_, seen)| now.saturating_since(*seen) < READER_IDLE_NS);
    }

    /// Whether `pid` is listed.
    #[must_use]
    pub(crate) fn contains(&self, pid: u32) -> bool {
        self.readers.contains_key(&pid)
    }

    /// Whether no reader is listed.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.readers.is_empty()
    }

    /// Readers listed.
    #[must_use]
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.readers.len()
    }

    /// The listed readers' process ids.
    pub(crate) fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.readers.keys().copied()
    }

    /// The listed readers: process id and command.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &str)> + '_ {
        self.readers
            .iter()
            .map(|(pid, (comm, _))| (*pid, comm.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: u64 = 1_000_000;

    /// 10 000 short-lived readers a second for 10 s (the kernel's report cap): the list stays
    /// bounded, and a player that reads again before 63 newcomers pushed it out stays listed.
    #[test]
    fn a_flood_of_short_lived_readers_stays_bounded() {
        let mut readers = RecentReaders::default();
        let player = 1;
        for i in 0..100_000u32 {
            let now = u64::from(i) * MS / 10;
            readers.saw(1000 + i, "flood".to_owned(), MonotonicNs(now));
            if i % 50 == 0 {
                readers.saw(player, "player".to_owned(), MonotonicNs(now));
            }
            assert!(readers.len() <= MAX_READERS);
        }
        assert!(readers.contains(player));
    }

    proptest! {
        /// Whatever the reports, the list never passes its bound, the latest reader is
        /// always listed, and nobody idle past `READER_IDLE_NS + PRUNE_EVERY_NS` is.
        #[test]
        fn bounded_and_fresh(reports in proptest::collection::vec((0u32..500, 0u64..3_000 * MS), 1..2000)) {
            let mut readers = RecentReaders::default();
            let mut now = 0;
            let mut last_seen = HashMap::new();
            for (pid, step) in reports {
                now += step / 100;
                readers.saw(pid, String::new(), MonotonicNs(now));
                last_seen.insert(pid, now);
                prop_assert!(readers.len() <= MAX_READERS);
                prop_assert!(readers.contains(pid));
            }
            for pid in readers.pids() {
                prop_assert!(now - last_seen[&pid] < READER_IDLE_NS + PRUNE_EVERY_NS);
            }
        }
    }
}
