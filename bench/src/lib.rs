//! The benchmark harness behind the `abiss-bench` binary: configurations (elevator, reader
//! I/O class, hooks for ABISS rows), the real-time readers and the copy loop, runs on a
//! private lab disk, and the reports. Needs root and Linux 6.x (tested on 6.18).
//!
//! A benchmark error is reported, not handled, so this harness uses `anyhow` throughout.

#![deny(missing_docs)]

pub mod abiss;
pub mod admission;
pub mod chart;
pub mod configuration;
pub mod interrupt;
pub mod ioprio;
pub mod lab_disk;
pub mod latency;
pub mod layout;
pub mod overhead;
pub mod reference;
pub mod report;
pub mod schedule;
pub mod sweep;
pub mod throughput;
pub mod trial;
pub mod upgrades;
pub mod workload;
