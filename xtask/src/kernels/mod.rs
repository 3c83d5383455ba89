//! `cargo xtask kernels`: abissd and abissctl from this build, run on the distribution kernels
//! users have, each booted in qemu from its own package.
//!
//! Each kernel's packages are downloaded once into `target/kernels/debs` (pinned URL and
//! SHA-256), unpacked with `dpkg-deb -x`, and booted with an initramfs that holds busybox, the
//! host's abissd, abissctl and abiss-test-reader (debug info stripped), mke2fs and bpftool with
//! the host libraries they link, and the kernel's own modules that the test needs and the
//! kernel has as modules (`loop`, `mq-deadline`). Its `/init` (`init.sh`) makes an ext4
//! loop device, starts abissd on it, attaches a file, reads it with the paced reader, detaches,
//! stops abissd and counts the BPF programs left; on a kernel below abissd's floor it checks
//! the refusal instead. It reports on the serial console, which this module reads and judges.
//!
//! The VM runs under TCG by default: this lab's `/dev/kvm` is PVM (`kvm_pvm`), which boots only
//! guest kernels built for PVM; a stock kernel crawls and then stops with a KVM emulation
//! failure. `--accel kvm` uses KVM where it is a hardware one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::shell;

mod archive;
mod image;
mod judge;
mod report;
mod stacks;
mod under_load;
mod vm;

use archive::{Fetched, Series};
use image::{common_initramfs, prepare};
use judge::boot_and_judge;
use report::{print_outcome, write_results};

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
    /// Where the series is in the archive's index, for when the pins are gone.
    series: Series,
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
/// the run takes the newest of the same series from the archive's index (with the index's
/// hash) and says so in its results; then pin that one here.
const KERNELS: &[Kernel] = &[
    Kernel {
        name: "debian11-5.10",
        distribution: "Debian 11 (bullseye)",
        version: "5.10.262-1 cloud",
        packages: &[Package {
            url: debian_security!("linux-image-5.10.0-46-cloud-amd64_5.10.262-1_amd64.deb"),
            sha256: "18d94781d1b3052e21967ac2262239e5f14fbf511d6c3e110629d7aa35340760",
        }],
        series: Series {
            archive: "http://deb.debian.org/debian-security",
            suite: "bullseye-security",
            image_prefix: "linux-image-5.10.0-",
            image_suffix: "-cloud-amd64",
            separate_modules: false,
        },
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
        series: Series {
            archive: "http://archive.ubuntu.com/ubuntu",
            suite: "jammy-updates",
            image_prefix: "linux-image-5.15.0-",
            image_suffix: "-generic",
            separate_modules: true,
        },
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
        series: Series {
            archive: "http://deb.debian.org/debian-security",
            suite: "bookworm-security",
            image_prefix: "linux-image-6.1.0-",
            image_suffix: "-cloud-amd64",
            separate_modules: false,
        },
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
        series: Series {
            archive: "http://archive.ubuntu.com/ubuntu",
            suite: "noble-updates",
            image_prefix: "linux-image-6.8.0-",
            image_suffix: "-generic",
            separate_modules: true,
        },
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
        series: Series {
            archive: "http://deb.debian.org/debian",
            suite: "trixie",
            image_prefix: "linux-image-6.12.",
            image_suffix: "+deb13-cloud-amd64",
            separate_modules: false,
        },
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

/// Modules the test needs, loaded in the guest when the kernel has them as modules: the
/// loop device and its elevator; device mapper, dm-crypt and the cipher modes its
/// `aes-xts-plain64` table asks the crypto API for (xts over ecb, which the kernel would
/// otherwise ask modprobe for); md and its raid1; md's raid4/5/6 and dm-raid (LVM's raid),
/// for the stacks that must be refused; virtio's disks (`--stacks-under-load`).
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "loop",
    "mq-deadline",
    "dm-mod",
    "dm-crypt",
    "xts",
    "ecb",
    "md-mod",
    "raid1",
    "raid456",
    "dm-raid",
];

/// The host programs copied into the initramfs, with the libraries they link: dmsetup and
/// mdadm build the storage stacks (LVM's and cryptsetup's tools would make the same tables).
const HOST_PROGRAMS: &[&str] = &[
    "/usr/sbin/mke2fs",
    "/usr/sbin/bpftool",
    "/usr/sbin/dmsetup",
    "/usr/sbin/mdadm",
];

/// The binaries of this build that run in the guest.
const BUILD_BINARIES: &[&str] = &["abissd", "abissctl", "abiss-test-reader"];

/// The guest's `/init`.
const INIT: &str = include_str!("init.sh");

/// What `/init` runs instead for `--stacks-under-load`.
const LOAD: &str = include_str!("load.sh");

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
    /// Boot each series' newest kernel in its archive's index instead of the pinned one.
    #[arg(long)]
    newest: bool,
    /// How many guests run at once. Each guest has two vCPUs; under TCG two guests share the
    /// machine's CPUs, which slows both and the figures they report.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    jobs: u8,
    /// Instead of the checks: the storage stacks (LUKS, LVM on LUKS, md raid1, striped LVM) on
    /// two virtual disks qemu throttles to an hdd's pace, a paced reader under a copy loop with
    /// stock mq-deadline and with abiss; results as stacks-under-load.{md,json}. Only Debian
    /// 13's 6.12 unless kernels are named.
    #[arg(long)]
    stacks_under_load: bool,
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

/// Adds a check to `checks`.
fn check(checks: &mut Vec<Check>, name: &str, pass: bool, detail: impl Into<String>) {
    checks.push(Check {
        name: name.to_owned(),
        pass,
        detail: detail.into(),
    });
}

/// The first `count` lines of `text`, on one line.
fn first_lines(text: &str, count: usize) -> String {
    text.lines().take(count).collect::<Vec<_>>().join(" / ")
}

/// What one VM run showed.
struct Outcome {
    kernel: &'static Kernel,
    /// The packages it booted from.
    packages: Vec<Fetched>,
    uname: String,
    boot_secs: f64,
    wall_secs: f64,
    capability_line: String,
    capabilities: Value,
    checks: Vec<Check>,
    log: String,
}

/// Downloads and unpacks every kernel's pinned packages into `target/kernels`, as the kernels
/// test will: `cargo xtask test` does it while it builds, so that on a fresh machine the
/// download (800 MB) waits for the network beside the compiler, not in the test's lane. Any
/// failure is left for the test itself to report.
pub fn prefetch(root: &Path) {
    let cache = root.join("target/kernels");
    for kernel in KERNELS {
        if let Err(error) = image::unpacked(&cache, kernel, false) {
            eprintln!(
                "xtask: {}'s packages not fetched ahead ({error:#}); the kernels test will try again",
                kernel.name
            );
            return;
        }
    }
}

/// Boots each prepared kernel, `args.jobs` at a time, and returns the outcomes in the order
/// given; each is printed as it ends.
fn boot_all(
    boots: &[(&'static Kernel, image::Boot)],
    args: &KernelsArgs,
) -> anyhow::Result<Vec<Outcome>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes: std::sync::Mutex<Vec<Option<anyhow::Result<Outcome>>>> =
        std::sync::Mutex::new(boots.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..args.jobs.min(u8::try_from(boots.len()).unwrap_or(u8::MAX)) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((kernel, boot)) = boots.get(index) else {
                    return;
                };
                eprintln!(
                    "xtask kernels: booting {} ({})",
                    kernel.name, kernel.version
                );
                let outcome = boot_and_judge(kernel, boot, args);
                if let Ok(outcome) = &outcome {
                    print_outcome(outcome);
                }
                outcomes.lock().expect("not poisoned")[index] = Some(outcome);
            });
        }
    });
    outcomes
        .into_inner()
        .expect("not poisoned")
        .into_iter()
        .map(|outcome| outcome.context("a guest was not booted")?)
        .collect()
}

/// Runs the kernels, writes the results, and fails if any check failed.
pub fn run(root: &Path, args: &KernelsArgs) -> anyhow::Result<()> {
    let chosen: Vec<&'static Kernel> = if args.kernels.is_empty() && args.stacks_under_load {
        KERNELS
            .iter()
            .filter(|k| k.name == "debian13-6.12")
            .collect()
    } else if args.kernels.is_empty() {
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
    let boots = chosen
        .into_iter()
        .map(|kernel| Ok((kernel, prepare(&cache, kernel, &common, args.newest)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out = if args.out.is_absolute() {
        args.out.clone()
    } else {
        root.join(&args.out)
    };
    if args.stacks_under_load {
        return under_load::run(root, &out, args, &boots);
    }
    let outcomes = boot_all(&boots, args)?;
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
