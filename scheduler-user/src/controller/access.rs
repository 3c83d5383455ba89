//! The controller's answers to what readers do: their reads, faults and misses of attached
//! files (routed to the right stream of a file), a player about to start, a position told by
//! the application, a raised thread's fork, and a finished load.

use std::collections::HashMap;

use abiss_proto::{Refusal, StreamId, StreamTarget};
use log::warn;
use scheduler_common::{AbissLevel, MonotonicNs};

use super::Controller;
use crate::kernel::events::{Access, Fork, Reader, StreamAccess};
use crate::kernel::tracer::BlockTracer;
use crate::policy::burst::BurstAllowance;
use crate::policy::playout::{PlayoutBuffer, ReaderWait, WindowAction};
use crate::policy::raise::{stream_allowance_kib, OWN_FILE_SLACK_KIB};
use crate::policy::shared_file::route;
use crate::raise::{RaiseFor, ReaderRaises, StreamBounds};
use crate::stream::prefetch::{JobKind, LoadDone, LoadOutcome};
use crate::stream::table::StreamTable;
use crate::stream::writeback::{AheadByUser, Recording};
use crate::stream::Stream;

/// What a raise for `stream` is for.
pub(super) fn raise_for(stream: &Stream) -> RaiseFor {
    RaiseFor {
        stream: stream.id,
        file_tag: stream.file_tag,
    }
}

/// The streams and their owners' start-up allowances, as the policing of raises sees them
/// at `now`.
pub(super) struct RaiseBounds<'a> {
    pub(crate) streams: &'a StreamTable,
    pub(crate) burst: &'a mut BurstAllowance,
    pub(crate) now: MonotonicNs,
}

impl StreamBounds for RaiseBounds<'_> {
    fn admitted(&self, stream: StreamId, since: MonotonicNs) -> Option<(u128, u64)> {
        self.streams
            .get(stream)
            .map(|s| (s.rates.earned(since, self.now), s.granted.buffer.0))
    }

    fn charge(&mut self, uid: u32, kib: u64) {
        self.burst.charge(uid, kib.saturating_mul(1024), self.now);
    }

    fn debt_kib(&self, uid: u32) -> u64 {
        self.burst.debt(uid, self.now).div_ceil(1024)
    }
}

/// KiB a stream's raises together may read of its file at real time: its buffer, what its
/// rates earned since it was attached, and the readahead slack (`policy::stray`).
pub(super) fn own_file_allowance_kib(stream: &Stream, now: MonotonicNs) -> u64 {
    stream_allowance_kib(
        stream.rates.earned(MonotonicNs::ZERO, now),
        stream.granted.buffer.0,
        OWN_FILE_SLACK_KIB,
    )
}

impl Controller {
    /// Charges their users for what ended raises read of other files and did not pay for.
    pub(super) fn charge_owed(&mut self, now: MonotonicNs) {
        charge_owed(&mut self.raises, &mut self.burst, now);
    }
}

/// [`Controller::charge_owed`], for callers that hold other parts of the controller. Called
/// right after whatever may end raises, so that the next raise knows who owes.
fn charge_owed(raises: &mut ReaderRaises, burst: &mut BurstAllowance, now: MonotonicNs) {
    for (uid, kib) in raises.take_owed() {
        burst.charge(uid, kib.saturating_mul(1024), now);
    }
}

/// Raises `reader` for `stream` after a miss, unless its user owes for real-time reads (a
/// raise that ended before its reads of other files were paid for): then no thread of theirs
/// is raised until their start-up allowance has come back that far (`policy::stray`).
fn raise_after_miss(
    (raises, burst, hook): (&mut ReaderRaises, &mut BurstAllowance, &mut BlockTracer),
    (stream, reader): (&Stream, &Reader),
    when: (MonotonicNs, AbissLevel),
) {
    let (at, _) = when;
    if burst.in_debt(reader.uid, at) {
        log::debug!(
            "stream {}: thread {} not raised: uid {} owes for real-time reads",
            stream.id,
            reader.pid,
            reader.uid
        );
        return;
    }
    raises.on_miss(raise_for(stream), reader, when, stream.owner_uid, hook);
    // Making room for the raise may have let go of raises whose threads are gone.
    charge_owed(raises, burst, at);
}

/// The readers of streams that ended, for a few seconds: their reads still on their way
/// from the kernel when their stream ended are theirs, not the file's other streams'. A
/// viewer's last reads, handled after `abissctl run` detached its stream, went to another
/// viewer's stream still waiting for its player, and dragged its window away.
#[derive(Debug, Default)]
pub(super) struct DepartedReaders {
    /// Process → when its stream ended.
    ended: HashMap<u32, MonotonicNs>,
}

impl DepartedReaders {
    /// How long a departed reader's earlier reads are recognised.
    const KEEP_NS: u64 = 5_000_000_000;
    /// Processes remembered at most.
    const MAX: usize = 4096;

    /// The processes `readers` read a stream that ended at `now`.
    pub(super) fn note(&mut self, readers: impl Iterator<Item = u32>, now: MonotonicNs) {
        self.ended
            .retain(|_, at| now.saturating_since(*at) < Self::KEEP_NS);
        for tgid in readers {
            if self.ended.len() < Self::MAX {
                self.ended.insert(tgid, now);
            }
        }
    }

    /// Whether an access by process `tgid` at `at` came before its stream ended.
    fn before_leaving(&self, tgid: u32, at: MonotonicNs) -> bool {
        self.ended.get(&tgid).is_some_and(|ended| at <= *ended)
    }
}

/// A reader of `stream` waited for the disk: a miss, unless the stream is still loading its
/// first window (a player started at once, as `abissctl run --preroll` does, waits for its
/// start there) or the window a seek asked for (the reader's own jump: its new data cannot be
/// in memory yet). Neither is a miss; the reader is raised either way.
fn count_wait(stream: &mut Stream) {
    match stream.playout.reader_wait() {
        ReaderWait::Start => {
            log::debug!("stream {}: a reader waits for the first window", stream.id);
        }
        ReaderWait::Seek => {
            log::debug!("stream {}: a reader waits for a seek's refill", stream.id);
            stream.seek_waits += 1;
        }
        ReaderWait::Miss => stream.misses += 1,
    }
}

/// Moves `stream`'s window as its reader moved (`step`), refilled from the allowance if the
/// move was a seek; a stream attached with a preroll prerolls again from the allowance once
/// its reader reads on from where it sought.
fn moved(
    burst: &mut BurstAllowance,
    stream: &mut Stream,
    now: MonotonicNs,
    step: impl FnOnce(&mut PlayoutBuffer) -> Vec<WindowAction>,
) -> Vec<WindowAction> {
    let seeks = stream.playout.seeks();
    let mut actions = step(&mut stream.playout);
    if stream.playout.seeks() > seeks {
        actions.extend(fill_from_allowance(burst, stream, now));
    } else if let Some(preroll) = stream.granted.preroll {
        let (id, uid) = (stream.id, stream.owner_uid);
        actions.extend(stream.playout.preroll_after_seek(preroll.0, |wanted| {
            let granted = burst.grant(uid, wanted, now);
            log::debug!(
                "stream {id}: prerolled {granted} of {wanted} bytes from the allowance after a seek"
            );
            granted
        }));
    }
    actions
}

/// Fills the window at once as far as the owner's start-up allowance covers what the banked
/// credit does not. After a seek: a seek is a burst, bounded per user like a start, not a
/// window left thin until the credit comes back at the rate. After a buffer grew: the credit
/// only keeps pace with the reader, so without it the larger window would never fill.
pub(super) fn fill_from_allowance(
    burst: &mut BurstAllowance,
    stream: &mut Stream,
    now: MonotonicNs,
) -> Vec<WindowAction> {
    let wanted = stream.playout.refill_shortfall();
    if wanted == 0 {
        return Vec::new();
    }
    let granted = burst.grant(stream.owner_uid, wanted, now);
    log::debug!(
        "stream {}: filled {granted} of {wanted} bytes from the allowance",
        stream.id
    );
    stream.playout.grant_credit(granted, now)
}

impl Controller {
    /// `peer_uid`'s thread `tid` is about to read stream `stream`: raised now, as a miss would
    /// raise it (the same checks: the thread must be the peer's user's).
    pub(crate) fn reader_starts(
        &mut self,
        peer_uid: u32,
        stream: StreamId,
        tid: u32,
        now: MonotonicNs,
    ) -> Result<bool, Refusal> {
        let id = self.owned_stream(peer_uid, &StreamTarget::Id(stream))?;
        let Some(stream) = self.streams.get(id) else {
            return Err(Refusal::NotAttached {
                what: format!("stream {id}"),
            });
        };
        let when = (now, stream.level);
        let owner = stream.owner_uid;
        // Not raised while its user owes for real-time reads (see `raise_after_miss`), but
        // still the stream's reader.
        let direct = stream.kind.recording().is_some_and(Recording::is_direct);
        let raising = (
            raise_for(stream),
            !self.burst.in_debt(peer_uid, now),
            direct,
        );
        let hook = &mut self.tracer;
        let Some(reader) = self
            .raises
            .on_reader_start(raising, (tid, peer_uid), when, owner, hook)
        else {
            return Ok(false);
        };
        // Making room for the raise may have let go of raises whose threads are gone.
        self.charge_owed(now);
        // Its process is the stream's reader from its first read on: where a file has several
        // streams, a viewer's first read is a jump to where it starts, which would otherwise
        // go to the first stream still waiting for its player (another viewer's).
        if let Some(stream) = self.streams.get_mut(id) {
            stream.saw_reader(reader.tgid, reader.command, now);
        }
        Ok(reader.raised)
    }

    /// The application's explicit playout point; `at` is when the application was there.
    pub(crate) fn position(
        &mut self,
        peer_uid: u32,
        id: StreamId,
        offset: u64,
        at: MonotonicNs,
        now: MonotonicNs,
    ) {
        let Some(stream) = self.streams.get_mut(id) else {
            return;
        };
        if peer_uid != 0 && stream.owner_uid != peer_uid {
            return;
        }
        if !stream.newer_evidence(at) {
            log::debug!("stream {id}: position {offset} is older than a read seen since");
            return;
        }
        log::debug!("stream {id}: position {offset}");
        let actions = moved(&mut self.burst, stream, now, |playout| {
            playout.on_position(offset, now)
        });
        Self::execute(&mut self.prefetch, stream, actions);
    }

    /// A task read, faulted on or missed pages of an attached file, or queued or completed a
    /// request on it.
    pub(crate) fn on_access(&mut self, event: StreamAccess, now: MonotonicNs) {
        let reader = &event.reader;
        if self.departed.before_leaving(reader.tgid, event.at) {
            return;
        }
        // The event names the file (its tag); which of the file's streams it belongs to
        // depends on who reads where.
        let at = match &event.access {
            Access::Read(range) | Access::Fault(range) | Access::Miss(range) => Some(range),
            _ => None,
        };
        let sharing = self.streams.sharing(event.file_tag, reader.tgid);
        let Some(id) = route(&sharing, reader.uid, at) else {
            return;
        };
        let Some(stream) = self.streams.get_mut(id) else {
            return;
        };
        // Another user may read the file, but its reads are not the owner's playout: they
        // neither move the window (a jump would burn the owner's credit) nor show in the
        // owner's list. Root's streams follow any reader.
        if stream.owner_uid != 0 && reader.uid != stream.owner_uid {
            return;
        }
        stream.saw_reader(reader.tgid, reader.command.clone(), now);
        if stream.kind.is_recording() {
            // A recording has no window to move; its writer is not raised.
            return;
        }
        if let Err(error) = self.tracer.note_reader() {
            warn!("cannot follow the io_uring requests of stream readers: {error}");
        }
        log::debug!(
            "stream {}: {:?} by {} ({})",
            stream.id,
            event.access,
            reader.tgid,
            reader.pid
        );
        let level = stream.level;
        if matches!(
            event.access,
            Access::Miss(_) | Access::Filled | Access::QueuedLow
        ) {
            // Raise the reader first: the reads it waits for now are being queued.
            let raising = (&mut self.raises, &mut self.burst, &mut self.tracer);
            raise_after_miss(raising, (stream, reader), (event.at, level));
        }
        let actions = match event.access {
            Access::Miss(range) => {
                // The window refills from where the reader is (on_read treats a miss outside
                // the window as a jump).
                let actions = if stream.newer_evidence(event.at) {
                    moved(&mut self.burst, stream, now, |playout| {
                        playout.on_read(range, now)
                    })
                } else {
                    Vec::new()
                };
                // Counted once the window moved: a miss that jumped waits for its refill.
                count_wait(stream);
                actions
            }
            Access::Filled => {
                // A miss, on a kernel that does not say where (the reader is raised above):
                // count it; the pages may be readahead past it, so the window stays (its reads
                // move it).
                count_wait(stream);
                return;
            }
            Access::QueuedLow => {
                // A reader's request queued below the stream's level (direct I/O, or
                // readahead of a miss): it is raised above; where it reads is told by its
                // reads.
                return;
            }
            Access::UringComplete { .. } => {
                stream.uring_requests += 1;
                self.raises.touch(reader.pid, stream.id, now);
                return;
            }
            Access::Read(range) | Access::Fault(range) => {
                self.raises.touch(reader.pid, stream.id, now);
                if !stream.newer_evidence(event.at) {
                    return;
                }
                moved(&mut self.burst, stream, now, |playout| {
                    playout.on_read(range, now)
                })
            }
        };
        Self::execute(&mut self.prefetch, stream, actions);
    }

    /// A raised thread made a task, which started with its raise.
    pub(crate) fn on_fork(&mut self, fork: &Fork) {
        let now = abiss_os::clock::monotonic_now();
        // What an over-bound drop leaves owed counts before the next raise is decided.
        let burst = &self.burst;
        let owes = |uid: u32| burst.in_debt(uid, now);
        self.raises.on_fork(fork, &mut self.tracer, &owes);
        self.charge_owed(now);
    }

    /// A load finished.
    pub(crate) fn loaded(&mut self, done: LoadDone) {
        if done.kind == JobKind::LockRing {
            return self.ring_locked(done);
        }
        log::debug!(
            "stream {}: {:?} {:?}",
            done.stream,
            done.range,
            done.outcome
        );
        // A write-back's end may allocate ahead too: within the user's room.
        let mut ahead = match self.streams.get(done.stream) {
            Some(stream) if stream.kind.is_recording() && done.kind != JobKind::Allocate => {
                self.streams.allocated_ahead()
            }
            _ => AheadByUser::default(),
        };
        let Some(stream) = self.streams.get_mut(done.stream) else {
            return;
        };
        let uid = stream.owner_uid;
        if let Some(recording) = stream.kind.recording_mut() {
            let failed = match &done.outcome {
                LoadOutcome::Failed(error) => Some(error),
                LoadOutcome::Loaded | LoadOutcome::Cancelled => None,
            };
            if done.kind == JobKind::Allocate {
                if let Some(error) = failed {
                    recording.allocation_failed(stream.id, error);
                }
                return;
            }
            let now = abiss_os::clock::monotonic_now();
            let actions = ahead.with_room(uid, recording, |r| {
                r.written_back(stream.id, &done.range, failed, now)
            });
            let at = (stream.id, stream.level);
            recording.carry_out(&mut self.prefetch, at, &stream.file, actions);
            return;
        }
        match done.outcome {
            LoadOutcome::Loaded => {
                let actions = stream.playout.on_loaded(done.range, done.generation);
                Self::execute(&mut self.prefetch, stream, actions);
            }
            LoadOutcome::Cancelled => {}
            LoadOutcome::Failed(error) => {
                if let Some(since) = stream.log_load_failure(abiss_os::clock::monotonic_now()) {
                    warn!(
                        "stream {}: loading {:?} failed: {error} ({since} more failed since the last line; one a minute is logged)",
                        stream.id, done.range
                    );
                }
                stream.playout.on_failed(&done.range, done.generation);
            }
        }
    }
}
