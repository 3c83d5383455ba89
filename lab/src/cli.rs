//! The command line: parses arguments, calls the library, maps errors to exit codes.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::lab::{self, DEFAULT_BACKING_DIR, DEFAULT_STATE_DIR};
use crate::{FilesystemKind, Lab, LabError, LabOptions, ModelFile, ModelKind};
use abiss_units::ByteSize;
use clap::{Parser, Subcommand, ValueEnum};

/// Emulated slow disks as real block devices (FUSE + loop device), for the abiss benchmarks.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Bring a lab up and print its device (and mount point); the emulator keeps running in
    /// the background until `down`.
    Up(UpArgs),
    /// Take the lab down, whatever state it is in (also after the emulator was killed).
    Down(StateArgs),
    /// Print the lab's state and the emulator's running totals as JSON.
    Status(StateArgs),
    /// Measure the device through the kernel with `O_DIRECT` and compare with the model;
    /// exits non-zero if a measurement is off by more than the tolerance.
    Validate {
        #[command(flatten)]
        state: StateArgs,
        /// Allowed relative error in percent.
        #[arg(long, default_value_t = 10.0)]
        tolerance_percent: f64,
    },
    /// Run the emulator (started by `up`; not for direct use).
    #[command(hide = true)]
    Serve {
        #[command(flatten)]
        state: StateArgs,
        /// Stay in the foreground instead of detaching.
        #[arg(long)]
        foreground: bool,
    },
}

#[derive(Debug, clap::Args)]
struct StateArgs {
    /// Directory holding the lab's state.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
struct UpArgs {
    /// The device model.
    #[arg(long, value_enum)]
    model: ModelArg,
    /// Model file (TOML) with parameters; see lab/models/default.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Size of the emulated disk: 4G, 512M (powers of 1024, as in dd), 4GB (powers of 1000)
    /// or bytes.
    #[arg(long, default_value = "4G", value_parser = parse_size)]
    size: u64,
    /// Make a file system on the device.
    #[arg(long, value_enum)]
    mkfs: Option<MkfsArg>,
    /// Mount the file system here (needs --mkfs, or a device that already has one).
    #[arg(long)]
    mount: Option<PathBuf>,
    /// Mount options (`mount -o`), e.g. compress=zstd on btrfs.
    #[arg(long)]
    mount_options: Option<String>,
    /// I/O scheduler to select on the device once its depth is set (e.g. bfq, mq-deadline).
    #[arg(long)]
    scheduler: Option<String>,
    #[command(flatten)]
    state: StateArgs,
    /// Directory for the sparse file that holds the data.
    #[arg(long, default_value = DEFAULT_BACKING_DIR)]
    backing_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModelArg {
    Hdd,
    Cloud,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MkfsArg {
    Ext4,
    Xfs,
    Btrfs,
}

/// Parses sizes the way abissctl and abissd do (`abiss-units`): `4G`, `512M`, `64MiB`, `1T`
/// or `4096`; `k`, `M`, `G`, `T` alone are powers of 1024, `MB` and `GB` powers of 1000.
fn parse_size(text: &str) -> Result<u64, String> {
    text.parse::<ByteSize>()
        .map(|size| size.0)
        .map_err(|error| error.to_string())
}

/// Parses the command line and runs it; the binary's `main`.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => up(&args),
        Command::Down(state) => down(&state.state_dir),
        Command::Status(state) => status(&state.state_dir),
        Command::Validate {
            state,
            tolerance_percent,
        } => validate(&state.state_dir, tolerance_percent),
        Command::Serve { state, foreground } => return serve(&state.state_dir, foreground),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abiss-lab: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn up(args: &UpArgs) -> Result<(), LabError> {
    let file = match &args.config {
        Some(path) => ModelFile::load(path)?,
        None => ModelFile::default(),
    };
    let kind = match args.model {
        ModelArg::Hdd => ModelKind::Hdd,
        ModelArg::Cloud => ModelKind::Cloud,
    };
    let mut options = LabOptions::new(file.spec(kind))?;
    options.size_bytes = args.size;
    options.mkfs = args.mkfs.map(|mkfs| match mkfs {
        MkfsArg::Ext4 => FilesystemKind::Ext4,
        MkfsArg::Xfs => FilesystemKind::Xfs,
        MkfsArg::Btrfs => FilesystemKind::Btrfs,
    });
    options.mount_dir.clone_from(&args.mount);
    options.mount_options.clone_from(&args.mount_options);
    options.scheduler.clone_from(&args.scheduler);
    options.state_dir.clone_from(&args.state.state_dir);
    options.backing_dir.clone_from(&args.backing_dir);
    let lab = Lab::up(&options)?;
    println!("device: {}", lab.device().display());
    if let Some(dir) = lab.mount_dir() {
        println!("mount: {}", dir.display());
    }
    println!("stats: {}", lab.state().stats_path.display());
    Ok(())
}

fn down(state_dir: &Path) -> Result<(), LabError> {
    let removed = Lab::down(state_dir)?;
    if removed.is_empty() {
        println!("nothing to remove");
    }
    for item in removed {
        println!("removed {item}");
    }
    Ok(())
}

fn status(state_dir: &Path) -> Result<(), LabError> {
    let lab = Lab::open(state_dir)?;
    let summary = lab.summary().ok();
    let json = serde_json::json!({ "state": lab.state(), "summary": summary });
    println!("{json:#}");
    Ok(())
}

/// Runs the validation, and runs it again (up to [`VALIDATION_ATTEMPTS`] in all, a second
/// apart) when it failed while the hypervisor took much of the machine's CPU time: such a run
/// measured the host, not the emulated disk. A run that fails on a quiet machine fails at once
/// (exit 8); when every run failed disturbed, the result is inconclusive (exit 11).
fn validate(state_dir: &Path, tolerance_percent: f64) -> Result<(), LabError> {
    let mut lab = Lab::open(state_dir)?;
    let mut attempt = 1;
    let mut least_stolen = f64::INFINITY;
    loop {
        let report = crate::validate(&mut lab, tolerance_percent)?;
        println!(
            "(the emulator takes {} µs of measured transport delay off each reply)",
            lab.state().transport_ns / 1000
        );
        println!("{report}");
        if report.failed() == 0 || !report.disturbed() {
            return report.into_result().map(drop);
        }
        least_stolen = least_stolen.min(report.stolen_share().unwrap_or(0.0) * 100.0);
        if attempt == VALIDATION_ATTEMPTS {
            return Err(LabError::ValidationDisturbed {
                attempts: attempt,
                least_stolen_percent: least_stolen,
            });
        }
        println!(
            "the hypervisor took more than {:.0}% of the CPUs' time during these checks, so \
             they measured the host rather than the disk: measuring again ({} of {})",
            crate::validate::STOLEN_SHARE_TO_REPEAT * 100.0,
            attempt + 1,
            VALIDATION_ATTEMPTS
        );
        attempt += 1;
        // Steal comes in bursts: give one a moment to pass.
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Validation runs at most, when runs fail under CPU steal.
const VALIDATION_ATTEMPTS: u32 = 5;

/// Runs the emulator. Detaching forks before any thread exists, so the parent (`up`) can
/// reap it at once and the emulator is nobody's zombie when it is killed.
fn serve(state_dir: &Path, foreground: bool) -> ExitCode {
    if !foreground {
        // SAFETY: no other thread exists yet in this process, so the child may run freely.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Parent { .. }) => return ExitCode::SUCCESS,
            Ok(nix::unistd::ForkResult::Child) => {
                let _ = nix::unistd::setsid();
            }
            Err(e) => {
                let error = LabError::system("detaching the emulator", e);
                lab::record_emulator_failure(state_dir, &error);
                return ExitCode::from(error.exit_code());
            }
        }
    }
    crate::emulator::apart::set_apart();
    let result = lab::record_emulator_pid(state_dir)
        .and_then(|()| lab::read_emulator_config(state_dir))
        .and_then(|config| crate::emulator::serve(&config));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abiss-lab serve: {error}");
            lab::record_emulator_failure(state_dir, &error);
            ExitCode::from(error.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        // The decimal units are decimal here too, as everywhere in abiss.
        assert_eq!(parse_size("4GB"), Ok(4_000_000_000));
        assert!(parse_size("4X").unwrap_err().contains("'4X'"));
        assert!(parse_size("big").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
