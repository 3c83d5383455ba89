//! Writing the one-value attributes of sysfs, the way the kernel asks for it.
//!
//! Linux 6.18 takes a disk's `queue/scheduler` write with a try-lock on its tag set (to break a
//! lock cycle with a disk being deleted): while another writer holds that lock (a write of
//! `nr_requests`, a change of hardware queues, a deletion), the switch fails with `EBUSY`, and
//! the kernel's comment says to try again. The suite met it once (2026-12-06: a lab disk's
//! switch to `none` refused on `loop0` while two other test binaries set up and took down
//! their own disks), and a shell loop switching a loop device's elevator beside another
//! writing its `nr_requests` had 119 of 1,000 switches refused while the suite ran, none in
//! later runs on a quiet machine. A disk abissd takes or puts back must not be left half done
//! by it, so every write here tries again while the kernel says busy.

use std::fs;
use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// How long a write goes on trying while the kernel says busy. The other writer holds the
/// lock for one write of its own, which takes milliseconds.
pub const BUSY_FOR_AT_MOST: Duration = Duration::from_secs(2);

/// The pause between tries.
const BUSY_PAUSE: Duration = Duration::from_millis(5);

/// Writes `value` to the sysfs attribute at `path` in one `write(2)` (sysfs takes a store as
/// one call), trying again for up to [`BUSY_FOR_AT_MOST`] while the kernel answers `EBUSY`.
/// Any other error, or `EBUSY` past that, is returned as it came.
pub fn write_attr(path: &Path, value: &str) -> io::Result<()> {
    while_busy(BUSY_FOR_AT_MOST, BUSY_PAUSE, || fs::write(path, value))
}

/// Runs `attempt` until it does not fail with `EBUSY`, or `limit` has passed since the first
/// try, pausing `pause` between tries.
fn while_busy<T>(
    limit: Duration,
    pause: Duration,
    mut attempt: impl FnMut() -> io::Result<T>,
) -> io::Result<T> {
    let started = Instant::now();
    loop {
        match attempt() {
            Err(error)
                if error.raw_os_error() == Some(libc::EBUSY) && started.elapsed() < limit =>
            {
                thread::sleep(pause);
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> io::Error {
        io::Error::from_raw_os_error(libc::EBUSY)
    }

    #[test]
    fn a_busy_kernel_is_asked_again_until_it_takes_the_write() {
        let mut tries = 0;
        let result = while_busy(Duration::from_secs(1), Duration::ZERO, || {
            tries += 1;
            if tries < 4 {
                Err(busy())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(result.unwrap(), 4);
    }

    #[test]
    fn other_errors_come_back_at_once() {
        let mut tries = 0;
        let result: io::Result<()> = while_busy(Duration::from_secs(1), Duration::ZERO, || {
            tries += 1;
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EINVAL));
        assert_eq!(tries, 1);
    }

    #[test]
    fn busy_for_longer_than_the_limit_is_an_error() {
        let started = Instant::now();
        let result: io::Result<()> =
            while_busy(Duration::from_millis(30), Duration::from_millis(5), || {
                Err(busy())
            });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EBUSY));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(30) && took < Duration::from_secs(1),
            "{took:?}"
        );
    }
}
