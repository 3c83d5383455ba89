//! A recording written past the page cache ([`DirectRecording`]): the file opened with
//! `O_DIRECT` and attached as a direct write stream, the ring and its writer thread
//! (`direct`), and abissd asked to raise that thread to the stream's level.
//!
//! abissd only admits the stream and raises the writer: should it die, the recording goes on
//! at best effort, and nothing handed to the ring is lost.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use abiss_proto::{StreamId, StreamInfo, StreamTarget};

use crate::client::{Client, ClientError};
use crate::direct::{direct_alignment, ring_bytes, DirectSummary, DirectWriter, MAX_PIECE_BYTES};
use crate::file::StreamOptions;

/// Why a direct recording could not start or finish. Each is one sentence.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The daemon could not be asked, or refused.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The file cannot be opened or made.
    #[error("{0}")]
    File(String),
    /// The file's file system does no direct I/O (tmpfs, most FUSE file systems), or wants an
    /// alignment the recorder cannot give.
    #[error("{0}")]
    NoDirectIo(String),
    /// The file system is full.
    #[error("{0}")]
    DiskFull(String),
    /// Writing failed.
    #[error("{0}")]
    Write(String),
}

/// A file recorded past the page cache at a guaranteed rate. Writes are copies into a ring of
/// memory this process owns, which abissd locks for it (or, where it does not, this process
/// as far as its `RLIMIT_MEMLOCK` allows); a thread of the library writes the ring to the file with
/// `O_DIRECT`, raised by abissd to the stream's level. Call
/// [`DirectRecording::finish`] at the end: it writes the tail, truncates the file to the exact
/// size written, and ends the stream (dropping it does the same, without the figures).
pub struct DirectRecording {
    writer: Option<DirectWriter>,
    client: Client,
    stream: StreamInfo,
    raised: bool,
    /// Why abissd did not lock the ring, if it did not.
    ring_refusal: Option<String>,
    path: PathBuf,
}

impl std::fmt::Debug for DirectRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectRecording")
            .field("stream", &self.stream.id)
            .field("raised", &self.raised)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// A finished direct recording: what the writer did, and whether abissd was there to the end.
/// Serialized flat (the writer's figures beside the rest), as `abissctl record --json` prints it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecordingSummary {
    /// The writer's figures.
    #[serde(flatten)]
    pub direct: DirectSummary,
    /// The writer thread was raised to the stream's level at the start.
    pub raised: bool,
    /// abissd could not be told the recording ended (it stopped or crashed during it): the
    /// recording went on at best effort from then.
    pub daemon_lost: bool,
    /// Why abissd did not lock the ring (this process then locked it as far as its
    /// `RLIMIT_MEMLOCK` allows), if it did not.
    pub ring_refusal: Option<String>,
}

impl DirectRecording {
    /// Creates (or empties) `path` and records into it through the daemon at the default
    /// socket, with a ring of `options.buffer`.
    pub fn start(path: impl AsRef<Path>, options: &StreamOptions) -> Result<Self, RecordError> {
        Self::begin(Client::connect_default, path.as_ref(), options)
    }

    /// [`DirectRecording::start`] through the daemon at `socket`, connected once the file
    /// passed its checks.
    pub fn start_at(
        socket: &Path,
        path: impl AsRef<Path>,
        options: &StreamOptions,
    ) -> Result<Self, RecordError> {
        Self::begin(|| Client::connect(socket), path.as_ref(), options)
    }

    /// [`DirectRecording::start`] through `client`.
    pub fn start_with(
        client: Client,
        path: impl AsRef<Path>,
        options: &StreamOptions,
    ) -> Result<Self, RecordError> {
        Self::begin(|| Ok(client), path.as_ref(), options)
    }

    /// [`DirectRecording::start`] through the client `connect` makes, called once the file
    /// passed its checks (as the C library connects).
    pub fn start_with_connect(
        connect: impl FnOnce() -> Result<Client, ClientError>,
        path: impl AsRef<Path>,
        options: &StreamOptions,
    ) -> Result<Self, RecordError> {
        Self::begin(connect, path.as_ref(), options)
    }

    /// Bad input (a file system without direct I/O, a full one) is refused before abissd is
    /// asked, and a file this call created is removed again on any refusal.
    fn begin(
        connect: impl FnOnce() -> Result<Client, ClientError>,
        path: &Path,
        options: &StreamOptions,
    ) -> Result<Self, RecordError> {
        let (file, created) = open_direct(path)?;
        let remove = |error: RecordError| {
            if created {
                let _ = std::fs::remove_file(path);
            }
            error
        };
        let align = check_file(&file, path, options).map_err(remove)?;
        let mut request = options.request(true);
        request.direct = true;
        // Admitted to lock the ring as it will be: whole pieces.
        request.buffer = abiss_proto::ByteSize(
            u64::try_from(ring_bytes(options.buffer.0, align)).unwrap_or(u64::MAX),
        );
        let mut client = connect().map_err(|e| remove(e.into()))?;
        let stream = client
            .attach(&file, request)
            .map_err(|e| remove(e.into()))?;
        // Emptied only once abissd took the stream: a refusal leaves the file as it was.
        file.set_len(0).map_err(|error| {
            RecordError::File(format!("cannot empty {}: {error}", path.display()))
        })?;
        let writer = DirectWriter::start(file, options.buffer.0, align)
            .map_err(|error| RecordError::Write(format!("cannot start the writer: {error}")))?;
        // Its writes are queued at the stream's level from now on. An older daemon, raises
        // switched off or a user who owes for real-time reads leave it as it is: it records at
        // best effort.
        let raised = client
            .reader_starts(stream.id, writer.writer_tid())
            .unwrap_or(false);
        // abissd locks the ring against the stream's budget; where it does not (a ring larger
        // than the stream's buffer and batch), it is locked here as far as the user's
        // RLIMIT_MEMLOCK allows. Either way before the first byte is copied in.
        let ring_refusal = match writer.ring_fd() {
            Some(ring) => client
                .lock_ring(stream.id, ring)
                .err()
                .map(|e| e.to_string()),
            None => Some("the ring is not a memfd (a direct-I/O alignment over 4 KiB)".into()),
        };
        writer.ring_locked(ring_refusal.is_none());
        Ok(Self {
            writer: Some(writer),
            client,
            stream,
            raised,
            ring_refusal,
            path: path.to_path_buf(),
        })
    }

    /// The stream as abissd granted it.
    #[must_use]
    pub fn stream(&self) -> &StreamInfo {
        &self.stream
    }

    /// Whether abissd raised the writer thread at the start.
    #[must_use]
    pub fn raised(&self) -> bool {
        self.raised
    }

    /// Gives the stream another rate (the ring keeps its size); refused, it keeps its rate.
    pub fn set_rate(&mut self, rate: abiss_proto::ByteRate) -> Result<(), ClientError> {
        self.stream = self
            .client
            .set_rate(StreamTarget::Id(self.stream.id), rate)?;
        Ok(())
    }

    /// Writes that found the ring full and waited, so far.
    #[must_use]
    pub fn overflows(&self) -> u64 {
        self.writer.as_ref().map_or(0, DirectWriter::overflows)
    }

    /// Writes what is left, truncates the file to its exact size and ends the stream.
    pub fn finish(mut self) -> Result<RecordingSummary, RecordError> {
        let writer = self.writer.take();
        let direct = writer
            .map(DirectWriter::finish)
            .transpose()
            .map_err(|error| write_error(&self.path, &error))?
            .unwrap_or_default();
        let daemon_lost = self
            .client
            .detach(StreamTarget::Id(self.stream.id))
            .is_err();
        self.stream.id = StreamId(0);
        Ok(RecordingSummary {
            direct,
            raised: self.raised,
            daemon_lost,
            ring_refusal: self.ring_refusal.take(),
        })
    }
}

impl Write for DirectRecording {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.write_all(data)?;
        Ok(data.len())
    }

    fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match &mut self.writer {
            Some(writer) => writer.write_all(data),
            None => Err(io::Error::other("the recording is finished")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for DirectRecording {
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            let _ = writer.finish();
        }
        if self.stream.id != StreamId(0) {
            let _ = self.client.detach(StreamTarget::Id(self.stream.id));
        }
    }
}

/// Opens `path` for direct writing, made if missing (and whether it was), not emptied yet.
fn open_direct(path: &Path) -> Result<(File, bool), RecordError> {
    let open = |create_new: bool| {
        File::options()
            .write(true)
            .create_new(create_new)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    };
    let result = match open(true) {
        Ok(file) => Ok((file, true)),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            open(false).map(|file| (file, false))
        }
        Err(error) => Err(error),
    };
    result.map_err(|error| {
        if error.raw_os_error() == Some(libc::EINVAL) {
            no_direct_io(path)
        } else {
            RecordError::File(format!(
                "cannot open {} for writing: {error}",
                path.display()
            ))
        }
    })
}

fn no_direct_io(path: &Path) -> RecordError {
    RecordError::NoDirectIo(format!(
        "the file system of {} does not do direct I/O (tmpfs, FUSE); record on a disk's file \
         system (ext4, xfs), or through the page cache with `abissctl attach --write`",
        path.display()
    ))
}

/// The alignment `file` wants, checked: direct I/O, an alignment a piece can keep, room for a
/// ring's worth of data.
fn check_file(file: &File, path: &Path, options: &StreamOptions) -> Result<usize, RecordError> {
    let (offset_align, memory_align) = direct_alignment(file)
        .map_err(|error| RecordError::File(format!("cannot stat {}: {error}", path.display())))?
        .ok_or_else(|| no_direct_io(path))?;
    let align = usize::try_from(offset_align.max(memory_align)).unwrap_or(usize::MAX);
    if !align.is_power_of_two() || align > MAX_PIECE_BYTES {
        return Err(RecordError::NoDirectIo(format!(
            "the file system of {} wants direct I/O aligned to {align} bytes, more than the \
             recorder's {MAX_PIECE_BYTES}-byte pieces; record through the page cache with \
             `abissctl attach --write`",
            path.display()
        )));
    }
    let space = nix::sys::statvfs::fstatvfs(file)
        .map_err(|error| RecordError::File(format!("cannot stat {}: {error}", path.display())))?;
    let free = space.blocks_available() * space.fragment_size();
    let needed = options.buffer.0.max(options.rate.0);
    if free < needed {
        return Err(RecordError::DiskFull(format!(
            "the file system of {} has {free} bytes free for you, less than a second of the \
             rate or the buffer ({needed} bytes)",
            path.display()
        )));
    }
    Ok(align)
}

/// A writer's failure as one sentence.
fn write_error(path: &Path, error: &io::Error) -> RecordError {
    if error.kind() == io::ErrorKind::StorageFull || error.raw_os_error() == Some(libc::ENOSPC) {
        RecordError::DiskFull(format!(
            "the file system of {} is full: {error}; what was recorded until then is in the file",
            path.display()
        ))
    } else {
        RecordError::Write(format!("writing {} failed: {error}", path.display()))
    }
}
