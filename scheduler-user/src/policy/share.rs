//! Admission by a share of a configured capacity: what a disk without a measured model gets.
//!
//! The ABISS slides' simplest admission: real-time streams may reserve a share of the disk's
//! sustained rate, and the rest always stays for best effort.

/// Why a stream was refused by share admission, with the figures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a stream of {requested_bps} B/s does not fit on {device}: {available_bps} B/s of its {budget_bps} B/s real-time budget ({share_percent}% of {capacity_bps} B/s) is free; ask for less, or detach another stream")]
pub(crate) struct ShareRefusal {
    /// The device's name.
    pub(crate) device: String,
    /// The rate asked for.
    pub(crate) requested_bps: u64,
    /// What is still free.
    pub(crate) available_bps: u64,
    /// The real-time budget.
    pub(crate) budget_bps: u64,
    /// The device capacity.
    pub(crate) capacity_bps: u64,
    /// The real-time share in percent.
    pub(crate) share_percent: u32,
}

/// Share-of-capacity admission for a device without a model: a configured capacity, of which
/// a configured share may be reserved by real-time streams.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ShareAdmission {
    /// The device's name, for messages.
    pub(crate) device: String,
    /// Sustained capacity of the device in B/s.
    pub(crate) capacity_bps: u64,
    /// Share of the capacity real-time streams may reserve, in percent (1 to 95: some is always
    /// kept for best-effort traffic).
    pub(crate) share_percent: u32,
}

impl ShareAdmission {
    /// Most that real-time streams may reserve together.
    #[must_use]
    pub(crate) fn budget_bps(&self) -> u64 {
        let share = u128::from(self.share_percent.clamp(1, 95));
        u64::try_from(u128::from(self.capacity_bps) * share / 100).unwrap_or(u64::MAX)
    }

    /// Whether a stream of `requested_bps` fits next to `reserved_bps` already admitted.
    pub(crate) fn admit(&self, reserved_bps: u64, requested_bps: u64) -> Result<(), ShareRefusal> {
        let available = self.budget_bps().saturating_sub(reserved_bps);
        if requested_bps <= available {
            Ok(())
        } else {
            Err(ShareRefusal {
                device: self.device.clone(),
                requested_bps,
                available_bps: available,
                budget_bps: self.budget_bps(),
                capacity_bps: self.capacity_bps,
                share_percent: self.share_percent.clamp(1, 95),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn device() -> ShareAdmission {
        ShareAdmission {
            device: "sda".into(),
            capacity_bps: 40_000_000,
            share_percent: 80,
        }
    }
    #[test]
    fn share_refusals_name_the_figures() {
        let error = device().admit(30_000_000, 4_000_000).unwrap_err();
        assert_eq!(error.available_bps, 2_000_000);
        let message = error.to_string();
        assert!(
            message.contains("4000000") && message.contains("2000000") && message.contains("80%"),
            "{message}"
        );
    }

    proptest! {
        /// Admitting streams one by one never reserves more than the budget, and never all of
        /// the capacity.
        #[test]
        fn share_admitted_streams_fit_the_budget(rates in proptest::collection::vec(1u64..20_000_000, 1..50),
                                                 share in 1u32..=100) {
            let admission = ShareAdmission { share_percent: share, ..device() };
            let mut reserved = 0u64;
            for rate in rates {
                if admission.admit(reserved, rate).is_ok() {
                    reserved += rate;
                }
                prop_assert!(reserved <= admission.budget_bps());
                prop_assert!(reserved < admission.capacity_bps);
            }
        }
    }
}
