//! The sysfs writes that take a disk and that give it back, planned from settings alone: this
//! module reads and writes nothing, so every plan can be tested without a disk.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::DeviceConfig;

/// The scheduler name that means "no elevator".
pub(super) const NO_ELEVATOR: &str = "none";

/// How a driver depth was learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DepthSource {
    /// Read live from blk-mq's debugfs (mounted, or mounted privately for the read).
    Debugfs,
    /// Without debugfs, with the scheduler `none`: `queue/nr_requests`, below the allocated
    /// tags, so a depth someone set.
    NrRequests,
    /// Without debugfs: the allocated tag count (`mq/N/nr_tags`), which is the driver's own
    /// depth unless someone shrank it before.
    AllocatedTags,
    /// What abissd wrote, not read back (no debugfs).
    Written,
}

/// A disk's queue settings that abissd changes, as they were before it took the disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// The active scheduler (`none`, `mq-deadline`, `kyber`, `bfq`, …).
    pub elevator: String,
    /// `queue/nr_requests`: the elevator's own depth, or with `none` the driver depth.
    pub nr_requests: u32,
    /// The driver depth.
    pub driver_depth: u32,
    /// How `driver_depth` was learned.
    pub driver_depth_source: DepthSource,
    /// The elevator's tunables (`queue/iosched/*`), which selecting another elevator discards.
    pub iosched: BTreeMap<String, String>,
}

/// One sysfs write of a plan, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum QueueWrite {
    /// Select a scheduler.
    Scheduler(String),
    /// `nr_requests` with scheduler `none`: resizes the driver tags.
    DriverDepth(u32),
    /// `nr_requests` with an elevator: the elevator's own depth.
    ElevatorDepth(u32),
    /// `queue/iosched/<name>`.
    Tunable(String, String),
}

/// The writes that give a disk `config`, from its `original` settings. Empty when it already
/// has the elevator and a driver depth no deeper than asked, so its tunables survive.
pub(super) fn plan_take(original: &QueueSettings, config: DeviceConfig) -> Vec<QueueWrite> {
    let elevator = config.elevator.sysfs_name().to_owned();
    if original.driver_depth > config.dispatch_depth {
        vec![
            QueueWrite::Scheduler(NO_ELEVATOR.to_owned()),
            QueueWrite::DriverDepth(config.dispatch_depth),
            QueueWrite::Scheduler(elevator),
        ]
    } else if original.elevator == elevator {
        Vec::new()
    } else {
        vec![QueueWrite::Scheduler(elevator)]
    }
}

/// A disk's settings now, as far as restoring needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct QueueNow {
    pub(super) elevator: String,
    pub(super) nr_requests: u32,
    /// `None` without debugfs.
    pub(super) driver_depth: Option<u32>,
    pub(super) iosched: BTreeMap<String, String>,
}

/// The writes that put `original` back on a disk that is `now` as it is. `shrunk_to` says
/// whether abissd meant to change the driver depth, for when the live depth cannot be read.
pub(super) fn plan_restore(
    original: &QueueSettings,
    shrunk_to: Option<u32>,
    now: &QueueNow,
) -> Vec<QueueWrite> {
    let mut writes = Vec::new();
    let depth_changed = match now.driver_depth {
        Some(depth) => depth != original.driver_depth,
        None => shrunk_to.is_some(),
    };
    // With `none`, nr_requests shows the driver depth, except after an elevator is switched off:
    // then it shows the allocated tags until written. Writing the depth makes it show the depth.
    let shows_wrong_depth = original.elevator == NO_ELEVATOR
        && (now.elevator != NO_ELEVATOR || now.nr_requests != original.driver_depth);
    let mut elevator_now = now.elevator.as_str();
    if depth_changed || shows_wrong_depth {
        writes.push(QueueWrite::Scheduler(NO_ELEVATOR.to_owned()));
        writes.push(QueueWrite::DriverDepth(original.driver_depth));
        elevator_now = NO_ELEVATOR;
    }
    let switched = elevator_now != original.elevator;
    if switched {
        writes.push(QueueWrite::Scheduler(original.elevator.clone()));
    }
    if original.elevator != NO_ELEVATOR {
        if switched || now.nr_requests != original.nr_requests {
            writes.push(QueueWrite::ElevatorDepth(original.nr_requests));
        }
        for (name, value) in &original.iosched {
            if switched || now.iosched.get(name) != Some(value) {
                writes.push(QueueWrite::Tunable(name.clone(), value.clone()));
            }
        }
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::super::config::Elevator;
    use super::*;

    fn settings(elevator: &str, nr_requests: u32, driver_depth: u32) -> QueueSettings {
        QueueSettings {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            driver_depth_source: DepthSource::Debugfs,
            iosched: BTreeMap::from([("fifo_batch".into(), "16".into())]),
        }
    }

    #[test]
    fn taking_a_deep_queue_shrinks_it_under_none_then_selects_the_elevator() {
        let config = DeviceConfig {
            elevator: Elevator::Bfq,
            dispatch_depth: 8,
        };
        assert_eq!(
            plan_take(&settings("mq-deadline", 256, 128), config),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(8),
                QueueWrite::Scheduler("bfq".into()),
            ]
        );
    }

    #[test]
    fn taking_never_deepens_the_driver_queue() {
        let config = DeviceConfig {
            elevator: Elevator::MqDeadline,
            dispatch_depth: 16,
        };
        assert_eq!(
            plan_take(&settings("none", 4, 4), config),
            [QueueWrite::Scheduler("mq-deadline".into())]
        );
        assert_eq!(plan_take(&settings("mq-deadline", 256, 16), config), []);
    }

    fn now(elevator: &str, nr_requests: u32, driver_depth: Option<u32>) -> QueueNow {
        QueueNow {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            iosched: BTreeMap::new(),
        }
    }

    #[test]
    fn restoring_deepens_under_none_then_puts_elevator_depth_and_tunables_back() {
        let original = settings("mq-deadline", 64, 128);
        assert_eq!(
            plan_restore(&original, Some(8), &now("bfq", 256, Some(8))),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(128),
                QueueWrite::Scheduler("mq-deadline".into()),
                QueueWrite::ElevatorDepth(64),
                QueueWrite::Tunable("fifo_batch".into(), "16".into()),
            ]
        );
    }

    #[test]
    fn restoring_without_debugfs_trusts_the_saved_plan() {
        let original = settings("none", 128, 128);
        assert_eq!(
            plan_restore(&original, Some(8), &now("bfq", 256, None)),
            [
                QueueWrite::Scheduler("none".into()),
                QueueWrite::DriverDepth(128),
            ]
        );
        let untouched_depth = settings("kyber", 256, 128);
        assert_eq!(
            plan_restore(&untouched_depth, None, &now("bfq", 256, None)),
            [
                QueueWrite::Scheduler("kyber".into()),
                QueueWrite::ElevatorDepth(256),
                QueueWrite::Tunable("fifo_batch".into(), "16".into()),
            ]
        );
    }

    #[test]
    fn restoring_none_writes_the_driver_depth_last_so_nr_requests_shows_it() {
        let original = settings("none", 6, 6);
        let writes = [
            QueueWrite::Scheduler("none".into()),
            QueueWrite::DriverDepth(6),
        ];
        assert_eq!(
            plan_restore(&original, None, &now("mq-deadline", 256, Some(6))),
            writes
        );
        assert_eq!(
            plan_restore(&original, None, &now("none", 128, Some(6))),
            writes
        );
        assert_eq!(plan_restore(&original, None, &now("none", 6, Some(6))), []);
    }

    #[test]
    fn restoring_a_restored_disk_writes_nothing() {
        let original = settings("mq-deadline", 64, 128);
        let restored = QueueNow {
            iosched: original.iosched.clone(),
            ..now("mq-deadline", 64, Some(128))
        };
        assert_eq!(plan_restore(&original, Some(8), &restored), []);
    }
}
