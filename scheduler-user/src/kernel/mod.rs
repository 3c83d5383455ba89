//! The kernel side, seen from the daemon: what this kernel allows ([`preflight`],
//! [`capabilities`]), the struct offsets the programs read ([`layout`]), loading the programs
//! and owning their maps ([`tracer`]), their ring buffers handed to the main loop
//! ([`ring_pump`]) and decoded once into typed events ([`events`]), and what it all costs
//! ([`stats`]).

pub mod capabilities;
pub mod events;
pub mod layout;
pub mod preflight;
pub mod ring_pump;
pub mod stats;
pub mod tracer;
