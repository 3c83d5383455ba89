//! A file read at a guaranteed byterate.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use abiss_proto::{
    AttachRequest, ByteRate, ByteSize, StreamId, StreamInfo, StreamTarget, DEFAULT_BATCH_PAGES,
    DEFAULT_LEVEL, PAGE_BYTES,
};

use crate::client::{Client, ClientError};

/// How a file is streamed.
///
/// Rates and sizes are whole bytes (per second): `ByteRate(1_000_000)` is 1 MB/s,
/// `ByteRate(1 << 20)` 1 MiB/s. Text a user typed is read with `FromStr` by the same rules as
/// abissctl's (`"64k"` is 65 536 bytes, `"8Mbit/s"` 1 000 000 B/s; see the `abiss-units` crate):
/// `"1.1MiB/s".parse::<ByteRate>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamOptions {
    /// Guaranteed byterate, in bytes per second.
    pub rate: ByteRate,
    /// Playout buffer in bytes (the application's buffer in the ABISS slides, `app_buffer`).
    pub buffer: ByteSize,
    /// Pages per credit step.
    pub batch_pages: u32,
    /// ABISS level, 0 (real time) to 7.
    pub priority: u8,
    /// Load this much of the file's head at once at the start, beyond the buffer (a player's
    /// start-up probe); `None`: no more than the buffer.
    pub preroll: Option<ByteSize>,
    /// abissd sizes the buffer (`abissctl attach --buffer auto`): from the real-time latency
    /// its disk shows, and on a disk with a model as large as its admission needs, within the
    /// locked-memory budgets; `buffer` is then the application's own part on top (0 for
    /// none). Read streams only.
    pub buffer_auto: bool,
    /// abissd allocates a recording's file a few seconds of the rate ahead of its writer (at
    /// most 64 MiB, within the owner's quota), and gives back what is left past the end when
    /// the stream ends. Write streams only.
    pub preallocate: bool,
}

impl StreamOptions {
    /// The attach request for these options: a non-persistent stream (it ends with the
    /// connection) for reading, or for `write`.
    pub(crate) fn request(&self, write: bool) -> AttachRequest {
        AttachRequest {
            rate: self.rate,
            buffer: self.buffer,
            batch_pages: self.batch_pages,
            priority: self.priority,
            persistent: false,
            write,
            preallocate: write && self.preallocate,
            direct: false,
            preroll: if write { None } else { self.preroll },
            buffer_auto: self.buffer_auto,
        }
    }

    /// A real-time stream at `rate` with a `buffer` playout buffer and 20-page batches.
    #[must_use]
    pub fn new(rate: ByteRate, buffer: ByteSize) -> Self {
        Self {
            rate,
            buffer,
            batch_pages: DEFAULT_BATCH_PAGES,
            priority: DEFAULT_LEVEL,
            preroll: None,
            buffer_auto: false,
            preallocate: false,
        }
    }
}

/// A file attached to abissd for the lifetime of this value. Reads come from the page cache,
/// where the daemon keeps the playout buffer loaded ahead of the position. Reads tell the
/// daemon the playout point every batch consumed, seeks at once. Dropping it detaches the
/// stream.
#[derive(Debug)]
pub struct AbissFile {
    file: File,
    client: Client,
    stream: StreamInfo,
    position: u64,
    /// Last playout point sent.
    reported: u64,
    /// Progress that warrants a new position message. The daemon also sees buffered reads in
    /// the kernel, so a message per read would only add a wakeup of the daemon to every read.
    report_every: u64,
}

impl AbissFile {
    /// Opens `path` for reading and attaches it through the daemon at the default socket.
    pub fn open(path: impl AsRef<Path>, options: &StreamOptions) -> Result<Self, ClientError> {
        Self::open_with(Client::connect_default()?, path, options)
    }

    /// Opens `path` for reading and attaches it through `client`.
    pub fn open_with(
        mut client: Client,
        path: impl AsRef<Path>,
        options: &StreamOptions,
    ) -> Result<Self, ClientError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|error| ClientError::BadRequest {
            message: format!("cannot open {}: {error}", path.display()),
        })?;
        let stream = client.attach(&file, options.request(false))?;
        // Like ABISS's start-up delay: reading begins once the playout buffer is loaded, so no
        // read waits for the disk. A window that takes longer still serves, just not yet fully.
        client.wait_loaded(stream.id, std::time::Duration::from_secs(10))?;
        // The opening thread is the reader as a rule: raised now, its first read past the
        // window is not queued below the stream. An older daemon, or raises switched off,
        // leave it as it is; the stream works either way.
        let _ = client.reader_starts(stream.id, nix::unistd::gettid().as_raw().unsigned_abs());
        // The daemon moves the window in whole batches, so a message per batch consumed is as
        // fine as its window can follow. Coarser messages (a quarter buffer) let the window's
        // next load start late: where the kernel's read tracking is off (kernels before 6.12)
        // they are all the daemon hears, and a read found its pages still loading.
        let report_every = (u64::from(options.batch_pages) * PAGE_BYTES).max(PAGE_BYTES);
        Ok(Self {
            file,
            client,
            stream,
            position: 0,
            reported: 0,
            report_every,
        })
    }

    /// Opens `path` for writing (created if missing, truncated unless `append`) and attaches
    /// it as a write stream (a recording) through the daemon at the default socket: abissd
    /// writes back what is written at the stream's priority, a buffer behind the writer.
    pub fn record(
        path: impl AsRef<Path>,
        options: &StreamOptions,
        append: bool,
    ) -> Result<Self, ClientError> {
        Self::record_with(Client::connect_default()?, path, options, append)
    }

    /// [`AbissFile::record`] through `client`.
    pub fn record_with(
        mut client: Client,
        path: impl AsRef<Path>,
        options: &StreamOptions,
        append: bool,
    ) -> Result<Self, ClientError> {
        let path = path.as_ref();
        let cannot_open = |error: io::Error| ClientError::BadRequest {
            message: format!("cannot open {} for writing: {error}", path.display()),
        };
        // Opened without truncating, and emptied only once abissd took the stream: a refused
        // recording leaves the file as it was (and one this call made is removed again).
        let open = |create_new: bool| {
            File::options()
                .write(true)
                .create_new(create_new)
                .append(append)
                .open(path)
        };
        let (file, created) = match open(true) {
            Ok(file) => (file, true),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                (open(false).map_err(cannot_open)?, false)
            }
            Err(error) => return Err(cannot_open(error)),
        };
        let stream = match client.attach(&file, options.request(true)) {
            Ok(stream) => stream,
            Err(error) => {
                if created {
                    let _ = std::fs::remove_file(path);
                }
                return Err(error);
            }
        };
        if !append {
            // The daemon follows a file that shrinks: its write-behind starts over from the
            // new end (`write_behind`'s truncation case).
            file.set_len(0).map_err(|error| ClientError::BadRequest {
                message: format!("cannot truncate {}: {error}", path.display()),
            })?;
        }
        Ok(Self {
            file,
            client,
            stream,
            position: 0,
            reported: 0,
            report_every: u64::MAX,
        })
    }

    /// The stream as the daemon granted it.
    #[must_use]
    pub fn stream(&self) -> &StreamInfo {
        &self.stream
    }

    /// The stream's id.
    #[must_use]
    pub fn stream_id(&self) -> StreamId {
        self.stream.id
    }

    /// Tells the daemon the playout point explicitly (the slides' "position" message); reads
    /// and seeks do this on their own.
    pub fn set_playout_point(&mut self, offset: u64) -> io::Result<()> {
        self.reported = offset;
        self.client
            .position(self.stream.id, offset)
            .map_err(io::Error::other)
    }

    /// Gives the stream another rate (fast-forward, slow motion), if its disk admits it;
    /// refused, it keeps its rate.
    pub fn set_rate(&mut self, rate: abiss_proto::ByteRate) -> Result<(), ClientError> {
        self.stream = self
            .client
            .set_rate(StreamTarget::Id(self.stream.id), rate)?;
        Ok(())
    }

    /// Ends the stream now and returns the file.
    pub fn detach(mut self) -> Result<File, ClientError> {
        self.client.detach(StreamTarget::Id(self.stream.id))?;
        // The stream is gone: Drop must not detach again.
        let file = self
            .file
            .try_clone()
            .map_err(|error| ClientError::BadRequest {
                message: format!("cannot keep the file: {error}"),
            })?;
        self.stream.id = StreamId(0);
        Ok(file)
    }
}

impl Read for AbissFile {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read(buffer)?;
        self.position += read as u64;
        if self.position >= self.reported + self.report_every {
            // The data is the caller's either way: a message the daemon could not take now is
            // simply superseded by the next one.
            if let Ok(true) = self.client.try_position(self.stream.id, self.position) {
                self.reported = self.position;
            }
        }
        Ok(read)
    }
}

/// Writes of a recording ([`AbissFile::record`]) go to the page cache; the daemon follows the
/// file's size, so nothing is sent per write.
impl Write for AbissFile {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let written = self.file.write(data)?;
        self.position += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for AbissFile {
    fn seek(&mut self, target: SeekFrom) -> io::Result<u64> {
        self.position = self.file.seek(target)?;
        // The file has moved whatever the daemon hears; without the daemon it is a plain file.
        let _ = self.set_playout_point(self.position);
        Ok(self.position)
    }
}

impl Drop for AbissFile {
    fn drop(&mut self) {
        if self.stream.id != StreamId(0) {
            // The daemon also ends a non-persistent stream when the connection closes; an
            // explicit detach makes it immediate.
            let _ = self.client.detach(StreamTarget::Id(self.stream.id));
        }
    }
}
