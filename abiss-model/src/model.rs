//! [`DeviceModel`]: what `abissctl profile` measured and fitted, and the arithmetic
//! admission control does with it.
//!
//! A model is saved as JSON per device in the model directory
//! (`/var/lib/abiss/models/<identity>.json` by default). Loading checks the format version and that the file
//! describes the device it is loaded for: a corrupt file, or one of another device, is an
//! error and never used. The JSON field names and [`DEVICE_MODEL_VERSION`] are the file
//! format: models saved earlier must keep loading.

use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use serde::{Deserialize, Serialize};

use crate::DeviceIdentity;

/// Version of the model file format; a file of another version is refused.
pub const DEVICE_MODEL_VERSION: u32 = 1;

/// The write rate as a fraction of the read rate assumed when writes were not measured
/// (conservative for disks: TRAC's Cheetah X15 measured 0.67 to 0.76).
pub const ASSUMED_WRITE_READ_RATIO: f64 = 0.6;

/// Sequential transfer rate measured at one position.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZonePoint {
    /// Where, as a fraction of the capacity (0 = LBA 0).
    pub position: f64,
    /// Sequential read rate there, B/s.
    pub read_bps: f64,
    /// Sequential write rate there, B/s, if writes were measured.
    pub write_bps: Option<f64>,
}

/// Mean access time measured at one seek distance.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeekPoint {
    /// Distance as a fraction of the capacity.
    pub distance: f64,
    /// Mean time to the first byte of a small read (seek plus rotation), ms.
    pub access_ms: f64,
    /// Reads measured.
    pub samples: u32,
}

/// Seek time against distance `d` (a fraction of the capacity): `min + (knee − min)·√(d/knee)`
/// for short seeks, linear from the knee to the full stroke for long ones (the shape Johnson &
/// Miller and TRAC fit). The rotational latency is not part of it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeekCurve {
    /// Seek time of the shortest non-zero distance, ms.
    pub min_ms: f64,
    /// Where short seeks turn into long ones, as a fraction of the capacity.
    pub knee_fraction: f64,
    /// Seek time at the knee, ms.
    pub knee_ms: f64,
    /// Seek time over the whole capacity, ms.
    pub full_stroke_ms: f64,
}

impl SeekCurve {
    /// Seek time over `distance` (clamped to 0..=1), ms; 0 for no distance.
    #[must_use]
    pub fn seek_ms(&self, distance: f64) -> f64 {
        let d = distance.clamp(0.0, 1.0);
        if d <= 0.0 {
            return 0.0;
        }
        let knee = self.knee_fraction.clamp(1e-6, 1.0 - 1e-6);
        if d < knee {
            self.min_ms + (self.knee_ms - self.min_ms) * (d / knee).sqrt()
        } else {
            self.knee_ms + (self.full_stroke_ms - self.knee_ms) * (d - knee) / (1.0 - knee)
        }
    }

    /// Mean and variance (ms, ms²) of the seek time between two positions drawn uniformly
    /// over the disk (random placement, as in TRAC): the distance has density `2(1 − x)`.
    #[must_use]
    pub fn random_seek_moments(&self) -> (f64, f64) {
        const STEPS: u32 = 4000;
        let (mut mean, mut square) = (0.0, 0.0);
        for i in 0..STEPS {
            let x = (f64::from(i) + 0.5) / f64::from(STEPS);
            let weight = 2.0 * (1.0 - x) / f64::from(STEPS);
            let t = self.seek_ms(x);
            mean += weight * t;
            square += weight * t * t;
        }
        (mean, (square - mean * mean).max(0.0))
    }
}

/// Throughput of random reads of one size at queue depth 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestSizePoint {
    /// Request size, bytes.
    pub bytes: u64,
    /// Mean service time of one request, ms.
    pub service_ms: f64,
}

/// Random reads with several requests in flight.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueDepthPoint {
    /// Requests in flight.
    pub depth: u32,
    /// Mean device time per request (elapsed time over requests), ms.
    pub service_ms: f64,
    /// Size of each request, bytes.
    pub request_bytes: u64,
}

/// A device model: what `abissctl profile` measured and fitted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceModel {
    /// [`DEVICE_MODEL_VERSION`].
    pub version: u32,
    /// The device measured.
    pub identity: DeviceIdentity,
    /// When, in seconds since the Unix epoch.
    pub measured_at_unix_s: u64,
    /// Whether it was a `--quick` profile.
    pub quick: bool,
    /// Sequential rate against position, ordered by position.
    pub zones: Vec<ZonePoint>,
    /// Write rate over read rate (TRAC's β): measured, or [`ASSUMED_WRITE_READ_RATIO`].
    pub write_read_ratio: f64,
    /// Whether `write_read_ratio` was measured.
    pub writes_measured: bool,
    /// Mean access time against seek distance, as measured.
    pub seek_points: Vec<SeekPoint>,
    /// The seek curve fitted to them (rotation taken out).
    pub seek: SeekCurve,
    /// One revolution of the platter (the rotational latency is uniform over it), ms; 0 for a
    /// device that does not rotate.
    pub revolution_ms: f64,
    /// Mean access time of random small reads all over the device at queue depth 1, ms.
    pub mean_access_ms: f64,
    /// Standard deviation of that access time, ms.
    pub access_stdev_ms: f64,
    /// Random reads by request size.
    pub request_sizes: Vec<RequestSizePoint>,
    /// Random reads by requests in flight.
    pub queue_depths: Vec<QueueDepthPoint>,
}

/// Why a model cannot be had or used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The device's identity cannot be read.
    #[error("cannot identify device {device}: {reason}")]
    NoIdentity {
        /// The device.
        device: DeviceNumber,
        /// Why.
        reason: String,
    },
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a model (corrupt, truncated, another format version, impossible figures).
    #[error("{path} is not a usable device model ({reason}); profile the device again with `abissctl profile DEV --save`")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file describes another device.
    #[error("{path} describes device {found}, not {expected}; profile this device with `abissctl profile DEV --save`")]
    OtherDevice {
        /// The file.
        path: PathBuf,
        /// The device it should describe.
        expected: String,
        /// The device it describes.
        found: String,
    },
}

fn finite_positive(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

impl DeviceModel {
    /// Checks that the figures make sense; the reason names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != DEVICE_MODEL_VERSION {
            return Err(format!(
                "format version {} where {DEVICE_MODEL_VERSION} is expected",
                self.version
            ));
        }
        if self.zones.is_empty() {
            return Err("no zone profile".into());
        }
        for zone in &self.zones {
            if !(0.0..=1.0).contains(&zone.position) || !finite_positive(zone.read_bps) {
                return Err(format!("impossible zone point {zone:?}"));
            }
            if zone.write_bps.is_some_and(|w| !finite_positive(w)) {
                return Err(format!("impossible zone write rate {zone:?}"));
            }
        }
        if !(finite_positive(self.write_read_ratio) && self.write_read_ratio <= 2.0) {
            return Err(format!(
                "write_read_ratio {} is not in (0, 2]",
                self.write_read_ratio
            ));
        }
        let seek = &self.seek;
        if !(seek.min_ms.is_finite()
            && seek.min_ms >= 0.0
            && seek.knee_ms >= seek.min_ms
            && seek.full_stroke_ms >= seek.knee_ms
            && seek.full_stroke_ms.is_finite()
            && seek.knee_fraction > 0.0
            && seek.knee_fraction < 1.0)
        {
            return Err(format!("impossible seek curve {seek:?}"));
        }
        if !(self.revolution_ms.is_finite() && self.revolution_ms >= 0.0) {
            return Err(format!(
                "revolution_ms {} is impossible",
                self.revolution_ms
            ));
        }
        if !(self.mean_access_ms.is_finite()
            && self.mean_access_ms >= 0.0
            && self.access_stdev_ms.is_finite()
            && self.access_stdev_ms >= 0.0)
        {
            return Err("impossible access time".into());
        }
        if self
            .queue_depths
            .iter()
            .any(|q| q.depth == 0 || !finite_positive(q.service_ms))
        {
            return Err("impossible queue-depth point".into());
        }
        Ok(())
    }

    /// Reads and checks the model of `expected` from `path`.
    pub fn load(path: &Path, expected: &DeviceIdentity) -> Result<Self, ModelError> {
        let text = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        let corrupt = |reason: String| ModelError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        let model: Self = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
        model.validate().map_err(corrupt)?;
        if !model.identity.same_device(expected) {
            return Err(ModelError::OtherDevice {
                path: path.to_owned(),
                expected: expected.to_string(),
                found: model.identity.to_string(),
            });
        }
        Ok(model)
    }

    /// Loads the model of `identity` from `model_dir` if there is one (`Ok(None)` if not).
    pub fn find(model_dir: &Path, identity: &DeviceIdentity) -> Result<Option<Self>, ModelError> {
        let path = identity.model_path(model_dir);
        if !path.exists() {
            return Ok(None);
        }
        Self::load(&path, identity).map(Some)
    }

    /// Writes the model to its place in `model_dir` (atomically: a crash leaves the old file
    /// or the whole new one); returns the path.
    pub fn save(&self, model_dir: &Path) -> Result<PathBuf, ModelError> {
        let path = self.identity.model_path(model_dir);
        let io = |source| ModelError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = serde_json::to_vec_pretty(self).map_err(|e| io(std::io::Error::other(e)))?;
        abiss_os::fs::write_atomically(&path, &text).map_err(io)?;
        Ok(path)
    }

    /// Highest sequential read rate, B/s.
    #[must_use]
    pub fn max_read_bps(&self) -> f64 {
        self.zones.iter().map(|z| z.read_bps).fold(0.0, f64::max)
    }

    /// Lowest sequential read rate (the slowest zone), B/s.
    #[must_use]
    pub fn min_read_bps(&self) -> f64 {
        self.zones
            .iter()
            .map(|z| z.read_bps)
            .fold(f64::INFINITY, f64::min)
    }

    /// The zone profile as (share of the capacity, read rate) pieces: each point stands for
    /// the capacity up to halfway to its neighbours.
    fn zone_pieces(&self) -> Vec<(f64, f64)> {
        let n = self.zones.len();
        (0..n)
            .map(|i| {
                let low = if i == 0 {
                    0.0
                } else {
                    f64::midpoint(self.zones[i - 1].position, self.zones[i].position)
                };
                let high = if i + 1 == n {
                    1.0
                } else {
                    f64::midpoint(self.zones[i].position, self.zones[i + 1].position)
                };
                ((high - low).max(0.0), self.zones[i].read_bps)
            })
            .collect()
    }

    /// Mean and variance of the time per byte read at a uniformly random position (TRAC's
    /// transfer-rate random variable, as seconds per byte).
    #[must_use]
    pub fn seconds_per_byte_moments(&self) -> (f64, f64) {
        let pieces = self.zone_pieces();
        let total: f64 = pieces.iter().map(|(w, _)| w).sum();
        if total <= 0.0 {
            let r = self.min_read_bps();
            return (1.0 / r, 0.0);
        }
        let mean: f64 = pieces.iter().map(|(w, r)| w / total / r).sum();
        let square: f64 = pieces.iter().map(|(w, r)| w / total / (r * r)).sum();
        (mean, (square - mean * mean).max(0.0))
    }

    /// A conservative stand-in until the device is measured: a slow laptop disk (35 MB/s
    /// everywhere, 20 ms full stroke, 4200 rpm).
    #[must_use]
    pub fn conservative_default(identity: DeviceIdentity) -> Self {
        Self {
            version: DEVICE_MODEL_VERSION,
            identity,
            measured_at_unix_s: 0,
            quick: false,
            zones: vec![ZonePoint {
                position: 0.5,
                read_bps: 35e6,
                write_bps: None,
            }],
            write_read_ratio: ASSUMED_WRITE_READ_RATIO,
            writes_measured: false,
            seek_points: Vec::new(),
            seek: SeekCurve {
                min_ms: 2.0,
                knee_fraction: 0.2,
                knee_ms: 10.0,
                full_stroke_ms: 20.0,
            },
            revolution_ms: 60_000.0 / 4200.0,
            mean_access_ms: 0.0,
            access_stdev_ms: 0.0,
            request_sizes: Vec::new(),
            queue_depths: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{laptop_disk, LAPTOP_REVOLUTION_MS};

    #[test]
    fn random_seek_of_the_laptop_curve_is_about_six_and_a_half_ms() {
        let (mean, var) = laptop_disk(1.0, LAPTOP_REVOLUTION_MS)
            .seek
            .random_seek_moments();
        assert!((6.0..7.0).contains(&mean), "{mean}");
        assert!(var > 0.0);
    }

    #[test]
    fn save_and_load_round_trip_and_refuse_corrupt_or_foreign_files() {
        let dir = std::env::temp_dir().join(format!("abiss-model-test-{}", std::process::id()));
        let model = laptop_disk(1.0, LAPTOP_REVOLUTION_MS);
        let path = model.save(&dir).unwrap();
        assert_eq!(
            DeviceModel::find(&dir, &model.identity).unwrap(),
            Some(model.clone())
        );
        let other = DeviceIdentity {
            key: model.identity.key.clone(),
            size_bytes: 1 << 30,
            ..model.identity.clone()
        };
        assert!(matches!(
            DeviceModel::load(&path, &other),
            Err(ModelError::OtherDevice { .. })
        ));
        std::fs::write(&path, b"{\"version\": 1, \"zones\": [").unwrap();
        assert!(matches!(
            DeviceModel::load(&path, &model.identity),
            Err(ModelError::Corrupt { .. })
        ));
        let mut bad = model.clone();
        bad.zones[0].read_bps = -1.0;
        std::fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        let error = DeviceModel::load(&path, &model.identity).unwrap_err();
        assert!(error.to_string().contains("zone"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file as `abissctl profile --save` wrote it before the model had its own crate: the
    /// field names and the version are the format, and such files must keep loading.
    const SAVED_EARLIER: &str = r#"{
      "version": 1,
      "identity": {
        "device": { "major": 7, "minor": 0 },
        "key": "dev-7_0-4294967296",
        "size_bytes": 4294967296
      },
      "measured_at_unix_s": 1700000000,
      "quick": true,
      "zones": [
        { "position": 0.25, "read_bps": 60000000.0, "write_bps": 54000000.0 },
        { "position": 0.75, "read_bps": 35000000.0, "write_bps": null }
      ],
      "write_read_ratio": 0.9,
      "writes_measured": true,
      "seek_points": [ { "distance": 0.1, "access_ms": 9.5, "samples": 24 } ],
      "seek": { "min_ms": 1.0, "knee_fraction": 0.2, "knee_ms": 6.0, "full_stroke_ms": 11.5 },
      "revolution_ms": 11.1,
      "mean_access_ms": 12.3,
      "access_stdev_ms": 3.2,
      "request_sizes": [ { "bytes": 4096, "service_ms": 12.0 } ],
      "queue_depths": [ { "depth": 2, "service_ms": 9.0, "request_bytes": 65536 } ]
    }"#;

    #[test]
    fn a_model_saved_earlier_still_loads() {
        let dir = std::env::temp_dir().join(format!("abiss-model-old-{}", std::process::id()));
        let identity = crate::fixtures::laptop_identity();
        let path = identity.model_path(&dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, SAVED_EARLIER).unwrap();
        let model = DeviceModel::find(&dir, &identity).unwrap().unwrap();
        assert_eq!(model.version, DEVICE_MODEL_VERSION);
        assert_eq!(model.zones[0].write_bps, Some(54e6));
        assert_eq!(model.seek_points[0].samples, 24);
        assert_eq!(model.queue_depths[0].request_bytes, 65536);
        let again: DeviceModel =
            serde_json::from_slice(&serde_json::to_vec(&model).unwrap()).unwrap();
        assert_eq!(again, model);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
