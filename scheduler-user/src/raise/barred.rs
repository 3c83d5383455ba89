//! The threads barred from a stream's raises: each lost a raise for it by misusing it
//! ([`super::misuse`]), and is not raised for that stream again.
//!
//! A thread is named by its id and its start time, as a raise is: ids come round again (a
//! user gets any id by making tasks until they wrap), and a new thread that takes a barred
//! thread's id did nothing. Its start time is looked up in `/proc` only when an id that is
//! barred asks for a raise, so the others pay nothing for it.

use std::collections::HashMap;

use crate::policy::raise::TaskId;

use super::task_identity;

/// Threads of one stream barred from being raised again, at most: beyond it the stream's
/// readers are not raised at all.
pub(super) const MAX_BARRED_PER_STREAM: usize = 1024;

/// One stream's barred threads, and how many raises of it were dropped.
#[derive(Debug, Default)]
pub(super) struct BarredThreads {
    /// Thread id to the start time of the thread that had it when it was barred.
    threads: HashMap<u32, u64>,
    /// Raises of the stream dropped for misuse (`list`'s policed readers).
    dropped: u64,
}

impl BarredThreads {
    /// Thread `task` lost its raise: it is not raised for the stream again.
    pub(super) fn bar(&mut self, task: TaskId) {
        self.dropped = self.dropped.saturating_add(1);
        if self.threads.len() < MAX_BARRED_PER_STREAM || self.threads.contains_key(&task.pid) {
            self.threads.insert(task.pid, task.start_time);
        }
    }

    /// Whether thread `pid` may not be raised for the stream: it was barred (it is still the
    /// thread that had the id then, or `/proc` cannot tell), or the stream's readers lost more
    /// raises than are kept count of. An id that another thread has taken since is forgotten.
    pub(super) fn bars(&mut self, pid: u32) -> bool {
        if self.threads.len() >= MAX_BARRED_PER_STREAM {
            return true;
        }
        let Some(&started) = self.threads.get(&pid) else {
            return false;
        };
        match task_identity(pid) {
            Ok(Some(now)) if now.task.start_time != started => {
                self.threads.remove(&pid);
                false
            }
            _ => true,
        }
    }

    /// Raises of the stream dropped for misuse so far.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test's own thread, as `/proc` names it.
    fn this_thread() -> TaskId {
        let tid = nix::unistd::gettid().as_raw().unsigned_abs();
        task_identity(tid)
            .expect("/proc answers")
            .expect("this thread is there")
            .task
    }

    #[test]
    fn a_barred_thread_stays_barred_and_one_that_took_its_id_does_not() {
        let me = this_thread();
        let mut barred = BarredThreads::default();
        assert!(!barred.bars(me.pid));
        barred.bar(me);
        assert!(barred.bars(me.pid), "the thread that lost its raise");
        assert!(barred.bars(me.pid), "still, on a second look");

        // The same id, barred when an earlier thread had it (started a tick before this one).
        let mut earlier = BarredThreads::default();
        earlier.bar(TaskId {
            start_time: me.start_time.wrapping_sub(1),
            ..me
        });
        assert!(!earlier.bars(me.pid), "a thread that took a barred id");
        assert!(
            !earlier.bars(me.pid),
            "and the earlier thread's bar is gone"
        );
        assert_eq!(earlier.dropped(), 1, "the dropped raise still counts");
    }

    #[test]
    fn past_its_bound_a_stream_bars_every_reader_and_counts_every_drop() {
        let mut barred = BarredThreads::default();
        let mut pids = (1..).map(|pid| TaskId { pid, start_time: 1 });
        for task in pids.by_ref().take(MAX_BARRED_PER_STREAM) {
            barred.bar(task);
        }
        let next = pids.next().expect("one more");
        assert!(barred.bars(next.pid), "past the bound nobody is raised");
        barred.bar(next);
        assert_eq!(barred.threads.len(), MAX_BARRED_PER_STREAM);
        assert_eq!(
            barred.dropped(),
            u64::try_from(MAX_BARRED_PER_STREAM + 1).unwrap_or(0)
        );
    }
}
