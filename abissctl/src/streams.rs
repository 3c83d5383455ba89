//! `abissctl attach | detach | run | list | status`: streams with a guaranteed byterate.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use abiss_client::Client;
use abiss_proto::{
    AttachRequest, ByteRate, ByteSize, DeviceNumber, StreamId, StreamInfo, StreamTarget,
};
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use crate::error::CliError;

/// Parameters of a stream as given on the command line.
#[derive(Debug, Clone)]
pub struct StreamParameters {
    /// Rate.
    pub rate: ByteRate,
    /// Playout buffer (with `buffer_auto`, the application's part).
    pub buffer: ByteSize,
    /// abissd sizes the buffer from the disk.
    pub buffer_auto: bool,
    /// Pages per batch.
    pub batch: u32,
    /// ABISS level.
    pub priority: u8,
    /// A recording: the file is written, and written back behind the writer.
    pub write: bool,
    /// Allocate a recording's file ahead of the writer.
    pub preallocate: bool,
    /// Load this much of the head at once at the start.
    pub preroll: Option<ByteSize>,
}

impl StreamParameters {
    fn request(&self, persistent: bool) -> AttachRequest {
        AttachRequest {
            rate: self.rate,
            buffer: self.buffer,
            batch_pages: self.batch,
            priority: self.priority,
            persistent,
            write: self.write,
            preallocate: self.preallocate,
            direct: false,
            preroll: self.preroll,
            buffer_auto: self.buffer_auto,
        }
    }

    /// Opens `path` as this user, for reading, or for a recording for writing (created if
    /// missing, never truncated: a recorder started later decides): the daemon gets the
    /// descriptor, never the path.
    fn open(&self, path: &Path) -> Result<File, CliError> {
        let opened = if self.write {
            File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        } else {
            File::open(path)
        };
        let how = if self.write { " for writing" } else { "" };
        opened.map_err(|error| {
            CliError::BadFile(format!("cannot open {}{how}: {error}", path.display()))
        })
    }

    /// Waits for a read stream's first window (a recording has nothing to load).
    fn wait_loaded(&self, client: &mut Client, id: StreamId) -> Result<(), CliError> {
        if !self.write && !client.wait_loaded(id, std::time::Duration::from_secs(10))? {
            eprintln!("{}", not_loaded(client, id));
        }
        Ok(())
    }
}

/// Attaches `path` until it is detached; prints the stream id.
pub fn attach(
    client: &mut Client,
    path: &Path,
    parameters: &StreamParameters,
    json: bool,
) -> Result<(), CliError> {
    let file = parameters.open(path)?;
    let info = client.attach(&file, parameters.request(true))?;
    warn_of(&info);
    // The stream is ready when its playout buffer is loaded: readers started after this
    // command find their first buffer in memory.
    parameters.wait_loaded(client, info.id)?;
    if json {
        println!("{}", serde_json::to_string(&info).unwrap_or_default());
    } else {
        println!("{}", info.id);
    }
    Ok(())
}

/// Prints what abissd warned of the stream (its storage stack's costs), a sentence a line.
fn warn_of(info: &StreamInfo) {
    for warning in &info.warnings {
        eprintln!("abissctl: warning: {warning}");
    }
}

/// Ends a stream named by id or by file.
pub fn detach(client: &mut Client, target: &str) -> Result<(), CliError> {
    let id = client.detach(stream_target(target)?)?;
    println!("detached stream {id}");
    Ok(())
}

/// `abissctl set-rate`: prints the stream's new rate.
pub fn set_rate(client: &mut Client, target: &str, rate: ByteRate) -> Result<(), CliError> {
    let info = client.set_rate(stream_target(target)?, rate)?;
    println!("stream {} now at {}", info.id, info.rate.readable());
    Ok(())
}

/// The stream a command line names: by id, or by its file.
fn stream_target(target: &str) -> Result<StreamTarget, CliError> {
    let path = Path::new(target);
    // A number names a stream, unless a file of that name exists here.
    let target = if let (Ok(id), false) = (target.parse::<u64>(), path.exists()) {
        StreamTarget::Id(StreamId(id))
    } else {
        {
            let meta = std::fs::metadata(path).map_err(|error| {
                CliError::BadFile(format!(
                    "'{target}' is neither a stream id nor a file ({error})"
                ))
            })?;
            StreamTarget::File {
                device: DeviceNumber {
                    major: libc::major(meta.dev()),
                    minor: libc::minor(meta.dev()),
                },
                inode: meta.ino(),
            }
        }
    };
    Ok(target)
}

/// Attaches `path` for as long as `command` runs; returns the command's exit code, or 128 + N
/// when signal N killed it (as a shell reports it).
/// Why an attached stream's window is not loaded yet, in one sentence.
fn not_loaded(client: &mut Client, id: StreamId) -> String {
    let limited = client
        .list()
        .ok()
        .and_then(|streams| streams.into_iter().find(|s| s.id == id))
        .is_some_and(|s| s.start_limited);
    if limited {
        format!(
            "abissctl: stream {id}: your start-up allowance is used up (too many attaches \
             lately), so its window fills at the stream's rate, not at once"
        )
    } else {
        format!("abissctl: stream {id}: its window is not loaded yet after 10 s; the disk is slow")
    }
}

pub fn run(
    client: &mut Client,
    path: &Path,
    parameters: &StreamParameters,
    command: &[String],
) -> Result<i32, CliError> {
    let file = parameters.open(path)?;
    let Some((program, args)) = command.split_first() else {
        return Err(CliError::Command("no command given after --".into()));
    };
    // Not persistent: the stream ends when this connection closes, even if abissctl is killed.
    let info = client.attach(&file, parameters.request(false))?;
    warn_of(&info);
    // ABISS's start-up delay: a reader started after its first window is loaded finds its
    // data in memory. A stream with a preroll is a player that probes its file as fast as it
    // can before it plays: it waits for those pages whatever it does, so it starts at once,
    // and its own start (loading its libraries, opening its decoders) overlaps the loading.
    if parameters.preroll.is_none() {
        parameters.wait_loaded(client, info.id)?;
    }
    // The command is raised to the stream's level before it runs, so its first reads past the
    // window (a player's probe) are not queued below the stream; its own threads are raised
    // as they miss.
    let status = supervise(program, args, |pid| {
        let _ = client.reader_starts(info.id, pid);
    })?;
    let _ = client.detach(StreamTarget::Id(info.id));
    Ok(status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1))
}

/// The signals `run` passes on to its command, so that `kill`, a service manager or a
/// terminal's hangup reach the program that does the work.
const FORWARDED: [Signal; 6] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// Runs the command and passes the [`FORWARDED`] signals abissctl receives on to it until it
/// ends.
///
/// The signals (and `SIGCHLD`) are blocked before the command starts and read from a
/// signalfd, so none is lost or handled twice between the start and the first read, and no
/// handler runs at an awkward moment; the command itself starts with no signal blocked (see
/// [`start_gated`]). Signals the kernel sent (Ctrl-C, `^\`, a
/// hangup) went to the whole foreground process group, the command included, so they are not
/// sent a second time.
fn supervise(
    program: &str,
    args: &[String],
    before_exec: impl FnOnce(u32),
) -> Result<ExitStatus, CliError> {
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        CliError::Command(format!("cannot run {program}: {what}: {error}"))
    };
    let mut signals = SigSet::empty();
    for signal in FORWARDED {
        signals.add(signal);
    }
    signals.add(Signal::SIGCHLD);
    signals
        .thread_block()
        .map_err(|e| failed("blocking signals", &e))?;
    let signalfd = SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC)
        .map_err(|e| failed("signalfd", &e))?;
    let pid = start_gated(program, args, before_exec)?;
    loop {
        // Checked before each wait: a SIGCHLD that came before this look is still pending.
        let mut raw_status = 0;
        // SAFETY: waitpid on our own child, with a status integer that lives through the call.
        let reaped = unsafe { libc::waitpid(pid.as_raw(), &raw mut raw_status, libc::WNOHANG) };
        if reaped < 0 {
            return Err(failed("waiting", &std::io::Error::last_os_error()));
        }
        if reaped == pid.as_raw() {
            return Ok(ExitStatus::from_raw(raw_status));
        }
        let Some(info) = signalfd
            .read_signal()
            .map_err(|e| failed("reading signals", &e))?
        else {
            continue;
        };
        let signal = i32::try_from(info.ssi_signo)
            .ok()
            .and_then(|number| Signal::try_from(number).ok());
        match signal {
            Some(Signal::SIGCHLD) | None => {}
            Some(_) if info.ssi_code == libc::SI_KERNEL => {}
            Some(signal) => {
                // The command may just have ended: ESRCH then, and the next look reaps it.
                let _ = kill(pid, signal);
            }
        }
    }
}

/// Starts `program` with `args` (found on `PATH`, as a shell would), with no signal blocked,
/// and calls `before_exec` with its process id while it waits between fork and exec; returns
/// the process id once it runs `program`.
///
/// By hand rather than with `std::process::Command`, whose `spawn` returns only after the
/// exec, so nothing can be done to the child's process before its program runs (abissd
/// raising it); and it left the signals abissctl blocks blocked in the child.
fn start_gated(
    program: &str,
    args: &[String],
    before_exec: impl FnOnce(u32),
) -> Result<Pid, CliError> {
    let failed = |what: &str, error: &dyn std::fmt::Display| {
        CliError::Command(format!("cannot run {program}: {what}: {error}"))
    };
    let words: Vec<CString> = std::iter::once(program)
        .chain(args.iter().map(String::as_str))
        .map(CString::new)
        .collect::<Result<_, _>>()
        .map_err(|e| failed("a word holds a NUL byte", &e))?;
    let mut pointers: Vec<*const libc::c_char> = words.iter().map(|w| w.as_ptr()).collect();
    pointers.push(std::ptr::null());
    // The gate holds the child before exec; the report pipe brings back an exec's errno.
    let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
    let (gate_read, gate_write) = nix::unistd::pipe2(cloexec).map_err(|e| failed("pipe", &e))?;
    let (report_read, report_write) =
        nix::unistd::pipe2(cloexec).map_err(|e| failed("pipe", &e))?;
    let fds = [
        gate_read.as_raw_fd(),
        gate_write.as_raw_fd(),
        report_write.as_raw_fd(),
    ];
    // SAFETY: abissctl has one thread, so the child may run anything; it runs only
    // async-signal-safe calls all the same, on memory prepared before the fork.
    match unsafe { nix::unistd::fork() }.map_err(|e| failed("fork", &e))? {
        nix::unistd::ForkResult::Child => unsafe {
            let mut empty = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&raw mut empty);
            libc::pthread_sigmask(libc::SIG_SETMASK, &raw const empty, std::ptr::null_mut());
            libc::close(fds[1]);
            let mut byte = 0u8;
            // Any outcome (a byte, end of file, an error) opens the gate.
            let _ = libc::read(fds[0], (&raw mut byte).cast(), 1);
            libc::execvp(pointers[0], pointers.as_ptr());
            let errno = *libc::__errno_location();
            let _ = libc::write(fds[2], (&raw const errno).cast(), 4);
            libc::_exit(127)
        },
        nix::unistd::ForkResult::Parent { child } => {
            drop(gate_read);
            drop(report_write);
            before_exec(child.as_raw().unsigned_abs());
            drop(gate_write);
            let mut errno = [0u8; 4];
            let mut report = File::from(report_read);
            if std::io::Read::read(&mut report, &mut errno).unwrap_or(0) == 4 {
                let _ = nix::sys::wait::waitpid(child, None);
                let error = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
                return Err(CliError::Command(format!("cannot run {program}: {error}")));
            }
            Ok(child)
        }
    }
}

fn readers(info: &StreamInfo) -> String {
    if info.readers.is_empty() {
        return "-".to_owned();
    }
    info.readers
        .iter()
        .map(|r| {
            // A raised reader is marked with a `^`.
            let mark = if r.raised { "^" } else { "" };
            format!("{}({}){mark}", r.comm, r.pid)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Prints the streams.
pub fn list(client: &mut Client, json: bool) -> Result<(), CliError> {
    let streams = client.list()?;
    let mut out = std::io::stdout().lock();
    if json {
        crate::json::print(&mut out, &streams);
        return Ok(());
    }
    let _ = writeln!(
        out,
        "{:>4} {:<32} {:>12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>6} {:>8} {:>11}  READERS (^ raised)",
        "ID",
        "FILE",
        "RATE",
        "BUFFER",
        "POINT",
        "RESIDENT",
        "LOCKED",
        "CREDIT",
        "MISSES",
        "RAISED",
        "PREFETCHED"
    );
    for info in &streams {
        let _ = writeln!(
            out,
            "{:>4} {:<32} {:>12} {:>11} {:>11} {:>11} {:>11} {:>11} {:>6} {:>8} {:>11}  {}",
            info.id,
            info.path,
            info.rate.readable(),
            info.buffer.readable(),
            info.playout_point,
            ByteSize(info.resident_bytes).readable(),
            ByteSize(info.locked_bytes).readable(),
            crate::sizes::signed_size(info.credit_bytes),
            info.misses,
            info.raises,
            ByteSize(info.prefetched_bytes).readable(),
            readers(info)
        );
        if let Some(recording) = &info.recording {
            let _ = writeln!(
                out,
                "     stream {}: {}",
                info.id,
                recording_line(recording)
            );
        }
        if let Some(auto) = &info.buffer_auto {
            let _ = writeln!(out, "     stream {}: {}", info.id, auto_buffer_line(auto));
        }
        if info.seek_waits > 0 {
            let _ = writeln!(
                out,
                "     stream {}: {} reads waited for the window to refill after a seek (not misses)",
                info.id, info.seek_waits
            );
        }
        if let Some(advice) = &info.suggestion {
            let _ = writeln!(out, "     stream {}: {advice}", info.id);
        }
        if info.policed > 0 {
            let _ = writeln!(
                out,
                "     stream {}: {} reader(s) lost their raise for real-time reads of other files",
                info.id, info.policed
            );
        }
    }
    Ok(())
}

/// Why an automatic buffer has its size, in one line.
fn auto_buffer_line(auto: &abiss_proto::AutoBufferInfo) -> String {
    let tail = if auto.measured {
        format!(
            "the disk's p99 of {} ms at the stream's priority class over the last seconds",
            auto.tail_us.div_ceil(1000)
        )
    } else if auto.estimated {
        format!(
            "an estimate of {} ms, the p99 of service time of all the disk's requests, until the \
             disk has shown its latency at the stream's priority class",
            auto.tail_us.div_ceil(1000)
        )
    } else {
        format!(
            "a default {} ms until the disk has shown its latency at the stream's priority class",
            auto.tail_us / 1000
        )
    };
    let app = if auto.app_bytes == 0 {
        String::new()
    } else {
        format!(" plus your {}", ByteSize(auto.app_bytes).readable())
    };
    let capped = if auto.capped {
        "; it would be larger, but the locked-memory budget has no room"
    } else {
        ""
    };
    let capacity = auto.for_capacity_bytes.map_or_else(String::new, |bytes| {
        format!(
            "; enlarged to {} so that the disk admits it next to the other streams (larger loads, fewer seeks)",
            ByteSize(bytes).readable()
        )
    });
    format!("buffer auto: twice the rate over {tail}, plus two batches{app}{capped}{capacity}")
}

/// What a write stream did, in one line.
fn recording_line(recording: &abiss_proto::RecordingInfo) -> String {
    if recording.direct {
        return format!(
            "recording past the page cache (abissctl record): written {}",
            ByteSize(recording.written_end).readable()
        );
    }
    let headroom = if recording.headroom_bytes >= 0 {
        format!(
            "{} before the writer is a buffer ahead",
            ByteSize(recording.headroom_bytes.unsigned_abs()).readable()
        )
    } else {
        format!(
            "the writer is {} beyond its buffer (it may be throttled)",
            ByteSize(recording.headroom_bytes.unsigned_abs()).readable()
        )
    };
    let allocated = if recording.preallocated_bytes == 0 {
        String::new()
    } else {
        format!(
            "; allocated to {}",
            ByteSize(recording.preallocated_end).readable()
        )
    };
    format!(
        "recording: written {}, written back {} ({} by abissd), {} dirty; {headroom}{allocated}",
        ByteSize(recording.written_end).readable(),
        ByteSize(recording.written_back_end).readable(),
        ByteSize(recording.written_back_bytes).readable(),
        ByteSize(recording.dirty_bytes).readable(),
    )
}
