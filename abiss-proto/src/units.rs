//! Names of devices, operations and I/O priorities as users know them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A block device number, `major:minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DeviceNumber {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DeviceNumber {
    /// From the kernel's internal `dev_t` (major in the top 12 bits of 32, minor in the low 20),
    /// the encoding eBPF programs see.
    #[must_use]
    pub const fn from_kernel(dev: u32) -> Self {
        Self {
            major: dev >> 20,
            minor: dev & ((1 << 20) - 1),
        }
    }

    /// The kernel's internal `dev_t` encoding.
    #[must_use]
    pub const fn to_kernel(self) -> u32 {
        (self.major << 20) | self.minor
    }
}

impl fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DeviceNumber {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (major, minor) = s
            .split_once(':')
            .ok_or_else(|| format!("'{s}' is not a MAJOR:MINOR device number"))?;
        let parse = |part: &str| {
            part.trim()
                .parse::<u32>()
                .map_err(|_| format!("'{s}' is not a MAJOR:MINOR device number"))
        };
        Ok(Self {
            major: parse(major)?,
            minor: parse(minor)?,
        })
    }
}

/// A block operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// Read.
    Read,
    /// Write.
    Write,
    /// Cache flush.
    Flush,
    /// Discard (trim).
    Discard,
    /// Write zeroes.
    WriteZeroes,
    /// Any other `REQ_OP_*` value.
    Other(u8),
}

impl Operation {
    /// From the kernel's `REQ_OP_*` value.
    #[must_use]
    pub const fn from_kernel(op: u8) -> Self {
        match op {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Flush,
            3 => Self::Discard,
            9 => Self::WriteZeroes,
            other => Self::Other(other),
        }
    }

    /// One letter, as in blktrace's RWBS field.
    #[must_use]
    pub const fn letter(self) -> char {
        match self {
            Self::Read => 'R',
            Self::Write => 'W',
            Self::Flush => 'F',
            Self::Discard => 'D',
            Self::WriteZeroes => 'Z',
            Self::Other(_) => '?',
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read => f.write_str("read"),
            Self::Write => f.write_str("write"),
            Self::Flush => f.write_str("flush"),
            Self::Discard => f.write_str("discard"),
            Self::WriteZeroes => f.write_str("write-zeroes"),
            Self::Other(op) => write!(f, "op{op}"),
        }
    }
}

/// An I/O priority class (`ioprio_set(2)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoClass {
    /// No class set: the kernel serves it as best effort, with a level from the task's nice value.
    None,
    /// Real time.
    Rt,
    /// Best effort.
    Be,
    /// Idle.
    Idle,
    /// A class value the kernel does not define.
    Invalid,
}

impl IoClass {
    /// From the kernel's class number.
    #[must_use]
    pub const fn from_kernel(class: u8) -> Self {
        match class {
            0 => Self::None,
            1 => Self::Rt,
            2 => Self::Be,
            3 => Self::Idle,
            _ => Self::Invalid,
        }
    }
}

impl fmt::Display for IoClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Rt => "rt",
            Self::Be => "be",
            Self::Idle => "idle",
            Self::Invalid => "invalid",
        })
    }
}

/// An I/O priority: class and level (0 = highest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct IoPriority {
    /// The class.
    pub class: IoClass,
    /// The level within the class, 0..=7.
    pub level: u8,
}

impl fmt::Display for IoPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.class, self.level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_round_trip() {
        let dev = DeviceNumber {
            major: 259,
            minor: 1_048_575,
        };
        assert_eq!(DeviceNumber::from_kernel(dev.to_kernel()), dev);
        assert_eq!(
            "7:3".parse::<DeviceNumber>(),
            Ok(DeviceNumber { major: 7, minor: 3 })
        );
        assert!("loop0".parse::<DeviceNumber>().is_err());
        assert!("7:x".parse::<DeviceNumber>().is_err());
    }

    #[test]
    fn priorities_print_as_class_and_level() {
        let p = IoPriority {
            class: IoClass::from_kernel(1),
            level: 0,
        };
        assert_eq!(p.to_string(), "rt/0");
        assert_eq!(Operation::from_kernel(1).to_string(), "write");
    }
}
