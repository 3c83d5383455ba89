//! Disks: the whole disks abissd manages, what it sets on them and gives back
//! ([`device`]), their admission and capacity ([`managed`]), and the latency tail each
//! shows ([`latency_tail`]), from which automatic buffers are sized.

pub mod device;
pub(crate) mod latency_tail;
pub(crate) mod managed;
