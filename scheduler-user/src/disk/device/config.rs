//! What abissd gives a managed device: an elevator that honours I/O priorities and a dispatch
//! depth.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The smallest depth the kernel accepts for `nr_requests` (`BLKDEV_MIN_RQ`); it rounds smaller
/// values up to this.
pub(crate) const MIN_DISPATCH_DEPTH: u32 = 4;

/// An elevator that honours I/O priorities.
// It parses from its sysfs name; that `FromStr` impl lives in error.rs, beside the
// `DeviceError::UnknownElevator` it returns, because `DeviceError` names `Elevator` itself: so
// this module imports nothing from its siblings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Elevator {
    /// Budget Fair Queueing: weights per class and level, with idling.
    Bfq,
    /// mq-deadline: strict class order (real time, best effort, idle) with aging.
    MqDeadline,
}

impl Elevator {
    /// The name in `queue/scheduler`.
    #[must_use]
    pub(crate) const fn sysfs_name(self) -> &'static str {
        match self {
            Self::Bfq => "bfq",
            Self::MqDeadline => "mq-deadline",
        }
    }

    /// The kernel module that provides it, for `modprobe`.
    #[must_use]
    pub(crate) const fn module(self) -> &'static str {
        match self {
            Self::Bfq => "bfq",
            Self::MqDeadline => "mq-deadline",
        }
    }
}

impl fmt::Display for Elevator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.sysfs_name())
    }
}

/// The dispatch depth of a rotational disk unless `--dispatch-depth` says: the kernel's least.
/// Its head serves one request at a time, so each request the driver holds ahead of a
/// real-time one is a seek that request waits for, and the disk's own queue orders only what
/// it holds. On the lab hdd, four players started together under the seeky load waited
/// 0.38 s for the load at depth 4 against 0.64 s at 8, with best effort moving as much (1.82
/// against 1.83 MB/s) and the copy loop too (10.6 against 10.5 MB/s); on an hdd whose
/// command queue orders 32 (SATA's NCQ), 0.92 against 1.24 s (`docs/measurements.md`, "What a
/// start waits behind").
pub const ROTATIONAL_DISPATCH_DEPTH: u32 = MIN_DISPATCH_DEPTH;

/// The dispatch depth of any other disk (an SSD, an `NVMe` drive, a network volume) unless
/// `--dispatch-depth` says: a few requests more than the least keep its internal parallelism
/// busy, while a request dispatched ahead of a real-time one waits behind at most 7 others.
pub const SOLID_STATE_DISPATCH_DEPTH: u32 = 8;

/// How abissd takes the disks it manages, as its command line says: one elevator for all,
/// and a dispatch depth given for all or chosen per disk by its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The elevator while managed.
    pub elevator: Elevator,
    /// The dispatch depth of every disk (`--dispatch-depth`), or `None` for
    /// [`ROTATIONAL_DISPATCH_DEPTH`] on rotational disks and [`SOLID_STATE_DISPATCH_DEPTH`]
    /// on the others.
    pub dispatch_depth: Option<u32>,
}

impl DeviceOptions {
    /// What a disk is taken with: rotational or not, as the kernel says
    /// (`queue/rotational`).
    #[must_use]
    pub fn config_for(&self, rotational: bool) -> DeviceConfig {
        DeviceConfig {
            elevator: self.elevator,
            dispatch_depth: self.dispatch_depth.unwrap_or(if rotational {
                ROTATIONAL_DISPATCH_DEPTH
            } else {
                SOLID_STATE_DISPATCH_DEPTH
            }),
        }
    }
}

/// How abissd sets up a managed device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceConfig {
    /// The elevator while managed.
    pub elevator: Elevator,
    /// The most requests the driver may hold; the elevator orders the rest. Never raised above
    /// what the driver had.
    pub dispatch_depth: u32,
}

impl DeviceConfig {
    /// The default: mq-deadline, because it serves the ABISS classes in strict order (real-time
    /// requests always dispatch before best effort, which dispatch before idle), it is built into
    /// most distribution kernels, and it costs little per request; bfq turns priorities into
    /// weights and idles on queues, which trades latency of the highest class for fairness.
    /// The depth of a solid-state disk ([`SOLID_STATE_DISPATCH_DEPTH`]); abissd gives a
    /// rotational one less ([`DeviceOptions::config_for`]).
    pub const DEFAULT: Self = Self {
        elevator: Elevator::MqDeadline,
        dispatch_depth: SOLID_STATE_DISPATCH_DEPTH,
    };
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elevators_parse_and_print_their_sysfs_names() {
        for elevator in [Elevator::Bfq, Elevator::MqDeadline] {
            assert_eq!(elevator.to_string().parse::<Elevator>().unwrap(), elevator);
        }
        let error = "kyber".parse::<Elevator>().unwrap_err();
        assert!(error.to_string().contains("'kyber'"), "{error}");
        assert_eq!(
            serde_json::to_string(&Elevator::MqDeadline).unwrap(),
            "\"mq-deadline\""
        );
    }

    #[test]
    fn the_default_config_is_accepted_by_the_kernel() {
        assert!(DeviceConfig::default().dispatch_depth >= MIN_DISPATCH_DEPTH);
    }

    #[test]
    fn a_rotational_disk_gets_the_least_depth_unless_one_is_given() {
        let chosen = DeviceOptions {
            elevator: Elevator::MqDeadline,
            dispatch_depth: None,
        };
        assert_eq!(chosen.config_for(true).dispatch_depth, MIN_DISPATCH_DEPTH);
        assert_eq!(chosen.config_for(false), DeviceConfig::DEFAULT);
        let given = DeviceOptions {
            elevator: Elevator::Bfq,
            dispatch_depth: Some(16),
        };
        for rotational in [true, false] {
            assert_eq!(
                given.config_for(rotational),
                DeviceConfig {
                    elevator: Elevator::Bfq,
                    dispatch_depth: 16
                }
            );
        }
    }
}
