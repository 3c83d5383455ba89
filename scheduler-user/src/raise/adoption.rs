//! A player's start raise, which the threads it makes as it starts keep; a direct recording's
//! writer's raise.
//!
//! `abissctl run` (and the libraries' open) raise a player's thread before it reads
//! ([`ReaderRaises::on_reader_start`]). Real players then read in threads they make
//! once they run (`GStreamer`'s streaming threads, mpv's demuxer): put back at their fork, as
//! every task of a raised thread is ([`crate::raise::forks`]), such a thread's first reads queued
//! below the stream and waited behind best-effort requests until it missed and was raised
//! again; that was most of those players' start-up stall under load.
//!
//! So a task made within [`ADOPTION_WINDOW_NS`] of a start raise, by the raised thread or by a
//! task adopted this way, is *adopted*: it keeps the raise as an raise of its own, as if it
//! had missed. It is recorded (a crash leaves nothing raised), policed like any raised reader
//! (its own real-time requests for other files, which its user pays for, and for the stream's
//! file beyond what the stream's rate and buffer allow), put back when it leaves the file idle
//! (so a decoder thread that never reads the file goes back after the idle time) and when the
//! stream ends. At most [`MAX_ADOPTED_PER_STREAM`] tasks per stream; later tasks are put back at
//! their fork as before.

use abiss_os::clock::monotonic_now;
use abiss_os::ioprio;
use log::debug;
use scheduler_common::{AbissLevel, MonotonicNs};

use super::task::task_identity;
use super::{RaiseFor, ReaderRaises};
use crate::kernel::events::{Fork, Reader};
use crate::policy::raise::Raise;
use crate::policy::stray::RaiseAccount;
use crate::raise::forks::ForkHook;

/// How long after its start raise a player's new tasks are its own: its start-up.
pub(crate) const ADOPTION_WINDOW_NS: u64 = 10_000_000_000;

/// Most tasks adopted per stream.
pub(crate) const MAX_ADOPTED_PER_STREAM: u64 = 32;

impl ReaderRaises {
    /// Adopts the task `fork` made, if it is a task of a player at its start (see the module)
    /// whose user does not owe (`owes`) for real-time reads (`policy::stray`); whether it was.
    pub(super) fn adopt(
        &mut self,
        fork: &Fork,
        hook: &mut dyn ForkHook,
        owes: &dyn Fn(u32) -> bool,
    ) -> bool {
        if fork.raise.shares_io_context {
            return false;
        }
        let Some(parent) = self.table.get(fork.raise.root) else {
            return false;
        };
        let Some(started_at) = parent.started_at else {
            return false;
        };
        if owes(parent.uid) {
            return false;
        }
        let stream = parent.stream;
        if fork.at.saturating_since(started_at) > ADOPTION_WINDOW_NS
            || self.adopted.get(&stream).copied().unwrap_or(0) >= MAX_ADOPTED_PER_STREAM
        {
            return false;
        }
        // The task must still be the one made, with the raise it was made with.
        let child = fork.child;
        let Ok(Some(identity)) = task_identity(child) else {
            return false;
        };
        // Adopted tasks count among their user's raises held at once, as raised threads do.
        if !self.table.user_has_room(identity.uid) {
            return false;
        }
        if ioprio::get(child).ok() != Some(fork.raise.applied) {
            return false;
        }
        let now = monotonic_now();
        let raise = Raise {
            task: identity.task,
            tgid: identity.tgid,
            last_access: now,
            raised_at: now,
            previous: fork.raise.previous,
            applied: fork.raise.applied,
            // Its own reads are counted from zero, so it has paid for none of them; they are
            // paid for by the user it runs as.
            uid: identity.uid,
            account: RaiseAccount::default(),
            // Only a player's start is adopted; a writer's raise is its own.
            writer: false,
            ..parent.clone()
        };
        // Followed as a raised thread of its own (policed, its own tasks followed), then
        // recorded; unrecorded, it is put back at once as before.
        if self.forks.follow(child, raise.followed_as(), hook).is_err() || !self.record_with(&raise)
        {
            return false;
        }
        self.table.insert(raise);
        *self.adopted.entry(stream).or_default() += 1;
        debug!(
            "stream {stream}: thread {} made {child} {} ms after its start raise; it keeps the raise",
            fork.parent,
            fork.at.saturating_since(started_at) / 1_000_000
        );
        true
    }
}

/// Why a thread is raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cause {
    /// It missed the page cache on the stream's file.
    Miss,
    /// The stream's owner said it is about to read the stream.
    ReaderStart,
    /// The owner of a direct recording said it is the recording's writer.
    DirectWriter,
}

/// A thread its stream's owner said is about to read the stream, as `/proc` shows it.
#[derive(Debug)]
pub(crate) struct StartingReader {
    /// Its process: the stream's reader from now on, so that the file's other streams do
    /// not take its first reads (a viewer's jump to where it starts playing).
    pub(crate) tgid: u32,
    /// The process's command.
    pub(crate) command: String,
    /// Whether it was raised now.
    pub(crate) raised: bool,
}

impl ReaderRaises {
    /// The stream's owner says thread `reader` is about to read the stream (a player that
    /// `abissctl run` starts, or the library's reading thread): raise it now, as a miss would,
    /// so that its first reads are not queued below the stream. The same checks, record,
    /// policing and idle restore as for a miss; not counted in the miss-to-raise latency. Not
    /// raised unless `may_raise` (its user owes for real-time reads), but named all the same.
    /// The first thread a `direct` recording names is its writer, kept until the stream ends
    /// ([`Raise::writer`]). `None` when the thread is gone or not the asking user's.
    pub(crate) fn on_reader_start(
        &mut self,
        (stream, may_raise, direct): (RaiseFor, bool, bool),
        (tid, uid): (u32, u32),
        when: (MonotonicNs, AbissLevel),
        owner_uid: u32,
        hook: &mut dyn ForkHook,
    ) -> Option<StartingReader> {
        // The thread must be the asking user's; its process comes from /proc.
        let Ok(Some(identity)) = task_identity(tid) else {
            return None;
        };
        if identity.uid != uid {
            debug!(
                "stream {}: thread {tid} is not uid {uid}'s; not raised",
                stream.stream
            );
            return None;
        }
        let reader = Reader {
            tgid: identity.tgid,
            pid: tid,
            uid,
            command: String::new(),
        };
        // One writer per recording is held: another thread its client names is raised as a
        // player's start is, and goes when idle.
        let other_writer = self
            .table
            .writer_of(stream.stream)
            .is_some_and(|writer| writer != tid);
        let cause = if direct && !other_writer {
            Cause::DirectWriter
        } else {
            Cause::ReaderStart
        };
        let raised = may_raise && self.raise(stream, &reader, when, owner_uid, hook, cause);
        Some(StartingReader {
            tgid: identity.tgid,
            command: identity.command,
            raised,
        })
    }
}
