//! The controller: the daemon's main-loop state. It owns the tracer's maps, the streams, the
//! prefetch engine and the managed devices, and is the only place that changes them.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use abiss_proto::device_model::{DeviceIdentity, DeviceModel};
use abiss_proto::{
    AdmissionMode, AdmissionReport, AdmitRequest, AttachRequest, ByteRate, DeviceNumber,
    DeviceStatus, ErrorKind, StreamInfo, StreamTarget, UpgradeReport, PAGE_BYTES,
};
use log::{info, warn};
use scheduler_common::{playout_kind, AttachedFile, PlayoutEvent};

use crate::device::{resolve_disk, ManagedDevice};
use crate::policy::admission::{AdmissionControl, ShareAdmission, StreamDemand, SERVICE_WINDOW_MS};
use crate::policy::playout::WindowAction;
use crate::prefetch::{LoadDone, LoadJob, LoadOutcome, MappedFile, PrefetchEngine};
use crate::streams::{
    check_file, check_parameters, AttachError, Stream, StreamOwner, StreamTable, MAX_STREAMS,
    MAX_STREAMS_PER_USER,
};
use crate::tracer::BlockTracer;
use crate::upgrades::ReaderUpgrades;

/// A refusal for the client: its kind (for the exit code) and one sentence.
pub type Refusal = (ErrorKind, String);

/// How the daemon admits streams, for every managed disk.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionSettings {
    /// The mode with a device model.
    pub mode: AdmissionMode,
    /// Allowed miss probability per window (statistical mode), in (0, 1).
    pub p_req: f64,
    /// Share of the device real-time streams may use, percent (1 to 95).
    pub share_percent: u32,
    /// Capacity assumed without a model, B/s.
    pub capacity_bps: u64,
    /// Where models are found (`<state dir>/models`).
    pub state_dir: std::path::PathBuf,
}

/// The playout buffer and batch `status` and `admit` assume for "one more stream" (the CLI's
/// defaults: the ABISS measurement's 564 KiB buffer and 20-page batches).
const DEFAULT_BUFFER_BYTES: u64 = 564 * 1024;
const DEFAULT_BATCH_BYTES: u64 = 20 * PAGE_BYTES;

/// A managed disk with its admission control.
#[derive(Debug)]
pub struct ManagedDisk {
    /// The device settings abissd holds (restored on drop).
    pub device: ManagedDevice,
    /// Its identity, under which its model is saved.
    pub identity: DeviceIdentity,
    /// Admission by the configured capacity, until the disk has a model.
    pub share: ShareAdmission,
    /// Admission by the disk's model, once it has one.
    pub model: Option<AdmissionControl>,
}

impl ManagedDisk {
    /// A disk with its model loaded from the state directory, if it has one. A model file
    /// that is corrupt or describes another device is an error, never ignored.
    pub fn new(
        device: ManagedDevice,
        settings: &AdmissionSettings,
    ) -> Result<Self, abiss_proto::device_model::ModelError> {
        let identity = DeviceIdentity::of(device.disk().number)?;
        let share = ShareAdmission {
            device: device.disk().name.clone(),
            capacity_bps: settings.capacity_bps,
            share_percent: settings.share_percent,
        };
        let mut disk = Self {
            device,
            identity,
            share,
            model: None,
        };
        disk.load_model(settings)?;
        Ok(disk)
    }

    /// Loads the disk's model if it has none yet and one was saved since.
    fn load_model(
        &mut self,
        settings: &AdmissionSettings,
    ) -> Result<(), abiss_proto::device_model::ModelError> {
        if self.model.is_some() {
            return Ok(());
        }
        if let Some(model) = DeviceModel::find(&settings.state_dir, &self.identity)? {
            info!(
                "{}: admission by its model {} ({} admission)",
                self.device.disk(),
                self.identity.model_path(&settings.state_dir).display(),
                settings.mode
            );
            self.model = Some(AdmissionControl {
                device: self.device.disk().name.clone(),
                source: format!(
                    "model {} measured at {} s since the epoch{}",
                    self.identity.key,
                    model.measured_at_unix_s,
                    if model.quick { " (quick profile)" } else { "" }
                ),
                model,
                mode: settings.mode,
                p_req: settings.p_req,
                share_percent: settings.share_percent,
            });
        }
        Ok(())
    }
}

/// The main loop's state.
#[derive(Debug)]
pub struct Controller {
    settings: AdmissionSettings,
    tracer: BlockTracer,
    streams: StreamTable,
    prefetch: PrefetchEngine,
    disks: BTreeMap<DeviceNumber, ManagedDisk>,
    upgrades: ReaderUpgrades,
}

impl Controller {
    /// A controller over loaded programs and taken devices.
    #[must_use]
    pub fn new(
        settings: AdmissionSettings,
        tracer: BlockTracer,
        prefetch: PrefetchEngine,
        disks: Vec<ManagedDisk>,
        upgrades: ReaderUpgrades,
    ) -> Self {
        Self {
            settings,
            upgrades,
            tracer,
            streams: StreamTable::default(),
            prefetch,
            disks: disks
                .into_iter()
                .map(|d| (d.device.disk().number, d))
                .collect(),
        }
    }

    /// The tracer, for the latency and stats requests.
    pub fn tracer(&mut self) -> &mut BlockTracer {
        &mut self.tracer
    }

    /// Carries out a stream's window actions.
    fn execute(prefetch: &mut PrefetchEngine, stream: &Stream, actions: Vec<WindowAction>) {
        let level = stream.granted.priority;
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
    pub fn attach(
        &mut self,
        peer_uid: u32,
        connection: u64,
        fd: OwnedFd,
        request: AttachRequest,
        now_ns: u64,
    ) -> Result<StreamInfo, Refusal> {
        let bad = |error: AttachError| (ErrorKind::BadRequest, error.to_string());
        check_parameters(&request).map_err(bad)?;
        let file = check_file(fd).map_err(bad)?;
        let disk = resolve_disk(&file.file_device.to_string()).map_err(|_| {
            bad(AttachError::Unmanaged {
                path: file.path.clone(),
                disk: format!("device {}", file.file_device),
            })
        })?;
        let Some(managed) = self.disks.get_mut(&disk.number) else {
            return Err(bad(AttachError::Unmanaged {
                path: file.path.clone(),
                disk: disk.to_string(),
            }));
        };
        // A model saved since the daemon started is taken up now; a broken one refuses.
        managed
            .load_model(&self.settings)
            .map_err(|error| (ErrorKind::ModelUnusable, error.to_string()))?;
        if let Some(existing) = self.streams.by_file(&file.key) {
            return Err((
                ErrorKind::Refused,
                format!(
                    "{} is already attached as stream {}; detach it first",
                    file.path, existing.id
                ),
            ));
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err((
                ErrorKind::Refused,
                format!("abissd already serves {MAX_STREAMS} streams, its most"),
            ));
        }
        if peer_uid != 0 && self.streams.count_of(peer_uid) >= MAX_STREAMS_PER_USER {
            return Err((
                ErrorKind::Refused,
                format!("this user already holds {MAX_STREAMS_PER_USER} streams, the most one user may; detach one first"),
            ));
        }
        self.admit_on(&disk, &request)?;
        let mapped = MappedFile::new(
            file.fd
                .try_clone()
                .map_err(|e| (ErrorKind::Internal, e.to_string()))?,
            file.bytes,
        )
        .map_err(|error| {
            (
                ErrorKind::Internal,
                format!("cannot map {}: {error}", file.path),
            )
        })?;
        let id = self.streams.next_id();
        let key = file.key;
        let level = request.priority;
        let owner = StreamOwner {
            uid: peer_uid,
            connection,
        };
        let (stream, actions) = Stream::new(
            id,
            owner,
            request,
            file,
            disk.number,
            Arc::new(mapped),
            now_ns,
        );
        self.tracer
            .attach_file(
                key,
                AttachedFile {
                    stream: id,
                    level,
                    pad: [0; 7],
                },
            )
            .map_err(|error| (ErrorKind::Internal, error.to_string()))?;
        Self::execute(&mut self.prefetch, &stream, actions);
        let info = stream.info();
        info!(
            "stream {id}: {} at {} with a {} buffer, level {level}, for uid {peer_uid}",
            info.path, info.rate, info.buffer
        );
        self.streams.insert(stream);
        Ok(info)
    }

    /// Admission of a stream of `request` on managed `disk`: by its model, or by the configured
    /// capacity until it has one.
    fn admit_on(&self, disk: &crate::device::Disk, request: &AttachRequest) -> Result<(), Refusal> {
        let managed = &self.disks[&disk.number];
        let demand = StreamDemand::playback(
            request.rate.0,
            request.buffer.0,
            u64::from(request.batch_pages) * PAGE_BYTES,
        );
        match (&managed.model, self.settings.mode) {
            (_, AdmissionMode::Off) => {}
            (Some(control), _) => {
                let prediction = control
                    .admit(&self.demands_on(disk.number), &demand)
                    .map_err(|refusal| (ErrorKind::Refused, refusal.to_string()))?;
                info!(
                    "{}: admitted {} B/s; predicted miss probability {:.4}%",
                    disk,
                    request.rate.0,
                    prediction.miss_probability * 100.0
                );
            }
            (None, _) => managed
                .share
                .admit(self.streams.reserved_on(disk.number), request.rate.0)
                .map_err(|refusal| (ErrorKind::Refused, refusal.to_string()))?,
        }
        Ok(())
    }

    /// What the streams on `disk` ask of it.
    fn demands_on(&self, disk: DeviceNumber) -> Vec<StreamDemand> {
        self.streams
            .iter()
            .filter(|s| s.disk == disk)
            .map(|s| {
                StreamDemand::playback(
                    s.granted.rate.0,
                    s.granted.buffer.0,
                    u64::from(s.granted.batch_pages) * PAGE_BYTES,
                )
            })
            .collect()
    }

    /// Capacity planning without a model: the configured capacity times the share.
    fn share_plan(
        &self,
        disk: &crate::device::Disk,
        request: &AdmitRequest,
        mode: AdmissionMode,
        admitted_streams: u32,
    ) -> AdmissionReport {
        let managed = &self.disks[&disk.number];
        let window_ms = SERVICE_WINDOW_MS;
        let free = managed
            .share
            .budget_bps()
            .saturating_sub(self.streams.reserved_on(disk.number));
        let n_max = (mode != AdmissionMode::Off)
            .then(|| u32::try_from(free / request.rate.0).unwrap_or(u32::MAX));
        AdmissionReport {
            device: disk.name.clone(),
            mode,
            p_req: self.settings.p_req,
            window_ms,
            realtime_share_percent: managed.share.share_percent,
            model_source: format!(
                "no device model: {} B/s configured (--capacity) times the share; profile the device with `abissctl profile {} --save`",
                managed.share.capacity_bps, disk.name
            ),
            admitted_streams,
            current_miss_probability: None,
            n_max,
            count: request.count,
            miss_probability: None,
            fits: request
                .count
                .map(|count| n_max.is_none_or(|n| count <= n)),
            window_overrun_probability: None,
        }
    }

    /// Capacity planning: how many streams like the request's fit on its device.
    pub fn plan(&mut self, request: &AdmitRequest) -> Result<AdmissionReport, Refusal> {
        let unknown = |message: String| (ErrorKind::UnknownDevice, message);
        let disk = resolve_disk(&request.device).map_err(|error| unknown(error.to_string()))?;
        let Some(managed) = self.disks.get_mut(&disk.number) else {
            return Err(unknown(format!(
                "abissd does not manage {disk}; start it with --device for it"
            )));
        };
        managed
            .load_model(&self.settings)
            .map_err(|error| (ErrorKind::ModelUnusable, error.to_string()))?;
        if request.rate.0 == 0 || request.rate.0 > crate::streams::MAX_RATE_BPS {
            return Err((
                ErrorKind::BadRequest,
                format!(
                    "a rate of {} B/s is outside 1 B/s to 1 TB/s",
                    request.rate.0
                ),
            ));
        }
        if request.rate_stdev.0 > crate::streams::MAX_RATE_BPS || request.buffer.0 == 0 {
            return Err((
                ErrorKind::BadRequest,
                "the rate's standard deviation must be below 1 TB/s and the buffer above 0"
                    .to_owned(),
            ));
        }
        let managed = &self.disks[&disk.number];
        let mode = request.mode.unwrap_or(self.settings.mode);
        let existing = self.demands_on(disk.number);
        let demand = StreamDemand {
            rate_stdev_bps: request.rate_stdev.0,
            write: request.write,
            ..StreamDemand::playback(request.rate.0, request.buffer.0, DEFAULT_BATCH_BYTES)
        };
        let window_ms = SERVICE_WINDOW_MS;
        let admitted_streams = u32::try_from(existing.len()).unwrap_or(u32::MAX);
        let Some(control) = &managed.model else {
            return Ok(self.share_plan(&disk, request, mode, admitted_streams));
        };
        let control = AdmissionControl {
            mode,
            ..control.clone()
        };
        let with_count = request.count.map(|count| {
            let mut all = existing.clone();
            all.extend(std::iter::repeat_n(demand, count as usize));
            let prediction = control.predict(&all);
            // The deterministic mode bounds rather than estimates: no miss is possible while
            // the worst case fits (0), and one cannot be ruled out once it does not (1).
            let p = match mode {
                AdmissionMode::Deterministic => {
                    if prediction.worst_work_s <= control.budget_s() {
                        0.0
                    } else {
                        1.0
                    }
                }
                _ => prediction.miss_probability,
            };
            (
                p,
                control.fits(mode, &all),
                prediction.window_overrun_probability,
            )
        });
        Ok(AdmissionReport {
            device: disk.name.clone(),
            mode,
            p_req: control.p_req,
            window_ms,
            realtime_share_percent: control.share_percent,
            model_source: control.source.clone(),
            admitted_streams,
            current_miss_probability: Some(control.predict(&existing).miss_probability),
            n_max: control.n_max(mode, &existing, &demand),
            count: request.count,
            miss_probability: with_count.map(|(p, _, _)| p),
            fits: with_count.map(|(_, fits, _)| fits),
            window_overrun_probability: with_count.map(|(_, _, overrun)| overrun),
        })
    }

    /// Ends stream `id`: cancels its loads, unlocks its window, forgets its file.
    fn end_stream(&mut self, id: u64) {
        let Some(stream) = self.streams.remove(id) else {
            return;
        };
        self.prefetch.cancel(stream.granted.priority, id, None);
        for range in stream.playout.locked_ranges() {
            let _ = stream.file.unlock(range);
        }
        if let Err(error) = self.tracer.detach_file(stream.key) {
            warn!("stream {id}: cannot forget its file in the kernel maps: {error}");
        }
        self.upgrades.end_stream(id);
        info!("stream {id}: detached ({})", stream.path);
        // The mapping goes when the last in-flight load lets go of it; unmapping unlocks
        // anything those loads locked.
    }

    /// Detaches a stream on behalf of `peer_uid` (its owner, or root).
    pub fn detach(&mut self, peer_uid: u32, target: &StreamTarget) -> Result<u64, Refusal> {
        let found = match target {
            StreamTarget::Id(id) => self.streams.get(*id),
            StreamTarget::File { device, inode } => self
                .streams
                .iter()
                .find(|s| s.file_device == *device && s.key.ino == *inode),
        };
        let Some(stream) = found else {
            let what = match target {
                StreamTarget::Id(id) => format!("stream {id}"),
                StreamTarget::File { .. } => "that file".to_owned(),
            };
            return Err((
                ErrorKind::NotFound,
                format!("{what} is not attached; `abissctl list` shows the streams"),
            ));
        };
        if peer_uid != 0 && stream.owner_uid != peer_uid {
            return Err((
                ErrorKind::PermissionDenied,
                format!(
                    "stream {} belongs to another user; only its owner or root may detach it",
                    stream.id
                ),
            ));
        }
        let id = stream.id;
        self.end_stream(id);
        Ok(id)
    }

    /// The application's explicit playout point.
    /// `at_ns` is when the application was there.
    pub fn position(&mut self, peer_uid: u32, id: u64, offset: u64, at_ns: u64, now_ns: u64) {
        let Some(stream) = self.streams.get_mut(id) else {
            return;
        };
        if peer_uid != 0 && stream.owner_uid != peer_uid {
            return;
        }
        if !stream.newer_evidence(at_ns) {
            log::debug!("stream {id}: position {offset} is older than a read seen since");
            return;
        }
        log::debug!("stream {id}: position {offset}");
        let actions = stream.playout.on_position(offset, now_ns);
        Self::execute(&mut self.prefetch, stream, actions);
    }

    /// The streams `peer_uid` may see.
    #[must_use]
    pub fn list(&self, peer_uid: u32) -> Vec<StreamInfo> {
        self.streams
            .iter()
            .filter(|s| peer_uid == 0 || s.owner_uid == peer_uid)
            .map(|s| {
                let mut info = s.info();
                info.upgrades = self.upgrades.count_for(s.id);
                for reader in &mut info.readers {
                    reader.upgraded = self.upgrades.raises(reader.pid, s.id);
                }
                info
            })
            .collect()
    }

    /// The daemon's reader upgrades.
    #[must_use]
    pub fn upgrade_report(&self) -> UpgradeReport {
        self.upgrades.report()
    }

    /// The managed devices.
    #[must_use]
    pub fn status(&self) -> Vec<DeviceStatus> {
        self.disks
            .values()
            .map(|managed| {
                let disk = managed.device.disk();
                let now = managed.device.status().ok();
                let reserved = self.streams.reserved_on(disk.number);
                let existing = self.demands_on(disk.number);
                let one_more =
                    StreamDemand::playback(1, DEFAULT_BUFFER_BYTES, DEFAULT_BATCH_BYTES);
                let (capacity, capacity_source, free, admission, miss) = match &managed.model {
                    Some(control) => {
                        #[expect(
                            clippy::cast_possible_truncation,
                            clippy::cast_sign_loss,
                            reason = "a rate in B/s"
                        )]
                        let capacity = control.model.max_read_bps() as u64;
                        let miss = control.predict(&existing).miss_probability;
                        (
                            capacity,
                            control.source.clone(),
                            if self.settings.mode == AdmissionMode::Off {
                                capacity.saturating_sub(reserved)
                            } else {
                                control.available_bps(&existing, &one_more)
                            },
                            if self.settings.mode == AdmissionMode::Statistical {
                                format!("statistical (p_req {})", self.settings.p_req)
                            } else {
                                self.settings.mode.to_string()
                            },
                            #[expect(
                                clippy::cast_possible_truncation,
                                clippy::cast_sign_loss,
                                reason = "parts per million"
                            )]
                            {
                                (miss * 1e6).round() as u32
                            },
                        )
                    }
                    None => (
                        managed.share.capacity_bps,
                        "configured (--capacity): no device model yet, a conservative default; `abissctl profile DEV --save` measures one".to_owned(),
                        managed.share.budget_bps().saturating_sub(reserved),
                        if self.settings.mode == AdmissionMode::Off {
                            "off".to_owned()
                        } else {
                            "share".to_owned()
                        },
                        0,
                    ),
                };
                DeviceStatus {
                    name: disk.name.clone(),
                    device: disk.number,
                    elevator: now
                        .as_ref()
                        .map_or_else(|| "?".to_owned(), |s| s.elevator.clone()),
                    dispatch_depth: now.as_ref().map_or(0, |s| s.dispatch_depth),
                    capacity: ByteRate(capacity),
                    capacity_source,
                    realtime_share_percent: managed.share.share_percent.clamp(1, 95),
                    reserved: ByteRate(reserved),
                    free: ByteRate(free),
                    admission,
                    miss_probability_ppm: miss,
                    streams: u32::try_from(
                        self.streams
                            .iter()
                            .filter(|s| s.disk == disk.number)
                            .count(),
                    )
                    .unwrap_or(u32::MAX),
                }
            })
            .collect()
    }

    /// A connection closed: its non-persistent streams end with it.
    pub fn connection_closed(&mut self, connection: u64) {
        let ending: Vec<u64> = self
            .streams
            .iter()
            .filter(|s| s.connection == connection && !s.granted.persistent)
            .map(|s| s.id)
            .collect();
        for id in ending {
            self.end_stream(id);
        }
    }

    /// A task read, faulted on or missed pages of an attached file.
    pub fn playout_event(&mut self, event: &PlayoutEvent, now_ns: u64) {
        let Some(stream) = self.streams.get_mut(event.stream) else {
            return;
        };
        let comm_len = event
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(event.comm.len());
        stream.saw_reader(
            event.tgid,
            String::from_utf8_lossy(&event.comm[..comm_len]).into_owned(),
            now_ns,
        );
        let range = event.first_page * PAGE_BYTES..(event.last_page + 1) * PAGE_BYTES;
        log::debug!(
            "stream {}: access kind {} by {} ({}) {range:?}",
            stream.id,
            event.kind,
            event.tgid,
            event.pid
        );
        let actions = match event.kind {
            playout_kind::MISS => {
                stream.misses += 1;
                // Raise the reader first: the reads it waits for now are being queued.
                self.upgrades.on_miss(
                    event,
                    stream.granted.priority,
                    stream.owner_uid,
                    crate::daemon::monotonic_ns,
                );
                // The window refills from where the reader is (on_read treats a miss outside
                // the window as a jump).
                if !stream.newer_evidence(event.ts_ns) {
                    return;
                }
                stream.playout.on_read(range, now_ns)
            }
            playout_kind::QUEUED_LOW => {
                // A reader's request queued below the stream's level (direct I/O, or
                // readahead of a miss): raise it; where it reads is told by its reads.
                self.upgrades.on_miss(
                    event,
                    stream.granted.priority,
                    stream.owner_uid,
                    crate::daemon::monotonic_ns,
                );
                return;
            }
            playout_kind::URING_COMPLETE => {
                stream.uring_requests += 1;
                self.upgrades.touch(event.pid, stream.id, now_ns);
                return;
            }
            _ => {
                self.upgrades.touch(event.pid, stream.id, now_ns);
                if !stream.newer_evidence(event.ts_ns) {
                    return;
                }
                stream.playout.on_read(range, now_ns)
            }
        };
        Self::execute(&mut self.prefetch, stream, actions);
    }

    /// A load finished.
    pub fn loaded(&mut self, done: LoadDone) {
        log::debug!(
            "stream {}: {:?} {:?}",
            done.stream,
            done.range,
            done.outcome
        );
        let Some(stream) = self.streams.get_mut(done.stream) else {
            return;
        };
        match done.outcome {
            LoadOutcome::Loaded => {
                let actions = stream.playout.on_loaded(done.range, done.generation);
                Self::execute(&mut self.prefetch, stream, actions);
            }
            LoadOutcome::Cancelled => {}
            LoadOutcome::Failed(error) => {
                warn!(
                    "stream {}: loading {:?} failed: {error}",
                    stream.id, done.range
                );
                stream.playout.on_failed(&done.range, done.generation);
            }
        }
    }

    /// How long until some stream's credit allows a load its window lacks; `None` while every
    /// window is as full as it may be (then only a reader moving on can change anything).
    #[must_use]
    pub fn next_wakeup_ns(&self, now_ns: u64) -> Option<u64> {
        let loads = self
            .streams
            .iter()
            .filter_map(|s| s.playout.ns_until_next_load())
            .min();
        let expiry = self.upgrades.ns_until_next_expiry(now_ns);
        match (loads, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time passed: credit accrued for every stream.
    pub fn tick(&mut self, now_ns: u64) {
        self.upgrades.expire(now_ns);
        for stream in self.streams.iter_mut() {
            let actions = stream.playout.on_tick(now_ns);
            Self::execute(&mut self.prefetch, stream, actions);
        }
    }

    /// Ends every stream and gives the devices back.
    pub fn shutdown(mut self) {
        let ids: Vec<u64> = self.streams.iter().map(|s| s.id).collect();
        for id in ids {
            self.end_stream(id);
        }
        self.upgrades.shutdown();
        // Workers finish their in-flight loads; then the mappings go and the devices are
        // restored (ManagedDevice restores on drop).
        drop(self.prefetch);
        for (_, managed) in std::mem::take(&mut self.disks) {
            if let Err(error) = managed.device.restore() {
                warn!("{error}");
            }
        }
    }
}
