//! The prefetch engine: loads playout windows through `io_uring` at the streams' ABISS priorities,
//! and locks what it loaded.
//!
//! A buffered read gets its I/O priority from the task that submits it, not from the SQE's
//! `ioprio` (measured on this kernel: docs/building.md), and `io_uring`'s workers inherit
//! the submitting thread's I/O context. So there is one worker thread, with its own ring and its
//! own `ioprio_set`, per ABISS level in use; a stream's loads go to its level's worker.
//!
//! A load is an `FADVISE(WILLNEED)` of exactly the window range, in pieces the kernel reads
//! whole ([`ring`]; it queues the reads), then
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
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abiss_os::ioprio;
use abiss_proto::StreamId;
use log::warn;
use scheduler_common::AbissLevel;

pub(crate) use crate::stream::mapped_file::MappedFile;

mod ring;
use crate::serve::keyed_threads::KeyedThreads;
use ring::submit_loads;

/// One window range to load for a stream.
#[derive(Debug)]
pub(crate) struct LoadJob {
    /// Stream id.
    pub(crate) stream: StreamId,
    /// Seek generation (stale generations are cancelled).
    pub(crate) generation: u32,
    /// Page-aligned byte range.
    pub(crate) range: Range<u64>,
    /// The stream's file.
    pub(crate) file: Arc<MappedFile>,
    /// What to do with the range.
    pub(crate) kind: JobKind,
}

/// What a job does with its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// Read it into the page cache and lock it (a read stream's window).
    Load,
    /// Write its dirty pages back, wait for them, and drop them from the page cache (a write
    /// stream's window): `sync_file_range` on the ring, run by an `io_uring` worker that shares
    /// this level's I/O context, so the writes carry the level's priority.
    WriteBack,
    /// Lock a direct recording's ring, its range the whole ring
    /// ([`crate::stream::recorder_ring`]): nothing is read; its client touched every page.
    LockRing,
    /// Allocate the range without changing the file's size (`fallocate` with `KEEP_SIZE`),
    /// likewise at the level's priority: the allocation's metadata reads and its journal
    /// handle must not wait behind best-effort I/O while the writer waits for the same journal.
    Allocate,
}

/// How a load ended.
#[derive(Debug)]
pub(crate) enum LoadOutcome {
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
pub(crate) struct LoadDone {
    /// Stream id.
    pub(crate) stream: StreamId,
    /// Seek generation.
    pub(crate) generation: u32,
    /// The range.
    pub(crate) range: Range<u64>,
    /// What the job did.
    pub(crate) kind: JobKind,
    /// How it ended.
    pub(crate) outcome: LoadOutcome,
}

/// A level's lockers: a thread per user with locks waiting, at the level's priority.
type Lockers = KeyedThreads<u32, LoadJob>;

enum WorkerCommand {
    Load(LoadJob),
    Cancel {
        stream: StreamId,
        generation: Option<u32>,
    },
}

/// Worker threads, one per ABISS level in use.
#[derive(Debug)]
pub(crate) struct PrefetchEngine {
    workers: HashMap<AbissLevel, Worker>,
    done: tokio::sync::mpsc::UnboundedSender<LoadDone>,
    /// Recorders' rings to lock: a thread per user, as the levels' lockers.
    ring_lockers: Lockers,
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
    pub(crate) fn new(done: tokio::sync::mpsc::UnboundedSender<LoadDone>) -> Self {
        let ring_done = done.clone();
        let ring_lockers = KeyedThreads::new(
            "abiss-ring-lock",
            |_uid| {},
            move |_uid, job: LoadJob| {
                let result = crate::stream::recorder_ring::lock_in_pieces(&job.file, &job.range);
                report(&job, locked(result), &ring_done);
            },
        );
        Self {
            workers: HashMap::new(),
            done,
            ring_lockers,
        }
    }

    /// Locks a recorder's ring (`job`, of kind [`JobKind::LockRing`]) on its user's ring
    /// locker; reported like a load.
    pub(crate) fn lock_ring(&self, job: LoadJob) {
        self.ring_lockers.submit(job.file.fd().uid(), job);
    }

    fn worker(&mut self, level: AbissLevel) -> io::Result<&Worker> {
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
    pub(crate) fn load(&mut self, level: AbissLevel, job: LoadJob) -> io::Result<()> {
        self.worker(level)?
            .commands
            .send(WorkerCommand::Load(job))
            .map_err(|_| io::Error::other("the prefetch worker stopped"))
    }

    /// Cancels a stream's in-flight loads (of one generation, or all).
    pub(crate) fn cancel(&mut self, level: AbissLevel, stream: StreamId, generation: Option<u32>) {
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
    level: AbissLevel,
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
fn fail(done: &tokio::sync::mpsc::UnboundedSender<LoadDone>, job: &LoadJob, error: io::Error) {
    report(job, LoadOutcome::Failed(error), done);
}

/// One ring's life: serves `held` (what came while the worker was down), then `commands`.
fn run_worker(
    level: AbissLevel,
    commands: &Receiver<WorkerCommand>,
    held: &mut Vec<WorkerCommand>,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
) -> io::Result<()> {
    ioprio::set(ioprio::CALLING_THREAD, level.to_ioprio())?;
    // Locking waits for the reads; it runs in threads of its own (same priority) so this one
    // keeps queueing the next ranges at once. Waiting here would let a window fall behind its
    // reader by one disk access per batch. One locker per user: a user who makes the locks of
    // their own window slow (a truncate or a hole punched under it, a file whose pages fault in
    // slowly) holds up only their own streams' locks, not every stream of the level.
    let lock_done = done.clone();
    let lockers = KeyedThreads::new(
        &format!("abiss-lock-{level}"),
        move |_uid| {
            let _ = ioprio::set(ioprio::CALLING_THREAD, level.to_ioprio());
        },
        move |_uid, job: LoadJob| lock_and_report(&job, &lock_done),
    );
    submit_loads(commands, held, done, &lockers)
}

/// Locks `job`'s range and reports how that ended to `done`.
fn lock_and_report(job: &LoadJob, done: &tokio::sync::mpsc::UnboundedSender<LoadDone>) {
    report(job, locked(job.file.lock(&job.range)), done);
}

/// A lock's outcome.
fn locked(result: io::Result<()>) -> LoadOutcome {
    match result {
        Ok(()) => LoadOutcome::Loaded,
        Err(error) => LoadOutcome::Failed(error),
    }
}

/// Reports to `done` how `job` ended.
fn report(
    job: &LoadJob,
    outcome: LoadOutcome,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
) {
    let _ = done.send(LoadDone {
        stream: job.stream,
        generation: job.generation,
        range: job.range.clone(),
        kind: job.kind,
        outcome,
    });
}
