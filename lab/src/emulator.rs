//! The emulator process: a FUSE filesystem with one file, the disk image, whose reads and
//! writes are served by the device model.
//!
//! The FUSE session thread only timestamps each request and hands it, with its reply object,
//! on over a channel; it never blocks, so many requests can be outstanding. A data thread
//! moves the data to or from the sparse backing file in arrival order (so reads see earlier
//! writes), ahead of the modelled time: the backing file system can stall for milliseconds,
//! and that must not delay replies. The service thread alone decides the order (through a
//! [`DeviceQueue`]), keeps the device's virtual clock and sends each reply at the instant the
//! model says the request completes, less the lab's measured transport delay (see
//! [`TRANSPORT_NAME`]). A fourth thread writes the statistics. While [`UNMODELLED_NAME`] holds
//! 1, requests bypass the model: the data thread replies to them itself.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::LabError;
use crate::model::{DeviceModel, ModelSpec, Op, ServicePlan};
use crate::queue::{DeviceQueue, Queued};
use crate::stats::{quantile, RequestRecord, StatsSummary};
use crate::timing::{self, nanos, SPIN_MARGIN};

/// Name of the disk image file at the root of the FUSE mount.
pub const IMAGE_NAME: &str = "disk";

/// Name of the control file at the root of the FUSE mount that holds the transport allowance
/// in nanoseconds, as decimal text.
///
/// A request spends time outside the model on its way from the loop device to the emulator and
/// back (loop worker, FUSE queue, two wake-ups): tens to hundreds of microseconds depending on
/// the machine. `up` measures it and writes it here; each reply then goes out that much before
/// the model's completion, so that the kernel, not the emulator, sees the model's timing. It
/// never moves a reply before the request's start.
pub const TRANSPORT_NAME: &str = "transport_ns";

/// Name of the control file at the root of the FUSE mount that switches the model off for
/// setting up: `1` or `0`, as decimal text (anything else is refused with `EINVAL`).
///
/// It stands for data that is already on the disk before the experiment starts: a test's
/// files, written through the loop device and its file system so that they are where the
/// kernel would put them, but without paying the model's time for it (200 MB takes 5 s at an
/// hdd's rate, for nothing the test measures). While it is 1, each request that arrives is
/// served as soon as its data has moved: it does not occupy the actuator, does not move the
/// model's head and is not recorded in the statistics, which show only modelled requests. It
/// is not for measuring anything: whoever sets it must make sure nothing else uses the disk
/// meanwhile, and bring everything it wrote to the disk before setting it back to 0.
pub const UNMODELLED_NAME: &str = "unmodelled";

/// Largest request the kernel may send, so that a loop request of up to 1 MiB reaches the
/// model as one request rather than as pieces.
const MAX_REQUEST_BYTES: u32 = 1 << 20;
/// Real-time priorities: the service thread above the FUSE thread, both above normal work, so
/// that replies leave on time on a loaded machine.
const SERVICE_PRIORITY: i32 = 20;
const FUSE_PRIORITY: i32 = 10;
const DATA_PRIORITY: i32 = 15;

const ROOT_INO: u64 = fuser::FUSE_ROOT_ID;
const IMAGE_INO: u64 = 2;
const TRANSPORT_INO: u64 = 3;
const UNMODELLED_INO: u64 = 4;
const ATTR_TTL: Duration = Duration::from_secs(3600);

/// Everything the emulator process needs; `up` writes it as JSON into the state directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmulatorConfig {
    /// The device model.
    pub model: ModelSpec,
    /// Size of the disk image.
    pub size_bytes: u64,
    /// Sparse file holding the data.
    pub backing_path: PathBuf,
    /// Where to mount the FUSE filesystem.
    pub mountpoint: PathBuf,
    /// Per-request statistics, JSON lines.
    pub stats_path: PathBuf,
    /// Summary statistics, rewritten every second.
    pub summary_path: PathBuf,
}

/// Mounts the filesystem and serves requests until it is unmounted.
pub fn serve(config: &EmulatorConfig) -> Result<(), LabError> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&config.backing_path)
        .map_err(LabError::io(&config.backing_path))?;
    let epoch = Instant::now();
    let outstanding = Arc::new(AtomicU32::new(0));
    let transport_ns = Arc::new(AtomicU64::new(0));
    let unmodelled = Arc::new(AtomicBool::new(false));

    let (record_tx, record_rx) = mpsc::channel();
    let stats_writer = StatsWriter::create(config, epoch)?;
    let stats_thread = std::thread::Builder::new()
        .name("stats".into())
        .spawn(move || stats_writer.run(&record_rx))
        .map_err(|e| LabError::system("starting the stats thread", e))?;

    let (io_tx, io_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let mover = DataMover { backing };
    let mover_thread = std::thread::Builder::new()
        .name("data".into())
        .spawn(move || mover.run(&io_rx, &ready_tx))
        .map_err(|e| LabError::system("starting the data thread", e))?;
    let service = ServiceThread {
        model: config.model.instantiate(config.size_bytes),
        queue: DeviceQueue::new(config.model.queue_depth() as usize, config.model.order()),
        rng: ChaCha8Rng::seed_from_u64(config.model.seed),
        epoch,
        outstanding: Arc::clone(&outstanding),
        transport_ns: Arc::clone(&transport_ns),
        records: record_tx,
    };
    let service_thread = std::thread::Builder::new()
        .name("service".into())
        .spawn(move || service.run(&ready_rx))
        .map_err(|e| LabError::system("starting the service thread", e))?;

    let filesystem = DiskImageFs {
        size_bytes: config.size_bytes,
        requests: io_tx,
        next_seq: 0,
        outstanding,
        transport_ns,
        unmodelled,
        created: SystemTime::now(),
    };
    let options = [
        MountOption::FSName("abiss-lab".into()),
        MountOption::Subtype("abiss-lab".into()),
        MountOption::AllowOther,
        MountOption::NoAtime,
    ];
    if !timing::make_current_thread_realtime(FUSE_PRIORITY) {
        eprintln!("abiss-lab: warning: no real-time priority; timing may suffer under load");
    }
    if !timing::lock_memory() {
        eprintln!("abiss-lab: warning: cannot lock the emulator in memory; timing may suffer");
    }
    let mut session =
        fuser::Session::new(filesystem, &config.mountpoint, &options).map_err(|e| {
            LabError::FuseUnavailable {
                reason: format!("cannot mount {}: {e}", config.mountpoint.display()),
            }
        })?;
    // Tell the parent we are serving: the image is visible from now on.
    eprintln!("abiss-lab: serving {}", config.mountpoint.display());
    let result = session.run();
    // Dropping the session drops the filesystem and with it the request channel: the service
    // thread finishes what is in flight and ends, and then the stats thread.
    drop(session);
    let _ = mover_thread.join();
    let _ = service_thread.join();
    let _ = stats_thread.join();
    result.map_err(|e| LabError::system("serving FUSE requests", e))
}

/// A request on its way from the FUSE thread to the service thread.
#[derive(Debug)]
struct PendingIo {
    seq: u64,
    offset: u64,
    len: u64,
    arrival: Instant,
    outstanding: u32,
    /// Arrived while the model was off (see [`UNMODELLED_NAME`]): replied to once its data has
    /// moved, not counted as outstanding, not recorded.
    unmodelled: bool,
    payload: Payload,
}

#[derive(Debug)]
enum Payload {
    Read(ReplyData),
    Write(Vec<u8>, ReplyWrite),
}

impl PendingIo {
    fn op(&self) -> Op {
        match self.payload {
            Payload::Read(_) => Op::Read,
            Payload::Write(..) => Op::Write,
        }
    }
}

/// A request whose data has moved, waiting for the actuator.
#[derive(Debug)]
struct ReadyIo {
    seq: u64,
    op: Op,
    offset: u64,
    len: u64,
    arrival: Instant,
    outstanding: u32,
    backing_ns: u64,
    completion: Completion,
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
struct DataMover {
    backing: File,
}

impl DataMover {
    fn run(self, requests: &Receiver<PendingIo>, ready: &Sender<ReadyIo>) {
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
struct DiskImageFs {
    size_bytes: u64,
    requests: Sender<PendingIo>,
    next_seq: u64,
    outstanding: Arc<AtomicU32>,
    transport_ns: Arc<AtomicU64>,
    unmodelled: Arc<AtomicBool>,
    created: SystemTime,
}

impl DiskImageFs {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
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

    fn submit(&mut self, offset: i64, requested: u64, payload: Payload) {
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

/// A request in service, waiting for its completion instant.
#[derive(Debug)]
struct InFlight {
    deadline: Instant,
    seq: u64,
    record: RequestRecord,
    completion: Completion,
}

#[derive(Debug)]
enum Completion {
    Read(ReplyData, Result<Vec<u8>, i32>),
    Write(ReplyWrite, Result<u32, i32>),
}

impl Completion {
    /// Sends the reply; returns whether the request succeeded.
    fn reply(self) -> bool {
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

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

/// The one thread that serves the device: order, virtual clock, data and replies.
struct ServiceThread {
    model: DeviceModel,
    queue: DeviceQueue<ReadyIo>,
    rng: ChaCha8Rng,
    epoch: Instant,
    outstanding: Arc<AtomicU32>,
    transport_ns: Arc<AtomicU64>,
    records: Sender<RequestRecord>,
}

impl ServiceThread {
    fn run(mut self, requests: &Receiver<ReadyIo>) {
        if !timing::make_current_thread_realtime(SERVICE_PRIORITY) {
            eprintln!("abiss-lab: warning: service thread has no real-time priority");
        }
        let mut in_flight: BinaryHeap<Reverse<InFlight>> = BinaryHeap::new();
        // The device's virtual clock: when the actuator is free for the next request. Starts
        // are computed from it, not from when this thread woke, so wake-up errors never add up.
        let mut free_at = self.epoch;
        let mut open = true;
        loop {
            while open {
                match requests.try_recv() {
                    Ok(io) => self.queue.push(io),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            let now = Instant::now();
            while in_flight.peek().is_some_and(|Reverse(f)| f.deadline <= now) {
                if let Some(Reverse(done)) = in_flight.pop() {
                    self.complete(done);
                }
            }
            if free_at <= now {
                if let Some(io) = self.queue.pick(free_at, self.model.head()) {
                    let started = self.start(io, free_at);
                    free_at = started.record_start + started.occupancy;
                    in_flight.push(Reverse(started.in_flight));
                    continue;
                }
            }
            let next_completion = in_flight.peek().map(|Reverse(f)| f.deadline);
            let next_start = (!self.queue.is_empty()).then_some(free_at);
            let wake = match (next_completion, next_start) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake {
                None if !open => break,
                None => match requests.recv() {
                    Ok(io) => self.queue.push(io),
                    Err(_) => open = false,
                },
                Some(wake) if self.queue.is_empty() && open => {
                    // Nothing queued: a new arrival may be able to start at once, so listen
                    // for one while waiting for the next completion.
                    let timeout = wake.saturating_duration_since(Instant::now() + SPIN_MARGIN);
                    if !timeout.is_zero() {
                        match requests.recv_timeout(timeout) {
                            Ok(io) => {
                                self.queue.push(io);
                                continue;
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => open = false,
                        }
                    }
                    timing::spin_until(wake);
                }
                Some(wake) => {
                    timing::wait_until(wake);
                }
            }
        }
    }

    fn since_epoch(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.epoch))
    }

    /// Starts `io` on the actuator that became free at `free_at`: plans it and schedules its
    /// completion.
    fn start(&mut self, io: ReadyIo, free_at: Instant) -> Started {
        let start = free_at.max(io.arrival);
        let plan: ServicePlan = self.model.plan(io.op, io.offset, io.len, &mut self.rng);
        let transport =
            Duration::from_nanos(self.transport_ns.load(Ordering::Relaxed)).min(plan.completion);
        let deadline = start + plan.completion.saturating_sub(transport);
        let record = RequestRecord {
            seq: io.seq,
            op: io.op,
            offset: io.offset,
            len: io.len,
            arrival_ns: self.since_epoch(io.arrival),
            start_ns: self.since_epoch(start),
            end_ns: self.since_epoch(start + plan.completion),
            transport_ns: nanos(transport),
            replied_ns: 0,
            seek_ns: nanos(plan.seek),
            rotation_ns: nanos(plan.rotation),
            transfer_ns: nanos(plan.transfer),
            latency_ns: nanos(plan.latency),
            occupancy_ns: nanos(plan.occupancy),
            outstanding: io.outstanding,
            backing_ns: io.backing_ns,
            failed: false,
        };
        Started {
            record_start: start,
            occupancy: plan.occupancy,
            in_flight: InFlight {
                deadline,
                seq: io.seq,
                record,
                completion: io.completion,
            },
        }
    }

    fn complete(&self, done: InFlight) {
        let mut record = done.record;
        record.replied_ns = self.since_epoch(Instant::now());
        record.failed = !done.completion.reply();
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        // The stats thread ends only after this thread; a failed send cannot happen.
        let _ = self.records.send(record);
    }
}

struct Started {
    record_start: Instant,
    occupancy: Duration,
    in_flight: InFlight,
}

/// Writes request records as JSON lines and keeps the summary file up to date.
struct StatsWriter {
    lines: BufWriter<File>,
    summary_path: PathBuf,
    epoch: Instant,
    summary: StatsSummary,
    late_sum_ns: f64,
    recent_late_ns: Vec<i64>,
    next_recent: usize,
}

const RECENT_LATE_SAMPLES: usize = 10_000;

impl StatsWriter {
    fn create(config: &EmulatorConfig, epoch: Instant) -> Result<Self, LabError> {
        let file = File::create(&config.stats_path).map_err(LabError::io(&config.stats_path))?;
        Ok(Self {
            lines: BufWriter::new(file),
            summary_path: config.summary_path.clone(),
            epoch,
            summary: StatsSummary::default(),
            late_sum_ns: 0.0,
            recent_late_ns: Vec::with_capacity(RECENT_LATE_SAMPLES),
            next_recent: 0,
        })
    }

    fn run(mut self, records: &Receiver<RequestRecord>) {
        // The summary exists from the start: a lab that is up has one to read, also before
        // its first second (a lab whose file system was made unmodelled is up in less).
        self.write_summary();
        let mut last_summary = Instant::now();
        loop {
            match records.recv_timeout(Duration::from_millis(100)) {
                Ok(record) => self.add(&record),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.lines.flush();
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if last_summary.elapsed() >= Duration::from_secs(1) {
                let _ = self.lines.flush();
                self.write_summary();
                last_summary = Instant::now();
            }
        }
        let _ = self.lines.flush();
        self.write_summary();
    }

    fn add(&mut self, record: &RequestRecord) {
        if let Ok(line) = serde_json::to_string(record) {
            let _ = writeln!(self.lines, "{line}");
        }
        let late = record.late_ns();
        let s = &mut self.summary;
        s.requests += 1;
        s.bytes += record.len;
        s.busy_ns += record.occupancy_ns;
        s.max_outstanding = s.max_outstanding.max(record.outstanding);
        s.late_max_ns = s.late_max_ns.max(late);
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds of lateness are small"
        )]
        let late_f = late as f64;
        self.late_sum_ns += late_f;
        if self.recent_late_ns.len() < RECENT_LATE_SAMPLES {
            self.recent_late_ns.push(late);
        } else {
            self.recent_late_ns[self.next_recent] = late;
            self.next_recent = (self.next_recent + 1) % RECENT_LATE_SAMPLES;
        }
    }

    fn write_summary(&mut self) {
        let s = &mut self.summary;
        s.elapsed_ns = nanos(self.epoch.elapsed());
        #[expect(clippy::cast_precision_loss, reason = "ratios of nanosecond counts")]
        {
            s.busy_fraction = s.busy_ns as f64 / s.elapsed_ns.max(1) as f64;
            s.late_mean_ns = self.late_sum_ns / s.requests.max(1) as f64;
        }
        let mut sorted = self.recent_late_ns.clone();
        sorted.sort_unstable();
        s.late_p99_ns = quantile(&sorted, 0.99).unwrap_or(0);
        // Readers (`abiss-lab status`, the benchmarks) must never see half a summary; it is
        // rewritten every second and need not survive a crash, so it is not synced (a sync
        // would add a journal commit on the emulator's machine every second, for nothing).
        if let Ok(text) = serde_json::to_string_pretty(&s) {
            let _ = abiss_os::fs::replace(&self.summary_path, text.as_bytes());
        }
    }
}

/// Path of the disk image under a FUSE mountpoint.
#[must_use]
pub fn image_path(mountpoint: &Path) -> PathBuf {
    mountpoint.join(IMAGE_NAME)
}
