//! The managed disks and their admission: which disks abissd holds, whether a stream fits on
//! them (by each one's measured model, or by a share of a configured capacity until it has
//! one) and device status (`abissctl status`); capacity planning (`abissctl admit`) is
//! [`super::capacity_plan`]'s.
//!
//! The arithmetic is pure policy ([`crate::policy::admission`], [`crate::policy::share`]);
//! this module keeps the per-disk state it runs on and turns its answers into refusals and
//! reports for clients.

use std::collections::BTreeMap;
use std::path::PathBuf;

use abiss_model::{DeviceIdentity, DeviceModel, ModelError};
use abiss_proto::{
    AdmissionMode, AttachRequest, ByteRate, DeviceNumber, DeviceStatus, Refusal, StreamId,
    DEFAULT_BATCH_PAGES, DEFAULT_BUFFER_BYTES, PAGE_BYTES,
};
use log::{info, warn};

use crate::disk::device::{self, resolve_disks, DeviceError, DeviceOptions, ManagedDevice, SYSFS};
use crate::disk::file_disk::{disk_of_file, FileDisk};
use crate::policy::admission::{AdmissionControl, StreamDemand};
use crate::policy::share::ShareAdmission;
use crate::serve::client_file::CheckedFile;
use crate::stream::table::StreamTable;

/// How the daemon admits streams, for every managed disk.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdmissionSettings {
    /// The mode with a device model.
    pub(crate) mode: AdmissionMode,
    /// Allowed miss probability per window (statistical mode), in (0, 1).
    pub(crate) p_req: f64,
    /// Share of the device real-time streams may use, percent (1 to 95).
    pub(crate) share_percent: u32,
    /// Capacity assumed without a model, B/s.
    pub(crate) capacity_bps: u64,
    /// Where device settings to restore after a crash are kept.
    pub(crate) state_dir: PathBuf,
    /// Where device models are found.
    pub(crate) model_dir: PathBuf,
}

/// Why the disks could not be taken at start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TakeError {
    /// A device could not be managed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A disk's saved model is corrupt or describes another device.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A managed disk with its admission control.
#[derive(Debug)]
pub(crate) struct ManagedDisk {
    /// The device settings abissd holds (restored on drop).
    pub(crate) device: ManagedDevice,
    /// Its identity, under which its model is saved.
    pub(crate) identity: DeviceIdentity,
    /// Admission by the configured capacity, until the disk has a model.
    pub(crate) share: ShareAdmission,
    /// Admission by the disk's model, once it has one.
    pub(crate) model: Option<AdmissionControl>,
}

impl ManagedDisk {
    /// A disk with its model loaded from the state directory, if it has one. A model file
    /// that is corrupt or describes another device is an error, never ignored.
    pub(crate) fn new(
        device: ManagedDevice,
        settings: &AdmissionSettings,
    ) -> Result<Self, ModelError> {
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
    pub(super) fn load_model(&mut self, settings: &AdmissionSettings) -> Result<(), ModelError> {
        if self.model.is_some() {
            return Ok(());
        }
        if let Some(model) = DeviceModel::find(&settings.model_dir, &self.identity)? {
            info!(
                "{}: admission by its model {} ({} admission)",
                self.device.disk(),
                self.identity.model_path(&settings.model_dir).display(),
                settings.mode
            );
            let source = format!(
                "model {} measured at {} s since the epoch{}",
                self.identity.key,
                model.measured_at_unix_s,
                if model.quick { " (quick profile)" } else { "" }
            );
            self.model = Some(AdmissionControl::new(
                self.device.disk().name.clone(),
                model,
                source,
                settings.mode,
                settings.p_req,
                settings.share_percent,
            ));
        }
        Ok(())
    }
}

/// What the streams on `disk` ask of it, but stream `except` (one whose rate is being changed).
pub(super) fn demands_on(
    streams: &StreamTable,
    disk: DeviceNumber,
    except: Option<StreamId>,
) -> Vec<StreamDemand> {
    streams
        .iter()
        .filter(|s| s.is_on(disk) && Some(s.id) != except)
        .map(crate::stream::Stream::demand)
        .collect()
}

/// Every managed disk, by device number, and the settings they are admitted by.
#[derive(Debug)]
pub(crate) struct Disks {
    pub(super) settings: AdmissionSettings,
    pub(super) disks: BTreeMap<DeviceNumber, ManagedDisk>,
}

impl Disks {
    /// Takes every disk of `specs` as `options` say for its kind, after restoring what a
    /// crashed daemon left changed.
    pub(crate) fn take(
        specs: &[String],
        options: DeviceOptions,
        settings: AdmissionSettings,
    ) -> Result<Self, TakeError> {
        for outcome in device::recover(&settings.state_dir)? {
            match outcome {
                device::RecoveryOutcome::Restored { disk } => {
                    info!("restored {disk}, left managed by a daemon that did not exit cleanly");
                }
                other => warn!("device state from an earlier daemon: {other:?}"),
            }
        }
        let mut disks = BTreeMap::new();
        // A spec may name any level of a stack (a partition, a device-mapper or md device):
        // it means the whole disks under it, each managed on its own.
        let mut names = Vec::new();
        for spec in specs {
            for disk in resolve_disks(spec)? {
                if !names.contains(&disk.name) {
                    names.push(disk.name);
                }
            }
        }
        for name in &names {
            let config = options.config_for(device::is_rotational(&device::resolve_disk(name)?));
            let device = ManagedDevice::take(name, &config, &settings.state_dir)?;
            let managed = ManagedDisk::new(device, &settings)?;
            info!(
                "managing {} with {} at dispatch depth {}",
                managed.device.disk(),
                config.elevator,
                config.dispatch_depth
            );
            disks.insert(managed.device.disk().number, managed);
        }
        Ok(Self { settings, disks })
    }

    /// Admits by `settings` from now on (a reload): each disk's share and its model are taken
    /// up again, so a model saved or replaced since is used. Streams already admitted keep
    /// running; a disk whose model no longer loads keeps admitting by its share, and says why.
    pub(crate) fn reconfigure(&mut self, settings: AdmissionSettings) {
        for managed in self.disks.values_mut() {
            managed.share.capacity_bps = settings.capacity_bps;
            managed.share.share_percent = settings.share_percent;
            managed.model = None;
            if let Err(error) = managed.load_model(&settings) {
                warn!(
                    "{}: its model is unusable ({error}); admitting by its share of --capacity",
                    managed.device.disk()
                );
            }
        }
        self.settings = settings;
    }

    /// The managed disks `file` lives on (found through its file system's stack: see
    /// [`crate::disk::file_disk`]), with any model saved since the daemon started taken up (a
    /// broken one refuses). The file's kernel key takes its file system's own device. A
    /// recording (`write`) is refused through a layer that writes from pages of its own.
    pub(crate) fn serving(
        &mut self,
        file: &mut CheckedFile,
        write: bool,
    ) -> Result<FileDisk, Refusal> {
        let found = disk_of_file(file.file_device, file.mount_id, &file.path, write)?;
        let unmanaged: Vec<String> = found
            .disks
            .iter()
            .filter(|disk| !self.disks.contains_key(&disk.number))
            .map(ToString::to_string)
            .collect();
        if !unmanaged.is_empty() {
            let which = if found.disks.len() == 1 {
                String::new()
            } else {
                let all: Vec<String> = found.disks.iter().map(ToString::to_string).collect();
                format!(" (its data may be on any of {})", all.join(", "))
            };
            return Err(Refusal::UnknownDevice(format!(
                "{} is on {}{which}, which abissd does not manage; start abissd with --device for {}",
                file.path,
                unmanaged.join(" and "),
                if unmanaged.len() == 1 { "it" } else { "each" }
            )));
        }
        for disk in &found.disks {
            if let Some(managed) = self.disks.get_mut(&disk.number) {
                managed
                    .load_model(&self.settings)
                    .map_err(|error| Refusal::ModelUnusable(error.to_string()))?;
            }
        }
        file.key.dev = found.kernel_device.to_kernel();
        Ok(found)
    }

    /// Admission of a stream of `request` on managed `disks`, next to `streams` (but stream
    /// `replacing`, which the request would replace): by each disk's model, or by the
    /// configured capacity until it has one. A stream over several disks is charged its whole
    /// demand on each: which of them serves a given read is the file system's choice (a
    /// btrfs's extent, a raid1's mirror), so each must be able to serve it all.
    pub(crate) fn admit(
        &self,
        disks: &[DeviceNumber],
        request: &AttachRequest,
        streams: &StreamTable,
        replacing: Option<StreamId>,
    ) -> Result<(), Refusal> {
        for &disk in disks {
            self.admit_on(disk, request, streams, replacing)?;
        }
        Ok(())
    }

    fn admit_on(
        &self,
        disk: DeviceNumber,
        request: &AttachRequest,
        streams: &StreamTable,
        replacing: Option<StreamId>,
    ) -> Result<(), Refusal> {
        let Some(managed) = self.disks.get(&disk) else {
            return Err(Refusal::Internal(format!("device {disk} is not managed")));
        };
        // A write stream is priced by the model's write figures, as `admit --write` plans.
        let demand = crate::stream::demand_of(request);
        let refused = |refusal: &dyn std::fmt::Display| Refusal::DoesNotFit(refusal.to_string());
        match (&managed.model, self.settings.mode) {
            (_, AdmissionMode::Off) => {}
            (Some(control), _) => {
                let prediction = control
                    .admit(&demands_on(streams, disk, replacing), &demand)
                    .map_err(|refusal| refused(&refusal))?;
                info!(
                    "{}: admitted {} B/s; predicted miss probability {:.4}%",
                    disk,
                    request.rate.0,
                    prediction.miss_probability * 100.0
                );
            }
            (None, _) => managed
                .share
                .admit(streams.reserved_on(disk, replacing), request.rate.0)
                .map_err(|refusal| refused(&refusal))?,
        }
        Ok(())
    }

    /// Whether the models of `disks` admit `demand` next to the streams each serves now
    /// (`existing_on` gives them, per disk): `None` when admission is off or one of the disks
    /// has no model yet (a share admits by rate, where a stream's buffer changes nothing, so
    /// growing buffers must not stand in for its check); `Some(false)` when one refuses.
    #[must_use]
    pub(crate) fn model_admits(
        &self,
        disks: &[DeviceNumber],
        existing_on: impl Fn(DeviceNumber) -> Vec<StreamDemand>,
        demand: &StreamDemand,
    ) -> Option<bool> {
        if self.settings.mode == AdmissionMode::Off {
            return None;
        }
        let mut controls = Vec::new();
        for &disk in disks {
            controls.push((disk, self.disks.get(&disk)?.model.as_ref()?));
        }
        Some(
            controls
                .into_iter()
                .all(|(disk, control)| control.admit(&existing_on(disk), demand).is_ok()),
        )
    }

    /// The managed devices as `abissctl status` shows them.
    #[must_use]
    pub(crate) fn status(&self, streams: &StreamTable) -> Vec<DeviceStatus> {
        self.disks
            .values()
            .map(|managed| self.disk_status(managed, streams))
            .collect()
    }

    fn disk_status(&self, managed: &ManagedDisk, streams: &StreamTable) -> DeviceStatus {
        let disk = managed.device.disk();
        let now = managed.device.status().ok();
        let reserved = streams.reserved_on(disk.number, None);
        let mode = self.settings.mode;
        let figures = match &managed.model {
            Some(control) => model_figures(
                control,
                &demands_on(streams, disk.number, None),
                reserved,
                &self.settings,
            ),
            None => AdmissionFigures {
                capacity_bps: managed.share.capacity_bps,
                source: "configured (--capacity): no device model yet, a conservative default; `abissctl profile DEV --save` measures one".to_owned(),
                free_bps: managed.share.budget_bps().saturating_sub(reserved),
                admission: if mode == AdmissionMode::Off { "off" } else { "share" }.to_owned(),
                miss_ppm: 0,
            },
        };
        DeviceStatus {
            name: disk.name.clone(),
            device: disk.number,
            elevator: now
                .as_ref()
                .map_or_else(|| "?".to_owned(), |s| s.elevator.clone()),
            dispatch_depth: now.as_ref().map_or(0, |s| s.dispatch_depth),
            capacity: ByteRate(figures.capacity_bps),
            capacity_source: figures.source,
            realtime_share_percent: managed.share.share_percent.clamp(1, 95),
            reserved: ByteRate(reserved),
            reserved_write: ByteRate(streams.reserved_write_on(disk.number)),
            free: ByteRate(figures.free_bps),
            admission: figures.admission,
            miss_probability_ppm: figures.miss_ppm,
            streams: u32::try_from(streams.iter().filter(|s| s.is_on(disk.number)).count())
                .unwrap_or(u32::MAX),
            built_on: abiss_kernel::storage::built_on(std::path::Path::new(SYSFS), &disk.name),
        }
    }

    /// The managed disks' device numbers.
    #[must_use]
    pub(crate) fn numbers(&self) -> Vec<DeviceNumber> {
        self.disks.keys().copied().collect()
    }

    /// Gives every disk its original settings back.
    pub(crate) fn restore(self) {
        for (_, managed) in self.disks {
            if let Err(error) = managed.device.restore() {
                warn!("{error}");
            }
        }
    }
}

/// A disk's admission figures for `status`.
struct AdmissionFigures {
    capacity_bps: u64,
    source: String,
    free_bps: u64,
    admission: String,
    miss_ppm: u32,
}

/// The figures of a disk with a model: "one more stream" is a 1 B/s stream with the default
/// buffer and batch, so `free` is the most such a stream could ask for.
fn model_figures(
    control: &AdmissionControl,
    existing: &[StreamDemand],
    reserved_bps: u64,
    settings: &AdmissionSettings,
) -> AdmissionFigures {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rate in B/s"
    )]
    let capacity_bps = control.model.max_read_bps() as u64;
    let one_more = StreamDemand::playback(
        1,
        DEFAULT_BUFFER_BYTES,
        u64::from(DEFAULT_BATCH_PAGES) * PAGE_BYTES,
    );
    let miss = control.predict(existing).miss_probability;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "parts per million"
    )]
    let miss_ppm = (miss * 1e6).round() as u32;
    AdmissionFigures {
        capacity_bps,
        source: control.source.clone(),
        free_bps: if settings.mode == AdmissionMode::Off {
            capacity_bps.saturating_sub(reserved_bps)
        } else {
            control.available_bps(existing, &one_more)
        },
        admission: if settings.mode == AdmissionMode::Statistical {
            format!("statistical (p_req {})", settings.p_req)
        } else {
            settings.mode.to_string()
        },
        miss_ppm,
    }
}
