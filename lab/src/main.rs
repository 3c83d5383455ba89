//! `abiss-lab`: bring emulated slow disks up and down, validate them, and serve them.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
