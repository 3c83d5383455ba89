//! Automatic priority raises of real-time readers: which task to raise, and when to put its
//! priority back.
//!
//! ABISS's elevator could raise a queued request when the application came to need it. Here the
//! kernel tells the daemon that a task missed the page cache on an attached file; the daemon
//! raises that thread's I/O priority to the stream's level, so the reads it is about to wait
//! for (and its next misses) are served ahead of best-effort traffic. The raise lasts while
//! the task keeps reading the file; it is reverted when the stream ends or the task has been
//! idle for a while. This module decides; `crate::raise` touches the tasks.

use std::collections::HashMap;

use abiss_proto::StreamId;
use scheduler_common::{AbissLevel, MonotonicNs};

pub(crate) use super::shared_io::{SharedIoTasks, MAX_SHARED_IO_TASKS_PER_STREAM};
use super::stray::RaiseAccount;

/// A thread, named robustly against pid reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) struct TaskId {
    /// Thread id.
    pub(crate) pid: u32,
    /// Start time in clock ticks since boot (`/proc/<pid>/stat`, field 22).
    pub(crate) start_time: u64,
}

/// One raised thread.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Raise {
    /// The thread.
    pub(crate) task: TaskId,
    /// Its process.
    pub(crate) tgid: u32,
    /// The stream whose level it was raised to.
    pub(crate) stream: StreamId,
    /// The tag of that stream's file in the kernel maps: the block program counts the
    /// thread's real-time requests for the file so tagged as its own (0 in records written
    /// before files had tags: then the stream's id, which was the tag).
    #[serde(default)]
    pub(crate) file_tag: u64,
    /// Its I/O priority before (encoded), put back on revert.
    pub(crate) previous: u16,
    /// The priority set (encoded); a revert leaves the thread alone if it changed since.
    pub(crate) applied: u16,
    /// Last time it touched the stream's file.
    #[serde(rename = "last_access_ns", with = "recorded_time")]
    pub(crate) last_access: MonotonicNs,
    /// When it was raised: what it may read of the stream's file at the raised priority grows
    /// from then at the stream's rate.
    #[serde(default, rename = "raised_ns", with = "recorded_time")]
    pub(crate) raised_at: MonotonicNs,
    /// For a raise at a player's start, and the tasks adopted from it: when the player was
    /// raised. Tasks it makes in its start-up keep the raise (`raises::adoption`).
    #[serde(
        default,
        rename = "started_ns",
        skip_serializing_if = "Option::is_none",
        with = "recorded_time::optional"
    )]
    pub(crate) started_at: Option<MonotonicNs>,
    /// The journal thread of a recording's file system (`raises::journal`): it reads no
    /// file, so it is not put back for idleness, only when the recording ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) journal: bool,
    /// The writer thread of a direct recording, named by its client (`reader_starts`): kept,
    /// as the journal thread is, until its stream ends. Its raise is used only by its own
    /// real-time writes, and a direct write on ext4 can wait seconds in the journal without
    /// making one; put back for idleness then, every later write of the recording queued below
    /// the best-effort load (measured on the lab hdd: one 5 s journal wait, then 100 s for
    /// 10 MB). It is policed as any raise is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) writer: bool,
    /// The user the thread runs as, whose start-up allowance pays for its real-time reads
    /// beyond what its stream was admitted for ([`super::stray`]). Not recorded: only the
    /// running daemon polices.
    #[serde(skip)]
    pub(crate) uid: u32,
    /// What of its real-time reads was charged or held against its stream so far. Not
    /// recorded either.
    #[serde(skip)]
    pub(crate) account: RaiseAccount,
}

#[path = "raise_recorded_time.rs"]
mod recorded_time;

impl Raise {
    /// Whether it is put back after a while without use: not the journal's, not a direct
    /// recording's writer, which go with their stream.
    #[must_use]
    pub(crate) fn expires_when_idle(&self) -> bool {
        !self.journal && !self.writer
    }

    /// What the fork program is told of the raise: (previous, applied, file tag).
    #[must_use]
    pub(crate) fn followed_as(&self) -> (u16, u16, u64) {
        let tag = if self.file_tag == 0 {
            self.stream.0
        } else {
            self.file_tag
        };
        (self.previous, self.applied, tag)
    }
}

/// KiB of slack on a raised thread's real-time reads of its stream's file: the kernel's
/// readahead beyond what was asked.
pub(crate) const OWN_FILE_SLACK_KIB: u64 = 4 * 1024;

/// KiB a thread raised for a stream with `buffer_bytes` may read of the stream's file at the
/// raised priority, when the stream's rate earned `earned_bytes` since the raise
/// ([`super::rate_history::RateHistory::earned`]): the buffer, that, and `slack_kib` for
/// readahead beyond what was asked.
#[must_use]
pub(crate) fn stream_allowance_kib(earned_bytes: u128, buffer_bytes: u64, slack_kib: u64) -> u64 {
    let bytes = u128::from(buffer_bytes).saturating_add(earned_bytes);
    u64::try_from(bytes / 1024)
        .unwrap_or(u64::MAX)
        .saturating_add(slack_kib)
}

/// The priority to raise a thread at `current` (encoded ioprio) to for a stream at ABISS
/// `level`, or `None` if it is already served at that level or above.
#[must_use]
pub(crate) fn raised_priority(current: u16, level: AbissLevel) -> Option<u16> {
    if AbissLevel::of_ioprio(current) <= level {
        return None;
    }
    Some(level.to_ioprio())
}

/// Whether a reader run by `reader_uid` may be raised for a stream owned by `owner_uid`.
///
/// A user can only obtain for their own tasks what they could obtain by attaching the file
/// themselves; root's streams raise any reader, because root chose to serve that file.
#[must_use]
pub(crate) fn may_raise(owner_uid: u32, reader_uid: u32) -> bool {
    owner_uid == 0 || owner_uid == reader_uid
}

/// Misses after which a stream is told its buffer is too small: the first one or two are
/// explained by a start or a seek; more mean the reader outruns its window.
pub(crate) const MISSES_BEFORE_ADVICE: u64 = 3;

/// Advice for a stream whose readers keep missing the page cache (and so keep needing
/// raises): a buffer twice as large absorbs twice the jitter or burst. An automatic buffer
/// (`auto_app`: its application's part) already follows the disk's latency, so what is left is
/// the reader's own burst: the advice is an application part as large as the whole buffer now.
#[must_use]
pub(crate) fn buffer_suggestion(
    misses: u64,
    buffer: abiss_proto::ByteSize,
    auto_app: Option<u64>,
) -> Option<String> {
    (misses >= MISSES_BEFORE_ADVICE).then(|| match auto_app {
        None => format!(
            "{misses} reads missed the window; try a larger buffer (--buffer {})",
            abiss_proto::ByteSize(buffer.0.saturating_mul(2))
        ),
        Some(app) => format!(
            "{misses} reads missed the window; try a larger part of your own (--buffer auto+{})",
            abiss_proto::ByteSize(buffer.0.max(app.saturating_mul(2)))
        ),
    })
}

/// The raised threads, by thread id.
#[derive(Debug, Default)]
pub(crate) struct RaiseTable {
    raises: HashMap<u32, Raise>,
    idle_ns: u64,
}

/// Threads one stream may have raised at once. A player reads in a few threads; without a
/// bound, one user's `ReaderStarts` for thousands of threads would fill the kernel's table of
/// raised threads (`MAX_RAISED`, shared by all), and nobody else could be raised.
pub const MAX_RAISED_PER_STREAM: usize = 32;

/// Threads one user but root may have raised at once, over all their streams and the tasks
/// adopted at their players' starts: each raise may owe a little and read at real time until
/// abissd's next check, and the kernel's table of raised threads is every user's.
pub const MAX_RAISED_PER_USER: usize = 64;

impl RaiseTable {
    /// Whether thread `pid` of user `uid` may be raised for `stream`: it is raised for it
    /// already, or, not counting a raise it has, the stream has fewer than
    /// [`MAX_RAISED_PER_STREAM`] raised threads and the user fewer than [`MAX_RAISED_PER_USER`].
    #[must_use]
    pub(crate) fn has_room(&self, stream: StreamId, pid: u32, uid: u32) -> bool {
        let others = || self.raises.values().filter(|u| u.task.pid != pid);
        self.raises
            .get(&pid)
            .is_some_and(|u| u.stream == stream && u.uid == uid)
            || (others().filter(|u| u.stream == stream).count() < MAX_RAISED_PER_STREAM
                && (uid == 0 || others().filter(|u| u.uid == uid).count() < MAX_RAISED_PER_USER))
    }

    /// Whether user `uid` may have one more thread raised ([`MAX_RAISED_PER_USER`]; root
    /// always).
    #[must_use]
    pub(crate) fn user_has_room(&self, uid: u32) -> bool {
        uid == 0 || self.raises.values().filter(|u| u.uid == uid).count() < MAX_RAISED_PER_USER
    }

    /// An empty table whose raises expire after `idle_ns` without an access.
    #[must_use]
    pub(crate) fn new(idle_ns: u64) -> Self {
        Self {
            raises: HashMap::new(),
            idle_ns,
        }
    }

    /// Whether no thread is raised.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.raises.is_empty()
    }

    /// The raise of thread `pid`, if raised.
    #[must_use]
    pub(crate) fn get(&self, pid: u32) -> Option<&Raise> {
        self.raises.get(&pid)
    }

    /// The thread held as `stream`'s writer ([`Raise::writer`]), if any: a direct recording
    /// has one.
    #[must_use]
    pub(crate) fn writer_of(&self, stream: StreamId) -> Option<u32> {
        self.raises
            .values()
            .find(|u| u.writer && u.stream == stream)
            .map(|u| u.task.pid)
    }

    /// Records a raise. A thread raised again (for a second stream at a higher level, or
    /// after it lowered its own priority) keeps the priority it had before the first raise and
    /// what was charged for its reads of other files (the kernel keeps counting them); raised
    /// again for the same file, it also keeps when it was first raised, from which what it
    /// may read of the file grows, and what of the file was held against its stream (the
    /// kernel keeps counting those too, by the file's tag), so a raise renewed by its own
    /// thread lends nothing new. Raised for another file, the kernel counts that file afresh.
    pub(crate) fn insert(&mut self, mut raise: Raise) {
        if let Some(earlier) = self.raises.get(&raise.task.pid) {
            if earlier.task == raise.task {
                raise.previous = earlier.previous;
                raise.account.stray_kib = earlier.account.stray_kib;
                if earlier.followed_as().2 == raise.followed_as().2 {
                    raise.raised_at = earlier.raised_at;
                    raise.account.own_kib = earlier.account.own_kib;
                    // A recording's writer raised again for it (a miss) stays its writer.
                    raise.writer |= earlier.writer && earlier.stream == raise.stream;
                }
            }
        }
        self.raises.insert(raise.task.pid, raise);
    }

    /// A thread touched `stream`'s file: its raise stays.
    pub(crate) fn touch(&mut self, pid: u32, stream: StreamId, now: MonotonicNs) {
        if let Some(raise) = self.raises.get_mut(&pid) {
            if raise.stream == stream {
                raise.last_access = raise.last_access.max(now);
            }
        }
    }

    /// Removes and returns the raises idle since before `now - idle`.
    pub(crate) fn take_idle(&mut self, now: MonotonicNs) -> Vec<Raise> {
        let idle_ns = self.idle_ns;
        self.take_where(|u| u.expires_when_idle() && now.saturating_since(u.last_access) >= idle_ns)
    }

    /// Removes and returns the raises made for `stream`.
    pub(crate) fn take_stream(&mut self, stream: StreamId) -> Vec<Raise> {
        self.take_where(|u| u.stream == stream)
    }

    /// Removes and returns the raise of thread `pid`.
    pub(crate) fn take_thread(&mut self, pid: u32) -> Vec<Raise> {
        self.take_where(|u| u.task.pid == pid)
    }

    /// Removes and returns every raise.
    pub(crate) fn take_all(&mut self) -> Vec<Raise> {
        self.take_where(|_| true)
    }

    fn take_where(&mut self, mut pred: impl FnMut(&Raise) -> bool) -> Vec<Raise> {
        let pids: Vec<u32> = self
            .raises
            .values()
            .filter(|u| pred(u))
            .map(|u| u.task.pid)
            .collect();
        let mut taken: Vec<Raise> = pids
            .iter()
            .filter_map(|pid| self.raises.remove(pid))
            .collect();
        taken.sort_by_key(|u| u.task.pid);
        taken
    }

    /// Nanoseconds until the next raise goes idle, if any is active.
    #[must_use]
    pub(crate) fn ns_until_next_expiry(&self, now: MonotonicNs) -> Option<u64> {
        self.raises
            .values()
            .filter(|u| u.expires_when_idle())
            .map(|u| {
                u.last_access
                    .saturating_add(self.idle_ns)
                    .saturating_since(now)
            })
            .min()
    }

    /// Every raise, in thread order.
    #[must_use]
    pub(crate) fn all(&self) -> Vec<Raise> {
        let mut all: Vec<Raise> = self.raises.values().cloned().collect();
        all.sort_by_key(|u| u.task.pid);
        all
    }

    /// Thread `pid`'s raise has accounted its real-time reads as `account` says.
    pub(crate) fn set_account(&mut self, pid: u32, account: RaiseAccount) {
        if let Some(raise) = self.raises.get_mut(&pid) {
            raise.account = account;
        }
    }

    /// Whether any thread of process `tgid` is raised for `stream`.
    #[must_use]
    pub(crate) fn raises(&self, tgid: u32, stream: StreamId) -> bool {
        self.raises
            .values()
            .any(|u| u.tgid == tgid && u.stream == stream)
    }
}

#[cfg(test)]
mod allowance_tests {
    use super::stream_allowance_kib;
    use proptest::prelude::*;

    #[test]
    fn the_buffer_then_what_the_rate_earned() {
        assert_eq!(stream_allowance_kib(0, 1 << 20, 0), 1024);
        assert_eq!(stream_allowance_kib(2_048_000, 1 << 20, 0), 1024 + 2000);
        assert_eq!(stream_allowance_kib(u128::MAX, 0, 7), u64::MAX);
    }

    proptest! {
        #[test]
        fn never_shrinks_as_more_is_earned(earned in 0u128..1 << 80, buffer in 0u64..1 << 30, more in 0u128..1 << 60) {
            prop_assert!(stream_allowance_kib(earned, buffer, 0) <= stream_allowance_kib(earned + more, buffer, 0));
        }
    }
}

#[cfg(test)]
#[path = "raise_tests.rs"]
mod tests;
