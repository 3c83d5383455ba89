//! A model shaped like the lab's laptop disk, written once for the tests of this crate and of
//! its users (they enable the `fixtures` feature as a dev-dependency).

use abiss_proto::DeviceNumber;

use crate::{DeviceIdentity, DeviceModel, SeekCurve, ZonePoint};

/// One revolution of the laptop disk's platter at 5400 rpm, ms.
pub const LAPTOP_REVOLUTION_MS: f64 = 60_000.0 / 5400.0;

/// The identity the fixture model carries: `loop0` (7:0), 4 GiB, no serial number.
#[must_use]
pub fn laptop_identity() -> DeviceIdentity {
    DeviceIdentity {
        key: "dev-7_0-4294967296".into(),
        device: DeviceNumber { major: 7, minor: 0 },
        size_bytes: 4 << 30,
    }
}

/// A model shaped like the lab's laptop hdd, with `scale` on its transfer rates and one
/// revolution taking `revolution_ms`.
///
/// Sixteen zones from 60 MB/s (outer) down to 35 MB/s (inner), times `scale`; writes not
/// measured, at 0.9 of the read rate; seeks of 1 ms at the shortest distance, 6 ms at a fifth
/// of the disk and 11.5 ms over all of it; no measured points, and a mean access time of 0
/// (so no overhead beyond seek and rotation).
#[must_use]
pub fn laptop_disk(scale: f64, revolution_ms: f64) -> DeviceModel {
    let zones = (0..16)
        .map(|i| ZonePoint {
            position: (f64::from(i) + 0.5) / 16.0,
            read_bps: (60.0 - 25.0 / 15.0 * f64::from(i)) * 1e6 * scale,
            write_bps: None,
        })
        .collect();
    DeviceModel {
        zones,
        seek: SeekCurve {
            min_ms: 1.0,
            knee_fraction: 0.2,
            knee_ms: 6.0,
            full_stroke_ms: 11.5,
        },
        revolution_ms,
        write_read_ratio: 0.9,
        ..DeviceModel::conservative_default(laptop_identity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_laptop_disk_is_a_valid_model() {
        for scale in [0.2, 1.0, 3.0] {
            for revolution_ms in [0.0, LAPTOP_REVOLUTION_MS, 20.0] {
                let model = laptop_disk(scale, revolution_ms);
                assert_eq!(model.validate(), Ok(()));
                assert!((model.max_read_bps() - 60e6 * scale).abs() < 1.0);
                assert!((model.min_read_bps() - 35e6 * scale).abs() < 1.0);
            }
        }
    }
}
