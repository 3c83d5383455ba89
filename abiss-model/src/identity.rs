//! A stable name of a disk, read from sysfs, and where the disk's model file lives.

use std::fmt;
use std::path::{Path, PathBuf};

use abiss_proto::DeviceNumber;
use serde::{Deserialize, Serialize};

use crate::ModelError;

/// Where abissd and `abissctl profile --save` keep device models unless told otherwise. It is
/// persistent state (systemd's `StateDirectory=abiss`): a model takes minutes to measure and
/// describes the disk, so it must survive a reboot, unlike the crash state under `/run/abiss`.
pub const DEFAULT_MODEL_DIR: &str = "/var/lib/abiss/models";

/// A stable name of a device: its WWN or serial number if the kernel knows one, else its
/// device number and size (which a loop device, say, keeps only until it is detached).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceIdentity {
    /// `wwn-…`, `serial-…` or `dev-MAJOR_MINOR-SIZE`; only `[A-Za-z0-9._-]`, usable as a file name.
    pub key: String,
    /// The device number it had when measured.
    pub device: DeviceNumber,
    /// Its size in bytes.
    pub size_bytes: u64,
}

impl DeviceIdentity {
    /// Reads the identity of whole disk `device` from sysfs.
    pub fn of(device: DeviceNumber) -> Result<Self, ModelError> {
        let sys = PathBuf::from(format!("/sys/dev/block/{device}"));
        let sectors: u64 = std::fs::read_to_string(sys.join("size"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| ModelError::NoIdentity {
                device,
                reason: "its size cannot be read from sysfs".into(),
            })?;
        let size_bytes = sectors.saturating_mul(512);
        let read = |name: &str| -> Option<String> {
            let text = std::fs::read_to_string(sys.join(name)).ok()?;
            let clean = file_name_safe(text.trim());
            (!clean.trim_matches('_').is_empty()).then_some(clean)
        };
        let key = read("wwid")
            .or_else(|| read("device/wwid"))
            .map(|w| format!("wwn-{w}"))
            .or_else(|| {
                read("serial")
                    .or_else(|| read("device/serial"))
                    .map(|s| format!("serial-{s}"))
            })
            .unwrap_or_else(|| format!("dev-{}_{}-{size_bytes}", device.major, device.minor));
        Ok(Self {
            key,
            device,
            size_bytes,
        })
    }

    /// Where the model of this device lives in the model directory `model_dir`.
    #[must_use]
    pub fn model_path(&self, model_dir: &Path) -> PathBuf {
        model_dir.join(format!("{}.json", self.key))
    }

    /// Whether `other` names the same device.
    #[must_use]
    pub fn same_device(&self, other: &Self) -> bool {
        self.key == other.key && self.size_bytes == other.size_bytes
    }
}

impl fmt::Display for DeviceIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, {} bytes)",
            self.key, self.device, self.size_bytes
        )
    }
}

/// `text` with every character outside `[A-Za-z0-9._-]` replaced by `_`.
fn file_name_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_names_become_file_names() {
        assert_eq!(file_name_safe("ST1000 LM/024 x"), "ST1000_LM_024_x");
        assert_eq!(file_name_safe("naa.5000c500-a_1"), "naa.5000c500-a_1");
    }

    #[test]
    fn the_model_file_is_named_by_the_key_in_the_model_directory() {
        let identity = crate::fixtures::laptop_identity();
        assert_eq!(
            identity.model_path(Path::new(DEFAULT_MODEL_DIR)),
            Path::new("/var/lib/abiss/models/dev-7_0-4294967296.json")
        );
    }
}
