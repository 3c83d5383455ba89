//! Where the benchmark's files sit on the lab disk, and making them.
//!
//! The stream files and the copy's source are spread evenly over the disk, so streams sit at
//! different distances from each other and from the copy, as files on a real disk would, and
//! the sweep's streams see seeks of every length. ext4 gives no say over where a file goes,
//! so the placement is forced: a reserve file is fallocated over all free space (unwritten
//! extents: no data I/O), then for each file a hole is punched in the reserve at the wanted
//! disk position, the journal is committed (freed blocks are reusable only after that), and
//! the file is written into the only free space there is. The last hole, at the end of the
//! disk, is left for the copy's destination.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use nix::fcntl::{fallocate, posix_fadvise, FallocateFlags, PosixFadviseAdvice};
use serde::Serialize;

use crate::throughput::DiskRanges;

/// Room beyond the copy's size in the hole left for it (ext4 allocates in groups of blocks).
const COPY_HOLE_EXTRA_BYTES: u64 = 64 << 20;
/// Room beyond a file's size in the hole punched for it: its extent tree and the reserve's
/// split extents need blocks too.
const HOLE_EXTRA_BYTES: u64 = 2 << 20;
/// Holes start on this disk alignment: ext4's buddy allocator hands out aligned power-of-two
/// chunks first, so an aligned hole is filled from its start, in file order.
const HOLE_ALIGNMENT: u64 = 16 << 20;

/// A run of a file's blocks on the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Extent {
    /// Offset in the file.
    pub logical: u64,
    /// Offset on the disk.
    pub physical: u64,
    /// Length in bytes.
    pub length: u64,
}

/// Evenly spaced disk positions for `count` items over `len` bytes from `start`, aligned
/// down to `alignment` (pure).
#[must_use]
pub fn spread_targets(count: usize, start: u64, len: u64, alignment: u64) -> Vec<u64> {
    let count = count as u64;
    (0..count)
        .map(|k| {
            let target = start + len.checked_div(count).unwrap_or(0) * k;
            target / alignment * alignment
        })
        .collect()
}

/// Where in a file mapped by `extents` a run of `len` bytes lies on the disk at or after
/// `target` (the first such run by disk position); `None` if no extent has room (pure).
#[must_use]
pub fn logical_for_physical(extents: &[Extent], target: u64, len: u64) -> Option<u64> {
    let mut by_position: Vec<&Extent> = extents.iter().collect();
    by_position.sort_by_key(|e| e.physical);
    by_position.into_iter().find_map(|extent| {
        let start = target.max(extent.physical);
        (start + len <= extent.physical + extent.length)
            .then(|| extent.logical + (start - extent.physical))
    })
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

/// The seed of the stream files' first order in a benchmark that shuffles them.
pub const SHUFFLE_SEED: u64 = 0x5eed_ab15;

impl BenchFiles {
    /// Puts the stream files in a fixed random order of `seed` (xorshift Fisher–Yates), so
    /// the first n land at random places over the disk rather than packed at its start, as
    /// admission's model places a stream's data.
    pub fn shuffle(&mut self, seed: u64) {
        let mut state = seed | 1;
        for i in (1..self.streams.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let j = usize::try_from(state % (i as u64 + 1)).unwrap_or(0);
            self.streams.swap(i, j);
            self.stream_positions.swap(i, j);
        }
    }

    /// Every file whose pages a run reads from the disk.
    pub fn read_files(&self) -> impl Iterator<Item = &Path> {
        self.streams
            .iter()
            .map(PathBuf::as_path)
            .chain([self.copy_source.as_path()])
    }
}

/// Makes `streams` stream files of `stream_bytes` and a copy source of `copy_bytes` under
/// `dir`, spread over the disk with room left for the copy at its end, and drops their pages.
pub fn make_files(
    dir: &Path,
    disk_bytes: u64,
    streams: usize,
    stream_bytes: u64,
    copy_bytes: u64,
) -> anyhow::Result<BenchFiles> {
    let block = nix::sys::statvfs::statvfs(dir)
        .context("statvfs on the lab file system")?
        .fragment_size();
    let reserve_path = dir.join("reserve");
    let reserve = fill_free_space(&reserve_path)?;
    let extents = file_extents(&reserve)?;
    let first = extents.iter().map(|e| e.physical).min().unwrap_or(0);
    let end = extents
        .iter()
        .map(|e| e.physical + e.length)
        .max()
        .unwrap_or(0);
    let copy_hole = (copy_bytes + COPY_HOLE_EXTRA_BYTES).next_multiple_of(block);
    anyhow::ensure!(
        end > first + copy_hole,
        "the lab disk has no room for the copy"
    );
    let mut sizes = vec![stream_bytes; streams];
    sizes.push(copy_bytes);
    let targets = spread_targets(
        sizes.len(),
        first.next_multiple_of(HOLE_ALIGNMENT),
        end - first - copy_hole,
        HOLE_ALIGNMENT,
    );

    let mut paths = Vec::new();
    for (k, (size, target)) in sizes.iter().zip(&targets).enumerate() {
        let path = if k < streams {
            dir.join(format!("stream-{k:03}"))
        } else {
            dir.join("copy-source")
        };
        punch_at(
            &reserve,
            *target,
            (size + HOLE_EXTRA_BYTES).next_multiple_of(block),
            dir,
        )
        .with_context(|| format!("making room for {}", path.display()))?;
        write_file(&path, *size)?;
        paths.push(path);
    }
    // The copy's destination gets the end of the disk. The reserve's last extents there need
    // not be one piece (ext4 extents are at most 128 MiB), so free them from the end back.
    punch_tail(&reserve, copy_hole, dir).context("making room for the copy")?;

    let copy_source = paths.pop().expect("the copy source was made last");
    finish(dir, disk_bytes, paths, copy_source)
}

/// As [`make_files`], but written one after the other where the file system puts them: btrfs
/// frees a punched hole only when its transaction commits, and copies on write, so the
/// placement by a reserve and holes fails there (ENOSPC). Positions are btrfs's logical
/// addresses, which on one fresh device follow the disk's order but not its offsets.
pub fn make_files_in_order(
    dir: &Path,
    disk_bytes: u64,
    streams: usize,
    stream_bytes: u64,
    copy_bytes: u64,
) -> anyhow::Result<BenchFiles> {
    let paths: Vec<PathBuf> = (0..streams)
        .map(|k| dir.join(format!("stream-{k:03}")))
        .collect();
    for path in &paths {
        write_file(path, stream_bytes)?;
    }
    let copy_source = dir.join("copy-source");
    write_file(&copy_source, copy_bytes)?;
    finish(dir, disk_bytes, paths, copy_source)
}

/// The files made, with their places on the disk, and their pages out of the cache so that
/// the first reads go to the disk.
fn finish(
    dir: &Path,
    disk_bytes: u64,
    streams: Vec<PathBuf>,
    copy_source: PathBuf,
) -> anyhow::Result<BenchFiles> {
    let files = BenchFiles {
        stream_positions: streams
            .iter()
            .map(|p| disk_position(p, disk_bytes))
            .collect::<Result<_, _>>()?,
        copy_source_position: disk_position(&copy_source, disk_bytes)?,
        streams,
        copy_destination: dir.join("copy-destination"),
        copy_source,
    };
    for path in files.read_files() {
        drop_cached_pages(path)?;
    }
    report_placement(&files);
    Ok(files)
}

/// Where `path` starts on a disk of `disk_bytes`, as a fraction of it (0 = outer edge);
/// warns if the file is in more than two pieces.
fn disk_position(path: &Path, disk_bytes: u64) -> anyhow::Result<f64> {
    let file = File::open(path)?;
    let extents = file_extents(&file)?;
    if extents.len() > 2 {
        eprintln!(
            "abiss-bench: {} is in {} pieces on the disk",
            path.display(),
            extents.len()
        );
    }
    let start = extents.iter().map(|e| e.physical).min().unwrap_or(0);
    #[expect(clippy::cast_precision_loss, reason = "a position for the report")]
    Ok(start as f64 / disk_bytes as f64)
}

/// Tells where the files went.
fn report_placement(files: &BenchFiles) {
    let percent = |p: &f64| format!("{:.0} %", p * 100.0);
    eprintln!(
        "files placed: streams at {}, copy source at {} of the disk",
        files
            .stream_positions
            .iter()
            .map(percent)
            .collect::<Vec<_>>()
            .join(", "),
        percent(&files.copy_source_position)
    );
}

/// Fallocates a file over all the free space data can use: one large request, then
/// ever smaller ones until not even a block is left, so that later writes can only go into
/// the holes punched for them.
fn fill_free_space(path: &Path) -> anyhow::Result<File> {
    let stat = nix::sys::statvfs::statvfs(path.parent().unwrap_or(Path::new("/")))?;
    let block = stat.fragment_size();
    // Root may use the blocks ext4 reserves for it, so count them as free.
    let free = stat.blocks_free() * block;
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let (mut len, mut chunk) = (0u64, free / block * block);
    while chunk >= block {
        match fallocate(
            file.as_raw_fd(),
            FallocateFlags::empty(),
            i64::try_from(len)?,
            i64::try_from(chunk)?,
        ) {
            Ok(()) => len += chunk,
            Err(nix::errno::Errno::ENOSPC) => chunk = chunk / 2 / block * block,
            Err(e) => return Err(e).with_context(|| format!("fallocate {}", path.display())),
        }
    }
    Ok(file)
}

/// Frees `len` bytes of the reserve at disk position `target` (or the next place with room)
/// and commits the journal so the blocks can be allocated again.
fn punch_at(reserve: &File, target: u64, len: u64, dir: &Path) -> anyhow::Result<()> {
    let extents = file_extents(reserve)?;
    let logical = logical_for_physical(&extents, target, len)
        .with_context(|| format!("no {len} bytes free in the reserve after {target}"))?;
    fallocate(
        reserve.as_raw_fd(),
        FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
        i64::try_from(logical)?,
        i64::try_from(len)?,
    )
    .context("punching a hole in the reserve")?;
    let dir = File::open(dir)?;
    nix::unistd::syncfs(dir.as_raw_fd()).context("syncfs")?;
    Ok(())
}

/// Frees `len` bytes of the reserve's extents nearest the end of the disk, extent by extent.
fn punch_tail(reserve: &File, len: u64, dir: &Path) -> anyhow::Result<()> {
    let mut extents = file_extents(reserve)?;
    extents.sort_by_key(|e| std::cmp::Reverse(e.physical));
    let mut left = len;
    for extent in extents {
        if left == 0 {
            break;
        }
        let take = left.min(extent.length);
        // The part of the extent nearest the end of the disk.
        let logical = extent.logical + extent.length - take;
        fallocate(
            reserve.as_raw_fd(),
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            i64::try_from(logical)?,
            i64::try_from(take)?,
        )
        .context("punching a hole in the reserve")?;
        left -= take;
    }
    anyhow::ensure!(left == 0, "the reserve lacks {left} bytes for the copy");
    let dir = File::open(dir)?;
    nix::unistd::syncfs(dir.as_raw_fd()).context("syncfs")?;
    Ok(())
}

/// Where `paths`' blocks lie on the disk.
pub fn disk_ranges(paths: &[PathBuf]) -> anyhow::Result<DiskRanges> {
    let mut extents = Vec::new();
    for path in paths {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        extents.extend(
            file_extents(&file)?
                .into_iter()
                .map(|e| (e.physical, e.length)),
        );
    }
    Ok(DiskRanges::new(extents))
}

/// A file's extents (`FS_IOC_FIEMAP`).
pub fn file_extents(file: &File) -> anyhow::Result<Vec<Extent>> {
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct FiemapExtent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    #[repr(C)]
    struct Fiemap {
        start: u64,
        length: u64,
        flags: u32,
        mapped_extents: u32,
        extent_count: u32,
        reserved: u32,
        extents: [FiemapExtent; 256],
    }
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_LAST: u32 = 1;

    let mut extents = Vec::new();
    let mut start = 0;
    loop {
        let mut request = Fiemap {
            start,
            length: u64::MAX - start,
            flags: FIEMAP_FLAG_SYNC,
            mapped_extents: 0,
            extent_count: 256,
            reserved: 0,
            extents: [FiemapExtent::default(); 256],
        };
        // SAFETY: FIEMAP fills at most `extent_count` extents of the request it is given.
        let result = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &raw mut request) };
        anyhow::ensure!(result == 0, "FIEMAP: {}", std::io::Error::last_os_error());
        let mapped = &request.extents[..request.mapped_extents as usize];
        extents.extend(mapped.iter().map(|e| Extent {
            logical: e.logical,
            physical: e.physical,
            length: e.length,
        }));
        match mapped.last() {
            Some(last) if last.flags & FIEMAP_EXTENT_LAST == 0 => {
                start = last.logical + last.length;
            }
            _ => return Ok(extents),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_evenly_spaced_and_block_aligned() {
        assert_eq!(
            spread_targets(4, 1000, 100_000, 4096),
            [0, 24576, 49152, 73728]
        );
        assert_eq!(spread_targets(2, 8192, 8192, 4096), [8192, 12288]);
        assert!(spread_targets(0, 0, 100, 1).is_empty());
    }

    #[test]
    fn a_run_is_found_by_disk_position_whatever_the_file_order() {
        // The reserve wrapped around the disk: its first half lies at the end.
        let extents = [
            Extent {
                logical: 0,
                physical: 600,
                length: 400,
            },
            Extent {
                logical: 400,
                physical: 100,
                length: 300,
            },
        ];
        // Position 150 is in the second extent, 50 bytes into it.
        assert_eq!(logical_for_physical(&extents, 150, 100), Some(450));
        // No room for 200 bytes at 300 in that extent: the next extent by position has it.
        assert_eq!(logical_for_physical(&extents, 300, 200), Some(0));
        // Before everything: the first extent by position.
        assert_eq!(logical_for_physical(&extents, 0, 10), Some(400));
        assert_eq!(logical_for_physical(&extents, 900, 200), None);
    }
}
