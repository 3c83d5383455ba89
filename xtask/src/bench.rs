//! `cargo xtask bench`: benchmarks are not tests; they live in the `abiss-bench` crate and
//! write JSON and Markdown (and charts) under `bench/results/`.

use std::path::Path;
use std::process::Command;

use crate::shell;

/// Runs a benchmark of the `abiss-bench` crate (optimised: its readers time themselves).
pub fn run_bench_binary(root: &Path, which: &str, args: &[String]) -> anyhow::Result<()> {
    shell::cargo(
        root,
        &["build", "--release", "-p", "abiss-bench", "-p", "abiss-lab"],
    )?;
    let mut command = Command::new(root.join("target/release/abiss-bench"));
    command
        .current_dir(root)
        .arg(which)
        .args(args)
        .env("ABISS_LAB_BIN", root.join("target/release/abiss-lab"))
        .env("ABISS_BIN_DIR", root.join("target/debug"));
    shell::run(&mut command)
}
