//! The cloud-volume model: a throttled network volume with byte-rate and IOPS caps.
//!
//! Such a volume pipelines requests: each one occupies the throttle for `max(len / rate,
//! 1 / iops)`, and its reply arrives a fixed network latency after it leaves the throttle.
//! Position does not matter.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Op, ServiceOrder, ServicePlan};
use crate::error::ModelError;

/// Parameters of the cloud model, as read from the `[cloud]` table of a model file.
///
/// The defaults resemble a small general-purpose cloud volume: 125 MB/s, 3000 IOPS, 1 ms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudParams {
    /// Throughput cap in MB/s (10^6 bytes per second), reads and writes alike.
    pub rate_mb_s: f64,
    /// Cap on requests per second.
    pub iops: f64,
    /// Latency added to every request after the throttle (network and backend), in ms.
    pub base_latency_ms: f64,
    /// How many requests the volume accepts at once.
    pub queue_depth: u32,
    /// The order in which queued requests enter the throttle.
    pub order: ServiceOrder,
}

impl Default for CloudParams {
    fn default() -> Self {
        Self {
            rate_mb_s: 125.0,
            iops: 3000.0,
            base_latency_ms: 1.0,
            queue_depth: 32,
            order: ServiceOrder::Fifo,
        }
    }
}

impl CloudParams {
    /// Checks the parameters; the error names the offending field.
    pub fn validate(&self) -> Result<(), ModelError> {
        for (field, value) in [
            ("cloud.rate_mb_s", self.rate_mb_s),
            ("cloud.iops", self.iops),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(ModelError::Invalid {
                    field,
                    reason: format!("must be a positive number, got {value}"),
                });
            }
        }
        if !(self.base_latency_ms.is_finite() && self.base_latency_ms >= 0.0) {
            return Err(ModelError::Invalid {
                field: "cloud.base_latency_ms",
                reason: format!("must be zero or positive, got {}", self.base_latency_ms),
            });
        }
        super::check_queue_depth("cloud.queue_depth", self.queue_depth)
    }

    /// Time a request of `len` bytes holds the throttle.
    #[must_use]
    pub fn occupancy(&self, len: u64) -> Duration {
        #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
        let transfer = len as f64 / (self.rate_mb_s * 1e6);
        Duration::from_secs_f64(transfer.max(1.0 / self.iops))
    }

    /// Expected latency of a lone request of `len` bytes.
    #[must_use]
    pub fn expected_service(&self, len: u64) -> Duration {
        self.occupancy(len) + Duration::from_secs_f64(self.base_latency_ms / 1e3)
    }

    /// Plans one request.
    #[must_use]
    pub fn plan(&self, _op: Op, len: u64) -> ServicePlan {
        let occupancy = self.occupancy(len);
        let latency = Duration::from_secs_f64(self.base_latency_ms / 1e3);
        ServicePlan {
            seek: Duration::ZERO,
            rotation: Duration::ZERO,
            transfer: occupancy,
            latency,
            occupancy,
            completion: occupancy + latency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_requests_are_iops_bound_and_large_ones_rate_bound() {
        let p = CloudParams::default();
        p.validate().unwrap();
        assert!((p.occupancy(4096).as_secs_f64() - 1.0 / 3000.0).abs() < 1e-9);
        assert!((p.occupancy(1 << 20).as_secs_f64() - f64::from(1u32 << 20) / 125e6).abs() < 1e-9);
    }

    #[test]
    fn validation_names_the_field() {
        let p = CloudParams {
            iops: 0.0,
            ..CloudParams::default()
        };
        assert!(p.validate().unwrap_err().to_string().contains("cloud.iops"));
    }

    proptest! {
        #[test]
        fn occupancy_is_monotone_in_length(a in 0u64..(64 << 20), b in 0u64..(64 << 20)) {
            let p = CloudParams::default();
            let (small, large) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(p.occupancy(small) <= p.occupancy(large));
        }
    }
}
