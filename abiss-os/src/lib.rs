//! The operating-system calls that more than one abiss crate makes, each written once.
//!
//! | module | what |
//! | --- | --- |
//! | [`blk_mq`] | the live driver tag depth of a disk, from debugfs (mounted privately if need be) |
//! | [`clock`] | `CLOCK_MONOTONIC`, the clock of the eBPF programs' timestamps and of position messages |
//! | [`ioprio`] | `ioprio_get(2)` / `ioprio_set(2)` for one thread |
//! | [`fs`] | replacing a file so that a crash leaves the old one or the whole new one; examining a descriptor without asking its file system |
//! | [`sysfs`] | writing a sysfs attribute, trying again while the kernel says busy |
//!
//! Linux only; nothing here needs a kernel newer than 4.11 (`statx`).
#![deny(missing_docs)]

pub mod blk_mq;
pub mod clock;
pub mod fs;
pub mod ioprio;
pub mod sysfs;
