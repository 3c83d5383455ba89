//! `cargo xtask man --out DIR`: man pages and shell completions made from the binaries' own
//! clap definitions, so they cannot drift from `--help`.
//!
//! | what | file |
//! | --- | --- |
//! | `abissctl`, each of its subcommands, `abiss-lab` and its subcommands | `DIR/man/man1/NAME.1` (`abissctl-trace.1`, …) |
//! | `abissd` (a system daemon) | `DIR/man/man8/abissd.8` |
//! | bash, zsh and fish completions | `DIR/completions/bash/NAME`, `DIR/completions/zsh/_NAME`, `DIR/completions/fish/NAME.fish` |
//!
//! The completion files are named as each shell's completion directory expects
//! (`bash-completion/completions/NAME`, `zsh/site-functions/_NAME`,
//! `fish/vendor_completions.d/NAME.fish`), so installing them is a copy.
//!
//! The definitions are values of the binaries' libraries (`abissctl::cli::Cli`,
//! `abiss_daemon::args::Args`, `abiss_lab::cli::Cli`). abissd's library has a build script that
//! needs the eBPF compiler `setup` installs, and xtask must build on a fresh machine, so xtask
//! links them only with its `docs` feature: without it, [`generate`] runs xtask again with the
//! feature (after setup, which every xtask command runs first).

use std::path::{Path, PathBuf};

/// Where the pages and completions go.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Output directory: pages under DIR/man, completions under DIR/completions.
    #[arg(long, value_name = "DIR", required_unless_present_all = ["man_dir", "completions_dir"])]
    out: Option<PathBuf>,
    /// Put the man pages (man1/, man8/) here instead of DIR/man.
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with = "out",
        requires = "completions_dir"
    )]
    man_dir: Option<PathBuf>,
    /// Put the completions (bash/, zsh/, fish/) here instead of DIR/completions.
    #[arg(long, value_name = "DIR", conflicts_with = "out", requires = "man_dir")]
    completions_dir: Option<PathBuf>,
}

/// `cargo xtask man`.
pub fn run(args: &ManArgs) -> anyhow::Result<()> {
    let (man_dir, completions_dir) = match (&args.out, &args.man_dir, &args.completions_dir) {
        (Some(out), _, _) => (out.join("man"), out.join("completions")),
        (None, Some(man), Some(completions)) => (man.clone(), completions.clone()),
        _ => anyhow::bail!("give --out DIR, or both --man-dir and --completions-dir"),
    };
    generate(&man_dir, &completions_dir)
}

/// Writes the man pages under `man_dir` (`man1/`, `man8/`) and the completions under
/// `completions_dir` (`bash/`, `zsh/`, `fish/`); prints each file written.
#[cfg(not(feature = "docs"))]
pub fn generate(man_dir: &Path, completions_dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    // The child runs in the workspace root: relative directories must mean what they meant
    // here.
    let absolute = |dir: &Path| {
        std::path::absolute(dir).with_context(|| format!("cannot resolve {}", dir.display()))
    };
    let man_dir = absolute(man_dir)?;
    let completions_dir = absolute(completions_dir)?;
    let text = |path: &Path| path.to_string_lossy().into_owned();
    crate::shell::cargo(
        &crate::workspace_root(),
        &[
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--features",
            "docs",
            "--",
            "man",
            "--man-dir",
            &text(&man_dir),
            "--completions-dir",
            &text(&completions_dir),
        ],
    )
}

/// Writes the man pages under `man_dir` (`man1/`, `man8/`) and the completions under
/// `completions_dir` (`bash/`, `zsh/`, `fish/`); prints each file written.
#[cfg(feature = "docs")]
pub fn generate(man_dir: &Path, completions_dir: &Path) -> anyhow::Result<()> {
    use clap::CommandFactory as _;
    let programs = [
        (abissctl::cli::Cli::command(), "1"),
        (abiss_daemon::args::Args::command(), "8"),
        (abiss_lab::cli::Cli::command(), "1"),
    ];
    for (command, section) in programs {
        let pages = man_dir.join(format!("man{section}"));
        create_dir(&pages)?;
        write_pages(command.clone(), section, &pages)?;
        write_completions(command, completions_dir)?;
    }
    Ok(())
}

#[cfg(feature = "docs")]
fn create_dir(dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// One page for the program and one for each visible subcommand (`abissctl-trace.1`), as
/// git does.
#[cfg(feature = "docs")]
fn write_pages(command: clap::Command, section: &str, dir: &Path) -> anyhow::Result<()> {
    fn page(command: clap::Command, section: &str, dir: &Path) -> anyhow::Result<()> {
        use anyhow::Context as _;
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            page(sub.clone(), section, dir)?;
        }
        let man = clap_mangen::Man::new(command)
            .section(section)
            .manual("abiss")
            .source(format!("abiss {}", env!("CARGO_PKG_VERSION")));
        let path = dir.join(man.get_filename());
        let mut text = Vec::new();
        man.render(&mut text)?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
        Ok(())
    }
    // Built, so that subcommands know their full names (`abissctl-trace`); no `help`
    // subcommand page, as `--help` is on every page anyway.
    let mut command = command.disable_help_subcommand(true);
    command.build();
    page(command, section, dir)
}

/// The program's completions for bash, zsh and fish.
#[cfg(feature = "docs")]
fn write_completions(mut command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use clap_complete::Shell;
    let name = command.get_name().to_owned();
    let files = [
        (Shell::Bash, "bash", name.clone()),
        (Shell::Zsh, "zsh", format!("_{name}")),
        (Shell::Fish, "fish", format!("{name}.fish")),
    ];
    for (shell, subdir, file) in files {
        let dir = dir.join(subdir);
        create_dir(&dir)?;
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut command, &name, &mut text);
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(())
}
