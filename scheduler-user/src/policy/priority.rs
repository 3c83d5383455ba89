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
#[must_use]
pub const fn kernel_ioprio(level: u8) -> (u8, u8) {
    match level {
        0 => (ioprio::CLASS_RT, 0),
        1 => (ioprio::CLASS_RT, 2),
        2 => (ioprio::CLASS_RT, 4),
        3 => (ioprio::CLASS_RT, 6),
        4 => (ioprio::CLASS_BE, 0),
        5 => (ioprio::CLASS_BE, 2),
        6 => (ioprio::CLASS_BE, 4),
        _ => (ioprio::CLASS_BE, 7),
    }
}

/// The encoded kernel ioprio value of an ABISS level.
#[must_use]
pub const fn encoded_ioprio(level: u8) -> u16 {
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
}
