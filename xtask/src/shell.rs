//! Running commands with their output shown and their failures named.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The cargo that runs this xtask (the rustup toolchain), whatever PATH says.
fn cargo_binary() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// Runs cargo in `root` with `args`.
pub fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    cargo_with_env(root, args, &[])
}

/// The command that runs cargo in `root` with `args`.
pub fn cargo_command(root: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(cargo_binary());
    command.current_dir(root).args(args);
    command
}

/// Runs cargo in `root` with `args` and extra environment.
pub fn cargo_with_env(root: &Path, args: &[&str], env: &[(&str, &OsStr)]) -> anyhow::Result<()> {
    let mut command = cargo_command(root, args);
    for (key, value) in env {
        command.env(key, value);
    }
    run(&mut command)
}

/// Runs a command to completion; a non-zero exit is an error naming the command.
pub fn run(command: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed with {status}");
    }
    Ok(())
}

/// Runs a command and returns its standard output.
pub fn output(command: &mut Command) -> anyhow::Result<String> {
    let shown = format!("{command:?}");
    let output = command
        .output()
        .with_context(|| format!("cannot start {shown}"))?;
    if !output.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
