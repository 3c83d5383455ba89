//! The controller: the daemon's main-loop state and the only place that changes it. It owns
//! the streams, the tracer's maps, the prefetch engine, the managed disks and the reader
//! raises; it takes typed events (client requests, kernel accesses, finished loads, time),
//! asks the pure policy what to do, and carries the answers out.

use crate::serve::client_file::check_file;
use crate::serve::closer::ClientFd;
use std::sync::Arc;

use abiss_os::clock::monotonic_now;
use abiss_proto::{
    AdmissionReport, AdmitRequest, AttachRequest, ByteRate, LoopReport, MemoryReport, Refusal,
    StatusReport, StreamId, StreamInfo, StreamTarget,
};
use log::{info, warn};
use scheduler_common::MonotonicNs;

mod access;
mod attach_checks;
pub(crate) mod commands;
mod recorder_ring;
mod sizing;

use crate::disk::latency_tail::LatencyTails;
use crate::disk::managed::Disks;
use crate::kernel::tracer::BlockTracer;
use crate::policy::burst::{BurstAllowance, BurstLimits};
use crate::policy::memory::LockedMemoryBudget;
use crate::policy::playout::WindowAction;
use crate::policy::shared_file::kernel_entry;
use crate::raise::ReaderRaises;
use crate::stream::prefetch::{JobKind, LoadJob, PrefetchEngine};
use crate::stream::table::StreamTable;
use crate::stream::writeback::GiveBack;
use crate::stream::{check_parameters, Stream, StreamKind, StreamOwner, StreamStart};
use access::RaiseBounds;

/// The main loop's state.
#[derive(Debug)]
pub(crate) struct Controller {
    tracer: BlockTracer,
    streams: StreamTable,
    prefetch: PrefetchEngine,
    disks: Disks,
    raises: ReaderRaises,
    memory: LockedMemoryBudget,
    /// Start-up credit of new streams, per user and shared.
    burst: BurstAllowance,
    /// The disks' recent real-time latency, for `--buffer auto`.
    tails: LatencyTails,
    /// Readers of streams that just ended.
    departed: access::DepartedReaders,
    /// Blocks ended recordings allocated ahead, given back off the main loop.
    give_back: GiveBack,
}

impl Controller {
    /// A controller over loaded programs and taken disks.
    #[must_use]
    pub(crate) fn new(
        tracer: BlockTracer,
        prefetch: PrefetchEngine,
        disks: Disks,
        raises: ReaderRaises,
        memory: LockedMemoryBudget,
    ) -> Self {
        Self {
            tracer,
            streams: StreamTable::default(),
            prefetch,
            disks,
            raises,
            memory,
            // Full buckets at any time: time 0 is long enough ago.
            burst: BurstAllowance::new(BurstLimits::DEFAULT, MonotonicNs::ZERO),
            tails: LatencyTails::default(),
            departed: access::DepartedReaders::default(),
            give_back: GiveBack::default(),
        }
    }

    /// The managed disks, for a reload of their admission settings.
    pub(crate) fn disks(&mut self) -> &mut Disks {
        &mut self.disks
    }

    /// The loaded programs and their maps.
    pub(crate) fn tracer(&mut self) -> &mut BlockTracer {
        &mut self.tracer
    }

    /// Carries out a stream's window actions.
    fn execute(prefetch: &mut PrefetchEngine, stream: &Stream, actions: Vec<WindowAction>) {
        let level = stream.level;
        for action in actions {
            match action {
                WindowAction::Load { range, generation } => {
                    log::debug!(
                        "stream {}: load {range:?} (generation {generation})",
                        stream.id
                    );
                    let job = LoadJob {
                        stream: stream.id,
                        generation,
                        range,
                        file: Arc::clone(&stream.file),
                        kind: JobKind::Load,
                    };
                    if let Err(error) = prefetch.load(level, job) {
                        warn!("stream {}: cannot queue a load: {error}", stream.id);
                    }
                }
                WindowAction::Release { range } => {
                    if let Err(error) = stream.file.unlock(&range) {
                        warn!("stream {}: cannot unlock {range:?}: {error}", stream.id);
                    }
                }
                WindowAction::CancelGeneration(generation) => {
                    prefetch.cancel(level, stream.id, Some(generation));
                }
            }
        }
    }

    /// Attaches the file behind `fd` for `peer_uid`.
    pub(crate) fn attach(
        &mut self,
        peer_uid: u32,
        connection: u64,
        fd: ClientFd,
        mut request: AttachRequest,
        now: MonotonicNs,
    ) -> Result<StreamInfo, Refusal> {
        let level = check_parameters(&request)?;
        let mut file = check_file(fd, request.write)?;
        let found = self.disks.serving(&mut file, request.write)?;
        let disks = found.numbers();
        if request.buffer_auto {
            // The tails are kept only while automatic streams run: the first one is sized from
            // what the disk did since they were last looked at.
            self.refresh_tails(now);
        }
        let (auto_buffer, sizing) = self.size_auto(peer_uid, (&mut request, level), &disks);
        let for_capacity = sizing.grown();
        let tag = self.may_share(peer_uid, &file, request.write)?;
        // The disks admit the stream with the owner's other automatic streams grown to its
        // buffer (checked with the memory budgets by `buffer_for_capacity`); they grow once
        // all else has said yes (the kernel's entry last), so a refusal changes nothing.
        self.admit(peer_uid, &request, &disks, &file, for_capacity.is_none())
            .map_err(|refusal| sizing.explain(refusal))?;
        let internal = |error: &dyn std::fmt::Display| Refusal::Internal(error.to_string());
        let mapped = Self::mapping(&file, request.write)?;
        let mapped = match found.largest_request_bytes() {
            Some(bytes) => mapped.with_advice_bytes(bytes),
            None => mapped,
        };
        let id = self.streams.next_id();
        // A file's first stream gives it its tag, its id.
        let tag = tag.unwrap_or(id.0);
        let key = file.key;
        let owner = StreamOwner {
            uid: peer_uid,
            connection,
        };
        let start = StreamStart {
            at: now,
            credit_bytes: self
                .burst
                .grant(peer_uid, Stream::credit_limit_bytes(&request), now),
        };
        let preroll = request.preroll;
        let (mut stream, mut actions) = Stream::new(
            (id, tag, level),
            owner,
            request,
            file,
            disks,
            Arc::new(mapped),
            start,
        );
        if let Some(preroll) = preroll {
            actions.extend(self.preroll(&mut stream, preroll.0, now));
        }
        stream.auto_buffer = auto_buffer;
        stream.warnings = found.warnings;
        // Only the owners' reads steer the file's streams (root's: anyone's), so the kernel
        // reports no others (see `on_access`).
        let mut sharing = self.streams.sharing(tag, 0);
        sharing.push(stream.as_shared(0));
        self.tracer
            .attach_file(key, kernel_entry(tag, &sharing))
            .map_err(|error| internal(&error))?;
        if let Some(bytes) = for_capacity {
            self.grow_for_capacity(peer_uid, &stream.disks, bytes, now);
        }
        Self::execute(&mut self.prefetch, &stream, actions);
        self.record_new(&mut stream, now);
        let info = stream.info();
        for warning in &info.warnings {
            warn!("stream {id}: {warning}");
        }
        info!(
            "stream {id}: {} at {} with a {} buffer, level {level}, for uid {peer_uid}{}",
            info.path,
            info.rate,
            info.buffer,
            if info.recording.is_some() {
                ", recording"
            } else {
                ""
            }
        );
        if stream.kind.is_recording() {
            // Its writes wait for the file system's journal (see `raises::journal`).
            let at = access::raise_for(&stream);
            self.raises
                .raise_journal(at, stream.file_device, stream.level);
        }
        self.streams.insert(stream);
        Ok(info)
    }

    /// Ends stream `id`: cancels its loads, unlocks its window, forgets its file.
    fn end_stream(&mut self, id: StreamId) {
        let Some(stream) = self.streams.remove(id) else {
            return;
        };
        self.departed.note(stream.readers.pids(), monotonic_now());
        self.prefetch.cancel(stream.level, id, None);
        for range in stream.playout.locked_ranges() {
            let _ = stream.file.unlock(&range);
        }
        // The file's other streams keep it in the kernel maps, at their levels and owners.
        let kept = match self.streams.kernel_entry(stream.file_tag) {
            Some(entry) => self.tracer.attach_file(stream.key, entry),
            None => self.tracer.detach_file(stream.key),
        };
        if let Err(error) = kept {
            warn!("stream {id}: cannot update its file in the kernel maps: {error}");
        }
        let allowance = access::own_file_allowance_kib(&stream, monotonic_now());
        self.raises.end_stream(id, allowance, &mut self.tracer);
        self.charge_owed(monotonic_now());
        if let Some(recording) = stream.kind.recording() {
            if recording.window.preallocated_bytes() > 0 {
                let allocated_end = recording.window.allocated_end();
                self.give_back
                    .ended(id, Arc::clone(&stream.file), allocated_end);
            }
            // The journal's raise was this recording's: another on the file system keeps it.
            if let Some(other) = self
                .streams
                .iter()
                .find(|s| s.kind.is_recording() && s.file_device == stream.file_device)
            {
                let at = access::raise_for(other);
                self.raises
                    .raise_journal(at, other.file_device, other.level);
            }
        }
        info!("stream {id}: detached ({})", stream.path);
        // The mapping goes when the last in-flight load lets go of it; unmapping unlocks
        // anything those loads locked.
    }

    /// Detaches a stream on behalf of `peer_uid` (its owner, or root).
    pub(crate) fn detach(
        &mut self,
        peer_uid: u32,
        target: &StreamTarget,
    ) -> Result<StreamId, Refusal> {
        let id = self.owned_stream(peer_uid, target)?;
        self.end_stream(id);
        Ok(id)
    }

    /// Gives a stream of `peer_uid` (or any, for root) rate `rate` from `now`, if its disk
    /// admits the stream at that rate next to the others; refused, nothing changes.
    pub(crate) fn set_rate(
        &mut self,
        peer_uid: u32,
        target: &StreamTarget,
        rate: ByteRate,
        now: MonotonicNs,
    ) -> Result<StreamInfo, Refusal> {
        let id = self.owned_stream(peer_uid, target)?;
        let (disks, request) = match self.streams.get(id) {
            Some(stream) => (
                stream.disks.clone(),
                AttachRequest {
                    rate,
                    ..stream.granted.clone()
                },
            ),
            None => {
                return Err(Refusal::NotAttached {
                    what: format!("stream {id}"),
                })
            }
        };
        check_parameters(&request)?;
        self.disks
            .admit(&disks, &request, &self.streams, Some(id))?;
        let Some(stream) = self.streams.get_mut(id) else {
            return Err(Refusal::NotAttached {
                what: format!("stream {id}"),
            });
        };
        let old = stream.granted.rate;
        let actions = stream.set_rate(rate, now);
        Self::execute(&mut self.prefetch, stream, actions);
        info!("stream {id}: rate {old} → {rate}");
        Ok(stream.info())
    }

    /// The id of the stream `target` names, if `peer_uid` owns it (root owns all). Another
    /// user's stream is answered as one that does not exist, word for word: which streams
    /// other users have, and on which files, is theirs to know.
    fn owned_stream(&self, peer_uid: u32, target: &StreamTarget) -> Result<StreamId, Refusal> {
        let visible = |s: &&Stream| peer_uid == 0 || s.owner_uid == peer_uid;
        let found = match target {
            StreamTarget::Id(id) => self.streams.get(*id).filter(visible).map(|s| s.id),
            StreamTarget::File { device, inode } => {
                let mine: Vec<StreamId> = self
                    .streams
                    .iter()
                    .filter(|s| s.file_device == *device && s.key.ino == *inode)
                    .filter(visible)
                    .map(|s| s.id)
                    .collect();
                if let [_, _, ..] = mine.as_slice() {
                    let ids: Vec<String> = mine.iter().map(StreamId::to_string).collect();
                    return Err(Refusal::BadRequest(format!(
                        "that file has several streams ({}); name one by its id",
                        ids.join(", ")
                    )));
                }
                mine.first().copied()
            }
        };
        found.ok_or_else(|| {
            let what = match target {
                StreamTarget::Id(id) => format!("stream {id}"),
                StreamTarget::File { .. } => "that file".to_owned(),
            };
            Refusal::NotAttached { what }
        })
    }

    /// The streams `peer_uid` may see.
    #[must_use]
    pub(crate) fn list(&self, peer_uid: u32) -> Vec<StreamInfo> {
        self.streams
            .iter()
            .filter(|s| peer_uid == 0 || s.owner_uid == peer_uid)
            .map(|s| {
                let mut info = s.info();
                info.raises = self.raises.count_for(s.id);
                info.policed = self.raises.policed_for(s.id);
                for reader in &mut info.readers {
                    reader.raised = self.raises.raises(reader.pid, s.id);
                }
                info
            })
            .collect()
    }

    /// The managed devices, the daemon's reader raises, what it can do on this kernel,
    /// and locked memory (with `peer_uid`'s own).
    #[must_use]
    pub(crate) fn status(&self, peer_uid: u32) -> StatusReport {
        StatusReport {
            devices: self.disks.status(&self.streams),
            raises: self.raises.report(),
            capabilities: self.tracer.capabilities().to_vec(),
            memory: MemoryReport {
                budget_bytes: self.memory.total_bytes,
                per_user_budget_bytes: self.memory.per_user_bytes,
                reserved_bytes: self.streams.locked_at_most(None),
                locked_bytes: self.streams.locked_now(None),
                yours_reserved_bytes: self.streams.locked_at_most(Some(peer_uid)),
                yours_locked_bytes: self.streams.locked_now(Some(peer_uid)),
            },
            // The loop's own figures are the loop's to add.
            main_loop: LoopReport::default(),
        }
    }

    /// Capacity planning: how many streams like the request's fit on its device.
    pub(crate) fn plan(&mut self, request: &AdmitRequest) -> Result<AdmissionReport, Refusal> {
        self.disks.plan(request, &self.streams)
    }

    /// A connection closed: its non-persistent streams end with it.
    pub(crate) fn connection_closed(&mut self, connection: u64) {
        let ending: Vec<StreamId> = self
            .streams
            .iter()
            .filter(|s| s.connection == connection && !s.granted.persistent)
            .map(|s| s.id)
            .collect();
        for id in ending {
            self.end_stream(id);
        }
    }

    /// How long until some stream's credit allows a load its window lacks, or a raised reader
    /// is due to be put back; `None` while neither can happen (then only a reader moving on
    /// can change anything).
    #[must_use]
    pub(crate) fn next_wakeup_ns(&self, now: MonotonicNs) -> Option<u64> {
        let loads = self
            .streams
            .iter()
            .filter_map(|s| {
                let due = match &s.kind {
                    StreamKind::Recording(recording) => Some(recording.ns_until_due(now)),
                    StreamKind::Playback => s.playout.ns_until_next_load(now),
                };
                match (due, s.ns_until_growth_check(now)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            })
            .min();
        let expiry = self.raises.ns_until_next_expiry(now);
        // Automatic buffers are sized from the tail measured once a second, which the tick
        // takes: it used to come with the timer that woke every millisecond for credit a
        // window would not spend, and without it no tail was ever measured.
        let tails = self
            .streams
            .iter()
            .any(|s| s.auto_buffer.is_some())
            .then(|| self.tails.ns_until_due(now));
        [loads, expiry, tails].into_iter().flatten().min()
    }

    /// Time passed: credit accrued for every stream, idle raises put back, automatic
    /// buffers sized again (once a second).
    pub(crate) fn tick(&mut self, now: MonotonicNs) {
        if self.refresh_tails(now) {
            self.grow_auto_buffers(now);
        }
        let mut bounds = RaiseBounds {
            streams: &self.streams,
            burst: &mut self.burst,
            now,
        };
        self.raises.expire(now, &mut self.tracer, &mut bounds);
        self.charge_owed(now);
        let mut ahead = self.streams.allocated_ahead();
        for stream in self.streams.iter_mut() {
            let mut actions = stream.follow_growth(now);
            actions.extend(stream.playout.on_tick(now));
            Self::execute(&mut self.prefetch, stream, actions);
            stream.record(&mut self.prefetch, now, &mut ahead);
        }
    }

    /// A new write stream (not in the table yet) looks at its writer, within its user's room.
    fn record_new(&mut self, stream: &mut Stream, now: MonotonicNs) {
        let mut ahead = self.streams.allocated_ahead();
        stream.record(&mut self.prefetch, now, &mut ahead);
    }

    /// Ends every stream and gives the devices back.
    pub(crate) fn shutdown(mut self) {
        let ids: Vec<StreamId> = self.streams.iter().map(|s| s.id).collect();
        for id in ids {
            self.end_stream(id);
        }
        self.raises.shutdown(&mut self.tracer);
        // Workers finish their in-flight loads; then the mappings go and the devices are
        // restored (ManagedDevice restores on drop).
        drop(self.prefetch);
        self.disks.restore();
    }
}
