//! `cargo xtask bench`: benchmarks are not tests; they live in the `abiss-bench` crate and
//! write JSON and Markdown (and charts) under `bench/results/`.

use std::path::Path;
use std::process::Command;

use crate::shell;

/// Runs a benchmark of the `abiss-bench` crate, with everything it starts built as users
/// run it, optimised: abissd and abissctl, the lab, and the test recorder and hostile client
/// that some benchmarks start (its readers time themselves, so they are optimised too).
pub fn run_bench_binary(root: &Path, which: &str, args: &[String]) -> anyhow::Result<()> {
    shell::cargo(
        root,
        &[
            "build",
            "--release",
            "-p",
            "abiss-bench",
            "-p",
            "abiss-lab",
            "-p",
            "scheduler-user",
            "-p",
            "abissctl",
            "-p",
            "abiss-tests",
            "--bins",
        ],
    )?;
    let mut command = Command::new(root.join("target/release/abiss-bench"));
    command
        .current_dir(root)
        .arg(which)
        .args(args)
        .env("ABISS_LAB_BIN", root.join("target/release/abiss-lab"))
        .env("ABISS_BIN_DIR", root.join("target/release"));
    shell::run(&mut command)
}
