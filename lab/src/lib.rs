//! The lab: emulated slow disks as real block devices.
//!
//! A FUSE filesystem exposes one file, the disk image, whose reads and writes take as long as
//! a device model says (a zoned, seeking, rotating disk, or a throttled cloud volume). A loop
//! device with direct I/O sits on that file, so the kernel's page cache, readahead, elevators
//! and eBPF probes see real requests on `/dev/loopN`; only the medium is emulated.
//!
//! Other crates bring a lab up and down with [`Lab::up`] and [`Lab::down`] and read the
//! per-request statistics with [`Lab::stats_cursor`]. Needs root, `/dev/fuse` and Linux 6.x
//! (tested on 6.18). The lab knows nothing of abiss itself (of the abiss crates it uses only
//! `abiss-os`), and `down` removes everything `up` made, even after a crash.
//!
//! | concern | module |
//! | --- | --- |
//! | bringing a lab up and taking it down: state directory, emulator, loop device, file system ([`Lab`]) | [`lab`] |
//! | the emulator process: the FUSE file served by the model | [`emulator`] |
//! | which queued request the emulated device serves next | [`queue`] |
//! | device models: pure functions from a request to its service time | [`model`] |
//! | the rotating disk: zoned rate, seek curve, rotational latency | `model::hdd` |
//! | the cloud volume: byte-rate and IOPS caps, network latency | `model::cloud` |
//! | waiting until an exact instant: sleep, then spin | [`timing`] |
//! | a FUSE file system whose server holds its requests, mounted by an unprivileged user | [`stalling_fs`] |
//! | per-request statistics and the summary file ([`StatsCursor`]) | [`stats`] |
//! | measuring a lab's device through the kernel against its model | [`validate`](mod@validate) |
//! | one timed `O_DIRECT` read at a time (calibration and validation); the aligned buffer | [`direct_io`] |
//! | commands, sysfs, mounts and processes | [`system`] |
//! | errors, one enum per concern, with exit codes | [`error`] |
//! | the `abiss-lab` command line ([`cli::Cli`]; a library module, so that `cargo xtask man` documents it too) | [`cli`] |

#![deny(missing_docs)]

pub mod cli;
pub mod direct_io;
pub mod emulator;
pub mod error;
pub mod model;
pub mod queue;
pub mod stalling_fs;
pub mod stats;
pub mod timing;

pub use error::{LabError, ModelError};
pub use model::{ModelFile, ModelKind, ModelSpec, Op, ServiceOrder};
pub use stats::{RequestRecord, StatsCursor, StatsSummary};
pub mod lab;
pub mod system;
pub mod validate;

pub use lab::{FilesystemKind, Lab, LabOptions, LabState};
pub use validate::{validate, ValidationReport};
