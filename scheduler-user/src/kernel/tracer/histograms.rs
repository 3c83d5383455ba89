//! Reading what the block programs measured: the latency histograms (with those of ended
//! streams folded into per-disk totals), and the request records (counted, and swept of
//! stale ones).

use abiss_proto::{
    DeviceNumber, IoClass, IoPriority, LatencyGroup, Log2Histogram, Operation, StreamId,
};
use aya::maps::{HashMap, MapData, PerCpuHashMap};
use scheduler_common::{
    request_state, AttachedFile, FileKey, HistogramKey, InflightRequest, LatencyCounters,
    MonotonicNs, STALE_REQUEST_NS,
};

use super::{BlockTracer, TracerError};
use scheduler_common::names::map;

impl BlockTracer {
    /// The cumulative latency histograms, summed over CPUs.
    pub(crate) fn latency(&self) -> Result<Vec<LatencyGroup>, TracerError> {
        let name = map::LATENCY;
        let histograms: PerCpuHashMap<&MapData, HistogramKey, LatencyCounters> =
            self.typed_map(name)?;
        let mut totals = self.retired.clone();
        for entry in &histograms {
            let (key, per_cpu) = entry.map_err(|source| TracerError::Map { name, source })?;
            let total = totals.entry(key).or_default();
            for counters in per_cpu.iter() {
                total.add(counters);
            }
        }
        let mut groups = Vec::new();
        for (key, total) in totals {
            groups.push(LatencyGroup {
                device: DeviceNumber::from_kernel(key.dev),
                operation: Operation::from_kernel(key.op),
                priority: IoPriority {
                    class: IoClass::from_kernel(key.class),
                    level: key.level,
                },
                stream: (key.stream != 0).then_some(StreamId(key.stream)),
                requests: total.requests,
                bytes: total.bytes,
                inversions: total.inversions,
                queue: Log2Histogram::from_slots(&total.queue_slots, total.queue_max_ns),
                service: Log2Histogram::from_slots(&total.service_slots, total.service_max_ns),
            });
        }
        groups.sort_by_key(LatencyGroup::key);
        Ok(groups)
    }

    /// Takes the histograms of streams no longer attached out of `LATENCY`, folded into
    /// `retired` under their stream-less keys (so per-disk figures keep counting them); how
    /// many keys went. Run at each detach, and at each sweep for the requests of an ended
    /// stream that completed after its detach.
    pub(super) fn retire_ended_streams(&mut self) -> Result<usize, TracerError> {
        let attached: HashMap<&MapData, FileKey, AttachedFile> = self.typed_map(map::ATTACHED)?;
        let live: Vec<u64> = attached
            .iter()
            .filter_map(Result::ok)
            .map(|(_, file)| file.stream)
            .collect();
        let name = map::LATENCY;
        let mut histograms: PerCpuHashMap<&mut MapData, HistogramKey, LatencyCounters> =
            self.typed_map_mut(name)?;
        let ended: Vec<HistogramKey> = histograms
            .keys()
            .filter_map(Result::ok)
            .filter(|key| key.stream != 0 && !live.contains(&key.stream))
            .collect();
        let mut folded = Vec::new();
        for key in &ended {
            // A request of the stream completing between the read and the removal is lost:
            // at most the last ones of a stream that has ended.
            if let Ok(per_cpu) = histograms.get(key, 0) {
                let mut total = LatencyCounters::ZERO;
                per_cpu.iter().for_each(|counters| total.add(counters));
                folded.push((HistogramKey { stream: 0, ..*key }, total));
            }
            let _ = histograms.remove(key);
        }
        for (key, total) in folded {
            self.retired.entry(key).or_default().add(&total);
        }
        Ok(ended.len())
    }

    /// Request records: (in flight now, records kept in all).
    pub(crate) fn request_records(&self) -> Result<(u64, u64), TracerError> {
        let name = map::INFLIGHT;
        let records: HashMap<&MapData, u64, InflightRequest> = self.typed_map(name)?;
        let (mut in_flight, mut kept) = (0, 0);
        for (_, record) in records.iter().flatten() {
            kept += 1;
            // A queue's own flush request completes without a `block_rq_complete` event, so
            // its record stays open until the next flush reuses it: not a request in flight.
            if record.state != request_state::DONE && record.op != scheduler_common::op::FLUSH {
                in_flight += 1;
            }
        }
        Ok((in_flight, kept))
    }

    /// Drops request records last used before `now - STALE_REQUEST_NS` (slots of devices
    /// that went idle or away, and requests that vanished without completing or merging), and
    /// those of disks no longer traced, followed `io_uring` requests older than
    /// `STALE_URING_NS` (followed readers that are gone have a thread of their own,
    /// `reader_sweep`). Returns how many were dropped.
    pub(crate) fn sweep_stale(&mut self, now: MonotonicNs) -> Result<usize, TracerError> {
        // The records keep the kernel's plain nanoseconds: so does the cutoff.
        let cutoff = now.0.saturating_sub(STALE_REQUEST_NS);
        let old = self.forget_records(|record| record.queued_ns < cutoff)?
            + self.sweep_stale_uring(now)?;
        self.retire_ended_streams()?;
        // A program that passed its check just before tracing stopped may have written a
        // record after `set_trace_all` dropped them.
        Ok(old + self.forget_untraced()?)
    }
}
