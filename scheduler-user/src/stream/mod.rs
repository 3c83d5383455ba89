//! Streams: attached files with a granted rate, each with its playout buffer (the checks a
//! client's descriptor passes first are in `client_file`).

pub(crate) mod mapped_file;
pub(crate) mod prefetch;
pub(crate) mod recorder_ring;
pub(crate) mod table;
pub(crate) mod writeback;

use std::os::fd::AsFd;
use std::sync::Arc;

use abiss_proto::{
    AttachRequest, AutoBufferInfo, ByteSize, DeviceNumber, ReaderInfo, StreamId, StreamInfo,
    PAGE_BYTES,
};
use scheduler_common::{AbissLevel, FileKey, MonotonicNs};

use crate::policy::admission::StreamDemand;
use crate::policy::memory::locked_at_most;
use crate::policy::playout::{PlayoutBuffer, PlayoutShape, WindowAction};
use crate::policy::rate_history::RateHistory;
use crate::policy::recent_readers::RecentReaders;
use crate::policy::shared_file::FileStream;
use crate::policy::write_behind::WriteBehindShape;
use crate::serve::client_file::{AttachError, CheckedFile};
use crate::stream::prefetch::{MappedFile, PrefetchEngine};
use crate::stream::writeback::{AheadByUser, Recording};

/// Most streams at once, and per user.
pub(crate) const MAX_STREAMS: usize = 256;
/// Most streams one (non-root) user may hold.
pub(crate) const MAX_STREAMS_PER_USER: usize = 32;
/// Highest rate a stream may ask for (1 TB/s): anything above is a mistake, not a stream.
pub(crate) const MAX_RATE_BPS: u64 = 1_000_000_000_000;
/// Largest playout buffer (1 GiB): it is locked memory.
pub(crate) const MAX_BUFFER_BYTES: u64 = 1 << 30;
/// Largest start-up preroll (64 MiB): it is locked memory and a real-time burst.
pub(crate) const MAX_PREROLL_BYTES: u64 = 64 << 20;
/// How often a read stream whose window reaches the end of its file looks whether the file
/// grew (a recording being watched, by abiss or anything else).
pub(crate) const GROWTH_POLL_NS: u64 = 100_000_000;
/// A stream's failed loads are logged at most once in this long: a file truncated under its
/// stream fails every load of its window, as often as the window asks again.
pub(crate) const LOAD_FAILURE_LOG_NS: u64 = 60_000_000_000;

/// Validates stream parameters (the client checked them too; the daemon trusts no client);
/// the stream's level, as the wire's number is one.
pub(crate) fn check_parameters(request: &AttachRequest) -> Result<AbissLevel, AttachError> {
    let bad = |message: String| Err(AttachError::BadParameter(message));
    if request.rate.0 == 0 || request.rate.0 > MAX_RATE_BPS {
        return bad(format!(
            "a rate of {} B/s is outside 1 B/s to 1 TB/s",
            request.rate.0
        ));
    }
    if request.batch_pages == 0 {
        return bad("a batch must be at least one page".into());
    }
    let Some(level) = AbissLevel::new(request.priority) else {
        return bad(format!(
            "priority {} is outside 0 (highest) to 7",
            request.priority
        ));
    };
    let batch_bytes = u64::from(request.batch_pages) * PAGE_BYTES;
    if request.direct && !request.write {
        return bad(
            "only a recording is written directly: a direct stream must be a write stream".into(),
        );
    }
    if request.buffer_auto && request.write {
        return bad(
            "a recording's buffer is its dirty-memory bound: give it a size, not auto".into(),
        );
    }
    // An automatic buffer's own part may be anything: abissd adds two batches and more.
    if request.buffer.0 < 2 * batch_bytes && !request.buffer_auto {
        return bad(format!(
            "a buffer of {} is smaller than two batches of {} pages ({}); give a larger --buffer or a smaller --batch",
            request.buffer,
            request.batch_pages,
            ByteSize(2 * batch_bytes)
        ));
    }
    if request.buffer.0 > MAX_BUFFER_BYTES {
        return bad(format!(
            "a buffer of {} is more than the 1 GiB abissd locks for one stream",
            request.buffer
        ));
    }
    if let Some(preroll) = request.preroll {
        if request.write {
            return bad("a recording has no preroll: it reads nothing ahead".into());
        }
        if preroll.0 > MAX_PREROLL_BYTES {
            return bad(format!(
                "a preroll of {preroll} is more than the {} abissd loads ahead at a start",
                ByteSize(MAX_PREROLL_BYTES)
            ));
        }
    }
    Ok(level)
}

/// A stream being served.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Stream id.
    pub(crate) id: StreamId,
    /// Its ABISS level (what the client asked for, in `granted.priority`, checked).
    pub(crate) level: AbissLevel,
    /// Its file's tag in the kernel maps: the id of the file's first stream still attached
    /// when this one was (see [`crate::policy::shared_file`]).
    pub(crate) file_tag: u64,
    /// User that attached it.
    pub(crate) owner_uid: u32,
    /// Connection that attached it (non-persistent streams end with it).
    pub(crate) connection: u64,
    /// The request it was granted.
    pub(crate) granted: AttachRequest,
    /// The file's path.
    pub(crate) path: String,
    /// The file's identity.
    pub(crate) key: FileKey,
    /// The filesystem device.
    pub(crate) file_device: DeviceNumber,
    /// The disks serving it, sorted, never empty: one, or each disk a file system over
    /// several may put the file's data on (a btrfs's devices, an md or device-mapper array's
    /// members). Each is charged the stream's whole rate (see `disk::managed`).
    pub(crate) disks: Vec<DeviceNumber>,
    /// What its storage stack costs it that abiss cannot take away (see `FileDisk`).
    pub(crate) warnings: Vec<String>,
    /// File size.
    pub(crate) file_bytes: u64,
    /// The mapped file (window pages are locked in this mapping).
    pub(crate) file: Arc<MappedFile>,
    /// The window state machine.
    pub(crate) playout: PlayoutBuffer,
    /// Recent readers, bounded.
    pub(crate) readers: RecentReaders,
    /// Reads that missed the page cache where the window should have held their data.
    pub(crate) misses: u64,
    /// Reads that waited for the window a seek asked for.
    pub(crate) seek_waits: u64,
    /// `io_uring` requests submitted on the file by readers.
    pub(crate) uring_requests: u64,
    /// Time of the newest position evidence (a read seen in the kernel, or a position
    /// message).
    pub(crate) newest_evidence: MonotonicNs,
    /// When a failed load was last logged, and how many failed since without a log line.
    pub(crate) load_failures: (Option<MonotonicNs>, u64),
    /// Its start-up credit was cut by the owner's burst allowance.
    pub(crate) start_limited: bool,
    /// What it does with its file: played back, or recorded.
    pub(crate) kind: StreamKind,
    /// When a read stream at the end of its file last looked whether it grew.
    pub(crate) growth_checked_at: MonotonicNs,
    /// The rates it had: what it was admitted for since a raise of its reader.
    pub(crate) rates: RateHistory,
    /// How abissd sized the buffer from the disk, for `--buffer auto`.
    pub(crate) auto_buffer: Option<AutoBufferInfo>,
}

/// Who holds a stream: the user that attached it, over which connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamOwner {
    /// User id of the client.
    pub(crate) uid: u32,
    /// The client's connection (non-persistent streams end with it).
    pub(crate) connection: u64,
}

/// When a stream starts, and the credit its start-up burst was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StreamStart {
    /// When it starts.
    pub(crate) at: MonotonicNs,
    /// Credit granted for the first fill ([`crate::policy::burst`]); the credit limit is the
    /// most a stream can use.
    pub(crate) credit_bytes: u64,
}

impl Stream {
    /// What the stream was admitted to lock (`Controller::admit`): its buffer and a batch. A
    /// direct recording's ring is locked within it.
    #[must_use]
    pub(crate) fn admitted_locked_bytes(&self) -> u64 {
        locked_at_most(
            self.granted.buffer.0,
            u64::from(self.granted.batch_pages) * PAGE_BYTES,
        )
    }

    /// Whether `disk` is one of the disks serving it.
    #[must_use]
    pub(crate) fn is_on(&self, disk: DeviceNumber) -> bool {
        self.disks.contains(&disk)
    }

    /// The credit a stream may hold: the initial fill and one seek refill are immediate;
    /// beyond that the stream loads at its rate (see `CreditTimer`).
    #[must_use]
    pub(crate) fn credit_limit_bytes(granted: &AttachRequest) -> u64 {
        granted.buffer.0.saturating_mul(2)
    }

    /// Stream `id` of the file tagged `file_tag`, at `level` (`granted.priority`, checked),
    /// over `file` with the granted parameters; returns the initial fill.
    #[must_use]
    pub(crate) fn new(
        (id, file_tag, level): (StreamId, u64, AbissLevel),
        owner: StreamOwner,
        granted: AttachRequest,
        file: CheckedFile,
        disks: Vec<DeviceNumber>,
        mapped: Arc<MappedFile>,
        start: StreamStart,
    ) -> (Self, Vec<WindowAction>) {
        let batch_bytes = u64::from(granted.batch_pages) * PAGE_BYTES;
        let recording = granted.write.then(|| {
            let shape = WriteBehindShape {
                buffer_bytes: granted.buffer.0,
                batch_bytes,
                rate_bps: granted.rate.0,
                credit_limit_bytes: Self::credit_limit_bytes(&granted),
                preallocate: granted.preallocate,
            };
            let recording = Recording::new(shape, file.bytes, start.credit_bytes, start.at);
            if granted.direct {
                recording.direct(file.bytes)
            } else {
                recording
            }
        });
        let (playout, actions) = PlayoutBuffer::starting_with(
            PlayoutShape {
                // A write stream reads nothing ahead.
                file_bytes: if granted.write { 0 } else { file.bytes },
                buffer_bytes: granted.buffer.0,
                batch_bytes,
                rate_bps: granted.rate.0,
                credit_limit_bytes: Self::credit_limit_bytes(&granted),
            },
            start.credit_bytes,
            start.at,
        );
        let stream = Self {
            id,
            level,
            file_tag,
            owner_uid: owner.uid,
            connection: owner.connection,
            path: file.path,
            key: file.key,
            file_device: file.file_device,
            disks,
            warnings: Vec::new(),
            file_bytes: file.bytes,
            file: mapped,
            playout,
            readers: RecentReaders::default(),
            misses: 0,
            seek_waits: 0,
            uring_requests: 0,
            newest_evidence: MonotonicNs::ZERO,
            load_failures: (None, 0),
            start_limited: start.credit_bytes < Self::credit_limit_bytes(&granted),
            kind: recording.map_or(StreamKind::Playback, StreamKind::Recording),
            growth_checked_at: start.at,
            rates: RateHistory::new(granted.rate.0, start.at),
            auto_buffer: None,
            granted,
        };
        (stream, actions)
    }

    /// Gives the stream rate `rate` from `now` on (admitted by the caller); returns the
    /// window's moves.
    pub(crate) fn set_rate(
        &mut self,
        rate: abiss_proto::ByteRate,
        now: MonotonicNs,
    ) -> Vec<WindowAction> {
        self.granted.rate = rate;
        self.rates.set(rate.0, now);
        if let Some(recording) = self.kind.recording_mut() {
            recording.window.set_rate(rate.0, now);
        }
        self.playout.set_rate(rate.0, now)
    }

    /// A write stream looks at how far its writer is, and writes back and allocates what is
    /// due (within its user's room, `ahead`); nothing for a read stream.
    pub(crate) fn record(
        &mut self,
        prefetch: &mut PrefetchEngine,
        now: MonotonicNs,
        ahead: &mut AheadByUser,
    ) {
        let at = (self.id, self.level);
        let uid = self.owner_uid;
        if let Some(recording) = self.kind.recording_mut() {
            let actions = ahead.with_room(uid, recording, |r| r.poll(&self.file, now));
            recording.carry_out(prefetch, at, &self.file, actions);
        }
    }

    /// What the stream asks of its disk, for admission.
    #[must_use]
    pub(crate) fn demand(&self) -> StreamDemand {
        demand_of(&self.granted)
    }

    /// Whether position evidence from `at` is no older than what was seen (then it becomes
    /// the newest). Reads seen in the kernel and the application's position messages travel
    /// different ways; a message that arrives after a read it precedes (as after a seek) must
    /// not move the window back.
    pub(crate) fn newer_evidence(&mut self, at: MonotonicNs) -> bool {
        if at < self.newest_evidence {
            return false;
        }
        self.newest_evidence = at;
        true
    }

    /// A load failed at `now`: whether to log it (the first, then one per
    /// [`LOAD_FAILURE_LOG_NS`]), with the failures not logged since the last line.
    pub(crate) fn log_load_failure(&mut self, now: MonotonicNs) -> Option<u64> {
        let (logged_at, unlogged) = &mut self.load_failures;
        if logged_at.is_some_and(|at| now.saturating_since(at) < LOAD_FAILURE_LOG_NS) {
            *unlogged += 1;
            return None;
        }
        *logged_at = Some(now);
        Some(std::mem::take(unlogged))
    }

    /// The buffer is now `bytes` (`--buffer auto`, grown: admitted by the caller); returns the
    /// window's moves.
    pub(crate) fn set_buffer(&mut self, bytes: u64, now: MonotonicNs) -> Vec<WindowAction> {
        self.granted.buffer = ByteSize(bytes);
        let limit = Self::credit_limit_bytes(&self.granted);
        self.playout.set_buffer(bytes, limit, now)
    }

    /// A read stream whose window reaches the end of its file looks (every
    /// [`GROWTH_POLL_NS`]) whether the file grew, and extends its window into the new data.
    pub(crate) fn follow_growth(&mut self, now: MonotonicNs) -> Vec<WindowAction> {
        if self.kind.is_recording()
            || !self.playout.reaches_file_end()
            || now.saturating_since(self.growth_checked_at) < GROWTH_POLL_NS
        {
            return Vec::new();
        }
        self.growth_checked_at = now;
        let Ok(stat) = abiss_os::fs::stat_cached(self.file.fd().as_fd()) else {
            return Vec::new();
        };
        let bytes = stat.size.min(self.file.reach_bytes());
        if bytes <= self.file_bytes {
            return Vec::new();
        }
        log::debug!("stream {}: the file grew to {bytes} bytes", self.id);
        self.file_bytes = bytes;
        self.playout.file_grew(bytes, now)
    }

    /// Until a read stream at the end of its file looks again whether the file grew.
    #[must_use]
    pub(crate) fn ns_until_growth_check(&self, now: MonotonicNs) -> Option<u64> {
        (!self.kind.is_recording() && self.playout.reaches_file_end()).then(|| {
            self.growth_checked_at
                .saturating_add(GROWTH_POLL_NS)
                .saturating_since(now)
        })
    }

    /// The stream as routing among its file's streams sees it, for an access by `tgid`.
    #[must_use]
    pub(crate) fn as_shared(&self, tgid: u32) -> FileStream {
        let from = self.playout.app_point();
        let to = self
            .playout
            .requested_end()
            .max(from.saturating_add(self.granted.buffer.0));
        FileStream {
            id: self.id,
            owner_uid: self.owner_uid,
            level: self.level,
            recording: self.kind.is_recording(),
            window: self.playout.window_start().min(from)..to,
            known_reader: self.readers.contains(tgid),
            waiting_for_reader: self.readers.is_empty(),
        }
    }

    /// Notes a reader task.
    pub(crate) fn saw_reader(&mut self, pid: u32, comm: String, now: MonotonicNs) {
        self.readers.saw(pid, comm, now);
    }

    /// The stream as clients see it.
    #[must_use]
    pub(crate) fn info(&self) -> StreamInfo {
        let window = self.playout.window_start()..self.playout.requested_end();
        let mut readers: Vec<ReaderInfo> = self
            .readers
            .iter()
            .map(|(pid, comm)| ReaderInfo {
                pid,
                comm: comm.to_owned(),
                raised: false,
            })
            .collect();
        readers.sort_by_key(|r| r.pid);
        StreamInfo {
            id: self.id,
            owner_uid: self.owner_uid,
            path: self.path.clone(),
            file_device: self.file_device,
            disk: self.disks[0],
            disks: self.disks.clone(),
            warnings: self.warnings.clone(),
            inode: self.key.ino,
            file_bytes: self.file_bytes,
            rate: self.granted.rate,
            buffer: self.granted.buffer,
            batch_pages: self.granted.batch_pages,
            priority: self.granted.priority,
            persistent: self.granted.persistent,
            playout_point: self.playout.app_point(),
            window_start: window.start,
            loaded_end: window.end,
            resident_bytes: self.file.resident_bytes(&window).unwrap_or(0),
            locked_bytes: self.playout.locked_bytes(),
            credit_bytes: i64::try_from(
                self.kind
                    .recording()
                    .map_or_else(|| self.playout.credit_bytes(), |r| r.window.credit_bytes()),
            )
            .unwrap_or(i64::MAX),
            readers,
            misses: self.misses,
            seek_waits: self.seek_waits,
            prefetched_bytes: self.playout.prefetched_bytes(),
            raises: 0,
            uring_requests: self.uring_requests,
            suggestion: crate::policy::raise::buffer_suggestion(
                self.misses,
                self.granted.buffer,
                self.auto_buffer.as_ref().map(|auto| auto.app_bytes),
            ),
            start_limited: self.start_limited,
            policed: 0,
            recording: self.kind.recording().map(|r| r.info(&self.file)),
            buffer_auto: self.auto_buffer.clone(),
        }
    }
}

/// What a stream does with its file.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "one per stream (32 at most), the size of the Option<Recording> it replaced; a box would only add an allocation"
)]
pub(crate) enum StreamKind {
    /// Its readers read the file: abissd loads and locks a window ahead of them.
    Playback,
    /// Its writer writes the file: abissd writes back behind it, and `playout` has nothing to
    /// load (the file is not mapped).
    Recording(Recording),
}

impl StreamKind {
    /// The recording's window, if it is one.
    pub(crate) fn recording(&self) -> Option<&Recording> {
        match self {
            Self::Recording(recording) => Some(recording),
            Self::Playback => None,
        }
    }

    /// The recording's window to change, if it is one.
    pub(crate) fn recording_mut(&mut self) -> Option<&mut Recording> {
        match self {
            Self::Recording(recording) => Some(recording),
            Self::Playback => None,
        }
    }

    /// Whether it is a recording.
    pub(crate) fn is_recording(&self) -> bool {
        matches!(self, Self::Recording(_))
    }
}

/// What a stream of `request` asks of its disk, for admission: a recording's write-backs are
/// requests of the same size as a playback's loads, and the model prices them as writes.
#[must_use]
pub(crate) fn demand_of(request: &AttachRequest) -> StreamDemand {
    StreamDemand {
        write: request.write,
        ..StreamDemand::playback(
            request.rate.0,
            request.buffer.0,
            u64::from(request.batch_pages) * PAGE_BYTES,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(rate: u64, buffer: u64, batch: u32, priority: u8) -> AttachRequest {
        AttachRequest::read(
            abiss_proto::ByteRate(rate),
            ByteSize(buffer),
            batch,
            priority,
        )
    }

    #[test]
    fn parameters_are_checked_with_plain_sentences() {
        assert!(check_parameters(&request(1_000_000, 564 * 1024, 20, 0)).is_ok());
        let message = |r| check_parameters(&r).unwrap_err().to_string();
        assert!(message(request(0, 564 * 1024, 20, 0)).contains("rate"));
        assert!(message(request(1, 564 * 1024, 0, 0)).contains("batch"));
        assert!(message(request(1, 564 * 1024, 20, 8)).contains("priority 8"));
        assert!(message(request(1, 100 * 1024, 20, 0)).contains("two batches"));
        assert!(message(request(u64::MAX, 564 * 1024, 20, 0)).contains("rate"));
    }

    #[test]
    fn a_direct_stream_is_a_recording_that_abissd_may_allocate_ahead_of() {
        let direct = |write, preallocate| AttachRequest {
            write,
            preallocate,
            direct: true,
            ..request(1_000_000, 2 << 20, 20, 0)
        };
        assert!(check_parameters(&direct(true, false)).is_ok());
        assert!(check_parameters(&direct(true, true)).is_ok());
        let message = |r| check_parameters(&r).unwrap_err().to_string();
        assert!(message(direct(false, false)).contains("write stream"));
    }
}
