//! `abissd`: the ABISS controller daemon.
use std::path::PathBuf;
use std::process::ExitCode;

use abiss_daemon::{kernel_layout::KERNEL_BTF, DaemonConfig};
use clap::Parser;

/// The ABISS controller daemon: traces block I/O by priority and serves abissctl.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Control socket to serve.
    #[arg(long, env = abiss_proto::SOCKET_ENV, default_value = abiss_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Kernel BTF to resolve struct layouts from.
    #[arg(long, env = "ABISS_BTF", default_value = KERNEL_BTF)]
    btf: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
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
    };
    match runtime.block_on(abiss_daemon::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abissd: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
