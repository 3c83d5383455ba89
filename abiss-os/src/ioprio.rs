//! One thread's I/O priority: `ioprio_get(2)` and `ioprio_set(2)` with `IOPRIO_WHO_PROCESS`,
//! which with a thread id means that thread alone (with 0, the calling thread).
//!
//! Values are the kernel's encoding, built with [`encode`]: the class in the top bits, the
//! level in the low ones.

use std::io;

pub use scheduler_common::ioprio::{encode, CLASS_BE, CLASS_IDLE, CLASS_NONE, CLASS_RT};

/// `IOPRIO_WHO_PROCESS`.
const WHO_PROCESS: libc::c_long = 1;

/// The thread meant by a thread id of 0.
pub const CALLING_THREAD: u32 = 0;

/// The I/O priority of thread `tid` (0: the calling thread), encoded.
pub fn get(tid: u32) -> io::Result<u16> {
    // SAFETY: ioprio_get(IOPRIO_WHO_PROCESS, tid) takes two integers and no memory.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, WHO_PROCESS, libc::c_long::from(tid)) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    u16::try_from(rc).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Sets the I/O priority of thread `tid` (0: the calling thread) to the encoded `value`.
pub fn set(tid: u32, value: u16) -> io::Result<()> {
    // SAFETY: ioprio_set(IOPRIO_WHO_PROCESS, tid, value) takes three integers and no memory.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            WHO_PROCESS,
            libc::c_long::from(tid),
            libc::c_long::from(value),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_can_lower_its_own_priority_and_read_it_back() {
        // Best effort needs no privilege, so this runs as any user.
        std::thread::spawn(|| {
            let value = encode(CLASS_BE, 7);
            set(CALLING_THREAD, value).expect("ioprio_set");
            assert_eq!(get(CALLING_THREAD).expect("ioprio_get"), value);
        })
        .join()
        .expect("thread");
    }

    #[test]
    fn a_missing_thread_is_an_error() {
        assert!(get(u32::MAX >> 1).is_err());
    }
}
