//! `cargo xtask kernels`: abissd and abissctl from this build, run on the distribution kernels
//! users have, each booted in qemu from its own package.
//!
//! Each kernel's packages are downloaded once into `target/kernels/debs` (pinned URL and
//! SHA-256), unpacked with `dpkg-deb -x`, and booted with an initramfs that holds busybox, the
//! host's abissd, abissctl and abiss-test-reader (debug info stripped), mke2fs and bpftool with
//! the host libraries they link, and the kernel's own modules that the test needs and the
//! kernel has as modules (`loop`, `mq-deadline`). Its `/init` (`kernels_init.sh`) makes an ext4
//! loop device, starts abissd on it, attaches a file, reads it with the paced reader, detaches,
//! stops abissd and counts the BPF programs left; on a kernel below abissd's floor it checks
//! the refusal instead. It reports on the serial console, which this module reads and judges.
//!
//! The VM runs under TCG by default: this lab's `/dev/kvm` is PVM (`kvm_pvm`), which boots only
//! guest kernels built for PVM; a stock kernel crawls and then stops with a KVM emulation
//! failure. `--accel kvm` uses KVM where it is a hardware one.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::shell;

/// One package to download: where, and what its SHA-256 must be.
struct Package {
    url: &'static str,
    sha256: &'static str,
}

/// What abissd must do on a kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Run, with these optional parts on (the others off, or on through a stand-in hook where
    /// `abissctl status` says so), and keep a stream's guarantee.
    Runs { on: &'static [&'static str] },
    /// Refuse to start: one sentence on stderr, this exit code, nothing left behind.
    Refuses { exit_code: i64 },
}

/// A distribution kernel.
struct Kernel {
    name: &'static str,
    distribution: &'static str,
    version: &'static str,
    /// The image package first (it holds `boot/vmlinuz-*`), then the modules package if any.
    packages: &'static [Package],
    expect: Expect,
}

/// A package of Debian's main archive.
macro_rules! debian {
    ($file:literal) => {
        concat!(
            "http://deb.debian.org/debian/pool/main/l/linux-signed-amd64/",
            $file
        )
    };
}

/// A package of Debian's security archive.
macro_rules! debian_security {
    ($file:literal) => {
        concat!(
            "http://deb.debian.org/debian-security/pool/updates/main/l/linux-signed-amd64/",
            $file
        )
    };
}

/// A package of Ubuntu's archive (every series shares the pool).
macro_rules! ubuntu {
    ($file:literal) => {
        concat!("http://archive.ubuntu.com/ubuntu/pool/main/l/", $file)
    };
}

/// The kernels, oldest first. Versions are pinned so that a run means the same thing later;
/// the hashes are those of the distributions' package indices. When a mirror drops a version,
/// pick the newest of the same series with `apt-cache show` and replace URL and hash.
const KERNELS: &[Kernel] = &[
    Kernel {
        name: "debian11-5.10",
        distribution: "Debian 11 (bullseye)",
        version: "5.10.262-1 cloud",
        packages: &[Package {
            url: debian_security!("linux-image-5.10.0-46-cloud-amd64_5.10.262-1_amd64.deb"),
            sha256: "18d94781d1b3052e21967ac2262239e5f14fbf511d6c3e110629d7aa35340760",
        }],
        expect: Expect::Refuses { exit_code: 11 },
    },
    Kernel {
        name: "ubuntu22.04-5.15",
        distribution: "Ubuntu 22.04 LTS (jammy-updates)",
        version: "5.15.0-204.214 generic",
        packages: &[
            Package {
                url: ubuntu!(
                    "linux-signed/linux-image-5.15.0-204-generic_5.15.0-204.214_amd64.deb"
                ),
                sha256: "f64db5a37befdde1ca0bef10a5826614482ee903c3163e57ed776d97a5919c75",
            },
            Package {
                url: ubuntu!("linux/linux-modules-5.15.0-204-generic_5.15.0-204.214_amd64.deb"),
                sha256: "e205a3933a1f6551dc04e3975b46df119fe12a0ba4b5ea37bdcd30862ad69a98",
            },
        ],
        expect: Expect::Runs {
            on: &["miss-raises", "direct-io-tagging"],
        },
    },
    Kernel {
        name: "debian12-6.1",
        distribution: "Debian 12 (bookworm-security)",
        version: "6.1.192-3 cloud",
        packages: &[Package {
            url: debian_security!("linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb"),
            sha256: "4fdd0172a8c3f41a97e92465b2ac1867e1c10d82d7aeed3d26ee7a5d14df1754",
        }],
        expect: Expect::Runs {
            on: &["miss-raises", "direct-io-tagging"],
        },
    },
    Kernel {
        name: "ubuntu24.04-6.8",
        distribution: "Ubuntu 24.04 LTS (noble-updates)",
        version: "6.8.0-151.151 generic",
        packages: &[
            Package {
                url: ubuntu!("linux-signed/linux-image-6.8.0-151-generic_6.8.0-151.151_amd64.deb"),
                sha256: "0100b9df02a44fd4038bf4f0b98e3f8699bfb6c398d8eeac3c607af34f96a2f8",
            },
            Package {
                url: ubuntu!("linux/linux-modules-6.8.0-151-generic_6.8.0-151.151_amd64.deb"),
                sha256: "b1784b7a049c8b1841bcb464bb2b8d101a0c265bf2263059d815bef1f4aed91a",
            },
        ],
        expect: Expect::Runs {
            on: &["miss-raises", "uring-reports", "direct-io-tagging"],
        },
    },
    Kernel {
        name: "debian13-6.12",
        distribution: "Debian 13 (trixie)",
        version: "6.12.117-1 cloud",
        packages: &[Package {
            url: debian!("linux-image-6.12.117+deb13-cloud-amd64_6.12.117-1_amd64.deb"),
            sha256: "e9893e5295d0549b8852611f12a4b8b5f6cc4b8128dcc2086b9847793b904ab7",
        }],
        expect: Expect::Runs {
            on: &[
                "read-tracking",
                "miss-raises",
                "uring-reports",
                "direct-io-tagging",
            ],
        },
    },
];

/// Modules the test needs, loaded in the guest when the kernel has them as modules.
const MODULES: &[&str] = &["loop", "mq-deadline"];

/// The host programs copied into the initramfs, with the libraries they link.
const HOST_PROGRAMS: &[&str] = &["/usr/sbin/mke2fs", "/usr/sbin/bpftool"];

/// The binaries of this build that run in the guest.
const BUILD_BINARIES: &[&str] = &["abissd", "abissctl", "abiss-test-reader"];

/// The guest's `/init`.
const INIT: &str = include_str!("kernels_init.sh");

/// How long one VM may run before it counts as hung.
const VM_TIMEOUT: Duration = Duration::from_secs(420);

/// `cargo xtask kernels` arguments.
#[derive(Debug, clap::Args)]
pub struct KernelsArgs {
    /// Only these kernels (repeatable): debian11-5.10, ubuntu22.04-5.15, debian12-6.1,
    /// ubuntu24.04-6.8, debian13-6.12. All by default.
    #[arg(long = "kernel", value_name = "NAME")]
    kernels: Vec<String>,
    /// Where the results go (kernels.md and kernels.json).
    #[arg(long, default_value = "bench/results")]
    out: PathBuf,
    /// Where the binaries are; `cargo build --workspace --bins` runs first unless this is given.
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Seconds the paced reader reads the attached file.
    #[arg(long, default_value_t = 8)]
    read_secs: u64,
    /// qemu accelerator: tcg, or kvm where /dev/kvm is a hardware KVM (see the module doc).
    #[arg(long, default_value = "tcg")]
    accel: String,
    /// abissd's `RUST_LOG` in the guest, e.g. `info,abiss_daemon::controller=debug` to see
    /// what each read did to its stream (a failed kernel's report carries abissd's log).
    #[arg(long, default_value = "info", value_parser = log_filter)]
    daemon_log: String,
}

/// A `RUST_LOG` filter that passes whole through the kernel command line: no spaces or quotes.
fn log_filter(text: &str) -> Result<String, String> {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ',' | '=' | '_' | ':'))
    {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "'{text}' is not a log filter: letters, digits and , = _ : only (e.g. info,abiss_daemon=debug)"
        ))
    }
}

/// One check's outcome.
struct Check {
    name: String,
    pass: bool,
    detail: String,
}

/// What one VM run showed.
struct Outcome {
    kernel: &'static Kernel,
    uname: String,
    boot_secs: f64,
    wall_secs: f64,
    capability_line: String,
    capabilities: Value,
    checks: Vec<Check>,
    log: String,
}

/// Runs the kernels, writes the results, and fails if any check failed.
pub fn run(root: &Path, args: &KernelsArgs) -> anyhow::Result<()> {
    let chosen: Vec<&'static Kernel> = if args.kernels.is_empty() {
        KERNELS.iter().collect()
    } else {
        args.kernels
            .iter()
            .map(|name| {
                KERNELS.iter().find(|k| k.name == name).with_context(|| {
                    let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
                    format!(
                        "no kernel named {name}: the kernels are {}",
                        names.join(", ")
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    let bin_dir = if let Some(dir) = &args.bin_dir {
        dir.clone()
    } else {
        shell::cargo(root, &["build", "--workspace", "--bins"])?;
        root.join("target/debug")
    };
    let cache = root.join("target/kernels");
    let common = common_initramfs(&cache, &bin_dir)?;
    let mut outcomes = Vec::new();
    for kernel in chosen {
        let boot = prepare(&cache, kernel, &common)?;
        eprintln!(
            "xtask kernels: booting {} ({})",
            kernel.name, kernel.version
        );
        let outcome = boot_and_judge(kernel, &boot, args)?;
        print_outcome(&outcome);
        outcomes.push(outcome);
    }
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    write_results(root, &out, args, &outcomes)?;
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.checks.iter().any(|c| !c.pass))
        .map(|o| o.kernel.name)
        .collect();
    if !failed.is_empty() {
        bail!(
            "checks failed on {} (see {})",
            failed.join(", "),
            out.join("kernels.md").display()
        );
    }
    Ok(())
}

/// The file name a URL ends in.
fn file_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// Downloads `package` into `debs` unless it is there with the right hash.
fn fetch(debs: &Path, package: &Package) -> anyhow::Result<PathBuf> {
    let path = debs.join(file_name(package.url));
    if path.exists() && sha256(&path)? == package.sha256 {
        return Ok(path);
    }
    std::fs::create_dir_all(debs)?;
    let partial = path.with_extension("partial");
    eprintln!("xtask kernels: downloading {}", package.url);
    shell::run(Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&partial).arg(package.url))
        .with_context(|| format!("cannot download {}: if the mirror no longer has this version, pin a newer one in xtask/src/kernels.rs", package.url))?;
    let got = sha256(&partial)?;
    if got != package.sha256 {
        bail!(
            "{} has SHA-256 {got}, not the pinned {}",
            package.url,
            package.sha256
        );
    }
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = shell::output(Command::new("sha256sum").arg(path))?;
    Ok(out.split_whitespace().next().unwrap_or_default().to_owned())
}

/// What a kernel boots with.
struct Boot {
    vmlinuz: PathBuf,
    initramfs: PathBuf,
}

/// Downloads and unpacks the kernel's packages (once) and makes its initramfs: the common
/// archive followed by one with its modules (the kernel reads concatenated archives).
fn prepare(cache: &Path, kernel: &Kernel, common: &Path) -> anyhow::Result<Boot> {
    let tree = cache.join("unpacked").join(kernel.name);
    let stamp = tree.join(".unpacked");
    if !stamp.exists() {
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree)?;
        for package in kernel.packages {
            let deb = fetch(&cache.join("debs"), package)?;
            shell::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
        }
        std::fs::write(&stamp, "")?;
    }
    let vmlinuz = find_in(&tree.join("boot"), |name| name.starts_with("vmlinuz-"))?
        .with_context(|| format!("{}'s package has no boot/vmlinuz-*", kernel.name))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_owned();
    let modules_dir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|d| tree.join(d).join(&release))
        .find(|d| d.exists())
        .with_context(|| format!("{}'s packages have no modules for {release}", kernel.name))?;
    let staging = cache.join("staging").join(kernel.name);
    let _ = std::fs::remove_dir_all(&staging);
    let target = staging.join("lib/modules");
    std::fs::create_dir_all(&target)?;
    let order = module_load_order(&modules_dir, MODULES)?;
    for relative in &order {
        let source = modules_dir.join(relative);
        let name = uncompressed_name(relative);
        let dest = target.join(&name);
        decompress(&source, &dest)?;
    }
    let names: Vec<String> = order.iter().map(|r| uncompressed_name(r)).collect();
    std::fs::write(target.join("load-order"), names.join("\n") + "\n")?;
    let modules_cpio = cache.join(format!("{}-modules.cpio", kernel.name));
    cpio(&staging, &modules_cpio)?;
    let initramfs = cache.join(format!("{}-initramfs.cpio", kernel.name));
    let mut bytes = std::fs::read(common)?;
    bytes.extend(std::fs::read(&modules_cpio)?);
    std::fs::write(&initramfs, bytes)?;
    Ok(Boot { vmlinuz, initramfs })
}

fn find_in(dir: &Path, wanted: impl Fn(&str) -> bool) -> anyhow::Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        if entry.file_name().to_str().is_some_and(&wanted) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// `kernel/drivers/block/loop.ko.xz` → `loop.ko`.
fn uncompressed_name(relative: &str) -> String {
    let base = relative.rsplit('/').next().unwrap_or(relative);
    let base = base
        .strip_suffix(".xz")
        .or_else(|| base.strip_suffix(".zst"))
        .unwrap_or(base);
    base.to_owned()
}

/// The module files (relative to `modules_dir`) to load for `wanted`, dependencies first;
/// modules built into the kernel need nothing. Packages ship no `modules.dep` (their install
/// script makes it), so dependencies come from each module's own `depends` field.
fn module_load_order(modules_dir: &Path, wanted: &[&str]) -> anyhow::Result<Vec<String>> {
    // Module names treat - and _ alike.
    let module_name = |path: &str| {
        uncompressed_name(path)
            .trim_end_matches(".ko")
            .replace('-', "_")
    };
    let builtin = std::fs::read_to_string(modules_dir.join("modules.builtin"))
        .context("the kernel's modules.builtin is missing")?;
    let listing = shell::output(
        Command::new("find")
            .arg("kernel")
            .args([
                "-name", "*.ko", "-o", "-name", "*.ko.xz", "-o", "-name", "*.ko.zst",
            ])
            .current_dir(modules_dir),
    )?;
    let files: Vec<&str> = listing.lines().collect();
    let mut order: Vec<String> = Vec::new();
    let mut pending: Vec<(String, bool)> =
        wanted.iter().map(|w| ((*w).to_owned(), false)).collect();
    // Depth-first: a module goes in after everything it depends on.
    while let Some((name, expanded)) = pending.pop() {
        let name = name.replace('-', "_");
        if builtin.lines().any(|line| module_name(line) == name) {
            continue;
        }
        let path = files
            .iter()
            .find(|f| module_name(f) == name)
            .with_context(|| format!("the kernel has {name} neither built in nor as a module"))?;
        if order.iter().any(|p| p == path) {
            continue;
        }
        if expanded {
            order.push((*path).to_owned());
            continue;
        }
        pending.push((name, true));
        let depends = shell::output(
            Command::new("modinfo")
                .args(["-F", "depends"])
                .arg(modules_dir.join(path)),
        )
        .context("modinfo reads the modules' dependencies: `cargo xtask setup` installs kmod")?;
        for need in depends.trim().split(',').filter(|n| !n.is_empty()) {
            pending.push((need.to_owned(), false));
        }
    }
    Ok(order)
}

/// Copies a module, decompressing `.xz` and `.zst` (busybox's insmod takes plain ELF).
fn decompress(source: &Path, dest: &Path) -> anyhow::Result<()> {
    let text = source.to_string_lossy();
    let tool = if text.ends_with(".xz") {
        Some("xz")
    } else if text.ends_with(".zst") {
        Some("zstd")
    } else {
        None
    };
    match tool {
        None => {
            std::fs::copy(source, dest)?;
        }
        Some(tool) => {
            let file = std::fs::File::create(dest)?;
            let status = Command::new(tool)
                .args(["-dc"])
                .arg(source)
                .stdout(file)
                .status()?;
            if !status.success() {
                bail!("{tool} could not decompress {}", source.display());
            }
        }
    }
    Ok(())
}

/// The part of the initramfs every kernel shares: busybox, the init script, this build's
/// binaries and the host programs with their libraries.
fn common_initramfs(cache: &Path, bin_dir: &Path) -> anyhow::Result<PathBuf> {
    let staging = cache.join("staging").join("common");
    let _ = std::fs::remove_dir_all(&staging);
    for dir in [
        "bin", "dev", "proc", "sys", "tmp", "run", "mnt", "etc", "usr/bin", "usr/sbin",
    ] {
        std::fs::create_dir_all(staging.join(dir))?;
    }
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox is missing: `cargo xtask setup` installs busybox-static");
    }
    std::fs::copy(busybox, staging.join("bin/busybox"))?;
    std::fs::write(staging.join("init"), INIT)?;
    set_executable(&staging.join("init"))?;
    let _ = std::fs::copy("/etc/mke2fs.conf", staging.join("etc/mke2fs.conf"));
    let mut libraries = BTreeSet::new();
    for name in BUILD_BINARIES {
        let source = bin_dir.join(name);
        if !source.exists() {
            bail!(
                "{} is missing: build with `cargo build --workspace --bins` first",
                source.display()
            );
        }
        shell::run(
            Command::new("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(staging.join("usr/bin").join(name))
                .arg(&source),
        )?;
        libraries.extend(linked_libraries(&source)?);
    }
    for program in HOST_PROGRAMS {
        let dest = staging.join(program.trim_start_matches('/'));
        std::fs::copy(program, &dest)
            .with_context(|| format!("cannot copy {program} (is it installed?)"))?;
        libraries.extend(linked_libraries(Path::new(program))?);
    }
    for library in libraries {
        let dest = staging.join(library.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap_or(&staging))?;
        // fs::copy follows symbolic links: the initramfs gets the file itself.
        std::fs::copy(&library, &dest).with_context(|| format!("cannot copy {library}"))?;
    }
    let archive = cache.join("common.cpio");
    cpio(&staging, &archive)?;
    Ok(archive)
}

fn set_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The shared libraries `program` loads (and the dynamic loader), by the paths `ldd` gives.
fn linked_libraries(program: &Path) -> anyhow::Result<Vec<String>> {
    let out = shell::output(Command::new("ldd").arg(program))?;
    Ok(out
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            match line.split_once("=>") {
                Some((_, target)) => target.split_whitespace().next(),
                None => line.split_whitespace().next(),
            }
        })
        .filter(|path| path.starts_with('/'))
        .map(str::to_owned)
        .collect())
}

/// A newc archive of `dir`.
fn cpio(dir: &Path, archive: &Path) -> anyhow::Result<()> {
    let file = std::fs::File::create(archive)?;
    let status = Command::new("sh")
        .args(["-c", "find . -mindepth 1 -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet --reproducible"])
        .current_dir(dir)
        .stdout(file)
        .status()
        .context("cannot run cpio (`cargo xtask setup` installs it)")?;
    if !status.success() {
        bail!("cpio failed on {}", dir.display());
    }
    Ok(())
}

/// What the guest said: `@@ KEY VALUE` lines and `@@begin NAME` … `@@end NAME` blocks.
#[derive(Default)]
struct Serial {
    says: Vec<(String, String)>,
    blocks: Vec<(String, String)>,
}

impl Serial {
    fn parse(lines: &[String]) -> Self {
        let mut serial = Self::default();
        let mut open: Option<(String, Vec<&str>)> = None;
        for line in lines {
            if let Some((name, body)) = &mut open {
                if line.trim() == format!("@@end {name}") {
                    serial
                        .blocks
                        .push((name.clone(), body.join("\n").trim().to_owned()));
                    open = None;
                } else {
                    body.push(line);
                }
            } else if let Some(name) = line.strip_prefix("@@begin ") {
                open = Some((name.trim().to_owned(), Vec::new()));
            } else if let Some(rest) = line.strip_prefix("@@ ") {
                let (key, value) = rest.split_once(' ').unwrap_or((rest, ""));
                serial.says.push((key.to_owned(), value.trim().to_owned()));
            }
        }
        serial
    }

    fn say(&self, key: &str) -> Option<&str> {
        self.says
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn block(&self, name: &str) -> &str {
        self.blocks
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or("", |(_, b)| b.as_str())
    }

    /// The first word of a `@@` line as a number.
    fn number(&self, key: &str) -> Option<i64> {
        self.say(key)?.split_whitespace().next()?.parse().ok()
    }
}

/// Boots `kernel` and judges what its `/init` reports.
/// The console of one VM run.
struct Console {
    lines: Vec<String>,
    /// From starting qemu to the `/init` script's first line.
    booted_after: Option<Duration>,
    status: std::process::ExitStatus,
    wall_secs: f64,
}

/// Boots `kernel` and judges what its `/init` reports.
fn boot_and_judge(
    kernel: &'static Kernel,
    boot: &Boot,
    args: &KernelsArgs,
) -> anyhow::Result<Outcome> {
    let Console {
        lines,
        booted_after: booted_at,
        status,
        wall_secs,
    } = run_vm(boot, args)?;
    let serial = Serial::parse(&lines);
    let mut checks = Vec::new();
    let booted = booted_at.is_some();
    checks.push(Check {
        name: "boots to /init".into(),
        pass: booted,
        detail: if booted {
            format!("qemu {status}")
        } else {
            format!(
                "no `@@ booted` on the console; qemu {status}; last lines: {}",
                tail(&lines, 8)
            )
        },
    });
    Ok(judge(
        kernel,
        &serial,
        booted,
        args.read_secs,
        checks,
        booted_at,
        wall_secs,
    ))
}

/// Runs qemu until the guest powers off (or `VM_TIMEOUT` passes) and collects its console.
fn run_vm(boot: &Boot, args: &KernelsArgs) -> anyhow::Result<Console> {
    let mut command = Command::new("qemu-system-x86_64");
    if args.accel == "kvm" {
        command.args(["-enable-kvm", "-cpu", "host"]);
    } else {
        command.args(["-accel", "tcg,thread=multi", "-cpu", "max"]);
    }
    command
        .args([
            "-m",
            "2G",
            "-smp",
            "2",
            "-nographic",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-net", "none", "-no-reboot", "-kernel"])
        .arg(&boot.vmlinuz)
        .arg("-initrd")
        .arg(&boot.initramfs)
        .arg("-append")
        .arg(format!(
            "console=ttyS0 panic=-1 quiet loglevel=3 abiss_read_secs={} abiss_log={}",
            args.read_secs, args.daemon_log
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().context(
        "cannot start qemu-system-x86_64 (`cargo xtask setup` installs qemu-system-x86)",
    )?;
    let stdout = child.stdout.take().context("qemu's output")?;
    let pid = libc::pid_t::try_from(child.id()).context("qemu's process id")?;
    // Kills this qemu if it runs past VM_TIMEOUT; told when it has been waited for, so that it
    // never signals a process id the system has handed to someone else since.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(VM_TIMEOUT).is_err() {
            // SAFETY: kill(2) on the qemu we started, which has not been waited for yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut lines = Vec::new();
    let mut booted_at = None;
    for line in BufReader::new(stdout).lines() {
        let mut line = line.unwrap_or_default().replace('\r', "");
        // The firmware's terminal escapes can precede the first line on the same row.
        if let Some(at) = line.find("@@").filter(|&at| at > 0) {
            line.drain(..at);
        }
        if booted_at.is_none() && line.starts_with("@@ booted") {
            booted_at = Some(started.elapsed());
        }
        lines.push(line);
    }
    let status = child.wait()?;
    let _ = done.send(());
    let _ = watchdog.join();
    Ok(Console {
        lines,
        booted_after: booted_at,
        status,
        wall_secs: started.elapsed().as_secs_f64(),
    })
}

/// The checks of what the guest reported, and the outcome.
fn judge(
    kernel: &'static Kernel,
    serial: &Serial,
    booted: bool,
    read_secs: u64,
    mut checks: Vec<Check>,
    booted_at: Option<Duration>,
    wall_secs: f64,
) -> Outcome {
    let uname = serial
        .say("booted")
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_owned();
    let capability_line = serial
        .block("abissd-log")
        .lines()
        .find_map(|l| {
            l.split_once(" listening on ")
                .map(|(_, rest)| rest.split_once("; ").map_or(rest, |(_, parts)| parts))
        })
        .unwrap_or("")
        .trim()
        .to_owned();
    let status_json: Value =
        serde_json::from_str(serial.block("status-json")).unwrap_or(Value::Null);
    let capabilities = status_json
        .get("capabilities")
        .cloned()
        .unwrap_or(Value::Null);
    if booted {
        for (key, _) in serial
            .says
            .iter()
            .filter(|(k, _)| k == "setup-failed" || k == "module-failed")
        {
            checks.push(Check {
                name: key.clone(),
                pass: false,
                detail: serial.say(key).unwrap_or_default().to_owned(),
            });
        }
        match kernel.expect {
            Expect::Runs { on } => {
                judge_run(serial, on, &capabilities, read_secs, &mut checks);
            }
            Expect::Refuses { exit_code } => judge_refusal(serial, exit_code, &mut checks),
        }
    }
    let log = [
        "abissd-log",
        "plain-stderr",
        "attach-stderr",
        "reader-stderr",
        "dmesg",
    ]
    .iter()
    .map(|name| (name, serial.block(name)))
    .filter(|(_, body)| !body.is_empty())
    .map(|(name, body)| format!("--- {name}\n{body}"))
    .collect::<Vec<_>>()
    .join("\n");
    Outcome {
        kernel,
        uname,
        boot_secs: booted_at.map_or(f64::NAN, |d| d.as_secs_f64()),
        wall_secs,
        capability_line,
        capabilities,
        checks,
        log,
    }
}

fn tail(lines: &[String], count: usize) -> String {
    lines[lines.len().saturating_sub(count)..].join(" | ")
}

fn check(checks: &mut Vec<Check>, name: &str, pass: bool, detail: impl Into<String>) {
    checks.push(Check {
        name: name.to_owned(),
        pass,
        detail: detail.into(),
    });
}

/// A kernel abissd must run on: it answers, reports the documented parts, keeps a stream's
/// guarantee and leaves nothing behind.
fn judge_run(
    serial: &Serial,
    expected_on: &[&str],
    capabilities: &Value,
    read_secs: u64,
    checks: &mut Vec<Check>,
) {
    let answered = serial.say("answered-after").is_some();
    let exit = serial.number("abissd-exit");
    check(
        checks,
        "abissd starts and answers `abissctl status`",
        answered,
        match (answered, exit) {
            (true, _) => format!(
                "answered (guest uptime at start, at answer: {})",
                serial.say("answered-after").unwrap_or_default()
            ),
            (false, code) => format!(
                "abissd exited with {code:?}: {}",
                first_lines(serial.block("plain-stderr"), 3)
            ),
        },
    );
    if !answered {
        return;
    }
    let on: BTreeSet<&str> = capabilities
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c.get("on").and_then(Value::as_bool) == Some(true))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let expected: BTreeSet<&str> = expected_on.iter().copied().collect();
    let stand_ins: Vec<&str> = capabilities
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c.get("stand_in").is_some_and(|v| !v.is_null()))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    check(
        checks,
        "optional parts on as documented",
        on == expected,
        format!("on: {on:?} (through a stand-in: {stand_ins:?}); documented: {expected:?}"),
    );
    let attach = serial.number("attach");
    check(
        checks,
        "`abissctl attach --rate 1MB/s` succeeds",
        attach == Some(0),
        format!(
            "exit {attach:?}: {}",
            first_lines(serial.block("attach-stderr"), 2)
        ),
    );
    stream_checks(serial, read_secs, on.contains("read-tracking"), checks);
    let detach = serial.number("detach");
    check(
        checks,
        "`abissctl detach` succeeds",
        detach == Some(0),
        format!("exit {detach:?}"),
    );
    check(
        checks,
        "abissd exits 0 on SIGTERM",
        exit == Some(0),
        format!("exit {exit:?}"),
    );
    leaves_nothing(serial, checks);
}

/// The attached stream: the paced reader kept its schedule and missed no deadline. Where
/// abissd follows readers (read-tracking) it must also have seen no page-cache miss; without
/// it the paced reader, which sends no position messages, outruns the window as documented
/// (docs/kernels.md), and its misses are reported, not judged.
fn stream_checks(serial: &Serial, read_secs: u64, follows_readers: bool, checks: &mut Vec<Check>) {
    let reader: Value = serde_json::from_str(serial.block("reader").lines().next().unwrap_or(""))
        .unwrap_or(Value::Null);
    let reads = reader.get("reads").and_then(Value::as_u64).unwrap_or(0);
    let misses = reader.get("misses").and_then(Value::as_u64);
    let scheduled = read_secs * 1_000_000 / 65_536;
    check(
        checks,
        "paced reader: schedule kept, 0 deadline misses",
        misses == Some(0) && reads * 100 >= scheduled * 95,
        format!(
            "{reads} reads of {scheduled} scheduled, misses {misses:?}, max {} µs",
            reader.get("max_ns").and_then(Value::as_u64).unwrap_or(0) / 1000
        ),
    );
    let list: Value = serde_json::from_str(serial.block("list-json")).unwrap_or(Value::Null);
    let streams: Vec<&Value> = list
        .as_array()
        .or_else(|| list.get("streams").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .collect();
    let daemon_misses: Vec<u64> = streams
        .iter()
        .filter_map(|s| s.get("misses").and_then(Value::as_u64))
        .collect();
    if follows_readers {
        check(
            checks,
            "abissd counted 0 page-cache misses",
            !daemon_misses.is_empty() && daemon_misses.iter().all(|&m| m == 0),
            format!("misses per stream: {daemon_misses:?}"),
        );
    } else {
        check(
            checks,
            "abissd saw the stream (page-cache misses reported, not judged: no read-tracking)",
            !daemon_misses.is_empty(),
            format!("misses per stream: {daemon_misses:?}"),
        );
    }
}

/// A kernel below the floor: one sentence, the documented exit code, nothing left behind.
fn judge_refusal(serial: &Serial, exit_code: i64, checks: &mut Vec<Check>) {
    let answered = serial.say("answered-after").is_some();
    let exit = serial.number("plain-exit");
    check(
        checks,
        &format!("abissd refuses to start with exit {exit_code}"),
        !answered && exit == Some(exit_code),
        format!("answered: {answered}; exit {exit:?}"),
    );
    let stderr = serial.block("plain-stderr");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    check(
        checks,
        "one plain sentence on stderr",
        lines.len() == 1 && !stderr.contains("panicked"),
        format!("{lines:?}"),
    );
    leaves_nothing(serial, checks);
}

fn leaves_nothing(serial: &Serial, checks: &mut Vec<Check>) {
    let (before, after) = (serial.number("bpf-before"), serial.number("bpf-after"));
    check(
        checks,
        "no BPF programs left loaded",
        before.is_some() && before == after,
        format!("programs before abissd {before:?}, after {after:?}"),
    );
    let leftovers = serial.say("leftovers").unwrap_or("?");
    check(
        checks,
        "no socket or BPF pins left",
        leftovers.is_empty(),
        format!("left: {leftovers:?}"),
    );
}

fn first_lines(text: &str, count: usize) -> String {
    text.lines().take(count).collect::<Vec<_>>().join(" / ")
}

fn print_outcome(outcome: &Outcome) {
    let passed = outcome.checks.iter().filter(|c| c.pass).count();
    eprintln!(
        "xtask kernels: {} ({}): booted to /init in {:.1} s, VM {:.1} s; {passed}/{} checks pass",
        outcome.kernel.name,
        outcome.uname,
        outcome.boot_secs,
        outcome.wall_secs,
        outcome.checks.len()
    );
    if !outcome.capability_line.is_empty() {
        eprintln!("  abissd: {}", outcome.capability_line);
    }
    for c in &outcome.checks {
        eprintln!(
            "  [{}] {}: {}",
            if c.pass { "pass" } else { "FAIL" },
            c.name,
            c.detail
        );
    }
    if outcome.checks.iter().any(|c| !c.pass) {
        eprintln!("{}", outcome.log);
    }
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// The machine, the build and the settings a run was made with.
fn conditions(root: &Path, args: &KernelsArgs) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let commit = command_line(
        "git",
        &[
            "-C",
            &root.to_string_lossy(),
            "describe",
            "--always",
            "--dirty",
        ],
    );
    let date = command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let host = command_line("uname", &["-r"]);
    let qemu = command_line("qemu-system-x86_64", &["--version"])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    format!(
        "{date}; abiss {commit}, binaries from {}; host Linux {host}, {cpu}, {} CPUs; {qemu}, accelerator {}, guest 2 CPUs and 2 GiB; paced reader {} s at 1 MB/s in 64 KiB reads",
        args.bin_dir.as_deref().map_or_else(|| root.join("target/debug"), Path::to_path_buf).display(),
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        args.accel,
        args.read_secs
    )
}

/// kernels.md: the table, then each kernel's checks (and its logs where one failed).
fn markdown(conditions: &str, outcomes: &[Outcome]) -> String {
    let mut md = String::from("# abissd on distribution kernels\n\n");
    md.push_str("Made by `cargo xtask kernels` (xtask/src/kernels.rs): each kernel is booted from its distribution's package in qemu, with an initramfs holding this build's abissd, abissctl and abiss-test-reader; abissd manages an ext4 loop device, a 24 MB file is attached at 1 MB/s and read by the paced reader, then detached, and abissd is stopped.\n\n");
    let _ = write!(md, "Conditions: {conditions}.\n\n");
    md.push_str("| kernel | package | `uname -r` | boot to /init | abissd's parts | checks | result |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for o in outcomes {
        let passed = o.checks.iter().filter(|c| c.pass).count();
        let parts = if o.capability_line.is_empty() {
            match o.kernel.expect {
                Expect::Refuses { .. } => "refused".to_owned(),
                Expect::Runs { .. } => "did not start".to_owned(),
            }
        } else {
            o.capability_line.clone()
        };
        let _ = writeln!(
            md,
            "| {} | {} {} | {} | {:.1} s | {} | {passed}/{} | {} |",
            o.kernel.name,
            o.kernel.distribution,
            o.kernel.version,
            o.uname,
            o.boot_secs,
            parts,
            o.checks.len(),
            if passed == o.checks.len() {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    for o in outcomes {
        let _ = write!(md, "\n## {} ({})\n\n", o.kernel.name, o.uname);
        for c in &o.checks {
            let _ = writeln!(
                md,
                "- {} {}: {}",
                if c.pass { "pass" } else { "**FAIL**" },
                c.name,
                c.detail.replace('|', "\\|")
            );
        }
        if o.checks.iter().any(|c| !c.pass) && !o.log.is_empty() {
            let _ = write!(md, "\n```\n{}\n```\n", o.log);
        }
    }
    md
}

/// kernels.md and kernels.json under `out`.
fn write_results(
    root: &Path,
    out: &Path,
    args: &KernelsArgs,
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    let conditions = conditions(root, args);
    std::fs::write(out.join("kernels.md"), markdown(&conditions, outcomes))?;
    let json = json!({
        "conditions": conditions,
        "kernels": outcomes.iter().map(|o| json!({
            "name": o.kernel.name,
            "distribution": o.kernel.distribution,
            "package_version": o.kernel.version,
            "packages": o.kernel.packages.iter().map(|p| json!({"url": p.url, "sha256": p.sha256})).collect::<Vec<_>>(),
            "uname": o.uname,
            "boot_to_init_secs": o.boot_secs,
            "vm_secs": o.wall_secs,
            "capability_line": o.capability_line,
            "capabilities": o.capabilities,
            "checks": o.checks.iter().map(|c| json!({"name": c.name, "pass": c.pass, "detail": c.detail})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("kernels.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    eprintln!(
        "xtask kernels: results in {}",
        out.join("kernels.md").display()
    );
    Ok(())
}
