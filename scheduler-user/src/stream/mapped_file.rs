//! A stream's file as the daemon holds it: a read stream's file mapped read-only, so the pages
//! of its playout window can be locked (`mlock`), unlocked and counted (`mincore`); a write
//! stream's file only held open (its window is written back, never locked).

use std::io;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::ptr::NonNull;

use log::warn;

use crate::serve::closer::ClientFd;
use nix::sys::mman::{madvise, mlock, mmap, munlock, munmap, MapFlags, MmapAdvise, ProtFlags};

/// How far past its size at attach a read stream's file is mapped: a file being recorded grows
/// while it is watched (timeshift), and its window follows it this far. It is address space,
/// not memory: only the window's pages are ever locked.
pub(crate) const GROWTH_RESERVE_BYTES: u64 = 64 << 30;

/// The file of `fd` (a descriptor the client proved it may read with) opened anew for
/// reading with `O_NOATIME`, for the daemon's own mapping: mapping a file updates its access
/// time, and abissd reading ahead is no access by the user. On ext4 that update is a journal
/// handle, and while a commit holds the journal (seconds, with a best-effort writer's ordered
/// data to write first) the `mmap` waited for it in abissd's main loop: 4 s in the recording
/// benchmark, every client and every stream's window waiting with it.
///
/// # Errors
/// The reopen is refused (`O_NOATIME` needs the file's owner or `CAP_FOWNER`), or the
/// reopened file is not the same file; the caller then maps the client's descriptor.
pub(crate) fn reopen_without_atime(fd: &ClientFd) -> io::Result<ClientFd> {
    reopen(
        fd,
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME),
    )
}

/// The file of `fd` opened anew with `options`, checked to be the same file, closed the way
/// `fd` is.
///
/// # Errors
/// The reopen is refused, or the reopened file is not the same file.
pub(crate) fn reopen(fd: &ClientFd, options: &std::fs::OpenOptions) -> io::Result<ClientFd> {
    let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let reopened = options.open(proc_path)?;
    let original = nix::sys::stat::fstat(fd.as_raw_fd())?;
    let now = reopened.metadata()?;
    if (original.st_dev, original.st_ino) != (now.dev(), now.ino()) {
        return Err(io::Error::other(
            "the descriptor's file opened as another file",
        ));
    }
    Ok(fd.same_owner(OwnedFd::from(reopened)))
}

/// The address space a read stream's mapping of a file of `bytes` takes: its whole pages and
/// [`GROWTH_RESERVE_BYTES`].
#[must_use]
pub(crate) fn mapping_bytes(bytes: u64) -> u64 {
    bytes
        .div_ceil(4096)
        .saturating_mul(4096)
        .saturating_add(GROWTH_RESERVE_BYTES)
}

/// A file a stream reads, mapped read-only so its window's pages can be locked.
#[derive(Debug)]
pub(crate) struct MappedFile {
    fd: ClientFd,
    map: NonNull<libc::c_void>,
    map_bytes: usize,
    /// The most one `POSIX_FADV_WILLNEED` on this file is asked to read.
    advice_bytes: u64,
}

/// What one `POSIX_FADV_WILLNEED` is asked to read when the disk's largest request is not
/// known. The kernel reads no more of one advice than the larger of the disk's largest request
/// and the file's readahead (2.5 MiB of a 6 MiB advice on a loop disk with `read_ahead_kb`
/// 2560 and `max_sectors_kb` 512, measured with `fincore`); the lock then faulted the rest in
/// one 4 KiB request at a time (`MADV_RANDOM`). 128 KiB is the kernel's default readahead,
/// within any disk's cap.
const DEFAULT_ADVICE_BYTES: u64 = 128 << 10;
/// The most one advice is asked to read, whatever the disk says.
const MAX_ADVICE_BYTES: u64 = 4 << 20;

// SAFETY: the mapping is read-only and only used as an address range for mlock/munlock/mincore,
// never dereferenced; the descriptor is a ClientFd (closed on its user's closing thread).
// Both are safe to use from any thread.
unsafe impl Send for MappedFile {}
// SAFETY: see Send; all operations are system calls on the immutable range.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps `fd` (a readable regular file of `bytes`), with room to grow by
    /// [`GROWTH_RESERVE_BYTES`].
    pub(crate) fn new(fd: ClientFd, bytes: u64) -> io::Result<Self> {
        if bytes == 0 {
            return Err(io::Error::other("the file is empty"));
        }
        let mapped = Self::mapped(fd, mapping_bytes(bytes))?;
        // SAFETY: advice on our own mapping: no readahead when mlock faults pages in.
        unsafe { madvise(mapped.map, mapped.map_bytes, MmapAdvise::MADV_RANDOM) }?;
        Ok(mapped)
    }

    /// A direct recording's ring ([`crate::stream::recorder_ring`]): a sealed memfd of
    /// exactly `bytes`, mapped whole, so its pages can be locked.
    pub(crate) fn ring(fd: ClientFd, bytes: u64) -> io::Result<Self> {
        Self::mapped(fd, bytes)
    }

    /// `fd` mapped shared and read-only over `reach` bytes.
    fn mapped(fd: ClientFd, reach: u64) -> io::Result<Self> {
        let map_bytes = usize::try_from(reach).map_err(io::Error::other)?;
        let length = NonZeroUsize::new(map_bytes).ok_or_else(|| io::Error::other("no length"))?;
        // SAFETY: a fresh shared read-only mapping of a file we hold open; nothing else is at
        // the address the kernel picks, and abissd never reads through it (a memfd ring's
        // seals keep it its size; a file's pages past its end are never touched).
        let map = unsafe {
            mmap(
                None,
                length,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        Ok(Self {
            fd,
            map,
            map_bytes,
            advice_bytes: DEFAULT_ADVICE_BYTES,
        })
    }

    /// A write stream's file: not mapped (its descriptor may be write-only, and its window is
    /// written back, never locked), so locking, unlocking and residency see nothing.
    #[must_use]
    pub(crate) fn unmapped(fd: ClientFd) -> Self {
        Self {
            fd,
            map: NonNull::dangling(),
            map_bytes: 0,
            advice_bytes: DEFAULT_ADVICE_BYTES,
        }
    }

    /// Loads of this file are advised in pieces of `bytes`: the largest request of its disk,
    /// which the kernel reads whole from one advice (so a load goes to the disk in requests as
    /// large as the disk takes, not only where the elevator merges smaller pieces).
    #[must_use]
    pub(crate) fn with_advice_bytes(mut self, bytes: u64) -> Self {
        self.advice_bytes = bytes.clamp(DEFAULT_ADVICE_BYTES, MAX_ADVICE_BYTES);
        self
    }

    /// The most one `POSIX_FADV_WILLNEED` on this file is asked to read.
    #[must_use]
    pub(crate) fn advice_bytes(&self) -> u64 {
        self.advice_bytes
    }

    /// The descriptor.
    #[must_use]
    pub(crate) fn fd(&self) -> &ClientFd {
        &self.fd
    }

    /// The most of the file the mapping reaches (pages past the file's end are never
    /// touched: windows stop at the end of the data).
    #[must_use]
    pub(crate) fn reach_bytes(&self) -> u64 {
        self.map_bytes as u64
    }

    fn span(&self, range: &Range<u64>) -> Option<(NonNull<libc::c_void>, usize)> {
        let start = usize::try_from(range.start).ok()?;
        let end = usize::try_from(range.end).ok()?.min(self.map_bytes);
        if start >= end {
            return None;
        }
        // SAFETY: start < map_bytes, so the pointer stays inside the mapping.
        let address = unsafe { self.map.byte_add(start) };
        Some((address, end - start))
    }

    /// Locks the pages of `range` (they are read in first if they are not resident).
    pub(crate) fn lock(&self, range: &Range<u64>) -> io::Result<()> {
        match self.span(range) {
            // SAFETY: the span lies within our mapping.
            Some((address, length)) => unsafe { mlock(address, length) }.map_err(io::Error::from),
            None => Ok(()),
        }
    }

    /// Unlocks the pages of `range` and lets go of them: they stay in the page cache, but no
    /// longer mapped by abissd.
    ///
    /// `munlock` alone leaves them mapped, so every page a stream ever played stayed in
    /// abissd's resident set, and the kernel's `POSIX_FADV_DONTNEED` skips mapped pages: a
    /// reader could not drop what it had played (the raise benchmark's misses found
    /// 75 of 200 drops refused, 2026-12-01), and reclaim had to unmap them first.
    /// `MADV_DONTNEED` on a shared file mapping only removes the mapping; the data is the
    /// file's.
    pub(crate) fn unlock(&self, range: &Range<u64>) -> io::Result<()> {
        let Some((address, length)) = self.span(range) else {
            return Ok(());
        };
        // SAFETY: the span lies within our mapping, which nothing dereferences.
        unsafe { munlock(address, length) }?;
        // SAFETY: as above; dropping the mapping of a read-only shared file range loses
        // nothing.
        unsafe { madvise(address, length, MmapAdvise::MADV_DONTNEED) }?;
        Ok(())
    }

    /// Bytes of `range` resident in the page cache (`mincore`).
    pub(crate) fn resident_bytes(&self, range: &Range<u64>) -> io::Result<u64> {
        let Some((address, length)) = self.span(range) else {
            return Ok(0);
        };
        let mut pages = vec![0u8; length.div_ceil(4096)];
        // SAFETY: the span lies within our mapping and `pages` has one byte per page.
        let rc = unsafe { libc::mincore(address.as_ptr(), length, pages.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(pages.iter().filter(|&&p| p & 1 == 1).count() as u64 * 4096)
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        if self.map_bytes == 0 {
            return;
        }
        // SAFETY: our own mapping, unmapped once; this also unlocks whatever is still locked.
        if let Err(error) = unsafe { munmap(self.map, self.map_bytes) } {
            warn!("cannot unmap a stream's file: {error}");
        }
    }
}
