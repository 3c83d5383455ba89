//! Admission control per managed device.
//!
//! With a measured [`DeviceModel`] a device admits streams the way TRAC does (Zimmermann & Fu,
//! reference 000): per service window `T`, the work the admitted streams bring (the accesses
//! their loads need, each a seek and a rotational latency, plus the transfer of their data at
//! the rate of wherever it lies) must fit into `T × share`, the rest of the window staying for
//! best-effort traffic.
//!
//! - **Deterministic:** every access takes the longest seek and a whole revolution, every
//!   byte comes from the slowest zone, and a stream needs the most loads a window can hold:
//!   if that fits, no window can overrun.
//! - **Statistical:** the window's work is a random sum — data demand (the number of loads,
//!   with the rate's standard deviation for variable-bit-rate streams), access time (random
//!   placement: seek over a random distance, uniform rotation) and transfer rate (uniform
//!   position over the zone profile) — approximated by a normal distribution, as in TRAC,
//!   which gives TRAC's overcommit probability `P(work > T × share)`. ABISS streams have what
//!   TRAC's do not: playout buffers, which carry an overrun into the next windows. So a read
//!   waits only when the real-time backlog outgrows the slack of the least buffered stream;
//!   with the per-window mean and variance of the work as the drift and variance of that
//!   backlog (a reflected random walk), its diffusion approximation gives
//!   `P(backlog > S) ≈ exp(−2·(T·share − mean)·S / σ²)`, 1 once the mean reaches the share.
//!   A set of streams is admitted while that probability is at most `p_req`.
//! - **Mixed loads:** recording streams transfer at the measured write/read rate ratio
//!   (TRAC's β); a window's work adds the reads' and the writes' time, which is TRAC's
//!   mixed-load factor applied per stream.
//!
//! Until a device has a model, [`super::share::ShareAdmission`] keeps the configured capacity
//! times the real-time share.

use abiss_model::{AccessTimes, DeviceModel};
use abiss_proto::AdmissionMode;

use super::load_bytes;

/// The service window admission looks at (TRAC's `T_svr`, one second there too), ms.
pub(crate) const SERVICE_WINDOW_MS: u64 = 1000;
/// The same in seconds.
pub(crate) const SERVICE_WINDOW_S: f64 = 1.0;

/// A VBR stream's peak rate for the deterministic worst case: its mean plus this many standard
/// deviations.
pub(crate) const PEAK_STDEVS: f64 = 3.0;

/// Most streams capacity planning considers (`count`, and how far `n_max` searches): far
/// more real-time streams than any disk serves, and small enough that a plan costs
/// milliseconds on the daemon's main loop: the costliest plan at this bound (10 000 streams
/// of 1 B/s on a disk with a model, statistical mode) took 28 ms in a debug build on a 2-core
/// machine (40 to 49 ms before the model's access times were built once, [`AccessTimes`]),
/// under the 50 ms at which it would have to move off the loop. The server asks for one plan
/// at a time (`serve::limits::PLANS_AT_ONCE`).
pub(crate) const MAX_PLANNED_STREAMS: u32 = 10_000;

/// What one stream asks of the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StreamDemand {
    /// Mean rate, B/s.
    pub(crate) rate_bps: u64,
    /// Standard deviation of the rate over a window, B/s (0 for a constant rate).
    pub(crate) rate_stdev_bps: u64,
    /// Bytes per load: one access each.
    pub(crate) load_bytes: u64,
    /// Bytes the stream holds ahead of its reader when it asks for a load (its playout buffer
    /// less a load): how far the disk may fall behind before a read waits.
    pub(crate) ahead_bytes: u64,
    /// A recording stream (written) rather than playback.
    pub(crate) write: bool,
}

impl StreamDemand {
    /// A playback stream with a playout buffer of `buffer_bytes` and batches of `batch_bytes`:
    /// one disk access per load, whose size is the playout buffer's own rule.
    #[must_use]
    pub(crate) fn playback(rate_bps: u64, buffer_bytes: u64, batch_bytes: u64) -> Self {
        let load_bytes = load_bytes(buffer_bytes, batch_bytes);
        Self {
            rate_bps,
            rate_stdev_bps: 0,
            load_bytes,
            ahead_bytes: buffer_bytes.saturating_sub(load_bytes),
            write: false,
        }
    }
}

/// The model's figures one prediction uses.
struct ModelMoments {
    per_byte_mean: f64,
    per_byte_var: f64,
    access_mean_ordered: f64,
    access_mean_random: f64,
    access_var: f64,
}

/// Why a stream was refused, with the figures.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("a stream of {requested_bps} B/s does not fit on {device} ({mode} admission, {model_source}): with it the {streams} streams would need {needed_ms:.0} ms of every {window_ms} ms window where {budget_ms:.0} ms ({share_percent}%) are for real time, a predicted miss probability of {miss_probability_percent:.3}% where {p_req_percent}% is allowed; at most {available_bps} B/s more fits; ask for less, or detach another stream")]
pub(crate) struct ModelRefusal {
    /// The device's name.
    pub(crate) device: String,
    /// The mode.
    pub(crate) mode: AdmissionMode,
    /// Where the model comes from.
    pub(crate) model_source: String,
    /// The rate asked for, B/s.
    pub(crate) requested_bps: u64,
    /// The highest rate that would still fit, B/s.
    pub(crate) available_bps: u64,
    /// Streams with the new one.
    pub(crate) streams: usize,
    /// Work per window with the new stream (mean for statistical, worst case for
    /// deterministic), ms.
    pub(crate) needed_ms: f64,
    /// Window, ms.
    pub(crate) window_ms: u64,
    /// Real-time part of the window, ms.
    pub(crate) budget_ms: f64,
    /// Share, percent.
    pub(crate) share_percent: u32,
    /// Predicted miss probability with the new stream, percent.
    pub(crate) miss_probability_percent: f64,
    /// The allowed miss probability, percent.
    pub(crate) p_req_percent: f64,
}

/// What admission predicts for a set of streams.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Prediction {
    /// Mean work per window, s.
    pub(crate) mean_work_s: f64,
    /// Its standard deviation, s.
    pub(crate) stdev_work_s: f64,
    /// Worst-case work per window, s.
    pub(crate) worst_work_s: f64,
    /// TRAC's overcommit probability: that a window's work exceeds the real-time budget.
    pub(crate) window_overrun_probability: f64,
    /// The slack of the least buffered stream, s.
    pub(crate) slack_s: f64,
    /// Probability that the real-time backlog outgrows that slack, so a read waits: what
    /// statistical admission holds to `p_req`.
    pub(crate) miss_probability: f64,
}

/// Model-based admission of one device.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdmissionControl {
    /// The device's name, for messages.
    pub(crate) device: String,
    /// The device model.
    pub(crate) model: DeviceModel,
    /// Where the model comes from, for messages and `status`.
    pub(crate) source: String,
    /// The mode.
    pub(crate) mode: AdmissionMode,
    /// Allowed miss probability per window, in (0, 1).
    pub(crate) p_req: f64,
    /// Share of each window real-time streams may use, percent (1 to 95).
    pub(crate) share_percent: u32,
    /// The model's access times, built once with it ([`AdmissionControl::new`]).
    access: AccessTimes,
}

#[expect(clippy::cast_precision_loss, reason = "rates and sizes far below 2^52")]
fn as_f64(value: u64) -> f64 {
    value as f64
}

impl AdmissionControl {
    /// Admission of `device` by `model` (from `source`, for messages).
    #[must_use]
    pub(crate) fn new(
        device: String,
        model: DeviceModel,
        source: String,
        mode: AdmissionMode,
        p_req: f64,
        share_percent: u32,
    ) -> Self {
        Self {
            device,
            access: AccessTimes::new(&model),
            model,
            source,
            mode,
            p_req,
            share_percent,
        }
    }

    /// The real-time part of a window, s.
    #[must_use]
    pub(crate) fn budget_s(&self) -> f64 {
        SERVICE_WINDOW_S * f64::from(self.share_percent.clamp(1, 95)) / 100.0
    }

    /// The model's figures a prediction uses, computed once per prediction: each is an
    /// integral over the zones or the seek curve, and the same for every stream.
    fn moments(&self, queued: f64) -> ModelMoments {
        let (per_byte_mean, per_byte_var) = self.model.seconds_per_byte_moments();
        ModelMoments {
            per_byte_mean,
            per_byte_var,
            access_mean_ordered: self.access.mean_s(queued),
            access_mean_random: self.access.mean_s(1.0),
            access_var: self.access.variance_s2(),
        }
    }

    /// Mean and variance (s, s²) of one access plus the transfer of a load, with the access
    /// mean `access_mean` (ordered by the elevator, or random; the variance is taken
    /// unordered, the larger one).
    fn load_moments(
        &self,
        demand: &StreamDemand,
        moments: &ModelMoments,
        access_mean: f64,
    ) -> (f64, f64) {
        let slow = if demand.write {
            1.0 / self.model.write_read_ratio
        } else {
            1.0
        };
        let bytes = as_f64(demand.load_bytes);
        (
            access_mean + bytes * moments.per_byte_mean * slow,
            moments.access_var + bytes * bytes * moments.per_byte_var * slow * slow,
        )
    }

    /// The prediction for `streams`.
    ///
    /// The elevator orders the loads waiting at once, which shortens seeks: near saturation
    /// every stream has a load waiting, so the queue is taken as the window's loads over the
    /// loads of the busiest stream (the stream count for equal streams; a slow stream counts
    /// for less). With more work it never falls, so admission stays monotone.
    #[must_use]
    pub(crate) fn predict(&self, streams: &[StreamDemand]) -> Prediction {
        let worst_access = self.access.worst_s();
        let slowest = self.model.min_read_bps();
        let loads_of = |demand: &StreamDemand| {
            as_f64(demand.rate_bps) * SERVICE_WINDOW_S / as_f64(demand.load_bytes.max(1))
        };
        let total_loads: f64 = streams.iter().map(loads_of).sum();
        let busiest = streams.iter().map(loads_of).fold(0.0, f64::max);
        let queued = if busiest > 0.0 {
            (total_loads / busiest).max(1.0)
        } else {
            1.0
        };
        let moments = self.moments(queued);
        let (mut mean, mut var, mut worst) = (0.0, 0.0, 0.0);
        for demand in streams {
            let load = as_f64(demand.load_bytes.max(1));
            let loads = loads_of(demand);
            let stdev_loads = as_f64(demand.rate_stdev_bps) * SERVICE_WINDOW_S / load;
            // A constant-rate stream needs ⌊x⌋ or ⌈x⌉ loads in a window; f(1 − f) is that
            // count's variance, bounded here by min(x, 1/4) so it never falls as x grows.
            let quantisation = loads.min(0.25);
            let (t_mean, _) = self.load_moments(demand, &moments, moments.access_mean_ordered);
            let (t_random, t_var) = self.load_moments(demand, &moments, moments.access_mean_random);
            mean += loads * t_mean;
            var += loads * t_var + (quantisation + stdev_loads * stdev_loads) * t_random * t_random;
            let write_slow = if demand.write {
                1.0 / self.model.write_read_ratio
            } else {
                1.0
            };
            let peak = as_f64(demand.rate_bps) + PEAK_STDEVS * as_f64(demand.rate_stdev_bps);
            let worst_loads = (peak * SERVICE_WINDOW_S / load).ceil();
            worst += worst_loads * (worst_access + load / slowest * write_slow);
        }
        let budget = self.budget_s();
        let stdev = var.sqrt();
        let slack_s = streams
            .iter()
            .map(|d| as_f64(d.ahead_bytes) / as_f64(d.rate_bps.max(1)))
            .fold(f64::INFINITY, f64::min);
        let slack_s = if slack_s.is_finite() { slack_s } else { 0.0 };
        // If the worst case fits, no window can overrun (the normal tail and the diffusion
        // below would say otherwise only because they are approximations).
        let (window_overrun_probability, miss_probability) = if worst <= budget {
            (0.0, 0.0)
        } else if stdev > 0.0 {
            // TRAC: the window's work as a normal variable.
            let overrun = normal_upper_tail((budget - mean) / stdev);
            // The playout buffers carry an overrun into the next windows: the real-time
            // backlog is a random walk with drift (mean − budget) and variance σ² per window,
            // reflected at 0. While the drift is negative, the probability that it exceeds
            // the slack S is about exp(−2·(budget − mean)·S / σ²) (its diffusion
            // approximation); with no negative drift the backlog grows without bound.
            let miss = if mean >= budget {
                1.0
            } else {
                (-2.0 * (budget - mean) * slack_s / SERVICE_WINDOW_S / (var / SERVICE_WINDOW_S))
                    .exp()
                    .min(1.0)
            };
            (overrun, miss)
        } else if mean > budget {
            (1.0, 1.0)
        } else {
            (0.0, 0.0)
        };
        Prediction {
            mean_work_s: mean,
            stdev_work_s: stdev,
            worst_work_s: worst,
            window_overrun_probability,
            slack_s,
            miss_probability,
        }
    }

    /// Whether `streams` fit in `mode`.
    #[must_use]
    pub(crate) fn fits(&self, mode: AdmissionMode, streams: &[StreamDemand]) -> bool {
        let sum: u128 = streams.iter().map(|s| u128::from(s.rate_bps)).sum();
        // Never more than the device can move at all, whatever the approximation says.
        #[expect(clippy::cast_precision_loss, reason = "a comparison of rates")]
        if sum as f64 > self.model.max_read_bps() {
            return mode == AdmissionMode::Off;
        }
        let prediction = self.predict(streams);
        match mode {
            AdmissionMode::Off => true,
            AdmissionMode::Deterministic => prediction.worst_work_s <= self.budget_s(),
            AdmissionMode::Statistical => {
                prediction.mean_work_s <= self.budget_s()
                    && prediction.miss_probability <= self.p_req
            }
        }
    }

    /// How many more streams like `demand` fit next to `existing` (`None` with admission off).
    #[must_use]
    pub(crate) fn n_max(
        &self,
        mode: AdmissionMode,
        existing: &[StreamDemand],
        demand: &StreamDemand,
    ) -> Option<u32> {
        if mode == AdmissionMode::Off {
            return None;
        }
        let fits = |n: u32| {
            let mut all = existing.to_vec();
            all.extend(std::iter::repeat_n(*demand, n as usize));
            self.fits(mode, &all)
        };
        if !fits(0) || !fits(1) {
            return Some(0);
        }
        // Admission is monotone in the number of streams: double, then bisect.
        let mut low = 1;
        let mut high = 2;
        while high <= MAX_PLANNED_STREAMS && fits(high) {
            low = high;
            high *= 2;
        }
        let mut high = high.min(MAX_PLANNED_STREAMS + 1);
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if fits(mid) {
                low = mid;
            } else {
                high = mid;
            }
        }
        Some(low.min(MAX_PLANNED_STREAMS))
    }

    /// The highest rate one more stream shaped like `demand` could be admitted at.
    #[must_use]
    pub(crate) fn available_bps(&self, existing: &[StreamDemand], demand: &StreamDemand) -> u64 {
        let fits = |rate: u64| {
            let mut all = existing.to_vec();
            all.push(StreamDemand {
                rate_bps: rate,
                ..*demand
            });
            self.fits(self.mode, &all)
        };
        if self.mode == AdmissionMode::Off {
            return u64::MAX;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a rate in B/s"
        )]
        let mut high = self.model.max_read_bps().ceil() as u64 + 1;
        if !fits(1) {
            return 0;
        }
        let mut low = 1;
        while high - low > 1 {
            let mid = low + (high - low) / 2;
            if fits(mid) {
                low = mid;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Whether `demand` may join `existing`.
    pub(crate) fn admit(
        &self,
        existing: &[StreamDemand],
        demand: &StreamDemand,
    ) -> Result<Prediction, Box<ModelRefusal>> {
        let mut all = existing.to_vec();
        all.push(*demand);
        let prediction = self.predict(&all);
        if self.fits(self.mode, &all) {
            return Ok(prediction);
        }
        let needed = match self.mode {
            AdmissionMode::Deterministic => prediction.worst_work_s,
            _ => prediction.mean_work_s,
        };
        let window_ms = SERVICE_WINDOW_MS;
        Err(Box::new(ModelRefusal {
            device: self.device.clone(),
            mode: self.mode,
            model_source: self.source.clone(),
            requested_bps: demand.rate_bps,
            available_bps: self.available_bps(existing, demand),
            streams: all.len(),
            needed_ms: needed * 1e3,
            window_ms,
            budget_ms: self.budget_s() * 1e3,
            share_percent: self.share_percent.clamp(1, 95),
            miss_probability_percent: if self.mode == AdmissionMode::Deterministic
                && prediction.worst_work_s > self.budget_s()
            {
                prediction.miss_probability.max(f64::MIN_POSITIVE) * 100.0
            } else {
                prediction.miss_probability * 100.0
            },
            p_req_percent: if self.mode == AdmissionMode::Deterministic {
                0.0
            } else {
                self.p_req * 100.0
            },
        }))
    }
}

/// The standard normal distribution's upper tail, `P(Z > z)`.
#[must_use]
pub(crate) fn normal_upper_tail(z: f64) -> f64 {
    if z.is_nan() {
        return f64::NAN;
    }
    0.5 * statrs::function::erf::erfc(z / std::f64::consts::SQRT_2)
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
