//! I/O priority classes as the benchmark's configurations name them (`rt/4`, `be/7`, `idle`),
//! set per thread (as `ionice` does per process) through the shared `abiss_os::ioprio`.

use std::fmt;

use abiss_os::ioprio::{self, CALLING_THREAD, CLASS_BE, CLASS_IDLE, CLASS_RT};

/// An I/O scheduling class with its level (0 = highest, 7 = lowest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    /// `IOPRIO_CLASS_RT` (`ionice -c1 -n LEVEL`).
    RealTime(u8),
    /// `IOPRIO_CLASS_BE` (`ionice -c2 -n LEVEL`).
    BestEffort(u8),
    /// `IOPRIO_CLASS_IDLE` (`ionice -c3`).
    Idle,
}

impl IoClass {
    /// The ioprio value: class in the top bits, level in the low bits.
    #[must_use]
    pub fn ioprio(self) -> u16 {
        match self {
            Self::RealTime(level) => ioprio::encode(CLASS_RT, level.min(7)),
            Self::BestEffort(level) => ioprio::encode(CLASS_BE, level.min(7)),
            Self::Idle => ioprio::encode(CLASS_IDLE, 0),
        }
    }

    /// Sets the calling thread's I/O priority, so each reader thread can have its own class.
    /// The page cache's readahead for the thread's reads is submitted in its context and so
    /// carries the class.
    pub fn set_for_current_thread(self) -> std::io::Result<()> {
        ioprio::set(CALLING_THREAD, self.ioprio())
    }
}

impl fmt::Display for IoClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RealTime(level) => write!(f, "rt/{level}"),
            Self::BestEffort(level) => write!(f, "be/{level}"),
            Self::Idle => f.write_str("idle"),
        }
    }
}

/// The calling thread's I/O priority value, as `ioprio_get(2)` returns it.
pub fn current_thread_ioprio() -> std::io::Result<u16> {
    ioprio::get(CALLING_THREAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_the_kernel_encoding() {
        assert_eq!(IoClass::RealTime(0).ioprio(), 1 << 13);
        assert_eq!(IoClass::RealTime(4).ioprio(), (1 << 13) | 4);
        assert_eq!(IoClass::BestEffort(7).ioprio(), (2 << 13) | 7);
        assert_eq!(IoClass::Idle.ioprio(), 3 << 13);
        assert_eq!(IoClass::RealTime(4).to_string(), "rt/4");
    }

    #[test]
    fn a_thread_can_lower_its_own_priority() {
        // Best effort needs no privilege; the class applies to this thread only.
        std::thread::spawn(|| {
            IoClass::BestEffort(6).set_for_current_thread().unwrap();
            assert_eq!(current_thread_ioprio().unwrap(), (2 << 13) | 6);
        })
        .join()
        .unwrap();
    }
}
