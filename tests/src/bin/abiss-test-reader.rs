//! A paced reader for the raise tests: it knows nothing of abiss. It reads FILE at a rate
//! with read(2) or with `io_uring`, optionally from a start offset and with one seek, and prints
//! a JSON summary per phase.
//!
//! `abiss-test-reader FILE RATE_BPS READ_BYTES BUFFER_BYTES SECS [--start OFF] [--seek OFF SECS]
//! [--uring] [--direct] [--ioprio CLASS/LEVEL] [--linger SECS] [--fork FILE SECS]
//! [--stray FILE] [--stray-shared-io | --stray-uring-workers] [--clone-io N KEEP SECS]
//! [--exit-after-clones] [--reap-clones] [--nested-clone-io N SECS] [--direct-chain BYTES DEPTH]`
//! (`--linger`: stay alive, idle, that long
//! after the last
//! read; `--direct`: `O_DIRECT` reads; `--fork`: after the first phase the reading thread forks
//! a child process that reads FILE at the same pace for SECS, and starts a thread that sleeps
//! SECS; both are waited for before exit; `--stray`: after the reads, the reading thread reads
//! FILE whole, as fast as it can; with `--stray-shared-io` a child process it makes with
//! `CLONE_IO`, which shares its I/O context and so its priority, reads it instead; with
//! `--stray-uring-workers` it reads it through `io_uring` with `IOSQE_ASYNC`, so that the ring's
//! worker threads, which share its I/O context too, queue the reads; `--clone-io`: after the
//! first phase the reading thread makes N child processes with `CLONE_IO`, of which all but the
//! last KEEP exit at once and the last KEEP sleep SECS; it prints their pids as
//! `{"clone_io":[…]}`; with `--exit-after-clones` it then exits at once, leaving them; with
//! `--reap-clones` it waits for the kept ones before it goes on, so their ids are free again;
//! `--direct-chain`: after the first phase the reading thread reads BYTES of FILE on from
//! where it is, in 4 KiB `O_DIRECT` reads through `io_uring`, each submitted alone (no plug
//! gathers them) with DEPTH in flight, so that each read's bio can merge into the request of
//! the one before while that waits in the disk's queue; prints `{"direct_chain_bytes":N}`;
//! `--nested-clone-io`: after the first phase the reading thread forks a child process, which
//! makes N child processes with `CLONE_IO` (sharing the child's I/O context); all but the last
//! exit at once, and the last forks a plain child that prints `{"nested":[PID]}` and sleeps
//! SECS).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use abiss_tests::{paced_read, set_thread_ioprio, PacedReport};
use io_uring::{opcode, types, IoUring};

/// A file read through `io_uring`, one buffered read at a time.
struct UringFile {
    file: File,
    ring: IoUring,
    offset: u64,
    /// Each read is handed to the ring's worker threads (`IOSQE_ASYNC`) rather than tried
    /// inline: the worker, not this thread, then queues the disk's requests.
    in_workers: bool,
}

impl Read for UringFile {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let len = u32::try_from(buffer.len()).unwrap_or(u32::MAX);
        let mut entry =
            opcode::Read::new(types::Fd(self.file.as_raw_fd()), buffer.as_mut_ptr(), len)
                .offset(self.offset)
                .build();
        if self.in_workers {
            entry = entry.flags(io_uring::squeue::Flags::ASYNC);
        }
        // SAFETY: the buffer outlives the request: we wait for its completion below.
        unsafe { self.ring.submission().push(&entry) }.map_err(std::io::Error::other)?;
        self.ring.submit_and_wait(1)?;
        let completion = self
            .ring
            .completion()
            .next()
            .ok_or_else(|| std::io::Error::other("no completion"))?;
        let result = completion.result();
        if result < 0 {
            return Err(std::io::Error::from_raw_os_error(-result));
        }
        let read = usize::try_from(result).unwrap_or(0);
        self.offset += read as u64;
        Ok(read)
    }
}

/// A file read with `O_DIRECT` through an aligned bounce buffer.
struct DirectFile {
    file: File,
    storage: Vec<u8>,
}

impl DirectFile {
    fn aligned(&mut self, len: usize) -> &mut [u8] {
        let start = self.storage.as_ptr().align_offset(4096);
        &mut self.storage[start..start + len]
    }
}

impl Read for DirectFile {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let len = buffer.len().min(self.storage.len() - 4096) / 4096 * 4096;
        let mut file = self.file.try_clone()?;
        let read = file.read(self.aligned(len))?;
        buffer[..read].copy_from_slice(&self.aligned(len)[..read]);
        Ok(read)
    }
}

impl Seek for DirectFile {
    fn seek(&mut self, position: SeekFrom) -> std::io::Result<u64> {
        self.file.seek(position)
    }
}

impl Seek for UringFile {
    fn seek(&mut self, position: SeekFrom) -> std::io::Result<u64> {
        match position {
            SeekFrom::Start(offset) => self.offset = offset,
            _ => return Err(std::io::Error::other("only absolute seeks")),
        }
        Ok(self.offset)
    }
}

fn summary(report: &PacedReport) -> String {
    let slow: Vec<String> = report
        .slow
        .iter()
        .map(|s| format!("[{},{},{}]", s.index, s.offset, s.latency_ns))
        .collect();
    format!(
        "{{\"reads\":{},\"misses\":{},\"bytes\":{},\"p99_ns\":{},\"p999_ns\":{},\"max_ns\":{},\"slow\":[{}]}}",
        report.latencies_ns.len(),
        report.misses,
        report.bytes,
        report.quantile_ns(0.99),
        report.quantile_ns(0.999),
        report.quantile_ns(1.0),
        slow.join(",")
    )
}

/// Who reads the stray file: the reading thread, or tasks that share its I/O context.
#[derive(Clone, Copy)]
enum StrayReader {
    /// The reading thread itself.
    Myself,
    /// A child process it makes with `CLONE_IO`.
    CloneIoChild,
    /// Its `io_uring` worker threads (`IOSQE_ASYNC`).
    UringWorkers,
}

/// The command line.
struct Options {
    path: String,
    rate: u64,
    read: u64,
    buffer: u64,
    secs: u64,
    start: u64,
    /// Where to seek after the first phase, and how long the second phase reads.
    seek: Option<(u64, u64)>,
    uring: bool,
    direct: bool,
    linger: u64,
    /// The file a forked child reads, and for how long.
    fork: Option<(String, u64)>,
    /// Another file this thread reads whole after its paced phases: I/O a raise is not for.
    stray: Option<String>,
    /// Who reads the stray file.
    stray_by: StrayReader,
    /// Child processes made with `CLONE_IO` after the first phase: how many, how many of the
    /// last ones stay, and for how long.
    clone_io: Option<(u64, u64, u64)>,
    /// What the reader does right after making them.
    after_clones: AfterClones,
    /// Bytes read after the first phase in small `O_DIRECT` reads, and how many in flight.
    direct_chain: Option<(u64, u64)>,
    /// A forked child's `CLONE_IO` children, how many, and how long the fork of the last one
    /// sleeps.
    nested_clone_io: Option<(u64, u64)>,
}

/// What the reader does right after making its `CLONE_IO` children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AfterClones {
    /// Goes on with its phases (and waits for them at its end).
    GoOn,
    /// Exits at once, leaving them.
    Exit,
    /// Waits for the kept ones (their ids are then free for others), then goes on.
    Reap,
}

/// Parses option `args[i]` if it is one of the options of tasks and `O_DIRECT` chains: the
/// index of the next option; `None` if it is none of them.
fn clone_option(args: &[String], i: usize, options: &mut Options) -> Option<usize> {
    let number = |i: usize| -> u64 { args[i].parse().expect("a number") };
    Some(match args[i].as_str() {
        "--clone-io" => {
            options.clone_io = Some((number(i + 1), number(i + 2), number(i + 3)));
            i + 4
        }
        "--exit-after-clones" => {
            options.after_clones = AfterClones::Exit;
            i + 1
        }
        "--reap-clones" => {
            options.after_clones = AfterClones::Reap;
            i + 1
        }
        "--nested-clone-io" => {
            options.nested_clone_io = Some((number(i + 1), number(i + 2)));
            i + 3
        }
        "--direct-chain" => {
            options.direct_chain = Some((number(i + 1), number(i + 2)));
            i + 3
        }
        _ => return None,
    })
}

/// Parses the command line; `--ioprio` is applied to the calling thread as it is parsed.
fn parse_options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let number = |i: usize| -> u64 { args[i].parse().expect("a number") };
    let mut options = Options {
        path: args[1].clone(),
        rate: number(2),
        read: number(3),
        buffer: number(4),
        secs: number(5),
        start: 0,
        seek: None,
        uring: false,
        direct: false,
        linger: 0,
        fork: None,
        stray: None,
        stray_by: StrayReader::Myself,
        clone_io: None,
        after_clones: AfterClones::GoOn,
        direct_chain: None,
        nested_clone_io: None,
    };
    let mut i = 6;
    while i < args.len() {
        match args[i].as_str() {
            "--start" => {
                options.start = number(i + 1);
                i += 2;
            }
            "--seek" => {
                options.seek = Some((number(i + 1), number(i + 2)));
                i += 3;
            }
            "--linger" => {
                options.linger = number(i + 1);
                i += 2;
            }
            "--fork" => {
                options.fork = Some((args[i + 1].clone(), number(i + 2)));
                i += 3;
            }
            "--stray" => {
                options.stray = Some(args[i + 1].clone());
                i += 2;
            }
            "--stray-shared-io" => {
                options.stray_by = StrayReader::CloneIoChild;
                i += 1;
            }
            "--stray-uring-workers" => {
                options.stray_by = StrayReader::UringWorkers;
                i += 1;
            }
            "--direct" => {
                options.direct = true;
                i += 1;
            }
            "--uring" => {
                options.uring = true;
                i += 1;
            }
            "--ioprio" => {
                let (class, level) = args[i + 1].split_once('/').expect("CLASS/LEVEL");
                set_thread_ioprio(class.parse().expect("class"), level.parse().expect("level"));
                i += 2;
            }
            other => {
                i = clone_option(&args, i, &mut options)
                    .unwrap_or_else(|| panic!("unknown argument {other}"));
            }
        }
    }
    options
}

/// Opens the file for the chosen kind of read: `O_DIRECT`, `io_uring` or plain read(2).
fn open_reader(options: &Options) -> Box<dyn ReadSeek> {
    let path = &options.path;
    let file = if options.direct {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    } else {
        File::open(path)
    }
    .expect("open");
    if options.direct {
        Box::new(DirectFile {
            file,
            storage: vec![0; (1 << 20) + 4096],
        })
    } else if options.uring {
        Box::new(UringFile {
            file,
            ring: IoUring::new(8).expect("io_uring"),
            offset: 0,
            in_workers: false,
        })
    } else {
        Box::new(file)
    }
}

fn main() {
    let options = parse_options();
    let (rate, buffer) = (options.rate, options.buffer);
    let mut reader = open_reader(&options);
    reader.seek(SeekFrom::Start(options.start)).expect("seek");
    let read = usize::try_from(options.read).expect("read size");
    let first = paced_read(
        &mut reader,
        None,
        rate,
        buffer,
        read,
        Duration::from_secs(options.secs),
    );
    println!("{}", summary(&first));
    let forked = options
        .fork
        .as_ref()
        .map(|(file, secs)| fork_child_and_thread(file, rate, read, *secs));
    if let Some((count, secs)) = options.nested_clone_io {
        fork_nested_clone_io(count, secs);
    }
    if let Some((count, keep, secs)) = options.clone_io {
        let kept = make_clone_io_children(count, keep, secs);
        println!("{{\"clone_io\":{kept:?}}}");
        if options.after_clones == AfterClones::Exit {
            // stdout is a pipe, flushed by the newline only on a terminal.
            let _ = std::io::Write::flush(&mut std::io::stdout());
            // SAFETY: leaves at once; the children, processes of their own, stay.
            unsafe { libc::_exit(0) };
        }
        if options.after_clones == AfterClones::Reap {
            let _ = std::io::Write::flush(&mut std::io::stdout());
            for child in kept {
                let mut status = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(child, &raw mut status, 0) };
            }
        }
    }
    if let Some((bytes, depth)) = options.direct_chain {
        let from = reader.stream_position().expect("position");
        let read = abiss_tests::raises::read_direct_chain(&options.path, from, bytes, depth);
        println!("{{\"direct_chain_bytes\":{read}}}");
    }
    if let Some((offset, secs)) = options.seek {
        reader.seek(SeekFrom::Start(offset)).expect("seek");
        let second = paced_read(
            &mut reader,
            None,
            rate,
            buffer,
            read,
            Duration::from_secs(secs),
        );
        println!("{}", summary(&second));
    }
    if let Some(stray) = &options.stray {
        // Right after the stream's reads, by the same thread (still raised, if it was) or by
        // a child sharing its I/O context.
        let started = std::time::Instant::now();
        let bytes = match options.stray_by {
            StrayReader::Myself => read_whole(stray),
            StrayReader::CloneIoChild => read_in_a_clone_io_child(stray),
            StrayReader::UringWorkers => read_through_uring_workers(stray),
        };
        println!(
            "{{\"stray_bytes\":{bytes},\"stray_ms\":{}}}",
            started.elapsed().as_millis()
        );
    }
    std::thread::sleep(Duration::from_secs(options.linger));
    if let Some((child, thread)) = forked {
        let _ = thread.join();
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(child, &raw mut status, 0) };
    }
    // The `CLONE_IO` children that stayed.
    let mut status = 0;
    // SAFETY: waits for our own children, until there are none.
    while unsafe { libc::waitpid(-1, &raw mut status, 0) } > 0 {}
}

/// Reads `path` whole, as fast as it can; the bytes read.
fn read_whole(path: &str) -> u64 {
    let mut other = File::open(path).expect("open the stray file");
    let mut sink = vec![0u8; 64 << 10];
    let mut bytes = 0u64;
    while let Ok(n) = std::io::Read::read(&mut other, &mut sink) {
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    bytes
}

/// Reads `path` whole through `io_uring` worker threads; the bytes read.
fn read_through_uring_workers(path: &str) -> u64 {
    let mut file = UringFile {
        file: File::open(path).expect("open the stray file"),
        ring: IoUring::new(4).expect("io_uring"),
        offset: 0,
        in_workers: true,
    };
    let mut sink = vec![0u8; 64 << 10];
    let mut bytes = 0u64;
    while let Ok(n) = file.read(&mut sink) {
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    bytes
}

/// Reads `path` whole in a child process made with `CLONE_IO` (as `fork`, but sharing this
/// thread's I/O context, hence its I/O priority: a raise of this thread is the child's too);
/// the bytes it read, from its exit.
fn read_in_a_clone_io_child(path: &str) -> u64 {
    let flags = libc::CLONE_IO | libc::SIGCHLD;
    // SAFETY: a fork-like clone (no new stack: the child runs on a copy of this one); the
    // process is single-threaded here, so the child may allocate and do I/O before `_exit`.
    let child = unsafe { libc::syscall(libc::SYS_clone, libc::c_long::from(flags), 0, 0, 0, 0) };
    assert!(child >= 0, "clone: {}", std::io::Error::last_os_error());
    if child == 0 {
        let bytes = read_whole(path);
        // The parent learns the MiB read from the exit status.
        let mib = i32::try_from((bytes >> 20).min(255)).unwrap_or(255);
        // SAFETY: ends the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(mib) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(i32::try_from(child).unwrap_or(-1), &raw mut status, 0) };
    u64::try_from(libc::WEXITSTATUS(status)).unwrap_or(0) << 20
}

/// Makes `count` child processes with `CLONE_IO` (sharing this thread's I/O context), of which
/// all but the last `keep` exit at once (and are reaped) and the last `keep` sleep `secs`; the
/// pids of those that stay.
fn make_clone_io_children(count: u64, keep: u64, secs: u64) -> Vec<i32> {
    let flags = libc::CLONE_IO | libc::SIGCHLD;
    let mut kept = Vec::new();
    for made in 0..count {
        let stays = made + keep >= count;
        // SAFETY: a fork-like clone (no new stack: the child runs on a copy of this one); the
        // process is single-threaded here, and the child only sleeps and exits.
        let child =
            unsafe { libc::syscall(libc::SYS_clone, libc::c_long::from(flags), 0, 0, 0, 0) };
        assert!(child >= 0, "clone: {}", std::io::Error::last_os_error());
        if child == 0 {
            if stays {
                // SAFETY: sleeping needs nothing of the parent's state.
                unsafe { libc::sleep(u32::try_from(secs).unwrap_or(u32::MAX)) };
            }
            // SAFETY: ends the child without running the parent's exit handlers twice.
            unsafe { libc::_exit(0) };
        }
        let child = i32::try_from(child).unwrap_or(-1);
        if stays {
            kept.push(child);
        } else {
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(child, &raw mut status, 0) };
        }
    }
    kept
}

/// Forks a child process that makes `count` child processes with `CLONE_IO`, all exiting at
/// once but the last, which forks a plain child that prints its pid and sleeps `secs`. Every
/// process in it waits for its own children; the reader reaps the first child at its end.
fn fork_nested_clone_io(count: u64, secs: u64) {
    use std::io::Write as _;
    // SAFETY: the process is single-threaded here; every process below only forks, prints,
    // sleeps, waits and exits.
    unsafe {
        if libc::fork() != 0 {
            return;
        }
        let flags = libc::CLONE_IO | libc::SIGCHLD;
        for made in 1..=count {
            let child = libc::syscall(libc::SYS_clone, libc::c_long::from(flags), 0, 0, 0, 0);
            if child == 0 {
                if made == count {
                    if libc::fork() == 0 {
                        println!("{{\"nested\":[{}]}}", libc::getpid());
                        let _ = std::io::stdout().flush();
                        libc::sleep(u32::try_from(secs).unwrap_or(u32::MAX));
                    }
                    let mut status = 0;
                    while libc::waitpid(-1, &raw mut status, 0) > 0 {}
                }
                libc::_exit(0);
            }
        }
        let mut status = 0;
        while libc::waitpid(-1, &raw mut status, 0) > 0 {}
        libc::_exit(0);
    }
}

/// From the calling (reading) thread: forks a child process that reads `file` at `rate` for
/// `secs` and exits, and starts a thread that sleeps `secs`. Both are made by this thread, so
/// both start with whatever I/O priority it has now.
fn fork_child_and_thread(
    file: &str,
    rate: u64,
    read: usize,
    secs: u64,
) -> (libc::pid_t, std::thread::JoinHandle<()>) {
    // SAFETY: the process is single-threaded here (the thread starts after the fork), so the
    // child may allocate and do I/O.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        let mut other = File::open(file).expect("open the child's file");
        let report = paced_read(
            &mut other,
            None,
            rate,
            1 << 20,
            read,
            Duration::from_secs(secs),
        );
        eprintln!("child read {} bytes", report.bytes);
        // SAFETY: ends the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(0) };
    }
    let thread = std::thread::spawn(move || std::thread::sleep(Duration::from_secs(secs)));
    (child, thread)
}

trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}
