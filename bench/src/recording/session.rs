//! The lab disk with a file system, the players' media and the readers' file, and one row:
//! recorders and players under the load, from a cold page cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use abiss_os::clock::monotonic_ns;
use anyhow::Context as _;
use serde::Serialize;

use super::direct::RecordSink;
use super::filesystem::FileSystem;
use super::load::{self, LoadFigures, LoadFiles, LoadKind};
use super::recorder::{RecorderKind, RecorderResult, RunningRecorder, Tracer};
use super::writes::quantile;
use super::{Configuration, DISK_BYTES, PLAYERS, RECORDERS};
use crate::abiss::Daemon;
use crate::cpu::{busy_pct, cpu_times, load_average};
use crate::interrupt;
use crate::lab_disk::LabDisk;
use crate::layout::drop_cached_pages;
use crate::players::baseline::{baseline, Baseline};
use crate::players::media;
use crate::players::player::play_for;
use crate::players::player::{PlayerKind, PlayerSpec, RunningPlayer, Wrapper};
use crate::players::session::{player_result, PlayerResult};
use crate::players::watch::{StreamFigures, StreamWatch};
use crate::players::Class;
use crate::request_trace::{self, RealTimeWrites, RequestTrace};
use crate::trial::sleep_interruptibly;

/// How long `perf trace` gets to set up before the recorders start.
const TRACER_SETUP: Duration = Duration::from_secs(2);

/// What a row runs.
#[derive(Clone, Copy, Debug)]
pub struct RowPlan<'a> {
    /// The row.
    pub row: &'a Configuration,
    /// Seconds the load runs before the recorders and players start.
    pub warmup: Duration,
    /// Seconds they run.
    pub secs: u64,
    /// `abissctl run --rate` of the players.
    pub player_rate: &'a str,
    /// `abissctl run --preroll` of each player (`0`: none).
    pub player_preroll: &'a str,
    /// `abissctl run --write --rate` of the recorders.
    pub recorder_rate: &'a str,
    /// `abissctl run --write --buffer` of the recorders.
    pub recorder_buffer: &'a str,
    /// `abissctl record --buffer` of the recorders in a direct row.
    pub record_buffer: &'a str,
    /// `abissctl record --preallocate` in a direct row.
    pub record_preallocate: bool,
    /// The capture buffer the recorders' overflows are counted against, ms.
    pub capture_ms: u64,
    /// Where to keep each recorder's `perf trace` output, if anywhere.
    pub traces_dir: Option<&'a Path>,
}

/// Write durations over all of a row's recorders.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PooledWrites {
    /// Calls.
    pub writes: usize,
    /// 99th percentile, ms (nearest rank).
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Most, ms.
    pub max_ms: f64,
}

impl PooledWrites {
    fn of(recorders: &[RecorderResult]) -> Self {
        let mut all: Vec<f64> = recorders
            .iter()
            .flat_map(|r| r.durations_ms.iter().copied())
            .collect();
        all.sort_by(f64::total_cmp);
        Self {
            writes: all.len(),
            p99_ms: quantile(&all, 0.99),
            p999_ms: quantile(&all, 0.999),
            max_ms: quantile(&all, 1.0),
        }
    }
}

/// The lab disk, its current file system and what is on it.
#[derive(Debug)]
pub struct Bench {
    disk: LabDisk,
    file_system: FileSystem,
    source: PathBuf,
    media: Vec<PathBuf>,
    load: Option<LoadFiles>,
    load_kind: LoadKind,
    scratch: PathBuf,
    bin_dir: Option<PathBuf>,
}

/// One row's results.
#[derive(Clone, Debug, Serialize)]
pub struct RowResult {
    /// What the row ran: the report writes it as its row's configuration, not again here.
    #[serde(skip)]
    pub row: Configuration,
    /// Seconds the recorders and players ran.
    pub secs: u64,
    /// Each recorder.
    pub recorders: Vec<RecorderResult>,
    /// The write(2) durations of all recorders together: calls, p99, p99.9, max (ms).
    pub recorder_writes: PooledWrites,
    /// Each player.
    pub players: Vec<PlayerResult>,
    /// Sum of the players' stalls, s.
    pub total_stall_s: f64,
    /// Freezes of the players after their start-up (a frame shown late by more than a frame
    /// period): the players' deadline misses as a viewer sees them.
    pub player_freezes: u64,
    /// Players that never played.
    pub failed_players: usize,
    /// What the best-effort load moved.
    pub load: LoadFigures,
    /// Busy share of all CPUs while the row ran, %.
    pub cpu_busy_pct: f64,
    /// The 1-minute load average when the recorders started.
    pub load_average_1m: f64,
    /// What abissd counted per stream (abiss rows).
    pub streams: Option<Vec<StreamFigures>>,
    /// The real-time write requests on the lab disk against ABISS's bound, from abissd's
    /// tracer (abiss rows).
    pub real_time_writes: Option<RealTimeWrites>,
}

impl Bench {
    /// Brings the lab hdd up (ext4) with the media for `media_secs`, for rows under
    /// `load_kind`.
    pub fn up(media_secs: u32, read_ahead_kb: u32, load_kind: LoadKind) -> anyhow::Result<Self> {
        let source = media::cached_media(media_secs)?;
        let disk = LabDisk::up("recording", DISK_BYTES, read_ahead_kb)?;
        let scratch =
            std::env::temp_dir().join(format!("abiss-bench-recording-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        Ok(Self {
            disk,
            file_system: FileSystem::Ext4,
            source,
            media: Vec::new(),
            load: None,
            load_kind,
            scratch,
            bin_dir: std::env::var_os("ABISS_BIN_DIR").map(PathBuf::from),
        })
    }

    /// The lab disk's queue settings now.
    #[must_use]
    pub fn queue_settings(&self) -> crate::lab_disk::QueueSettings {
        self.disk.queue_settings()
    }

    /// Where the scratch files go (off the lab disk).
    #[must_use]
    pub fn scratch(&self) -> &Path {
        &self.scratch
    }

    fn bin_dir(&self) -> anyhow::Result<&Path> {
        self.bin_dir.as_deref().context(
            "the recording benchmark needs ABISS_BIN_DIR (abissd, abissctl, abiss-test-recorder); run it through `cargo xtask bench recording`",
        )
    }

    /// Puts `file_system` on the disk if it is not there (or nothing was laid out yet), with
    /// the players' media and the readers' file.
    pub fn prepare(&mut self, file_system: FileSystem) -> anyhow::Result<()> {
        if self.load.is_some() && self.file_system == file_system {
            return Ok(());
        }
        interrupt::check()?;
        if self.file_system != file_system {
            self.media.clear();
            self.load = None;
            file_system.make(self.disk.device(), self.disk.mount_dir())?;
            self.file_system = file_system;
        }
        eprintln!(
            "recording: {} on {}; copying the media and laying out the readers' file",
            file_system.name(),
            self.disk.device().display()
        );
        self.media = media::copy_onto(&self.source, self.disk.mount_dir(), PLAYERS)?;
        self.load = Some(load::lay_out(
            self.disk.mount_dir(),
            &self.scratch,
            self.load_kind,
        )?);
        Ok(())
    }

    /// No-load runs of the ffmpeg player (three of `secs` from a warm page cache, three short
    /// ones from a cold one): its cold start-up, against which the rows' start-ups are
    /// counted.
    pub fn baseline(&self, secs: u64) -> anyhow::Result<BTreeMap<String, Baseline>> {
        self.disk.select_elevator("mq-deadline")?;
        let file = self.media.first().context("no media laid out")?;
        std::io::copy(&mut std::fs::File::open(file)?, &mut std::io::sink())?;
        let spec = PlayerSpec {
            kind: PlayerKind::Ffmpeg,
            file: file.clone(),
            start_s: 0,
            seek_every_s: None,
        };
        let baseline = baseline("ffmpeg", &spec, secs, 3, &self.scratch)?;
        Ok(BTreeMap::from([("ffmpeg".to_owned(), baseline)]))
    }

    /// abissd for an abiss row, and how the row starts its players and recorders (a direct
    /// row's recorders run as they are, into `abissctl record`).
    fn wrappers(&self, plan: &RowPlan<'_>) -> anyhow::Result<(Option<Daemon>, Wrapper, Wrapper)> {
        Ok(match plan.row.class {
            Class::Abiss if plan.row.direct => {
                let bin_dir = self.bin_dir()?;
                let daemon =
                    Daemon::start(bin_dir, self.disk.device(), plan.row.daemon_options, None)?;
                let player = Wrapper::Abiss {
                    abissctl: bin_dir.join("abissctl"),
                    socket: daemon.socket().to_path_buf(),
                    args: player_args(plan.player_rate, plan.player_preroll),
                };
                (Some(daemon), player, Wrapper::Plain)
            }
            Class::Abiss => {
                let bin_dir = self.bin_dir()?;
                let daemon =
                    Daemon::start(bin_dir, self.disk.device(), plan.row.daemon_options, None)?;
                let abissctl = bin_dir.join("abissctl");
                let socket = daemon.socket().to_path_buf();
                let player = Wrapper::Abiss {
                    abissctl: abissctl.clone(),
                    socket: socket.clone(),
                    args: player_args(plan.player_rate, plan.player_preroll),
                };
                let recorder = Wrapper::Abiss {
                    abissctl,
                    socket,
                    args: [
                        "--write",
                        "--rate",
                        plan.recorder_rate,
                        "--buffer",
                        plan.recorder_buffer,
                    ]
                    .map(str::to_owned)
                    .to_vec(),
                };
                (Some(daemon), player, recorder)
            }
            Class::RealTime => (None, Wrapper::RealTime, Wrapper::RealTime),
            Class::Default => (None, Wrapper::Plain, Wrapper::Plain),
        })
    }

    /// Runs `plan`: the load for its warm-up, then the recorders and the players for its
    /// seconds.
    pub fn run_row(
        &self,
        plan: &RowPlan<'_>,
        baselines: &BTreeMap<String, Baseline>,
    ) -> anyhow::Result<RowResult> {
        interrupt::check()?;
        let row = plan.row;
        let files = self.load.as_ref().context("nothing laid out")?;
        let bin_dir = self.bin_dir()?;
        self.disk.select_elevator(row.elevator)?;
        self.start_afresh(files)?;
        let (daemon, player_wrapper, recorder_wrapper) = self.wrappers(plan)?;
        let request_trace = daemon
            .as_ref()
            .map(|d| self.trace_requests(d, bin_dir, row.name))
            .transpose()?;
        let watch = daemon
            .as_ref()
            .map(|d| StreamWatch::start_polling_latency(d.socket()));
        let runtime = plan.warmup + Duration::from_secs(plan.secs + 3);
        let load = load::start(&self.scratch, files, runtime)?;
        sleep_interruptibly(plan.warmup)?;
        let load_average_1m = load_average();
        let cpu_before = cpu_times()?;
        let sink = record_sink(plan, daemon.as_ref(), bin_dir);
        let mut recorders =
            self.launch_recorders(&recorder_wrapper, sink.as_ref(), bin_dir, plan.secs)?;
        let players = self.launch_players(&player_wrapper)?;
        let mut streams = None;
        let (mut signalled, mut signalled_ns) = (Instant::now(), monotonic_ns());
        let runs = play_for(players, Duration::from_secs(plan.secs), || {
            if let Some(watch) = watch {
                streams = Some(watch.finish()?);
            }
            // The test recorder ends by itself after its seconds (and prints its summary).
            for recorder in &mut recorders {
                if recorder.kind() == RecorderKind::Test {
                    recorder.wait_for_end(Duration::from_secs(15))?;
                }
            }
            (signalled, signalled_ns) = (Instant::now(), monotonic_ns());
            for recorder in &recorders {
                recorder.signal_stop();
            }
            Ok(())
        })?;
        #[expect(clippy::cast_precision_loss, reason = "ms of a capture buffer")]
        let capture_ms = plan.capture_ms as f64;
        let mut recorders = recorders
            .into_iter()
            .enumerate()
            .map(|(index, r)| {
                let keep = plan
                    .traces_dir
                    .map(|dir| dir.join(format!("{}-{index}-{}.trace", row.name, r.kind().name())));
                r.collect(signalled, signalled_ns, capture_ms, keep.as_deref())
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let cpu_after = cpu_times()?;
        let load = load.finish()?;
        recorders.iter_mut().for_each(RecorderResult::check_content);
        let real_time_writes = request_trace
            .map(|(trace, file)| self.real_time_writes(trace, &file))
            .transpose()?;
        drop(daemon);
        let players: Vec<PlayerResult> = runs
            .iter()
            .map(|run| player_result(run, baselines))
            .collect();
        Ok(RowResult {
            row: row.clone(),
            secs: plan.secs,
            recorder_writes: PooledWrites::of(&recorders),
            recorders,
            total_stall_s: players.iter().filter_map(|p| p.stall_s).sum(),
            player_freezes: players.iter().map(|p| p.figures.freezes).sum(),
            failed_players: players.iter().filter(|p| p.stall_s.is_none()).count(),
            players,
            load,
            cpu_busy_pct: busy_pct(cpu_before, cpu_after),
            load_average_1m,
            streams,
            real_time_writes,
        })
    }

    /// Last row's recordings and the writers' files go (this row allocates anew) and their
    /// blocks are freed, the media leave the page cache, and the disk is let go idle.
    fn start_afresh(&self, files: &LoadFiles) -> anyhow::Result<()> {
        for index in 0..RECORDERS.len() {
            let _ = std::fs::remove_file(self.recording(index));
        }
        for file in files.kind.write_files(&files.dir) {
            let _ = std::fs::remove_file(file);
        }
        sync_disks();
        for path in &self.media {
            drop_cached_pages(path)?;
        }
        self.disk
            .wait_until_idle(Duration::from_secs(1), Duration::from_secs(60))?;
        Ok(())
    }

    /// Every block request `daemon` sees while row `name` runs, into a file of the scratch.
    fn trace_requests(
        &self,
        daemon: &Daemon,
        bin_dir: &Path,
        name: &str,
    ) -> anyhow::Result<(RequestTrace, PathBuf)> {
        let file = self.scratch.join(format!("{name}-requests.jsonl"));
        Ok((RequestTrace::start(bin_dir, daemon.socket(), &file)?, file))
    }

    /// Ends `trace` and counts the real-time writes on the lab disk it saw in `file`.
    fn real_time_writes(&self, trace: RequestTrace, file: &Path) -> anyhow::Result<RealTimeWrites> {
        drop(trace);
        let records = request_trace::records(file)?;
        let _ = std::fs::remove_file(file);
        Ok(RealTimeWrites::of(
            &records,
            request_trace::device_number(self.disk.device())?,
        ))
    }

    fn launch_recorders(
        &self,
        wrapper: &Wrapper,
        sink: Option<&RecordSink>,
        bin_dir: &Path,
        secs: u64,
    ) -> anyhow::Result<Vec<RunningRecorder>> {
        let mut tracers = (0..RECORDERS.len())
            .map(|index| {
                Tracer::start(
                    &format!("abiss-bench-recording-{}-{index}", std::process::id()),
                    &self.scratch,
                )
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // perf sets up its events (a few hundred ms on this machine) before anything is
        // written; the marker then proves it traces.
        sleep_interruptibly(TRACER_SETUP)?;
        for tracer in &mut tracers {
            tracer.mark()?;
        }
        RECORDERS
            .iter()
            .zip(tracers)
            .enumerate()
            .map(|(index, (kind, tracer))| {
                RunningRecorder::launch(
                    *kind,
                    &self.recording(index),
                    (wrapper, sink),
                    tracer,
                    bin_dir,
                    secs,
                )
            })
            .collect()
    }

    fn launch_players(&self, wrapper: &Wrapper) -> anyhow::Result<Vec<RunningPlayer>> {
        self.media
            .iter()
            .map(|file| {
                let spec = PlayerSpec {
                    kind: PlayerKind::Ffmpeg,
                    file: file.clone(),
                    start_s: 0,
                    seek_every_s: None,
                };
                RunningPlayer::launch(&spec, wrapper, &self.scratch)
            })
            .collect()
    }

    fn recording(&self, index: usize) -> PathBuf {
        self.disk
            .mount_dir()
            .join(format!("recording-{index}-{}.ts", RECORDERS[index].name()))
    }
}

/// sync(2): the removed files' blocks are freed and the journal quiet before the row.
fn sync_disks() {
    // SAFETY: sync(2) has no arguments and cannot fail.
    unsafe { libc::sync() };
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// `abissctl run` options of a player in an abiss row.
#[must_use]
pub fn player_args(rate: &str, preroll: &str) -> Vec<String> {
    let mut args = vec!["--rate".to_owned(), rate.to_owned()];
    if preroll != "0" {
        args.extend(["--preroll".to_owned(), preroll.to_owned()]);
    }
    args
}

/// A direct row's `abissctl record` between each recorder and its file, against `daemon`.
fn record_sink(plan: &RowPlan<'_>, daemon: Option<&Daemon>, bin_dir: &Path) -> Option<RecordSink> {
    daemon.filter(|_| plan.row.direct).map(|daemon| RecordSink {
        abissctl: bin_dir.join("abissctl"),
        socket: daemon.socket().to_path_buf(),
        rate: plan.recorder_rate.to_owned(),
        buffer: plan.record_buffer.to_owned(),
        preallocate: plan.record_preallocate,
    })
}
