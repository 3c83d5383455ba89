//! The device queue: which queued request the actuator serves next.
//!
//! The order is decided here, explicitly, and never by whichever thread wins a lock: an
//! unfair lock would starve requests and make the emulated device's order meaningless.

use std::collections::VecDeque;
use std::time::Instant;

use crate::model::ServiceOrder;

/// What the queue needs to know about a request.
pub trait Queued {
    /// Byte offset of the request's first byte.
    fn offset(&self) -> u64;
    /// When the request reached the device.
    fn arrival(&self) -> Instant;
}

/// Requests waiting for the actuator, in arrival order.
///
/// Only the first `depth` requests are in the device queue (like NCQ tags); the rest wait in
/// the host's order behind them. Elevator order chooses within the device queue only.
#[derive(Debug)]
pub struct DeviceQueue<T> {
    pending: VecDeque<T>,
    depth: usize,
    order: ServiceOrder,
    /// Elevator direction: towards higher offsets.
    ascending: bool,
    /// How many times the oldest request has been passed over.
    oldest_passed_over: usize,
}

impl<T: Queued> DeviceQueue<T> {
    /// An empty queue with a device queue of `depth` requests (at least 1).
    #[must_use]
    pub fn new(depth: usize, order: ServiceOrder) -> Self {
        Self {
            pending: VecDeque::new(),
            depth: depth.max(1),
            order,
            ascending: true,
            oldest_passed_over: 0,
        }
    }

    /// Adds a request; requests must be pushed in arrival order.
    pub fn push(&mut self, request: T) {
        self.pending.push_back(request);
    }

    /// Number of waiting requests.
    #[must_use]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no request waits.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Takes the request to serve when the actuator becomes free at `free_at` with the head at
    /// `head`.
    ///
    /// Only requests that had arrived by `free_at` compete; if none had (the device went
    /// idle), the device starts on the first one to arrive. Like a disk's command aging, the
    /// oldest request is served once `depth` others have been chosen over it, so a stream of
    /// requests at the head cannot starve it.
    pub fn pick(&mut self, free_at: Instant, head: u64) -> Option<T> {
        let window = self.pending.len().min(self.depth);
        let eligible = self
            .pending
            .iter()
            .take(window)
            .take_while(|r| r.arrival() <= free_at)
            .count();
        if eligible == 0
            || self.order == ServiceOrder::Fifo
            || self.oldest_passed_over >= self.depth
        {
            self.oldest_passed_over = 0;
            return self.pending.pop_front();
        }
        let index = self.elevator_choice(eligible, head);
        if index == 0 {
            self.oldest_passed_over = 0;
        } else {
            self.oldest_passed_over += 1;
        }
        self.pending.remove(index)
    }

    /// LOOK: the nearest request at or beyond the head in the direction of travel; if there is
    /// none, turn around.
    fn elevator_choice(&mut self, eligible: usize, head: u64) -> usize {
        for _ in 0..2 {
            let candidates = self.pending.iter().take(eligible).enumerate();
            let best = if self.ascending {
                candidates
                    .filter(|(_, r)| r.offset() >= head)
                    .min_by_key(|(i, r)| (r.offset(), *i))
            } else {
                candidates
                    .filter(|(_, r)| r.offset() <= head)
                    .max_by_key(|(i, r)| (r.offset(), std::cmp::Reverse(*i)))
            };
            if let Some((index, _)) = best {
                return index;
            }
            self.ascending = !self.ascending;
        }
        // Unreachable with at least one eligible request: one direction always has one.
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    #[derive(Debug, Clone, PartialEq)]
    struct Req {
        offset: u64,
        arrival: Instant,
    }
    impl Queued for Req {
        fn offset(&self) -> u64 {
            self.offset
        }
        fn arrival(&self) -> Instant {
            self.arrival
        }
    }

    fn queue_of(offsets: &[u64], depth: usize, order: ServiceOrder) -> (DeviceQueue<Req>, Instant) {
        let t0 = Instant::now();
        let mut q = DeviceQueue::new(depth, order);
        for (i, &offset) in offsets.iter().enumerate() {
            q.push(Req {
                offset,
                arrival: t0 + Duration::from_micros(i as u64),
            });
        }
        (q, t0 + Duration::from_secs(1))
    }

    fn drain(q: &mut DeviceQueue<Req>, now: Instant, mut head: u64) -> Vec<u64> {
        let mut out = Vec::new();
        while let Some(r) = q.pick(now, head) {
            head = r.offset + 1;
            out.push(r.offset);
        }
        out
    }

    #[test]
    fn fifo_serves_in_arrival_order() {
        let (mut q, now) = queue_of(&[50, 10, 40, 20], 4, ServiceOrder::Fifo);
        assert_eq!(drain(&mut q, now, 30), vec![50, 10, 40, 20]);
    }

    #[test]
    fn scan_sweeps_up_then_down() {
        let (mut q, now) = queue_of(&[50, 10, 40, 20], 4, ServiceOrder::Scan);
        assert_eq!(drain(&mut q, now, 30), vec![40, 50, 20, 10]);
    }

    #[test]
    fn scan_chooses_only_within_the_device_queue() {
        // Depth 2: 90 is not yet in the device queue when 10 and 50 are chosen from.
        let (mut q, now) = queue_of(&[50, 10, 90], 2, ServiceOrder::Scan);
        assert_eq!(q.pick(now, 0).unwrap().offset, 10);
    }

    #[test]
    fn idle_device_starts_on_the_first_arrival() {
        let (mut q, _) = queue_of(&[50, 10], 4, ServiceOrder::Scan);
        // The device went idle before either arrived.
        let idle_since = q.pending[0]
            .arrival
            .checked_sub(Duration::from_millis(1))
            .unwrap();
        assert_eq!(q.pick(idle_since, 0).unwrap().offset, 50);
    }

    proptest! {
        #[test]
        fn every_request_is_served_exactly_once(
            offsets in proptest::collection::vec(0u64..1000, 0..40),
            depth in 1usize..8,
            scan: bool,
        ) {
            let order = if scan { ServiceOrder::Scan } else { ServiceOrder::Fifo };
            let (mut q, now) = queue_of(&offsets, depth, order);
            let mut served = drain(&mut q, now, 500);
            let mut expected = offsets.clone();
            served.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(served, expected);
        }

        #[test]
        fn overtaking_is_bounded_so_nothing_starves(
            offsets in proptest::collection::vec(0u64..1000, 1..40),
            depth in 1usize..8,
        ) {
            // Once in the device queue a request has fewer than `depth` older ones ahead of
            // it, and each of them, and then itself, is passed over at most `depth` times
            // before aging serves it: overtaking is bounded, nothing starves.
            let (mut q, now) = queue_of(&offsets, depth, ServiceOrder::Scan);
            let mut head = 0;
            let mut order = Vec::new();
            while let Some(r) = q.pick(now, head) {
                head = r.offset;
                order.push(r.arrival);
            }
            for (served_at, arrival) in order.iter().enumerate() {
                let overtaken_by = order[..served_at].iter().filter(|a| *a > arrival).count();
                prop_assert!(overtaken_by <= depth * depth);
            }
        }
    }
}
