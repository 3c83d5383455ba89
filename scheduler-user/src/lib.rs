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
//! | concern | module |
//! | --- | --- |
//! | start, main loop, reload, shutdown, exit codes | [`daemon`] |
//! | the command line (`abissd --help`, the man page, the completions) | [`args`] |
//! | the configuration file (`/etc/abiss/abissd.toml`) | [`config_file`] |
//! | readiness notification and journald log levels | [`systemd`] |
//! | serving a connection: commands, answers, event subscriptions, stats | [`server`] |
//! | closing what clients pass, on a thread per user ([`server::closer`]) | `server::closer` |
//! | a thread per user for work that may wait as long as that user likes (closes, window locks) | [`keyed_threads`] |
//! | protocol lines and passed descriptors on one socket | [`connection`] |
//! | the control socket's path and lock | [`socket`] |
//! | stream lifecycle and event dispatch | [`controller`] |
//! | managed disks, admission, capacity planning, device status | [`disks`] |
//! | streams | [`streams`] |
//! | what a passed descriptor is, and the checks it passes before it becomes a stream's file | [`client_file`] |
//! | ring records decoded into typed events | [`kernel_events`] |
//! | loading the programs, reading and writing their maps | [`tracer`] |
//! | kernel struct offsets from BTF | [`kernel_layout`] |
//! | privilege checks | [`preflight`] |
//! | optional parts and the kernel hooks they need | [`capabilities`] |
//! | prefetch: a thread and an `io_uring` per ABISS level, `mlock` | [`prefetch`] |
//! | a stream's file held by the daemon: mapped to lock a read window, or only open | [`mapped_file`] |
//! | raising and restoring readers' I/O priority | [`upgrades`] |
//! | write streams: how far the writer is, write-back through the level's ring, allocation ahead | [`writeback`] |
//! | the tasks raised threads make: followed by the fork program, put back | [`raised_forks`] |
//! | the programs' ring buffers handed to the main loop, bounded and in turns | [`ring_pump`] |
//! | elevator and driver depth of a managed disk, crash recovery | [`device`] |
//! | eBPF and daemon cost | [`stats`] |
//! | Prometheus metrics on `--metrics ADDR` (asks the main loop, like a connection) | [`metrics`] |
//! | pure decisions: playout window, credit timer, admission (model, share), levels, upgrades | [`policy`] |
//!
//! The device model and its fitting are in `abiss-model`; the shared system calls (ioprio,
//! monotonic clock, atomic file writes) in `abiss-os`.
//!
//! Requires Linux 5.15 or newer with BTF, and root (or `CAP_BPF` with `CAP_PERFMON`); the
//! optional parts need newer kernels ([`capabilities`]).
#![deny(missing_docs)]

pub mod args;
pub mod capabilities;
pub mod client_file;
pub mod config_file;
pub mod connection;
pub mod controller;
pub mod daemon;
pub mod device;
pub mod disks;
pub mod kernel_events;
pub mod kernel_layout;
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
