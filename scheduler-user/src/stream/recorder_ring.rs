//! A direct recording's ring, handed to abissd by its client and locked here.
//!
//! The data of a direct recording waits in its client's ring before the client writes it
//! with `O_DIRECT`; abissd never touches the data (a crash of abissd loses nothing). But the
//! ring must stay in memory, and a client that locks it itself is bound by its own
//! `RLIMIT_MEMLOCK` (8 MiB by default), whatever abissd admitted. So the client hands the ring
//! over as a memfd and abissd locks it through a read-only shared mapping of its own, against
//! the locked memory the stream was admitted with ([`crate::policy::memory`]: a recording's
//! buffer), until the stream ends.
//!
//! What the ring must be, checked before anything is mapped, in an order that never waits on
//! the client's object: a memfd sealed against shrinking, growing and later writers
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE`; `F_GET_SEALS` answers only for memfds,
//! without calling any file system), so its size is fixed and no page of it can be punched out
//! (a hole punch is refused under a write seal), while the client's own writable mapping, made
//! before the seal, goes on; at most the stream's reservation; and every page already touched
//! by its client (`mincore`), so that the lock charges no page to abissd's memory cgroup that
//! the client's would have paid for.
//!
//! The lock runs on the owner's ring-locking thread
//! ([`crate::stream::prefetch::PrefetchEngine::lock_ring`]), never on the main loop, and in
//! pieces ([`lock_in_pieces`]): `mlock` faults pages in under abissd's address-space lock, which
//! every other lock and the main loop's `mmap` and `munmap` wait for, and a memfd's page that
//! its client pushed out to swap (`MADV_PAGEOUT`, allowed to it) would be read back under that
//! lock. So each piece is first read through the descriptor (`pread`, which brings swapped pages
//! back without that lock), then locked; once locked, a page can no longer be paged out. What a
//! client can still make the lock wait for is a page it pushed out between the read and the
//! lock of one piece. The lock stops when the stream ended meanwhile.

use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use abiss_proto::Refusal;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use tokio::sync::oneshot;

use crate::serve::closer::ClientFd;
use crate::stream::mapped_file::MappedFile;

/// Where a ring's lock is.
#[derive(Debug)]
enum RingState {
    /// Queued on the owner's locking thread; the client waits for this answer.
    Locking(oneshot::Sender<Result<u64, Refusal>>),
    /// Locked.
    Locked,
}

/// A direct recording's ring, mapped by abissd; unmapping it (when the stream ends) unlocks it.
#[derive(Debug)]
pub(crate) struct RecorderRing {
    file: Arc<MappedFile>,
    bytes: u64,
    state: RingState,
}

impl RecorderRing {
    /// Checks the ring behind `fd` against a stream that may lock `reserved_bytes`, and maps
    /// it; the client is answered through `reply` once it is locked.
    pub(crate) fn map(
        fd: ClientFd,
        reserved_bytes: u64,
        reply: oneshot::Sender<Result<u64, Refusal>>,
    ) -> Result<Self, (Refusal, oneshot::Sender<Result<u64, Refusal>>)> {
        match checked(fd, reserved_bytes) {
            Ok((file, bytes)) => Ok(Self {
                file: Arc::new(file),
                bytes,
                state: RingState::Locking(reply),
            }),
            Err(reason) => Err((Refusal::BadRequest(reason), reply)),
        }
    }

    /// The mapping to lock, and its length.
    pub(crate) fn to_lock(&self) -> (Arc<MappedFile>, u64) {
        (Arc::clone(&self.file), self.bytes)
    }

    /// Bytes locked now.
    #[must_use]
    pub(crate) fn locked_bytes(&self) -> u64 {
        match self.state {
            RingState::Locked => self.bytes,
            RingState::Locking(_) => 0,
        }
    }

    /// The lock is done (`Err`: why it failed), and the client is told. Whether the ring is
    /// locked; if not, it is to be dropped.
    pub(crate) fn on_locked(&mut self, outcome: Result<(), String>) -> bool {
        let RingState::Locking(reply) = std::mem::replace(&mut self.state, RingState::Locked)
        else {
            return true;
        };
        match outcome {
            Ok(()) => {
                let _ = reply.send(Ok(self.bytes));
                true
            }
            Err(error) => {
                let _ = reply.send(Err(Refusal::Internal(format!(
                    "abissd could not lock the ring: {error}"
                ))));
                false
            }
        }
    }
}

impl Drop for RecorderRing {
    /// A stream that ends while its ring is being locked answers its client.
    fn drop(&mut self) {
        if let RingState::Locking(reply) = std::mem::replace(&mut self.state, RingState::Locked) {
            let _ = reply.send(Err(Refusal::NotAttached {
                what: "the ring's stream".into(),
            }));
        }
    }
}

/// The seals a ring must carry: its size is fixed, and no hole can be punched in it.
const RING_SEALS: SealFlag = SealFlag::F_SEAL_SHRINK
    .union(SealFlag::F_SEAL_GROW)
    .union(SealFlag::F_SEAL_FUTURE_WRITE);

/// The most of a ring read and locked at once.
const PIECE_BYTES: u64 = 2 << 20;

/// Locks `range` of the ring `file` (on the owner's ring-locking thread), a piece at a time,
/// each read through the descriptor first (see the module). Stops with `Interrupted` once
/// nothing but this job holds the ring: its stream ended.
pub(crate) fn lock_in_pieces(file: &Arc<MappedFile>, range: &Range<u64>) -> io::Result<()> {
    let mut scratch = vec![0u8; usize::try_from(PIECE_BYTES).unwrap_or(1 << 20)];
    let mut at = range.start;
    while at < range.end {
        if Arc::strong_count(file) == 1 {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the stream ended while its ring was locked",
            ));
        }
        let end = (at + PIECE_BYTES).min(range.end);
        let length = usize::try_from(end - at).unwrap_or(0);
        let offset = i64::try_from(at).map_err(io::Error::other)?;
        nix::sys::uio::pread(file.fd(), &mut scratch[..length], offset)?;
        file.lock(&(at..end))?;
        at = end;
    }
    Ok(())
}

/// The ring behind `fd`, mapped, and its size; or why it is not one abissd locks.
fn checked(fd: ClientFd, reserved_bytes: u64) -> Result<(MappedFile, u64), String> {
    let seals = fcntl(fd.as_fd().as_raw_fd(), FcntlArg::F_GET_SEALS).map_err(|_| {
        "the ring must be a memfd (memfd_create with MFD_ALLOW_SEALING); this descriptor is not one"
            .to_owned()
    })?;
    if !SealFlag::from_bits_truncate(seals).contains(RING_SEALS) {
        return Err(
            "the ring must be sealed against shrinking, growing and later writers (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE, after the recorder mapped it) before it is handed over"
                .into(),
        );
    }
    // A sealed memfd's size is its inode's: answered by shmem, never by a user's server.
    let bytes = nix::sys::stat::fstat(fd.as_fd().as_raw_fd())
        .map(|stat| u64::try_from(stat.st_size).unwrap_or(0))
        .map_err(|error| format!("cannot read the ring's size: {error}"))?;
    if bytes == 0 || bytes % 4096 != 0 {
        return Err(format!(
            "the ring is {bytes} bytes; it must be a whole number of 4 KiB pages, and not empty"
        ));
    }
    if bytes > reserved_bytes {
        return Err(format!(
            "the ring is {bytes} bytes, more than the {reserved_bytes} bytes of locked memory the stream was admitted with (its buffer); attach with a larger buffer"
        ));
    }
    let file =
        MappedFile::ring(fd, bytes).map_err(|error| format!("cannot map the ring: {error}"))?;
    let resident = file
        .resident_bytes(&(0..bytes))
        .map_err(|error| format!("cannot see the ring's pages: {error}"))?;
    if resident < bytes {
        return Err(format!(
            "{} of the ring's {bytes} bytes were never touched; write every page of it before it is handed over",
            bytes - resident
        ));
    }
    Ok((file, bytes))
}

#[cfg(test)]
mod tests {
    use std::os::fd::{FromRawFd, OwnedFd};

    use super::*;
    use crate::serve::closer::Closer;

    /// A memfd of `bytes`, `touched` or not, with `seals`.
    fn memfd(bytes: usize, touched: bool, seals: libc::c_int) -> OwnedFd {
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe { libc::memfd_create(c"ring-test".as_ptr(), libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0, "memfd_create");
        // SAFETY: just made.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let length = libc::off_t::try_from(bytes).unwrap();
        // SAFETY: our memfd.
        assert_eq!(unsafe { libc::ftruncate(raw, length) }, 0);
        if touched {
            let page = vec![1u8; 4096];
            for offset in (0..bytes).step_by(4096) {
                let at = libc::off_t::try_from(offset).unwrap();
                // SAFETY: a buffer of 4096 bytes, written into our memfd.
                let wrote = unsafe { libc::pwrite(raw, page.as_ptr().cast(), 4096, at) };
                assert_eq!(wrote, 4096);
            }
        }
        if seals != 0 {
            // SAFETY: our memfd.
            assert_eq!(unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) }, 0);
        }
        fd
    }

    fn check(fd: OwnedFd, reserved: u64) -> Result<u64, String> {
        let closer = Closer::new();
        checked(ClientFd::new(fd, 1000, closer), reserved).map(|(_, bytes)| bytes)
    }

    const SEALED: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE;

    #[test]
    fn a_sealed_touched_memfd_within_the_reservation_is_taken_and_locked() {
        let (tx, _rx) = oneshot::channel();
        let closer = Closer::new();
        let fd = ClientFd::new(memfd(64 << 10, true, SEALED), 1000, closer);
        let mut ring = RecorderRing::map(fd, 64 << 10, tx)
            .map_err(|(r, _)| r)
            .unwrap();
        assert_eq!(ring.locked_bytes(), 0, "not locked before its lock is done");
        let (file, bytes) = ring.to_lock();
        file.lock(&(0..bytes))
            .expect("mlock 64 KiB (root, or within RLIMIT_MEMLOCK)");
        assert!(ring.on_locked(Ok(())));
        assert_eq!(ring.locked_bytes(), 64 << 10);
    }

    #[test]
    fn a_ring_that_is_not_a_sealed_touched_memfd_within_the_reservation_is_refused() {
        let unsealed = check(memfd(64 << 10, true, 0), 1 << 20).unwrap_err();
        assert!(
            unsealed.contains("F_SEAL_SHRINK | F_SEAL_GROW"),
            "{unsealed}"
        );
        let may_grow = check(memfd(64 << 10, true, libc::F_SEAL_SHRINK), 1 << 20).unwrap_err();
        assert!(may_grow.contains("sealed against"), "{may_grow}");
        let too_large = check(memfd(2 << 20, true, SEALED), 1 << 20).unwrap_err();
        assert!(
            too_large.contains("more than the 1048576 bytes"),
            "{too_large}"
        );
        let untouched = check(memfd(64 << 10, false, SEALED), 1 << 20).unwrap_err();
        assert!(untouched.contains("never touched"), "{untouched}");
        let empty = check(memfd(0, false, SEALED), 1 << 20).unwrap_err();
        assert!(
            empty.contains("not be empty") || empty.contains("not empty"),
            "{empty}"
        );
        let odd = check(memfd(5000, false, SEALED), 1 << 20).unwrap_err();
        assert!(odd.contains("4 KiB pages"), "{odd}");
        let file = std::fs::File::open("/proc/self/exe").unwrap();
        let not_memfd = check(OwnedFd::from(file), 1 << 20).unwrap_err();
        assert!(not_memfd.contains("must be a memfd"), "{not_memfd}");
    }

    #[test]
    fn a_stream_that_ends_while_its_ring_is_locked_answers_its_client() {
        let (tx, rx) = oneshot::channel();
        let closer = Closer::new();
        let fd = ClientFd::new(memfd(16 << 10, true, SEALED), 1000, closer);
        let ring = RecorderRing::map(fd, 64 << 10, tx)
            .map_err(|(r, _)| r)
            .unwrap();
        drop(ring);
        let answer = rx.blocking_recv().expect("answered");
        assert!(
            matches!(answer, Err(Refusal::NotAttached { .. })),
            "{answer:?}"
        );
    }
}
