//! The lab's emulated hdd, files written cold on it without the model's time, and the copy loop
//! that loads it: both keep the model on for the files written meanwhile.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::devices::{Ext4Mount, LoopDevice};
use crate::page_cache::evict;
use crate::users::chmod;
use crate::{FixtureTimer, Scratch};

/// An emulated laptop hdd from the lab (FUSE + loop device) with ext4 mounted; torn down on
/// drop.
#[derive(Debug)]
pub struct HddLab {
    lab: abiss_lab::Lab,
    state_dir: PathBuf,
    /// Holds the lab's state (and its image where memory has no room for it).
    scratch: Scratch,
}

impl HddLab {
    /// A `size_gib` lab hdd with `scheduler` selected, ext4 made and mounted.
    #[must_use]
    pub fn up(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Ext4),
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected, xfs made and mounted.
    #[must_use]
    pub fn up_xfs(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Xfs),
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected, btrfs (one device) made and mounted
    /// with `mount_options` (`compress=zstd`).
    #[must_use]
    pub fn up_btrfs(
        tag: &str,
        size_gib: u64,
        scheduler: &str,
        mount_options: Option<&str>,
    ) -> Self {
        Self::up_modelled(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Btrfs),
            mount_options,
            None,
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected and ext4 on it, reading and writing
    /// `mb_s` MB/s in every zone: a disk slow enough that locking a window of it takes seconds.
    /// Made and filled as the others (unmodelled), so only what a test reads from it is slow.
    #[must_use]
    pub fn up_slow(tag: &str, size_gib: u64, scheduler: &str, mb_s: f64) -> Self {
        Self::up_modelled(
            tag,
            size_gib,
            scheduler,
            Some(abiss_lab::FilesystemKind::Ext4),
            None,
            Some(mb_s),
        )
    }

    /// A `size_gib` lab hdd with `scheduler` selected and nothing on it (a raw disk).
    #[must_use]
    pub fn up_raw(tag: &str, size_gib: u64, scheduler: &str) -> Self {
        Self::up_with(tag, size_gib, scheduler, None)
    }

    fn up_with(
        tag: &str,
        size_gib: u64,
        scheduler: &str,
        mkfs: Option<abiss_lab::FilesystemKind>,
    ) -> Self {
        Self::up_modelled(tag, size_gib, scheduler, mkfs, None, None)
    }

    fn up_modelled(
        tag: &str,
        size_gib: u64,
        scheduler: &str,
        mkfs: Option<abiss_lab::FilesystemKind>,
        mount_options: Option<&str>,
        rate_mb_s: Option<f64>,
    ) -> Self {
        use abiss_lab::{Lab, LabOptions};
        let dir = Scratch::new_in("/tmp", &format!("lab-{tag}"));
        let mut options =
            LabOptions::hdd_in(dir.path(), size_gib << 30, mkfs).expect("lab options");
        if let Some(rate) = rate_mb_s {
            options.model.hdd.outer_rate_mb_s = rate;
            options.model.hdd.inner_rate_mb_s = rate;
        }
        options.mount_options = mount_options.map(str::to_owned);
        options.scheduler = Some(scheduler.to_owned());
        let timer = FixtureTimer::start("lab hdd up");
        let lab = Lab::up(&options).expect("bring the lab hdd up");
        drop(timer);
        if mkfs.is_some() {
            register_lab_disk(&lab, &options.state_dir);
        }
        Self {
            lab,
            state_dir: options.state_dir,
            scratch: dir,
        }
    }

    /// The loop device.
    #[must_use]
    pub fn device(&self) -> &Path {
        self.lab.device()
    }

    /// The mounted filesystem.
    #[must_use]
    pub fn mount(&self) -> &Path {
        self.lab.mount_dir().expect("mounted")
    }

    /// The lab itself (stats).
    #[must_use]
    pub fn lab(&self) -> &abiss_lab::Lab {
        &self.lab
    }
}

impl Drop for HddLab {
    fn drop(&mut self) {
        let _timer = FixtureTimer::start("lab hdd down");
        let device = device_number(self.lab.device());
        lab_disks().retain(|disk| Some(disk.device) != device);
        if let Err(error) = abiss_lab::Lab::down(&self.state_dir) {
            eprintln!("lab down: {error}");
        }
        // A backing directory in memory is not under the scratch directory: should `down`
        // have failed, it would hold the image in memory until a reboot.
        let memory = Path::new(abiss_lab::lab::MEMORY_BACKING_DIR);
        let lab_dir = memory.join(self.scratch.path().file_name().unwrap_or_default());
        let _ = std::fs::remove_dir_all(lab_dir);
    }
}

/// The lab disks with a file system that [`HddLab`] brought up in this process, for
/// [`write_cold_file`].
static LAB_DISKS: Mutex<Vec<LabDisk>> = Mutex::new(Vec::new());

/// One of [`LAB_DISKS`].
#[derive(Debug)]
struct LabDisk {
    /// The loop device's number: its `st_rdev`, and the `st_dev` of the files on it.
    device: u64,
    /// The `st_dev` of the files at the top of its file system: btrfs gives them an
    /// anonymous number, not the disk's.
    file_device: u64,
    /// A second handle on the lab, to switch its model off and on.
    lab: abiss_lab::Lab,
    /// Files being written with the model off ([`ModelOff`]).
    fills: usize,
    /// Daemons managing the disk and copy loops on it ([`DiskLoad`]).
    loads: usize,
}

impl LabDisk {
    /// Whether `device` (a device's or a file's) is this disk's.
    fn holds(&self, device: u64) -> bool {
        device == self.device || device == self.file_device
    }
}

fn lab_disks() -> MutexGuard<'static, Vec<LabDisk>> {
    LAB_DISKS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn register_lab_disk(lab: &abiss_lab::Lab, state_dir: &Path) {
    let device = device_number(lab.device()).expect("the lab's loop device");
    let lab = abiss_lab::Lab::open(state_dir).expect("a second handle on the lab");
    let file_device = lab.mount_dir().and_then(device_number).unwrap_or(device);
    lab_disks().push(LabDisk {
        device,
        file_device,
        lab,
        fills: 0,
        loads: 0,
    });
}

/// The device a path is on: a block device's own number, or that of the file system holding
/// the file (or, if it does not exist yet, its directory).
fn device_number(path: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let metadata = std::fs::metadata(path).or_else(|_| {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        std::fs::metadata(parent.unwrap_or(Path::new(".")))
    });
    let metadata = metadata.ok()?;
    Some(if metadata.file_type().is_block_device() {
        metadata.rdev()
    } else {
        metadata.dev()
    })
}

/// A load on lab disks (a daemon managing one, a copy loop on one), for as long as it is held:
/// [`write_cold_file`] keeps the model on for files on those disks meanwhile.
#[derive(Debug)]
pub(crate) struct DiskLoad {
    devices: Vec<u64>,
}

impl DiskLoad {
    /// A load on those of `paths` (devices or files) that are on lab disks; `None` if none is.
    pub(crate) fn on<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Option<Self> {
        let mut disks = lab_disks();
        let mut devices = Vec::new();
        for device in paths.into_iter().filter_map(device_number) {
            if devices.contains(&device) {
                continue;
            }
            if let Some(disk) = disks.iter_mut().find(|d| d.holds(device)) {
                disk.loads += 1;
                devices.push(device);
            }
        }
        drop(disks);
        // Not `then_some`: it would make (and drop, locking the list again) an empty load.
        if devices.is_empty() {
            None
        } else {
            Some(Self { devices })
        }
    }
}

impl Drop for DiskLoad {
    fn drop(&mut self) {
        for disk in lab_disks()
            .iter_mut()
            .filter(|d| self.devices.iter().any(|&device| d.holds(device)))
        {
            disk.loads -= 1;
        }
    }
}

/// A lab disk's model switched off while a file is put on it; switched back on when dropped
/// (also when unwinding from a panic).
struct ModelOff {
    device: u64,
}

impl ModelOff {
    /// Switches the model off for a file at `path`, if `path` is on a lab disk of this process
    /// with no [`DiskLoad`] on it.
    fn for_file(path: &Path) -> Option<Self> {
        let device = device_number(path)?;
        let mut disks = lab_disks();
        let disk = disks.iter_mut().find(|d| d.holds(device) && d.loads == 0)?;
        if disk.fills == 0 {
            disk.lab
                .set_unmodelled(true)
                .expect("switch the lab's model off");
        }
        disk.fills += 1;
        Some(Self { device })
    }
}

impl Drop for ModelOff {
    fn drop(&mut self) {
        let mut disks = lab_disks();
        let Some(disk) = disks.iter_mut().find(|d| d.holds(self.device)) else {
            return;
        };
        disk.fills -= 1;
        if disk.fills > 0 {
            return;
        }
        if let Err(error) = disk.lab.set_unmodelled(false) {
            // A panic while unwinding would abort, and hide the first one.
            if std::thread::panicking() {
                eprintln!("switching the lab's model back on: {error}");
            } else {
                panic!("switching the lab's model back on: {error}");
            }
        }
    }
}

/// Writes a file of `bytes` pseudo-random bytes ([`cold_file_bytes`]), synced and evicted from
/// the page cache.
///
/// On the disk of an [`HddLab`] of this process, the file is written with the lab's model
/// switched off ([`abiss_lab::Lab::set_unmodelled`]): it stands for data that was on the disk
/// before the test, and costs no modelled time (200 MB took 5 s at the emulated disk's rate),
/// nor shows in the lab's statistics. Before the model is switched back on (also when this
/// panics), the file is synced, and the file system with it (`syncfs`, and ext4's journal
/// checkpointed), so that no write of the fill reaches the model later, and the file is
/// evicted: the first read of it is a modelled cold read, as on any disk.
///
/// Other I/O on that disk meanwhile would go unmodelled too. While a [`Daemon`](crate::Daemon)
/// manages the disk or a [`CopyLoop`] runs on it, the file is written under the model instead,
/// as before; I/O a test starts on the disk by other means is not known here: write the files
/// first.
pub fn write_cold_file(path: &Path, bytes: u64) {
    write_cold(path, bytes, |block| block);
}

/// As [`write_cold_file`], but every other 4 KiB page of the file is zeros, so that a file
/// system that compresses (btrfs with `compress=zstd`) keeps it in about half the space.
pub fn write_cold_compressible_file(path: &Path, bytes: u64) {
    write_cold(path, bytes, |block| {
        for page in block.chunks_mut(8192) {
            let half = page.len().min(4096);
            page[..half].fill(0);
        }
        block
    });
}

fn write_cold(path: &Path, bytes: u64, shape: impl Fn(&mut [u8]) -> &mut [u8]) {
    let _timer = FixtureTimer::start(format!("cold file of {} MiB", bytes >> 20));
    let model_off = ModelOff::for_file(path);
    let mut file = File::create(path).expect("create file");
    cold_blocks(bytes, |block| {
        let mut owned = block.to_vec();
        file.write_all(shape(&mut owned)).expect("write");
    });
    file.sync_all().expect("sync");
    if model_off.is_some() {
        sync_file_system(&file);
    }
    evict(&file);
    drop(model_off);
}

/// A 128 MiB ext4 over memory whose root every user may enter, with a cold file
/// ([`write_cold_file`]) of each of `files` (name, bytes) that every user may read: where
/// the tests of what one user may do to another's stream put their files.
#[must_use]
pub fn shared_fs(files: &[(&str, u64)]) -> (Ext4Mount, Vec<PathBuf>) {
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    chmod(fs.path(), 0o755);
    let paths = files
        .iter()
        .map(|&(name, bytes)| {
            let path = fs.path().join(name);
            write_cold_file(&path, bytes);
            chmod(&path, 0o644);
            path
        })
        .collect();
    (fs, paths)
}

/// The contents [`write_cold_file`] writes for a file of `bytes` bytes.
#[must_use]
pub fn cold_file_bytes(bytes: u64) -> Vec<u8> {
    let mut contents = Vec::with_capacity(usize::try_from(bytes).expect("fits in memory"));
    cold_blocks(bytes, |block| contents.extend_from_slice(block));
    contents
}

/// Hands the contents of a cold file of `bytes` bytes to `each`, 1 MiB at a time.
fn cold_blocks(bytes: u64, mut each: impl FnMut(&[u8])) {
    let mut block = vec![0u8; 1 << 20];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ bytes;
    let mut done = 0;
    while done < bytes {
        for chunk in block.chunks_mut(8) {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        let n = usize::try_from((bytes - done).min(block.len() as u64)).expect("fits");
        each(&block[..n]);
        done += n as u64;
    }
}

/// `_IOW('f', 43, __u32)`: write everything in an ext4 file system's journal to its place
/// (Linux 5.13).
const EXT4_IOC_CHECKPOINT: libc::c_ulong = 0x4004_662b;

/// Brings what is dirty in `file`'s file system to the disk, metadata included: `syncfs`,
/// then ext4's journal checkpointed, which jbd2 would otherwise do at some later time.
fn sync_file_system(file: &File) {
    use std::os::unix::io::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: syncfs on an open descriptor.
    let rc = unsafe { libc::syncfs(fd) };
    assert_eq!(rc, 0, "syncfs: {}", std::io::Error::last_os_error());
    let flags: u32 = 0;
    // SAFETY: the ioctl reads one u32 of flags. Without it (not ext4, an older kernel) the
    // journal's blocks are written later, as they always were.
    let _ = unsafe { libc::ioctl(fd, EXT4_IOC_CHECKPOINT, &raw const flags) };
}

/// A best-effort copy loop, as in the ABISS measurement: the benchmarks' copy loop (128 KiB
/// reads and writes, the source dropped from the page cache each pass, writeback kept going in
/// windows as under a small machine's dirty limit), stopped on drop.
#[derive(Debug)]
pub struct CopyLoop {
    inner: Option<abiss_bench::workload::CopyLoop>,
    /// A load on the lab disk it copies on, if it does (see [`write_cold_file`]).
    load: Option<DiskLoad>,
}

impl CopyLoop {
    /// Starts copying.
    #[must_use]
    pub fn start(source: PathBuf, target: PathBuf) -> Self {
        Self {
            load: DiskLoad::on([source.as_path(), target.as_path()]),
            inner: Some(abiss_bench::workload::CopyLoop::start(
                source,
                target,
                128 << 10,
            )),
        }
    }

    /// Stops and returns the bytes copied.
    ///
    /// # Panics
    /// If the copy failed.
    pub fn stop(&mut self) -> u64 {
        let Some(inner) = self.inner.take() else {
            return 0;
        };
        let copied = inner.copied_bytes();
        inner.stop().expect("the copy loop");
        self.load = None;
        copied
    }
}

impl Drop for CopyLoop {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            let _ = inner.stop();
        }
    }
}
