//! `abissctl`: the ABISS command line.
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
