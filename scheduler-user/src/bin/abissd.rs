//! `abissd`: the ABISS controller daemon (its start is `abiss_daemon::start`).
fn main() -> std::process::ExitCode {
    abiss_daemon::start::main()
}
