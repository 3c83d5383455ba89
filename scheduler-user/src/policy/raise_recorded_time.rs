//! A time in a raise's record: the plain count of nanoseconds on `CLOCK_MONOTONIC` that
//! records always held, so a restarted daemon reads its predecessor's records.

use scheduler_common::MonotonicNs;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's `with` hands the field by reference"
)]
pub(super) fn serialize<S: Serializer>(time: &MonotonicNs, to: S) -> Result<S::Ok, S::Error> {
    time.0.serialize(to)
}

pub(super) fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<MonotonicNs, D::Error> {
    u64::deserialize(from).map(MonotonicNs)
}

/// The same for a time a record may lack.
pub(super) mod optional {
    use scheduler_common::MonotonicNs;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[expect(
        clippy::ref_option,
        reason = "serde's `with` hands the field by reference"
    )]
    pub(in super::super) fn serialize<S: Serializer>(
        time: &Option<MonotonicNs>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        time.map(|time| time.0).serialize(to)
    }

    pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<Option<MonotonicNs>, D::Error> {
        Option::<u64>::deserialize(from).map(|time| time.map(MonotonicNs))
    }
}
