//! `abissd`, the ABISS controller daemon.
//!
//! It loads and attaches the eBPF programs of `scheduler-ebpf`, owns their maps, and serves the
//! versioned protocol of `abiss-proto` on a Unix socket. The flow reads one way:
//!
//! ```text
//! kernel ring records ─▶ kernel_events (typed) ─┐
//! client requests ─▶ server (Command) ──────────┼─▶ daemon main loop ─▶ controller
//! prefetch completions (LoadDone) ──────────────┘                          │
//!                        policy (pure: playout, credit, admission, upgrades) ◀┘
//!                                                                          │
//!          actions: prefetch (io_uring, mlock), upgrades (ioprio), tracer (maps), device (sysfs)
//! ```
//!
//! Only the main loop touches the controller, and so the maps, streams and disks; everything
//! else reaches it over channels. No import cycle of any length between its modules
//! (`xtask/tests/architecture.rs`, which checks every crate of the workspace).
//!
//! The module map (every file, by concern) and the flows of an attach and of a raise are in
//! `docs/architecture.md`; `xtask/tests/doc_index.rs` keeps that map whole.
//!
//! The device model and its fitting are in `abiss-model`; the shared system calls (ioprio,
//! monotonic clock, atomic file writes) in `abiss-os`.
//!
//! Requires Linux 5.15 or newer with BTF, and root (or `CAP_BPF` with `CAP_PERFMON`); the
//! optional parts need newer kernels ([`capabilities`]).
#![deny(missing_docs)]

pub mod args;
pub mod client_file;
pub mod config_file;
pub mod connection;
pub mod controller;
pub mod daemon;
pub mod device;
pub mod disks;
pub mod kernel_events;
pub mod keyed_threads;
pub mod latency_tail;
pub mod mapped_file;
pub mod metrics;
pub mod policy;
pub mod prefetch;
pub mod preflight;
pub mod raised_forks;
pub mod ring_pump;
pub mod server;
pub mod socket;
pub mod stats;
pub mod stream_table;
pub mod streams;
pub mod systemd;
pub mod tracer;
pub mod upgrades;
pub mod writeback;

pub use daemon::{run, DaemonConfig, DaemonError, Reload};
// The kernel probes live in `abiss-kernel`, which `abissctl doctor` shares; these names keep
// the daemon's paths to them.
pub use abiss_kernel::{capabilities, layout as kernel_layout};
