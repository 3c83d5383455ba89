//! `abissctl`: the ABISS command line. Everything but `main` is in the library (`src/lib.rs`),
//! whose clap definition `cargo xtask man` also turns into man pages and shell completions.
use std::process::ExitCode;

use abissctl::cli;
use clap::Parser;

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
