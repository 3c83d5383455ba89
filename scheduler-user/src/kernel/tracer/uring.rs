//! The `io_uring` requests the programs follow (`URING_INFLIGHT`, and each user's count of them
//! in `URING_USERS`): dropped when they outlive any read of a stream, and forgotten with the
//! last attached file. The processes whose requests they follow (`FILE_READERS`) are swept on
//! a thread of their own (`reader_sweep`).

use aya::maps::HashMap;
use aya::maps::MapData;
use scheduler_common::{MonotonicNs, UringSubmission, MAX_URING_INFLIGHT, STALE_URING_NS};

use super::{BlockTracer, TracerError};
use scheduler_common::names::map;

impl BlockTracer {
    /// Drops the followed `io_uring` requests submitted before `now - STALE_URING_NS` (a
    /// poll or a read on a pipe or a socket that has not completed, or a request whose
    /// completion was not seen), and gives their users' room back; how many. Each user's
    /// stuck requests fill only that user's room (`MAX_URING_INFLIGHT_PER_USER`), and this
    /// lets a user have it back once their requests are old. What abissd gives back is counted
    /// in a map of its own (`URING_GIVEN`), which the programs only read: with one shared count,
    /// abissd's read and write lost the programs' atomic adds that came between the two, and
    /// the bound wore away.
    pub(super) fn sweep_stale_uring(&mut self, now: MonotonicNs) -> Result<usize, TracerError> {
        // The map keeps the kernel's plain nanoseconds: so does the cutoff.
        let cutoff = now.0.saturating_sub(STALE_URING_NS);
        let name = map::URING_INFLIGHT;
        let mut requests: HashMap<&mut MapData, u64, UringSubmission> = self.typed_map_mut(name)?;
        // The walk starts over from the first bucket when the key it stands on is deleted
        // meanwhile (the completion program deletes all the time): it is cut at one pass's
        // worth of steps, and what it saw twice counts once; the rest waits for the next sweep.
        let mut stale: Vec<(u64, u32)> = requests
            .iter()
            .take(MAX_URING_INFLIGHT as usize)
            .filter_map(Result::ok)
            .filter(|(_, submission)| submission.submitted_ns < cutoff)
            .map(|(req, submission)| (req, submission.uid))
            .collect();
        stale.sort_unstable();
        stale.dedup();
        // Only what this removes is given back: the completion program gives back what it
        // takes out itself.
        let removed: Vec<u32> = stale
            .iter()
            .filter(|(req, _)| requests.remove(req).is_ok())
            .map(|&(_, uid)| uid)
            .collect();
        self.give_back(&removed)?;
        Ok(removed.len())
    }

    /// Adds one to the given-back count (`URING_GIVEN`, which only abissd writes) of each of
    /// `uids`, once per appearance.
    fn give_back(&mut self, uids: &[u32]) -> Result<(), TracerError> {
        let mut given: HashMap<&mut MapData, u32, u64> = self.typed_map_mut(map::URING_GIVEN)?;
        for uid in uids {
            let count = given.get(uid, 0).unwrap_or(0);
            let _ = given.insert(uid, count.saturating_add(1), 0);
        }
        Ok(())
    }

    /// Forgets every followed `io_uring` request and reader, and every user's counts: no file
    /// is attached, and the completion program no longer looks.
    pub(super) fn forget_uring(&mut self) -> Result<(), TracerError> {
        self.forget_all::<u64, UringSubmission>(map::URING_INFLIGHT)?;
        self.forget_all::<u32, u64>(map::URING_USERS)?;
        self.forget_all::<u32, u64>(map::URING_GIVEN)?;
        // The sweeping thread writes what users are given back: it empties its maps itself.
        self.reader_sweep.forget();
        Ok(())
    }
}
