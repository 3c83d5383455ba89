//! A blocking connection to abissd.

use std::io::{BufRead, BufReader, ErrorKind as IoErrorKind, IoSlice};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use abiss_os::clock::monotonic_ns;
use abiss_proto::{
    decode_line, encode_line, AdmissionReport, AdmitRequest, AttachRequest, ByteRate, DeviceStatus,
    Envelope, ErrorKind, LatencyGroup, Request, RequestRecord, Response, StatsReport, StatusReport,
    StreamId, StreamInfo, StreamTarget, DEFAULT_SOCKET, PAGE_BYTES, SOCKET_ENV,
};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixAddr};

/// Failures talking to the daemon. Each is one sentence that says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon answers on the socket.
    #[error("abissd is not running ({reason} at {}); start it as root with `abissd`, or point ABISS_SOCKET/--socket at its socket", path.display())]
    NotRunning {
        /// The socket path tried.
        path: PathBuf,
        /// What was found there.
        reason: &'static str,
    },
    /// The socket path is something else.
    #[error("{} is not a socket; point ABISS_SOCKET/--socket at abissd's socket", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The socket or the daemon refused this user.
    #[error("{message}")]
    PermissionDenied {
        /// The daemon's or the system's sentence.
        message: String,
    },
    /// The daemon refused the request as invalid.
    #[error("{message}")]
    BadRequest {
        /// The daemon's sentence.
        message: String,
    },
    /// Admission control refused.
    #[error("{message}")]
    Refused {
        /// The daemon's sentence, with the figures.
        message: String,
    },
    /// No such stream.
    #[error("{message}")]
    NotFound {
        /// The daemon's sentence.
        message: String,
    },
    /// No such device, or one the daemon does not manage.
    #[error("{message}")]
    UnknownDevice {
        /// The daemon's sentence.
        message: String,
    },
    /// The device's saved model is corrupt or describes another device.
    #[error("{message}")]
    ModelUnusable {
        /// The daemon's sentence.
        message: String,
    },
    /// Client and daemon speak different protocol versions.
    #[error("{message}")]
    VersionMismatch {
        /// The daemon's sentence.
        message: String,
    },
    /// The daemon failed internally.
    #[error("abissd failed: {message}")]
    Daemon {
        /// The daemon's sentence.
        message: String,
    },
    /// The connection broke or the daemon answered nonsense.
    #[error("the connection to abissd on {} broke: {message}", path.display())]
    Broken {
        /// The socket path.
        path: PathBuf,
        /// What happened.
        message: String,
    },
}

/// One connection to the daemon. Requests are answered in order.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    /// The socket from `ABISS_SOCKET`, else the default path.
    #[must_use]
    pub fn default_socket() -> PathBuf {
        std::env::var_os(SOCKET_ENV).map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
    }

    /// Connects to the daemon at [`Client::default_socket`].
    pub fn connect_default() -> Result<Self, ClientError> {
        Self::connect(&Self::default_socket())
    }

    /// Connects to the daemon's socket at `path`.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        match std::fs::metadata(path) {
            Err(error) if error.kind() == IoErrorKind::NotFound => {
                return Err(ClientError::NotRunning {
                    path: path.to_path_buf(),
                    reason: "no socket",
                })
            }
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(ClientError::NotASocket {
                    path: path.to_path_buf(),
                })
            }
            _ => {}
        }
        let stream = UnixStream::connect(path).map_err(|error| match error.kind() {
            IoErrorKind::ConnectionRefused | IoErrorKind::NotFound => ClientError::NotRunning {
                path: path.to_path_buf(),
                reason: "nobody answers",
            },
            IoErrorKind::PermissionDenied => ClientError::PermissionDenied {
                message: format!(
                    "this user may not connect to {}; ask an administrator for access",
                    path.display()
                ),
            },
            _ => ClientError::Broken {
                path: path.to_path_buf(),
                message: error.to_string(),
            },
        })?;
        let reader = BufReader::new(stream.try_clone().map_err(|error| ClientError::Broken {
            path: path.to_path_buf(),
            message: error.to_string(),
        })?);
        Ok(Self {
            path: path.to_path_buf(),
            writer: stream,
            reader,
        })
    }

    fn broken(&self, message: impl Into<String>) -> ClientError {
        ClientError::Broken {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    fn line(&self, request: Request) -> Result<Vec<u8>, ClientError> {
        encode_line(&Envelope::new(request)).map_err(|error| self.broken(error.to_string()))
    }

    /// Sends a request without waiting for an answer.
    pub fn send(&mut self, request: Request) -> Result<(), ClientError> {
        let line = self.line(request)?;
        self.send_all(&line)
    }

    /// Writes all of `bytes`. `MSG_NOSIGNAL`: once the daemon is gone a write fails with an
    /// error the caller sees, instead of a SIGPIPE that kills a C program using libabiss.
    fn send_all(&self, mut bytes: &[u8]) -> Result<(), ClientError> {
        while !bytes.is_empty() {
            match nix::sys::socket::send(self.writer.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL) {
                Ok(sent) => bytes = &bytes[sent..],
                Err(nix::errno::Errno::EINTR) => {}
                Err(error) => return Err(self.broken(error.to_string())),
            }
        }
        Ok(())
    }

    /// Sends a request with a file descriptor attached (`SCM_RIGHTS`), in one message so the
    /// daemon receives the descriptor with the request's first byte.
    pub fn send_with_fd(&mut self, request: Request, fd: impl AsFd) -> Result<(), ClientError> {
        let line = self.line(request)?;
        let fds = [fd.as_fd().as_raw_fd()];
        let control = [ControlMessage::ScmRights(&fds)];
        let mut sent = sendmsg::<UnixAddr>(
            self.writer.as_raw_fd(),
            &[IoSlice::new(&line)],
            &control,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|error| self.broken(error.to_string()))?;
        if sent < line.len() {
            // The descriptor went with the first part; the rest is plain bytes.
            self.send_all(&line[sent..])?;
            sent = line.len();
        }
        debug_assert_eq!(sent, line.len());
        Ok(())
    }

    /// Reads the next answer; daemon errors become [`ClientError`]s.
    pub fn receive(&mut self) -> Result<Response, ClientError> {
        let mut line = Vec::new();
        let read = self
            .reader
            .read_until(b'\n', &mut line)
            .map_err(|error| self.broken(error.to_string()))?;
        if read == 0 {
            return Err(self.broken("abissd closed the connection (did it stop?)"));
        }
        let response: Response =
            decode_line(&line).map_err(|error| self.broken(format!("abissd sent {error}")))?;
        match response {
            Response::Error { error, message } => Err(match error {
                ErrorKind::BadRequest => ClientError::BadRequest { message },
                ErrorKind::VersionMismatch => ClientError::VersionMismatch { message },
                ErrorKind::PermissionDenied => ClientError::PermissionDenied { message },
                ErrorKind::Refused => ClientError::Refused { message },
                ErrorKind::NotFound => ClientError::NotFound { message },
                ErrorKind::UnknownDevice => ClientError::UnknownDevice { message },
                ErrorKind::ModelUnusable => ClientError::ModelUnusable { message },
                ErrorKind::Internal => ClientError::Daemon { message },
            }),
            other => Ok(other),
        }
    }

    /// Sends a request and waits for its answer.
    pub fn call(&mut self, request: Request) -> Result<Response, ClientError> {
        self.send(request)?;
        self.receive()
    }

    fn unexpected(&self, response: &Response) -> ClientError {
        self.broken(format!("unexpected answer {response:?}"))
    }

    /// Attaches the open file `file` as a stream.
    pub fn attach(
        &mut self,
        file: impl AsFd,
        request: AttachRequest,
    ) -> Result<StreamInfo, ClientError> {
        self.send_with_fd(Request::Attach(request), file)?;
        match self.receive()? {
            Response::Attached(info) => Ok(info),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Ends a stream.
    pub fn detach(&mut self, target: StreamTarget) -> Result<StreamId, ClientError> {
        match self.call(Request::Detach { target })? {
            Response::Detached { stream } => Ok(stream),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Gives a stream another rate (trick play), if its disk admits it; refused, the stream
    /// keeps its rate.
    pub fn set_rate(
        &mut self,
        target: StreamTarget,
        rate: ByteRate,
    ) -> Result<StreamInfo, ClientError> {
        match self.call(Request::SetRate { target, rate })? {
            Response::RateChanged(info) => Ok(info),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Thread `tid` (of this user) is about to read stream `stream`: the daemon raises it to
    /// the stream's level now, so its first reads are not queued below it. Whether it did.
    pub fn reader_starts(&mut self, stream: StreamId, tid: u32) -> Result<bool, ClientError> {
        match self.call(Request::ReaderStarts { stream, tid })? {
            Response::ReaderRaised { raised } => Ok(raised),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Hands the ring of direct recording `stream` (a memfd sealed against shrinking, growing
    /// and later writers, its pages touched) to the daemon, which locks it for as long as the stream
    /// lasts, against the stream's locked-memory budget. The bytes locked.
    pub fn lock_ring(&mut self, stream: StreamId, ring: impl AsFd) -> Result<u64, ClientError> {
        self.send_with_fd(Request::LockRing { stream }, ring)?;
        match self.receive()? {
            Response::RingLocked { bytes, .. } => Ok(bytes),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Tells the daemon the application's playout point (no answer is awaited).
    pub fn position(&mut self, stream: StreamId, offset: u64) -> Result<(), ClientError> {
        self.send(Request::Position {
            stream,
            offset,
            at_ns: Some(monotonic_ns()),
        })
    }

    /// Like [`Client::position`], but never waits: if the socket buffer is full (the daemon is
    /// busy), the message is skipped and `false` returned; a later one carries a newer position.
    pub fn try_position(&mut self, stream: StreamId, offset: u64) -> Result<bool, ClientError> {
        let line = self.line(Request::Position {
            stream,
            offset,
            at_ns: Some(monotonic_ns()),
        })?;
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        match nix::sys::socket::send(self.writer.as_raw_fd(), &line, flags) {
            Ok(sent) if sent == line.len() => Ok(true),
            // A partial message must be completed, or the stream of lines would break.
            Ok(sent) => self.send_all(&line[sent..]).map(|()| true),
            Err(nix::errno::Errno::EAGAIN) => Ok(false),
            Err(error) => Err(self.broken(error.to_string())),
        }
    }

    /// The streams this user may see.
    pub fn list(&mut self) -> Result<Vec<StreamInfo>, ClientError> {
        match self.call(Request::List)? {
            Response::Streams { streams } => Ok(streams),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The cumulative latency histograms: (monotonic time of the snapshot in ns, groups).
    pub fn latency(&mut self) -> Result<(u64, Vec<LatencyGroup>), ClientError> {
        match self.call(Request::Latency)? {
            Response::Latency { taken_ns, groups } => Ok((taken_ns, groups)),
            other => Err(self.unexpected(&other)),
        }
    }

    /// eBPF and daemon cost measured over `window_ms`.
    pub fn stats(&mut self, window_ms: u64) -> Result<StatsReport, ClientError> {
        match self.call(Request::Stats { window_ms })? {
            Response::Stats(report) => Ok(report),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Starts streaming per-request events, and returns once the daemon records them; read
    /// them with [`Client::next_event`].
    pub fn subscribe_events(&mut self) -> Result<(), ClientError> {
        match self.call(Request::Events)? {
            Response::Subscribed => Ok(()),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The next per-request event after [`Client::subscribe_events`].
    pub fn next_event(&mut self) -> Result<RequestRecord, ClientError> {
        match self.receive()? {
            Response::Event(record) => Ok(record),
            other => Err(self.unexpected(&other)),
        }
    }

    /// Waits until stream `id` has its initial window loaded (or the window covers the whole
    /// file), so the first reads find their data in memory. Gives up after `timeout` and says
    /// whether the window was loaded.
    pub fn wait_loaded(
        &mut self,
        id: StreamId,
        timeout: std::time::Duration,
    ) -> Result<bool, ClientError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let streams = self.list()?;
            let Some(stream) = streams.iter().find(|s| s.id == id) else {
                return Err(ClientError::NotFound {
                    message: format!("stream {id} ended while waiting for its window"),
                });
            };
            let window = stream
                .buffer
                .0
                .min(stream.file_bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES);
            if stream.locked_bytes >= window {
                return Ok(true);
            }
            // Started on less credit than its fill: it loads at its rate from here.
            if stream.start_limited {
                return Ok(false);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Capacity planning on a managed device; attaches nothing.
    pub fn admit(&mut self, request: AdmitRequest) -> Result<AdmissionReport, ClientError> {
        match self.call(Request::Admit(request))? {
            Response::Admission(report) => Ok(report),
            other => Err(self.unexpected(&other)),
        }
    }

    /// The managed devices.
    pub fn status(&mut self) -> Result<Vec<DeviceStatus>, ClientError> {
        self.status_and_raises().map(|(devices, _)| devices)
    }

    /// The managed devices, and the daemon's reader raises.
    pub fn status_and_raises(
        &mut self,
    ) -> Result<(Vec<DeviceStatus>, abiss_proto::RaiseReport), ClientError> {
        self.status_report()
            .map(|report| (report.devices, report.raises))
    }

    /// Everything `abissctl status` shows.
    pub fn status_report(&mut self) -> Result<StatusReport, ClientError> {
        match self.call(Request::Status)? {
            Response::Devices(report) => Ok(report),
            other => Err(self.unexpected(&other)),
        }
    }
}
