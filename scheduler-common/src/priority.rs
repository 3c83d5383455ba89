//! Priorities both sides compute alike: the kernel's I/O priority encoding and the ABISS
//! levels mapped onto it.

/// Kernel I/O priority encoding (`include/uapi/linux/ioprio.h`).
pub mod ioprio {
    /// No class set: the kernel derives best effort from the task's nice value.
    pub const CLASS_NONE: u8 = 0;
    /// Real time.
    pub const CLASS_RT: u8 = 1;
    /// Best effort.
    pub const CLASS_BE: u8 = 2;
    /// Idle.
    pub const CLASS_IDLE: u8 = 3;
    /// Bits the class is shifted by.
    pub const CLASS_SHIFT: u16 = 13;
    /// Mask of the level within a class.
    pub const LEVEL_MASK: u16 = 0x7;

    /// Splits an encoded ioprio into (class, level).
    #[must_use]
    pub const fn split(ioprio: u16) -> (u8, u8) {
        // Both fit in a u8 by construction: the class is 3 bits, the level 3 bits.
        #[allow(clippy::cast_possible_truncation)]
        (
            ((ioprio >> CLASS_SHIFT) & 0x7) as u8,
            (ioprio & LEVEL_MASK) as u8,
        )
    }

    /// Encodes (class, level) as the kernel's ioprio value.
    #[must_use]
    pub const fn encode(class: u8, level: u8) -> u16 {
        ((class as u16) << CLASS_SHIFT) | (level as u16 & LEVEL_MASK)
    }
}

/// ABISS priority levels: 0 the highest (real time only) … 7 the default best effort, and
/// the kernel I/O priorities they map to.
///
/// | ABISS level | kernel ioprio |
/// | --- | --- |
/// | 0 | RT/0 |
/// | 1 | RT/2 |
/// | 2 | RT/4 |
/// | 3 | RT/6 |
/// | 4 | BE/0 |
/// | 5 | BE/2 |
/// | 6 | BE/4 |
/// | 7 | BE/7 |
///
/// It lives here because both sides need it: the programs to tell a request that runs below
/// its stream's level (a priority inversion), the daemon to set priorities.
pub mod abiss_level {
    use super::ioprio;

    /// The lowest ABISS level, plain best effort.
    pub const LOWEST: u8 = 7;

    /// Kernel (class, level) of an ABISS level; levels above 7 are treated as 7.
    #[must_use]
    pub const fn to_kernel(level: u8) -> (u8, u8) {
        match level {
            0 => (ioprio::CLASS_RT, 0),
            1 => (ioprio::CLASS_RT, 2),
            2 => (ioprio::CLASS_RT, 4),
            3 => (ioprio::CLASS_RT, 6),
            4 => (ioprio::CLASS_BE, 0),
            5 => (ioprio::CLASS_BE, 2),
            6 => (ioprio::CLASS_BE, 4),
            _ => (ioprio::CLASS_BE, 7),
        }
    }

    /// The ABISS level a request or task at kernel (class, level) is served at: the highest
    /// ABISS level whose kernel priority it does not exceed. No class means the kernel's
    /// default, BE/4; idle is below every level and counts as the lowest.
    #[must_use]
    #[expect(
        clippy::inline_always,
        reason = "called from eBPF programs, where a call that is not inlined costs a call frame"
    )]
    #[inline(always)]
    pub const fn from_kernel(class: u8, level: u8) -> u8 {
        match class {
            ioprio::CLASS_RT => level / 2,
            ioprio::CLASS_BE => match level {
                0 | 1 => 4,
                2 | 3 => 5,
                4..=6 => 6,
                _ => 7,
            },
            ioprio::CLASS_NONE => 6,
            _ => LOWEST,
        }
    }
}
