//! The emulated disk a benchmark runs on: a private lab with ext4, taken down on drop
//! (including on errors and Ctrl-C), so no loop device, mount or emulator outlives the run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use abiss_lab::{FilesystemKind, Lab, LabOptions, RequestRecord};
use anyhow::Context as _;
use serde::Serialize;

use crate::interrupt;

/// The file system a benchmark's lab disk carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchFs {
    /// ext4, as in every result before issue 35.
    #[default]
    Ext4,
    /// btrfs on the one device.
    Btrfs,
    /// btrfs mounted with `compress=zstd`.
    BtrfsZstd,
}

impl BenchFs {
    /// As the reports name it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ext4 => "ext4",
            Self::Btrfs => "btrfs",
            Self::BtrfsZstd => "btrfs (compress=zstd)",
        }
    }
}

/// A lab hdd with ext4 (or btrfs) mounted, private to this process.
#[derive(Debug)]
pub struct LabDisk {
    lab: Lab,
    state_dir: PathBuf,
    read_ahead_kb: u32,
    fs: BenchFs,
}

/// The block queue settings a run had, for the reports.
#[derive(Clone, Debug, Serialize)]
pub struct QueueSettings {
    /// The device, e.g. `/dev/loop3`.
    pub device: String,
    /// Readahead window of the device (`queue/read_ahead_kb`).
    pub read_ahead_kb: String,
    /// Requests the scheduler holds (`queue/nr_requests`).
    pub nr_requests: String,
    /// Requests the emulated disk gets at once (driver tags, from debugfs).
    pub dispatch_depth: Option<u32>,
    /// Whether the device says it is rotational.
    pub rotational: bool,
}

impl LabDisk {
    /// Brings up the default hdd model (a 5400 rpm laptop disk) with `size_bytes`, makes ext4
    /// on it and mounts it, in directories named after `benchmark` and this process, with a
    /// readahead of `read_ahead_kb`.
    ///
    /// A loop device inherits a large readahead from its backing file (2.5 MiB over the lab's
    /// FUSE image, and the kernel resets it to that whenever the queue limits change, e.g. on
    /// writing `rotational`), while the kernel gives a SATA disk 128 KiB. The readahead
    /// decides how often a 1 MB/s reader reaches the disk at all, so it is set here and again
    /// after every elevator change.
    pub fn up(benchmark: &str, size_bytes: u64, read_ahead_kb: u32) -> anyhow::Result<Self> {
        Self::up_with(benchmark, size_bytes, read_ahead_kb, BenchFs::Ext4, None)
    }

    /// As [`LabDisk::up`], with file system `fs`, and the hdd taking `hdd_queue_depth`
    /// requests at once instead of its model's (`lab/models/default.toml`), where given.
    pub fn up_with(
        benchmark: &str,
        size_bytes: u64,
        read_ahead_kb: u32,
        fs: BenchFs,
        hdd_queue_depth: Option<u32>,
    ) -> anyhow::Result<Self> {
        let name = format!("abiss-bench-{benchmark}-{}", std::process::id());
        let mkfs = match fs {
            BenchFs::Ext4 => FilesystemKind::Ext4,
            BenchFs::Btrfs | BenchFs::BtrfsZstd => FilesystemKind::Btrfs,
        };
        // On disk (/var/tmp) where memory has no room for the image: it can be large.
        let dir = PathBuf::from(format!("/var/tmp/{name}"));
        let mut options = LabOptions::hdd_in(&dir, size_bytes, Some(mkfs))
            .context("cannot find the abiss-lab executable (set ABISS_LAB_BIN)")?;
        options.mount_options = (fs == BenchFs::BtrfsZstd).then(|| "compress=zstd".to_owned());
        if let Some(depth) = hdd_queue_depth {
            options.model.hdd.queue_depth = depth;
        }
        let lab = Lab::up(&options).context("cannot bring the lab up")?;
        let disk = Self {
            lab,
            state_dir: options.state_dir,
            read_ahead_kb,
            fs,
        };
        disk.apply_read_ahead()?;
        if fs != BenchFs::Ext4 {
            return Ok(disk);
        }
        // mkfs leaves inode tables to be zeroed lazily by a kernel thread after mounting;
        // that background writing would land in the first runs.
        let mount = disk.mount_dir().to_string_lossy().into_owned();
        let status = std::process::Command::new("mount")
            .args(["-o", "remount,noinit_itable", &mount])
            .status()
            .context("cannot run mount")?;
        anyhow::ensure!(
            status.success(),
            "remount of {mount} with noinit_itable failed"
        );
        Ok(disk)
    }

    fn apply_read_ahead(&self) -> anyhow::Result<()> {
        let path = Path::new("/sys/block")
            .join(self.device().file_name().unwrap_or_default())
            .join("queue/read_ahead_kb");
        std::fs::write(&path, self.read_ahead_kb.to_string())
            .with_context(|| format!("cannot write {}", path.display()))?;
        let now = std::fs::read_to_string(&path)?;
        anyhow::ensure!(
            now.trim() == self.read_ahead_kb.to_string(),
            "{} is {} after writing {}",
            path.display(),
            now.trim(),
            self.read_ahead_kb
        );
        Ok(())
    }

    /// Its file system.
    #[must_use]
    pub fn fs(&self) -> BenchFs {
        self.fs
    }

    /// The block device.
    #[must_use]
    pub fn device(&self) -> &Path {
        self.lab.device()
    }

    /// Where ext4 is mounted.
    #[must_use]
    pub fn mount_dir(&self) -> &Path {
        self.lab.mount_dir().unwrap_or(Path::new("/nonexistent"))
    }

    /// The emulated disk's size.
    #[must_use]
    pub fn size_bytes(&self) -> u64 {
        self.lab.state().size_bytes
    }

    /// The device model, for the reports.
    #[must_use]
    pub fn model(&self) -> &abiss_lab::ModelSpec {
        &self.lab.state().model
    }

    /// Runs `lay_out` with the disk's model off: what it writes stands for data that was on
    /// the disk before the experiment, and costs no emulated disk time (1.25 GiB of the
    /// players' load took half a minute of it). `lay_out` must sync what it wrote: only
    /// requests that reach the emulator before the model is back on go unmodelled. The model
    /// is back on whether or not `lay_out` succeeded.
    pub fn unmodelled<T>(&self, lay_out: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        self.lab
            .set_unmodelled(true)
            .context("cannot switch the lab's model off")?;
        let result = lay_out();
        self.lab
            .set_unmodelled(false)
            .context("cannot switch the lab's model back on")?;
        result
    }

    /// Selects `elevator`, keeping the dispatch depth the lab set from the model.
    pub fn select_elevator(&self, elevator: &str) -> anyhow::Result<()> {
        let model = &self.lab.state().model;
        abiss_lab::lab::configure_queue(
            self.device(),
            model.queue_depth(),
            model.rotational(),
            Some(elevator),
        )
        .with_context(|| format!("cannot select the {elevator} elevator"))?;
        self.apply_read_ahead()
    }

    /// The queue settings in force now.
    #[must_use]
    pub fn queue_settings(&self) -> QueueSettings {
        let queue = Path::new("/sys/block")
            .join(self.device().file_name().unwrap_or_default())
            .join("queue");
        let attr = |name: &str| {
            std::fs::read_to_string(queue.join(name))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        QueueSettings {
            device: self.device().display().to_string(),
            read_ahead_kb: attr("read_ahead_kb"),
            nr_requests: attr("nr_requests"),
            dispatch_depth: abiss_lab::lab::driver_tag_depth(self.device()),
            rotational: attr("rotational") == "1",
        }
    }

    /// A cursor over the requests the disk serves from now on.
    pub fn requests_from_now(&self) -> anyhow::Result<abiss_lab::StatsCursor> {
        Ok(self.lab.stats_cursor()?)
    }

    /// Waits until the disk has served no request for `quiet` (at most `limit`); returns
    /// whether it became quiet.
    pub fn wait_until_idle(&self, quiet: Duration, limit: Duration) -> anyhow::Result<bool> {
        let mut cursor = self.lab.stats_cursor()?;
        let started = Instant::now();
        let mut last_request = Instant::now();
        while started.elapsed() < limit {
            interrupt::check()?;
            std::thread::sleep(Duration::from_millis(200));
            let records: Vec<RequestRecord> = cursor.read_new()?;
            if records.is_empty() {
                if last_request.elapsed() >= quiet {
                    return Ok(true);
                }
            } else {
                last_request = Instant::now();
            }
        }
        Ok(false)
    }
}

impl Drop for LabDisk {
    fn drop(&mut self) {
        if let Err(error) = Lab::down(&self.state_dir) {
            eprintln!(
                "abiss-bench: taking the lab down failed ({error}); run `abiss-lab down --state-dir {}`",
                self.state_dir.display()
            );
        }
        // The lab's own directory (`LabOptions::hdd_in`), empty once the lab is down.
        if let Some(dir) = self.state_dir.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// `rows` without those whose elevator this kernel lacks (kernels may be built without bfq),
/// each said on stderr; a row named on the command line (`named`) that needs a missing
/// elevator is an error instead.
pub fn with_elevators_present<R>(
    rows: Vec<R>,
    named: &[String],
    name: impl Fn(&R) -> &str,
    elevator: impl Fn(&R) -> &str,
) -> anyhow::Result<Vec<R>> {
    let mut kept = Vec::with_capacity(rows.len());
    for row in rows {
        if abiss_lab::system::elevator_available(elevator(&row)) {
            kept.push(row);
            continue;
        }
        let offered = abiss_lab::system::elevators_offered().join(", ");
        anyhow::ensure!(
            !named.iter().any(|n| n == name(&row)),
            "row {} needs the {} I/O scheduler, which this kernel does not have (its schedulers: {offered})",
            name(&row),
            elevator(&row)
        );
        eprintln!(
            "not running row {}: this kernel has no {} I/O scheduler (its schedulers: {offered})",
            name(&row),
            elevator(&row)
        );
    }
    Ok(kept)
}
