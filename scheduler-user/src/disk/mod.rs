//! Disks: the whole disks abissd manages, what it sets on them and gives back
//! ([`device`]), their admission ([`managed`]) and capacity planning ([`capacity_plan`]), and
//! the latency tail each shows ([`latency_tail`]), from which automatic buffers are sized;
//! which of them serve a client's file, through any stack ([`file_disk`]).

pub(crate) mod capacity_plan;
pub mod device;
pub(crate) mod file_disk;
pub(crate) mod latency_tail;
pub(crate) mod managed;
