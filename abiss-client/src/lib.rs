//! Client library of abiss.
//!
//! [`Client`] is a blocking connection to `abissd`. [`AbissFile`] is the application API after
//! the ABISS slides' `abiss_fopen`/`abiss_fread`: it opens a file, attaches it with a byterate
//! and a playout buffer, and implements [`Read`](std::io::Read) and [`Seek`](std::io::Seek), telling the daemon its playout
//! point as it goes so the daemon keeps the next buffer's worth of data in memory.
//!
//! The file is opened by the caller's process and its descriptor is passed to the daemon
//! (`SCM_RIGHTS`): the daemon never opens a path on a client's behalf. The library speaks only
//! the protocol of `abiss-proto`; it does not link aya or any part of the daemon, and runs no
//! async runtime.
//!
//! | concern | module |
//! | --- | --- |
//! | the connection: requests, answers, passed descriptors, position messages ([`Client`], [`ClientError`], [`StatusReport`]) | `client` |
//! | a file read at a guaranteed byterate ([`AbissFile`], [`StreamOptions`]) | `file` |
//! | a recording written past the page cache ([`DirectRecording`], [`RecordError`], [`RecordingSummary`]) | `recording` |
//! | its ring of locked memory and `O_DIRECT` writer thread ([`DirectSummary`]) | `direct` |
#![deny(missing_docs)]

mod client;
mod direct;
mod file;
mod recording;

pub use abiss_proto::{StatusReport, StreamId};
pub use client::{Client, ClientError};
pub use direct::DirectSummary;
pub use file::{AbissFile, StreamOptions};
pub use recording::{DirectRecording, RecordError, RecordingSummary};
