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
    /// A depth of 8: the kernel's minimum is 4, and a few more keep a disk's internal
    /// parallelism busy while a request dispatched ahead of a real-time one waits at most
    /// behind 7 others.
    pub const DEFAULT: Self = Self {
        elevator: Elevator::MqDeadline,
        dispatch_depth: 8,
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
}
