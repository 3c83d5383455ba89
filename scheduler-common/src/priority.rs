//! Priorities both sides compute alike: the kernel's I/O priority encoding and the ABISS
//! levels mapped onto it ([`AbissLevel`] for the daemon; the programs use [`abiss_level`]'s
//! `u8` functions, which it wraps).

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

/// An ABISS priority level: 0, the most urgent (real time), to 7, plain best effort; the
/// smaller, the more urgent, and so the order is the number's (the most urgent of several is
/// their `min`).
///
/// Its own type, and only ever 0 to 7, so that a level is not taken for a kernel I/O priority
/// (class and level, or encoded), whose levels also run 0 to 7 and mean something else. The
/// kernel side's maps keep a plain `u8` ([`crate::AttachedFile::level`]): the layout is the
/// ABI, and the programs compute with [`abiss_level`]'s functions.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbissLevel(u8);

impl AbissLevel {
    /// Level 0: real time, served first.
    pub const HIGHEST: Self = Self(0);
    /// Level 7: plain best effort.
    pub const LOWEST: Self = Self(abiss_level::LOWEST);

    /// Level `level`, if it is one (0 to 7).
    #[must_use]
    pub const fn new(level: u8) -> Option<Self> {
        if level <= abiss_level::LOWEST {
            Some(Self(level))
        } else {
            None
        }
    }

    /// Its number, 0 to 7.
    #[must_use]
    pub const fn get(self) -> u8 {
        self.0
    }

    /// The kernel (class, level) it maps to (see [`abiss_level`]).
    #[must_use]
    pub const fn to_kernel(self) -> (u8, u8) {
        abiss_level::to_kernel(self.0)
    }

    /// The encoded kernel I/O priority it maps to.
    #[must_use]
    pub const fn to_ioprio(self) -> u16 {
        let (class, level) = self.to_kernel();
        ioprio::encode(class, level)
    }

    /// The level a request or task at kernel (class, level) is served at (see
    /// [`abiss_level::from_kernel`]).
    #[must_use]
    pub const fn from_kernel(class: u8, level: u8) -> Self {
        Self(abiss_level::from_kernel(class, level))
    }

    /// The level a task or request with encoded I/O priority `ioprio` is served at.
    #[must_use]
    pub const fn of_ioprio(encoded: u16) -> Self {
        let (class, level) = ioprio::split(encoded);
        Self::from_kernel(class, level)
    }
}

impl core::fmt::Display for AbissLevel {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::{ioprio, AbissLevel};

    #[test]
    fn a_level_is_0_to_7_and_reads_back_from_its_kernel_priority() {
        assert_eq!(AbissLevel::new(8), None);
        for number in 0..=7 {
            let level = AbissLevel::new(number).expect("a level");
            assert_eq!(level.get(), number);
            let (class, kernel_level) = level.to_kernel();
            assert_eq!(AbissLevel::from_kernel(class, kernel_level), level);
            assert_eq!(AbissLevel::of_ioprio(level.to_ioprio()), level);
        }
        // A plain reader (no class: BE/4) is below every real-time level.
        assert_eq!(
            AbissLevel::of_ioprio(ioprio::encode(ioprio::CLASS_NONE, 0)),
            AbissLevel::new(6).expect("a level")
        );
        assert!(AbissLevel::HIGHEST < AbissLevel::LOWEST);
    }

    #[test]
    fn the_mapping_keeps_the_order() {
        // A lower ABISS level is served first: RT before BE, a lower kernel level first.
        for number in 0..7 {
            let level = |n| AbissLevel::new(n).expect("a level").to_kernel();
            assert!(level(number) < level(number + 1), "level {number}");
        }
        assert_eq!(AbissLevel::HIGHEST.to_kernel(), (ioprio::CLASS_RT, 0));
        assert_eq!(AbissLevel::LOWEST.to_kernel(), (ioprio::CLASS_BE, 7));
        assert_eq!(
            AbissLevel::from_kernel(ioprio::CLASS_IDLE, 0),
            AbissLevel::LOWEST
        );
        assert_eq!(
            AbissLevel::from_kernel(ioprio::CLASS_RT, 7).get(),
            3,
            "RT/7 is served at level 3, below RT/6"
        );
    }
}
