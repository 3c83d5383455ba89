//! One row's run on the lab disk: the session (disk, media, load files), the no-load
//! baselines, and a row's players under the load, from a cold page cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;

use super::baseline::{baseline, Baseline};
use super::load::{self, LoadFigures, LoadFiles};
use super::media;
use super::player::{play_for, PlayerKind, PlayerRun, PlayerSpec, RunningPlayer, Wrapper};
use super::stall::{self, StallFigures};
use super::watch::{StreamFigures, StreamWatch};
use super::{
    Class, Configuration, Scenario, ARRIVAL_SPACING_S, DISK_BYTES, FOUR, SEEK_EVERY_S, VIEWERS,
    VIEWER_SPACING_S,
};
use crate::abiss::Daemon;
use crate::cpu::{busy_pct, cpu_times, load_average};
use crate::interrupt;
use crate::lab_disk::LabDisk;
use crate::layout::drop_cached_pages;
use crate::trial::sleep_interruptibly;

/// What a row runs: its players, for how long, at what rate under abiss.
#[derive(Clone, Copy, Debug)]
pub struct RowPlan<'a> {
    /// The row.
    pub row: &'a Configuration,
    /// Its players, one file each (the 8-viewer rows ignore them).
    pub kinds: &'a [PlayerKind],
    /// Seconds the load runs before the players start.
    pub warmup: Duration,
    /// Seconds the players play.
    pub secs: u64,
    /// `abissctl run --rate`.
    pub rate: &'a str,
    /// Where to write the players' reports, if anywhere.
    pub events_dir: Option<&'a Path>,
    /// Which run of the row this is, of how many (`--repeat`).
    pub run: (u32, u32),
}

impl RowPlan<'_> {
    /// The row's name, with the run's number when the row runs more than once.
    #[must_use]
    pub fn label(&self) -> String {
        run_label(self.row.name, self.run)
    }
}

/// `name`, or `name#k` for run k of several.
fn run_label(name: &str, (run, runs): (u32, u32)) -> String {
    if runs > 1 {
        format!("{name}#{run}")
    } else {
        name.to_owned()
    }
}

/// The lab disk with the media and the load's files, and where abissd is.
#[derive(Debug)]
pub struct Session {
    disk: LabDisk,
    media: Vec<PathBuf>,
    load: LoadFiles,
    scratch: PathBuf,
    bin_dir: Option<PathBuf>,
}

/// A player's part of a row.
#[derive(Clone, Debug, Serialize)]
pub struct PlayerResult {
    /// The player and its file.
    pub spec: PlayerSpec,
    /// What its reports add up to.
    pub figures: StallFigures,
    /// Start-up beyond the player's no-load cold start-up, s (beyond the warm one when the
    /// cold one was not measured).
    pub startup_excess_s: Option<f64>,
    /// Of the start-up, what `abissctl run` took before it started the player (attach, and
    /// the wait for the window to be loaded), s.
    pub attach_s: Option<f64>,
    /// Start-up excess + freezes + seek stalls beyond the no-load seek stall, s (`None` if it
    /// never played): what the load made the viewer wait.
    pub stall_s: Option<f64>,
    /// The same with the start-up counted beyond the no-load *warm* start-up: what the viewer
    /// waited beyond a player whose file was already in memory, s.
    pub stall_beyond_warm_s: Option<f64>,
    /// CPU time of the player (with its wrapper), s.
    pub cpu_s: f64,
    /// How it ended.
    pub ended: String,
    /// Why it did not play, if it did not (abissctl's message, say).
    pub error: Option<String>,
}

/// One row's results.
#[derive(Clone, Debug, Serialize)]
pub struct RowResult {
    /// What the row ran: the report writes it as its row's configuration, not again here.
    #[serde(skip)]
    pub row: Configuration,
    /// Which run of the row this was, of how many.
    pub run: (u32, u32),
    /// Seconds the players played.
    pub secs: u64,
    /// Each player.
    pub players: Vec<PlayerResult>,
    /// Sum of the stalls of the players that played, s.
    pub total_stall_s: f64,
    /// Sum of their stalls beyond a warm start-up, s.
    pub total_stall_beyond_warm_s: f64,
    /// Players that never played.
    pub failed_players: usize,
    /// What the best-effort load moved.
    pub load: LoadFigures,
    /// Busy share of all CPUs while the players played, %.
    pub cpu_busy_pct: f64,
    /// The players' CPU time over their wall time, % of one CPU, summed over players.
    pub players_cpu_pct: f64,
    /// The 1-minute load average when the players started.
    pub load_average_1m: f64,
    /// CPU time the hypervisor took from this machine while the players played (steal, all
    /// CPUs), ms; `None` where the kernel does not count it. Players' start-ups and frames
    /// wait for it like for a busy CPU.
    pub stolen_ms: Option<u64>,
    /// How late the emulated disk replied while the players played, p99.9, ms
    /// ([`abiss_lab::stats::late_percentile_ns`]): a medium that strayed from its model was not
    /// the modelled disk. `None` in results from before it was recorded.
    #[serde(default)]
    pub medium_late_p999_ms: Option<f64>,
    /// What abissd counted per stream (abiss rows).
    pub streams: Option<Vec<StreamFigures>>,
}

impl RowResult {
    /// The row's name, with the run's number when the row ran more than once.
    #[must_use]
    pub fn label(&self) -> String {
        run_label(self.row.name, self.run)
    }
}

impl Session {
    /// Brings the lab hdd up (taking `hdd_queue_depth` requests at once instead of its
    /// model's, where given), copies `players` media files of `media_secs` onto it and lays
    /// out the load.
    pub fn up(
        name: &str,
        players: usize,
        media_secs: u32,
        (read_ahead_kb, hdd_queue_depth): (u32, Option<u32>),
    ) -> anyhow::Result<Self> {
        let source = media::cached_media(media_secs)?;
        let disk = LabDisk::up_with(
            name,
            DISK_BYTES,
            read_ahead_kb,
            crate::lab_disk::BenchFs::Ext4,
            hdd_queue_depth,
        )?;
        eprintln!(
            "lab hdd {} with ext4 at {}; copying the media and laying out the load",
            disk.device().display(),
            disk.mount_dir().display()
        );
        let (media, load) = disk.unmodelled(|| {
            Ok((
                media::copy_onto(&source, disk.mount_dir(), players)?,
                load::lay_out(disk.mount_dir())?,
            ))
        })?;
        let scratch =
            std::env::temp_dir().join(format!("abiss-bench-players-{}", std::process::id()));
        std::fs::create_dir_all(&scratch)?;
        Ok(Self {
            disk,
            media,
            load,
            scratch,
            bin_dir: std::env::var_os("ABISS_BIN_DIR").map(PathBuf::from),
        })
    }

    /// The players of `scenario`: `kinds` on their own files, or eight viewers.
    fn specs(&self, scenario: Scenario, kinds: &[PlayerKind]) -> Vec<PlayerSpec> {
        let spec = |kind, file: &PathBuf, start_s, seek_every_s| PlayerSpec {
            kind,
            file: file.clone(),
            start_s,
            seek_every_s,
        };
        match scenario {
            Scenario::Four
            | Scenario::FourOneSeeking
            | Scenario::FourArriving
            | Scenario::EightFiles => kinds
                .iter()
                .zip(&self.media)
                .enumerate()
                .map(|(i, (kind, file))| {
                    let seeks = scenario == Scenario::FourOneSeeking && i == 0;
                    spec(*kind, file, 0, seeks.then_some(SEEK_EVERY_S))
                })
                .collect(),
            Scenario::EightViewers => (0..VIEWERS)
                .map(|i| {
                    let kind = FOUR[i as usize % 3];
                    spec(kind, &self.media[0], i * VIEWER_SPACING_S, None)
                })
                .collect(),
        }
    }

    /// No-load, warm-cache runs of each player (three of `secs`), and one of the seeking
    /// `GStreamer` player over 2.5 seek periods.
    pub fn baselines(
        &self,
        kinds: &[PlayerKind],
        secs: u64,
    ) -> anyhow::Result<BTreeMap<String, Baseline>> {
        self.disk.select_elevator("mq-deadline")?;
        let file = &self.media[0];
        std::io::copy(&mut std::fs::File::open(file)?, &mut std::io::sink())?;
        let mut baselines = BTreeMap::new();
        let mut plans: Vec<(String, PlayerSpec, u64, usize)> = kinds
            .iter()
            .map(|&kind| {
                let spec = PlayerSpec {
                    kind,
                    file: file.clone(),
                    start_s: 0,
                    seek_every_s: None,
                };
                (kind.name().to_owned(), spec, secs, 3)
            })
            .collect();
        if kinds.contains(&PlayerKind::Gstreamer) {
            let spec = PlayerSpec {
                kind: PlayerKind::Gstreamer,
                file: file.clone(),
                start_s: 0,
                seek_every_s: Some(SEEK_EVERY_S),
            };
            plans.push((
                "gst-seeking".to_owned(),
                spec,
                u64::from(SEEK_EVERY_S) * 5 / 2,
                1,
            ));
        }
        for (name, spec, secs, repeats) in plans {
            let baseline = baseline(&name, &spec, secs, repeats, &self.scratch)?;
            baselines.insert(name, baseline);
        }
        Ok(baselines)
    }

    /// Takes abissd and abissctl from `bin_dir` (instead of `$ABISS_BIN_DIR`).
    pub fn set_bin_dir(&mut self, bin_dir: &Path) {
        self.bin_dir = Some(bin_dir.to_path_buf());
    }

    /// The lab disk's queue settings now.
    #[must_use]
    pub fn queue_settings(&self) -> crate::lab_disk::QueueSettings {
        self.disk.queue_settings()
    }

    /// abissd for an abiss row (managing the lab disk, with its defaults), and how the row's
    /// players are started.
    fn wrapper(
        &self,
        row: &Configuration,
        rate: &str,
    ) -> anyhow::Result<(Option<Daemon>, Wrapper)> {
        Ok(match row.class {
            Class::Abiss => {
                let bin_dir = self.bin_dir.as_deref().context(
                    "abiss rows need ABISS_BIN_DIR (where abissd is); run them through `cargo xtask bench`",
                )?;
                let daemon = Daemon::start(bin_dir, self.disk.device(), row.daemon_options, None)?;
                let wrapper = Wrapper::Abiss {
                    abissctl: bin_dir.join("abissctl"),
                    socket: daemon.socket().to_path_buf(),
                    args: ["--rate", rate]
                        .iter()
                        .chain(row.run_options)
                        .map(|a| (*a).to_owned())
                        .collect(),
                };
                (Some(daemon), wrapper)
            }
            Class::RealTime => (None, Wrapper::RealTime),
            Class::Default => (None, Wrapper::Plain),
        })
    }

    /// Launches `players` for `plan`'s row, and says how long they have left to play. Arriving
    /// players are launched one by one, and all stop when the row's time from the first launch
    /// is up: each one's stall counts from its own launch.
    fn launch(
        &self,
        plan: &RowPlan<'_>,
        players: &[PlayerSpec],
        wrapper: &Wrapper,
    ) -> anyhow::Result<(Vec<RunningPlayer>, Duration)> {
        let spacing = match plan.row.scenario {
            Scenario::FourArriving => Duration::from_secs(ARRIVAL_SPACING_S),
            _ => Duration::ZERO,
        };
        let last_launch = spacing * u32::try_from(players.len().saturating_sub(1))?;
        anyhow::ensure!(
            Duration::from_secs(plan.secs) >= last_launch + Duration::from_secs(5),
            "row {} launches its last player {} s in: give it --secs {} or more",
            plan.row.name,
            last_launch.as_secs(),
            last_launch.as_secs() + 5
        );
        let first_launch = Instant::now();
        let mut running = Vec::with_capacity(players.len());
        for (index, spec) in players.iter().enumerate() {
            if index > 0 {
                sleep_interruptibly(spacing)?;
            }
            running.push(RunningPlayer::launch(spec, wrapper, &self.scratch)?);
        }
        let left = Duration::from_secs(plan.secs).saturating_sub(first_launch.elapsed());
        Ok((running, left))
    }

    /// Runs `plan`: the load for its warm-up, then the players for its seconds, from a cold
    /// page cache (a warm one for a warm row).
    pub fn run_row(
        &self,
        plan: &RowPlan<'_>,
        baselines: &BTreeMap<String, Baseline>,
    ) -> anyhow::Result<RowResult> {
        interrupt::check()?;
        let row = plan.row;
        let players_to_start = self.specs(row.scenario, plan.kinds);
        self.disk.select_elevator(row.elevator)?;
        for path in &self.media {
            if row.warm {
                anyhow::ensure!(
                    super::program::warm_file(path) > 0,
                    "cannot read {} into the page cache",
                    path.display()
                );
            } else {
                drop_cached_pages(path)?;
            }
        }
        self.disk
            .wait_until_idle(Duration::from_secs(1), Duration::from_secs(30))?;
        let (daemon, wrapper) = self.wrapper(row, plan.rate)?;
        let watch = daemon.as_ref().map(|d| StreamWatch::start(d.socket()));
        let request_trace = match (&daemon, plan.events_dir) {
            (Some(daemon), Some(dir)) => Some(crate::request_trace::RequestTrace::start(
                self.bin_dir.as_deref().unwrap_or(Path::new(".")),
                daemon.socket(),
                &dir.join(format!("{}-requests.jsonl", plan.label())),
            )?),
            _ => None,
        };
        let runtime = plan.warmup + Duration::from_secs(plan.secs + 1);
        let load = (!row.no_load)
            .then(|| load::start(&self.scratch, &self.load, runtime))
            .transpose()?;
        sleep_interruptibly(plan.warmup)?;
        let load_average_1m = load_average();
        let cpu_before = cpu_times()?;
        let stolen_before = abiss_lab::system::stolen_ms();
        let mut medium = self.disk.requests_from_now()?;
        let (running, left) = self.launch(plan, &players_to_start, &wrapper)?;
        let mut streams = None;
        let runs = play_for(running, left, || {
            if let Some(watch) = watch {
                streams = Some(watch.finish()?);
            }
            Ok(())
        })?;
        let cpu_after = cpu_times()?;
        let stolen_ms = abiss_lab::system::stolen_since(stolen_before);
        #[expect(clippy::cast_precision_loss, reason = "nanoseconds of lateness")]
        let medium_late_p999_ms = abiss_lab::stats::late_percentile_ns(&medium.read_new()?, 99.9)
            .map(|ns| ns as f64 / 1e6);
        drop(request_trace);
        let load = load
            .map(load::Load::finish)
            .transpose()?
            .unwrap_or_default();
        if let Some(dir) = plan.events_dir {
            write_events(dir, &plan.label(), &runs)?;
        }
        drop(daemon);
        let players: Vec<PlayerResult> = runs
            .iter()
            .map(|run| player_result(run, baselines))
            .collect();
        #[expect(clippy::cast_precision_loss, reason = "seconds")]
        let wall = plan.secs as f64;
        Ok(RowResult {
            row: row.clone(),
            run: plan.run,
            secs: plan.secs,
            total_stall_s: players.iter().filter_map(|p| p.stall_s).sum(),
            total_stall_beyond_warm_s: players.iter().filter_map(|p| p.stall_beyond_warm_s).sum(),
            failed_players: players.iter().filter(|p| p.stall_s.is_none()).count(),
            players_cpu_pct: players.iter().map(|p| p.cpu_s).sum::<f64>() / wall * 100.0,
            players,
            load,
            cpu_busy_pct: busy_pct(cpu_before, cpu_after),
            load_average_1m,
            stolen_ms,
            medium_late_p999_ms,
            streams,
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

pub(crate) fn player_result(
    run: &PlayerRun,
    baselines: &BTreeMap<String, Baseline>,
) -> PlayerResult {
    let figures = stall::analyse(run.launched_ns, run.stopped_ns, &run.events);
    let warm = baselines
        .get(run.spec.kind.name())
        .map_or(0.0, |b| b.startup_s);
    let floor = baselines
        .get(run.spec.kind.name())
        .and_then(|b| b.cold_startup_s)
        .unwrap_or(warm);
    // A player still starting when stopped stalled for the whole run; one that ended by
    // itself without playing (a refused attach) did not play at all.
    let startup = figures.startup_s.or_else(|| {
        (!run.ended_early).then(|| {
            #[expect(clippy::cast_precision_loss, reason = "ns of a run")]
            let wall = run.stopped_ns.saturating_sub(run.launched_ns) as f64 / 1e9;
            wall
        })
    });
    let startup_excess_s = startup.map(|s| (s - floor).max(0.0));
    // Seeks cost the player time with its data in memory too: count what they took beyond.
    let per_seek_s = baselines
        .get("gst-seeking")
        .and_then(|b| b.per_seek_s)
        .unwrap_or(0.0);
    #[expect(clippy::cast_precision_loss, reason = "a few seeks")]
    let seek_excess_s = (figures.seek_stall_s - per_seek_s * figures.seeks as f64).max(0.0);
    let stall_s = startup_excess_s.map(|s| s + figures.freeze_s + seek_excess_s);
    let stall_beyond_warm_s =
        startup.map(|s| (s - warm).max(0.0) + figures.freeze_s + seek_excess_s);
    let error = stall_s.is_none().then(|| {
        if run.stderr.is_empty() {
            format!("no media time reported ({})", run.ended)
        } else {
            format!("{} ({})", run.stderr, run.ended)
        }
    });
    PlayerResult {
        spec: run.spec.clone(),
        figures,
        startup_excess_s,
        #[expect(clippy::cast_precision_loss, reason = "ns to s")]
        attach_s: run
            .exec_ns
            .map(|at| at.saturating_sub(run.launched_ns) as f64 / 1e9),
        stall_s,
        stall_beyond_warm_s,
        cpu_s: run.cpu_s,
        ended: run.ended.clone(),
        error,
    }
}

/// Each player's reports as CSV in `dir`.
fn write_events(dir: &Path, row: &str, runs: &[PlayerRun]) -> anyhow::Result<()> {
    use std::fmt::Write as _;
    std::fs::create_dir_all(dir)?;
    for (index, run) in runs.iter().enumerate() {
        let mut text = String::from("t_s,media_s\n");
        for event in &run.events {
            #[expect(clippy::cast_precision_loss, reason = "ns to s")]
            let since = |at: u64| at.saturating_sub(run.launched_ns) as f64 / 1e9;
            #[expect(clippy::cast_precision_loss, reason = "ns to s")]
            let _ = match *event {
                stall::Event::Frame { at_ns, media_ns } => {
                    writeln!(text, "{:.4},{:.4}", since(at_ns), media_ns as f64 / 1e9)
                }
                stall::Event::Seek { at_ns } => writeln!(text, "{:.4},seek", since(at_ns)),
            };
        }
        let name = format!("{row}-p{index}-{}.csv", run.spec.kind.name());
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}
