//! A thread raised while its id still names an earlier raise in the table: the earlier thread
//! exited and the id came round again before that raise was let go (it goes when it idles out,
//! or when its stream needs the room). Thread ids wrap at `pid_max`, 32768 on many systems, and
//! any user can make them wrap in a few seconds of forks.
//!
//! What the kernel counted under the id (reads of other files, reads of the stream's file,
//! tasks sharing the I/O context) was the earlier thread's. Kept for the new one, the new
//! thread's user would pay for the earlier thread's reads, and go into debt for them (another
//! user could make that happen on purpose: read much of other files at real time in a raised
//! thread, exit, and let the id come round to someone else's player), and the new raise could
//! be dropped for the earlier one's bounds. So the earlier raise ends here, charged to its own
//! user for what it read and did not pay for, and the new raise starts with fresh counts.

use abiss_os::ioprio;
use abiss_proto::StreamId;
use log::warn;

use super::task::task_identity;
use super::{RaiseFor, ReaderRaises};
use crate::kernel::events::Reader;
use crate::policy::raise::TaskId;
use crate::raise::forks::ForkHook;

/// The thread of `reader`'s event, with its start time, if its id names it still (its user and
/// process are the event's); `None` if it is gone or is another thread.
pub(super) fn reader_task(reader: &Reader, stream: StreamId) -> Option<TaskId> {
    let pid = reader.pid;
    match task_identity(pid) {
        Ok(Some(identity)) if identity.uid == reader.uid && identity.tgid == reader.tgid => {
            Some(identity.task)
        }
        Ok(None) => None, // gone already
        _ => {
            warn!("stream {stream}: thread {pid} is not the reader of the event; not raised");
            None
        }
    }
}

impl ReaderRaises {
    /// Thread `task` (the reader of `reader`'s event) was just raised from `current` to
    /// `target` for `stream`, and followed as `followed` (previous, applied, file tag). Its id
    /// must still name that thread, and not another that took the id since: then how it is
    /// followed now. Otherwise it is put back, and `None`.
    pub(super) fn confirm_reader(
        &mut self,
        reader: &Reader,
        task: TaskId,
        RaiseFor { stream, file_tag }: RaiseFor,
        (current, target): (u16, u16),
        followed: (u16, u16, u64),
        hook: &mut dyn ForkHook,
    ) -> Option<(u16, u16, u64)> {
        let pid = reader.pid;
        match task_identity(pid) {
            Ok(Some(identity)) if identity.task == task => {}
            Ok(None) => {
                self.not_raised(pid, hook); // gone already: nothing to restore
                return None;
            }
            _ => {
                let _ = ioprio::set(pid, current);
                warn!("stream {stream}: thread {pid} is not the reader of the event; put back");
                self.not_raised(pid, hook);
                return None;
            }
        }
        let fresh = (current, target, file_tag);
        match self.end_raise_of_earlier_thread(task, fresh, hook) {
            Ok(false) => Some(followed),
            Ok(true) => Some(fresh),
            Err(error) => {
                let _ = ioprio::set(pid, current);
                warn!("stream {stream}: cannot follow thread {pid}'s forks ({error}); put back");
                self.not_raised(pid, hook);
                None
            }
        }
    }

    /// If the table's raise under `task`'s id is another thread's, that raise ends and `task`
    /// is followed afresh as `fresh`: whether it was. The error is the follow's.
    fn end_raise_of_earlier_thread(
        &mut self,
        task: TaskId,
        fresh: (u16, u16, u64),
        hook: &mut dyn ForkHook,
    ) -> Result<bool, String> {
        if self
            .table
            .get(task.pid)
            .is_none_or(|earlier| earlier.task == task)
        {
            return Ok(false);
        }
        let earlier = self.table.take_thread(task.pid);
        // Before the counts go: what the earlier thread read is on its own user.
        self.note_owed(&earlier);
        self.forks.follow_afresh(task.pid, fresh, hook)?;
        Ok(true)
    }
}
