//! The measured model of a disk: what `abissctl profile` fits and saves, and what abissd's
//! admission control loads and computes with.
//!
//! | module | what |
//! | --- | --- |
//! | [`identity`] | [`DeviceIdentity`]: a stable name of a disk, read from sysfs, and where its model file lives |
//! | [`model`] | [`DeviceModel`] and its measured points, the seek-curve mathematics, checking, loading and saving a model file |
//! | [`access`] | [`AccessTimes`]: a model's time to reach a block (ordered and random seeks, rotation, overhead), built once and asked often |
//! | [`fit`](mod@fit) | fitting a model to raw [`Measurements`] (arithmetic only; the measuring is `abissctl`'s) |
//! | `fixtures` | a model shaped like the lab's laptop disk, for tests (`cfg(test)` or the `fixtures` feature) |
//!
//! The model's shape is TRAC's (Zimmermann & Fu, "Comprehensive Statistical Admission Control
//! for Streaming Media Servers", reference 000): a multi-zone transfer-rate profile for reads
//! and writes, and an access-time profile against seek distance with the rotational latency on
//! top. The measurements it is fitted to follow Johnson & Miller ("Performance Measurements of
//! Tertiary Storage Devices", reference 003): transfer rate against position and request size,
//! access time against distance for short and long seeks, and the effect of requests in flight.
//!
//! The protocol crate (`abiss-proto`) knows nothing of this one; this one takes only its units
//! (`DeviceNumber`) from there.
#![deny(missing_docs)]

pub mod access;
pub mod fit;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod identity;
pub mod model;

pub use access::AccessTimes;
pub use fit::{fit, fit_seek_curve, Measurements};
pub use identity::{DeviceIdentity, DEFAULT_MODEL_DIR};
pub use model::{
    DeviceModel, ModelError, QueueDepthPoint, RequestSizePoint, SeekCurve, SeekPoint, ZonePoint,
    ASSUMED_WRITE_READ_RATIO, DEVICE_MODEL_VERSION,
};
