//! The sysfs writes that take a disk and that give it back, planned from settings alone: this
//! module reads and writes nothing, so every plan can be tested without a disk.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{DeviceConfig, Elevator};

/// The scheduler name that means "no elevator".
pub(super) const NO_ELEVATOR: &str = "none";

/// The largest request a managed disk takes, KiB (`queue/max_sectors_kb`, lowered to this when
/// larger). A real-time request waits in the driver behind the requests already dispatched, so
/// their size bounds its wait as much as their number does (Paceline's short queues). On the
/// lab hdd with 4 requests at once (Linux 6.18, whose page cache holds large folios, each one
/// segment), the copy loop's writes reached the disk as 1.2 MB requests, and a 1 MB/s
/// stream's real-time tail behind them was 268 to 286 ms: the reader of a 564 KiB buffer found
/// its pages still loading. At 512 KiB the tail was 153 ms and it found every page loaded.
pub const REQUEST_CAP_KIB: u32 = 512;

/// mq-deadline's `write_expire` on a managed disk, ms (the kernel's default is 5000): how long a
/// best-effort write may wait while the elevator serves others in sector order. The file
/// system's own metadata is written back at best effort, and a writer that needs one of those
/// blocks while it is being written waits for that write: a direct recording's writer on
/// ext4 (its inode, the superblock's orphan list) waited out the whole 5 s behind a best-effort
/// writer's ascending stream on the lab hdd (every group-0 metadata write there took 5.2 to
/// 5.3 s), and its ring of 2 s overflowed. Half a second is mq-deadline's own `read_expire`.
pub const WRITE_EXPIRE_MS: u32 = 500;

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
    /// `queue/max_sectors_kb`, the largest request; `None` where the disk has no such file, or
    /// in a state file from before abissd capped it (nothing to put back either way).
    #[serde(default)]
    pub max_request_kib: Option<u32>,
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
    /// `queue/max_sectors_kb`.
    MaxRequestKib(u32),
}

/// The writes that give a disk `config`, from its `original` settings: requests larger than
/// [`REQUEST_CAP_KIB`] capped first, then no elevator switch when the disk already has the
/// elevator and a driver depth no deeper than asked, so its tunables survive.
pub(super) fn plan_take(original: &QueueSettings, config: DeviceConfig) -> Vec<QueueWrite> {
    let elevator = config.elevator.sysfs_name().to_owned();
    let mut writes = Vec::new();
    if original
        .max_request_kib
        .is_some_and(|kib| kib > REQUEST_CAP_KIB)
    {
        writes.push(QueueWrite::MaxRequestKib(REQUEST_CAP_KIB));
    }
    if original.driver_depth > config.dispatch_depth {
        writes.extend([
            QueueWrite::Scheduler(NO_ELEVATOR.to_owned()),
            QueueWrite::DriverDepth(config.dispatch_depth),
            QueueWrite::Scheduler(elevator),
        ]);
    } else if original.elevator != elevator {
        writes.push(QueueWrite::Scheduler(elevator.clone()));
    }
    // Selecting an elevator resets its tunables; one kept keeps them.
    let kept = writes
        .iter()
        .all(|write| !matches!(write, QueueWrite::Scheduler(_)));
    let expire = WRITE_EXPIRE_MS.to_string();
    if config.elevator == Elevator::MqDeadline
        && !(kept && original.iosched.get("write_expire") == Some(&expire))
    {
        writes.push(QueueWrite::Tunable("write_expire".into(), expire));
    }
    writes
}

/// A disk's settings now, as far as restoring needs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct QueueNow {
    pub(super) elevator: String,
    pub(super) nr_requests: u32,
    /// `None` without debugfs.
    pub(super) driver_depth: Option<u32>,
    pub(super) iosched: BTreeMap<String, String>,
    pub(super) max_request_kib: Option<u32>,
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
    if let Some(kib) = original.max_request_kib {
        if now.max_request_kib != Some(kib) {
            writes.push(QueueWrite::MaxRequestKib(kib));
        }
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(elevator: &str, nr_requests: u32, driver_depth: u32) -> QueueSettings {
        QueueSettings {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            driver_depth_source: DepthSource::Debugfs,
            iosched: BTreeMap::from([("fifo_batch".into(), "16".into())]),
            max_request_kib: Some(REQUEST_CAP_KIB),
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
            [QueueWrite::Scheduler("mq-deadline".into()), write_expire()]
        );
        assert_eq!(
            plan_take(&settings("mq-deadline", 256, 16), config),
            [write_expire()]
        );
    }

    fn write_expire() -> QueueWrite {
        QueueWrite::Tunable("write_expire".into(), WRITE_EXPIRE_MS.to_string())
    }

    /// mq-deadline's best-effort writes wait at most [`WRITE_EXPIRE_MS`]: written after any
    /// switch of elevator (which resets it), and not again when a kept elevator has it.
    #[test]
    fn taking_with_mq_deadline_bounds_how_long_a_write_waits() {
        let config = DeviceConfig {
            elevator: Elevator::MqDeadline,
            dispatch_depth: 8,
        };
        let mut expiring = settings("mq-deadline", 256, 8);
        expiring
            .iosched
            .insert("write_expire".into(), WRITE_EXPIRE_MS.to_string());
        assert_eq!(plan_take(&expiring, config), []);
        let deep = QueueSettings {
            driver_depth: 128,
            ..expiring
        };
        let writes = plan_take(&deep, config);
        assert_eq!(writes.last(), Some(&write_expire()));
        assert_eq!(writes.len(), 4, "{writes:?}");
    }

    fn now(elevator: &str, nr_requests: u32, driver_depth: Option<u32>) -> QueueNow {
        QueueNow {
            elevator: elevator.into(),
            nr_requests,
            driver_depth,
            iosched: BTreeMap::new(),
            max_request_kib: Some(REQUEST_CAP_KIB),
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
    fn larger_requests_are_capped_at_the_take_and_put_back_at_the_restore() {
        let config = DeviceConfig {
            elevator: Elevator::MqDeadline,
            dispatch_depth: 16,
        };
        let large = QueueSettings {
            max_request_kib: Some(1280),
            ..settings("mq-deadline", 256, 16)
        };
        assert_eq!(
            plan_take(&large, config),
            [QueueWrite::MaxRequestKib(REQUEST_CAP_KIB), write_expire()]
        );
        let small = QueueSettings {
            max_request_kib: Some(256),
            ..large.clone()
        };
        assert_eq!(
            plan_take(&small, config),
            [write_expire()],
            "smaller ones stay"
        );
        let taken = QueueNow {
            iosched: large.iosched.clone(),
            ..now("mq-deadline", 256, Some(16))
        };
        assert_eq!(
            plan_restore(&large, None, &taken),
            [QueueWrite::MaxRequestKib(1280)]
        );
        // A state file from before the cap says nothing of it: nothing to put back.
        let before_the_cap = QueueSettings {
            max_request_kib: None,
            ..large
        };
        assert_eq!(plan_restore(&before_the_cap, None, &taken), []);
        let old_file: QueueSettings = serde_json::from_str(
            r#"{"elevator":"none","nr_requests":4,"driver_depth":4,"driver_depth_source":"debugfs","iosched":{}}"#,
        )
        .unwrap();
        assert_eq!(old_file.max_request_kib, None);
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
