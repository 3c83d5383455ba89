//! Block device names as users type them: `loop0`, `/dev/loop0` or `7:0`.

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use abiss_proto::DeviceNumber;

use crate::error::CliError;

/// Resolves a device as typed by the user to its number; it must exist on this machine.
pub fn resolve(spec: &str) -> Result<DeviceNumber, CliError> {
    let unknown = || {
        CliError::UnknownDevice(format!(
            "there is no block device '{spec}'; name one from `lsblk` as NAME, /dev/NAME or MAJOR:MINOR"
        ))
    };
    if let Ok(number) = spec.parse::<DeviceNumber>() {
        return if Path::new(&format!("/sys/dev/block/{number}")).exists() {
            Ok(number)
        } else {
            Err(unknown())
        };
    }
    if spec.starts_with('/') {
        let meta = std::fs::metadata(spec).map_err(|_| unknown())?;
        if !meta.file_type().is_block_device() {
            return Err(unknown());
        }
        let rdev = meta.rdev();
        return Ok(DeviceNumber {
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        });
    }
    if spec.contains('/') || spec.is_empty() {
        return Err(unknown());
    }
    let dev =
        std::fs::read_to_string(format!("/sys/class/block/{spec}/dev")).map_err(|_| unknown())?;
    dev.trim().parse().map_err(|_| unknown())
}

/// Names of block devices by number, read once from sysfs.
#[derive(Debug)]
pub struct DeviceNames {
    names: HashMap<DeviceNumber, String>,
    loaded: Instant,
}

impl DeviceNames {
    /// Reads `/sys/class/block`.
    #[must_use]
    pub fn load() -> Self {
        let mut names = HashMap::new();
        if let Ok(entries) = std::fs::read_dir("/sys/class/block") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Ok(dev) = std::fs::read_to_string(entry.path().join("dev")) {
                    if let Ok(number) = dev.trim().parse() {
                        names.insert(number, name);
                    }
                }
            }
        }
        Self {
            names,
            loaded: Instant::now(),
        }
    }

    /// The device's name, or its number when it has none (e.g. it went away). Devices that
    /// appeared since the last look are found by reading sysfs again, at most once a second.
    pub fn name(&mut self, device: DeviceNumber) -> String {
        if !self.names.contains_key(&device) && self.loaded.elapsed() > Duration::from_secs(1) {
            *self = Self::load();
        }
        self.names
            .get(&device)
            .cloned()
            .unwrap_or_else(|| device.to_string())
    }
}
