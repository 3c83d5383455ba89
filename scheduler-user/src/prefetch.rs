//! The prefetch engine: loads playout windows through `io_uring` at the streams' ABISS priorities,
//! and locks what it loaded.
//!
//! A buffered read gets its I/O priority from the task that submits it, not from the SQE's
//! `ioprio` (measured on this kernel: docs/building.md), and `io_uring`'s workers inherit
//! the submitting thread's I/O context. So there is one worker thread, with its own ring and its
//! own `ioprio_set`, per ABISS level in use; a stream's loads go to its level's worker.
//!
//! A load is an `FADVISE(WILLNEED)` of exactly the window range (it queues the reads), then
//! `mlock` of the same range of a read-only shared mapping of the file, which waits for those
//! reads and pins the pages while they are in the playout window. The mapping is advised
//! `MADV_RANDOM`, so faulting it in never adds readahead beyond the window. Unmapping the file (when the last user of a
//! [`MappedFile`] goes) unlocks everything still locked.
//!
//! A worker whose ring fails (its setup refused, say while `kernel.io_uring_disabled` is set,
//! or a submission error) or that panics reports the loads its ring held as failed (their
//! windows ask for them again) and starts over after a pause, 1 s doubling up to a minute
//! while it keeps failing. What is sent meanwhile waits for the new ring: failing it at once
//! would only have the windows ask again in a loop. Its thread stays, so no load sent to it
//! is lost, and its level loads again once a ring can be set up.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abiss_os::ioprio;
use io_uring::{opcode, types, IoUring};
use log::warn;

pub use crate::mapped_file::MappedFile;
use crate::policy::priority::encoded_ioprio;

/// One window range to load for a stream.
#[derive(Debug)]
pub struct LoadJob {
    /// Stream id.
    pub stream: u64,
    /// Seek generation (stale generations are cancelled).
    pub generation: u32,
    /// Page-aligned byte range.
    pub range: Range<u64>,
    /// The stream's file.
    pub file: Arc<MappedFile>,
    /// What to do with the range.
    pub kind: JobKind,
}

/// What a job does with its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobKind {
    /// Read it into the page cache and lock it (a read stream's window).
    Load,
    /// Write its dirty pages back, wait for them, and drop them from the page cache (a write
    /// stream's window): `sync_file_range` on the ring, run by an `io_uring` worker that shares
    /// this level's I/O context, so the writes carry the level's priority.
    WriteBack,
    /// Allocate the range without changing the file's size (`fallocate` with `KEEP_SIZE`),
    /// likewise at the level's priority: the allocation's metadata reads and its journal
    /// handle must not wait behind best-effort I/O while the writer waits for the same journal.
    Allocate,
}

/// How a load ended.
#[derive(Debug)]
pub enum LoadOutcome {
    /// Read into the page cache and locked (a load), or written back and dropped (a
    /// write-back).
    Loaded,
    /// Cancelled by a seek or a detach.
    Cancelled,
    /// The read or the lock failed.
    Failed(io::Error),
}

/// A finished load, reported to the daemon's main loop.
#[derive(Debug)]
pub struct LoadDone {
    /// Stream id.
    pub stream: u64,
    /// Seek generation.
    pub generation: u32,
    /// The range.
    pub range: Range<u64>,
    /// What the job did.
    pub kind: JobKind,
    /// How it ended.
    pub outcome: LoadOutcome,
}

enum WorkerCommand {
    Load(LoadJob),
    Cancel {
        stream: u64,
        generation: Option<u32>,
    },
}

/// Worker threads, one per ABISS level in use.
#[derive(Debug)]
pub struct PrefetchEngine {
    workers: HashMap<u8, Worker>,
    done: tokio::sync::mpsc::UnboundedSender<LoadDone>,
}

#[derive(Debug)]
struct Worker {
    commands: Sender<WorkerCommand>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for WorkerCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Load(job) => write!(f, "Load({}, {:?})", job.stream, job.range),
            Self::Cancel { stream, generation } => write!(f, "Cancel({stream}, {generation:?})"),
        }
    }
}

impl PrefetchEngine {
    /// An engine that reports finished loads to `done`.
    #[must_use]
    pub fn new(done: tokio::sync::mpsc::UnboundedSender<LoadDone>) -> Self {
        Self {
            workers: HashMap::new(),
            done,
        }
    }

    fn worker(&mut self, level: u8) -> io::Result<&Worker> {
        if !self.workers.contains_key(&level) {
            let (commands, receiver) = mpsc::channel();
            let done = self.done.clone();
            let thread = std::thread::Builder::new()
                .name(format!("abiss-prefetch-{level}"))
                .spawn(move || supervise(level, &receiver, &done))?;
            self.workers.insert(
                level,
                Worker {
                    commands,
                    thread: Some(thread),
                },
            );
        }
        self.workers
            .get(&level)
            .ok_or_else(|| io::Error::other("worker vanished"))
    }

    /// Loads `job` at ABISS `level`.
    pub fn load(&mut self, level: u8, job: LoadJob) -> io::Result<()> {
        self.worker(level)?
            .commands
            .send(WorkerCommand::Load(job))
            .map_err(|_| io::Error::other("the prefetch worker stopped"))
    }

    /// Cancels a stream's in-flight loads (of one generation, or all).
    pub fn cancel(&mut self, level: u8, stream: u64, generation: Option<u32>) {
        if let Some(worker) = self.workers.get(&level) {
            let _ = worker
                .commands
                .send(WorkerCommand::Cancel { stream, generation });
        }
    }
}

impl Drop for PrefetchEngine {
    fn drop(&mut self) {
        for (_, mut worker) in self.workers.drain() {
            drop(worker.commands);
            if let Some(thread) = worker.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// First pause before a failed worker starts again; it doubles while the worker keeps failing.
const RESTART_PAUSE: Duration = Duration::from_secs(1);
/// Longest pause between restarts.
const RESTART_PAUSE_MAX: Duration = Duration::from_secs(60);
/// A worker that ran this long before failing starts again after the first pause.
const RESTART_RESET: Duration = Duration::from_secs(60);

/// A level's worker thread: runs its ring until the engine goes, and starts it again when it
/// fails or panics (see the module documentation).
fn supervise(
    level: u8,
    commands: &Receiver<WorkerCommand>,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
) {
    let mut pause = RESTART_PAUSE;
    let mut held = Vec::new();
    loop {
        let started = Instant::now();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_worker(level, commands, &mut held, done)
        }));
        let why = match run {
            Ok(Ok(())) => return,
            Ok(Err(error)) => error.to_string(),
            Err(_) => "it panicked".to_owned(),
        };
        if started.elapsed() > RESTART_RESET {
            pause = RESTART_PAUSE;
        }
        warn!("prefetch worker for level {level} stopped ({why}); starting it again in {pause:?}");
        if !hold_for(pause, commands, &mut held) {
            return;
        }
        pause = (pause * 2).min(RESTART_PAUSE_MAX);
    }
}

/// Keeps what is sent within `pause` (the worker is down) for the next ring, in order; false
/// once the engine is gone (nothing is waited for then).
fn hold_for(
    pause: Duration,
    commands: &Receiver<WorkerCommand>,
    held: &mut Vec<WorkerCommand>,
) -> bool {
    let until = Instant::now() + pause;
    loop {
        match commands.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(command) => held.push(command),
            Err(mpsc::RecvTimeoutError::Timeout) => return true,
            Err(mpsc::RecvTimeoutError::Disconnected) => return false,
        }
    }
}

/// Reports `job` as failed with `error`.
fn fail(done: &tokio::sync::mpsc::UnboundedSender<LoadDone>, job: LoadJob, error: io::Error) {
    let _ = done.send(LoadDone {
        stream: job.stream,
        generation: job.generation,
        range: job.range,
        kind: job.kind,
        outcome: LoadOutcome::Failed(error),
    });
}

/// Marks cancel requests' completions apart from loads'.
const CANCEL_TAG: u64 = 1 << 63;

struct InFlight {
    job: LoadJob,
}
/// One ring's life: serves `held` (what came while the worker was down), then `commands`.
fn run_worker(
    level: u8,
    commands: &Receiver<WorkerCommand>,
    held: &mut Vec<WorkerCommand>,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
) -> io::Result<()> {
    ioprio::set(ioprio::CALLING_THREAD, encoded_ioprio(level))?;
    // Locking waits for the reads; it runs in its own thread (same priority) so this one keeps
    // queueing the next ranges at once. Waiting here would let a window fall behind its reader
    // by one disk access per batch.
    let (lock_jobs, lock_rx) = mpsc::channel::<LoadJob>();
    let lock_done = done.clone();
    let locker = std::thread::Builder::new()
        .name(format!("abiss-lock-{level}"))
        .spawn(move || {
            let _ = ioprio::set(ioprio::CALLING_THREAD, encoded_ioprio(level));
            for job in lock_rx {
                let outcome = match job.file.lock(&job.range) {
                    Ok(()) => LoadOutcome::Loaded,
                    Err(error) => LoadOutcome::Failed(error),
                };
                let _ = lock_done.send(LoadDone {
                    stream: job.stream,
                    generation: job.generation,
                    range: job.range.clone(),
                    kind: job.kind,
                    outcome,
                });
            }
        })?;
    let result = submit_loads(commands, held, done, &lock_jobs);
    drop(lock_jobs);
    let _ = locker.join();
    result
}

/// The ring side of a worker: queues WILLNEED advice for every load as soon as it arrives and
/// hands finished advice to the locker.
fn submit_loads(
    commands: &Receiver<WorkerCommand>,
    held: &mut Vec<WorkerCommand>,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
    lock_jobs: &Sender<LoadJob>,
) -> io::Result<()> {
    let mut ring = LoadRing {
        ring: IoUring::new(256)?,
        in_flight: HashMap::new(),
        next_id: 1,
    };
    let result = ring.serve(commands, std::mem::take(held), done, lock_jobs);
    if let Err(error) = &result {
        // The ring goes with its requests: their windows must ask for them again.
        for (_, InFlight { job }) in ring.in_flight.drain() {
            fail(done, job, io::Error::new(error.kind(), error.to_string()));
        }
    }
    result
}

/// One worker's ring and the loads it has in flight.
struct LoadRing {
    ring: IoUring,
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
}

impl LoadRing {
    /// Queues and reaps loads, `first` first, until the engine is gone and nothing is left
    /// to finish.
    fn serve(
        &mut self,
        commands: &Receiver<WorkerCommand>,
        first: Vec<WorkerCommand>,
        done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
        lock_jobs: &Sender<LoadJob>,
    ) -> io::Result<()> {
        let mut next = Some(first);
        while let Some(batch) = next {
            let mut batch = batch.into_iter();
            while let Some(command) = batch.next() {
                if let Err(error) = self.queue(command) {
                    // What the ring never saw fails with it.
                    for command in batch {
                        if let WorkerCommand::Load(job) = command {
                            fail(done, job, io::Error::new(error.kind(), error.to_string()));
                        }
                    }
                    return Err(error);
                }
            }
            if !self.in_flight.is_empty() {
                self.reap(done, lock_jobs)?;
            }
            next = self.next_commands(commands);
        }
        Ok(())
    }

    /// The commands waiting now; blocks for one only when nothing is in flight (otherwise the
    /// ring is polled). `None` once the engine is gone and nothing is left to finish.
    fn next_commands(&self, commands: &Receiver<WorkerCommand>) -> Option<Vec<WorkerCommand>> {
        let mut batch = Vec::new();
        if self.in_flight.is_empty() {
            batch.push(commands.recv().ok()?);
        }
        loop {
            match commands.try_recv() {
                Ok(command) => batch.push(command),
                Err(TryRecvError::Disconnected)
                    if self.in_flight.is_empty() && batch.is_empty() =>
                {
                    return None
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return Some(batch),
            }
        }
    }

    /// Puts a load's advice, or a stream's cancellations, on the ring.
    fn queue(&mut self, command: WorkerCommand) -> io::Result<()> {
        match command {
            WorkerCommand::Load(job) => {
                if job.kind != JobKind::Load {
                    return self.queue_write_back(job);
                }
                let length =
                    i64::try_from(job.range.end - job.range.start).map_err(io::Error::other)?;
                // WILLNEED reads exactly the range, at this thread's priority (its io-wq
                // worker inherits our I/O context). A buffered READ would add the kernel's
                // readahead beyond the window, unmetered and at the wrong time.
                let advise = opcode::Fadvise::new(
                    types::Fd(job.file.fd().as_raw_fd()),
                    length,
                    libc::POSIX_FADV_WILLNEED,
                )
                .offset(job.range.start)
                .build()
                .user_data(self.next_id);
                // In flight first: if the push fails, the job fails with the ring.
                self.in_flight.insert(self.next_id, InFlight { job });
                self.next_id += 1;
                push(&mut self.ring, &advise)?;
            }
            WorkerCommand::Cancel { stream, generation } => {
                let targets: Vec<u64> = self
                    .in_flight
                    .iter()
                    .filter(|(_, f)| {
                        f.job.stream == stream && generation.is_none_or(|g| g == f.job.generation)
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for id in targets {
                    let entry = opcode::AsyncCancel::new(id)
                        .build()
                        .user_data(id | CANCEL_TAG);
                    push(&mut self.ring, &entry)?;
                }
            }
        }
        Ok(())
    }

    /// Puts a write stream's job on the ring: a write-back writes the range's dirty pages and
    /// waits for them (also for pages the kernel's flushers had already started); an
    /// allocation allocates the range beyond the file's end.
    fn queue_write_back(&mut self, job: LoadJob) -> io::Result<()> {
        let fd = types::Fd(job.file.fd().as_raw_fd());
        let length = job.range.end - job.range.start;
        let entry = if job.kind == JobKind::Allocate {
            opcode::Fallocate::new(fd, length)
                .offset(job.range.start)
                .mode(libc::FALLOC_FL_KEEP_SIZE)
                .build()
        } else {
            let length = u32::try_from(length).map_err(io::Error::other)?;
            opcode::SyncFileRange::new(fd, length)
                .offset(job.range.start)
                .flags(
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                )
                .build()
        }
        .user_data(self.next_id);
        self.in_flight.insert(self.next_id, InFlight { job });
        self.next_id += 1;
        push(&mut self.ring, &entry)
    }

    /// Submits, waits up to 2 ms for a completion, and hands each finished load on: to the
    /// locker when its reads are queued, to the controller when it was cancelled or failed.
    fn reap(
        &mut self,
        done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
        lock_jobs: &Sender<LoadJob>,
    ) -> io::Result<()> {
        let timeout = types::Timespec::from(Duration::from_millis(2));
        let args = types::SubmitArgs::new().timespec(&timeout);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(error) => return Err(error),
        }
        let finished: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (id, result) in finished {
            if id & CANCEL_TAG != 0 {
                continue;
            }
            let Some(InFlight { job, .. }) = self.in_flight.remove(&id) else {
                continue;
            };
            let outcome = if result == -libc::ECANCELED {
                LoadOutcome::Cancelled
            } else if result < 0 {
                LoadOutcome::Failed(io::Error::from_raw_os_error(-result))
            } else if job.kind == JobKind::WriteBack {
                release_written(&job);
                LoadOutcome::Loaded
            } else if job.kind == JobKind::Allocate {
                LoadOutcome::Loaded
            } else {
                // The reads are queued; the locker faults the pages in (waiting for those
                // reads) and pins them.
                let _ = lock_jobs.send(job);
                continue;
            };
            let _ = done.send(LoadDone {
                stream: job.stream,
                generation: job.generation,
                range: job.range.clone(),
                kind: job.kind,
                outcome,
            });
        }
        Ok(())
    }
}

/// Drops a written-back range from the page cache, so a recording holds no more memory than
/// its window. Clean pages only go; the advice writes nothing (they were just written back).
fn release_written(job: &LoadJob) {
    let (Ok(start), Ok(length)) = (
        i64::try_from(job.range.start),
        i64::try_from(job.range.end - job.range.start),
    ) else {
        return;
    };
    // SAFETY: advice on a descriptor the job holds open.
    let rc = unsafe {
        libc::posix_fadvise(
            job.file.fd().as_raw_fd(),
            start,
            length,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if rc != 0 {
        log::debug!(
            "stream {}: cannot drop {:?} from the page cache: error {rc}",
            job.stream,
            job.range
        );
    }
}

fn push(ring: &mut IoUring, entry: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: every buffer an entry points to lives in `in_flight` until its completion.
    while unsafe { ring.submission().push(entry) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}
