//! Files and the page cache: eviction, what is resident, and a reader paced on the ABISS
//! schedule that records what it waited for.

use std::fs::File;
use std::time::{Duration, Instant};

/// The stream the guarantee tests read (`stream_guarantee`, `btrfs`): 1 MB/s in 64 KiB reads
/// with a 564 KiB buffer, one set of figures so that their results compare.
pub mod guarantee {
    use std::time::Duration;

    /// Bytes per second.
    pub const RATE: u64 = 1_000_000;
    /// Playout buffer, bytes.
    pub const BUFFER: u64 = 564 * 1024;
    /// Bytes per read.
    pub const READ: usize = 64 * 1024;

    /// How long a guarantee run reads: `default_secs`, or `ABISS_GUARANTEE_SECS` when set (to
    /// take tail figures over a longer run, or a quick look over a shorter one).
    #[must_use]
    pub fn read_for(default_secs: u64) -> Duration {
        Duration::from_secs(
            std::env::var("ABISS_GUARANTEE_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(default_secs),
        )
    }
}

/// Drops a file's pages from the page cache.
pub fn evict(file: &File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: fadvise on an open descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// What a paced reader saw: per-read latency and deadline misses.
#[derive(Debug, Default)]
pub struct PacedReport {
    /// Latency of each read, ns.
    pub latencies_ns: Vec<u64>,
    /// Reads that completed after their deadline.
    pub misses: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Reads that took over a millisecond.
    pub slow: Vec<SlowRead>,
    /// Reads that began while part of their range was not in the page cache: the window
    /// lagged the reader, and the read waited for the disk (with a watched file only).
    pub not_resident: Vec<SlowRead>,
}

impl PacedReport {
    /// The latency below which `quantile` of the reads completed, ns.
    #[must_use]
    pub fn quantile_ns(&self, quantile: f64) -> u64 {
        let mut sorted = self.latencies_ns.clone();
        sorted.sort_unstable();
        abiss_lab::stats::quantile(&sorted, quantile).unwrap_or(0)
    }
}

/// A read that took over a millisecond, with what the page cache held just before it.
#[derive(Debug, Clone, Copy)]
pub struct SlowRead {
    /// Index of the read.
    pub index: u64,
    /// File offset it started at.
    pub offset: u64,
    /// How long it took, ns.
    pub latency_ns: u64,
    /// Bytes of the read's range that were in the page cache when it started (`None` when the
    /// reader was not given a file to look at).
    pub resident_before: Option<u64>,
}

/// Bytes of `[offset, offset + len)` of `file` that are in the page cache.
///
/// Uses `mincore` on a private mapping, which neither reads the file nor counts as an access, so
/// it does not disturb the readers it watches (or the daemon's view of them). `offset` must be
/// page-aligned; the range is clipped to the file.
///
/// # Panics
/// If the file cannot be mapped.
#[must_use]
pub fn resident_bytes(file: &File, offset: u64, len: u64) -> u64 {
    let size = file.metadata().expect("file size").len();
    let len = len.min(size.saturating_sub(offset));
    if len == 0 {
        return 0;
    }
    let length = usize::try_from(len).expect("a range that fits in memory");
    // SAFETY: a fresh read-only mapping of a file we hold open, used only for mincore.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(file),
            i64::try_from(offset).expect("an offset within the file"),
        )
    };
    assert_ne!(map, libc::MAP_FAILED, "mmap for mincore");
    let mut pages = vec![0u8; length.div_ceil(4096)];
    // SAFETY: `pages` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(map, length, pages.as_mut_ptr()) };
    // SAFETY: our mapping, unmapped once.
    unsafe { libc::munmap(map, length) };
    assert_eq!(rc, 0, "mincore");
    let pages = pages.iter().filter(|&&p| p & 1 == 1).count() as u64;
    (pages * 4096).min(len)
}

/// Reads `reader` in `read_bytes` reads on the ABISS schedule: read i is issued at
/// `t0 + i·S/R` (at once if late) and misses if it completes after `t0 + B/R + i·S/R`.
/// With `watched` (the same file, opened separately), each slow read records how much of its
/// range was in the page cache just before it.
pub fn paced_read(
    reader: &mut impl std::io::Read,
    watched: Option<&File>,
    rate_bps: u64,
    buffer_bytes: u64,
    read_bytes: usize,
    duration: Duration,
) -> PacedReport {
    let start = Instant::now();
    let mut report = PacedReport::default();
    let mut chunk = vec![0u8; read_bytes];
    let period_ns = read_bytes as u64 * 1_000_000_000 / rate_bps;
    let slack_ns = buffer_bytes * 1_000_000_000 / rate_bps;
    for i in 0u64.. {
        let issue = Duration::from_nanos(i * period_ns);
        if issue >= duration {
            break;
        }
        if let Some(wait) = issue.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        // Only the page-aligned part is looked at: mincore maps from a page boundary.
        let aligned = report.bytes / 4096 * 4096;
        let resident_before = watched.map(|file| resident_bytes(file, aligned, read_bytes as u64));
        let wanted = watched.map(|file| {
            let size = file.metadata().map_or(0, |m| m.len());
            size.saturating_sub(aligned).min(read_bytes as u64)
        });
        let before = Instant::now();
        let read = reader.read(&mut chunk).expect("paced read");
        let done = start.elapsed();
        let latency = u64::try_from(before.elapsed().as_nanos()).unwrap_or(u64::MAX);
        report.latencies_ns.push(latency);
        let this = SlowRead {
            index: i,
            offset: report.bytes,
            latency_ns: latency,
            resident_before,
        };
        if resident_before < wanted {
            report.not_resident.push(this);
        }
        if latency > 1_000_000 {
            report.slow.push(this);
        }
        if done > Duration::from_nanos(slack_ns + i * period_ns) {
            report.misses += 1;
        }
        report.bytes += read as u64;
        if read == 0 {
            break;
        }
    }
    report
}
