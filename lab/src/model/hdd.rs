//! The rotating-disk model: zoned transfer rate, a seek curve and rotational latency.
//!
//! The shape follows the device models in the reference papers (TRAC: a multi-zone transfer-rate
//! profile and a seek-time profile against seek distance; Johnson & Miller: short seeks grow with
//! the square root of the distance, long seeks linearly). Positions are byte offsets; LBA 0 is the
//! outer edge, where the rate is highest.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{Op, ServiceOrder, ServicePlan};
use crate::error::ModelError;

/// Parameters of the hdd model, as read from the `[hdd]` table of a model file.
///
/// The defaults resemble a 2.5" 5400 rpm laptop disk: 60 MB/s at the outer edge falling to
/// 35 MB/s at the inner edge, an average random seek of about 6.5 ms and half a revolution of
/// 5.56 ms, so about 12 ms average access time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HddParams {
    /// Spindle speed in revolutions per minute; one revolution bounds the rotational latency.
    pub rpm: f64,
    /// Sequential read rate in the outermost zone (LBA 0), in MB/s (10^6 bytes per second).
    pub outer_rate_mb_s: f64,
    /// Sequential read rate in the innermost zone, in MB/s.
    pub inner_rate_mb_s: f64,
    /// Number of zones of equal size; the rate falls in equal steps from outer to inner.
    pub zones: u32,
    /// Write rate as a fraction of the read rate in the same zone (0 < f <= 1).
    pub write_rate_fraction: f64,
    /// Seek time for the shortest non-zero distance (track to track plus settle), in ms.
    pub min_seek_ms: f64,
    /// Distance, as a fraction of the capacity, where the square-root curve of short seeks
    /// turns into the linear curve of long seeks.
    pub seek_knee_fraction: f64,
    /// Seek time at the knee distance, in ms.
    pub knee_seek_ms: f64,
    /// Seek time over the whole capacity (full stroke), in ms.
    pub full_stroke_seek_ms: f64,
    /// How many requests the device accepts at once (NCQ depth); the loop device's dispatch
    /// depth is set to match (the block layer's minimum is 4).
    pub queue_depth: u32,
    /// The order in which queued requests are served.
    pub order: ServiceOrder,
}

impl Default for HddParams {
    fn default() -> Self {
        Self {
            rpm: 5400.0,
            outer_rate_mb_s: 60.0,
            inner_rate_mb_s: 35.0,
            zones: 16,
            write_rate_fraction: 0.9,
            min_seek_ms: 1.0,
            seek_knee_fraction: 0.2,
            knee_seek_ms: 6.0,
            full_stroke_seek_ms: 11.5,
            // A short device queue keeps the host's elevator in charge of the order, which is
            // what an I/O scheduler needs to show its effect.
            queue_depth: 4,
            order: ServiceOrder::Scan,
        }
    }
}

fn positive(field: &'static str, value: f64) -> Result<(), ModelError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ModelError::Invalid {
            field,
            reason: format!("must be a positive number, got {value}"),
        })
    }
}

impl HddParams {
    /// Checks the parameters; the error names the offending field.
    pub fn validate(&self) -> Result<(), ModelError> {
        positive("hdd.rpm", self.rpm)?;
        positive("hdd.outer_rate_mb_s", self.outer_rate_mb_s)?;
        positive("hdd.inner_rate_mb_s", self.inner_rate_mb_s)?;
        if self.inner_rate_mb_s > self.outer_rate_mb_s {
            return Err(ModelError::Invalid {
                field: "hdd.inner_rate_mb_s",
                reason: "must not exceed hdd.outer_rate_mb_s (LBA 0 is the fast outer edge)".into(),
            });
        }
        if self.zones == 0 {
            return Err(ModelError::Invalid {
                field: "hdd.zones",
                reason: "must be at least 1".into(),
            });
        }
        positive("hdd.write_rate_fraction", self.write_rate_fraction)?;
        if self.write_rate_fraction > 1.0 {
            return Err(ModelError::Invalid {
                field: "hdd.write_rate_fraction",
                reason: "must be at most 1".into(),
            });
        }
        positive("hdd.min_seek_ms", self.min_seek_ms)?;
        positive("hdd.seek_knee_fraction", self.seek_knee_fraction)?;
        if self.seek_knee_fraction >= 1.0 {
            return Err(ModelError::Invalid {
                field: "hdd.seek_knee_fraction",
                reason: "must be below 1".into(),
            });
        }
        if !(self.knee_seek_ms.is_finite() && self.knee_seek_ms >= self.min_seek_ms) {
            return Err(ModelError::Invalid {
                field: "hdd.knee_seek_ms",
                reason: "must be at least hdd.min_seek_ms".into(),
            });
        }
        if !(self.full_stroke_seek_ms.is_finite() && self.full_stroke_seek_ms >= self.knee_seek_ms)
        {
            return Err(ModelError::Invalid {
                field: "hdd.full_stroke_seek_ms",
                reason: "must be at least hdd.knee_seek_ms".into(),
            });
        }
        super::check_queue_depth("hdd.queue_depth", self.queue_depth)
    }

    /// One revolution of the platter.
    #[must_use]
    pub fn revolution(&self) -> Duration {
        Duration::from_secs_f64(60.0 / self.rpm)
    }

    /// Read rate of zone `zone` (0 = outer), in bytes per second.
    #[must_use]
    pub fn zone_rate_bps(&self, zone: u32) -> f64 {
        let zone = zone.min(self.zones - 1);
        let step = if self.zones > 1 {
            (self.outer_rate_mb_s - self.inner_rate_mb_s) / f64::from(self.zones - 1)
        } else {
            0.0
        };
        (self.outer_rate_mb_s - step * f64::from(zone)) * 1e6
    }

    /// Seek time over `fraction` of the capacity (0 = no seek, 1 = full stroke).
    ///
    /// Short seeks follow `a + b·√d` (the arm accelerates and decelerates), long seeks
    /// `c + e·d` (the arm coasts); the two pieces meet at the knee so the curve is continuous
    /// and never decreasing.
    #[must_use]
    pub fn seek_time(&self, fraction: f64) -> Duration {
        let d = fraction.clamp(0.0, 1.0);
        if d <= 0.0 {
            return Duration::ZERO;
        }
        let knee = self.seek_knee_fraction;
        let ms = if d < knee {
            self.min_seek_ms + (self.knee_seek_ms - self.min_seek_ms) * (d / knee).sqrt()
        } else {
            self.knee_seek_ms
                + (self.full_stroke_seek_ms - self.knee_seek_ms) * (d - knee) / (1.0 - knee)
        };
        Duration::from_secs_f64(ms / 1e3)
    }

    /// Mean seek time between two positions drawn uniformly over the disk.
    ///
    /// The distance `x` of two uniform points has density `2(1 - x)`; integrated numerically.
    #[must_use]
    pub fn mean_random_seek(&self) -> Duration {
        const STEPS: u32 = 10_000;
        let mut sum = 0.0;
        for i in 0..STEPS {
            let x = (f64::from(i) + 0.5) / f64::from(STEPS);
            sum += self.seek_time(x).as_secs_f64() * 2.0 * (1.0 - x) / f64::from(STEPS);
        }
        Duration::from_secs_f64(sum)
    }
}

/// The hdd model with its head position; `plan` advances the head.
#[derive(Debug, Clone)]
pub struct HddModel {
    params: HddParams,
    capacity_bytes: u64,
    /// Byte offset just past the last transferred byte, where the head is now.
    head: u64,
}

impl HddModel {
    /// A model of a disk of `capacity_bytes`, head parked at LBA 0.
    #[must_use]
    pub fn new(params: HddParams, capacity_bytes: u64) -> Self {
        Self {
            params,
            capacity_bytes: capacity_bytes.max(1),
            head: 0,
        }
    }

    /// The parameters.
    #[must_use]
    pub fn params(&self) -> &HddParams {
        &self.params
    }

    /// Where the head is: the byte offset just past the last request.
    #[must_use]
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Zone index (0 = outer) holding byte `offset`.
    #[must_use]
    pub fn zone_of(&self, offset: u64) -> u32 {
        let zones = u64::from(self.params.zones);
        let zone = u128::from(offset.min(self.capacity_bytes - 1)) * u128::from(zones)
            / u128::from(self.capacity_bytes);
        u32::try_from(zone).unwrap_or(self.params.zones - 1)
    }

    /// Read rate at byte `offset`, in bytes per second.
    #[must_use]
    pub fn rate_at_bps(&self, offset: u64) -> f64 {
        self.params.zone_rate_bps(self.zone_of(offset))
    }

    /// Time to transfer `len` bytes from `offset`, summed zone by zone.
    #[must_use]
    pub fn transfer_time(&self, op: Op, offset: u64, len: u64) -> Duration {
        let factor = match op {
            Op::Read => 1.0,
            Op::Write => self.params.write_rate_fraction,
        };
        let zones = u128::from(self.params.zones);
        let capacity = u128::from(self.capacity_bytes);
        let mut seconds = 0.0;
        let mut at = offset;
        let end = offset.saturating_add(len);
        while at < end {
            let zone = self.zone_of(at);
            // First byte of the next zone: ceil((zone + 1) * capacity / zones).
            let next = (u128::from(zone) + 1) * capacity;
            let next = u64::try_from(next.div_ceil(zones)).unwrap_or(u64::MAX);
            let chunk_end = if next > at { end.min(next) } else { end };
            #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
            let bytes = (chunk_end - at) as f64;
            seconds += bytes / (self.params.zone_rate_bps(zone) * factor);
            at = chunk_end;
        }
        Duration::from_secs_f64(seconds)
    }

    /// Seek distance from the head to `offset` as a fraction of the capacity.
    #[must_use]
    pub fn seek_fraction(&self, offset: u64) -> f64 {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a fraction needs no exact bytes"
        )]
        let fraction = self.head.abs_diff(offset) as f64 / self.capacity_bytes as f64;
        fraction
    }

    /// Expected service time of a request (mean rotational latency) without moving the head;
    /// `validate` compares measurements with this.
    #[must_use]
    pub fn expected_service(&self, op: Op, offset: u64, len: u64) -> Duration {
        if offset == self.head {
            return self.transfer_time(op, offset, len);
        }
        self.params.seek_time(self.seek_fraction(offset))
            + self.params.revolution() / 2
            + self.transfer_time(op, offset, len)
    }

    /// Plans a request and moves the head past it.
    ///
    /// A request that starts where the previous one ended is sequential: the head is already
    /// there and the sector is just arriving, so it pays neither seek nor rotation.
    pub fn plan(&mut self, op: Op, offset: u64, len: u64, rng: &mut impl Rng) -> ServicePlan {
        let (seek, rotation) = if offset == self.head {
            (Duration::ZERO, Duration::ZERO)
        } else {
            let seek = self.params.seek_time(self.seek_fraction(offset));
            let rotation = self.params.revolution().mul_f64(rng.gen::<f64>());
            (seek, rotation)
        };
        let transfer = self.transfer_time(op, offset, len);
        self.head = offset.saturating_add(len);
        let total = seek + rotation + transfer;
        ServicePlan {
            seek,
            rotation,
            transfer,
            latency: Duration::ZERO,
            occupancy: total,
            completion: total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    const GIB: u64 = 1 << 30;

    #[test]
    fn defaults_are_valid_and_resemble_a_laptop_disk() {
        let p = HddParams::default();
        p.validate().unwrap();
        let access = p.mean_random_seek() + p.revolution() / 2;
        let access_ms = access.as_secs_f64() * 1e3;
        assert!(
            (11.5..12.5).contains(&access_ms),
            "mean access {access_ms} ms"
        );
        assert!((p.zone_rate_bps(0) - 60e6).abs() < 1.0);
        assert!((p.zone_rate_bps(p.zones - 1) - 35e6).abs() < 1.0);
    }

    #[test]
    fn validation_names_the_field() {
        let p = HddParams {
            inner_rate_mb_s: 70.0,
            ..HddParams::default()
        };
        let err = p.validate().unwrap_err().to_string();
        assert!(err.contains("hdd.inner_rate_mb_s"), "{err}");
        let p = HddParams {
            rpm: -1.0,
            ..HddParams::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("hdd.rpm"));
    }

    #[test]
    fn sequential_requests_pay_only_transfer() {
        let mut model = HddModel::new(HddParams::default(), 4 * GIB);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let first = model.plan(Op::Read, 0, 1 << 20, &mut rng);
        assert_eq!(first.seek, Duration::ZERO, "head starts at 0");
        let second = model.plan(Op::Read, 1 << 20, 1 << 20, &mut rng);
        assert_eq!(second.seek + second.rotation, Duration::ZERO);
        // 1 MiB at 60 MB/s.
        let expected = f64::from(1u32 << 20) / 60e6;
        assert!((second.transfer.as_secs_f64() - expected).abs() < 1e-9);
        let random = model.plan(Op::Read, 2 * GIB, 4096, &mut rng);
        assert!(random.seek > Duration::from_millis(5));
    }

    #[test]
    fn writes_are_slower_by_the_fraction() {
        let model = HddModel::new(HddParams::default(), 4 * GIB);
        let read = model.transfer_time(Op::Read, 0, 1 << 20);
        let write = model.transfer_time(Op::Write, 0, 1 << 20);
        assert!((read.as_secs_f64() / write.as_secs_f64() - 0.9).abs() < 1e-6);
    }

    #[test]
    fn transfer_across_a_zone_boundary_mixes_rates() {
        let model = HddModel::new(HddParams::default(), 16 * GIB);
        // Zone 0 is [0, 1 GiB); half a MiB on each side of the boundary.
        let t = model.transfer_time(Op::Read, GIB - (1 << 19), 1 << 20);
        let expected = f64::from(1u32 << 19) / model.params().zone_rate_bps(0)
            + f64::from(1u32 << 19) / model.params().zone_rate_bps(1);
        assert!((t.as_secs_f64() - expected).abs() < 1e-9);
    }

    proptest! {
        #[test]
        fn seek_time_is_monotone_in_distance(a in 0.0f64..1.0, b in 0.0f64..1.0) {
            let p = HddParams::default();
            let (near, far) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(p.seek_time(near) <= p.seek_time(far));
        }

        #[test]
        fn seek_time_is_bounded_by_min_and_full_stroke(d in 1e-9f64..=1.0) {
            let p = HddParams::default();
            let t = p.seek_time(d).as_secs_f64() * 1e3;
            prop_assert!(t >= p.min_seek_ms - 1e-9 && t <= p.full_stroke_seek_ms + 1e-9);
        }

        #[test]
        fn zone_rate_decreases_inward(a in 0u64..(4 * GIB), b in 0u64..(4 * GIB)) {
            let model = HddModel::new(HddParams::default(), 4 * GIB);
            let (outer, inner) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(model.rate_at_bps(outer) >= model.rate_at_bps(inner));
        }

        #[test]
        fn plan_components_add_up(offset in 0u64..(4 * GIB), len in 1u64..(4 << 20), seed: u64) {
            let mut model = HddModel::new(HddParams::default(), 4 * GIB);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let plan = model.plan(Op::Read, offset, len, &mut rng);
            prop_assert_eq!(plan.seek + plan.rotation + plan.transfer, plan.completion);
            prop_assert!(plan.rotation < model.params().revolution());
            prop_assert_eq!(model.head(), offset + len);
        }
    }
}
