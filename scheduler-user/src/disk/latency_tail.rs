//! The latency tail of each managed disk per priority class, over the last seconds: what
//! `--buffer auto` sizes buffers from. Fed the cumulative latency histograms the block programs
//! keep (every completed request's queue and service time, by device and priority), it keeps
//! one difference per look (once a second while automatic streams run; a pause of up to
//! [`WINDOW_SECONDS`] is one difference, a longer one empties the history) for the last
//! [`MAX_WINDOW_SECONDS`] looks, and answers the p99 of queue plus service time of a class's
//! requests over the last [`WINDOW_SECONDS`] looks, or over as many more as it takes to hold
//! [`MIN_TAIL_SAMPLES`] requests. One stream's loads are few: at 1 MB/s in thirds of a 700 KiB
//! buffer the lab hdd showed 29 real-time requests in 8 s, so a fixed 10 s window never
//! measured the tail of a disk with a single stream on it. A stream's loads are queued in its
//! level's class, so that class's tail is what its buffer must cover: the real-time one for
//! levels 0 to 3, the best-effort one (requests with no class set count there, as the kernel
//! serves them) for levels 4 to 7.
//!
//! The histograms have power-of-two buckets, and the two quantiles are added, so the tail is
//! an upper bound (up to about twice the true p99): a buffer sized from it errs on the large
//! side.
//!
//! A class that has not shown its latency yet (the first real-time stream of a disk that only
//! served best effort) is estimated from the service time of all the disk's requests (by
//! `controller::sizing`, never below the default for a disk not seen at all): a
//! real-time request waits in the driver behind the requests already dispatched, so its
//! service time is about theirs, and the elevator dispatches it ahead of those still queued. On
//! the lab hdd under the copy loop the best-effort requests' service p99 was at most 262 ms
//! before the first stream came, and that stream's real-time tail then measured 190 ms; the
//! fixed default the buffer was sized from before was 100 ms, and a reader keeping to the first
//! buffer found a page not loaded now and then.

use std::collections::{BTreeMap, VecDeque};

use abiss_proto::{DeviceNumber, IoClass, LatencyGroup, Log2Histogram};
use scheduler_common::MonotonicNs;

use crate::policy::buffer_sizing::MIN_TAIL_SAMPLES;

/// Seconds of history the tail is taken over, at least.
pub(crate) const WINDOW_SECONDS: usize = 10;

/// Seconds of history kept, for classes whose requests are too few to measure in
/// [`WINDOW_SECONDS`].
pub(crate) const MAX_WINDOW_SECONDS: usize = 60;

/// How often the histograms are looked at.
pub(crate) const UPDATE_NS: u64 = 1_000_000_000;

/// One disk's and class's (queue, service) histograms.
type Pair = (Log2Histogram, Log2Histogram);

/// A disk and a priority class: [`IoClass::Rt`], [`IoClass::Be`] or [`IoClass::Idle`].
type Key = (DeviceNumber, IoClass);

/// The class a request of `class` is served in: no class set is best effort.
fn served_as(class: IoClass) -> Option<IoClass> {
    match class {
        IoClass::Rt => Some(IoClass::Rt),
        IoClass::Be | IoClass::None => Some(IoClass::Be),
        IoClass::Idle => Some(IoClass::Idle),
        IoClass::Invalid => None,
    }
}

/// The recent latency of every disk, per class.
#[derive(Debug, Default)]
pub(crate) struct LatencyTails {
    cumulative: BTreeMap<Key, Pair>,
    recent: BTreeMap<Key, VecDeque<Pair>>,
    updated_at: Option<MonotonicNs>,
}

impl LatencyTails {
    /// Whether it is time to look at the histograms again.
    #[must_use]
    pub(crate) fn due(&self, now: MonotonicNs) -> bool {
        self.updated_at
            .is_none_or(|at| now.saturating_since(at) >= UPDATE_NS)
    }

    /// Nanoseconds from `now` until it is time to look at the histograms again.
    #[must_use]
    pub(crate) fn ns_until_due(&self, now: MonotonicNs) -> u64 {
        self.updated_at
            .map_or(0, |at| at.saturating_add(UPDATE_NS).saturating_since(now))
    }

    /// Takes in the cumulative histograms as they are at `now`. The histograms are looked
    /// at only while automatic streams run, so after a longer pause the window is emptied
    /// first: its seconds are not the last ones, and what the disk did since the last look
    /// comes as one step.
    pub(crate) fn update(&mut self, groups: &[LatencyGroup], now: MonotonicNs) {
        let window_ns = UPDATE_NS.saturating_mul(WINDOW_SECONDS as u64);
        if self
            .updated_at
            .is_some_and(|at| now.saturating_since(at) > window_ns)
        {
            self.recent.clear();
        }
        self.updated_at = Some(now);
        let mut totals: BTreeMap<Key, Pair> = BTreeMap::new();
        for group in groups {
            let Some(class) = served_as(group.priority.class) else {
                continue;
            };
            let (queue, service) = totals.entry((group.device, class)).or_default();
            queue.merge(&group.queue);
            service.merge(&group.service);
        }
        for (key, (queue, service)) in totals {
            let delta = match self.cumulative.get(&key) {
                Some((queue_before, service_before)) => {
                    (queue.since(queue_before), service.since(service_before))
                }
                None => (queue.clone(), service.clone()),
            };
            let recent = self.recent.entry(key).or_default();
            recent.push_back(delta);
            while recent.len() > MAX_WINDOW_SECONDS {
                recent.pop_front();
            }
            self.cumulative.insert(key, (queue, service));
        }
    }

    /// The p99 of queue plus service time of `device`'s requests served in `class` over the
    /// window (as long as it takes to hold [`MIN_TAIL_SAMPLES`]), in ns; `None` while fewer
    /// completed in all the history kept.
    #[must_use]
    pub(crate) fn tail_ns(&self, device: DeviceNumber, class: IoClass) -> Option<u64> {
        let recent = self.recent.get(&(device, served_as(class)?))?;
        let mut queue = Log2Histogram::default();
        let mut service = Log2Histogram::default();
        for (seconds, (q, s)) in recent.iter().rev().enumerate() {
            if seconds >= WINDOW_SECONDS && service.count() >= MIN_TAIL_SAMPLES {
                break;
            }
            queue.merge(q);
            service.merge(s);
        }
        if service.count() < MIN_TAIL_SAMPLES {
            return None;
        }
        let p99 = |h: &Log2Histogram| h.quantile_us(0.99).unwrap_or(0);
        Some((p99(&queue) + p99(&service)) * 1000)
    }

    /// The p99 of service time of all `device`'s requests, whatever their class, over the
    /// window (as long as it takes to hold [`MIN_TAIL_SAMPLES`]), in ns: what a class that has
    /// not shown its own latency is estimated by (see the module); `None` while fewer completed.
    #[must_use]
    pub(crate) fn estimate_ns(&self, device: DeviceNumber) -> Option<u64> {
        let classes: Vec<&VecDeque<Pair>> = self
            .recent
            .iter()
            .filter(|((disk, _), _)| *disk == device)
            .map(|(_, recent)| recent)
            .collect();
        let mut service = Log2Histogram::default();
        // Every class got a difference at each update since it was first seen: their newest
        // entries are the same seconds.
        for seconds in 0..MAX_WINDOW_SECONDS {
            if seconds >= WINDOW_SECONDS && service.count() >= MIN_TAIL_SAMPLES {
                break;
            }
            for recent in &classes {
                if let Some((_, s)) = recent.iter().rev().nth(seconds) {
                    service.merge(s);
                }
            }
        }
        if service.count() < MIN_TAIL_SAMPLES {
            return None;
        }
        service.quantile_us(0.99).map(|us| us * 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abiss_proto::{IoPriority, Operation};

    fn group(device: DeviceNumber, class: IoClass, service_us: u64, count: u64) -> LatencyGroup {
        let mut slots = vec![0; 32];
        let index = (0..32)
            .find(|&i| Log2Histogram::bucket_bounds_us(i).1 > service_us)
            .unwrap();
        slots[index] = count;
        LatencyGroup {
            device,
            operation: Operation::Read,
            priority: IoPriority { class, level: 0 },
            stream: None,
            requests: count,
            bytes: count * 4096,
            inversions: 0,
            queue: Log2Histogram::from_slots(&[count], 0),
            service: Log2Histogram::from_slots(&slots, service_us * 1000),
        }
    }

    #[test]
    fn the_tail_follows_the_recent_requests_of_each_disk_and_class() {
        let disk = DeviceNumber { major: 8, minor: 0 };
        let mut tails = LatencyTails::default();
        assert!(tails.due(MonotonicNs::ZERO));
        // Too few real-time samples: no real-time tail; best-effort requests do not count
        // there, but they have their own (with the requests of no class).
        tails.update(
            &[
                group(disk, IoClass::Rt, 5_000, 10),
                group(disk, IoClass::Be, 900_000, 1000),
                group(disk, IoClass::None, 900_000, 1000),
            ],
            MonotonicNs::ZERO,
        );
        assert_eq!(tails.tail_ns(disk, IoClass::Rt), None);
        let be = tails.tail_ns(disk, IoClass::Be).unwrap();
        assert!((900_000_000..=2_000_000_000).contains(&be), "{be}");
        assert_eq!(tails.tail_ns(disk, IoClass::None), Some(be));
        assert_eq!(tails.tail_ns(disk, IoClass::Idle), None);
        assert!(!tails.due(MonotonicNs(UPDATE_NS - 1)) && tails.due(MonotonicNs(UPDATE_NS)));
        // 100 more at about 60 ms: the tail is their bucket's top.
        let mut cumulative = group(disk, IoClass::Rt, 5_000, 10);
        let slow = group(disk, IoClass::Rt, 60_000, 100);
        cumulative.service.merge(&slow.service);
        tails.update(&[cumulative.clone()], MonotonicNs(UPDATE_NS));
        let tail = tails.tail_ns(disk, IoClass::Rt).unwrap();
        assert!((60_000_000..=140_000_000).contains(&tail), "{tail}");
        // Ten quiet seconds of fast requests later, the slow ones are out of the window.
        for second in 2..=12u64 {
            cumulative
                .service
                .merge(&group(disk, IoClass::Rt, 1_000, 10).service);
            tails.update(&[cumulative.clone()], MonotonicNs(second * UPDATE_NS));
        }
        assert!(tails.tail_ns(disk, IoClass::Rt).unwrap() < 10_000_000);
    }

    #[test]
    fn a_class_not_seen_yet_is_estimated_from_the_service_time_of_the_disks_requests() {
        let disk = DeviceNumber { major: 8, minor: 0 };
        let other = DeviceNumber {
            major: 8,
            minor: 16,
        };
        let mut tails = LatencyTails::default();
        tails.update(&[group(disk, IoClass::Be, 30_000, 40)], MonotonicNs::ZERO);
        assert_eq!(tails.estimate_ns(disk), None, "too few requests");
        tails.update(
            &[
                group(disk, IoClass::Be, 30_000, 80),
                group(disk, IoClass::None, 200_000, 5),
                group(other, IoClass::Be, 900_000, 1000),
            ],
            MonotonicNs(UPDATE_NS),
        );
        assert_eq!(tails.tail_ns(disk, IoClass::Rt), None);
        // 85 requests, 5 of them slow: the p99 is the slow ones' bucket (capped at the
        // slowest), whatever their class; the other disk's requests do not count.
        assert_eq!(tails.estimate_ns(disk), Some(200_000_000));
        assert_eq!(tails.estimate_ns(DeviceNumber { major: 9, minor: 0 }), None);
    }

    #[test]
    fn a_class_with_few_requests_is_measured_over_as_many_seconds_as_it_takes() {
        let disk = DeviceNumber { major: 8, minor: 0 };
        let mut tails = LatencyTails::default();
        // One stream's loads: 4 requests a second at about 100 ms, after 40 slow seconds-old
        // ones that fell out of the kept history.
        let mut cumulative = group(disk, IoClass::Rt, 900_000, 40);
        tails.update(&[cumulative.clone()], MonotonicNs::ZERO);
        let mut measured_after = None;
        for second in 1..=(MAX_WINDOW_SECONDS as u64 + 5) {
            cumulative
                .service
                .merge(&group(disk, IoClass::Rt, 100_000, 4).service);
            tails.update(&[cumulative.clone()], MonotonicNs(second * UPDATE_NS));
            if let Some(tail) = tails.tail_ns(disk, IoClass::Rt) {
                measured_after.get_or_insert(second);
                if second > MAX_WINDOW_SECONDS as u64 {
                    assert!(tail < 300_000_000, "the slow start is out: {tail}");
                }
            }
        }
        // 40 + 4 a second reach 50 in the third second; with a fixed 10 s window the fast
        // ones alone (40) never would.
        assert_eq!(measured_after, Some(3));
        let tail = tails.tail_ns(disk, IoClass::Rt).unwrap();
        assert!((100_000_000..=300_000_000).contains(&tail), "{tail}");
        assert!(tails.estimate_ns(disk).is_some());
    }

    #[test]
    fn after_a_pause_longer_than_the_window_only_what_came_since_counts() {
        let disk = DeviceNumber { major: 8, minor: 0 };
        let mut tails = LatencyTails::default();
        let slow = group(disk, IoClass::Rt, 900_000, 100);
        tails.update(std::slice::from_ref(&slow), MonotonicNs::ZERO);
        assert!(tails.tail_ns(disk, IoClass::Rt).unwrap() >= 900_000_000);
        // An hour later, 100 fast requests more: the slow ones are not the last seconds'.
        let mut cumulative = slow;
        cumulative
            .service
            .merge(&group(disk, IoClass::Rt, 1_000, 100).service);
        tails.update(&[cumulative], MonotonicNs(3_600 * UPDATE_NS));
        assert!(tails.tail_ns(disk, IoClass::Rt).unwrap() < 10_000_000);
    }
}
