//! The two kinds of load of a run, as plain programs would do them: real-time readers (a
//! buffered read(2) loop paced at the stream's rate) and the best-effort copy loop.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abiss_os::clock::thread_run_delay_ns;
use anyhow::{anyhow, Context as _};
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};

use crate::configuration::{ReaderContext, RunSetup};
use crate::interrupt;
use crate::ioprio::{current_thread_ioprio, IoClass};
use crate::latency::LatencyHistogram;
use crate::schedule::{DeadlineTally, StreamSpec};

/// One real-time reader of a run.
#[derive(Clone, Copy, Debug)]
pub struct ReaderPlan<'a> {
    /// The reader's number within the run.
    pub reader: usize,
    /// The stream file.
    pub path: &'a Path,
    /// Rate, read size and buffer.
    pub stream: StreamSpec,
    /// The I/O class to set on the reader's thread.
    pub class: Option<IoClass>,
    /// Reads are issued while their issue time is within this long of the start.
    pub duration: Duration,
    /// Seek to a random position this often.
    pub seek_every: Option<Duration>,
}

/// What one reader measured.
#[derive(Debug)]
pub struct ReaderOutcome {
    /// The reader's number within the run.
    pub reader: usize,
    /// Latency of every read(2) call.
    pub latency: LatencyHistogram,
    /// Deadline accounting.
    pub tally: DeadlineTally,
    /// How often the reader reached the end of its file and started over.
    pub wraps: u64,
    /// Seeks made.
    pub seeks: u64,
    /// Per seek, how long after it the reader still waited for the disk: the end of the last
    /// read over [`SLOW_READ`] before the next seek (zero if none was that slow).
    pub recoveries: Vec<Duration>,
    /// Reads after a seek that missed their deadline.
    pub misses_after_seeks: u64,
    /// When each read over [`SLOW_READ`] after a seek completed, counted from its seek.
    pub slow_after_seek: Vec<Duration>,
    /// Each read over [`TAIL_READ`]: how long it took, and how much of that the thread waited
    /// for a CPU (the kernel's run-queue delay): the tail that is the machine's CPU load.
    pub tail_reads: Vec<TailRead>,
}

/// A read over [`TAIL_READ`], and the part of it spent waiting for a CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailRead {
    /// read(2), issue to return.
    pub latency: Duration,
    /// Of that, runnable but not running.
    pub cpu_wait: Duration,
}

/// Reads slower than this are kept with their CPU wait ([`ReaderOutcome::tail_reads`]): a
/// read from the page cache takes tens of µs, so these are the tail of the abiss rows.
pub const TAIL_READ: Duration = Duration::from_micros(500);

/// A read slower than this waited for the disk.
pub const SLOW_READ: Duration = Duration::from_millis(1);

/// Runs one reader on the calling thread: sets its I/O class, opens its file, runs the
/// configuration's reader hook, says it is ready, waits for the common start, then reads on
/// schedule until the run's duration is over.
pub fn run_reader(
    plan: &ReaderPlan<'_>,
    setup: &dyn RunSetup,
    ready: &Sender<anyhow::Result<()>>,
    start: &Receiver<Instant>,
) -> anyhow::Result<ReaderOutcome> {
    let prepared = prepare_reader(plan, setup);
    let (file, mut hook) = match prepared {
        Ok(prepared) => {
            let _ = ready.send(Ok(()));
            prepared
        }
        Err(error) => {
            // The run reports this error, with its cause kept (a benchmark may look for the
            // daemon's refusal in it); the thread's own result only says it ended.
            let _ = ready.send(Err(error.context(format!("reader {}", plan.reader))));
            return Err(anyhow!("reader {} could not start", plan.reader));
        }
    };
    let t0 = start
        .recv()
        .map_err(|_| anyhow!("the run ended before it started"))?;

    let mut reader = ScheduledReader::new(plan, file)?;
    for index in 0.. {
        let due = plan.stream.issue_offset(index);
        if due >= plan.duration || interrupt::interrupted() {
            break;
        }
        reader.seek_if_due(index, due)?;
        reader.wrap_if_at_end()?;
        let len = reader.read(index, t0, due)?;
        hook.after_read(reader.offset, len)?;
        reader.offset += len;
    }
    Ok(reader.finish())
}

/// A reader's file and where it is in its schedule, between the reads of [`run_reader`].
struct ScheduledReader<'a> {
    plan: ReaderPlan<'a>,
    file: File,
    file_len: u64,
    buffer: Vec<u8>,
    /// Where the next read starts in the file.
    offset: u64,
    /// A seek restarts the schedule: deadlines count from the seek, with the buffer's slack
    /// again, as at the start. The index and issue offset of the first read since.
    origin: (u64, Duration),
    next_seek: Option<Duration>,
    last_slow_end: Option<Duration>,
    rng: rand_chacha::ChaCha8Rng,
    outcome: ReaderOutcome,
}

impl<'a> ScheduledReader<'a> {
    fn new(plan: &ReaderPlan<'a>, file: File) -> anyhow::Result<Self> {
        let stream = plan.stream;
        let read_bytes = usize::try_from(stream.read_bytes)?;
        let file_len = file.metadata()?.len();
        anyhow::ensure!(
            file_len >= stream.read_bytes,
            "{} is shorter than one read",
            plan.path.display()
        );
        Ok(Self {
            plan: *plan,
            file,
            file_len,
            buffer: vec![0u8; read_bytes],
            offset: 0,
            origin: (0, Duration::ZERO),
            next_seek: plan.seek_every,
            last_slow_end: None,
            rng: <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(plan.reader as u64),
            outcome: ReaderOutcome {
                reader: plan.reader,
                latency: LatencyHistogram::new(),
                tally: DeadlineTally::default(),
                wraps: 0,
                seeks: 0,
                recoveries: Vec::new(),
                misses_after_seeks: 0,
                slow_after_seek: Vec::new(),
                tail_reads: Vec::new(),
            },
        })
    }

    /// If a seek is due by the issue offset `due` of read `index`, seeks to a random position
    /// and restarts the schedule there.
    fn seek_if_due(&mut self, index: u64, due: Duration) -> anyhow::Result<()> {
        let stream = self.plan.stream;
        if let (Some(at), Some(every)) = (self.next_seek, self.plan.seek_every) {
            if due >= at {
                if self.outcome.seeks > 0 {
                    self.outcome
                        .recoveries
                        .push(self.last_slow_end.unwrap_or_default());
                }
                let positions = (self.file_len / stream.read_bytes).max(1);
                self.offset = rand::Rng::gen_range(&mut self.rng, 0..positions) * stream.read_bytes;
                self.file.seek(SeekFrom::Start(self.offset))?;
                self.outcome.seeks += 1;
                self.origin = (index, due);
                self.last_slow_end = None;
                self.next_seek = Some(at + every);
            }
        }
        Ok(())
    }

    /// Starts the file over if the next read would pass its end.
    fn wrap_if_at_end(&mut self) -> anyhow::Result<()> {
        if self.offset + self.plan.stream.read_bytes > self.file_len {
            // Longer runs than the file lasts start over, from the disk again.
            posix_fadvise(
                self.file.as_raw_fd(),
                0,
                0,
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )?;
            self.file.seek(SeekFrom::Start(0))?;
            self.offset = 0;
            self.outcome.wraps += 1;
        }
        Ok(())
    }

    /// Waits for read `index`'s issue time `t0 + due`, reads, and accounts for the read's
    /// latency and deadline; returns the bytes read.
    fn read(&mut self, index: u64, t0: Instant, due: Duration) -> anyhow::Result<u64> {
        if let Some(wait) = (t0 + due).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let run_delay = thread_run_delay_ns();
        let issued = Instant::now();
        let len = read_full(&mut self.file, &mut self.buffer)
            .with_context(|| format!("reading {}", self.plan.path.display()))?;
        let completed = Instant::now();
        let outcome = &mut self.outcome;
        outcome.latency.record(completed - issued);
        if completed - issued > TAIL_READ {
            // The run-queue delay is read just outside the timed call (reading it costs a few
            // µs), so it may count a preemption next to the call: never more than the call.
            let waited = Duration::from_nanos(thread_run_delay_ns().saturating_sub(run_delay));
            outcome.tail_reads.push(TailRead {
                latency: completed - issued,
                cpu_wait: waited.min(completed - issued),
            });
        }
        let (origin_index, origin_due) = self.origin;
        let start = t0 + origin_due;
        let missed = outcome.tally.record(
            &self.plan.stream,
            index - origin_index,
            issued - start,
            completed - start,
        );
        if outcome.seeks > 0 {
            outcome.misses_after_seeks += u64::from(missed);
            if completed - issued > SLOW_READ {
                self.last_slow_end = Some(completed - start);
                outcome.slow_after_seek.push(completed - start);
            }
        }
        Ok(len as u64)
    }

    /// The outcome, with the recovery of the last seek.
    fn finish(mut self) -> ReaderOutcome {
        if self.outcome.seeks > 0 {
            self.outcome
                .recoveries
                .push(self.last_slow_end.unwrap_or_default());
        }
        self.outcome
    }
}

fn prepare_reader(
    plan: &ReaderPlan<'_>,
    setup: &dyn RunSetup,
) -> anyhow::Result<(File, Box<dyn crate::configuration::ReaderSetup>)> {
    if let Some(class) = plan.class {
        class
            .set_for_current_thread()
            .with_context(|| format!("ioprio_set {class}"))?;
        let now = current_thread_ioprio()?;
        anyhow::ensure!(
            now == class.ioprio(),
            "ioprio is {now:#x} after setting {class}"
        );
    }
    let file = File::open(plan.path).with_context(|| format!("opening {}", plan.path.display()))?;
    let hook = setup.start_reader(&ReaderContext {
        reader: plan.reader,
        path: plan.path,
        file: &file,
        stream: plan.stream,
    })?;
    Ok((file, hook))
}

/// read(2) until the buffer is full or the file ends (a regular file returns short only at
/// its end, so this is one call in practice).
fn read_full(file: &mut File, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The best-effort load: copies a file over and over in fixed-size read(2)/write(2) calls, as
/// the slides' "loop with BE file copy" (175 MB, 128 kB reads).
///
/// Two things keep it a disk load on a machine with far more memory than the slides' set-top
/// box: each pass drops the source's pages so the next pass reads the disk again, and the
/// copy's writes are pushed out as it goes (writeback is started for every
/// [`WRITEBACK_WINDOW`] written and awaited one window later, then those pages are dropped),
/// so at most two windows are dirty, as under a small machine's dirty limit, instead of the
/// whole copy sitting in the page cache until a flusher or a final sync writes it at once.
#[derive(Debug)]
pub struct CopyLoop {
    stop: Arc<AtomicBool>,
    copied_bytes: Arc<AtomicU64>,
    passes: Arc<AtomicU64>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
}

/// Dirty data of the copy is written back in windows of this size.
pub const WRITEBACK_WINDOW: u64 = 8 << 20;

impl CopyLoop {
    /// Starts copying `source` to `destination` in `chunk_bytes` calls on a new thread.
    #[must_use]
    pub fn start(source: PathBuf, destination: PathBuf, chunk_bytes: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let copied_bytes = Arc::new(AtomicU64::new(0));
        let passes = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, copied_bytes, passes) = (stop.clone(), copied_bytes.clone(), passes.clone());
            std::thread::spawn(move || {
                let mut buffer = vec![0u8; chunk_bytes];
                while !stop.load(Ordering::Relaxed) && !interrupt::interrupted() {
                    if copy_pass(&source, &destination, &mut buffer, &stop, &copied_bytes)? {
                        passes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        };
        Self {
            stop,
            copied_bytes,
            passes,
            thread: Some(thread),
        }
    }

    /// Bytes copied so far.
    #[must_use]
    pub fn copied_bytes(&self) -> u64 {
        self.copied_bytes.load(Ordering::Relaxed)
    }

    /// Complete passes so far.
    #[must_use]
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Stops the copy at its next call and reports whether it failed.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result.context("the copy loop failed"),
            Some(Err(_)) => Err(anyhow!("the copy loop panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for CopyLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One pass of the copy; returns whether it reached the end of the source.
fn copy_pass(
    source: &Path,
    destination: &Path,
    buffer: &mut [u8],
    stop: &AtomicBool,
    copied_bytes: &AtomicU64,
) -> anyhow::Result<bool> {
    let mut input = File::open(source).with_context(|| format!("opening {}", source.display()))?;
    let mut output = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(destination)
        .with_context(|| format!("creating {}", destination.display()))?;
    let (mut written, mut started, mut awaited) = (0u64, 0u64, 0u64);
    loop {
        if stop.load(Ordering::Relaxed) || interrupt::interrupted() {
            return Ok(false);
        }
        let len = match input.read(buffer) {
            Ok(0) => break,
            Ok(len) => len,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", source.display())),
        };
        output
            .write_all(&buffer[..len])
            .with_context(|| format!("writing {}", destination.display()))?;
        written += len as u64;
        copied_bytes.fetch_add(len as u64, Ordering::Relaxed);
        if written - started >= WRITEBACK_WINDOW {
            sync_range(
                &output,
                started,
                written - started,
                libc::SYNC_FILE_RANGE_WRITE,
            )?;
            if started > awaited {
                sync_range(
                    &output,
                    awaited,
                    started - awaited,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                )?;
                drop_range(&output, awaited, started - awaited)?;
                awaited = started;
            }
            started = written;
        }
    }
    output
        .sync_data()
        .with_context(|| format!("syncing {}", destination.display()))?;
    drop_range(&output, 0, 0)?;
    drop_range(&input, 0, 0)?;
    Ok(true)
}

fn sync_range(file: &File, offset: u64, len: u64, flags: libc::c_uint) -> anyhow::Result<()> {
    // SAFETY: sync_file_range on a descriptor we own; no memory is passed.
    let result = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            i64::try_from(offset)?,
            i64::try_from(len)?,
            flags,
        )
    };
    anyhow::ensure!(
        result == 0,
        "sync_file_range: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

fn drop_range(file: &File, offset: u64, len: u64) -> anyhow::Result<()> {
    posix_fadvise(
        file.as_raw_fd(),
        i64::try_from(offset)?,
        i64::try_from(len)?,
        PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::configuration::NoSetup;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("abiss-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_reader_on_a_fast_file_keeps_its_schedule_and_wraps() {
        let dir = temp_dir("reader");
        let path = dir.join("stream");
        std::fs::write(&path, vec![7u8; 3 * 4096]).unwrap();
        // 4 KiB reads at 400 kB/s: one read per ~10 ms, 10 reads in 100 ms over a 3-read file.
        let stream = StreamSpec {
            rate_bps: 409_600,
            read_bytes: 4096,
            buffer_bytes: 8192,
        };
        let plan = ReaderPlan {
            reader: 0,
            path: &path,
            stream,
            class: None,
            duration: Duration::from_millis(100),
            seek_every: None,
        };
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (start_tx, start_rx) = std::sync::mpsc::channel();
        let started = Instant::now();
        let outcome = std::thread::scope(|scope| {
            let reader = scope.spawn(move || run_reader(&plan, &NoSetup, &ready_tx, &start_rx));
            ready_rx.recv().unwrap().unwrap();
            start_tx.send(Instant::now()).unwrap();
            reader.join().unwrap().unwrap()
        });
        assert!(started.elapsed() >= Duration::from_millis(90));
        assert_eq!(outcome.tally.reads, 10);
        assert_eq!(outcome.latency.len(), 10);
        assert_eq!(outcome.tally.misses, 0);
        assert_eq!(outcome.wraps, 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_copy_loop_copies_the_whole_file_per_pass() {
        let dir = temp_dir("copy");
        let (source, destination) = (dir.join("source"), dir.join("destination"));
        let data: Vec<u8> = (0..(WRITEBACK_WINDOW * 3 + 5))
            .map(|i| (i % 253) as u8)
            .collect();
        std::fs::write(&source, &data).unwrap();
        let copy = CopyLoop::start(source.clone(), destination.clone(), 128 << 10);
        let deadline = Instant::now() + Duration::from_secs(30);
        while copy.passes() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let copied = copy.copied_bytes();
        copy.stop().unwrap();
        assert!(copied >= 2 * data.len() as u64);
        // The destination holds a complete copy from a finished pass, or a prefix of one.
        let copy_data = std::fs::read(&destination).unwrap();
        assert_eq!(copy_data[..], data[..copy_data.len()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
