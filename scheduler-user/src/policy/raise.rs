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
        self.take_where(|u| !u.journal && now.saturating_since(u.last_access) >= idle_ns)
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
mod tests {
    use super::*;
    use proptest::prelude::*;
    use scheduler_common::ioprio;

    const BE4: u16 = ioprio::encode(ioprio::CLASS_BE, 4);
    const RT0: u16 = ioprio::encode(ioprio::CLASS_RT, 0);

    fn raise(pid: u32, stream: u64, last_access: u64) -> Raise {
        Raise {
            task: TaskId { pid, start_time: 7 },
            tgid: pid,
            stream: StreamId(stream),
            file_tag: stream,
            previous: BE4,
            applied: RT0,
            last_access: MonotonicNs(last_access),
            raised_at: MonotonicNs::ZERO,
            started_at: None,
            journal: false,
            uid: 1000,
            account: RaiseAccount::default(),
        }
    }

    /// A record keeps its times as the plain nanoseconds it always held, under the names it
    /// always had: a raised daemon reads its predecessor's records.
    #[test]
    fn a_record_keeps_its_times_as_nanoseconds() {
        let mut recorded = raise(3, 10, 40);
        recorded.raised_at = MonotonicNs(20);
        recorded.started_at = Some(MonotonicNs(10));
        recorded.uid = 0;
        let text = serde_json::to_string(&recorded).unwrap();
        for field in [
            r#""last_access_ns":40"#,
            r#""raised_ns":20"#,
            r#""started_ns":10"#,
        ] {
            assert!(text.contains(field), "{field} not in {text}");
        }
        assert_eq!(serde_json::from_str::<Raise>(&text).unwrap(), recorded);
        recorded.started_at = None;
        let text = serde_json::to_string(&recorded).unwrap();
        assert!(!text.contains("started_ns"), "{text}");
        assert_eq!(serde_json::from_str::<Raise>(&text).unwrap(), recorded);
    }

    #[test]
    fn a_raise_renewed_by_its_own_thread_keeps_what_it_paid_and_when_it_began() {
        let mut table = RaiseTable::new(5);
        let mut first = raise(7, 1, 10);
        first.raised_at = MonotonicNs(10);
        first.account = RaiseAccount {
            stray_kib: 300,
            own_kib: 200,
        };
        table.insert(first);
        // The same thread, raised again for the same file after it lowered its priority.
        let mut again = raise(7, 1, 50);
        again.raised_at = MonotonicNs(50);
        table.insert(again);
        let kept = table.get(7).unwrap();
        assert_eq!(
            (kept.raised_at, kept.account.stray_kib),
            (MonotonicNs(10), 300)
        );
        assert_eq!(kept.account.own_kib, 200);
        // Raised for another file: what it may read of that one grows from now, and the kernel
        // counts it afresh.
        let mut other = raise(7, 2, 60);
        other.raised_at = MonotonicNs(60);
        table.insert(other);
        let kept = table.get(7).unwrap();
        assert_eq!(
            (kept.raised_at, kept.account.stray_kib),
            (MonotonicNs(60), 300)
        );
        assert_eq!(kept.account.own_kib, 0);
        // Another thread that took the id: nothing of the first.
        let mut stranger = raise(7, 2, 70);
        stranger.task.start_time = 8;
        stranger.raised_at = MonotonicNs(70);
        table.insert(stranger);
        let kept = table.get(7).unwrap();
        assert_eq!(
            (kept.raised_at, kept.account),
            (MonotonicNs(70), RaiseAccount::default())
        );
    }

    #[test]
    fn a_best_effort_reader_is_raised_to_the_streams_level_and_never_lowered() {
        let level = |n| AbissLevel::new(n).expect("a level");
        assert_eq!(raised_priority(BE4, level(0)), Some(RT0));
        assert_eq!(raised_priority(0, level(0)), Some(RT0), "no class is BE/4");
        assert_eq!(raised_priority(RT0, level(0)), None);
        assert_eq!(raised_priority(RT0, level(3)), None, "never lowered");
        assert_eq!(
            raised_priority(ioprio::encode(ioprio::CLASS_RT, 4), level(1)),
            Some(ioprio::encode(ioprio::CLASS_RT, 2))
        );
        assert_eq!(
            raised_priority(BE4, level(6)),
            None,
            "BE/4 is level 6 already"
        );
        assert_eq!(
            raised_priority(ioprio::encode(ioprio::CLASS_IDLE, 0), level(6)),
            Some(BE4)
        );
    }

    proptest! {
        /// However many threads are offered for raises, in any order over a few streams, a
        /// stream never holds more than its share, and a thread raised for it stays raisable.
        #[test]
        fn a_stream_never_holds_more_raised_threads_than_its_share(
            offers in proptest::collection::vec((1u32..200, 1u64..4), 1..400),
        ) {
            let mut table = RaiseTable::new(1);
            for (pid, number) in offers {
                let stream = StreamId(number);
                if table.has_room(stream, pid, 1000) {
                    table.insert(raise(pid, number, 0));
                }
                let raised_here = table.get(pid).is_some_and(|u| u.stream == stream);
                prop_assert!(!raised_here || table.has_room(stream, pid, 1000));
                for stream in (1..4).map(StreamId) {
                    let raised = table.all().iter().filter(|u| u.stream == stream).count();
                    prop_assert!(raised <= MAX_RAISED_PER_STREAM);
                }
            }
        }
    }

    proptest! {
        /// However many threads of a few users are offered for raises over many streams, no
        /// user but root holds more than [`MAX_RAISED_PER_USER`] at once; root is not bound.
        #[test]
        fn a_user_never_holds_more_raised_threads_than_the_bound(
            offers in proptest::collection::vec((1u32..400, 1u64..8, 0u32..3, proptest::bool::weighted(0.1)), 1..600),
        ) {
            let mut table = RaiseTable::new(1);
            for (pid, number, uid, ends) in offers {
                if ends {
                    table.take_thread(pid);
                    continue;
                }
                if table.has_room(StreamId(number), pid, uid) {
                    let mut raise = raise(pid, number, 0);
                    raise.uid = uid;
                    table.insert(raise);
                }
                for uid in 1..3 {
                    let held = table.all().iter().filter(|u| u.uid == uid).count();
                    prop_assert!(held <= MAX_RAISED_PER_USER);
                }
            }
        }
    }

    #[test]
    fn root_is_not_bound_by_the_users_cap() {
        let mut table = RaiseTable::new(1);
        for pid in 0..200u32 {
            let stream = u64::from(pid / 30);
            assert!(table.has_room(StreamId(stream), pid, 0));
            let mut raise = raise(pid, stream, 0);
            raise.uid = 0;
            table.insert(raise);
        }
        assert_eq!(table.all().len(), 200);
        assert!(
            table.user_has_room(1000),
            "root's raises are not user 1000's"
        );
    }

    #[test]
    fn only_the_owner_or_roots_streams_raise_a_reader() {
        assert!(may_raise(1000, 1000));
        assert!(may_raise(0, 1000));
        assert!(!may_raise(1000, 1001));
        assert!(
            !may_raise(1000, 0),
            "a user's stream cannot be used on root's tasks"
        );
    }

    #[test]
    fn idle_upgrades_expire_and_accesses_keep_them() {
        let mut table = RaiseTable::new(5_000);
        table.insert(raise(1, 10, 0));
        table.insert(raise(2, 10, 0));
        table.touch(2, StreamId(10), MonotonicNs(4_000));
        table.touch(1, StreamId(11), MonotonicNs(4_000)); // another stream's file does not keep it
        assert_eq!(table.ns_until_next_expiry(MonotonicNs(4_000)), Some(1_000));
        let idle = table.take_idle(MonotonicNs(5_000));
        assert_eq!(idle.iter().map(|u| u.task.pid).collect::<Vec<_>>(), [1]);
        assert!(table.get(2).is_some());
        assert_eq!(table.take_stream(StreamId(10)).len(), 1);
        assert_eq!(table.ns_until_next_expiry(MonotonicNs(5_000)), None);
    }

    #[test]
    fn a_second_raise_keeps_the_first_previous_priority() {
        let mut table = RaiseTable::new(5_000);
        table.insert(raise(1, 10, 0));
        let mut again = raise(1, 11, 10);
        again.previous = RT0;
        table.insert(again);
        assert_eq!(table.get(1).unwrap().previous, BE4);
        assert_eq!(table.get(1).unwrap().stream, StreamId(11));
        // A new thread with a reused pid is a different task: its own previous priority.
        let mut reused = raise(1, 12, 20);
        reused.task.start_time = 99;
        reused.previous = 0;
        table.insert(reused);
        assert_eq!(table.get(1).unwrap().previous, 0);
    }

    #[test]
    fn repeated_misses_suggest_a_larger_buffer() {
        let buffer = abiss_proto::ByteSize(564 * 1024);
        assert_eq!(buffer_suggestion(2, buffer, None), None);
        let advice = buffer_suggestion(3, buffer, None).unwrap();
        assert!(advice.contains("--buffer 1128KiB"), "{advice}");
        // An automatic buffer is told to add a part of its own as large as it is now.
        let advice = buffer_suggestion(3, buffer, Some(0)).unwrap();
        assert!(advice.contains("--buffer auto+564KiB"), "{advice}");
        let advice = buffer_suggestion(3, buffer, Some(400 * 1024)).unwrap();
        assert!(advice.contains("--buffer auto+800KiB"), "{advice}");
    }

    proptest! {
        #[test]
        fn a_raise_is_always_upwards_and_lands_on_the_level(class in 0u8..4, level in 0u8..8, target in 0u8..8) {
            let current = ioprio::encode(class, level);
            let before = AbissLevel::from_kernel(class, level);
            let target = AbissLevel::new(target).expect("a level");
            match raised_priority(current, target) {
                Some(raised) => {
                    prop_assert!(before > target);
                    prop_assert_eq!(AbissLevel::of_ioprio(raised), target);
                }
                None => prop_assert!(before <= target),
            }
        }
    }
}
