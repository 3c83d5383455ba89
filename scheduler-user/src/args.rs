//! abissd's command line, as a value of the library: the binary parses it (with the
//! configuration file under it), and `cargo xtask man` makes the man page and the shell
//! completions from the same definition.

use std::path::PathBuf;
use std::time::Duration;

use abiss_proto::{AdmissionMode, ByteRate, ByteSize};
use clap::Parser;

use crate::config_file::DEFAULT_CONFIG;
use crate::disk::device::{DeviceConfig, Elevator};
use crate::kernel::capabilities::Feature;
use crate::kernel::layout::KERNEL_BTF;

/// The ABISS controller daemon: guaranteed-rate streams on managed disks, and block I/O
/// tracing by priority.
#[derive(Debug, Parser)]
// The name is the binary's, not the package's (`scheduler-user`): the man page and the
// completions are named after it.
#[command(name = "abissd", version)]
pub struct Args {
    /// Configuration file: abissd's long options as TOML keys (`device = ["sdb"]`,
    /// `capacity = "30MB/s"`); options given here override it. Read again on SIGHUP. A
    /// missing default file is no error.
    #[arg(long, env = "ABISSD_CONFIG", default_value = DEFAULT_CONFIG)]
    pub(crate) config: PathBuf,
    /// Control socket to serve.
    #[arg(long, env = abiss_proto::SOCKET_ENV, default_value = abiss_proto::DEFAULT_SOCKET)]
    pub(crate) socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    #[arg(long, env = "ABISS_BTF", default_value = KERNEL_BTF)]
    pub(crate) btf: PathBuf,
    /// Where device settings to restore after a crash are kept.
    #[arg(long, default_value = "/run/abiss")]
    pub(crate) state_dir: PathBuf,
    /// Where device models are kept (`abissctl profile --save --model-dir`); persistent, so
    /// that models survive a reboot.
    #[arg(long, default_value = abiss_model::DEFAULT_MODEL_DIR)]
    pub(crate) model_dir: PathBuf,
    /// A disk to manage (NAME, /dev/NAME or MAJOR:MINOR; a partition means its disk, a
    /// device-mapper or md device the disks beneath, a directory every disk under the file
    /// system mounted there, such as all of a btrfs's). Streams can only be attached to files on
    /// managed disks. Repeat for more disks.
    #[arg(long = "device", value_name = "DEV")]
    pub(crate) devices: Vec<String>,
    /// Elevator of managed disks: mq-deadline or bfq.
    #[arg(long, default_value_t = DeviceConfig::DEFAULT.elevator)]
    pub(crate) elevator: Elevator,
    /// Most requests a managed disk's driver may hold (at least 4): the elevator orders the
    /// rest, so a shallow queue keeps real-time requests first. Default: 4 on rotational
    /// disks, whose head serves one request at a time; 8 on the others.
    #[arg(long)]
    pub(crate) dispatch_depth: Option<u32>,
    /// Sustained capacity assumed for each managed disk until it has a measured model (see
    /// `abissctl profile --save`), e.g. 30MB/s.
    #[arg(long, default_value = "20MB/s")]
    pub(crate) capacity: ByteRate,
    /// Percent of the capacity real-time streams may reserve (1 to 95); the rest stays for
    /// best-effort traffic.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=95))]
    pub(crate) realtime_share: u32,
    /// Do not raise readers that miss the page cache on an attached file to the stream's
    /// priority (for comparisons). `--no-upgrades`, its earlier name, is still taken.
    #[arg(long, alias = "no-upgrades")]
    pub(crate) no_raises: bool,
    /// Seconds a raised reader may go without reading its file before its priority is put
    /// back. `--upgrade-idle`, its earlier name, is still taken.
    #[arg(long, alias = "upgrade-idle", default_value = "5", value_parser = parse_seconds)]
    pub(crate) raise_idle: Duration,
    /// Admission on disks with a measured model: deterministic (the worst case must fit),
    /// statistical (TRAC: the predicted miss probability must stay at most --p-req), or off
    /// (admit everything: for measurements only).
    #[arg(long, default_value = "statistical")]
    pub(crate) admission: AdmissionMode,
    /// Allowed probability that a service window overruns (statistical admission), between 0
    /// and 1 exclusive.
    #[arg(long, default_value = "0.01", value_parser = parse_probability)]
    pub(crate) p_req: f64,
    /// Switch an optional part off, as on a kernel without its hooks (repeatable):
    /// read-tracking (Linux 6.12), miss-raises (6.18; an older hook then stands in, as on
    /// such a kernel), uring-reports (6.4), direct-io-tagging. `abissctl status` shows what
    /// is on.
    #[arg(long = "disable", value_name = "PART", value_enum)]
    pub(crate) disabled: Vec<Feature>,
    /// Most memory all playout buffers together may lock (default: a quarter of RAM).
    #[arg(long, value_name = "SIZE")]
    pub(crate) locked_memory: Option<ByteSize>,
    /// Most memory one user's playout buffers may lock (default: a quarter of
    /// --locked-memory). Root's streams count only against the total.
    #[arg(long, value_name = "SIZE")]
    pub(crate) user_locked_memory: Option<ByteSize>,
    /// Serve Prometheus metrics on `/metrics` at ADDR, a loopback address and port such as
    /// 127.0.0.1:9565. Off by default. The metrics are root's view: every user's streams with
    /// their owner's uid, rate and disk, whoever connects; set --metrics-token-file where
    /// users who should not see that can reach the port.
    #[arg(long, value_name = "ADDR", value_parser = crate::serve::metrics::parse_address)]
    pub(crate) metrics: Option<std::net::SocketAddr>,
    /// Allow --metrics on an address other than loopback (such as 0.0.0.0:9565): the metrics
    /// are then anyone's who reaches it, unless --metrics-token-file is set too.
    #[arg(long, requires = "metrics")]
    pub(crate) metrics_remote: bool,
    /// Answer only scrapes that send the token on the first line of FILE as
    /// `Authorization: Bearer TOKEN` (Prometheus: `authorization: {credentials_file: FILE}`);
    /// others get 401. Read at start; FILE must not be readable by other users.
    #[arg(long, value_name = "FILE", requires = "metrics")]
    pub(crate) metrics_token_file: Option<PathBuf>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_is_consistent() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        assert_eq!(Args::command().get_name(), "abissd");
    }
}
