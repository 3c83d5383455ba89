//! Real, unmodified players under a seeky best-effort load (issue 12): `GStreamer`'s
//! `playbin`, `ffmpeg -re` and mpv play 8 Mbit/s MPEG-TS files from the lab hdd while fio
//! reads and writes at random, per configuration: stock mq-deadline and bfq, bfq with the
//! players in `ionice -c1`, and abiss (each player under `abissctl run`); then one player
//! seeking every 10 s, and 8 viewers of one file. Stall is defined in [`stall`].

pub mod baseline;
pub mod load;
pub mod media;
pub mod player;
pub mod program;
mod rows;
pub mod session;
pub mod stall;
mod table;
pub mod watch;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::json;

use crate::report::{Results, Row};
use crate::row::RowsArg;
use baseline::Baseline;
use player::PlayerKind;
pub use rows::all_rows;
use session::{RowPlan, RowResult, Session};

/// The lab disk: the media copies, the load's 1.25 GiB and room to spare.
const DISK_BYTES: u64 = 4 << 30;
/// The players of the main rows, in order (player 0 is the one that seeks in the seek rows).
const FOUR: [PlayerKind; 4] = [
    PlayerKind::Gstreamer,
    PlayerKind::Ffmpeg,
    PlayerKind::Mpv,
    PlayerKind::Ffmpeg,
];
/// Viewers of one file in the 8-viewer rows, starting this far apart in the media.
const VIEWERS: u32 = 8;
/// Players of the 8-player rows, one file each, in [`FOUR`]'s order twice.
const EIGHT: [PlayerKind; 8] = [
    FOUR[0], FOUR[1], FOUR[2], FOUR[3], FOUR[0], FOUR[1], FOUR[2], FOUR[3],
];
const VIEWER_SPACING_S: u32 = 10;
/// How often the seeking player seeks.
const SEEK_EVERY_S: u32 = 10;
/// How far apart the players of the arriving rows are launched, s.
const ARRIVAL_SPACING_S: u64 = 5;

/// `abiss-bench players`.
#[derive(Debug, clap::Args)]
pub struct PlayersArgs {
    /// Seconds each row's players play (from their launch).
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Seconds the load runs before the players start.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// The rows to run ([`all_rows`]), e.g. `--rows mq-deadline,abiss`.
    #[command(flatten)]
    pub rows: RowsArg,
    /// The rate each abiss row's player is attached at (`abissctl run --rate`); the media is
    /// 1 MB/s.
    #[arg(long, default_value = "1.1MB/s")]
    pub rate: String,
    /// Seconds of each no-load, warm-cache baseline run (three per player).
    #[arg(long, default_value_t = 8)]
    pub baseline_secs: u64,
    /// Readahead of the lab device in KiB (128 is what the kernel gives a SATA disk).
    #[arg(long, default_value_t = 128)]
    pub read_ahead_kb: u32,
    /// Requests the lab hdd takes at once and orders by position (its command queue),
    /// instead of its model's 4: a disk whose queue orders more (32 for SATA's NCQ) gains
    /// from a deeper dispatch depth, which the model's 4 cannot show.
    #[arg(long)]
    pub hdd_queue_depth: Option<u32>,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
    /// Also write every player's reports here, one CSV per row and player (`ROW-pN-KIND.csv`:
    /// seconds since launch, then the media time in seconds or `seek`).
    #[arg(long)]
    pub events_dir: Option<PathBuf>,
    /// Runs of each row, one after the other; the report gives each run and, with more than
    /// one, every row's median and worst total stall. One run can be thrown by the host: no-load
    /// start-ups of a player with its file in memory reached 5.4 s here against a median of
    /// 0.26 s.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
}

/// How the players of a row are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// As they are (best effort, from their nice value).
    Default,
    /// `ionice -c1 -n4`.
    RealTime,
    /// Under `abissctl run` with abissd managing the disk.
    Abiss,
}

impl Class {
    /// How the report's tables show it.
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::RealTime => "ionice -c1",
            Self::Abiss => "abissctl run",
        }
    }
}

/// Who plays what in a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Four players, four files, from the start.
    Four,
    /// The same, player 0 (`GStreamer`) seeking to a random position every 10 s.
    FourOneSeeking,
    /// Eight players of one file, started 10 s apart in the media.
    EightViewers,
    /// Four players, four files, launched 5 s apart as viewers arrive: each start-up meets
    /// the load and the players already playing, not three other cold starts at once.
    FourArriving,
    /// Eight players, eight files, from the start: eight cold starts at once (the lab hdd's
    /// admission took all eight at 1.1 MB/s with 6 MiB prerolls; nothing here tried a ninth).
    EightFiles,
}

impl Scenario {
    /// The players a row of this scenario starts, one file each (the 8-viewer rows share
    /// the first file).
    fn players(self) -> &'static [PlayerKind] {
        match self {
            Self::EightFiles => &EIGHT,
            Self::Four | Self::FourOneSeeking | Self::FourArriving | Self::EightViewers => &FOUR,
        }
    }
}

/// What one row of the benchmark runs (reported as its [`crate::row::Row`]'s configuration).
#[derive(Clone, Debug, Serialize)]
pub struct Configuration {
    /// Short name (`--rows`).
    pub name: &'static str,
    /// What it is.
    pub description: &'static str,
    /// The elevator (abissd selects mq-deadline itself in the abiss rows).
    pub elevator: &'static str,
    /// How the players are started.
    pub class: Class,
    /// Who plays what.
    pub scenario: Scenario,
    /// More `abissctl run` options (abiss rows): `--buffer 6MiB`, `--preroll 6MiB`.
    pub run_options: &'static [&'static str],
    /// More abissd options (abiss rows): `--dispatch-depth 8`.
    pub daemon_options: &'static [&'static str],
    /// No best-effort load: what the players' cold start costs the disk alone, the floor
    /// under every row's start-up.
    pub no_load: bool,
    /// The players' files in the page cache at launch, not dropped from it: with no load, what
    /// starting the players at once costs with nothing to read (their share of the CPUs).
    pub warm: bool,
}

/// Runs the benchmark and writes players.{json,md,svg}.
pub fn run(args: &PlayersArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    anyhow::ensure!(args.secs >= 5, "--secs must be at least 5");
    let rows =
        args.rows
            .select_present(all_rows(), |r| r.name, rows::by_default, |r| r.elevator)?;
    let media_secs = u32::try_from(args.secs)? + VIEWERS * VIEWER_SPACING_S + 30;
    let files = rows
        .iter()
        .map(|row| row.scenario.players().len())
        .max()
        .unwrap_or(FOUR.len());
    let session = Session::up(
        "players",
        files,
        media_secs.max(150),
        (args.read_ahead_kb, args.hdd_queue_depth),
    )?;
    eprintln!("players: no-load, warm-cache baselines");
    let baselines = session.baselines(
        &[PlayerKind::Gstreamer, PlayerKind::Ffmpeg, PlayerKind::Mpv],
        args.baseline_secs,
    )?;
    let mut measured = Vec::new();
    for row in &rows {
        for run in 1..=args.repeat {
            let plan = RowPlan {
                row,
                kinds: row.scenario.players(),
                warmup: Duration::from_secs(args.warmup_secs),
                secs: args.secs,
                rate: &args.rate,
                events_dir: args.events_dir.as_deref(),
                run: (run, args.repeat),
            };
            eprintln!("running {} …", plan.label());
            let result = session
                .run_row(&plan, &baselines)
                .with_context(|| format!("row {}", plan.label()))?;
            eprintln!("  {}", table::progress_line(&result));
            measured.push(result);
        }
    }
    let queue = session.queue_settings();
    drop(session);

    let mut media_parameters = media::parameters(media_secs.max(150));
    media_parameters["codec"] =
        json!("MPEG-2 video 7 Mbit/s, MP2 audio 192 kbit/s, MPEG-TS muxrate 8 Mbit/s");
    let results = Results::new(
        "players",
        begun,
        json!({
            "secs": args.secs,
            "warmup_secs": args.warmup_secs,
            "repeat": args.repeat,
            "rate": args.rate,
            "buffer": "abissctl's default (auto: sized by abissd)",
            "media": media_parameters,
            "freeze_tolerance_s": stall::FREEZE_TOLERANCE,
            "queue": queue,
            "disk_bytes": DISK_BYTES,
        }),
        measured
            .iter()
            .map(|result| Row::new(result.label(), &result.row, result))
            .collect(),
    )
    .with("baselines", &baselines)?;
    let markdown = table::markdown(
        &results.command,
        &results.machine,
        args,
        &queue,
        &baselines,
        &measured,
    );
    results.write(&args.results_dir, "players", &markdown, |svg| {
        table::chart(svg, args.secs, &measured)
    })
}

/// The stall of one `kind` of player under the load for `secs`, under `abissctl run --rate
/// RATE OPTIONS…` with the abissd and abissctl of `abiss` (`Some((bin_dir, rate, options))`)
/// or plain under mq-deadline, with its no-load start-up measured first: for the integration
/// test.
pub fn measure_one(
    kind: PlayerKind,
    secs: u64,
    abiss: Option<(&std::path::Path, &str, &'static [&'static str])>,
) -> anyhow::Result<(Baseline, RowResult)> {
    let mut session = Session::up("players-test", 1, 150, (128, None))?;
    if let Some((bin_dir, _, _)) = abiss {
        session.set_bin_dir(bin_dir);
    }
    let baselines = session.baselines(&[kind], 2)?;
    let row = Configuration {
        name: if abiss.is_some() {
            "abiss"
        } else {
            "mq-deadline"
        },
        description: "one player under the seeky load",
        elevator: "mq-deadline",
        class: if abiss.is_some() {
            Class::Abiss
        } else {
            Class::Default
        },
        scenario: Scenario::Four,
        no_load: false,
        warm: false,
        run_options: abiss.map_or(&[], |(_, _, options)| options),
        daemon_options: &[],
    };
    let result = session.run_row(
        &RowPlan {
            row: &row,
            kinds: &[kind],
            warmup: Duration::from_secs(3),
            secs,
            rate: abiss.map_or("", |(_, rate, _)| rate),
            events_dir: None,
            run: (1, 1),
        },
        &baselines,
    )?;
    Ok((baselines[kind.name()].clone(), result))
}
