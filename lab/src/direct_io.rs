//! One `O_DIRECT` read at a time, timed: how the lab measures its device through the kernel
//! (each read is one request to the model), both to calibrate the transport delay and to
//! validate the model.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::LabError;

/// A buffer aligned for `O_DIRECT` (the lab's reads and the tests' direct reads).
#[derive(Debug)]
pub struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    /// A zeroed buffer of `len` bytes starting on a 4 KiB boundary.
    #[must_use]
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + 4096];
        let start = storage.as_ptr().align_offset(4096);
        Self {
            storage,
            start,
            len,
        }
    }

    /// Its first `len` bytes (at most its length).
    pub fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.storage[self.start..self.start + len.min(self.len)]
    }
}

/// Reads `len` bytes at `offset` of `device` into `buf`; how long the read took.
pub(crate) fn timed_read(
    device: &File,
    buf: &mut AlignedBuffer,
    offset: u64,
    len: u64,
) -> Result<Duration, LabError> {
    let slice = buf.slice(usize::try_from(len).unwrap_or(0));
    let started = Instant::now();
    device
        .read_exact_at(slice, offset)
        .map_err(|e| LabError::system(format!("O_DIRECT read at {offset}"), e))?;
    Ok(started.elapsed())
}

/// `device` opened for direct reads.
pub(crate) fn open_direct(device: &Path) -> Result<File, LabError> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(device)
        .map_err(LabError::io(device))
}
