//! Capacity planning (`abissctl admit`): how many streams like a request's fit on a managed
//! disk, by its model or its share of the configured capacity, and on a device over several
//! disks, by the fullest of them.

use abiss_proto::{
    AdmissionMode, AdmissionReport, AdmitRequest, Refusal, DEFAULT_BATCH_PAGES, PAGE_BYTES,
};

use super::device::{resolve_client_disk, Disk, SYSFS};
use super::managed::{demands_on, Disks, ManagedDisk};
use crate::policy::admission::{
    AdmissionControl, StreamDemand, MAX_PLANNED_STREAMS, SERVICE_WINDOW_MS,
};
use crate::stream::table::StreamTable;
use crate::stream::{MAX_BUFFER_BYTES, MAX_RATE_BPS};

impl Disks {
    /// Capacity planning: how many streams like the request's fit on its device. A device
    /// over several disks (an md or device-mapper array, named at any level) is planned on
    /// each of its disks, as a stream there is charged on each, and the fullest one answers.
    pub(crate) fn plan(
        &mut self,
        request: &AdmitRequest,
        streams: &StreamTable,
    ) -> Result<AdmissionReport, Refusal> {
        let named = resolve_client_disk(&request.device)
            .map_err(|error| Refusal::UnknownDevice(error.to_string()))?;
        let sys = std::path::Path::new(SYSFS);
        // A stack attach would refuse (md raid5) is not planned for either.
        if let Some(stack) = abiss_kernel::storage::stack_of(sys, named.number) {
            if let Some(layer) = stack.unserved_layer() {
                let refusal = abiss_kernel::storage::Unservable::Layer {
                    stack: Box::new(stack.clone()),
                    layer: Box::new(layer.clone()),
                };
                return Err(Refusal::UnknownDevice(format!(
                    "{} {}",
                    named.name,
                    refusal.reason()
                )));
            }
        }
        let disks: Vec<Disk> = abiss_kernel::storage::physical_disks(sys, named.number)
            .filter(|below| !below.is_empty())
            .map_or_else(
                || vec![named.clone()],
                |below| below.iter().map(Disk::from).collect(),
            );
        let mut fullest: Option<AdmissionReport> = None;
        for disk in &disks {
            let report = self.plan_on(disk, request, streams)?;
            let room = |r: &AdmissionReport| r.n_max.unwrap_or(u32::MAX);
            if fullest.as_ref().is_none_or(|f| room(&report) < room(f)) {
                fullest = Some(report);
            }
        }
        let mut report = fullest.ok_or_else(|| {
            Refusal::UnknownDevice(format!("{named} is on no disk abissd could manage"))
        })?;
        if disks.len() > 1 {
            let members: Vec<&str> = disks.iter().map(|d| d.name.as_str()).collect();
            report.model_source = format!(
                "{} is the fullest of {}'s disks ({}), each charged a stream's whole rate; {}",
                report.device,
                named.name,
                members.join(", "),
                report.model_source
            );
        }
        Ok(report)
    }

    fn plan_on(
        &mut self,
        disk: &Disk,
        request: &AdmitRequest,
        streams: &StreamTable,
    ) -> Result<AdmissionReport, Refusal> {
        let Some(managed) = self.disks.get_mut(&disk.number) else {
            return Err(Refusal::UnknownDevice(format!(
                "abissd does not manage {disk}; start it with --device for it"
            )));
        };
        managed
            .load_model(&self.settings)
            .map_err(|error| Refusal::ModelUnusable(error.to_string()))?;
        let demand = planned_demand(request)?;
        let managed = &self.disks[&disk.number];
        let mode = request.mode.unwrap_or(self.settings.mode);
        let existing = demands_on(streams, disk.number, None);
        let Some(control) = &managed.model else {
            let free = managed
                .share
                .budget_bps()
                .saturating_sub(streams.reserved_on(disk.number, None));
            return Ok(self.share_plan(managed, request, mode, free, existing.len()));
        };
        let mut control = control.clone();
        control.mode = mode;
        Ok(model_plan(&control, request, &existing, &demand))
    }

    /// Capacity planning without a model: the configured capacity times the share.
    fn share_plan(
        &self,
        managed: &ManagedDisk,
        request: &AdmitRequest,
        mode: AdmissionMode,
        free_bps: u64,
        admitted: usize,
    ) -> AdmissionReport {
        let n_max = (mode != AdmissionMode::Off)
            .then(|| u32::try_from(free_bps / request.rate.0).unwrap_or(u32::MAX));
        let disk = managed.device.disk();
        AdmissionReport {
            device: disk.name.clone(),
            mode,
            p_req: self.settings.p_req,
            window_ms: SERVICE_WINDOW_MS,
            realtime_share_percent: managed.share.share_percent,
            model_source: format!(
                "no device model: {} B/s configured (--capacity) times the share; profile the device with `abissctl profile {} --save`",
                managed.share.capacity_bps, disk.name
            ),
            admitted_streams: u32::try_from(admitted).unwrap_or(u32::MAX),
            current_miss_probability: None,
            n_max,
            count: request.count,
            miss_probability: None,
            fits: request
                .count
                .map(|count| n_max.is_none_or(|n| count <= n)),
            window_overrun_probability: None,
            mean_work_ms: None,
        }
    }
}

/// The stream an `admit` request plans for, or why the request is malformed.
fn planned_demand(request: &AdmitRequest) -> Result<StreamDemand, Refusal> {
    if request.rate.0 == 0 || request.rate.0 > MAX_RATE_BPS {
        return Err(Refusal::BadRequest(format!(
            "a rate of {} B/s is outside 1 B/s to 1 TB/s",
            request.rate.0
        )));
    }
    if request.rate_stdev.0 > MAX_RATE_BPS || request.buffer.0 == 0 {
        return Err(Refusal::BadRequest(
            "the rate's standard deviation must be below 1 TB/s and the buffer above 0".to_owned(),
        ));
    }
    if request.buffer.0 > MAX_BUFFER_BYTES {
        return Err(Refusal::BadRequest(format!(
            "a buffer of {} is more than the 1 GiB abissd locks for one stream",
            request.buffer
        )));
    }
    if request
        .count
        .is_some_and(|count| count > MAX_PLANNED_STREAMS)
    {
        return Err(Refusal::BadRequest(format!(
            "plans are for at most {MAX_PLANNED_STREAMS} streams; ask about fewer"
        )));
    }
    let batch_pages = request.batch_pages.unwrap_or(DEFAULT_BATCH_PAGES);
    if batch_pages == 0 {
        return Err(Refusal::BadRequest(
            "a batch must be at least one page".to_owned(),
        ));
    }
    Ok(StreamDemand {
        rate_stdev_bps: request.rate_stdev.0,
        write: request.write,
        ..StreamDemand::playback(
            request.rate.0,
            request.buffer.0,
            u64::from(batch_pages) * PAGE_BYTES,
        )
    })
}

/// Capacity planning with a model.
fn model_plan(
    control: &AdmissionControl,
    request: &AdmitRequest,
    existing: &[StreamDemand],
    demand: &StreamDemand,
) -> AdmissionReport {
    let mode = control.mode;
    let with_count = request.count.map(|count| {
        let mut all = existing.to_vec();
        all.extend(std::iter::repeat_n(*demand, count as usize));
        let prediction = control.predict(&all);
        // The deterministic mode bounds rather than estimates: no miss is possible while the
        // worst case fits (0), and one cannot be ruled out once it does not (1).
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
            prediction.mean_work_s * 1e3,
        )
    });
    AdmissionReport {
        device: control.device.clone(),
        mode,
        p_req: control.p_req,
        window_ms: SERVICE_WINDOW_MS,
        realtime_share_percent: control.share_percent,
        model_source: control.source.clone(),
        admitted_streams: u32::try_from(existing.len()).unwrap_or(u32::MAX),
        current_miss_probability: Some(control.predict(existing).miss_probability),
        n_max: control.n_max(mode, existing, demand),
        count: request.count,
        miss_probability: with_count.map(|(p, ..)| p),
        fits: with_count.map(|(_, fits, ..)| fits),
        window_overrun_probability: with_count.map(|(_, _, overrun, _)| overrun),
        mean_work_ms: with_count.map(|(.., work_ms)| work_ms),
    }
}
