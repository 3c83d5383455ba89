//! The protocol between `abissd` and its clients (`abissctl`, the client libraries).
//!
//! Messages are JSON objects, one per line, on the daemon's Unix stream socket. Every request
//! carries the protocol version; the daemon answers a request of another version with an
//! [`ErrorKind::VersionMismatch`] error and nothing else. The CLI never links the kernel side:
//! everything it knows about the daemon is in this crate.
//!
//! The protocol only: message types, their encoding, and the units and histogram arithmetic
//! both sides share. No file system access, no sockets, nothing of the kernel side or of the
//! device model (`abiss-model`).
//!
//! | concern | module |
//! | --- | --- |
//! | requests, responses, error kinds, the version, defaults, one JSON line per message ([`encode_line`], [`decode_line`]) | crate root (`lib.rs`) |
//! | capacity planning: [`AdmitRequest`], [`AdmissionReport`], [`AdmissionMode`] | `admission` |
//! | what a client is told of a stream ([`StreamInfo`]) | `stream_info` |
//! | a stream's id ([`StreamId`]) | `stream_id` |
//! | what a client is told of the daemon: devices, parts, memory, raises ([`StatusReport`]) | `status` |
//! | latency histograms, request records, the daemon's own cost ([`LatencyGroup`], [`RequestRecord`], [`StatsReport`]) | `measurement` |
//! | log2 latency histograms, as bcc's biolatency prints them ([`Log2Histogram`]) | `histogram` |
//! | byte sizes and rates as people write them, `564KiB`, `1MiB/s` ([`ByteSize`], [`ByteRate`]) | re-exported from the `abiss-units` crate |
//! | why abissd said no: each refusal's error kind and sentence in one place ([`Refusal`]) | `refusal` |
//! | devices, operations and I/O priorities as users name them ([`DeviceNumber`], [`IoPriority`]) | `units` |
#![deny(missing_docs)]

mod admission;
mod histogram;
mod measurement;
mod refusal;
mod status;
mod stream_id;
mod stream_info;
mod units;

pub use abiss_units::{ByteRate, ByteSize, QuantityError};
pub use admission::{AdmissionMode, AdmissionReport, AdmitRequest};
pub use histogram::{Log2Histogram, LATENCY_BUCKETS};
pub use measurement::{LatencyGroup, ProgramCost, RequestRecord, StatsReport};
pub use refusal::Refusal;
pub use status::{Capability, DeviceStatus, LoopReport, MemoryReport, RaiseReport, StatusReport};
pub use stream_id::StreamId;
pub use stream_info::{AutoBufferInfo, ReaderInfo, RecordingInfo, StreamInfo};
pub use units::{DeviceNumber, IoClass, IoPriority, Operation};

use serde::{Deserialize, Serialize};

/// Version of this protocol. Bump on any incompatible change of [`Request`] or [`Response`].
pub const PROTOCOL_VERSION: u32 = 5;

/// ABISS priority levels: 0 is the highest (real time only), 7 the default best effort.
pub const ABISS_LEVELS: u8 = 8;

/// Default ABISS level of a stream: real time.
pub const DEFAULT_LEVEL: u8 = 0;

/// Page size the playout window is managed in: the unit of `batch_pages`, of loading and of
/// locking.
pub const PAGE_BYTES: u64 = 4096;

/// Playout buffer of a stream when the client names none: the ABISS measurement's 564 KiB.
pub const DEFAULT_BUFFER_BYTES: u64 = 564 * 1024;

/// Pages per credit step of a stream when the client names none (80 KiB).
pub const DEFAULT_BATCH_PAGES: u32 = 20;

/// Where `abissd` listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/abiss/abiss.sock";

/// Environment variable that overrides [`DEFAULT_SOCKET`] for the daemon and its clients.
pub const SOCKET_ENV: &str = "ABISS_SOCKET";

/// Longest accepted message line, in bytes; longer lines are refused unread.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// A request with its protocol version, as sent on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The client's [`PROTOCOL_VERSION`].
    pub version: u32,
    /// What is asked.
    pub request: Request,
}

impl Envelope {
    /// Wraps a request in the current protocol version.
    #[must_use]
    pub fn new(request: Request) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            request,
        }
    }
}

/// What a client can ask.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// Who is there: answered with [`Response::Hello`].
    Hello,
    /// The cumulative latency histograms of every (device, operation, priority) seen since the
    /// daemon started; clients compute per-interval figures as differences.
    Latency,
    /// Answered with [`Response::Subscribed`] once the programs record request events, then
    /// one [`Response::Event`] per completed block request until the client hangs up.
    /// Unprivileged clients only see requests submitted by their own user.
    Events,
    /// eBPF program cost and daemon resource use, measured over `window_ms`. Kernel BPF run-time
    /// statistics are switched on only for that window.
    Stats {
        /// Length of the measurement window, in milliseconds (1 ms to 60 s).
        window_ms: u64,
    },
    /// Attach the file whose descriptor travels with this message (`SCM_RIGHTS`) as a stream.
    /// The daemon never opens a path for a client: the descriptor proves the client may read
    /// the file. Answered with [`Response::Attached`].
    Attach(AttachRequest),
    /// End a stream. Only its owner or root may. Answered with [`Response::Detached`].
    Detach {
        /// Which stream.
        target: StreamTarget,
    },
    /// Give a stream another rate (trick play: fast-forward, slow motion), if its disk admits
    /// it; its buffer and window stay. Only its owner or root may. Answered with
    /// [`Response::RateChanged`]; when refused, the stream keeps its rate.
    SetRate {
        /// Which stream.
        target: StreamTarget,
        /// The new rate.
        rate: ByteRate,
    },
    /// Thread `tid` of the caller's (its user's) is about to read stream `stream`: raise it
    /// to the stream's level now, as a miss would, so its first reads are not queued below the
    /// stream (`abissctl run` for the player it starts; the client library for its reading
    /// thread). Only the stream's owner or root may ask, and only for a thread of the same
    /// user; the raise is policed and put back like any other. Answered with
    /// [`Response::ReaderRaised`].
    ReaderStarts {
        /// The stream.
        stream: StreamId,
        /// The thread (a process id names its main thread).
        tid: u32,
    },
    /// The ring of a direct recording's client, a memfd sealed against shrinking, growing
    /// and later writers (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE`, once the client
    /// mapped it) whose pages the client has touched, travels
    /// with this message (`SCM_RIGHTS`): abissd locks it in memory for as long as the stream
    /// lasts, against the locked memory the stream was admitted with (its buffer), so the
    /// client's own `RLIMIT_MEMLOCK` does not bind it. The data stays in the client's ring;
    /// should abissd stop, the ring is merely no longer locked. Only the stream's owner (or
    /// root) may, once per stream. Answered with [`Response::RingLocked`] once it is locked.
    LockRing {
        /// The direct recording.
        stream: StreamId,
    },
    /// The application's playout point moved to `offset` (ABISS's "position" message). A
    /// notification: the daemon does not answer it, so readers never wait for the daemon.
    Position {
        /// The stream.
        stream: StreamId,
        /// Byte offset the application has consumed up to.
        offset: u64,
        /// When the application was there (`CLOCK_MONOTONIC` ns): the daemon also sees the
        /// reads in the kernel, and orders the two kinds of evidence by time, so a message that
        /// arrives after the reader has moved on (a seek) does not pull the window back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// The streams (all for root, the caller's own otherwise). Answered with
    /// [`Response::Streams`].
    List,
    /// The managed devices and their budgets. Answered with [`Response::Devices`].
    Status,
    /// Capacity planning: how many streams of a kind fit on a managed device, and what miss
    /// probability a number of them would have. Attaches nothing. Answered with
    /// [`Response::Admission`].
    Admit(AdmitRequest),
}

/// Parameters of a new stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent wire flags, each absent for older clients; no two form a state machine"
)]
pub struct AttachRequest {
    /// Guaranteed byterate.
    pub rate: ByteRate,
    /// Playout buffer: how far ahead of the application's playout point data is kept loaded.
    pub buffer: ByteSize,
    /// Pages loaded per credit step.
    pub batch_pages: u32,
    /// ABISS priority level, 0 (highest, real time) to 7 (best effort).
    pub priority: u8,
    /// Whether the stream outlives the connection (until an explicit detach). Otherwise it ends
    /// when the client's connection closes.
    pub persistent: bool,
    /// A recording: the application writes the file at the rate, and abissd writes its dirty
    /// pages back behind it (the write-behind window of `buffer`) instead of reading ahead.
    /// The descriptor must then be open for writing. Absent (older clients): a read stream.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub write: bool,
    /// For a write stream: allocate the file a few seconds of the rate ahead of the writer
    /// (`fallocate` with `KEEP_SIZE`, at most 64 MiB), so it is laid out in large extents.
    /// Off by default: on ext4 it delays the writer's writes (docs/user-guide.md, "Recordings").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preallocate: bool,
    /// For a write stream: the client writes the file past the page cache itself (`O_DIRECT`,
    /// from a ring it owns, `abissctl record`), so abissd runs no write-behind and allocates
    /// nothing for it; it admits the stream and raises the thread that writes
    /// ([`Request::ReaderStarts`] with the writer's id), whose real-time writes of the file are
    /// policed against the stream's rate and buffer like a reader's reads. Absent (older
    /// clients): the page-cache write stream. An older daemon ignores it and writes back
    /// pages the direct writes never dirty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// For a read stream: load this much of the file's head at once when the stream starts,
    /// beyond its buffer (a player's start-up probe), locked until the reader passes it, and
    /// the file's last 512 KiB with it (players read the end for the duration). It comes out
    /// of the start-up allowance and counts against the locked-memory budgets.
    /// Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preroll: Option<ByteSize>,
    /// Size the buffer from the disk (`--buffer auto`): `buffer` is then the application's
    /// own part (it may be 0), and abissd adds what the disk's measured latency tail in the
    /// stream's priority class takes at the stream's rate, growing it as the tail grows, within the locked-memory
    /// budgets. Absent: `buffer` is the whole buffer, fixed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub buffer_auto: bool,
}

impl AttachRequest {
    /// A read stream at `rate` with a fixed `buffer`, `batch_pages` per credit step, at ABISS
    /// level `priority`, that ends with its connection, every other option off; the rest
    /// come with struct update syntax (`AttachRequest { write: true, ..AttachRequest::read(…) }`).
    #[must_use]
    pub const fn read(rate: ByteRate, buffer: ByteSize, batch_pages: u32, priority: u8) -> Self {
        Self {
            rate,
            buffer,
            batch_pages,
            priority,
            persistent: false,
            write: false,
            preallocate: false,
            direct: false,
            preroll: None,
            buffer_auto: false,
        }
    }
}

/// A stream named by id, or by the file it streams.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamTarget {
    /// By stream id.
    Id(StreamId),
    /// By file identity.
    File {
        /// Filesystem device.
        device: DeviceNumber,
        /// Inode number.
        inode: u64,
    },
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::Hello`].
    Hello {
        /// The daemon's [`PROTOCOL_VERSION`].
        version: u32,
        /// The daemon's process id.
        pid: u32,
        /// The running kernel's release.
        kernel: String,
    },
    /// Answer to [`Request::Latency`].
    Latency {
        /// Monotonic time of the snapshot, in ns.
        taken_ns: u64,
        /// One group per (device, operation, priority) seen so far.
        groups: Vec<LatencyGroup>,
    },
    /// The first answer to [`Request::Events`]: request events are recorded from now on, so
    /// a client may start the I/O it wants to see.
    Subscribed,
    /// One completed block request (a stream of these follows [`Response::Subscribed`]).
    Event(RequestRecord),
    /// Answer to [`Request::Stats`].
    Stats(StatsReport),
    /// Answer to [`Request::Attach`].
    Attached(StreamInfo),
    /// Answer to [`Request::Detach`].
    Detached {
        /// The stream that ended.
        stream: StreamId,
    },
    /// Answer to [`Request::ReaderStarts`].
    ReaderRaised {
        /// Whether the thread is at the stream's level now (false: it was already, or reader
        /// raises are off, or it cannot be raised; the stream works either way).
        raised: bool,
    },
    /// Answer to [`Request::LockRing`]: the ring is locked.
    RingLocked {
        /// The stream.
        stream: StreamId,
        /// Bytes locked.
        bytes: u64,
    },
    /// Answer to [`Request::SetRate`]: the stream as it is now.
    RateChanged(StreamInfo),
    /// Answer to [`Request::List`].
    Streams {
        /// The streams.
        streams: Vec<StreamInfo>,
    },
    /// Answer to [`Request::Admit`].
    Admission(AdmissionReport),
    /// Answer to [`Request::Status`].
    Devices(StatusReport),
    /// The request failed; nothing was changed.
    Error {
        /// What kind of failure, for the client's exit code.
        error: ErrorKind,
        /// One sentence for a person: what is wrong and what to do.
        message: String,
    },
}

/// Failure classes a client can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request could not be parsed or has invalid arguments.
    BadRequest,
    /// The client speaks another protocol version.
    VersionMismatch,
    /// The peer may not do this.
    PermissionDenied,
    /// Something failed inside the daemon.
    Internal,
    /// Admission control refused: the rate does not fit, or too many streams.
    Refused,
    /// No such stream.
    NotFound,
    /// No such device, or the daemon does not manage it.
    UnknownDevice,
    /// The device's saved model is corrupt or describes another device.
    ModelUnusable,
}

/// Errors of reading or writing a protocol line.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The line is not a valid message.
    #[error("malformed message: {source}")]
    Malformed {
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// The line is longer than [`MAX_LINE_BYTES`].
    #[error("message longer than {MAX_LINE_BYTES} bytes")]
    TooLong,
}

/// Encodes a message as one line (with the trailing newline).
pub fn encode_line<T: Serialize>(message: &T) -> Result<Vec<u8>, WireError> {
    let mut line = serde_json::to_vec(message).map_err(|source| WireError::Malformed { source })?;
    line.push(b'\n');
    Ok(line)
}

/// Decodes one line (with or without its newline).
pub fn decode_line<T: for<'de> Deserialize<'de>>(line: &[u8]) -> Result<T, WireError> {
    if line.len() > MAX_LINE_BYTES {
        return Err(WireError::TooLong);
    }
    serde_json::from_slice(line.trim_ascii_end()).map_err(|source| WireError::Malformed { source })
}

/// Why a request line is not a request of this protocol version.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The line is not a message, or not a request.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The client speaks another protocol version (whatever its request looks like).
    #[error("the client speaks protocol {0} but this abissd speaks {PROTOCOL_VERSION}; use matching versions of abissctl and abissd")]
    OtherVersion(u32),
}

/// Decodes a request line, checking its version before its request: a request kind or
/// field of another protocol version is that version's, not a malformed message.
pub fn decode_envelope(line: &[u8]) -> Result<Envelope, EnvelopeError> {
    /// Only the version; serde skips the rest, whatever it is.
    #[derive(Deserialize)]
    struct VersionOnly {
        version: u32,
    }
    let VersionOnly { version } = decode_line(line)?;
    if version != PROTOCOL_VERSION {
        return Err(EnvelopeError::OtherVersion(version));
    }
    Ok(decode_line(line)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_is_told_before_its_request_is_read() {
        let line = br#"{"version":999,"request":{"kind":"teleport","to":"mars"}}"#;
        assert!(matches!(
            decode_envelope(line),
            Err(EnvelopeError::OtherVersion(999))
        ));
        let line = format!(r#"{{"version":{PROTOCOL_VERSION},"request":{{"kind":"teleport"}}}}"#);
        assert!(matches!(
            decode_envelope(line.as_bytes()),
            Err(EnvelopeError::Wire(WireError::Malformed { .. }))
        ));
        let hello = encode_line(&Envelope::new(Request::Hello)).unwrap();
        assert_eq!(decode_envelope(&hello).unwrap().request, Request::Hello);
        assert!(matches!(
            decode_envelope(br#"{"request":{"kind":"hello"}}"#),
            Err(EnvelopeError::Wire(_))
        ));
    }

    #[test]
    fn requests_round_trip_through_a_line() {
        for request in [
            Request::Hello,
            Request::Latency,
            Request::Events,
            Request::Stats { window_ms: 1000 },
        ] {
            let line = encode_line(&Envelope::new(request.clone())).unwrap();
            assert_eq!(line.last(), Some(&b'\n'));
            let back: Envelope = decode_line(&line).unwrap();
            assert_eq!(back.request, request);
            assert_eq!(back.version, PROTOCOL_VERSION);
        }
    }

    /// A direct recording's flag travels, and is absent from a request without it, so an
    /// older daemon reads such a request as before.
    #[test]
    fn a_direct_recording_round_trips_and_is_absent_by_default() {
        let request = AttachRequest {
            write: true,
            direct: true,
            ..AttachRequest::read(
                ByteRate(1_000_000),
                ByteSize(2 << 20),
                DEFAULT_BATCH_PAGES,
                DEFAULT_LEVEL,
            )
        };
        let line = encode_line(&Envelope::new(Request::Attach(request.clone()))).unwrap();
        assert!(String::from_utf8_lossy(&line).contains(r#""direct":true"#));
        let back: Envelope = decode_line(&line).unwrap();
        assert_eq!(back.request, Request::Attach(request.clone()));
        let plain = AttachRequest {
            direct: false,
            ..request
        };
        let line = encode_line(&Envelope::new(Request::Attach(plain))).unwrap();
        assert!(!String::from_utf8_lossy(&line).contains("direct"));
    }

    #[test]
    fn garbage_and_oversized_lines_are_refused() {
        assert!(matches!(
            decode_line::<Envelope>(b"{not json"),
            Err(WireError::Malformed { .. })
        ));
        let long = vec![b' '; MAX_LINE_BYTES + 1];
        assert!(matches!(
            decode_line::<Envelope>(&long),
            Err(WireError::TooLong)
        ));
    }
}
