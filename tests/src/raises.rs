//! A stream `nobody` owns on a managed disk (over memory, or the lab's hdd), with readers of
//! `nobody`'s that abissd raises: the fixture of the raise attacks (`tests/security_raises.rs`,
//! `tests/security_raises_clone_io.rs`, `tests/security_raise_merges.rs`).

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::daemon::Daemon;
use crate::devices::Ext4Mount;
use crate::lab_disk::{shared_fs, write_cold_file, HddLab};
use crate::users::{abissctl_as_nobody, as_nobody, chmod, wait_for_ioprio, RT0};
use crate::{binary, wait_until};

/// The reader's own priority, set by itself (an unprivileged user may): BE/5, so a put-back
/// is told from the kernel's default.
pub const READER_IOPRIO: &str = "2/5";

/// Where nobody's files are: ext4 on a loop device over memory, or on the lab's hdd.
#[derive(Debug)]
pub enum SharedDisk {
    /// Over memory: fast, so requests seldom wait in the disk's queue.
    Memory(Ext4Mount),
    /// The lab's emulated hdd, whose queue holds what its four slots cannot take yet.
    Hdd(Box<HddLab>),
}

/// A managed disk with nobody's stream on `stream_bytes` of cold file at `rate`, attached by
/// nobody, and another cold file of `other_bytes` nobody may read.
#[derive(Debug)]
pub struct NobodysStream {
    /// abissd, managing the loop device. First, so that it stops (and puts the disk back, and
    /// lets go of the file) before the disk below it is taken down: fields drop in order.
    pub daemon: Daemon,
    /// The file system and its disk.
    pub disk: SharedDisk,
    /// The stream's file.
    pub stream: PathBuf,
    /// The other file.
    pub other: PathBuf,
}

impl NobodysStream {
    /// Files of `stream_bytes` and `other_bytes`, the first attached by nobody at `rate`.
    #[must_use]
    pub fn new(stream_bytes: u64, other_bytes: u64, rate: &str) -> Self {
        let (fs, files) = shared_fs(&[("nobodys.bin", stream_bytes), ("other.bin", other_bytes)]);
        let [stream, other] = <[PathBuf; 2]>::try_from(files).expect("two files");
        Self::attached(SharedDisk::Memory(fs), stream, other, rate)
    }

    /// The same on a 1 GiB lab hdd (`tag` names its lab).
    #[must_use]
    pub fn on_hdd(tag: &str, stream_bytes: u64, other_bytes: u64, rate: &str) -> Self {
        let lab = HddLab::up(tag, 1, "none");
        chmod(lab.mount(), 0o755);
        let [stream, other] =
            [("nobodys.bin", stream_bytes), ("other.bin", other_bytes)].map(|(name, bytes)| {
                let path = lab.mount().join(name);
                write_cold_file(&path, bytes);
                chmod(&path, 0o644);
                path
            });
        Self::attached(SharedDisk::Hdd(Box::new(lab)), stream, other, rate)
    }

    fn attached(disk: SharedDisk, stream: PathBuf, other: PathBuf, rate: &str) -> Self {
        let device = match &disk {
            SharedDisk::Memory(fs) => fs.device().path().to_path_buf(),
            SharedDisk::Hdd(lab) => lab.device().to_path_buf(),
        };
        let daemon = Daemon::start_managing(&device, &[]);
        let attached = abissctl_as_nobody(
            daemon.socket(),
            &["attach", &stream.to_string_lossy(), "--rate", rate],
        );
        assert!(attached.status.success(), "{attached:?}");
        Self {
            daemon,
            disk,
            stream,
            other,
        }
    }

    /// The kernel's name of the managed disk (`loop3`).
    #[must_use]
    pub fn device_name(&self) -> String {
        match &self.disk {
            SharedDisk::Memory(fs) => fs.device().name(),
            SharedDisk::Hdd(lab) => lab
                .device()
                .file_name()
                .expect("a device name")
                .to_string_lossy()
                .into_owned(),
        }
    }

    /// Nobody's test reader of the stream with `args` (rate, read size, buffer, seconds,
    /// options); returns it once it is raised, which is the premise of the tests.
    #[must_use]
    pub fn raised_reader(&self, args: &[&str]) -> Child {
        let reader = as_nobody(&binary("abiss-test-reader"))
            .arg(&self.stream)
            .args(args)
            .args(["--ioprio", READER_IOPRIO])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the test reader as nobody");
        assert!(
            wait_for_ioprio(reader.id(), RT0, Duration::from_secs(2)).is_some(),
            "nobody's reader of nobody's stream is raised (the premise of the test)"
        );
        reader
    }

    /// Waits until abissd has `raises` raises in its table: a reader is seen raised a moment
    /// before abissd has recorded its raise, and a test that stops abissd must not stop it in
    /// between.
    pub fn until_recorded(&self, raises: u64) {
        let mut client = abiss_client::Client::connect(self.daemon.socket()).expect("connect");
        let recorded = wait_until(Duration::from_secs(2), || {
            client.status_report().expect("status").raises.active >= raises
        });
        assert!(recorded, "abissd did not record {raises} raises");
    }

    /// What `status` says of raises, and what `list` says of the stream's policed readers.
    #[must_use]
    pub fn policed(&self) -> (abiss_proto::RaiseReport, u64) {
        let mut client = abiss_client::Client::connect(self.daemon.socket()).expect("connect");
        let raises = client.status_report().expect("status").raises;
        let listed = client.list().expect("list");
        (raises, listed[0].policed)
    }
}

/// Reads `bytes` of `path` from `from` (rounded down to 4 KiB) in 4 KiB `O_DIRECT` reads
/// through `io_uring`, each submitted by a call of its own, `depth` in flight; the bytes read.
#[must_use]
pub fn read_direct_chain(path: &str, from: u64, bytes: u64, depth: u64) -> u64 {
    const PIECE_BYTES: u32 = 4096;
    const PIECE: usize = PIECE_BYTES as usize;
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    let depth = usize::try_from(depth.max(1)).expect("depth");
    let mut ring =
        io_uring::IoUring::new(u32::try_from(depth * 2).expect("depth")).expect("io_uring");
    let layout = std::alloc::Layout::from_size_align(PIECE * depth, PIECE).expect("layout");
    // SAFETY: a non-zero size; freed below, after the last completion.
    let buffers = unsafe { std::alloc::alloc(layout) };
    assert!(!buffers.is_null(), "allocate the buffers");
    let pieces = bytes / PIECE as u64;
    let mut offset = from / PIECE as u64 * PIECE as u64;
    let (mut submitted, mut completed, mut read) = (0u64, 0u64, 0u64);
    while completed < pieces {
        while submitted < pieces && submitted - completed < depth as u64 {
            let slot = usize::try_from(submitted % depth as u64).expect("slot");
            // SAFETY: within the allocation; each slot is reused only after its completion.
            let buffer = unsafe { buffers.add(slot * PIECE) };
            let entry = io_uring::opcode::Read::new(
                io_uring::types::Fd(file.as_raw_fd()),
                buffer,
                PIECE_BYTES,
            )
            .offset(offset)
            .build()
            .user_data(submitted);
            // SAFETY: the buffer outlives the request (freed after every completion).
            unsafe { ring.submission().push(&entry) }.expect("push");
            // One request per call: the kernel plugs only a batch of several.
            ring.submit().expect("submit");
            offset += PIECE as u64;
            submitted += 1;
        }
        ring.submit_and_wait(1).expect("wait");
        for completion in ring.completion() {
            completed += 1;
            read += u64::try_from(completion.result().max(0)).unwrap_or(0);
        }
    }
    // SAFETY: allocated above with this layout; no request is in flight.
    unsafe { std::alloc::dealloc(buffers, layout) };
    read
}
