//! `abissd`, the ABISS controller daemon.
//!
//! It loads and attaches the eBPF programs of `scheduler-ebpf`, owns their maps, and serves the
//! versioned protocol of `abiss-proto` on a Unix socket. The flow reads one way:
//!
//! ```text
//! kernel ring records ─▶ kernel (events, typed) ──┐
//! client requests ─▶ serve (Command) ─────────────┼─▶ daemon main loop ─▶ controller
//! prefetch completions (LoadDone) ────────────────┘                         │
//!                        policy (pure: playout, credit, admission, raises) ◀─┘
//!                                                                           │
//!     actions: stream (prefetch: io_uring, mlock), raise (ioprio), kernel (maps), disk (sysfs)
//! ```
//!
//! The modules, by concept: [`stream`] (streams, their table, prefetch, mapped files,
//! write-back), [`raise`] (readers raised to their stream's level, and the tasks they make),
//! [`disk`] (managed disks, their settings and admission, their latency tail), [`kernel`] (the
//! programs, their maps and rings, what this kernel allows), [`serve`] (connections, the
//! descriptors clients pass, metrics), with [`policy`] pure and [`controller`] the one state the
//! main loop ([`daemon`]) changes.
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
//! optional parts need newer kernels ([`kernel::capabilities`]).
#![deny(missing_docs)]
// Its modules are crate-private; the daemon's documentation is read with
// `cargo doc --document-private-items`, where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod args;
mod config_file;
mod controller;
mod daemon;
pub mod disk;
mod kernel;
mod latency_histogram;
pub mod policy;
mod raise;
pub mod serve;
pub mod start;
mod stream;
mod systemd;
