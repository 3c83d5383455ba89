//! The service side: the thread that orders requests, keeps the virtual clock and replies at
//! the modelled instant, and the thread that writes the statistics.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand_chacha::ChaCha8Rng;

use super::{EmulatorConfig, SERVICE_PRIORITY};
use crate::error::LabError;
use crate::model::{DeviceModel, ServicePlan};
use crate::queue::DeviceQueue;
use crate::stats::{quantile, RequestRecord, StatsSummary};
use crate::timing::{self, nanos, SPIN_MARGIN};

use super::fuse::{Completion, ReadyIo};

/// A request in service, waiting for its completion instant.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) deadline: Instant,
    pub(super) seq: u64,
    pub(super) record: RequestRecord,
    pub(super) completion: Completion,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.deadline, self.seq) == (other.deadline, other.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.deadline, self.seq).cmp(&(other.deadline, other.seq))
    }
}

/// The one thread that serves the device: order, virtual clock, data and replies.
pub(super) struct ServiceThread {
    pub(super) model: DeviceModel,
    pub(super) queue: DeviceQueue<ReadyIo>,
    pub(super) rng: ChaCha8Rng,
    pub(super) epoch: Instant,
    pub(super) outstanding: Arc<AtomicU32>,
    pub(super) transport_ns: Arc<AtomicU64>,
    pub(super) records: Sender<RequestRecord>,
}

impl ServiceThread {
    pub(super) fn run(mut self, requests: &Receiver<ReadyIo>) {
        if !timing::make_current_thread_realtime(SERVICE_PRIORITY) {
            eprintln!("abiss-lab: warning: service thread has no real-time priority");
        }
        let mut in_flight: BinaryHeap<Reverse<InFlight>> = BinaryHeap::new();
        // The device's virtual clock: when the actuator is free for the next request. Starts
        // are computed from it, not from when this thread woke, so wake-up errors never add up.
        let mut free_at = self.epoch;
        let mut open = true;
        loop {
            while open {
                match requests.try_recv() {
                    Ok(io) => self.queue.push(io),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            let now = Instant::now();
            while in_flight.peek().is_some_and(|Reverse(f)| f.deadline <= now) {
                if let Some(Reverse(done)) = in_flight.pop() {
                    self.complete(done);
                }
            }
            if free_at <= now {
                if let Some(io) = self.queue.pick(free_at, self.model.head()) {
                    let started = self.start(io, free_at);
                    free_at = started.record_start + started.occupancy;
                    in_flight.push(Reverse(started.in_flight));
                    continue;
                }
            }
            let next_completion = in_flight.peek().map(|Reverse(f)| f.deadline);
            let next_start = (!self.queue.is_empty()).then_some(free_at);
            let wake = match (next_completion, next_start) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake {
                None if !open => break,
                None => match requests.recv() {
                    Ok(io) => self.queue.push(io),
                    Err(_) => open = false,
                },
                Some(wake) if self.queue.is_empty() && open => {
                    // Nothing queued: a new arrival may be able to start at once, so listen
                    // for one while waiting for the next completion.
                    let timeout = wake.saturating_duration_since(Instant::now() + SPIN_MARGIN);
                    if !timeout.is_zero() {
                        match requests.recv_timeout(timeout) {
                            Ok(io) => {
                                self.queue.push(io);
                                continue;
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => open = false,
                        }
                    }
                    timing::spin_until(wake);
                }
                Some(wake) => {
                    timing::wait_until(wake);
                }
            }
        }
    }

    pub(super) fn since_epoch(&self, t: Instant) -> u64 {
        nanos(t.saturating_duration_since(self.epoch))
    }

    /// Starts `io` on the actuator that became free at `free_at`: plans it and schedules its
    /// completion.
    pub(super) fn start(&mut self, io: ReadyIo, free_at: Instant) -> Started {
        let start = free_at.max(io.arrival);
        let plan: ServicePlan = self.model.plan(io.op, io.offset, io.len, &mut self.rng);
        let transport =
            Duration::from_nanos(self.transport_ns.load(Ordering::Relaxed)).min(plan.completion);
        let deadline = start + plan.completion.saturating_sub(transport);
        let record = RequestRecord {
            seq: io.seq,
            op: io.op,
            offset: io.offset,
            len: io.len,
            arrival_ns: self.since_epoch(io.arrival),
            start_ns: self.since_epoch(start),
            end_ns: self.since_epoch(start + plan.completion),
            transport_ns: nanos(transport),
            replied_ns: 0,
            seek_ns: nanos(plan.seek),
            rotation_ns: nanos(plan.rotation),
            transfer_ns: nanos(plan.transfer),
            latency_ns: nanos(plan.latency),
            occupancy_ns: nanos(plan.occupancy),
            outstanding: io.outstanding,
            backing_ns: io.backing_ns,
            failed: false,
        };
        Started {
            record_start: start,
            occupancy: plan.occupancy,
            in_flight: InFlight {
                deadline,
                seq: io.seq,
                record,
                completion: io.completion,
            },
        }
    }

    pub(super) fn complete(&self, done: InFlight) {
        let mut record = done.record;
        // No longer outstanding before the reply: once replied, the kernel may free the
        // request's tag and send the next one, which a FUSE thread counts on arrival; counted
        // after the reply, a busy CPU let the emulator see one more than the queue's depth
        // (7 of 6 in a suite run beside two other test binaries).
        self.outstanding.fetch_sub(1, Ordering::Relaxed);
        record.replied_ns = self.since_epoch(Instant::now());
        record.failed = !done.completion.reply();
        // The stats thread ends only after this thread; a failed send cannot happen.
        let _ = self.records.send(record);
    }
}

pub(super) struct Started {
    pub(super) record_start: Instant,
    pub(super) occupancy: Duration,
    pub(super) in_flight: InFlight,
}

/// Writes request records as JSON lines and keeps the summary file up to date.
pub(super) struct StatsWriter {
    pub(super) lines: BufWriter<File>,
    pub(super) summary_path: PathBuf,
    pub(super) epoch: Instant,
    pub(super) summary: StatsSummary,
    pub(super) late_sum_ns: f64,
    pub(super) recent_late_ns: Vec<i64>,
    pub(super) next_recent: usize,
}

pub(super) const RECENT_LATE_SAMPLES: usize = 10_000;

impl StatsWriter {
    pub(super) fn create(config: &EmulatorConfig, epoch: Instant) -> Result<Self, LabError> {
        let file = File::create(&config.stats_path).map_err(LabError::io(&config.stats_path))?;
        Ok(Self {
            lines: BufWriter::new(file),
            summary_path: config.summary_path.clone(),
            epoch,
            summary: StatsSummary::default(),
            late_sum_ns: 0.0,
            recent_late_ns: Vec::with_capacity(RECENT_LATE_SAMPLES),
            next_recent: 0,
        })
    }

    pub(super) fn run(mut self, records: &Receiver<RequestRecord>) {
        // The summary exists from the start: a lab that is up has one to read, also before
        // its first second (a lab whose file system was made unmodelled is up in less).
        self.write_summary();
        let mut last_summary = Instant::now();
        loop {
            match records.recv_timeout(Duration::from_millis(100)) {
                Ok(record) => self.add(&record),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.lines.flush();
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if last_summary.elapsed() >= Duration::from_secs(1) {
                let _ = self.lines.flush();
                self.write_summary();
                last_summary = Instant::now();
            }
        }
        let _ = self.lines.flush();
        self.write_summary();
    }

    pub(super) fn add(&mut self, record: &RequestRecord) {
        if let Ok(line) = serde_json::to_string(record) {
            let _ = writeln!(self.lines, "{line}");
        }
        let late = record.late_ns();
        let s = &mut self.summary;
        s.requests += 1;
        s.bytes += record.len;
        s.busy_ns += record.occupancy_ns;
        s.max_outstanding = s.max_outstanding.max(record.outstanding);
        s.late_max_ns = s.late_max_ns.max(late);
        #[expect(
            clippy::cast_precision_loss,
            reason = "nanoseconds of lateness are small"
        )]
        let late_f = late as f64;
        self.late_sum_ns += late_f;
        if self.recent_late_ns.len() < RECENT_LATE_SAMPLES {
            self.recent_late_ns.push(late);
        } else {
            self.recent_late_ns[self.next_recent] = late;
            self.next_recent = (self.next_recent + 1) % RECENT_LATE_SAMPLES;
        }
    }

    pub(super) fn write_summary(&mut self) {
        let s = &mut self.summary;
        s.elapsed_ns = nanos(self.epoch.elapsed());
        #[expect(clippy::cast_precision_loss, reason = "ratios of nanosecond counts")]
        {
            s.busy_fraction = s.busy_ns as f64 / s.elapsed_ns.max(1) as f64;
            s.late_mean_ns = self.late_sum_ns / s.requests.max(1) as f64;
        }
        let mut sorted = self.recent_late_ns.clone();
        sorted.sort_unstable();
        s.late_p99_ns = quantile(&sorted, 0.99).unwrap_or(0);
        // Readers (`abiss-lab status`, the benchmarks) must never see half a summary; it is
        // rewritten every second and need not survive a crash, so it is not synced (a sync
        // would add a journal commit on the emulator's machine every second, for nothing).
        if let Ok(text) = serde_json::to_string_pretty(&s) {
            let _ = abiss_os::fs::replace(&self.summary_path, text.as_bytes());
        }
    }
}
