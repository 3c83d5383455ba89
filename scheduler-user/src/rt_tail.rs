//! The real-time latency tail of each managed disk, over the last seconds: what `--buffer
//! auto` sizes buffers from. Fed the cumulative latency histograms the block programs keep
//! (every completed request's queue and service time, by device and priority), it keeps one
//! difference per second for the last [`WINDOW_SECONDS`] and answers the p99 of queue plus
//! service time of the real-time requests among them.
//!
//! The histograms have power-of-two buckets, and the two quantiles are added, so the tail is
//! an upper bound (up to about twice the true p99): a buffer sized from it errs on the large
//! side.

use std::collections::{BTreeMap, VecDeque};

use abiss_proto::{DeviceNumber, IoClass, LatencyGroup, Log2Histogram};

use crate::policy::buffer_sizing::MIN_TAIL_SAMPLES;

/// Seconds of history the tail is taken over.
pub const WINDOW_SECONDS: usize = 10;

/// How often the histograms are looked at.
pub const UPDATE_NS: u64 = 1_000_000_000;

/// One disk's real-time (queue, service) histograms.
type Pair = (Log2Histogram, Log2Histogram);

/// The recent real-time latency of every disk.
#[derive(Debug, Default)]
pub struct RealTimeTails {
    cumulative: BTreeMap<DeviceNumber, Pair>,
    recent: BTreeMap<DeviceNumber, VecDeque<Pair>>,
    updated_ns: Option<u64>,
}

impl RealTimeTails {
    /// Whether it is time to look at the histograms again.
    #[must_use]
    pub fn due(&self, now_ns: u64) -> bool {
        self.updated_ns
            .is_none_or(|at| now_ns.saturating_sub(at) >= UPDATE_NS)
    }

    /// Takes in the cumulative histograms as they are at `now_ns`.
    pub fn update(&mut self, groups: &[LatencyGroup], now_ns: u64) {
        self.updated_ns = Some(now_ns);
        let mut totals: BTreeMap<DeviceNumber, Pair> = BTreeMap::new();
        for group in groups.iter().filter(|g| g.priority.class == IoClass::Rt) {
            let (queue, service) = totals.entry(group.device).or_default();
            queue.merge(&group.queue);
            service.merge(&group.service);
        }
        for (device, (queue, service)) in totals {
            let delta = match self.cumulative.get(&device) {
                Some((queue_before, service_before)) => {
                    (queue.since(queue_before), service.since(service_before))
                }
                None => (queue.clone(), service.clone()),
            };
            let recent = self.recent.entry(device).or_default();
            recent.push_back(delta);
            while recent.len() > WINDOW_SECONDS {
                recent.pop_front();
            }
            self.cumulative.insert(device, (queue, service));
        }
    }

    /// The p99 of queue plus service time of `device`'s real-time requests over the window,
    /// in ns; `None` while fewer than [`MIN_TAIL_SAMPLES`] completed in it.
    #[must_use]
    pub fn tail_ns(&self, device: DeviceNumber) -> Option<u64> {
        let recent = self.recent.get(&device)?;
        let mut queue = Log2Histogram::default();
        let mut service = Log2Histogram::default();
        for (q, s) in recent {
            queue.merge(q);
            service.merge(s);
        }
        if service.count() < MIN_TAIL_SAMPLES {
            return None;
        }
        let p99 = |h: &Log2Histogram| h.quantile_us(0.99).unwrap_or(0);
        Some((p99(&queue) + p99(&service)) * 1000)
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
    fn the_tail_follows_the_recent_real_time_requests_of_each_disk() {
        let disk = DeviceNumber { major: 8, minor: 0 };
        let mut tails = RealTimeTails::default();
        assert!(tails.due(0));
        // Too few samples: no tail; best-effort requests do not count.
        tails.update(
            &[
                group(disk, IoClass::Rt, 5_000, 10),
                group(disk, IoClass::Be, 900_000, 1000),
            ],
            0,
        );
        assert_eq!(tails.tail_ns(disk), None);
        assert!(!tails.due(UPDATE_NS - 1) && tails.due(UPDATE_NS));
        // 100 more at about 60 ms: the tail is their bucket's top.
        let mut cumulative = group(disk, IoClass::Rt, 5_000, 10);
        let slow = group(disk, IoClass::Rt, 60_000, 100);
        cumulative.service.merge(&slow.service);
        tails.update(&[cumulative.clone()], UPDATE_NS);
        let tail = tails.tail_ns(disk).unwrap();
        assert!((60_000_000..=140_000_000).contains(&tail), "{tail}");
        // Ten quiet seconds of fast requests later, the slow ones are out of the window.
        for second in 2..=12u64 {
            cumulative
                .service
                .merge(&group(disk, IoClass::Rt, 1_000, 10).service);
            tails.update(&[cumulative.clone()], second * UPDATE_NS);
        }
        assert!(tails.tail_ns(disk).unwrap() < 10_000_000);
    }
}
