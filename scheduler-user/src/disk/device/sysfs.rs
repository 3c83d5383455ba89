//! Reading and writing the one-value files of sysfs (and debugfs).

use std::fs;
use std::io;
use std::path::Path;

use super::error::DeviceError;

/// Where sysfs is mounted.
pub(crate) const SYSFS: &str = "/sys";

pub(super) fn read_trimmed(path: &Path) -> Result<String, DeviceError> {
    fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .map_err(|source| DeviceError::Read {
            path: path.to_path_buf(),
            source,
        })
}

pub(super) fn read_number(path: &Path) -> Result<u32, DeviceError> {
    let text = read_trimmed(path)?;
    text.parse().map_err(|_| DeviceError::Unparsable {
        path: path.to_path_buf(),
        content: text,
    })
}

pub(super) fn write_value(path: &Path, value: &str) -> Result<(), DeviceError> {
    abiss_os::sysfs::write_attr(path, value).map_err(|source| {
        if source.kind() == io::ErrorKind::PermissionDenied {
            DeviceError::PermissionDenied {
                path: path.to_path_buf(),
            }
        } else {
            DeviceError::Write {
                path: path.to_path_buf(),
                value: value.to_owned(),
                source,
            }
        }
    })
}
