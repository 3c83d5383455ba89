//! `abiss-lab`: bring emulated slow disks up and down, validate them, and serve them. The
//! command line is in the library (`abiss_lab::cli`).

fn main() -> std::process::ExitCode {
    abiss_lab::cli::main()
}
