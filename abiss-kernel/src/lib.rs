//! What the running kernel offers abiss, probed without loading anything, so that abissd
//! (which then loads its programs) and `abissctl doctor` (which only reports, as any user)
//! ask the kernel the same questions in one place.
//!
//! | module | what |
//! | --- | --- |
//! | [`capabilities`] | the optional parts, the kernel hooks each needs, and what works without it |
//! | [`layout`] | the struct offsets the eBPF programs read, and the optional parts whose tracepoints or fields the kernel's BTF lacks |
//! | [`storage`] | which disks hold a file system: mounts, partitions, btrfs devices, device-mapper and md stacks, from sysfs |
//!
//! Nothing here needs privileges but reading `/proc/kallsyms` addresses, which the kernel hides
//! from other users (`kptr_restrict`).
#![deny(missing_docs)]

pub mod capabilities;
pub mod device_mapper;
pub mod layout;
pub mod storage;
