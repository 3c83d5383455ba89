//! Policy: pure decisions with no I/O. Fed events and time, they answer what to load, lock,
//! release and admit; the daemon carries the decisions out. Unit and property tests pin them.

pub mod admission;
pub mod burst;
pub mod credit;
pub mod memory;
pub mod playout;
pub mod priority;
pub mod share;
pub mod upgrade;
pub mod write_behind;
