//! `abissctl`: the ABISS command line.
//!
//! It talks to abissd only through the protocol (`abiss-proto`, via `abiss-client`) and never
//! links aya or the eBPF side. The one thing it does without the daemon is `profile`, which
//! reads a disk itself and has `abiss-model` fit the model.
//!
//! | concern | module |
//! | --- | --- |
//! | arguments, subcommands, dispatch | `cli` |
//! | block device names as users type them: `loop0`, `/dev/loop0`, `7:0` | `devices` |
//! | errors and their exit codes | `error` |
//! | `admit`: capacity planning answered by abissd's admission control; nothing is attached | `planning` |
//! | `profile`: measuring a disk with `O_DIRECT` and fitting its model | `profile` |
//! | what `profile` prints without `--json` | `profile::report` |
//! | `stats`: what the eBPF programs and the daemon cost | `stats` |
//! | `attach`, `detach`, `run`, `list`, `status`: streams | `streams` |
//! | `trace`: live latency by device, operation and I/O priority, or by stream | `trace` |
use std::process::ExitCode;

use clap::Parser;

mod cli;
mod devices;
mod error;
mod planning;
mod profile;
mod stats;
mod streams;
mod trace;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match cli::run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("abissctl: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}
