//! The handle behind `ABISS_FILE`: an [`AbissFile`] with stdio's position, end-of-file and
//! error state.

use std::ffi::CStr;
use std::fs::File;
use std::io::{ErrorKind as IoErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use abiss_client::{AbissFile, Client, ClientError, DirectRecording, RecordError, StreamOptions};
use abiss_proto::{ByteRate, ByteSize};

use crate::failure::Failure;

/// Playout buffer when `abiss_fopen` gets `app_buffer` 0: the protocol's default, the 564 KiB
/// of the ABISS slides' measurements ("Measurements, description").
pub const DEFAULT_APP_BUFFER_BYTES: u64 = abiss_proto::DEFAULT_BUFFER_BYTES;

/// An open stream as C sees it (`ABISS_FILE`, opaque there).
#[derive(Debug)]
pub struct AbissStdioFile {
    backing: Backing,
    /// Bytes from the start of the file to the next read, as `abiss_ftell` reports it.
    position: u64,
    at_eof: bool,
    failed: bool,
    /// A recording (`"w"`, `"a"`): written, never read.
    writing: bool,
}

/// What an `ABISS_FILE` reads or writes through.
#[derive(Debug)]
enum Backing {
    /// A read stream, or a recording through the page cache that abissd writes back.
    Stream(AbissFile),
    /// A recording past the page cache (`ABISS_DIRECT`): the library's ring and raised writer.
    Direct(DirectRecording),
}

/// How `abiss_fopen` opens its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `"r"`: a read stream.
    Read,
    /// `"w"` (truncate) or `"a"` (append): a write stream, the file created if missing.
    Write { append: bool },
}

/// What `abiss_fopen` and `abiss_fopen_opts` ask for beyond the path, mode and rate: the
/// fields of `struct abiss_options` (`abiss_fopen` gives only `app_buffer`), still as C gave
/// them, so that [`open`] checks them all in one place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct OpenOptions {
    /// Playout buffer in bytes, 0 for the default.
    pub(crate) app_buffer: i64,
    /// Bytes of the file's head to load at once at the start, 0 for none.
    pub(crate) preroll: i64,
    /// `ABISS_*` flags.
    pub(crate) flags: u64,
}

/// `ABISS_BUFFER_AUTO`: abissd sizes the buffer; `app_buffer` is the application's own part.
pub(crate) const BUFFER_AUTO: u64 = 0x1;

/// `ABISS_DIRECT`: a recording written past the page cache, by a thread of the library.
pub(crate) const DIRECT: u64 = 0x2;

/// The flags `struct abiss_options` may carry. Every other set bit is refused, so a program
/// that asks for an option this library does not have learns it (`EINVAL`) instead of being
/// silently given less.
const KNOWN_FLAGS: u64 = BUFFER_AUTO | DIRECT;

/// `abiss_fopen`'s and `abiss_fopen_opts`'s checks and the attach. Everything that can be
/// decided locally is, before the daemon is asked and before a recording's file is created,
/// so a wrong path, mode or option fails with the precise `errno` and leaves nothing behind.
pub(crate) fn open(
    path: &CStr,
    mode: &CStr,
    byterate: i64,
    options: OpenOptions,
    connect: impl FnOnce() -> Result<Client, ClientError>,
) -> Result<AbissStdioFile, Failure> {
    let OpenOptions {
        app_buffer,
        preroll,
        flags,
    } = options;
    let mode = check_mode(mode)?;
    let rate = u64::try_from(byterate)
        .ok()
        .filter(|&rate| rate > 0)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "a byterate of {byterate} bytes/s is not positive; give the stream's rate in bytes per second"
            ))
        })?;
    let buffer_auto = flags & BUFFER_AUTO != 0;
    if buffer_auto && mode != Mode::Read {
        return Err(Failure::invalid(
            "a recording's buffer is what it keeps dirty, not sized by abissd: leave ABISS_BUFFER_AUTO out with \"w\" or \"a\"".to_owned(),
        ));
    }
    let buffer = match u64::try_from(app_buffer) {
        // With ABISS_BUFFER_AUTO, app_buffer is the application's own part, and 0 is none.
        Ok(0) if !buffer_auto => DEFAULT_APP_BUFFER_BYTES,
        Ok(bytes) => bytes,
        Err(_) => {
            return Err(Failure::invalid(format!(
                "an app_buffer of {app_buffer} bytes is negative; give 0 for the default of {DEFAULT_APP_BUFFER_BYTES} bytes"
            )))
        }
    };
    let preroll = match u64::try_from(preroll) {
        Ok(0) => None,
        Ok(_) if mode != Mode::Read => {
            return Err(Failure::invalid(format!(
                "a recording has no preroll (it reads nothing ahead), but a preroll of {preroll} bytes was given; give preroll 0 with \"w\" or \"a\""
            )))
        }
        Ok(bytes) => Some(ByteSize(bytes)),
        Err(_) => {
            return Err(Failure::invalid(format!(
                "a preroll of {preroll} bytes is negative; give 0 for none"
            )))
        }
    };
    if flags & !KNOWN_FLAGS != 0 {
        return Err(Failure::invalid(format!(
            "flags {:#x} are unknown to this libabiss; leave the options' flags at 0",
            flags & !KNOWN_FLAGS
        )));
    }
    let direct = flags & DIRECT != 0;
    if direct && mode != (Mode::Write { append: false }) {
        return Err(Failure::invalid(
            "ABISS_DIRECT records a file from its start: open it with \"w\"".to_owned(),
        ));
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let created = check_file(path, mode)?;
    let mut options = StreamOptions::new(ByteRate(rate), ByteSize(buffer));
    options.preroll = preroll;
    options.buffer_auto = buffer_auto;
    let backing = match attach(connect, path, mode, direct, &options) {
        Ok(backing) => backing,
        Err(failure) => {
            // A refused recording leaves nothing behind, not even the file fopen would make.
            if created {
                let _ = std::fs::remove_file(path);
            }
            return Err(failure);
        }
    };
    Ok(AbissStdioFile {
        backing,
        position: 0,
        at_eof: false,
        failed: false,
        writing: mode != Mode::Read,
    })
}

/// The stream asked of abissd, once every local check passed.
fn attach(
    connect: impl FnOnce() -> Result<Client, ClientError>,
    path: &Path,
    mode: Mode,
    direct: bool,
    options: &StreamOptions,
) -> Result<Backing, Failure> {
    if direct {
        return DirectRecording::start_with_connect(connect, path, options)
            .map(Backing::Direct)
            .map_err(|error| record_failure(&error));
    }
    connect()
        .and_then(|client| match mode {
            Mode::Read => AbissFile::open_with(client, path, options),
            Mode::Write { append } => AbissFile::record_with(client, path, options, append),
        })
        .map(Backing::Stream)
        .map_err(Failure::from)
}

/// The `errno` of a direct recording that could not start or finish.
fn record_failure(error: &RecordError) -> Failure {
    let errno = match error {
        RecordError::Client(client) => {
            return Failure::new(crate::failure::client_errno(client), client.to_string())
        }
        RecordError::NoDirectIo(_) => libc::EOPNOTSUPP,
        RecordError::DiskFull(_) => libc::ENOSPC,
        RecordError::File(_) | RecordError::Write(_) => libc::EIO,
    };
    Failure::new(errno, error.to_string())
}

/// "r" (a read stream), "w" or "a" (a recording), each with stdio's "b" (no meaning on POSIX)
/// and glibc's "e" (close on exec, which the library's descriptors always are). A stream is
/// read or written, never both: no "+".
fn check_mode(mode: &CStr) -> Result<Mode, Failure> {
    let bytes = mode.to_bytes();
    let flags_ok = |rest: &[u8]| rest.iter().all(|flag| matches!(flag, b'b' | b'e'));
    match bytes.split_first() {
        Some((b'r', rest)) if flags_ok(rest) => Ok(Mode::Read),
        Some((b'w', rest)) if flags_ok(rest) => Ok(Mode::Write { append: false }),
        Some((b'a', rest)) if flags_ok(rest) => Ok(Mode::Write { append: true }),
        _ => Err(Failure::invalid(format!(
            "mode \"{}\" is not a stream mode; open a stream with \"r\" to read, \"w\" or \"a\" to record",
            mode.to_string_lossy()
        ))),
    }
}

/// The file must be a regular file this process can open as `mode` asks (to read, it must
/// exist; to record, it is created if missing); whether it was created.
fn check_file(path: &Path, mode: Mode) -> Result<bool, Failure> {
    let cannot_open =
        |error: &std::io::Error| Failure::io(&format!("cannot open {}", path.display()), error);
    if path.as_os_str().is_empty() {
        return Err(Failure::new(
            libc::ENOENT,
            "the path is empty; give the file to stream",
        ));
    }
    let metadata = match std::fs::metadata(path) {
        Err(error) if mode != Mode::Read && error.kind() == IoErrorKind::NotFound => {
            // Created as fopen(3) would, so a missing directory fails with its own errno.
            File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(|error| cannot_open(&error))?;
            return Ok(true);
        }
        found => found.map_err(|error| cannot_open(&error))?,
    };
    if metadata.is_dir() {
        return Err(Failure::new(
            libc::EISDIR,
            format!(
                "{} is a directory; only regular files can be streamed",
                path.display()
            ),
        ));
    }
    if !metadata.is_file() {
        // Checked before opening: opening a FIFO for reading would block until a writer comes.
        return Err(Failure::invalid(format!(
            "{} is not a regular file; only regular files can be streamed",
            path.display()
        )));
    }
    // The client library reports any open failure as a bad request; opening here first keeps
    // the system's errno (EACCES, ...). For a recording, without truncating: that is the
    // attach's to do, once the daemon is reached.
    match mode {
        Mode::Read => File::open(path),
        Mode::Write { .. } => File::options().write(true).truncate(false).open(path),
    }
    .map_err(|error| cannot_open(&error))?;
    Ok(false)
}

impl AbissStdioFile {
    /// Fills `buffer` as far as the file goes and returns the bytes read. Stops early only at
    /// the end of the file or on an error, which is recorded (errno, message, error flag).
    pub(crate) fn read_fully(&mut self, buffer: &mut [u8]) -> usize {
        if self.writing {
            self.failed = true;
            Failure::new(
                libc::EBADF,
                "the stream was opened to record (\"w\" or \"a\"); it cannot be read",
            )
            .record();
            return 0;
        }
        let Backing::Stream(file) = &mut self.backing else {
            unreachable!("a direct recording is a recording")
        };
        let mut filled = 0;
        while let Some(rest) = buffer.get_mut(filled..).filter(|rest| !rest.is_empty()) {
            match file.read(rest) {
                Ok(0) => {
                    self.at_eof = true;
                    break;
                }
                Ok(read) => {
                    filled += read;
                    self.position += read as u64;
                }
                Err(error) if error.kind() == IoErrorKind::Interrupted => {}
                Err(error) => {
                    self.failed = true;
                    let what = format!("cannot read {}", file.stream().path);
                    Failure::io(&what, &error).record();
                    break;
                }
            }
        }
        filled
    }

    /// Writes all of `data` unless an error stops it (recorded as for reads); returns the
    /// bytes written.
    pub(crate) fn write_fully(&mut self, data: &[u8]) -> usize {
        if !self.writing {
            self.failed = true;
            Failure::new(
                libc::EBADF,
                "the stream was opened to read (\"r\"); open it with \"w\" or \"a\" to record",
            )
            .record();
            return 0;
        }
        let path = self.path();
        let mut written = 0;
        while let Some(rest) = data.get(written..).filter(|rest| !rest.is_empty()) {
            let wrote = match &mut self.backing {
                Backing::Stream(file) => file.write(rest),
                // Waits for room in the ring when it is full: nothing is dropped.
                Backing::Direct(recording) => recording.write_all(rest).map(|()| rest.len()),
            };
            match wrote {
                Ok(0) => break,
                Ok(count) => {
                    written += count;
                    self.position += count as u64;
                }
                Err(error) if error.kind() == IoErrorKind::Interrupted => {}
                Err(error) => {
                    self.failed = true;
                    let what = format!("cannot write {path}");
                    Failure::io(&what, &error).record();
                    break;
                }
            }
        }
        written
    }

    /// Moves the read position (and with it the playout point) as `fseek` does.
    pub(crate) fn seek(&mut self, offset: i64, whence: i32) -> Result<(), Failure> {
        let file = match &mut self.backing {
            Backing::Stream(file) => file,
            Backing::Direct(_) => {
                return Err(Failure::new(
                    libc::ESPIPE,
                    "a direct recording (ABISS_DIRECT) is written in order; it cannot seek",
                ))
            }
        };
        let target = match whence {
            libc::SEEK_SET => SeekFrom::Start(u64::try_from(offset).map_err(|_| {
                Failure::invalid(format!("cannot seek to {offset}, before the file's start"))
            })?),
            libc::SEEK_CUR => SeekFrom::Current(offset),
            libc::SEEK_END => SeekFrom::End(offset),
            _ => {
                return Err(Failure::invalid(format!(
                    "whence {whence} is none of SEEK_SET, SEEK_CUR and SEEK_END"
                )))
            }
        };
        match file.seek(target) {
            Ok(position) => {
                self.position = position;
                self.at_eof = false;
                Ok(())
            }
            // The system refused the seek (EINVAL before the start): nothing moved. If the
            // daemon connection failed instead, the file has moved but the stream is broken;
            // stdio too leaves the position unspecified after a failed fseek.
            Err(error) => Err(Failure::io(
                &format!("cannot seek in {}", file.stream().path),
                &error,
            )),
        }
    }

    /// The read position.
    pub(crate) fn position(&self) -> u64 {
        self.position
    }

    /// Tells the daemon the playout point (the slides' "position" message).
    pub(crate) fn set_playout_point(&mut self, offset: u64) -> Result<(), Failure> {
        let file = match &mut self.backing {
            Backing::Stream(file) => file,
            Backing::Direct(_) => return Err(Failure::invalid(
                "a direct recording (ABISS_DIRECT) has no playout point: its writer is its pace",
            )),
        };
        file.set_playout_point(offset).map_err(|error| {
            Failure::io(
                &format!(
                    "cannot tell abissd the playout point of {}",
                    file.stream().path
                ),
                &error,
            )
        })
    }

    /// The stream's path, as abissd named it.
    fn path(&self) -> String {
        match &self.backing {
            Backing::Stream(file) => file.stream().path.clone(),
            Backing::Direct(recording) => recording.stream().path.clone(),
        }
    }

    /// The daemon's id of the stream.
    /// Gives the stream another rate; refused, it keeps its rate.
    pub(crate) fn set_rate(&mut self, rate: abiss_proto::ByteRate) -> Result<(), Failure> {
        match &mut self.backing {
            Backing::Stream(file) => file.set_rate(rate),
            Backing::Direct(recording) => recording.set_rate(rate),
        }
        .map_err(Failure::from)
    }

    /// The stream's id as the C interface hands it out: a plain number.
    pub(crate) fn stream_id(&self) -> u64 {
        match &self.backing {
            Backing::Stream(file) => file.stream_id().0,
            Backing::Direct(recording) => recording.stream().id.0,
        }
    }

    pub(crate) fn at_eof(&self) -> bool {
        self.at_eof
    }

    pub(crate) fn failed(&self) -> bool {
        self.failed
    }

    /// Ends the stream at the daemon; the file closes either way. A direct recording first
    /// writes what its ring holds and truncates the file to the bytes written; that abissd is
    /// gone by then is no failure (it holds none of the data).
    pub(crate) fn close(self) -> Result<(), Failure> {
        let path = self.path();
        let file = match self.backing {
            Backing::Stream(file) => file,
            Backing::Direct(recording) => {
                return recording.finish().map(drop).map_err(|error| {
                    let failure = record_failure(&error);
                    Failure::new(
                        failure.errno,
                        format!("cannot finish {path}: {}", failure.message),
                    )
                })
            }
        };
        file.detach().map(drop).map_err(|error| {
            let failure = Failure::from(error);
            Failure::new(
                failure.errno,
                format!("cannot detach {path}: {}", failure.message),
            )
        })
    }
}
