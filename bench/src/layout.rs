//! Where the benchmark's files sit on the lab disk, and making them.
//!
//! The stream files and the copy's source are spread evenly over the file system, with
//! fallocated filler files between them (unwritten extents: no data I/O, only space), so the
//! streams sit at different distances from each other and from the copy, as files on a real
//! disk would, and the sweep's streams see seeks of every length. The end of the disk stays
//! free for the copy's destination.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use serde::Serialize;

/// Leave this much of the file system free beyond what the plan needs (metadata, journal,
/// allocator slack).
const SPARE_FRACTION: f64 = 0.05;

/// How big a filler goes before each file so that `files` start at evenly spaced positions of
/// `space_bytes` (pure). File k starts at k·space/n; a file larger than its share just pushes
/// the next one on.
#[must_use]
pub fn spread_fillers(files: &[u64], space_bytes: u64) -> Vec<u64> {
    let count = files.len() as u64;
    let mut position = 0;
    files
        .iter()
        .enumerate()
        .map(|(k, size)| {
            let target = space_bytes.checked_div(count).unwrap_or(0) * k as u64;
            let filler = target.saturating_sub(position);
            position += filler + size;
            filler
        })
        .collect()
}

/// Files on the lab's file system: one per stream, the copy's source, and the copy.
#[derive(Clone, Debug, Serialize)]
pub struct BenchFiles {
    /// The stream files, in reader order.
    pub streams: Vec<PathBuf>,
    /// The copy loop's source.
    pub copy_source: PathBuf,
    /// The copy loop's destination (made by each run, removed after it).
    pub copy_destination: PathBuf,
    /// Where each stream file starts, as a fraction of the disk (0 = outer edge).
    pub stream_positions: Vec<f64>,
    /// Where the copy source starts, as a fraction of the disk.
    pub copy_source_position: f64,
}

impl BenchFiles {
    /// Every file whose pages a run reads from the disk.
    pub fn read_files(&self) -> impl Iterator<Item = &Path> {
        self.streams
            .iter()
            .map(PathBuf::as_path)
            .chain([self.copy_source.as_path()])
    }
}

/// Makes `streams` stream files of `stream_bytes` and a copy source of `copy_bytes` under
/// `dir`, spread over the file system with room left for the copy, and drops their pages.
pub fn make_files(
    dir: &Path,
    disk_bytes: u64,
    streams: usize,
    stream_bytes: u64,
    copy_bytes: u64,
) -> anyhow::Result<BenchFiles> {
    let stat = nix::sys::statvfs::statvfs(dir).context("statvfs on the lab file system")?;
    let free = stat.blocks_available() * stat.fragment_size();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a margin in bytes"
    )]
    let spare = (free as f64 * SPARE_FRACTION) as u64;
    let mut sizes = vec![stream_bytes; streams];
    sizes.push(copy_bytes);
    let needed: u64 = sizes.iter().sum::<u64>() + copy_bytes + spare;
    anyhow::ensure!(
        needed <= free,
        "the files need {} MB but the lab file system has {} MB free",
        needed / 1_000_000,
        free / 1_000_000
    );
    // The copy's destination goes after the last file: keep its size (and the spare) out of
    // the spread.
    let spread_bytes = free - copy_bytes - spare;
    let fillers = spread_fillers(&sizes, spread_bytes);

    let mut paths = Vec::new();
    for (k, (size, filler)) in sizes.iter().zip(&fillers).enumerate() {
        if *filler > 0 {
            let path = dir.join(format!("filler-{k:03}"));
            let file =
                File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            nix::fcntl::fallocate(
                file.as_raw_fd(),
                nix::fcntl::FallocateFlags::empty(),
                0,
                i64::try_from(*filler)?,
            )
            .with_context(|| format!("fallocate {}", path.display()))?;
        }
        let path = if k < streams {
            dir.join(format!("stream-{k:03}"))
        } else {
            dir.join("copy-source")
        };
        write_file(&path, *size)?;
        paths.push(path);
    }
    let copy_source = paths.pop().expect("the copy source was made last");
    let position = |path: &Path| disk_position(path, disk_bytes);
    let files = BenchFiles {
        stream_positions: paths
            .iter()
            .map(|p| position(p))
            .collect::<Result<_, _>>()?,
        copy_source_position: position(&copy_source)?,
        streams: paths,
        copy_destination: dir.join("copy-destination"),
        copy_source,
    };
    for path in files.read_files() {
        drop_cached_pages(path)?;
    }
    Ok(files)
}

/// Writes `size` bytes of a pattern (real data: ext4 stores every block) and syncs them.
fn write_file(path: &Path, size: u64) -> anyhow::Result<()> {
    const CHUNK: usize = 1 << 20;
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut chunk = vec![0u8; CHUNK];
    let mut written = 0u64;
    while written < size {
        let len = usize::try_from((size - written).min(CHUNK as u64))?;
        // A different pattern per chunk, so no two chunks are alike.
        chunk.fill(u8::try_from(written / CHUNK as u64 % 251)?);
        file.write_all(&chunk[..len])
            .with_context(|| format!("writing {}", path.display()))?;
        written += len as u64;
    }
    file.sync_all()
        .with_context(|| format!("syncing {}", path.display()))
}

/// Drops a clean file's pages from the page cache, so the next run reads it from the disk.
pub fn drop_cached_pages(path: &Path) -> anyhow::Result<()> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    posix_fadvise(
        file.as_raw_fd(),
        0,
        0,
        PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .with_context(|| format!("fadvise DONTNEED on {}", path.display()))?;
    Ok(())
}

/// Pages of `path` in the page cache (mincore over a mapping of the file).
pub fn cached_pages(path: &Path) -> anyhow::Result<u64> {
    let file = OpenOptions::new().read(true).open(path)?;
    let len = usize::try_from(file.metadata()?.len())?;
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: a private read-only mapping of a file we hold open, unmapped below; mincore
    // writes one byte per page into a vector of that many bytes.
    unsafe {
        let map = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        anyhow::ensure!(map != libc::MAP_FAILED, "mmap {} failed", path.display());
        let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE))?;
        let mut residency = vec![0u8; len.div_ceil(page)];
        let result = libc::mincore(map, len, residency.as_mut_ptr());
        libc::munmap(map, len);
        anyhow::ensure!(result == 0, "mincore {} failed", path.display());
        Ok(residency.iter().filter(|r| *r & 1 != 0).count() as u64)
    }
}

/// Where a file's first block is, as a fraction of the disk (FIBMAP: logical block 0 to the
/// file system block, which on a whole-disk file system is the disk block).
fn disk_position(path: &Path, disk_bytes: u64) -> anyhow::Result<f64> {
    const FIBMAP: libc::c_ulong = 1;
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let block_size = nix::sys::statvfs::fstatvfs(&file)?.block_size();
    let mut block: libc::c_int = 0;
    // SAFETY: FIBMAP reads and writes one int through the pointer.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), FIBMAP, &raw mut block) };
    anyhow::ensure!(
        result == 0,
        "FIBMAP on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    #[expect(clippy::cast_precision_loss, reason = "a position for the report")]
    Ok((u64::try_from(block)? * block_size) as f64 / disk_bytes as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fillers_spread_files_evenly() {
        // Four 10-byte files over 100 bytes start at 0, 25, 50 and 75.
        assert_eq!(spread_fillers(&[10, 10, 10, 10], 100), [0, 15, 15, 15]);
    }

    #[test]
    fn a_file_larger_than_its_share_pushes_the_next_one() {
        // Starts at 0, 50 and 100: the second would overlap the first file, so it follows it.
        assert_eq!(spread_fillers(&[70, 10, 10], 150), [0, 0, 20]);
    }

    #[test]
    fn no_files_no_fillers() {
        assert!(spread_fillers(&[], 100).is_empty());
        assert_eq!(spread_fillers(&[5], 100), [0]);
    }
}
