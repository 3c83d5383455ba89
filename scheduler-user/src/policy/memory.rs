//! Locked memory is admitted like disk time.
//!
//! A stream's playout buffer is locked in memory (`mlock`): at most its buffer plus one batch
//! (the playout buffer's invariant). Memory is the machine's, not the disk's, so it has a
//! budget of its own: one for all streams together, and one for each user, so that no local
//! user can lock the machine's memory away (32 sparse 1 GiB files once locked 23.5 GiB, all of
//! a 24 GiB machine, and the kernel killed abissd). Root's streams count against the total.

/// The locked-memory budgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockedMemoryBudget {
    /// Most bytes all streams together may lock.
    pub total_bytes: u64,
    /// Most bytes the streams of one user other than root may lock.
    pub per_user_bytes: u64,
}

/// Why a stream's buffer does not fit, with the figures.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemoryRefusal {
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
}

/// What a stream with `buffer_bytes` and batches of `batch_bytes` may lock at most.
#[must_use]
pub fn locked_at_most(buffer_bytes: u64, batch_bytes: u64) -> u64 {
    buffer_bytes.saturating_add(batch_bytes)
}

impl LockedMemoryBudget {
    /// The defaults for a machine with `ram_bytes` of memory: a quarter of it for all streams,
    /// and a quarter of that for one user.
    #[must_use]
    pub fn for_ram(ram_bytes: u64) -> Self {
        let total_bytes = ram_bytes / 4;
        Self {
            total_bytes,
            per_user_bytes: total_bytes / 4,
        }
    }

    /// Whether a stream of `uid` that locks up to `wanted_bytes` fits next to streams that
    /// lock up to `locked_total` together and `locked_by_user` for this user.
    pub fn admit(
        &self,
        uid: u32,
        wanted_bytes: u64,
        locked_total: u64,
        locked_by_user: u64,
    ) -> Result<(), MemoryRefusal> {
        let free_total = self.total_bytes.saturating_sub(locked_total);
        if wanted_bytes > free_total {
            return Err(MemoryRefusal::Total {
                wanted_bytes,
                free_bytes: free_total,
                budget_bytes: self.total_bytes,
            });
        }
        let free_user = self.per_user_bytes.saturating_sub(locked_by_user);
        if uid != 0 && wanted_bytes > free_user {
            return Err(MemoryRefusal::User {
                wanted_bytes,
                free_bytes: free_user,
                budget_bytes: self.per_user_bytes,
            });
        }
        Ok(())
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
    }
}
