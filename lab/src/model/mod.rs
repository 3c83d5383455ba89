//! Device models: pure functions from a request (and the device's state) to its service time.
//!
//! Nothing here does I/O or reads clocks, so the math is unit- and property-tested.

mod cloud;
mod hdd;

use std::path::Path;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

pub use cloud::CloudParams;
pub use hdd::{HddModel, HddParams};

use crate::error::ModelError;

/// Direction of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Data from the medium.
    Read,
    /// Data to the medium.
    Write,
}

/// The order in which a device serves the requests in its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceOrder {
    /// In order of arrival.
    Fifo,
    /// Elevator order (LOOK): the next request in the head's direction of travel, reversing
    /// at the last one, among the requests in the device queue.
    Scan,
}

/// Which device model to emulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// A rotating disk.
    Hdd,
    /// A throttled cloud volume.
    Cloud,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Hdd => "hdd",
            Self::Cloud => "cloud",
        })
    }
}

/// How one request is served, in components; all durations are from the request's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServicePlan {
    /// Arm movement.
    pub seek: Duration,
    /// Waiting for the sector to come under the head.
    pub rotation: Duration,
    /// Moving the data (for the cloud model: time in the throttle).
    pub transfer: Duration,
    /// Fixed latency after the medium (cloud network latency).
    pub latency: Duration,
    /// How long the request keeps the actuator (or throttle) from starting the next one.
    pub occupancy: Duration,
    /// When the reply is due.
    pub completion: Duration,
}

/// The model file: a documented TOML file with an optional table per model.
///
/// ```toml
/// seed = 1             # rotational latencies are drawn from a generator seeded with this
///
/// [hdd]
/// rpm = 5400.0
/// outer_rate_mb_s = 60.0
/// inner_rate_mb_s = 35.0
/// zones = 16
/// write_rate_fraction = 0.9
/// min_seek_ms = 1.0
/// seek_knee_fraction = 0.2
/// knee_seek_ms = 6.0
/// full_stroke_seek_ms = 11.5
/// queue_depth = 4
/// order = "scan"      # or "fifo"
///
/// [cloud]
/// rate_mb_s = 125.0
/// iops = 3000.0
/// base_latency_ms = 1.0
/// queue_depth = 32
/// order = "fifo"
/// ```
///
/// Every field is optional; missing ones take the defaults shown. `lab/models/default.toml`
/// is this file with comments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelFile {
    /// Seed of the random generator for rotational latency.
    pub seed: u64,
    /// The hdd model's parameters.
    pub hdd: HddParams,
    /// The cloud model's parameters.
    pub cloud: CloudParams,
}

impl Default for ModelFile {
    fn default() -> Self {
        Self {
            seed: 1,
            hdd: HddParams::default(),
            cloud: CloudParams::default(),
        }
    }
}

impl ModelFile {
    /// Parses and validates a model file's text; errors name the offending field.
    pub fn parse(text: &str) -> Result<Self, ModelError> {
        let deserializer = toml::Deserializer::new(text);
        let file: Self = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            ModelError::Syntax {
                field,
                message: inner.message().trim().to_owned(),
            }
        })?;
        file.hdd.validate()?;
        file.cloud.validate()?;
        Ok(file)
    }

    /// Reads, parses and validates a model file.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text)
    }

    /// The chosen model's specification.
    #[must_use]
    pub fn spec(&self, kind: ModelKind) -> ModelSpec {
        ModelSpec {
            kind,
            seed: self.seed,
            hdd: self.hdd.clone(),
            cloud: self.cloud.clone(),
        }
    }
}

fn check_queue_depth(field: &'static str, depth: u32) -> Result<(), ModelError> {
    if (1..=1024).contains(&depth) {
        Ok(())
    } else {
        Err(ModelError::Invalid {
            field,
            reason: format!("must be between 1 and 1024, got {depth}"),
        })
    }
}

/// A chosen model with all its parameters; what the emulator is started with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Which model.
    pub kind: ModelKind,
    /// Seed of the random generator.
    pub seed: u64,
    /// Parameters used when `kind` is hdd.
    pub hdd: HddParams,
    /// Parameters used when `kind` is cloud.
    pub cloud: CloudParams,
}

impl ModelSpec {
    /// The device queue depth of the chosen model.
    #[must_use]
    pub fn queue_depth(&self) -> u32 {
        match self.kind {
            ModelKind::Hdd => self.hdd.queue_depth,
            ModelKind::Cloud => self.cloud.queue_depth,
        }
    }

    /// The service order of the chosen model.
    #[must_use]
    pub fn order(&self) -> ServiceOrder {
        match self.kind {
            ModelKind::Hdd => self.hdd.order,
            ModelKind::Cloud => self.cloud.order,
        }
    }

    /// Whether the kernel should treat the device as rotational.
    #[must_use]
    pub fn rotational(&self) -> bool {
        self.kind == ModelKind::Hdd
    }

    /// A fresh model instance for a device of `capacity_bytes`.
    #[must_use]
    pub fn instantiate(&self, capacity_bytes: u64) -> DeviceModel {
        match self.kind {
            ModelKind::Hdd => DeviceModel::Hdd(HddModel::new(self.hdd.clone(), capacity_bytes)),
            ModelKind::Cloud => DeviceModel::Cloud(self.cloud.clone()),
        }
    }
}

/// A model instance with its state (the head position for a disk).
#[derive(Clone, Debug)]
pub enum DeviceModel {
    /// A rotating disk.
    Hdd(HddModel),
    /// A throttled cloud volume.
    Cloud(CloudParams),
}

impl DeviceModel {
    /// Plans one request that starts now, updating the state.
    pub fn plan(&mut self, op: Op, offset: u64, len: u64, rng: &mut impl Rng) -> ServicePlan {
        match self {
            Self::Hdd(model) => model.plan(op, offset, len, rng),
            Self::Cloud(params) => params.plan(op, len),
        }
    }

    /// The head position, for elevator order (0 for position-less devices).
    #[must_use]
    pub fn head(&self) -> u64 {
        match self {
            Self::Hdd(model) => model.head(),
            Self::Cloud(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(ModelFile::parse("").unwrap(), ModelFile::default());
    }

    #[test]
    fn shipped_default_file_matches_the_defaults() {
        let text = include_str!("../../models/default.toml");
        assert_eq!(ModelFile::parse(text).unwrap(), ModelFile::default());
    }

    #[test]
    fn type_error_names_the_field() {
        let err = ModelFile::parse("[hdd]\nrpm = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("hdd.rpm"), "{err}");
    }

    #[test]
    fn unknown_field_is_named() {
        let err = ModelFile::parse("[hdd]\nrpmm = 7200\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("rpmm"), "{err}");
    }

    #[test]
    fn bad_value_names_the_field() {
        let err = ModelFile::parse("[cloud]\nqueue_depth = 0\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("cloud.queue_depth"), "{err}");
    }
}
