//! The FUSE side: the file system with the disk image, and the data thread that moves a
//! request's bytes to or from the backing file ahead of its modelled time.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request,
};

use super::{
    ATTR_TTL, DATA_PRIORITY, IMAGE_INO, IMAGE_NAME, MAX_REQUEST_BYTES, ROOT_INO, TRANSPORT_INO,
    TRANSPORT_NAME, UNMODELLED_INO, UNMODELLED_NAME,
};
use crate::model::Op;
use crate::queue::Queued;
use crate::timing::{self, nanos};

/// A request on its way from the FUSE thread to the service thread.
#[derive(Debug)]
pub(super) struct PendingIo {
    pub(super) seq: u64,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) arrival: Instant,
    pub(super) outstanding: u32,
    /// Arrived while the model was off (see [`UNMODELLED_NAME`]): replied to once its data has
    /// moved, not counted as outstanding, not recorded.
    pub(super) unmodelled: bool,
    pub(super) payload: Payload,
}

#[derive(Debug)]
pub(super) enum Payload {
    Read(ReplyData),
    Write(Vec<u8>, ReplyWrite),
}

impl PendingIo {
    pub(super) fn op(&self) -> Op {
        match self.payload {
            Payload::Read(_) => Op::Read,
            Payload::Write(..) => Op::Write,
        }
    }
}

/// A request whose data has moved, waiting for the actuator.
#[derive(Debug)]
pub(super) struct ReadyIo {
    pub(super) seq: u64,
    pub(super) op: Op,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) arrival: Instant,
    pub(super) outstanding: u32,
    pub(super) backing_ns: u64,
    pub(super) completion: Completion,
}

impl Queued for ReadyIo {
    fn offset(&self) -> u64 {
        self.offset
    }
    fn arrival(&self) -> Instant {
        self.arrival
    }
}

/// Moves data between requests and the backing file, in arrival order.
pub(super) struct DataMover {
    pub(super) backing: File,
}

impl DataMover {
    pub(super) fn run(self, requests: &Receiver<PendingIo>, ready: &Sender<ReadyIo>) {
        if !timing::make_current_thread_realtime(DATA_PRIORITY) {
            eprintln!("abiss-lab: warning: data thread has no real-time priority");
        }
        while let Ok(io) = requests.recv() {
            let op = io.op();
            let moving = Instant::now();
            let completion = match io.payload {
                Payload::Read(reply) => {
                    let mut buf = vec![0; usize::try_from(io.len).unwrap_or(0)];
                    let result = self
                        .backing
                        .read_exact_at(&mut buf, io.offset)
                        .map(|()| buf)
                        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO));
                    Completion::Read(reply, result)
                }
                Payload::Write(data, reply) => {
                    let len = usize::try_from(io.len).unwrap_or(0).min(data.len());
                    let result = self
                        .backing
                        .write_all_at(&data[..len], io.offset)
                        .map(|()| u32::try_from(data.len()).unwrap_or(u32::MAX))
                        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO));
                    Completion::Write(reply, result)
                }
            };
            if io.unmodelled {
                // Data already on the disk before the experiment: no actuator, no record.
                completion.reply();
                continue;
            }
            let io = ReadyIo {
                seq: io.seq,
                op,
                offset: io.offset,
                len: io.len,
                arrival: io.arrival,
                outstanding: io.outstanding,
                backing_ns: nanos(moving.elapsed()),
                completion,
            };
            if ready.send(io).is_err() {
                break;
            }
        }
    }
}

/// The FUSE filesystem: a root directory holding the disk image.
#[derive(Debug)]
pub(super) struct DiskImageFs {
    pub(super) size_bytes: u64,
    pub(super) requests: Sender<PendingIo>,
    pub(super) next_seq: u64,
    pub(super) outstanding: Arc<AtomicU32>,
    pub(super) transport_ns: Arc<AtomicU64>,
    pub(super) unmodelled: Arc<AtomicBool>,
    pub(super) created: SystemTime,
}

impl DiskImageFs {
    pub(super) fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, perm, nlink, size) = match ino {
            ROOT_INO => (FileType::Directory, 0o755, 2, 0),
            IMAGE_INO => (FileType::RegularFile, 0o600, 1, self.size_bytes),
            TRANSPORT_INO | UNMODELLED_INO => (FileType::RegularFile, 0o600, 1, 0),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: self.created,
            mtime: self.created,
            ctime: self.created,
            crtime: self.created,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    pub(super) fn submit(&mut self, offset: i64, requested: u64, payload: Payload) {
        let arrival = Instant::now();
        let offset = u64::try_from(offset).unwrap_or(0).min(self.size_bytes);
        let len = requested.min(self.size_bytes - offset);
        // Read here, on the one thread that also serves writes of the control file: a request
        // is unmodelled exactly when it arrived between a 1 and the next 0.
        let unmodelled = self.unmodelled.load(Ordering::Relaxed);
        let outstanding = if unmodelled {
            0
        } else {
            self.outstanding.fetch_add(1, Ordering::Relaxed) + 1
        };
        let io = PendingIo {
            seq: self.next_seq,
            offset,
            len,
            arrival,
            outstanding,
            unmodelled,
            payload,
        };
        self.next_seq += 1;
        if let Err(mpsc::SendError(io)) = self.requests.send(io) {
            // The service thread is gone; fail the request rather than lose its reply.
            match io.payload {
                Payload::Read(reply) => reply.error(libc::EIO),
                Payload::Write(_, reply) => reply.error(libc::EIO),
            }
        }
    }
}

impl Filesystem for DiskImageFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        // Each of these only raises a limit; the kernel's own maximum wins when lower.
        let _ = config.set_max_write(MAX_REQUEST_BYTES);
        let _ = config.set_max_readahead(MAX_REQUEST_BYTES);
        // Direct I/O from the loop device arrives as background requests: let many be
        // outstanding so the device queue, not FUSE, limits the depth.
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        let _ = config.add_capabilities(fuser::consts::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let ino = if name == IMAGE_NAME {
            IMAGE_INO
        } else if name == TRANSPORT_NAME {
            TRANSPORT_INO
        } else if name == UNMODELLED_NAME {
            UNMODELLED_INO
        } else {
            0
        };
        match self.attr(ino) {
            Some(attr) if parent == ROOT_INO && ino != ROOT_INO => {
                reply.entry(&ATTR_TTL, &attr, 0);
            }
            _ => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&ATTR_TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == IMAGE_INO {
            reply.opened(0, 0);
        } else if ino == TRANSPORT_INO || ino == UNMODELLED_INO {
            // Direct I/O: reads see the current value whatever the (zero) size says.
            reply.opened(0, fuser::consts::FOPEN_DIRECT_IO);
        } else {
            reply.error(libc::EISDIR);
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let control = match ino {
            TRANSPORT_INO => Some(self.transport_ns.load(Ordering::Relaxed)),
            UNMODELLED_INO => Some(u64::from(self.unmodelled.load(Ordering::Relaxed))),
            _ => None,
        };
        if let Some(value) = control {
            let text = format!("{value}\n");
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(text.len());
            let end = start.saturating_add(size as usize).min(text.len());
            reply.data(&text.as_bytes()[start..end]);
            return;
        }
        self.submit(offset, u64::from(size), Payload::Read(reply));
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        data: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        if ino == TRANSPORT_INO {
            let value = std::str::from_utf8(data)
                .ok()
                .and_then(|text| text.trim().parse::<u64>().ok());
            match value {
                Some(nanos) if offset == 0 => {
                    self.transport_ns.store(nanos, Ordering::Relaxed);
                    reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX));
                }
                _ => reply.error(libc::EINVAL),
            }
            return;
        }
        if ino == UNMODELLED_INO {
            let value = match std::str::from_utf8(data).map(str::trim) {
                Ok("0") => Some(false),
                Ok("1") => Some(true),
                _ => None,
            };
            match value {
                Some(on) if offset == 0 => {
                    self.unmodelled.store(on, Ordering::Relaxed);
                    reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX));
                }
                _ => reply.error(libc::EINVAL),
            }
            return;
        }
        // The session reuses its buffer for the next request, so the data is copied.
        let len = data.len() as u64;
        self.submit(offset, len, Payload::Write(data.to_vec(), reply));
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _data: bool, reply: ReplyEmpty) {
        // The emulated disk has no volatile cache: every reply means the data is on the medium.
        reply.ok();
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT_INO {
            reply.error(libc::ENOTDIR);
            return;
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
            (IMAGE_INO, FileType::RegularFile, IMAGE_NAME),
            (TRANSPORT_INO, FileType::RegularFile, TRANSPORT_NAME),
            (UNMODELLED_INO, FileType::RegularFile, UNMODELLED_NAME),
        ];
        let skip = usize::try_from(offset).unwrap_or(0);
        for (index, (ino, kind, name)) in entries.iter().enumerate().skip(skip) {
            let next = i64::try_from(index + 1).unwrap_or(i64::MAX);
            if reply.add(*ino, next, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// How a request is answered: its reply object and what the data thread got.
#[derive(Debug)]
pub(super) enum Completion {
    Read(ReplyData, Result<Vec<u8>, i32>),
    Write(ReplyWrite, Result<u32, i32>),
}

impl Completion {
    /// Sends the reply; returns whether the request succeeded.
    pub(super) fn reply(self) -> bool {
        match self {
            Completion::Read(reply, Ok(data)) => reply.data(&data),
            Completion::Write(reply, Ok(written)) => reply.written(written),
            Completion::Read(reply, Err(errno)) => {
                reply.error(errno);
                return false;
            }
            Completion::Write(reply, Err(errno)) => {
                reply.error(errno);
                return false;
            }
        }
        true
    }
}
