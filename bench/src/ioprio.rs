//! I/O priority classes, set per thread with `ioprio_set(2)` as `ionice` does per process.

use std::fmt;

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

const IOPRIO_CLASS_SHIFT: u32 = 13;
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

impl IoClass {
    /// The ioprio value: class in the top bits, level in the low bits.
    #[must_use]
    pub fn ioprio(self) -> libc::c_int {
        let (class, level) = match self {
            Self::RealTime(level) => (1, level),
            Self::BestEffort(level) => (2, level),
            Self::Idle => (3, 0),
        };
        (class << IOPRIO_CLASS_SHIFT) | libc::c_int::from(level.min(7))
    }

    /// Sets the calling thread's I/O priority (who = 0 with `IOPRIO_WHO_PROCESS` is the
    /// calling thread, so each reader thread can have its own class). The page cache's
    /// readahead for the thread's reads is submitted in its context and so carries the class.
    pub fn set_for_current_thread(self) -> std::io::Result<()> {
        // SAFETY: ioprio_set takes three integers and touches no memory of ours.
        let result =
            unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, self.ioprio()) };
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
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
pub fn current_thread_ioprio() -> std::io::Result<libc::c_int> {
    // SAFETY: ioprio_get takes two integers and touches no memory of ours.
    let result = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(libc::c_int::try_from(result).unwrap_or(-1))
    }
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
