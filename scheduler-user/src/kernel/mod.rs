//! The kernel side, seen from the daemon: what this kernel allows ([`preflight`], and from
//! the `abiss-kernel` crate, which `abissctl doctor` shares,
//! [`capabilities`]), the struct offsets the programs read ([`layout`]), loading the programs
//! and owning their maps ([`tracer`]), their ring buffers handed to the main loop
//! ([`ring_pump`]) and decoded once into typed events ([`events`]), and what it all costs
//! ([`stats`]).

pub(crate) use abiss_kernel::capabilities;
pub(crate) mod events;
pub(crate) use abiss_kernel::layout;
pub(crate) mod preflight;
pub(crate) mod ring_pump;
pub(crate) mod stats;
pub(crate) mod tracer;
