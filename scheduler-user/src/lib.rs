//! `abissd`, the ABISS controller daemon.
//!
//! It loads and attaches the eBPF programs of `scheduler-ebpf`, owns their maps, and serves the
//! versioned protocol of `abiss-proto` on a Unix socket. Only the daemon's main loop touches the
//! maps; connections ask it over a channel.
//!
//! Requires Linux 6.1 or newer with BTF, and root (or `CAP_BPF` with `CAP_PERFMON`).
#![deny(missing_docs)]

pub mod connection;
pub mod controller;
pub mod daemon;
pub mod device;
pub mod disks;
pub mod kernel_events;
pub mod kernel_layout;
pub mod policy;
pub mod prefetch;
pub mod preflight;
pub mod server;
pub mod socket;
pub mod stats;
pub mod streams;
pub mod tracer;
pub mod upgrades;

pub use daemon::{run, DaemonConfig, DaemonError};
