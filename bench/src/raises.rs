//! Raise latency: how long abissd takes from a reader's page-cache miss on an attached file
//! (the kernel's event) to the reader's raised I/O priority, over many misses, under each of two
//! best-effort loads on the lab hdd: the reference copy loop, and the players benchmark's seeky
//! load (fio's random direct and buffered readers and a random writer: five busy processes on
//! the CPUs as well as on the disk, which is where issue 12 saw raises slow down).
//!
//! Each miss is made by a new thread (so each is a new raise): it drops a random 64 KiB of the
//! attached file from the page cache, reads it back, and checks whether it was raised by the
//! time its read returned.

use std::fmt::Write as _;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use abiss_proto::{AttachRequest, ByteRate, ByteSize};
use anyhow::Context as _;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use serde_json::json;

use crate::abiss::Daemon;
use crate::cpu::{busy_pct, cpu_times};
use crate::ioprio::current_thread_ioprio;
use crate::lab_disk::LabDisk;
use crate::latency::{LatencyHistogram, LatencySummary};
use crate::layout;
use crate::reference::{COPY_CHUNK_BYTES, COPY_FILE_BYTES, DISK_BYTES, STREAM_FILE_BYTES};
use crate::report::{self, Results, Row};
use crate::row::{self, RowsArg};
use crate::workload::CopyLoop;

/// `abiss-bench raises` (`upgrades`, its earlier name, is still taken).
#[derive(Debug, clap::Args)]
pub struct RaisesArgs {
    /// Misses to make (one new reader thread each).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub misses: u32,
    /// The best-effort loads to measure under, one row each: `copy`, `seeky`.
    #[command(flatten)]
    pub rows: RowsArg,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// What loads the lab hdd while the misses are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BestEffortLoad {
    /// The reference measurement's copy loop (64 KiB reads and writes, one process).
    Copy,
    /// The players benchmark's seeky load (`players::load`).
    Seeky,
}

impl BestEffortLoad {
    /// The row's name.
    fn name(self) -> &'static str {
        match self {
            Self::Copy => "copy",
            Self::Seeky => "seeky",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Copy => "copy loop",
            Self::Seeky => "seeky load (fio: 16 KiB random direct reads at iodepth 16, 4 buffered random readers, a random 64 KiB writer)",
        }
    }
}

/// A load running while the misses are made; stopped (or killed) when it is dropped.
enum RunningLoad {
    Copy(CopyLoop),
    Seeky(crate::players::load::Load),
}

const READ_BYTES: u64 = 64 << 10;
/// RT/0, the priority of a level-0 stream.
const RT0: u16 = 1 << 13;

/// Runs the measurement and writes raises.{json,md,svg}.
pub fn run(args: &RaisesArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    let loads = args.rows.select(
        vec![BestEffortLoad::Copy, BestEffortLoad::Seeky],
        |load| load.name(),
        row::always,
    )?;
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd is); run it through `cargo xtask bench`")?;
    let mut rows = Vec::new();
    for load in loads {
        eprintln!(
            "raises: {} misses under the {}",
            args.misses,
            load.describe()
        );
        rows.push(Row::new(
            load.name(),
            load,
            measure(&bin_dir, args.misses, load)?,
        ));
    }

    let results = Results::new(
        "raises",
        begun,
        json!({
            "misses": args.misses,
            "read_bytes": READ_BYTES,
            "stream": {"rate_bps": 1_000_000, "buffer_bytes": 564 << 10, "level": 0},
            "copy_file_bytes": COPY_FILE_BYTES,
            "abissd": "the build the machine line names (ABISS_BIN_DIR), mq-deadline",
        }),
        rows,
    );
    let markdown = markdown(&results, args.misses);
    results.write(&args.results_dir, "raises", &markdown, |path| {
        chart(path, &results.rows)
    })
}

/// A row: a best-effort load and the raises under it.
type RaiseRow = Row<BestEffortLoad, RaiseFigures>;

/// Issue 12's goal for the raise latency under the seeky load, µs (p99).
const GOAL_P99_US: f64 = 2000.0;

/// Raise latency per load as bars on a log scale (p50, p99, max), with the goal.
fn chart(path: &Path, rows: &[RaiseRow]) -> anyhow::Result<()> {
    use plotters::prelude::*;
    const FLOOR: f64 = 10.0;
    #[expect(
        clippy::cast_precision_loss,
        reason = "latencies in µs, far below 2^52"
    )]
    let figures: Vec<[f64; 3]> = rows
        .iter()
        .map(|row| {
            let r = &row.figures.raises;
            [r.latency_p50_us, r.latency_p99_us, r.latency_max_us]
                .map(|us| us.map_or(FLOOR, |us| (us as f64).max(FLOOR)))
        })
        .collect();
    let top = figures
        .iter()
        .flatten()
        .copied()
        .fold(GOAL_P99_US, f64::max)
        * 2.0;
    #[expect(clippy::cast_precision_loss, reason = "a handful of rows")]
    let width = rows.len() as f64;
    let names: Vec<&str> = rows
        .iter()
        .map(|row| match row.configuration {
            BestEffortLoad::Copy => "copy loop",
            BestEffortLoad::Seeky => "seeky load",
        })
        .collect();
    crate::chart::row_bars(
        path,
        "Raise latency: page-cache miss to raised I/O priority, lab hdd".to_owned(),
        20,
        &names,
        (FLOOR, top),
        "miss event to ioprio_set returned (µs, log scale)",
        |chart| {
            for (which, label) in ["p50", "p99", "max"].into_iter().enumerate() {
                let color = Palette99::pick(which).to_rgba();
                #[expect(clippy::cast_precision_loss, reason = "0 to 2")]
                let offset = 0.1 + 0.27 * which as f64;
                chart
                    .draw_series(figures.iter().enumerate().map(|(i, bars)| {
                        #[expect(clippy::cast_precision_loss, reason = "a bar index")]
                        let x = i as f64 + offset;
                        Rectangle::new([(x, FLOOR), (x + 0.25, bars[which])], color.filled())
                    }))?
                    .label(label)
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled())
                    });
            }
            crate::chart::reference_line(
                chart,
                width,
                GOAL_P99_US,
                "goal: p99 under 2 ms under the seeky load (issue 12)".to_owned(),
            )
        },
    )
}

/// What [`measure`] found.
#[derive(Debug, Serialize)]
struct RaiseFigures {
    /// abissd's raise count and latencies.
    raises: abiss_proto::RaiseReport,
    /// Miss threads raised by the time their read returned.
    #[serde(rename = "raised_before_the_read_returned")]
    raised_in_time: u32,
    /// Latency of the miss reads.
    #[serde(rename = "miss_read_latency")]
    read_summary: LatencySummary,
    /// The programs' cost over the first 10 s, with the file attached.
    #[serde(rename = "program_costs_with_a_file_attached")]
    costs: abiss_proto::StatsReport,
    /// Busy share of all CPUs while the misses were made, %.
    cpu_busy_pct: f64,
    /// Steal over that time, ms (all CPUs): the hypervisor's share, which delays abissd and
    /// the programs alike (`None` where the kernel does not count it).
    steal_ms: Option<u64>,
}

/// Brings up the lab disk and abissd with one attached 1 MB/s stream, starts `load`, and makes
/// `misses` misses on the stream's file; everything is torn down before it returns.
fn measure(bin_dir: &Path, misses: u32, load: BestEffortLoad) -> anyhow::Result<RaiseFigures> {
    let disk = LabDisk::up("raises", DISK_BYTES, 128)?;
    // The seeky load's files go first: the stream and copy files are then spread over what is
    // left, and a reserve fills the rest of the disk.
    let seeky_files = match load {
        BestEffortLoad::Copy => None,
        BestEffortLoad::Seeky => Some(crate::players::load::lay_out(disk.mount_dir())?),
    };
    let files = layout::make_files(
        disk.mount_dir(),
        disk.size_bytes(),
        1,
        STREAM_FILE_BYTES,
        COPY_FILE_BYTES,
    )?;
    let stream_file = files.streams[0].clone();
    let daemon = Daemon::start(
        bin_dir,
        disk.device(),
        &[
            "--elevator",
            "mq-deadline",
            "--capacity",
            "100MB/s",
            "--realtime-share",
            "95",
        ],
        None,
    )?;
    let mut client = daemon.connect()?;
    let file = File::open(&stream_file)?;
    let stream = client.attach(
        &file,
        AttachRequest::read(ByteRate(1_000_000), ByteSize(564 << 10), 20, 0),
    )?;
    client.wait_loaded(stream.id, Duration::from_secs(30))?;
    let running = start_load(load, &files, seeky_files, disk.mount_dir(), misses)?;
    std::thread::sleep(Duration::from_secs(3));

    // The programs' cost while a file is attached (every request's file is looked up), over
    // the load and the misses.
    let mut stats_client = daemon.connect()?;
    let costs = std::thread::spawn(move || stats_client.stats(10_000));
    let (cpu_before, steal_before) = (cpu_times()?, abiss_lab::system::stolen_ms());
    let (reads, raised_in_time) = make_misses(&stream_file, misses)?;
    let (cpu_after, steal_ms) = (cpu_times()?, abiss_lab::system::stolen_since(steal_before));
    let costs = costs
        .join()
        .map_err(|_| anyhow::anyhow!("the stats request panicked"))??;
    let (_, raises) = client.status_and_raises()?;
    match running {
        RunningLoad::Copy(copy) => copy.stop()?,
        RunningLoad::Seeky(seeky) => drop(seeky),
    }
    drop(client);
    drop(daemon);
    drop(disk);
    Ok(RaiseFigures {
        raises,
        raised_in_time,
        read_summary: reads.summary(),
        costs,
        cpu_busy_pct: busy_pct(cpu_before, cpu_after),
        steal_ms,
    })
}

/// Starts `load` on the lab disk mounted at `mount_dir` (its files laid out already).
fn start_load(
    load: BestEffortLoad,
    files: &layout::BenchFiles,
    seeky_files: Option<crate::players::load::LoadFiles>,
    mount_dir: &Path,
    misses: u32,
) -> anyhow::Result<RunningLoad> {
    Ok(match load {
        BestEffortLoad::Copy => RunningLoad::Copy(CopyLoop::start(
            files.copy_source.clone(),
            files.copy_destination.clone(),
            COPY_CHUNK_BYTES,
        )),
        BestEffortLoad::Seeky => {
            let files = seeky_files.context("the seeky load's files were laid out")?;
            // Longer than any run of the misses (200 under this load take about a minute);
            // the load is killed when the misses are done.
            let runtime = Duration::from_secs(60) + Duration::from_secs(u64::from(misses));
            RunningLoad::Seeky(crate::players::load::start(mount_dir, &files, runtime)?)
        }
    })
}

/// Makes `count` misses on `path`, each by a new thread; returns their read latencies and how
/// many threads were raised by the time their read returned.
fn make_misses(path: &Path, count: u32) -> anyhow::Result<(LatencyHistogram, u32)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut reads = LatencyHistogram::new();
    let mut raised_in_time = 0u32;
    for _ in 0..count {
        let offset = rng.gen_range(0..STREAM_FILE_BYTES / READ_BYTES) * READ_BYTES;
        let path = path.to_path_buf();
        let reader = std::thread::spawn(move || -> anyhow::Result<(Duration, bool)> {
            let file = File::open(&path)?;
            posix_fadvise(
                file.as_raw_fd(),
                i64::try_from(offset)?,
                i64::try_from(READ_BYTES)?,
                PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )?;
            let mut buffer = vec![0u8; usize::try_from(READ_BYTES)?];
            let started = Instant::now();
            file.read_exact_at(&mut buffer, offset)?;
            let took = started.elapsed();
            let raised = current_thread_ioprio()? == RT0;
            Ok((took, raised))
        });
        let (took, raised) = reader
            .join()
            .map_err(|_| anyhow::anyhow!("a reader panicked"))??;
        reads.record(took);
        raised_in_time += u32::from(raised);
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((reads, raised_in_time))
}

/// The Markdown report.
fn markdown(results: &Results<BestEffortLoad, RaiseFigures>, misses: u32) -> String {
    let command = &results.command;
    let micros = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |us| us.to_string());
    let mut markdown = format!(
        "### Raise latency: page-cache miss on an attached file to raised I/O priority\n\n\
         `{command}`: {} misses per load, each by a new thread reading 64 KiB it first dropped \
         from the page cache, on a 1 MB/s level-0 stream of the lab hdd. Latency is measured by \
         abissd from the kernel event's timestamp to the return of `ioprio_set` (the record of \
         the raise is written before it), and read back from `abissctl status`. While the misses were made: the busy share \
         of all CPUs, and steal, the time the hypervisor gave this virtual machine's CPUs to \
         others while they had work (all CPUs; it delays abissd and the programs alike). {}\n\n\
         | load | misses | raises | raise p50 µs | raise p99 µs | raise max µs | raised before the read returned | miss read p50 ms | miss read p99 ms | CPU busy % | steal ms |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        misses,
        report::machine_line(&results.machine)
    );
    for Row {
        configuration: load,
        figures: row,
        ..
    } in &results.rows
    {
        let _ = writeln!(
            markdown,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
            load.describe(),
            misses,
            row.raises.total,
            micros(row.raises.latency_p50_us),
            micros(row.raises.latency_p99_us),
            micros(row.raises.latency_max_us),
            row.raised_in_time,
            report::ms(row.read_summary.p50_ms),
            report::ms(row.read_summary.p99_ms),
            row.cpu_busy_pct,
            row.steal_ms
                .map_or_else(|| "-".to_owned(), |ms| ms.to_string())
        );
    }
    for Row {
        configuration: load,
        figures: row,
        ..
    } in &results.rows
    {
        let _ = write!(
            markdown,
            "\nCost of the eBPF programs over the first 10 s under the {}, with the stream's \
             file attached (each request's file is then looked up and tagged):\n\n\
             | program | runs | mean ns |\n| --- | ---: | ---: |\n",
            load.describe()
        );
        for program in &row.costs.programs {
            let _ = writeln!(
                markdown,
                "| {} | {} | {:.0} |",
                program.name, program.run_count, program.avg_ns
            );
        }
    }
    markdown
}
