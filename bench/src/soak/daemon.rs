//! abissd under the soak: started, killed with SIGKILL and restarted while the users' workers
//! cycle, and what its last run holds at the end.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, StreamTarget};
use serde_json::{json, Value};

use super::system::{hash_map_entries, process_footprint, DiskSettings};
use super::worker::{float, Worker};
use super::{ShmDisk, SoakArgs, Users, STREAM};
use crate::daemon::{DaemonCommand, DaemonProcess};

/// How long the last abissd is left alone after the users before what it holds is counted.
const SETTLE: Duration = Duration::from_secs(10);

/// abissd under the soak: started, killed, restarted, on one socket and state directory.
pub(super) struct Soak {
    bin_dir: PathBuf,
    device: PathBuf,
    disk: String,
    dir: PathBuf,
    daemon: Option<DaemonProcess>,
    original: Option<DiskSettings>,
    baseline: Value,
    pub(super) kills: Vec<Value>,
    /// Set while abissd is killed and restarted (root's asking counts those answers apart).
    restarting: Arc<std::sync::atomic::AtomicBool>,
}

impl Soak {
    pub(super) fn new(bin_dir: &Path, disk: &ShmDisk) -> anyhow::Result<Self> {
        let dir = disk.dir.join("daemon");
        std::fs::create_dir_all(&dir)?;
        let mut soak = Self {
            bin_dir: bin_dir.to_path_buf(),
            device: disk.device.clone(),
            disk: disk.name.clone(),
            dir,
            daemon: None,
            original: DiskSettings::of(&disk.name),
            baseline: Value::Null,
            kills: Vec::new(),
            restarting: Arc::default(),
        };
        soak.start(true)?;
        Ok(soak)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("abiss.sock")
    }

    fn pid(&self) -> u32 {
        self.daemon.as_ref().map_or(0, DaemonProcess::pid)
    }

    /// Starts abissd (managing the disk, or not: then it only recovers what a killed one
    /// left) and waits until it answers.
    fn start(&mut self, managing: bool) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut command = DaemonCommand::new(&self.bin_dir, &self.dir).log("error");
        if managing {
            command = command.args(["--device", &self.device.to_string_lossy()]);
        }
        self.daemon = Some(command.start()?);
        Ok(started.elapsed())
    }

    /// Ends the running abissd: `kill -9`, or SIGTERM.
    fn end(&mut self, kill: bool) -> Option<i32> {
        let mut daemon = self.daemon.take()?;
        if kill {
            daemon.kill()
        } else {
            daemon.stop()
        }
    }

    /// One stream at every level and back (a prefetch worker per level starts with the
    /// level's first stream); what the daemon then holds.
    fn warm_up(&mut self, file: &Path) -> anyhow::Result<Value> {
        let mut root = Client::connect(&self.socket())?;
        for level in 0..abiss_proto::ABISS_LEVELS {
            let stream = root.attach(
                &std::fs::File::open(file)?,
                AttachRequest {
                    priority: level,
                    ..STREAM
                },
            )?;
            root.detach(StreamTarget::Id(stream.id))?;
        }
        // And a recording allocated ahead, which starts the thread that gives such blocks back
        // (one per abissd, for its life), as the hostile user's recordings do.
        let recording = std::fs::File::options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(file.with_extension("rec"))?;
        let stream = root.attach(
            &recording,
            AttachRequest {
                write: true,
                preallocate: true,
                ..STREAM
            },
        )?;
        drop(recording);
        root.detach(StreamTarget::Id(stream.id))?;
        drop(root);
        std::thread::sleep(Duration::from_millis(500));
        Ok(json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        }))
    }

    /// `kill -9`, then an abissd without disks (it puts back what the killed one left), the
    /// disk's settings compared with the original, and the managing abissd again.
    fn kill_and_restart(&mut self, cycle: u64, baseline_file: &Path) -> anyhow::Result<()> {
        self.restarting.store(true, Ordering::Relaxed);
        let result = self.kill_and_restart_now(cycle, baseline_file);
        self.restarting.store(false, Ordering::Relaxed);
        result
    }

    fn kill_and_restart_now(&mut self, cycle: u64, baseline_file: &Path) -> anyhow::Result<()> {
        let before_kill = json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        });
        self.end(true);
        let after_kill = DiskSettings::of(&self.disk);
        let recovery = self.start(false)?;
        let recovered = DiskSettings::of(&self.disk);
        self.end(false);
        let restart = self.start(true)?;
        let retaken = DiskSettings::of(&self.disk);
        // With the users' cycles going on: for the record, not the baseline.
        let warmed_up = self.warm_up(baseline_file)?;
        self.kills.push(json!({
            "at_cycle": cycle,
            "daemon_before_kill": before_kill,
            "disk_after_kill": after_kill,
            "disk_after_recovery": recovered,
            "restored": recovered == self.original,
            "disk_after_restart": retaken,
            "recovery_start_s": recovery.as_secs_f64(),
            "restart_s": restart.as_secs_f64(),
            "after_restart_under_load": warmed_up,
        }));
        println!(
            "soak: kill -9 at cycle {cycle}: disk {} after recovery, restarted in {:.2} s",
            if recovered == self.original {
                "restored"
            } else {
                "NOT restored"
            },
            restart.as_secs_f64()
        );
        Ok(())
    }

    /// Runs the workers, killing and restarting abissd on the way.
    pub(super) fn cycle(
        &mut self,
        args: &SoakArgs,
        users: &Users,
        files: &[PathBuf],
        hostile_file: &Path,
        baseline_file: &Path,
    ) -> anyhow::Result<Cycles> {
        // Every abissd of the soak is the same program with the same options: the first one,
        // quiet after its warm-up, is what the last one must come back to.
        self.baseline = self.warm_up(baseline_file)?;
        let done = Arc::new(AtomicU64::new(0));
        let mut workers = Vec::new();
        let share = args.cycles / 4;
        for (index, file) in files.iter().enumerate() {
            let cycles = if index == 0 {
                args.cycles - 3 * share
            } else {
                share
            };
            let user = (index > 0).then(|| &users.ids[index - 1]);
            workers.push(Worker::start(&self.socket(), file, cycles, user, &done)?);
        }
        // Nobody's attacks and root's view of them last as long as the workers.
        let hostile = super::hostile::HostileUser::start(
            &self.bin_dir,
            &self.socket(),
            hostile_file,
            &self.device,
        )?;
        let probe = super::hostile::StatusProbe::start(&self.socket(), &self.restarting);
        let started = Instant::now();
        let mut samples = Vec::new();
        let mut next_kill = args.kill_every;
        while workers.iter_mut().any(Worker::running) {
            crate::interrupt::check()?;
            let now = done.load(Ordering::Relaxed);
            if now >= next_kill && now < args.cycles {
                self.kill_and_restart(now, baseline_file)?;
                next_kill += args.kill_every;
            }
            samples.push((
                started.elapsed().as_secs_f64(),
                now,
                process_footprint(self.pid()),
            ));
            std::thread::sleep(Duration::from_millis(200));
        }
        let root_status = probe.finish();
        let mut hostile = hostile.finish()?;
        hostile["root_status"] = root_status;
        let reports = workers
            .into_iter()
            .map(Worker::finish)
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Cycles {
            wall_s: started.elapsed().as_secs_f64(),
            done: done.load(Ordering::Relaxed),
            reports,
            samples,
            hostile,
        })
    }

    /// After the workers: what the last abissd holds against its baseline, then its clean stop
    /// and the disk's settings after it.
    pub(super) fn finish(&mut self) -> anyhow::Result<Value> {
        // The hostile user's last closes wait (the stalling file's flush 1 s; a lingering
        // socket until the hostile user lets it go as it ends), and a user's closing or
        // locking thread ends 5 s after its last work.
        std::thread::sleep(SETTLE);
        // Counted before root's own connection, which the daemon closes a moment after root.
        let now = json!({
            "process": process_footprint(self.pid()),
            "hash_map_entries": hash_map_entries(self.pid()),
        });
        let mut root = Client::connect(&self.socket())?;
        let streams = root.list()?.len();
        let (_, raises) = root.status_and_raises()?;
        drop(root);
        let exit = self.end(false);
        let disk = DiskSettings::of(&self.disk);
        Ok(json!({
            "baseline": self.baseline,
            "at_end": now,
            "streams_left": streams,
            "raised_threads": raises.active,
            "raises_total": raises.total,
            "raises_restored": raises.restored,
            "exit_code": exit,
            "note": "raises_* count the last abissd's raises only (since its start)",
            "disk_original": self.original,
            "disk_after_stop": disk,
            "disk_restored_at_stop": disk == self.original,
        }))
    }
}

impl Drop for Soak {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// The cycles' outcome.
pub(super) struct Cycles {
    wall_s: f64,
    done: u64,
    reports: Vec<Value>,
    /// (seconds, cycles done, daemon footprint) every 200 ms.
    pub(super) samples: Vec<(f64, u64, Value)>,
    /// The hostile user, and root's `status` latency meanwhile.
    hostile: Value,
}

impl Cycles {
    pub(super) fn to_json(&self) -> Value {
        json!({
            "done": self.done,
            "wall_s": self.wall_s,
            "per_s": float(self.done) / self.wall_s.max(1e-9),
            "workers": self.reports,
            "hostile": self.hostile,
        })
    }
}
