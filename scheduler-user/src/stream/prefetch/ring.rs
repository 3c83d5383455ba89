//! A level's `io_uring`: what a worker puts on it for each job, and what it hands on as
//! jobs complete.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use io_uring::{opcode, types, IoUring};

use super::{fail, report, JobKind, LoadDone, LoadJob, LoadOutcome, Lockers, WorkerCommand};

/// Marks cancel requests' completions apart from loads'.
const CANCEL_TAG: u64 = 1 << 63;

/// A job on the ring, as submissions (its parts) that must all complete.
struct InFlight {
    job: LoadJob,
    /// Its submissions' ids.
    parts: Vec<u64>,
    /// Parts not completed yet.
    pending: usize,
    /// How a part ended badly, if one did: cancelled wins over failed.
    worst: i32,
}

/// The ring side of a worker: queues WILLNEED advice for every load as soon as it arrives and
/// hands finished advice to its owner's locker.
pub(super) fn submit_loads(
    commands: &Receiver<WorkerCommand>,
    held: &mut Vec<WorkerCommand>,
    done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
    lockers: &Lockers,
) -> io::Result<()> {
    let ring = IoUring::new(256)?;
    let allocator = match register_without_capabilities(&ring) {
        Ok(personality) => Some(personality),
        Err(error) => {
            log::warn!("no allocation ahead: cannot drop capabilities for it: {error}");
            None
        }
    };
    let mut ring = LoadRing {
        ring,
        allocator,
        in_flight: HashMap::new(),
        part_of: HashMap::new(),
        next_id: 1,
    };
    let result = ring.serve(commands, std::mem::take(held), done, lockers);
    if let Err(error) = &result {
        // The ring goes with its requests: their windows must ask for them again.
        for (_, InFlight { job, .. }) in ring.in_flight.drain() {
            fail(done, &job, io::Error::new(error.kind(), error.to_string()));
        }
    }
    result
}

/// One worker's ring and the loads it has in flight.
struct LoadRing {
    ring: IoUring,
    /// The ring's personality with abissd's credentials less every capability
    /// ([`register_without_capabilities`]): allocations run with it, or not at all.
    allocator: Option<u16>,
    /// By job id (its first part's id).
    in_flight: HashMap<u64, InFlight>,
    /// Submission id to job id.
    part_of: HashMap<u64, u64>,
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
        lockers: &Lockers,
    ) -> io::Result<()> {
        let mut next = Some(first);
        while let Some(batch) = next {
            let mut batch = batch.into_iter();
            while let Some(command) = batch.next() {
                if let Err(error) = self.queue(command, done) {
                    // What the ring never saw fails with it.
                    for command in batch {
                        if let WorkerCommand::Load(job) = command {
                            fail(done, &job, io::Error::new(error.kind(), error.to_string()));
                        }
                    }
                    return Err(error);
                }
            }
            if !self.in_flight.is_empty() {
                self.reap(done, lockers)?;
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
    fn queue(
        &mut self,
        command: WorkerCommand,
        done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
    ) -> io::Result<()> {
        match command {
            WorkerCommand::Load(job) => {
                if job.kind == JobKind::Allocate && self.allocator.is_none() {
                    // Never as root: that would pass the owner's quota.
                    fail(
                        done,
                        &job,
                        io::Error::other("abissd cannot allocate without its capabilities"),
                    );
                    return Ok(());
                }
                if job.kind != JobKind::Load {
                    return self.queue_write_back(job);
                }
                if job.range.is_empty() {
                    // No piece to advise, so nothing would ever complete it (and a length of
                    // 0 would advise the whole file): there is nothing to load or lock.
                    return Ok(());
                }
                // WILLNEED reads exactly the range, at this thread's priority (its io-wq
                // worker inherits our I/O context). A buffered READ would add the kernel's
                // readahead beyond the window, unmetered and at the wrong time.
                // In pieces the kernel reads whole (`MappedFile::advice_bytes`): what one
                // advice leaves unread, the lock would fault in one page at a time.
                let fd = types::Fd(job.file.fd().as_raw_fd());
                let piece = job.file.advice_bytes();
                let chunks: Vec<(u64, i64)> = (job.range.start..job.range.end)
                    .step_by(usize::try_from(piece).map_err(io::Error::other)?)
                    .map(|start| {
                        let end = (start + piece).min(job.range.end);
                        i64::try_from(end - start).map(|length| (start, length))
                    })
                    .collect::<Result<_, _>>()
                    .map_err(io::Error::other)?;
                let entries = chunks.into_iter().map(|(start, length)| {
                    opcode::Fadvise::new(fd, length, libc::POSIX_FADV_WILLNEED)
                        .offset(start)
                        .build()
                });
                self.submit(job, entries)?;
            }
            WorkerCommand::Cancel { stream, generation } => {
                let targets: Vec<u64> = self
                    .in_flight
                    .values()
                    .filter(|f| {
                        f.job.stream == stream && generation.is_none_or(|g| g == f.job.generation)
                    })
                    .flat_map(|f| f.parts.iter().copied())
                    .filter(|part| self.part_of.contains_key(part))
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
        let entry = if let (JobKind::Allocate, Some(personality)) = (job.kind, self.allocator) {
            opcode::Fallocate::new(fd, length)
                .offset(job.range.start)
                .mode(libc::FALLOC_FL_KEEP_SIZE)
                .build()
                .personality(personality)
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
        };
        self.submit(job, std::iter::once(entry))
    }

    /// Puts `job` on the ring as `entries`, each with its own id; the job finishes when all of
    /// them have completed.
    fn submit(
        &mut self,
        job: LoadJob,
        entries: impl Iterator<Item = io_uring::squeue::Entry>,
    ) -> io::Result<()> {
        let job_id = self.next_id;
        let entries: Vec<_> = entries
            .map(|entry| {
                let id = self.next_id;
                self.next_id += 1;
                self.part_of.insert(id, job_id);
                entry.user_data(id)
            })
            .collect();
        let parts: Vec<u64> = (job_id..self.next_id).collect();
        let pending = parts.len();
        // In flight first: if a push fails, the job fails with the ring.
        self.in_flight.insert(
            job_id,
            InFlight {
                job,
                parts,
                pending,
                worst: 0,
            },
        );
        for entry in &entries {
            push(&mut self.ring, entry)?;
        }
        Ok(())
    }

    /// Submits, waits up to 2 ms for a completion, and hands each finished load on: to the
    /// locker when its reads are queued, to the controller when it was cancelled or failed.
    fn reap(
        &mut self,
        done: &tokio::sync::mpsc::UnboundedSender<LoadDone>,
        lockers: &Lockers,
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
            let Some(job_id) = self.part_of.remove(&id) else {
                continue;
            };
            let Some(flight) = self.in_flight.get_mut(&job_id) else {
                continue;
            };
            flight.pending -= 1;
            if result == -libc::ECANCELED || (result < 0 && flight.worst == 0) {
                flight.worst = result;
            }
            if flight.pending > 0 {
                continue;
            }
            let Some(InFlight { job, worst, .. }) = self.in_flight.remove(&job_id) else {
                continue;
            };
            let result = worst;
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
                lockers.submit(job.file.fd().uid(), job);
                continue;
            };
            report(&job, outcome, done);
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

/// Registers on `ring` a personality with the credentials of a thread of abissd's that dropped
/// every capability, and returns its id. Allocations ahead run with it: the kernel skips the
/// quota of a file's owner for a caller with `CAP_SYS_RESOURCE` (`ignore_hardlimit`), and lets
/// it into the blocks ext4 keeps back; an allocation needs none of root's rights (the
/// descriptor is open for writing). The io-wq worker that runs the `fallocate` takes the
/// request's credentials, so the quota is checked as for the owner's own `fallocate`.
///
/// The capabilities are dropped by a thread of its own that ends at once: credentials are per
/// thread, and dropping them in the worker would have to raise them again (which the kernel
/// counts as a privilege change of the whole process). Only capabilities go: changing the
/// thread's user ids would let that user signal abissd.
fn register_without_capabilities(ring: &IoUring) -> io::Result<u16> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("abiss-no-caps".to_owned())
            .spawn_scoped(scope, || {
                drop_all_capabilities()?;
                ring.submitter().register_personality()
            })?
            .join()
            .map_err(|_| io::Error::other("the thread that drops capabilities panicked"))?
    })
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Drops every capability of the calling thread (effective, permitted, inheritable), for good.
fn drop_all_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data::default(); 2];
    // SAFETY: capset reads a header and two data words of the kernel's layout, both live
    // locals; the raw call changes only this thread (glibc would not broadcast it either).
    let rc = unsafe { libc::syscall(libc::SYS_capset, &raw const header, data.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn push(ring: &mut IoUring, entry: &io_uring::squeue::Entry) -> io::Result<()> {
    // SAFETY: every buffer an entry points to lives in `in_flight` until its completion.
    while unsafe { ring.submission().push(entry) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// Opens `path` on `ring`, with `personality` if given: the open's result.
    fn open_on_ring(ring: &mut IoUring, path: &std::ffi::CStr, personality: Option<u16>) -> i32 {
        let mut entry = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
            .flags(libc::O_RDONLY | libc::O_CLOEXEC)
            .build()
            .user_data(7);
        if let Some(personality) = personality {
            entry = entry.personality(personality);
        }
        push(ring, &entry).expect("push");
        ring.submit_and_wait(1).expect("submit");
        let result = ring.completion().next().expect("a completion").result();
        if result >= 0 {
            // SAFETY: the ring opened this descriptor for us and nothing else holds it.
            unsafe { libc::close(result) };
        }
        result
    }

    /// What an allocation runs with has none of root's capabilities (here seen by
    /// `CAP_DAC_OVERRIDE`, which opens a file its mode refuses to everyone; `CAP_SYS_RESOURCE`,
    /// which passes quotas, goes with it), while the worker's own thread keeps them.
    #[test]
    fn allocations_run_without_capabilities() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("abiss-ring-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("nobody's");
        std::fs::write(&file, b"x").expect("write");
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).expect("chown");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).expect("chmod");
        let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).expect("path");

        let mut ring = IoUring::new(8).expect("ring");
        let personality = register_without_capabilities(&ring).expect("register");
        let as_root = open_on_ring(&mut ring, &path, None);
        let as_allocator = open_on_ring(&mut ring, &path, Some(personality));
        // The worker thread itself keeps its capabilities.
        let still_root = open_on_ring(&mut ring, &path, None);
        let _ = std::fs::remove_dir_all(&dir);

        assert!(as_root >= 0, "root opens it: {as_root}");
        assert_eq!(
            as_allocator,
            -libc::EACCES,
            "without capabilities it is refused"
        );
        assert!(
            still_root >= 0,
            "the worker thread kept its own: {still_root}"
        );
    }
}
