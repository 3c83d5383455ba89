//! Locked memory and address space are admitted like disk time.
//!
//! A stream's playout buffer is locked in memory (`mlock`): at most its buffer plus one batch
//! (the playout buffer's invariant). Memory is the machine's, not the disk's, so it has a
//! budget of its own: one for all streams together, and one for each user, so that no local
//! user can lock the machine's memory away (32 sparse 1 GiB files once locked 23.5 GiB, all of
//! a 24 GiB machine, and the kernel killed abissd). Root's streams count against the total.
//!
//! A read stream maps its whole file, and room for it to grow (`mapped_file`): no memory, but
//! address space, of which abissd has 128 TiB. A sparse file of 16 TiB costs its owner
//! nothing, and eight streams of it would fill that space: every other user's attach would
//! then fail to map its file. So mappings have budgets of their own, of the same shape.

/// The locked-memory budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LockedMemoryBudget {
    /// Most bytes all streams together may lock.
    pub(crate) total_bytes: u64,
    /// Most bytes the streams of one user other than root may lock.
    pub(crate) per_user_bytes: u64,
}

/// Why a stream's buffer does not fit, with the figures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MemoryRefusal {
    /// The machine-wide budget is spent.
    #[error("a stream locking {wanted_bytes} bytes (its buffer, a batch and any preroll) does not fit: {free_bytes} of the {budget_bytes} bytes abissd may lock for all streams are free; ask for a smaller --buffer or --preroll, or detach a stream")]
    Total {
        /// What the stream would lock.
        wanted_bytes: u64,
        /// What is free.
        free_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// The user's budget is spent.
    #[error("a stream locking {wanted_bytes} bytes (its buffer, a batch and any preroll) does not fit: {free_bytes} of the {budget_bytes} bytes one user's streams may lock are free; ask for a smaller --buffer or --preroll, or detach one of yours")]
    User {
        /// What the stream would lock.
        wanted_bytes: u64,
        /// What is free.
        free_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// The address space all streams may map is spent.
    #[error("a stream mapping {wanted_bytes} bytes of address space (its file and room to grow) does not fit: {free_bytes} of the {budget_bytes} bytes abissd maps for all streams are free; stream a smaller file, or detach a stream")]
    AddressTotal {
        /// What the stream would map.
        wanted_bytes: u64,
        /// What is free.
        free_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
    /// The address space one user's streams may map is spent.
    #[error("a stream mapping {wanted_bytes} bytes of address space (its file and room to grow) does not fit: {free_bytes} of the {budget_bytes} bytes abissd maps for one user's streams are free; stream a smaller file, or detach one of yours")]
    AddressUser {
        /// What the stream would map.
        wanted_bytes: u64,
        /// What is free.
        free_bytes: u64,
        /// The budget.
        budget_bytes: u64,
    },
}

/// Which budget a stream overran, with the free bytes.
enum Overrun {
    Total(u64),
    User(u64),
}

/// Whether `wanted_bytes` of `uid` fits budgets of `total_bytes` and `per_user_bytes` (root
/// has none), next to `used_total` and `used_by_user`.
fn check(
    (total_bytes, per_user_bytes): (u64, u64),
    uid: u32,
    wanted_bytes: u64,
    used_total: u64,
    used_by_user: u64,
) -> Result<(), Overrun> {
    let free_total = total_bytes.saturating_sub(used_total);
    if wanted_bytes > free_total {
        return Err(Overrun::Total(free_total));
    }
    let free_user = per_user_bytes.saturating_sub(used_by_user);
    if uid != 0 && wanted_bytes > free_user {
        return Err(Overrun::User(free_user));
    }
    Ok(())
}

/// What a stream with `buffer_bytes` and batches of `batch_bytes` may lock at most.
#[must_use]
pub(crate) fn locked_at_most(buffer_bytes: u64, batch_bytes: u64) -> u64 {
    buffer_bytes.saturating_add(batch_bytes)
}

impl LockedMemoryBudget {
    /// The defaults for a machine with `ram_bytes` of memory: a quarter of it for all streams,
    /// and a quarter of that for one user.
    #[must_use]
    pub(crate) fn for_ram(ram_bytes: u64) -> Self {
        let total_bytes = ram_bytes / 4;
        Self {
            total_bytes,
            per_user_bytes: total_bytes / 4,
        }
    }

    /// Whether a stream of `uid` that locks up to `wanted_bytes` fits next to streams that
    /// lock up to `locked_total` together and `locked_by_user` for this user.
    pub(crate) fn admit(
        &self,
        uid: u32,
        wanted_bytes: u64,
        locked_total: u64,
        locked_by_user: u64,
    ) -> Result<(), MemoryRefusal> {
        let budgets = (self.total_bytes, self.per_user_bytes);
        check(budgets, uid, wanted_bytes, locked_total, locked_by_user).map_err(|overrun| {
            match overrun {
                Overrun::Total(free_bytes) => MemoryRefusal::Total {
                    wanted_bytes,
                    free_bytes,
                    budget_bytes: self.total_bytes,
                },
                Overrun::User(free_bytes) => MemoryRefusal::User {
                    wanted_bytes,
                    free_bytes,
                    budget_bytes: self.per_user_bytes,
                },
            }
        })
    }
}

/// The address-space budgets of read streams' mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AddressSpaceBudget {
    /// Most bytes all streams' mappings together may take.
    pub(crate) total_bytes: u64,
    /// Most bytes the mappings of one user other than root may take.
    pub(crate) per_user_bytes: u64,
}

impl AddressSpaceBudget {
    /// Half of a process's 128 TiB (47-bit) address space for all streams, a quarter of that
    /// for one user: room for 256 streams with their 64 GiB to grow each (16 TiB), and for any
    /// user's media files many times over.
    pub(crate) const DEFAULT: Self = Self {
        total_bytes: 64 << 40,
        per_user_bytes: 16 << 40,
    };

    /// Whether a stream of `uid` that maps `wanted_bytes` fits next to mappings of
    /// `mapped_total` together and `mapped_by_user` for this user.
    pub(crate) fn admit(
        &self,
        uid: u32,
        wanted_bytes: u64,
        mapped_total: u64,
        mapped_by_user: u64,
    ) -> Result<(), MemoryRefusal> {
        let budgets = (self.total_bytes, self.per_user_bytes);
        check(budgets, uid, wanted_bytes, mapped_total, mapped_by_user).map_err(|overrun| {
            match overrun {
                Overrun::Total(free_bytes) => MemoryRefusal::AddressTotal {
                    wanted_bytes,
                    free_bytes,
                    budget_bytes: self.total_bytes,
                },
                Overrun::User(free_bytes) => MemoryRefusal::AddressUser {
                    wanted_bytes,
                    free_bytes,
                    budget_bytes: self.per_user_bytes,
                },
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn refusals_name_the_free_bytes_and_the_budget() {
        let budget = LockedMemoryBudget {
            total_bytes: 1000,
            per_user_bytes: 300,
        };
        let user = budget.admit(1000, 200, 100, 200).unwrap_err();
        assert_eq!(
            user,
            MemoryRefusal::User {
                wanted_bytes: 200,
                free_bytes: 100,
                budget_bytes: 300
            }
        );
        assert!(user.to_string().contains("100 of the 300 bytes"));
        assert!(
            budget.admit(0, 200, 100, 200).is_ok(),
            "root has no user budget"
        );
        assert!(matches!(
            budget.admit(0, 901, 100, 0),
            Err(MemoryRefusal::Total {
                free_bytes: 900,
                ..
            })
        ));
        assert_eq!(
            LockedMemoryBudget::for_ram(24 << 30).per_user_bytes,
            1536 << 20
        );
    }

    proptest! {
        /// Admitting buffers one by one, for any users, never locks more than the budgets.
        #[test]
        fn admitted_buffers_stay_within_both_budgets(
            requests in proptest::collection::vec((0u32..4, 1u64..(1 << 31)), 1..100),
            total in 1u64..(1 << 34),
        ) {
            let budget = LockedMemoryBudget { total_bytes: total, per_user_bytes: total / 3 };
            let mut by_user = [0u64; 4];
            for (uid, wanted) in requests {
                let locked: u64 = by_user.iter().sum();
                let index = uid as usize;
                if budget.admit(uid, wanted, locked, by_user[index]).is_ok() {
                    by_user[index] += wanted;
                }
                prop_assert!(by_user.iter().sum::<u64>() <= budget.total_bytes);
                for (user, locked) in by_user.iter().enumerate().skip(1) {
                    prop_assert!(*locked <= budget.per_user_bytes, "user {}", user);
                }
            }
        }

        /// Mappings admitted one by one, for any users and file sizes up to ext4's 16 TiB,
        /// never take more than the address-space budgets.
        #[test]
        fn admitted_mappings_stay_within_both_budgets(
            requests in proptest::collection::vec((0u32..4, 1u64..(17 << 40)), 1..100),
        ) {
            let budget = AddressSpaceBudget::DEFAULT;
            let mut by_user = [0u64; 4];
            for (uid, wanted) in requests {
                let mapped: u64 = by_user.iter().sum();
                let index = uid as usize;
                if budget.admit(uid, wanted, mapped, by_user[index]).is_ok() {
                    by_user[index] += wanted;
                }
                prop_assert!(by_user.iter().sum::<u64>() <= budget.total_bytes);
                for (user, mapped) in by_user.iter().enumerate().skip(1) {
                    prop_assert!(*mapped <= budget.per_user_bytes, "user {}", user);
                }
            }
        }
    }

    #[test]
    fn a_sparse_file_of_ext4s_largest_size_maps_once_per_user_at_most() {
        let budget = AddressSpaceBudget::DEFAULT;
        // ext4's largest file and the 64 GiB a mapping leaves to grow into.
        let file = (16 << 40) - 4096 + (64 << 30);
        let refusal = budget.admit(1000, file, 0, 0).unwrap_err();
        assert!(matches!(refusal, MemoryRefusal::AddressUser { .. }));
        assert!(refusal.to_string().contains("address space"), "{refusal}");
        let half = (8 << 40) + (64 << 30);
        assert!(budget.admit(1000, half, 0, 0).is_ok());
        assert!(budget.admit(1000, half, half, half).is_err());
        assert!(
            budget.admit(0, half, half, half).is_ok(),
            "root has no user budget"
        );
    }
}
