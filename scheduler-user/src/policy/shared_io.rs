//! Tasks sharing raised threads' I/O contexts (`CLONE_IO`), counted per stream: each stays in
//! the kernel's table of raised threads for as long as its raise.

use abiss_proto::StreamId;
use std::collections::HashMap;

/// Tasks sharing a raised thread's I/O context (`CLONE_IO`) that a stream's raises together may
/// have noted in the kernel's table of raised threads. Such a task stays in that table as long
/// as the raise (putting it back alone would put back the raised thread), the table is every
/// user's, and a stream may have
/// [`MAX_RAISED_PER_STREAM`](super::raise::MAX_RAISED_PER_STREAM) raised threads: the eBPF side's own
/// bound per raise (`MAX_SHARED_IO_TASKS_PER_RAISE`) alone would let one stream note 512. With
/// it, every stream's raised threads and noted tasks fit the table together.
pub(crate) const MAX_SHARED_IO_TASKS_PER_STREAM: u32 = 16;

/// The tasks sharing raised threads' I/O contexts noted so far, per raise: a stream's may not
/// pass [`MAX_SHARED_IO_TASKS_PER_STREAM`].
#[derive(Debug, Default)]
pub(crate) struct SharedIoTasks {
    /// By raised thread: the stream it is raised for, and the tasks noted under its raises
    /// since it was last restored.
    by_root: HashMap<u32, (StreamId, u32)>,
}

impl SharedIoTasks {
    /// One more task noted under the raise of thread `root` for `stream`. False once the
    /// stream's raises together have more than the bound: the raise is then to be dropped
    /// (and [`Self::forget`] called with it).
    pub(crate) fn note(&mut self, root: u32, stream: StreamId) -> bool {
        let noted = self.by_root.entry(root).or_insert((stream, 0));
        // A thread raised for another stream now keeps the tasks noted under its earlier
        // raise (they stay in the table until it is restored): they count for the new one.
        noted.0 = stream;
        noted.1 = noted.1.saturating_add(1);
        self.of_stream(stream) <= MAX_SHARED_IO_TASKS_PER_STREAM
    }

    /// Tasks noted under the raises for `stream`.
    #[must_use]
    pub(crate) fn of_stream(&self, stream: StreamId) -> u32 {
        self.by_root
            .values()
            .filter(|(of, _)| *of == stream)
            .fold(0, |sum, (_, count)| sum.saturating_add(*count))
    }

    /// Thread `root`'s raise ended: the tasks noted under it left the table with it.
    pub(crate) fn forget(&mut self, root: u32) {
        self.by_root.remove(&root);
    }
}

#[cfg(test)]
mod tests {
    use super::{SharedIoTasks, StreamId, MAX_SHARED_IO_TASKS_PER_STREAM};
    use proptest::prelude::*;

    proptest! {
        /// Whatever the order of tasks noted and raises ended over a few streams, a stream's
        /// count is what its live raises noted, and noting one more past the bound says so
        /// (the daemon then drops that raise and forgets it): no stream holds more.
        #[test]
        fn a_streams_raises_never_hold_more_than_the_bound(
            steps in proptest::collection::vec((0u32..8, 0u64..3, proptest::bool::weighted(0.05)), 1..600),
        ) {
            let mut tasks = SharedIoTasks::default();
            let mut model = std::collections::HashMap::<u32, (StreamId, u32)>::new();
            for (root, number, ends) in steps {
                let stream = StreamId(number);
                if ends {
                    tasks.forget(root);
                    model.remove(&root);
                    continue;
                }
                let within = tasks.note(root, stream);
                let noted = model.entry(root).or_insert((stream, 0));
                noted.0 = stream;
                noted.1 += 1;
                let of_stream: u32 = model.values().filter(|(s, _)| *s == stream).map(|(_, c)| c).sum();
                prop_assert_eq!(tasks.of_stream(stream), of_stream);
                prop_assert_eq!(within, of_stream <= MAX_SHARED_IO_TASKS_PER_STREAM);
                if !within {
                    tasks.forget(root);
                    model.remove(&root);
                }
                prop_assert!(tasks.of_stream(stream) <= MAX_SHARED_IO_TASKS_PER_STREAM);
            }
        }
    }
}
