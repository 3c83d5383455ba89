//! Write streams (recordings): what the daemon does for them outside the pure policy
//! ([`crate::policy::write_behind`]). It learns how far the application has written from the
//! size of the file (`fstat` of the stream's own descriptor at every poll: the file grows as it
//! is written), has the window written back through the level's prefetch ring
//! ([`JobKind::WriteBack`]), allocates ahead with `fallocate(FALLOC_FL_KEEP_SIZE)` on the same
//! ring ([`JobKind::Allocate`]: its metadata I/O at the stream's priority too), and reads
//! the file's real dirty pages with `cachestat` (Linux 6.5) for `abissctl list`.
//!
//! abissd runs as root, which may allocate blocks that the file system keeps back for root and
//! beyond the owner's quota. So the allocation runs with credentials without any capability
//! (the ring's personality, `prefetch::ring`), which the quota of the file's owner binds as it
//! binds the owner; it is made only while the file system has room for ordinary users
//! (`f_bavail`: ext4 lets root's user id into its reserve even without capabilities); a stream
//! allocates at most [`MAX_PREALLOCATE_AHEAD`] ahead, and no faster than twice that at once
//! plus its rate; one user's recordings together hold at most
//! [`crate::policy::write_behind::MAX_PREALLOCATED_AHEAD_PER_USER`] ahead ([`AheadByUser`]); and what a stream allocated
//! past the file's end is given back when it ends ([`GiveBack`]).

use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;

use crate::serve::closer::ClientFd;
use std::sync::Arc;

use abiss_proto::{RecordingInfo, StreamId};
use log::{info, warn};
use scheduler_common::{AbissLevel, MonotonicNs};

mod give_back;
pub(crate) use give_back::GiveBack;

use crate::policy::write_behind::{allocation_room, WriteAction, WriteBehind, WriteBehindShape};
use crate::stream::prefetch::{JobKind, LoadJob, MappedFile, PrefetchEngine};
use crate::stream::recorder_ring::RecorderRing;

/// What each user's recordings hold allocated ahead of their writers, by uid: each
/// recording is held to what its user's budget leaves it
/// ([`crate::policy::write_behind::MAX_PREALLOCATED_AHEAD_PER_USER`]).
#[derive(Debug, Default)]
pub(crate) struct AheadByUser(std::collections::HashMap<u32, u64>);

impl AheadByUser {
    /// What `recordings` (each with its owner's uid) hold ahead now.
    pub(crate) fn of<'a>(recordings: impl Iterator<Item = (u32, &'a Recording)>) -> Self {
        let mut ahead = Self::default();
        for (uid, recording) in recordings {
            *ahead.0.entry(uid).or_default() += recording.window.allocated_ahead();
        }
        ahead
    }

    /// Lets `recording` of user `uid` `look` at its writer with what its user's other
    /// recordings leave it to allocate ahead, and counts what it holds after.
    pub(crate) fn with_room<T>(
        &mut self,
        uid: u32,
        recording: &mut Recording,
        look: impl FnOnce(&mut Recording) -> T,
    ) -> T {
        let total = self.0.entry(uid).or_default();
        let others = total.saturating_sub(recording.window.allocated_ahead());
        recording
            .window
            .set_allocation_room(allocation_room(uid, others));
        let result = look(recording);
        *total = others.saturating_add(recording.window.allocated_ahead());
        result
    }
}

/// Shortest and longest time between two looks at a write stream's file size.
const POLL_NS: Range<u64> = 10_000_000..250_000_000;

/// A write stream's window and what the daemon knows of its file.
#[derive(Debug)]
pub(crate) struct Recording {
    /// The window.
    pub(crate) window: WriteBehind,
    shape: WriteBehindShape,
    /// When the file's size was last looked at.
    polled_at: MonotonicNs,
    /// Write-backs that failed, for the log.
    failures: u64,
    /// A direct recording (`AttachRequest::direct`): its client writes past the page cache,
    /// so there is nothing to write back; its size is followed, for `abissctl list` and for
    /// the allocation ahead of it (if asked for).
    direct: Option<u64>,
    /// A direct recording's ring, handed over by its client and locked by abissd.
    pub(crate) ring: Option<RecorderRing>,
}

impl Recording {
    /// A recording of a file of `file_bytes`, with `credit_bytes` of start-up credit.
    #[must_use]
    pub(crate) fn new(
        shape: WriteBehindShape,
        file_bytes: u64,
        credit_bytes: u64,
        now: MonotonicNs,
    ) -> Self {
        Self {
            window: WriteBehind::new(shape, file_bytes, credit_bytes, now),
            shape,
            polled_at: now,
            failures: 0,
            direct: None,
            ring: None,
        }
    }

    /// A direct recording of a file of `file_bytes`: no write-behind.
    #[must_use]
    pub(crate) fn direct(self, file_bytes: u64) -> Self {
        Self {
            direct: Some(file_bytes),
            ..self
        }
    }

    /// Whether its client writes it past the page cache.
    #[must_use]
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// What abissd holds locked of its client's ring.
    #[must_use]
    pub(crate) fn ring_locked_bytes(&self) -> u64 {
        self.ring.as_ref().map_or(0, RecorderRing::locked_bytes)
    }

    /// Time between two looks at the file's size: a quarter of a write-back request at the
    /// rate, so the window never lags a request behind the writer.
    #[must_use]
    pub(crate) fn poll_interval_ns(&self) -> u64 {
        let request_ns = u128::from(self.shape.request_bytes()) * 1_000_000_000
            / u128::from(self.shape.rate_bps.max(1));
        u64::try_from(request_ns / 4)
            .unwrap_or(u64::MAX)
            .clamp(POLL_NS.start, POLL_NS.end)
    }

    /// Nanoseconds until this stream needs the main loop.
    #[must_use]
    pub(crate) fn ns_until_due(&self, now: MonotonicNs) -> u64 {
        if self.direct.is_some() {
            return self
                .polled_at
                .saturating_add(POLL_NS.end)
                .saturating_since(now);
        }
        let poll = self
            .polled_at
            .saturating_add(self.poll_interval_ns())
            .saturating_since(now);
        self.window
            .ns_until_next_write_back(now)
            .map_or(poll, |ns| ns.min(poll))
    }

    /// Looks at the file's size if a poll is due, and lets the window act on it.
    pub(crate) fn poll(&mut self, file: &MappedFile, now: MonotonicNs) -> Vec<WriteAction> {
        if let Some(written) = &mut self.direct {
            if now.saturating_since(self.polled_at) >= POLL_NS.end {
                self.polled_at = now;
                if let Ok(stat) = nix::sys::stat::fstat(file.fd().as_raw_fd()) {
                    *written = u64::try_from(stat.st_size).unwrap_or(0);
                    return self.window.on_written_directly(*written, now);
                }
            }
            return Vec::new();
        }
        if now.saturating_since(self.polled_at) < self.poll_interval_ns() {
            return self.window.on_tick(now);
        }
        self.polled_at = now;
        match nix::sys::stat::fstat(file.fd().as_raw_fd()) {
            Ok(stat) => self
                .window
                .on_size(u64::try_from(stat.st_size).unwrap_or(0), now),
            Err(_) => self.window.on_tick(now),
        }
    }

    /// Carries out the window's actions for stream `stream` at ABISS `level`.
    pub(crate) fn carry_out(
        &mut self,
        prefetch: &mut PrefetchEngine,
        (stream, level): (StreamId, AbissLevel),
        file: &Arc<MappedFile>,
        actions: Vec<WriteAction>,
    ) {
        for action in actions {
            match action {
                WriteAction::WriteBack(range) => {
                    log::debug!("stream {stream}: write back {range:?}");
                    let job = LoadJob {
                        stream,
                        generation: 0,
                        range: range.clone(),
                        file: Arc::clone(file),
                        kind: JobKind::WriteBack,
                    };
                    if let Err(error) = prefetch.load(level, job) {
                        warn!("stream {stream}: cannot queue a write-back: {error}");
                        self.window.on_failed(&range);
                    }
                }
                WriteAction::Preallocate(range) => {
                    let queued = room_for(file.fd(), &range).and_then(|()| {
                        prefetch.load(
                            level,
                            LoadJob {
                                stream,
                                generation: 0,
                                range,
                                file: Arc::clone(file),
                                kind: JobKind::Allocate,
                            },
                        )
                    });
                    if let Err(error) = queued {
                        self.allocation_failed(stream, &error);
                    }
                }
            }
        }
    }

    /// Allocating ahead failed: the stream goes on without it.
    pub(crate) fn allocation_failed(&mut self, stream: StreamId, error: &dyn std::fmt::Display) {
        info!("stream {stream}: no allocation ahead of the writer: {error}");
        self.window.allocation_failed();
    }

    /// A write-back ended (`failed` with the error, if it did).
    pub(crate) fn written_back(
        &mut self,
        stream: StreamId,
        range: &Range<u64>,
        failed: Option<&io::Error>,
        now: MonotonicNs,
    ) -> Vec<WriteAction> {
        if let Some(error) = failed {
            self.failures += 1;
            if self.failures.is_power_of_two() {
                warn!(
                    "stream {stream}: writing back {range:?} failed: {error} ({} failures so far)",
                    self.failures
                );
            }
            self.window.on_failed(range);
            return Vec::new();
        }
        self.window.on_written_back(range, now)
    }

    /// The window as clients see it.
    #[must_use]
    pub(crate) fn info(&self, file: &MappedFile) -> RecordingInfo {
        let window = &self.window;
        if let Some(written) = self.direct {
            // Written by its client straight to the disk: nothing dirty, nothing behind.
            return RecordingInfo {
                written_end: written,
                written_back_end: written,
                headroom_bytes: i64::try_from(self.shape.buffer_bytes).unwrap_or(i64::MAX),
                preallocated_end: window.allocated_end(),
                preallocated_bytes: window.preallocated_bytes(),
                direct: true,
                ..RecordingInfo::default()
            };
        }
        RecordingInfo {
            written_end: window.written_end(),
            written_back_end: window.written_back_end(),
            written_back_bytes: window.written_back_bytes(),
            dirty_bytes: dirty_bytes(file.fd()).unwrap_or_else(|_| window.behind_bytes()),
            headroom_bytes: window.headroom_bytes(),
            preallocated_end: window.allocated_end(),
            preallocated_bytes: window.preallocated_bytes(),
            direct: false,
        }
    }
}

/// Whether ordinary users could allocate `range` of the file now.
fn room_for(fd: &ClientFd, range: &Range<u64>) -> io::Result<()> {
    let length = range.end - range.start;
    let space = nix::sys::statvfs::fstatvfs(fd)?;
    let free_to_users = space.blocks_available() * space.fragment_size();
    if free_to_users < length {
        return Err(io::Error::other(
            "the file system has no room left for ordinary users",
        ));
    }
    Ok(())
}

/// `struct cachestat_range` of `cachestat(2)`.
#[repr(C)]
struct CachestatRange {
    offset: u64,
    length: u64,
}

/// `struct cachestat` of `cachestat(2)`.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    cache: u64,
    dirty: u64,
    writeback: u64,
    evicted: u64,
    recently_evicted: u64,
}

/// `cachestat`'s number on every architecture (the unified syscall table of Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

/// Dirty and under-writeback bytes of the whole file in the page cache.
///
/// # Errors
/// The kernel has no `cachestat` (before Linux 6.5).
pub(crate) fn dirty_bytes(fd: &ClientFd) -> io::Result<u64> {
    let range = CachestatRange {
        offset: 0,
        length: 0,
    };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live locals of the kernel's layout.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd(),
            &raw const range,
            &raw mut stat,
            0u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let _ = (stat.cache, stat.evicted, stat.recently_evicted);
    Ok((stat.dirty + stat.writeback) * abiss_proto::PAGE_BYTES)
}
