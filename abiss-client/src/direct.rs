//! Writing a file past the page cache: a ring of locked memory the caller's writes are copied
//! into, and a writer thread that writes it out with `O_DIRECT`, in aligned pieces.
//!
//! Why: a recording written through the page cache is paced by the kernel's dirty-page
//! throttle, which every writer of the disk shares (docs/user-guide.md, "Recordings"). Direct
//! writes make no dirty pages, so nothing throttles them but the disk, where abissd's raise of
//! the writer thread puts them at the stream's level. The data path is all here, in the
//! recording process: abissd never holds a byte of it, so a crash of abissd loses nothing.
//!
//! The writer thread writes each piece itself (`pwrite`), not through `io_uring`: a direct
//! write that extends a file cannot be issued without blocking, so `io_uring` hands it to an
//! io-wq worker. The worker shares the raised thread's I/O priority, but abissd counts its
//! real-time requests against the raise only through the raised thread's I/O context, which
//! the eBPF side learns from that thread's own real-time requests; a writer whose every write
//! went to a worker made none. Measured on the lab hdd: every write of the recording came from
//! a worker, none was counted, and the raise went idle after 5 s, leaving the rest of the
//! recording at best effort (49 overflows in 20 s). Written by the raised thread itself, every
//! request is the raise's own, counted and bounded.
//!
//! A write is a `memcpy` into the ring unless the ring is full; then it **waits** for room
//! (nothing is dropped) and counts an overflow, which the caller reports. At the end the
//! unaligned tail is written padded to the alignment and the file truncated to its exact size.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// Largest piece written at once.
pub(crate) const MAX_PIECE_BYTES: usize = 256 * 1024;

/// Pieces the ring holds at least.
const MIN_PIECES: usize = 3;

/// The alignment direct I/O on `file` needs: (file offsets and lengths, memory), from `statx`
/// (`STATX_DIOALIGN`, Linux 6.1). `None`: its file system does no direct I/O (tmpfs, most
/// FUSE file systems), or the kernel cannot say.
pub(crate) fn direct_alignment(file: &File) -> io::Result<Option<(u32, u32)>> {
    // SAFETY: statx is all zeroes valid; the kernel fills it.
    let mut stat: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH names the open descriptor; `stat` is ours.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &raw mut stat,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if stat.stx_mask & libc::STATX_DIOALIGN == 0 || stat.stx_dio_offset_align == 0 {
        return Ok(None);
    }
    Ok(Some((stat.stx_dio_offset_align, stat.stx_dio_mem_align)))
}

/// What a finished direct recording did (serialized as `abissctl record --json` prints it).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct DirectSummary {
    /// Bytes recorded: the file's size.
    pub bytes: u64,
    /// Direct write requests made (pieces and the tail).
    pub pieces: u64,
    /// Caller's writes that found the ring full and waited for room.
    pub overflows: u64,
    /// Caller's writes (copies into the ring), and the slowest, ms.
    pub writes: u64,
    /// The caller's write p99.9, ms (a copy unless the ring was full).
    pub write_p999_ms: f64,
    /// The slowest caller's write, ms.
    pub write_max_ms: f64,
    /// A piece's direct write, submission to completion: p99.9 and slowest, ms.
    pub piece_p999_ms: f64,
    /// The slowest piece, ms.
    pub piece_max_ms: f64,
    /// Whether the ring was locked in memory, by abissd or else by this process (`mlock`,
    /// as far as the user's `RLIMIT_MEMLOCK` allows).
    pub locked: bool,
    /// Whether abissd locked it, against the stream's budget.
    pub locked_by_abissd: bool,
}

/// The ring's memory: a memfd mapped shared, which abissd can lock against the stream's
/// budget (`Request::LockRing`); or aligned heap memory where a memfd cannot be had or
/// cannot give the alignment. Either is locked here instead when abissd does not take it, as
/// far as the user's `RLIMIT_MEMLOCK` allows.
struct RingMemory {
    pointer: *mut u8,
    /// Bytes mapped or allocated: the ring, to a whole page for a memfd.
    bytes: usize,
    backing: Backing,
    /// [`RING_UNLOCKED`], [`RING_LOCKED_HERE`] or [`RING_LOCKED_BY_ABISSD`].
    lock: AtomicU8,
}

enum Backing {
    /// Sealed against shrinking, growing and later writers, every page touched.
    Memfd(OwnedFd),
    Heap(std::alloc::Layout),
}

const RING_UNLOCKED: u8 = 0;
const RING_LOCKED_HERE: u8 = 1;
const RING_LOCKED_BY_ABISSD: u8 = 2;

/// A page, the most a memfd's mapping is aligned to.
const PAGE_BYTES: usize = 4096;

// SAFETY: the memory is plain bytes; who touches which part is ordered by `Shared::state`.
unsafe impl Send for RingMemory {}
// SAFETY: as above.
unsafe impl Sync for RingMemory {}

impl RingMemory {
    fn new(bytes: usize, align: usize) -> io::Result<Self> {
        if align <= PAGE_BYTES {
            if let Ok(ring) = Self::memfd(bytes) {
                return Ok(ring);
            }
        }
        let layout = std::alloc::Layout::from_size_align(bytes, align)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error.to_string()))?;
        // SAFETY: a layout of non-zero size.
        let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
        if pointer.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        Ok(Self {
            pointer,
            bytes,
            backing: Backing::Heap(layout),
            lock: AtomicU8::new(RING_UNLOCKED),
        })
    }

    /// A memfd of `bytes` to a whole page, mapped, touched and sealed.
    fn memfd(bytes: usize) -> io::Result<Self> {
        let bytes = bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES;
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe {
            libc::memfd_create(
                c"abiss-ring".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just made, and ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let length = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
        // SAFETY: our memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), length) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of our memfd of `bytes`; nothing else is there.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ring = Self {
            pointer: pointer.cast(),
            bytes,
            backing: Backing::Memfd(fd),
            lock: AtomicU8::new(RING_UNLOCKED),
        };
        // abissd takes only a ring whose every page is there (its lock must not be what
        // brings them in): one byte written per page.
        for page in (0..bytes).step_by(PAGE_BYTES) {
            // SAFETY: within the mapping, which is writable.
            unsafe { ring.pointer.add(page).write_volatile(0) };
        }
        let Backing::Memfd(fd) = &ring.backing else {
            unreachable!("made as a memfd above")
        };
        // SAFETY: our memfd. Sealed, its size is fixed for abissd's mapping as for ours, and no
        // hole can be punched in it; the writable mapping above was made before the seal.
        let sealed = unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE,
            )
        };
        if sealed != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ring)
    }

    /// The memfd to hand to abissd, if the ring is one.
    fn memfd_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Memfd(fd) => Some(fd.as_fd()),
            Backing::Heap(_) => None,
        }
    }

    /// Locks the ring here, as far as `RLIMIT_MEMLOCK` allows: whether it is.
    fn lock_here(&self) -> bool {
        // SAFETY: our own mapping or allocation of `bytes`.
        let locked = unsafe { libc::mlock(self.pointer.cast(), self.bytes) } == 0;
        if locked {
            self.lock.store(RING_LOCKED_HERE, Ordering::SeqCst);
        }
        locked
    }
}

impl Drop for RingMemory {
    fn drop(&mut self) {
        // SAFETY: made in `new` with these bytes and this layout; munlock of unlocked memory is
        // harmless, and unmapping unlocks too.
        unsafe {
            match &self.backing {
                Backing::Memfd(_) => {
                    libc::munmap(self.pointer.cast(), self.bytes);
                }
                Backing::Heap(layout) => {
                    libc::munlock(self.pointer.cast(), self.bytes);
                    std::alloc::dealloc(self.pointer, *layout);
                }
            }
        }
    }
}

/// Positions in the byte stream, all growing: the ring holds `filled - written` bytes.
#[derive(Default)]
struct Progress {
    /// Copied in by the caller.
    filled: u64,
    /// Written to the file, in order.
    written: u64,
    /// The caller is done: write the tail and stop.
    closing: bool,
    /// The writer failed; every later write fails with it.
    failed: Option<(io::ErrorKind, String)>,
    overflows: u64,
}

struct Shared {
    memory: RingMemory,
    capacity: u64,
    progress: Mutex<Progress>,
    /// Signalled when data came or the caller closes.
    data: Condvar,
    /// Signalled when room came or the writer failed.
    room: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A file written past the page cache by a thread of its own.
pub(crate) struct DirectWriter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<io::Result<WriterFigures>>>,
    writer_tid: u32,
    write_ms: Vec<f32>,
}

/// What the writer thread measured.
#[derive(Default)]
struct WriterFigures {
    pieces: u64,
    piece_ms: Vec<f32>,
}

impl DirectWriter {
    /// Starts writing `file` (open with `O_DIRECT`, empty) from a ring of at least
    /// `buffer_bytes`, in pieces aligned to `align` (file and memory).
    pub(crate) fn start(file: File, buffer_bytes: u64, align: usize) -> io::Result<Self> {
        let piece = piece_bytes(buffer_bytes, align);
        let capacity = ring_bytes(buffer_bytes, align);
        let shared = Arc::new(Shared {
            memory: RingMemory::new(capacity, align.max(4096))?,
            capacity: capacity as u64,
            progress: Mutex::new(Progress::default()),
            data: Condvar::new(),
            room: Condvar::new(),
        });
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let writing = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("abiss-direct".into())
            .spawn(move || {
                let _ = tid_tx.send(nix::unistd::gettid().as_raw().unsigned_abs());
                let result = write_out(&writing, &file, piece, align);
                if let Err(error) = &result {
                    writing.lock().failed = Some((error.kind(), error.to_string()));
                    writing.room.notify_all();
                }
                result
            })?;
        let writer_tid = tid_rx
            .recv()
            .map_err(|_| io::Error::other("the writer thread did not start"))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            writer_tid,
            write_ms: Vec::new(),
        })
    }

    /// The writer thread, for abissd to raise.
    pub(crate) fn writer_tid(&self) -> u32 {
        self.writer_tid
    }

    /// The ring's memfd, to hand to abissd (`None`: the ring is heap memory).
    pub(crate) fn ring_fd(&self) -> Option<BorrowedFd<'_>> {
        self.shared.memory.memfd_fd()
    }

    /// abissd locked the ring (`locked_by_abissd`), or else it is locked here as far as the
    /// user's `RLIMIT_MEMLOCK` allows. Whether it is locked.
    pub(crate) fn ring_locked(&self, locked_by_abissd: bool) -> bool {
        let memory = &self.shared.memory;
        if locked_by_abissd {
            memory.lock.store(RING_LOCKED_BY_ABISSD, Ordering::SeqCst);
            return true;
        }
        memory.lock_here()
    }

    /// Copies all of `data` into the ring, waiting for room when it is full (an overflow).
    pub(crate) fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        let began = Instant::now();
        let shared = Arc::clone(&self.shared);
        let mut progress = shared.lock();
        let mut waited = false;
        while !data.is_empty() {
            if let Some((kind, message)) = &progress.failed {
                return Err(io::Error::new(*kind, message.clone()));
            }
            let free = shared.capacity - (progress.filled - progress.written);
            if free == 0 {
                if !waited {
                    progress.overflows += 1;
                    waited = true;
                }
                progress = shared
                    .room
                    .wait(progress)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            let at = progress.filled % shared.capacity;
            let run = usize::try_from(free.min(shared.capacity - at))
                .unwrap_or(usize::MAX)
                .min(data.len());
            // Copied outside the lock: the writer touches only [written, filled).
            drop(progress);
            // SAFETY: `at + run` is within the ring, and that part is the caller's alone
            // (beyond `filled`, within a ring's length of `written`).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    shared.memory.pointer.add(usize::try_from(at).unwrap_or(0)),
                    run,
                );
            }
            data = &data[run..];
            progress = shared.lock();
            progress.filled += run as u64;
            shared.data.notify_one();
        }
        drop(progress);
        self.write_ms.push(began.elapsed().as_secs_f32() * 1000.0);
        Ok(())
    }

    /// Writes what is left, the tail padded and the file truncated to its size, and stops
    /// the writer.
    pub(crate) fn finish(mut self) -> io::Result<DirectSummary> {
        {
            let mut progress = self.shared.lock();
            progress.closing = true;
            self.shared.data.notify_one();
        }
        let figures = self.thread.take().map_or_else(
            || Ok(WriterFigures::default()),
            |thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("the writer thread panicked")))
            },
        )?;
        let progress = self.shared.lock();
        Ok(DirectSummary {
            bytes: progress.filled,
            pieces: figures.pieces,
            overflows: progress.overflows,
            writes: self.write_ms.len() as u64,
            write_p999_ms: quantile_of(&self.write_ms, 0.999),
            write_max_ms: self.write_ms.iter().copied().fold(0.0, f32::max).into(),
            piece_p999_ms: quantile_of(&figures.piece_ms, 0.999),
            piece_max_ms: figures.piece_ms.iter().copied().fold(0.0, f32::max).into(),
            locked: self.shared.memory.lock.load(Ordering::SeqCst) != RING_UNLOCKED,
            locked_by_abissd: self.shared.memory.lock.load(Ordering::SeqCst)
                == RING_LOCKED_BY_ABISSD,
        })
    }

    /// Overflows so far.
    pub(crate) fn overflows(&self) -> u64 {
        self.shared.lock().overflows
    }
}

impl Drop for DirectWriter {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.shared.lock().closing = true;
            self.shared.data.notify_one();
            let _ = thread.join();
        }
    }
}

/// The ring a buffer of `buffer_bytes` takes: whole pieces ([`piece_bytes`]), at least
/// [`MIN_PIECES`] of them. The stream is attached with this buffer, so that abissd admits
/// what it is asked to lock.
pub(crate) fn ring_bytes(buffer_bytes: u64, align: usize) -> usize {
    let piece = piece_bytes(buffer_bytes, align);
    let pieces = usize::try_from(buffer_bytes.div_ceil(piece as u64))
        .unwrap_or(usize::MAX)
        .max(MIN_PIECES);
    pieces.saturating_mul(piece)
}

/// The piece size for a ring of `buffer_bytes`: a quarter of it, at most
/// [`MAX_PIECE_BYTES`], a whole number of `align`.
pub(crate) fn piece_bytes(buffer_bytes: u64, align: usize) -> usize {
    let quarter = usize::try_from(buffer_bytes / 4).unwrap_or(MAX_PIECE_BYTES);
    let piece = quarter.min(MAX_PIECE_BYTES) / align * align;
    piece.max(align)
}

/// The `q` quantile of `values` (the workspace's one, [`abiss_units::quantile`]), 0 if none.
fn quantile_of(values: &[f32], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    abiss_units::quantile(&sorted, q).map_or(0.0, f64::from)
}

/// The writer thread: whole pieces as they fill, then the tail. Each is written by this
/// thread itself (`pwrite`, blocking): see the module's comment for why not `io_uring`.
fn write_out(
    shared: &Shared,
    file: &File,
    piece: usize,
    align: usize,
) -> io::Result<WriterFigures> {
    let mut figures = WriterFigures::default();
    let piece = piece as u64;
    loop {
        let (filled, written, closing) = {
            let mut progress = shared.lock();
            while !progress.closing && progress.filled - progress.written < piece {
                progress = shared
                    .data
                    .wait(progress)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            (progress.filled, progress.written, progress.closing)
        };
        if filled - written >= piece {
            let sent = Instant::now();
            write_piece(file, shared, written, piece)?;
            figures.piece_ms.push(sent.elapsed().as_secs_f32() * 1000.0);
            figures.pieces += 1;
            shared.lock().written += piece;
            shared.room.notify_all();
            continue;
        }
        if closing {
            let tail = filled - written;
            if tail > 0 {
                let padded = tail.div_ceil(align as u64) * align as u64;
                let at = usize::try_from(written % shared.capacity).unwrap_or(0);
                // SAFETY: the tail and its padding lie within its piece, in the ring; the
                // caller is done, so no one else writes there.
                unsafe {
                    std::ptr::write_bytes(
                        shared
                            .memory
                            .pointer
                            .add(at + usize::try_from(tail).unwrap_or(0)),
                        0,
                        usize::try_from(padded - tail).unwrap_or(0),
                    );
                }
                write_piece(file, shared, written, padded)?;
                figures.pieces += 1;
            }
            // The padding goes: the file is exactly what was written.
            file.set_len(filled)?;
            return Ok(figures);
        }
    }
}

/// Writes `length` bytes of the ring from stream offset `offset` to the same offset of the
/// file; a short write is the file system out of room.
fn write_piece(file: &File, shared: &Shared, offset: u64, length: u64) -> io::Result<()> {
    let at = usize::try_from(offset % shared.capacity).unwrap_or(0);
    let length = usize::try_from(length).unwrap_or(0);
    // SAFETY: the piece lies within the ring (pieces divide it) and between `written` and
    // `filled`, which the caller does not touch until `written` passes it.
    let piece = unsafe { std::slice::from_raw_parts(shared.memory.pointer.add(at), length) };
    let mut done = 0;
    while done < length {
        let position = i64::try_from(offset + done as u64).unwrap_or(i64::MAX);
        match nix::sys::uio::pwrite(file, &piece[done..], position) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!("only {done} of {length} bytes were written at {offset}"),
                ))
            }
            // A short direct write ends on an aligned boundary: the rest goes again.
            Ok(wrote) => done += wrote,
            Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(io::Error::from(error)),
        }
    }
    Ok(())
}
