//! A disk's queue in sysfs and debugfs: reading its settings and applying planned writes.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::config::{Elevator, MIN_DISPATCH_DEPTH};
use super::disk::Disk;
use super::error::DeviceError;
use super::plan::{DepthSource, QueueNow, QueueSettings, QueueWrite, NO_ELEVATOR};
use super::sysfs::{read_number, read_trimmed, write_value, SYSFS};

/// The line of `queue/scheduler`, e.g. `none [mq-deadline] kyber bfq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SchedulerLine {
    /// The bracketed one.
    pub(super) active: String,
    /// All of them, in the kernel's order.
    pub(super) offered: Vec<String>,
}

impl SchedulerLine {
    /// `None` for a line without an active entry (old kernels print a bare `none` for
    /// bio-based disks) or with no entries at all.
    fn parse(line: &str) -> Option<Self> {
        let mut active = None;
        let mut offered = Vec::new();
        for word in line.split_whitespace() {
            if let Some(name) = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
                if active.replace(name.to_owned()).is_some() {
                    return None;
                }
                offered.push(name.to_owned());
            } else {
                offered.push(word.to_owned());
            }
        }
        Some(Self {
            active: active?,
            offered,
        })
    }

    pub(super) fn offers(&self, name: &str) -> bool {
        self.offered.iter().any(|offered| offered == name)
    }
}

/// Where a disk's settings live in sysfs and debugfs.
#[derive(Clone, Debug)]
pub(super) struct DiskQueue {
    name: String,
    queue_dir: PathBuf,
    mq_dir: PathBuf,
    diskseq_file: PathBuf,
}

impl DiskQueue {
    pub(super) fn of(disk: &Disk) -> Self {
        let block = Path::new(SYSFS).join("block").join(&disk.name);
        Self {
            name: disk.name.clone(),
            queue_dir: block.join("queue"),
            mq_dir: block.join("mq"),
            diskseq_file: block.join("diskseq"),
        }
    }

    pub(super) fn scheduler_file(&self) -> PathBuf {
        self.queue_dir.join("scheduler")
    }

    pub(super) fn nr_requests_file(&self) -> PathBuf {
        self.queue_dir.join("nr_requests")
    }

    pub(super) fn scheduler(&self) -> Result<SchedulerLine, DeviceError> {
        let path = self.scheduler_file();
        let line = match fs::read_to_string(&path) {
            Ok(line) => line,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(DeviceError::NoElevatorQueue {
                    name: self.name.clone(),
                })
            }
            Err(source) => return Err(DeviceError::Read { path, source }),
        };
        if line.trim() == NO_ELEVATOR {
            return Err(DeviceError::NoElevatorQueue {
                name: self.name.clone(),
            });
        }
        SchedulerLine::parse(&line).ok_or(DeviceError::Unparsable {
            path,
            content: line.trim().to_owned(),
        })
    }

    fn nr_requests(&self) -> Result<u32, DeviceError> {
        read_number(&self.nr_requests_file())
    }

    fn max_request_file(&self) -> PathBuf {
        self.queue_dir.join("max_sectors_kb")
    }

    fn read_ahead_file(&self) -> PathBuf {
        self.queue_dir.join("read_ahead_kb")
    }

    /// Writes `read_ahead_kb` back to `before` if it changed since it was read.
    fn put_back_read_ahead(&self, before: Option<&str>) {
        let Some(before) = before else { return };
        let path = self.read_ahead_file();
        if read_trimmed(&path).ok().as_deref() != Some(before) {
            if let Err(error) = write_value(&path, before) {
                log::warn!(
                    "{}: readahead not put back to {before} KiB: {error}",
                    self.name
                );
            }
        }
    }

    /// `queue/max_sectors_kb`; `None` where the disk does not show it.
    fn max_request_kib(&self) -> Option<u32> {
        read_number(&self.max_request_file()).ok()
    }

    /// Whether the kernel treats the disk as rotational; `false` when it does not say.
    pub(super) fn rotational(&self) -> bool {
        read_trimmed(&self.queue_dir.join("rotational")).is_ok_and(|flag| flag == "1")
    }

    pub(super) fn diskseq(&self) -> Option<u64> {
        read_trimmed(&self.diskseq_file).ok()?.parse().ok()
    }

    /// The live driver depth, the largest over the hardware queues, from blk-mq's debugfs
    /// (mounted privately if nobody mounted it); `None` when the kernel does not show it.
    pub(super) fn live_driver_depth(&self) -> Option<u32> {
        abiss_os::blk_mq::driver_tag_depth(&self.name).map(|(depth, _)| depth)
    }

    /// The allocated driver tags, the largest over the hardware queues.
    fn allocated_tags(&self) -> Result<u32, DeviceError> {
        let entries = fs::read_dir(&self.mq_dir).map_err(|source| DeviceError::Read {
            path: self.mq_dir.clone(),
            source,
        })?;
        let mut largest = None;
        for entry in entries.filter_map(Result::ok) {
            let tags = read_number(&entry.path().join("nr_tags"))?;
            largest = largest.max(Some(tags));
        }
        largest.ok_or_else(|| DeviceError::Read {
            path: self.mq_dir.clone(),
            source: io::Error::new(io::ErrorKind::NotFound, "no hardware queues"),
        })
    }

    /// The driver depth and how it was learned. Without debugfs, `nr_requests` shows the
    /// live depth while the scheduler is `none` (or, just after an elevator was switched off,
    /// the allocated tags, which is never less); with an elevator active only the allocated
    /// tags are known, which overstate a depth someone shrank before.
    fn driver_depth(&self) -> Result<(u32, DepthSource), DeviceError> {
        if let Some(depth) = self.live_driver_depth() {
            return Ok((depth, DepthSource::Debugfs));
        }
        let allocated = self.allocated_tags()?;
        if self.scheduler()?.active == NO_ELEVATOR {
            let shown = self.nr_requests()?;
            if shown < allocated {
                return Ok((shown, DepthSource::NrRequests));
            }
        }
        Ok((allocated, DepthSource::AllocatedTags))
    }

    /// The writable tunables of the active elevator.
    fn iosched(&self) -> BTreeMap<String, String> {
        let dir = self.queue_dir.join("iosched");
        let mut tunables = BTreeMap::new();
        let Ok(entries) = fs::read_dir(&dir) else {
            // `none` has no iosched directory.
            return tunables;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let writable = entry
                .metadata()
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o200 != 0);
            // A tunable that cannot be read back cannot be restored either; leave it out.
            if let (true, Ok(value)) = (writable, read_trimmed(&path)) {
                tunables.insert(entry.file_name().to_string_lossy().into_owned(), value);
            }
        }
        tunables
    }

    pub(super) fn settings(&self) -> Result<QueueSettings, DeviceError> {
        let (driver_depth, driver_depth_source) = self.driver_depth()?;
        Ok(QueueSettings {
            elevator: self.scheduler()?.active,
            nr_requests: self.nr_requests()?,
            driver_depth,
            driver_depth_source,
            iosched: self.iosched(),
            max_request_kib: self.max_request_kib(),
        })
    }

    pub(super) fn now(&self) -> Result<QueueNow, DeviceError> {
        Ok(QueueNow {
            elevator: self.scheduler()?.active,
            nr_requests: self.nr_requests()?,
            driver_depth: self.live_driver_depth(),
            iosched: self.iosched(),
            max_request_kib: self.max_request_kib(),
        })
    }

    pub(super) fn apply(&self, writes: &[QueueWrite]) -> Result<(), DeviceError> {
        for write in writes {
            match write {
                QueueWrite::Scheduler(name) => self.select(name)?,
                QueueWrite::DriverDepth(depth) => self.set_driver_depth(*depth)?,
                QueueWrite::ElevatorDepth(depth) => {
                    if self.nr_requests()? != *depth {
                        write_value(&self.nr_requests_file(), &depth.to_string())?;
                    }
                }
                QueueWrite::Tunable(name, value) => {
                    let path = self.queue_dir.join("iosched").join(name);
                    if read_trimmed(&path)? != *value {
                        write_value(&path, value)?;
                    }
                }
                QueueWrite::MaxRequestKib(kib) => {
                    // The cap only shortens real-time waits, and the kernel may refuse a value
                    // (5.15 to 6.9 refuse one above a hardware limit that shrank meanwhile): a
                    // refused write must neither fail a take nor leave a disk that can never
                    // be restored and so never taken again.
                    if self.max_request_kib() != Some(*kib) {
                        // Committing new queue limits recomputes the readahead from the
                        // disk's optimal I/O size (the lab's disk: 128 KiB → 1 MiB), which
                        // would silently drop the owner's readahead: it is put back.
                        let read_ahead = read_trimmed(&self.read_ahead_file()).ok();
                        if let Err(error) = write_value(&self.max_request_file(), &kib.to_string())
                        {
                            log::warn!("{}: largest request left as it is: {error}", self.name);
                        }
                        self.put_back_read_ahead(read_ahead.as_deref());
                    }
                }
            }
        }
        Ok(())
    }

    fn select(&self, name: &str) -> Result<(), DeviceError> {
        if self.scheduler()?.active == name {
            return Ok(());
        }
        let result = write_value(&self.scheduler_file(), name);
        if let Err(DeviceError::Write { .. }) = &result {
            // Writing a name makes the kernel try to load its module, so "not offered" is
            // known only after a refused write.
            let line = self.scheduler()?;
            if let (false, Ok(elevator)) = (line.offers(name), name.parse::<Elevator>()) {
                return Err(DeviceError::ElevatorNotOffered {
                    name: self.name.clone(),
                    elevator,
                    offered: line.offered.join(" "),
                    module: elevator.module(),
                });
            }
        }
        result
    }

    /// Resizes the driver tags; the scheduler must be `none`.
    fn set_driver_depth(&self, depth: u32) -> Result<(), DeviceError> {
        let path = self.nr_requests_file();
        // The kernel ignores a write of the value nr_requests already shows, and after an
        // elevator is switched off it shows the allocated tags whatever the live depth is; so
        // when they match, step to a neighbour first to make the wanted value a change.
        if self.nr_requests()? == depth {
            let neighbour = if depth > MIN_DISPATCH_DEPTH {
                depth - 1
            } else {
                depth + 1
            };
            write_value(&path, &neighbour.to_string())?;
        }
        write_value(&path, &depth.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_lines_give_the_active_and_offered_elevators() {
        let line = SchedulerLine::parse("none [mq-deadline] kyber bfq \n").unwrap();
        assert_eq!(line.active, "mq-deadline");
        assert_eq!(line.offered, ["none", "mq-deadline", "kyber", "bfq"]);
        assert!(line.offers("bfq"));
        assert!(!line.offers("cfq"));
        assert_eq!(SchedulerLine::parse("[none] ").unwrap().active, "none");
        assert_eq!(SchedulerLine::parse("none"), None);
        assert_eq!(SchedulerLine::parse(""), None);
        assert_eq!(SchedulerLine::parse("[none] [bfq]"), None);
    }
}
