//! `abissd`: the ABISS controller daemon.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use abiss_daemon::capabilities::Feature;
use abiss_daemon::device::{DeviceConfig, Elevator};
use abiss_daemon::policy::memory::LockedMemoryBudget;
use abiss_daemon::{kernel_layout::KERNEL_BTF, DaemonConfig};
use abiss_proto::{AdmissionMode, ByteRate, ByteSize};
use clap::Parser;

/// The ABISS controller daemon: guaranteed-rate streams on managed disks, and block I/O
/// tracing by priority.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Control socket to serve.
    #[arg(long, env = abiss_proto::SOCKET_ENV, default_value = abiss_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    #[arg(long, env = "ABISS_BTF", default_value = KERNEL_BTF)]
    btf: PathBuf,
    /// Where device settings to restore after a crash are kept.
    #[arg(long, default_value = "/run/abiss")]
    state_dir: PathBuf,
    /// A disk to manage (NAME, /dev/NAME or MAJOR:MINOR; a partition means its disk). Streams
    /// can only be attached to files on managed disks. Repeat for more disks.
    #[arg(long = "device", value_name = "DEV")]
    devices: Vec<String>,
    /// Elevator of managed disks: mq-deadline or bfq.
    #[arg(long, default_value_t = DeviceConfig::DEFAULT.elevator)]
    elevator: Elevator,
    /// Most requests a managed disk's driver may hold (at least 4): the elevator orders the
    /// rest, so a shallow queue keeps real-time requests first.
    #[arg(long, default_value_t = DeviceConfig::DEFAULT.dispatch_depth)]
    dispatch_depth: u32,
    /// Sustained capacity assumed for each managed disk until it has a measured model (see
    /// `abissctl profile --save`), e.g. 30MB/s.
    #[arg(long, default_value = "20MB/s")]
    capacity: ByteRate,
    /// Percent of the capacity real-time streams may reserve (1 to 95); the rest stays for
    /// best-effort traffic.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=95))]
    realtime_share: u32,
    /// Do not raise readers that miss the page cache on an attached file to the stream's
    /// priority (for comparisons).
    #[arg(long)]
    no_upgrades: bool,
    /// Seconds a raised reader may go without reading its file before its priority is put
    /// back.
    #[arg(long, default_value = "5", value_parser = parse_seconds)]
    upgrade_idle: Duration,
    /// Admission on disks with a measured model: deterministic (the worst case must fit),
    /// statistical (TRAC: the predicted miss probability must stay at most --p-req), or off
    /// (admit everything: for measurements only).
    #[arg(long, default_value = "statistical")]
    admission: AdmissionMode,
    /// Allowed probability that a service window overruns (statistical admission), between 0
    /// and 1 exclusive.
    #[arg(long, default_value = "0.01", value_parser = parse_probability)]
    p_req: f64,
    /// Switch an optional part off, as on a kernel without its hooks (repeatable):
    /// read-tracking (Linux 6.12), miss-upgrades (6.18), uring-reports (6.4),
    /// direct-io-tagging. `abissctl status` shows what is on.
    #[arg(long = "disable", value_name = "PART", value_enum)]
    disabled: Vec<Feature>,
    /// Most memory all playout buffers together may lock (default: a quarter of RAM).
    #[arg(long, value_name = "SIZE")]
    locked_memory: Option<ByteSize>,
    /// Most memory one user's playout buffers may lock (default: a quarter of
    /// --locked-memory). Root's streams count only against the total.
    #[arg(long, value_name = "SIZE")]
    user_locked_memory: Option<ByteSize>,
}

fn parse_seconds(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= 86_400.0 => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(format!(
            "{text:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

/// A probability strictly between 0 and 1.
fn parse_probability(text: &str) -> Result<f64, String> {
    let p: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if p.is_finite() && p > 0.0 && p < 1.0 {
        Ok(p)
    } else {
        Err(format!(
            "{text} is not a probability between 0 and 1 (exclusive)"
        ))
    }
}

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

fn main() -> ExitCode {
    let args = Args::parse();
    raise_descriptor_limit();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
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
    let config = DaemonConfig {
        socket: args.socket,
        btf: args.btf,
        state_dir: args.state_dir,
        devices: args.devices,
        device_config: DeviceConfig {
            elevator: args.elevator,
            dispatch_depth: args.dispatch_depth,
        },
        capacity_bps: args.capacity.0,
        realtime_share_percent: args.realtime_share,
        upgrades: !args.no_upgrades,
        upgrade_idle: args.upgrade_idle,
        admission_mode: args.admission,
        p_req: args.p_req,
        disabled: args.disabled,
        locked_memory: locked_memory(args.locked_memory, args.user_locked_memory),
    };
    match runtime.block_on(abiss_daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abissd: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
