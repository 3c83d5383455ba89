//! Project automation: `cargo xtask setup | build | test | bench | demo | install | deb`.
//!
//! Every command first makes sure the machine has what it needs (Debian packages, bpf-linker),
//! so a fresh clone needs nothing but `cargo xtask demo` or `cargo xtask test`. Each installs
//! only what it runs: the demo the build and the lab, the tests and benchmarks the rest.
//! It holds no project logic of its own: the benchmarks live in `abiss-bench`, the integration
//! tests in `abiss-tests`, the lab in `abiss-lab`, and the eBPF object is built by
//! `scheduler-user`'s build script.
//!
//! | concern | module |
//! | --- | --- |
//! | arguments; `build` and `test` (unit tests, then the root-only integration tests one at a time) | crate root (`main.rs`) |
//! | `setup`: the packages each command needs, Debian's rustc-web and bpf-linker, idempotently; no package's service enabled | `setup`, `setup/services.rs` |
//! | `bench`: runs `abiss-bench`, results under `bench/results/` | `bench` |
//! | `demo`: an emulated laptop hdd, a copy loop and a 1 MB/s player streamed by abissd | `demo` |
//! | `install`: binaries, library, header, man pages, completions, systemd unit, configuration | `install` |
//! | `deb`: the Debian package, from the tree `install` stages | `deb` |
//! | `kernels`: this build on distribution kernels booted in qemu | `kernels` |
//! | `man`: man pages and shell completions from the binaries' clap definitions | `docs` |
//! | running commands with their output shown and failures named | `shell` |
//! | the integration run: binaries in two lanes under the integration lock | `suite` |
//! | the integration run's failure sections and times, repeated at its end | `test_log` |
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod deb;
mod demo;
mod docs;
mod install;
mod kernels;
mod setup;
mod shell;
mod suite;
mod test_log;

/// abiss build, test and demo automation.
#[derive(Debug, Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install (idempotently) the Debian packages and bpf-linker that the build, the demo and
    /// the tests need (each other command installs only what it runs).
    Setup,
    /// Build the eBPF object and the user-space binaries (the object is embedded in abissd).
    Build {
        /// Build with optimisations.
        #[arg(long)]
        release: bool,
    },
    /// Run the unit tests, then the privileged integration tests one at a time.
    Test {
        /// Only the unit tests.
        #[arg(long)]
        unit: bool,
        /// Passed to the test binaries as a name filter.
        filter: Option<String>,
    },
    /// Install abiss as a system service: binaries, libabiss (with SONAME and a pkg-config
    /// file), the header, man pages, completions, the systemd unit and a configuration file.
    Install(install::InstallArgs),
    /// A Debian package, in target/deb: the installed tree, the unit
    /// enabled on install, /etc/abiss/abissd.toml as a conffile.
    Deb(deb::DebArgs),
    /// Man pages (abissctl, abiss-lab: section 1; abissd: 8) and bash, zsh and fish
    /// completions, generated from the binaries' clap definitions.
    Man(docs::ManArgs),
    /// Benchmarks (not tests): results go to bench/results/ as JSON and Markdown.
    Bench {
        #[command(subcommand)]
        which: Benchmark,
    },
    /// abissd and abissctl from this build on Debian's and Ubuntu's kernels (5.10 to 6.12),
    /// each booted in qemu: results go to bench/results/kernels.md and kernels.json.
    Kernels(kernels::KernelsArgs),
    /// The main job: start abissd on a scratch disk, run a mixed-priority workload and show
    /// live latency per priority, then tear everything down.
    Demo {
        /// Seconds of workload.
        #[arg(long, default_value_t = 12)]
        secs: u64,
    },
}

#[derive(Debug, Subcommand)]
enum Benchmark {
    /// The ABISS reference measurement on the lab hdd (see `abiss-bench reference --help`).
    Reference {
        /// Passed to `abiss-bench reference`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The saturation sweep on the lab hdd (see `abiss-bench sweep --help`).
    Sweep {
        /// Passed to `abiss-bench sweep`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// eBPF cost per event under a 4 KiB random-read load (see `abiss-bench overhead --help`).
    Overhead {
        /// Passed to `abiss-bench overhead`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Raise latency over many page-cache misses (see `abiss-bench raises --help`);
    /// `upgrades`, its earlier name, is still taken.
    #[command(alias = "upgrades")]
    Raises {
        /// Passed to `abiss-bench raises`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Admission control's predictions against measured misses on the lab hdd (see
    /// `abiss-bench admission --help`).
    Admission {
        /// Passed to `abiss-bench admission`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Zero-miss streams against the locked-memory budget their buffers share (see
    /// `abiss-bench memory --help`).
    Memory {
        /// Passed to `abiss-bench memory`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Real players under a seeky best-effort load on the lab hdd (see `abiss-bench players
    /// --help`).
    Players {
        /// Passed to `abiss-bench players`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Real recorders and players next to a best-effort writer on the lab hdd (see
    /// `abiss-bench recording --help`).
    Recording {
        /// Passed to `abiss-bench recording`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// 10 000 attach/detach cycles by four users with abissd killed every 2 000, then what
    /// is left over (see `abiss-bench soak --help`).
    Soak {
        /// Passed to `abiss-bench soak`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// The workspace root (xtask lives one level below it).
fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let root = workspace_root();
    let needs = match &args.command {
        Command::Setup | Command::Test { .. } | Command::Bench { .. } | Command::Kernels(_) => {
            setup::Needs::Everything
        }
        Command::Demo { .. } => setup::Needs::Demo,
        Command::Deb(_) => setup::Needs::Package,
        Command::Build { .. } | Command::Install(_) | Command::Man(_) => setup::Needs::Build,
    };
    let result = setup::ensure(needs).and_then(|()| match args.command {
        Command::Setup => Ok(()),
        Command::Build { release } => build(&root, release),
        Command::Test { unit, filter } => test(&root, unit, filter.as_deref()),
        Command::Bench { which } => build(&root, false).and_then(|()| match which {
            Benchmark::Overhead { args } => bench::run_bench_binary(&root, "overhead", &args),
            Benchmark::Reference { args } => bench::run_bench_binary(&root, "reference", &args),
            Benchmark::Sweep { args } => bench::run_bench_binary(&root, "sweep", &args),
            Benchmark::Raises { args } => bench::run_bench_binary(&root, "raises", &args),
            Benchmark::Admission { args } => bench::run_bench_binary(&root, "admission", &args),
            Benchmark::Memory { args } => bench::run_bench_binary(&root, "memory", &args),
            Benchmark::Players { args } => bench::run_bench_binary(&root, "players", &args),
            Benchmark::Recording { args } => bench::run_bench_binary(&root, "recording", &args),
            Benchmark::Soak { args } => bench::run_bench_binary(&root, "soak", &args),
        }),
        Command::Demo { secs } => build(&root, false).and_then(|()| demo::run(&root, secs)),
        Command::Install(args) => install::run(&root, &args),
        Command::Deb(args) => deb::run(&root, &args),
        Command::Man(args) => docs::run(&args),
        Command::Kernels(args) => kernels::run(&root, &args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn build(root: &std::path::Path, release: bool) -> anyhow::Result<()> {
    let mut args = vec!["build", "--workspace"];
    if release {
        args.push("--release");
    }
    shell::cargo(root, &args)
}

fn test(root: &std::path::Path, unit_only: bool, filter: Option<&str>) -> anyhow::Result<()> {
    // The kernels test's packages come over the network while the compiler has the CPUs.
    let kernel_packages = (!unit_only && filter.is_none()).then(|| {
        let root = root.to_path_buf();
        std::thread::spawn(move || kernels::prefetch(&root))
    });
    // One build of every target: `cargo test` unifies the dev-dependencies' features into
    // the libraries it builds, so a plain `cargo build` first would build most of them twice
    // (44 s of a 172 s build on the lab VM). The binaries land in target/debug as well.
    shell::cargo(root, &["build", "--workspace", "--all-targets"])?;
    let mut unit = vec!["test", "--workspace", "--lib", "--bins"];
    if let Some(filter) = filter {
        unit.extend(["--", filter]);
    }
    shell::cargo(root, &unit)?;
    if unit_only {
        return Ok(());
    }
    if !nix_is_root() {
        anyhow::bail!("the integration tests load eBPF programs and create loop devices: run `cargo xtask test` as root");
    }
    suite::run(root, filter, kernel_packages)
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}
