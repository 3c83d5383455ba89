//! ABISS priority levels and the kernel I/O priorities they map to.
//!
//! ABISS had eight elevator queues: 0 the highest (real time only), 7 the default best effort.
//! The kernel has real-time and best-effort classes with eight levels each, honoured by bfq and
//! mq-deadline. The mapping keeps ABISS's order and spreads the levels over both classes:
//!
//! | ABISS level | kernel ioprio |
//! | --- | --- |
//! | 0 | RT/0 |
//! | 1 | RT/2 |
//! | 2 | RT/4 |
//! | 3 | RT/6 |
//! | 4 | BE/0 |
//! | 5 | BE/2 |
//! | 6 | BE/4 |
//! | 7 | BE/7 (a plain reader's default is BE/4) |

use scheduler_common::ioprio;

/// Kernel (class, level) of an ABISS level; levels above 7 are treated as 7.
pub(crate) use scheduler_common::abiss_level::to_kernel as kernel_ioprio;

/// The encoded kernel ioprio value of an ABISS level.
#[must_use]
pub(crate) const fn encoded_ioprio(level: u8) -> u16 {
    let (class, kernel_level) = kernel_ioprio(level);
    ioprio::encode(class, kernel_level)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_keeps_the_order() {
        // Lower ABISS level = served first: RT before BE, lower kernel level first.
        let served_first = |level: u8| {
            let (class, kernel_level) = kernel_ioprio(level);
            (class, kernel_level)
        };
        for level in 0..7 {
            assert!(
                served_first(level) < served_first(level + 1),
                "level {level}"
            );
        }
        assert_eq!(kernel_ioprio(0), (ioprio::CLASS_RT, 0));
        assert_eq!(kernel_ioprio(7), (ioprio::CLASS_BE, 7));
        assert_eq!(kernel_ioprio(200), (ioprio::CLASS_BE, 7));
    }

    #[test]
    fn every_level_reads_back_from_its_kernel_priority() {
        use scheduler_common::abiss_level::from_kernel;
        for level in 0..=7 {
            let (class, kernel_level) = kernel_ioprio(level);
            assert_eq!(from_kernel(class, kernel_level), level);
        }
        // A plain reader (no class: BE/4 by default) is at level 6, below every RT stream.
        assert_eq!(from_kernel(ioprio::CLASS_NONE, 0), 6);
        assert_eq!(from_kernel(ioprio::CLASS_IDLE, 0), 7);
        assert_eq!(from_kernel(ioprio::CLASS_RT, 7), 3);
    }
}
