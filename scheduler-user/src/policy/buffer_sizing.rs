//! `--buffer auto`: a stream's buffer sized from what its disk does.
//!
//! In the ABISS slides a stream's buffer is the application's part plus the OS and hardware
//! part. The OS part must hold the data the reader consumes while a refill waits for the disk:
//! the window asks for more once the reader is within half a buffer of what is loaded (or a
//! third of the buffer is missing), so half the buffer must last the refill's latency, and the
//! window moves in batches, which the credit pays one at a time. So
//! `B = app + 2 · R · tail + 2 · batch`, with `tail` the disk's real-time latency tail (p99 of
//! queue plus service time of its real-time requests over the last seconds, which the block
//! programs measure for every request), or before the disk has shown it, an estimate from all
//! its requests (`crate::disk::latency_tail`).
//!
//! Memory also buys disk time. A window is refilled in loads of a third of its buffer, one
//! disk access each, so a larger buffer means fewer seeks per second of media: with the
//! reference 564 KiB buffers the lab's laptop disk spends most of its time seeking and serves
//! 12 to 16 streams of 1 MB/s from memory next to a copy loop, with 1.5 MiB buffers 28 and
//! with 6.3 MiB 36, for a minute each; past that the transfer alone fills the disk
//! (`bench/results/memory-60s/memory.md`). When a disk's admission would refuse an
//! automatic stream at its latency-sized buffer, [`smallest_fitting_buffer`] finds the
//! smallest common buffer at which the disk admits it, within the memory budgets.

use abiss_proto::PAGE_BYTES;

use super::{page_ceil, page_floor};

/// The tail assumed for a disk with too few requests measured yet in the stream's class and
/// in all (`crate::disk::latency_tail`): a hard disk's seek and rotation behind a few queued
/// requests.
pub(crate) const DEFAULT_TAIL_NS: u64 = 100_000_000;

/// Requests a disk must have completed in the window before its tail in a class is believed,
/// and before its requests of every class estimate a class not seen yet.
pub(crate) const MIN_TAIL_SAMPLES: u64 = 50;

/// Grow an automatic buffer only when the new size is this much larger (in percent), so a
/// tail that wanders a little does not resize it every second.
pub(crate) const GROW_HYSTERESIS_PERCENT: u64 = 10;

/// The buffer for a stream of `rate_bps` with `app_bytes` of its own, on a disk whose
/// latency tail (in the stream's class) is `tail_ns`, loading in batches of `batch_bytes`: whole pages.
#[must_use]
pub(crate) fn auto_buffer_bytes(
    app_bytes: u64,
    rate_bps: u64,
    tail_ns: u64,
    batch_bytes: u64,
) -> u64 {
    let during_tail = u128::from(rate_bps) * u128::from(tail_ns) / 1_000_000_000;
    let os = u64::try_from(during_tail.saturating_mul(2))
        .unwrap_or(u64::MAX)
        .saturating_add(batch_bytes.max(PAGE_BYTES).saturating_mul(2));
    page_ceil(app_bytes.saturating_add(os))
}

/// Whether a buffer of `now_bytes` should grow to `wanted_bytes`.
#[must_use]
pub(crate) fn should_grow(now_bytes: u64, wanted_bytes: u64) -> bool {
    u128::from(wanted_bytes) * 100
        > u128::from(now_bytes) * u128::from(100 + GROW_HYSTERESIS_PERCENT)
}

/// Halvings of the gap between a buffer that does not fit and one that does: the buffer
/// found is within 1/256 of that gap of the smallest that fits, in at most as many tries.
pub(crate) const FITTING_SEARCH_HALVINGS: u32 = 8;

/// The smallest buffer from `from_bytes` up to `cap_bytes` (whole pages) for which `fits`
/// holds, `None` if not even `cap_bytes` does. `fits` is the disk's admission and the memory
/// budgets for a buffer of that size, which only get easier as the buffer grows (fewer loads
/// a second, more held ahead). Doubling from `from_bytes` finds one that fits, then
/// [`FITTING_SEARCH_HALVINGS`] halvings of the gap close in on the smallest: at most about 40
/// admissions for any sizes, each a few microseconds for the streams one disk holds.
pub(crate) fn smallest_fitting_buffer(
    from_bytes: u64,
    cap_bytes: u64,
    mut fits: impl FnMut(u64) -> bool,
) -> Option<u64> {
    let cap = page_floor(cap_bytes);
    let mut low = page_ceil(from_bytes.max(PAGE_BYTES));
    if low > cap {
        return None;
    }
    if fits(low) {
        return Some(low);
    }
    // `low` does not fit: double until something does.
    let mut high = loop {
        let next = low.saturating_mul(2).min(cap);
        if fits(next) {
            break next;
        }
        if next == cap {
            return None;
        }
        low = next;
    };
    for _ in 0..FITTING_SEARCH_HALVINGS {
        let middle = page_ceil(low + (high - low) / 2);
        if middle >= high || middle <= low {
            break;
        }
        if fits(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    Some(high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_1_mb_s_stream_on_a_disk_with_a_100_ms_tail_gets_about_a_third_of_a_megabyte() {
        let batch = 20 * PAGE_BYTES;
        let bytes = auto_buffer_bytes(0, 1_000_000, DEFAULT_TAIL_NS, batch);
        assert_eq!(bytes, page_ceil(200_000 + 2 * batch));
        // A slower disk, a larger buffer; the application's part comes on top.
        assert!(auto_buffer_bytes(0, 1_000_000, 250_000_000, batch) > bytes);
        assert_eq!(
            auto_buffer_bytes(64 * 1024, 1_000_000, DEFAULT_TAIL_NS, batch),
            page_ceil(64 * 1024 + 200_000 + 2 * batch)
        );
        assert!(!should_grow(1000, 1100) && should_grow(1000, 1101));
    }

    proptest! {
        /// The buffer holds the application's part, two batches and twice what the rate
        /// consumes during the tail, in whole pages, and never shrinks as the tail grows.
        #[test]
        fn the_buffer_covers_the_tail_at_the_rate(
            app in 0u64..(64 << 20),
            rate in 1u64..100_000_000,
            tail in 0u64..5_000_000_000,
            more in 0u64..1_000_000_000,
            batch_pages in 1u64..256,
        ) {
            let batch = batch_pages * PAGE_BYTES;
            let bytes = auto_buffer_bytes(app, rate, tail, batch);
            prop_assert_eq!(bytes % PAGE_BYTES, 0);
            let consumed = u128::from(rate) * u128::from(tail) / 1_000_000_000;
            prop_assert!(u128::from(bytes) >= u128::from(app) + 2 * consumed + 2 * u128::from(batch));
            prop_assert!(auto_buffer_bytes(app, rate, tail + more, batch) >= bytes);
        }
    }

    proptest! {
        /// Against a threshold (the disk fits the set from some buffer size on), the search
        /// finds a fitting buffer in whole pages, no larger than the cap, within 1/256 of the
        /// doubling's last gap of the threshold, and `None` only when the cap is below it.
        #[test]
        fn the_smallest_fitting_buffer_is_found_near_the_threshold(
            from in 0u64..(4 << 20),
            threshold in 0u64..(2 << 30),
            cap in 0u64..(2 << 30),
        ) {
            let mut tries = 0;
            let found = smallest_fitting_buffer(from, cap, |b| {
                tries += 1;
                b >= threshold
            });
            prop_assert!(tries <= 64 + FITTING_SEARCH_HALVINGS);
            let start = page_ceil(from.max(PAGE_BYTES));
            match found {
                None => prop_assert!(page_floor(cap) < threshold.max(start)),
                Some(b) => {
                    prop_assert_eq!(b % PAGE_BYTES, 0);
                    prop_assert!(b >= threshold && b >= start && b <= page_floor(cap).max(start));
                    // Close to the smallest: the doubling's gap was at most the threshold,
                    // and 8 halvings leave a 256th of it, plus the page rounding.
                    let slack = threshold.max(start) / 256 + 2 * PAGE_BYTES;
                    prop_assert!(b <= page_ceil(threshold.max(start)) + slack, "{} for {}", b, threshold);
                }
            }
        }
    }

    #[test]
    fn a_disk_that_fits_at_once_keeps_the_latency_sized_buffer() {
        assert_eq!(
            smallest_fitting_buffer(356 << 10, 1 << 30, |_| true),
            Some(356 << 10)
        );
        assert_eq!(smallest_fitting_buffer(356 << 10, 1 << 30, |_| false), None);
        assert_eq!(smallest_fitting_buffer(2 << 20, 1 << 20, |_| true), None);
    }
}
