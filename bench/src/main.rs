//! `abiss-bench`: benchmarks on the lab's emulated disks, run through `cargo xtask bench
//! reference|sweep` (which builds this and abiss-lab in release mode and sets
//! `ABISS_LAB_BIN`). Needs root.

use abiss_bench::{
    admission, interrupt, memory, overhead, players, raises, recording, reference, soak, sweep,
};
use clap::Parser;

/// Benchmarks of abiss on the lab's emulated hdd; results go to bench/results/.
#[derive(Debug, Parser)]
#[command(version)]
enum Command {
    /// The ABISS slides' reference measurement: 4 readers at 1 MB/s against a copy loop,
    /// per configuration (reference.json, .md, .svg).
    Reference(reference::ReferenceArgs),
    /// Saturation sweep: more 1 MB/s readers under the same copy load until deadlines are
    /// missed, per configuration (sweep.json, .md, .svg).
    Sweep(sweep::SweepArgs),
    /// The tracer's cost per eBPF event under a 4 KiB random-read load, per elevator
    /// (overhead.json, .md).
    Overhead(overhead::OverheadArgs),
    /// Time from a page-cache miss on an attached file to the reader's raised priority, over
    /// many misses under the copy load and the seeky load (raises.json, .md, .svg).
    #[command(alias = "upgrades")]
    Raises(raises::RaisesArgs),
    /// Admission control against measurement: the lab hdd profiled, the predicted miss
    /// probability per number of 1 MB/s readers in both modes, and the measured miss ratio
    /// with admission off (admission.json, .md, .svg).
    Admission(admission::AdmissionArgs),
    /// The saturation sweep's readers with buffers shared out of a locked-memory budget, per
    /// budget, with admission's prediction for each (memory.json, .md, .svg).
    Memory(memory::MemoryArgs),
    /// Real, unmodified media players (gst playbin, ffmpeg, mpv) under a seeky best-effort
    /// load: stall per player per configuration (players.json, .md, .svg).
    Players(players::PlayersArgs),
    /// Real recorders (ffmpeg, gst-launch, the test recorder) and players next to a best-effort
    /// writer under a small machine's dirty limits: overflows and write(2) times per
    /// configuration and file system (recording.json, .md, .svg).
    Recording(recording::RecordingArgs),
    /// Attach/detach cycles by root and three unprivileged users at once, abissd killed and
    /// restarted on the way; then what is left over (soak.json, .md, .svg).
    Soak(soak::SoakArgs),
    /// One user's cycles of `soak` (started by it).
    #[command(hide = true)]
    SoakWorker(soak::WorkerArgs),
}

fn main() -> anyhow::Result<()> {
    let command = Command::parse();
    interrupt::install()?;
    match command {
        Command::Reference(args) => reference::run(&args),
        Command::Sweep(args) => sweep::run(&args),
        Command::Overhead(args) => overhead::run(&args),
        Command::Raises(args) => raises::run(&args),
        Command::Admission(args) => admission::run(&args),
        Command::Memory(args) => memory::run(&args),
        Command::Players(args) => players::run(&args),
        Command::Recording(args) => recording::run(&args),
        Command::Soak(args) => soak::run(&args),
        Command::SoakWorker(args) => soak::worker(&args),
    }
}
