//! `abissd`'s start: the command line over the configuration file becomes the daemon's
//! configuration (again on SIGHUP), the runtime starts, and errors become exit codes. The
//! binary (`bin/abissd.rs`) only calls [`main`], so the library's one public way in is this.
use std::ffi::OsString;
use std::process::ExitCode;

use crate::args::Args;
use crate::config_file::{self, ConfigError};
use crate::daemon::DaemonConfig;
use crate::disk::device::DeviceOptions;
use crate::policy::memory::LockedMemoryBudget;
use abiss_proto::ByteSize;
use clap::{CommandFactory, FromArgMatches, Parser};

/// The locked-memory budgets: given, or from the machine's RAM.
fn locked_memory(total: Option<ByteSize>, per_user: Option<ByteSize>) -> LockedMemoryBudget {
    use procfs::Current as _;
    let ram = procfs::Meminfo::current().map_or(0, |info| info.mem_total);
    let mut budget = LockedMemoryBudget::for_ram(ram);
    if let Some(total) = total {
        budget = LockedMemoryBudget {
            total_bytes: total.0,
            per_user_bytes: total.0 / 4,
        };
    }
    if let Some(per_user) = per_user {
        budget.per_user_bytes = per_user.0;
    }
    budget
}

/// Raises the soft limit of open descriptors to the hard one: every connection and stream
/// holds descriptors, and a daemon out of them can no longer even open sysfs to restore a
/// disk. (The server bounds connections well below it.)
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we pass, nothing else.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0
            && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit);
        }
    }
}

/// Exit code of an unusable configuration file (clap's usage errors exit with 2).
const CONFIG_EXIT: u8 = 18;

/// Why the arguments could not be read.
enum Unusable {
    /// The command line (or a usage request: --help, --version), as clap reports it.
    Usage(clap::Error),
    /// The configuration file.
    File(ConfigError),
}

/// The arguments: the configuration file's settings under the command line's. The same at
/// start and on SIGHUP.
fn read_args(command_line: &[OsString]) -> Result<Args, Unusable> {
    // Which file: the command line's (or ABISSD_CONFIG's) `--config`, else the default; only
    // a file asked for by name must exist.
    let matches = Args::command()
        .try_get_matches_from(command_line)
        .map_err(Unusable::Usage)?;
    let first = Args::from_arg_matches(&matches).map_err(Unusable::Usage)?;
    let required = matches!(
        matches.value_source("config"),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    );
    let merged = config_file::merge(&Args::command(), &first.config, required, command_line)
        .map_err(Unusable::File)?;
    Args::try_parse_from(merged).map_err(Unusable::Usage)
}

fn daemon_config(args: Args) -> DaemonConfig {
    DaemonConfig {
        socket: args.socket,
        btf: args.btf,
        state_dir: args.state_dir,
        model_dir: args.model_dir,
        devices: args.devices,
        device_options: DeviceOptions {
            elevator: args.elevator,
            dispatch_depth: args.dispatch_depth,
        },
        capacity_bps: args.capacity.0,
        realtime_share_percent: args.realtime_share,
        raises: !args.no_raises,
        raise_idle: args.raise_idle,
        admission_mode: args.admission,
        p_req: args.p_req,
        disabled: args.disabled,
        locked_memory: locked_memory(args.locked_memory, args.user_locked_memory),
        metrics: args
            .metrics
            .map(|address| crate::serve::metrics::MetricsSettings {
                address,
                remote: args.metrics_remote,
                token_file: args.metrics_token_file,
            }),
    }
}

/// Reads the file again for SIGHUP, with the same command line; errors are returned as one
/// sentence, never printed as usage (the daemon keeps running).
fn reload(command_line: &[OsString]) -> Result<DaemonConfig, String> {
    match read_args(command_line) {
        Ok(args) => Ok(daemon_config(args)),
        Err(Unusable::File(error)) => Err(error.to_string()),
        Err(Unusable::Usage(error)) => Err(error
            .render()
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()),
    }
}

/// abissd: reads its configuration, runs the daemon until SIGINT or SIGTERM, and returns its
/// exit code.
#[must_use]
pub fn main() -> ExitCode {
    let command_line: Vec<OsString> = std::env::args_os().collect();
    let args = match read_args(&command_line) {
        Ok(args) => args,
        // Usage errors, --help and --version end as clap ends them (exit 2 or 0).
        Err(Unusable::Usage(error)) => error.exit(),
        Err(Unusable::File(error)) => {
            eprintln!("abissd: {error}");
            return ExitCode::from(CONFIG_EXIT);
        }
    };
    raise_descriptor_limit();
    crate::systemd::init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("abissd: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let config = daemon_config(args);
    let reload = Box::new(move || reload(&command_line));
    match runtime.block_on(crate::daemon::run(config, reload)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abissd: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
