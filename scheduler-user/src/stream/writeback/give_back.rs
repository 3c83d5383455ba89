//! Giving back what a recording allocated ahead of its writer (`--preallocate`) once its
//! stream ended: the blocks past the file's size, allocated with `FALLOC_FL_KEEP_SIZE`, stayed
//! the owner's for as long as the file existed, though nothing would ever be written into them.
//!
//! A truncation to the file's size frees them (ext4 frees the blocks past the size even when
//! the size does not change), but a truncation that raced a write would cut what the writer
//! wrote after its size was read. So it is made only while abissd holds a write lease on the
//! file: the kernel grants one only while no other open file (nor a writable mapping) can write
//! it, the client's own included, and holds every new `open` and `truncate` of it until the
//! lease is let go, microseconds later. The size read under the lease is final.
//!
//! A file still open for writing elsewhere when the stream ends (the writer goes on without
//! abissd, and may write into those blocks) is tried again, [`TRIES`] times over about 6 s
//! (the client's descriptors are closed on its closing thread meanwhile); then its blocks stay.
//! All of it runs on a thread of its own: a reopen, a lease and a truncation wait on the file
//! system, never on abissd's main loop.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_proto::StreamId;
use log::{debug, info};

use crate::serve::closer::ClientFd;
use crate::stream::mapped_file::reopen;
use crate::stream::prefetch::MappedFile;

/// Ended recordings whose blocks wait to be given back; beyond, a recording's stay (as many as
/// streams can be at once).
pub(crate) const MAX_WAITING: usize = crate::stream::MAX_STREAMS;
/// Tries of a file still open for writing elsewhere, [`FIRST_PAUSE`] apart, doubling.
pub(crate) const TRIES: u32 = 8;
/// The pause before the second try.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// `fcntl`'s `F_SETSIG` (Linux's number; the libc crate does not name it).
const F_SETSIG: libc::c_int = 10;

/// A recording whose stream ended.
struct Ended {
    stream: StreamId,
    file: Arc<MappedFile>,
    /// How far the stream allocated.
    allocated_end: u64,
}

/// One waiting to be tried (again).
struct Waiting {
    stream: StreamId,
    /// abissd's own write descriptor of the file (a reopen, so the client's open file is
    /// not counted as ours by the lease).
    file: ClientFd,
    allocated_end: u64,
    tries: u32,
    due: Instant,
}

/// The thread that gives back, started with the first recording that allocated.
#[derive(Debug, Default)]
pub(crate) struct GiveBack {
    sender: Option<SyncSender<Ended>>,
}

impl GiveBack {
    /// Stream `stream`, which allocated `file` up to `allocated_end`, ended: its blocks past
    /// the file's size are given back on the thread. Never waits.
    pub(crate) fn ended(&mut self, stream: StreamId, file: Arc<MappedFile>, allocated_end: u64) {
        if self.sender.is_none() {
            let (sender, receiver) = mpsc::sync_channel(MAX_WAITING);
            match std::thread::Builder::new()
                .name("abiss-give-back".to_owned())
                .spawn(move || serve(&receiver))
            {
                Ok(_) => self.sender = Some(sender),
                Err(error) => {
                    info!("stream {stream}: its blocks allocated ahead stay: {error}");
                    return;
                }
            }
        }
        let ended = Ended {
            stream,
            file,
            allocated_end,
        };
        if let Some(sender) = &self.sender {
            match sender.try_send(ended) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    info!("stream {stream}: its blocks allocated ahead stay: too many wait");
                }
                Err(TrySendError::Disconnected(_)) => self.sender = None,
            }
        }
    }
}

/// The thread: reopens each ended recording's file for writing, lets go of the stream's
/// descriptor, and tries each file until it is given back or its tries are spent.
fn serve(receiver: &Receiver<Ended>) {
    let mut waiting: Vec<Waiting> = Vec::new();
    let mut open = true;
    while open || !waiting.is_empty() {
        let next_due = waiting.iter().map(|w| w.due).min();
        let arrived = match next_due {
            _ if !open => None,
            None => receiver.recv().ok().or_else(|| {
                open = false;
                None
            }),
            Some(due) => match receiver.recv_timeout(due.saturating_duration_since(Instant::now()))
            {
                Ok(ended) => Some(ended),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    None
                }
            },
        };
        if let Some(ended) = arrived {
            // Without waiting: an open for writing breaks a lease on the file, and the owner
            // may hold one; waiting out its break time (45 s) here would hold every other
            // recording's give-back.
            let options = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .clone();
            match reopen(ended.file.fd(), &options) {
                Ok(file) => waiting.push(Waiting {
                    stream: ended.stream,
                    file,
                    allocated_end: ended.allocated_end,
                    tries: 0,
                    due: Instant::now(),
                }),
                Err(error) => info!(
                    "stream {}: its blocks allocated ahead stay: cannot reopen its file: {error}",
                    ended.stream
                ),
            }
            // The stream's descriptor (the client's open file) goes to its closing thread.
            drop(ended.file);
        }
        if !open {
            // abissd is stopping: one last try each, no waiting.
            for w in &mut waiting {
                w.tries = TRIES - 1;
                w.due = Instant::now();
            }
        }
        let now = Instant::now();
        waiting.retain_mut(|w| {
            if w.due > now {
                return true;
            }
            w.tries += 1;
            match give_back(&w.file, w.allocated_end) {
                Ok(Some(size)) => {
                    debug!("stream {}: allocated blocks past {size} given back", w.stream);
                    false
                }
                Ok(None) if w.tries < TRIES => {
                    w.due = now + FIRST_PAUSE * 2u32.pow(w.tries - 1);
                    true
                }
                Ok(None) => {
                    info!(
                        "stream {}: its blocks allocated ahead stay: the file is still open for writing",
                        w.stream
                    );
                    false
                }
                Err(error) => {
                    info!("stream {}: its blocks allocated ahead stay: {error}", w.stream);
                    false
                }
            }
        });
    }
}

/// Truncates `file` to its size under a write lease, if it allocated past it: the size given
/// back at, or `None` while another open file can write it.
fn give_back(file: &ClientFd, allocated_end: u64) -> io::Result<Option<u64>> {
    let fd = file.as_raw_fd();
    // Taking a lease makes abissd the owner of the file's signals: a break (any open of the
    // file while the lease is held) would send SIGIO, which ends a process that does not
    // handle it. SIGURG is ignored unless handled, and abissd does not handle it.
    // SAFETY: fcntl on a descriptor we hold.
    if unsafe { libc::fcntl(fd, F_SETSIG, libc::SIGURG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } != 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::EAGAIN | libc::EBUSY) => Ok(None),
            _ => Err(error),
        };
    }
    let truncated = nix::sys::stat::fstat(fd)
        .map_err(io::Error::from)
        .and_then(|stat| {
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            if allocated_end > size {
                nix::unistd::ftruncate(file, stat.st_size)?;
            }
            Ok(Some(size))
        });
    // SAFETY: as above; letting go of our own lease.
    unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
    truncated
}
