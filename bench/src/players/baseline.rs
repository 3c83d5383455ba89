//! A player's baseline: its no-load runs, warm (its file in memory) and cold (its file dropped
//! from the page cache first), whose start-ups and stalls are the floor a row's are measured
//! against. The recording benchmark measures its player's baseline this way too.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use super::player::{play_for, PlayerSpec, RunningPlayer, Wrapper};
use super::stall::{self, StallFigures};
use crate::layout::drop_cached_pages;

/// A player's no-load runs: warm (its file in memory), then cold (its file dropped from the
/// page cache before each run).
#[derive(Clone, Debug, Serialize)]
pub struct Baseline {
    /// The player (`gst-seeking` for the seeking one).
    pub player: String,
    /// Start-up of each warm run, s.
    pub startups_s: Vec<f64>,
    /// Their median: what the player needs with its data in memory and the CPU to itself.
    pub startup_s: f64,
    /// Start-up of each cold run, s (none for the seeking player).
    pub cold_startups_s: Vec<f64>,
    /// Their median: what the player needs when it reads its probe from the disk with nothing
    /// else on it. This is the floor a cold start costs the disk itself; a row's start-up
    /// beyond it is what the load made the player wait (`None` when not measured).
    pub cold_startup_s: Option<f64>,
    /// Freezes (and seek stalls) in those runs: the measurement's floor.
    pub stall_after_startup_s: f64,
    /// Mean stall of a seek with the data in memory, s (the seeking player's baseline).
    pub per_seek_s: Option<f64>,
    /// The figures of each run.
    pub runs: Vec<StallFigures>,
}

/// How long the first, uncounted launch of a baseline plays ([`baseline`]).
const FIRST_LAUNCH_S: u64 = 4;

/// How long a cold baseline run plays: only its start-up is kept.
const COLD_RUN_S: u64 = 3;

/// One no-load run of `spec` for `secs`, started plainly, and what its reports add up to.
fn no_load_run(
    name: &str,
    spec: &PlayerSpec,
    secs: u64,
    scratch: &Path,
) -> anyhow::Result<StallFigures> {
    let player = RunningPlayer::launch(spec, &Wrapper::Plain, scratch)?;
    let pid = player.pid();
    // What the player maps while it plays is what its next launches read first.
    let run = play_for(vec![player], Duration::from_secs(secs), || {
        if let Some(pid) = pid {
            super::program::remember(spec.kind.name(), pid, &spec.file);
        }
        Ok(())
    })?
    .remove(0);
    anyhow::ensure!(
        !run.events.is_empty(),
        "{name} reported no media time on an idle machine ({}): {}",
        run.ended,
        run.stderr
    );
    Ok(stall::analyse(run.launched_ns, run.stopped_ns, &run.events))
}

/// The sorted start-ups of `runs` and their median.
fn startups(runs: &[StallFigures]) -> (Vec<f64>, Option<f64>) {
    let mut startups: Vec<f64> = runs.iter().filter_map(|r| r.startup_s).collect();
    startups.sort_by(f64::total_cmp);
    let median = abiss_lab::stats::quantile(&startups, 0.5);
    (startups, median)
}

/// `repeats` no-load runs of `spec` for `secs` each from a warm page cache, then (for a
/// player that does not seek) `repeats` short ones with its file dropped from the page cache
/// first, started plainly (`scratch` holds the player's IPC socket), as the baseline `name`;
/// says what it found on stderr. The recording benchmark measures its player's baseline this
/// way too.
pub(crate) fn baseline(
    name: &str,
    spec: &PlayerSpec,
    secs: u64,
    repeats: usize,
    scratch: &Path,
) -> anyhow::Result<Baseline> {
    // A first launch, not counted, loads the player's program files and notes them for the
    // warming of every later launch: the machine may have reclaimed them since the player last
    // ran (on the lab VM a first ffmpeg after ten minutes of other tests reported no media
    // time within its 2 s run, in a suite), and a baseline of reading them from the root disk
    // is not the player's.
    let first = RunningPlayer::launch(spec, &Wrapper::Plain, scratch)?;
    let pid = first.pid();
    play_for(vec![first], Duration::from_secs(FIRST_LAUNCH_S), || {
        if let Some(pid) = pid {
            super::program::remember(spec.kind.name(), pid, &spec.file);
        }
        Ok(())
    })?;
    let runs = (0..repeats)
        .map(|_| no_load_run(name, spec, secs, scratch))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut cold_runs = Vec::new();
    if spec.seek_every_s.is_none() {
        for _ in 0..repeats {
            drop_cached_pages(&spec.file)?;
            cold_runs.push(no_load_run(name, spec, COLD_RUN_S, scratch)?);
        }
    }
    let (warm, warm_median) = startups(&runs);
    let (cold, cold_median) = startups(&cold_runs);
    let baseline = Baseline {
        player: name.to_owned(),
        startup_s: warm_median.context("no warm baseline run")?,
        startups_s: warm,
        cold_startups_s: cold,
        cold_startup_s: cold_median,
        stall_after_startup_s: runs.iter().map(|r| r.freeze_s + r.seek_stall_s).sum(),
        // None for players that do not seek: they report no seeks.
        per_seek_s: per_seek(&runs),
        runs,
    };
    eprintln!(
        "  baseline {name}: start-up {:.3} s warm, {:?} s cold, stall after start-up {:.3} s",
        baseline.startup_s, baseline.cold_startup_s, baseline.stall_after_startup_s
    );
    Ok(baseline)
}

/// The mean stall per seek of `runs`, if they seeked.
fn per_seek(runs: &[StallFigures]) -> Option<f64> {
    let seeks: u64 = runs.iter().map(|r| r.seeks).sum();
    #[expect(clippy::cast_precision_loss, reason = "a few seeks")]
    let per_seek =
        (seeks > 0).then(|| runs.iter().map(|r| r.seek_stall_s).sum::<f64>() / seeks as f64);
    per_seek
}
