//! `cargo xtask install`: puts abiss on a machine as a system service.
//!
//! | what | where (prefix `PREFIX`, `/usr/local` by default) |
//! | --- | --- |
//! | `abissd` | `PREFIX/sbin` |
//! | `abissctl`, `abiss-lab` | `PREFIX/bin` |
//! | `libabiss.so.0` (SONAME), `libabiss.so`, `libabiss.a` | `PREFIX/lib` (`--libdir`) |
//! | `abiss.h` / `abiss.pc` | `PREFIX/include` / `PREFIX/lib/pkgconfig` |
//! | man pages, bash/zsh/fish completions | `PREFIX/share/...` |
//! | `abissd.service` | `PREFIX/lib/systemd/system` (`/lib/systemd/system` for `/usr`) |
//! | `abissd.toml` (only if there is none) | `PREFIX/etc/abiss` (`/etc/abiss` for `/usr`) |
//!
//! The configuration and the unit follow the prefix as Autotools, Meson and `CMake`'s
//! `GNUInstallDirs` do: an install into a home directory writes nothing outside it. systemd reads
//! units in `/usr/local/lib/systemd/system`, so the default prefix needs no `--unitdir`.
//!
//! Installing again replaces the files and keeps the configuration. `--destdir` stages
//! everything under another root (packaging); the installed files still name the final
//! paths.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::shell;

/// Where things go.
#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Installation prefix.
    #[arg(long, default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// System configuration directory; abissd's file is `SYSCONFDIR/abiss/abissd.toml`, and
    /// the unit names it with --config unless it is /etc. [default: PREFIX/etc, or /etc when
    /// PREFIX is /usr]
    #[arg(long)]
    pub sysconfdir: Option<PathBuf>,
    /// Where the systemd unit goes. [default: PREFIX/lib/systemd/system, or
    /// /lib/systemd/system when PREFIX is /usr]
    #[arg(long)]
    pub unitdir: Option<PathBuf>,
    /// Where the libraries and abiss.pc go (Debian's packages use /usr/lib/MULTIARCH).
    /// [default: PREFIX/lib]
    #[arg(long)]
    pub libdir: Option<PathBuf>,
    /// Stage under this root instead of installing (for packages).
    #[arg(long)]
    pub destdir: Option<PathBuf>,
    /// Install the binaries already built in this directory (e.g. target/debug) instead of
    /// building a release.
    #[arg(long)]
    pub from: Option<PathBuf>,
}

/// The library's version, the workspace's: `libabiss.so.MAJOR` is its SONAME (set in
/// abiss-c's build script from the same version).
const LIBRARY_VERSION: &str = env!("CARGO_PKG_VERSION");
const LIBRARY_MAJOR: &str = env!("CARGO_PKG_VERSION_MAJOR");

/// The configuration installed when there is none: every setting commented out, so the
/// service starts with abissd's defaults and manages no disk until one is named.
const DEFAULT_CONFIG: &str = "\
# abissd's configuration: its long options as TOML keys (see `man abissd`).
# Options given on abissd's command line override these. `systemctl reload abissd` reads
# this file again; admission settings and models take effect at once, the rest at restart.
#
# The disks abissd manages (NAME, /dev/NAME or MAJOR:MINOR):
# device = [\"sdb\"]
# elevator = \"mq-deadline\"
# dispatch_depth = 4
# Sustained capacity assumed for a disk until it has a measured model:
# capacity = \"20MB/s\"
# realtime_share = 80
# admission = \"statistical\"
# p_req = 0.01
# locked_memory = \"1GiB\"
# metrics = \"127.0.0.1:9565\"
";

impl InstallArgs {
    /// `--sysconfdir`, or where the prefix puts it.
    fn sysconfdir(&self) -> PathBuf {
        self.sysconfdir.clone().unwrap_or_else(|| {
            if self.prefix == Path::new("/usr") {
                PathBuf::from("/etc")
            } else {
                self.prefix.join("etc")
            }
        })
    }

    /// `--unitdir`, or where the prefix puts it.
    fn unitdir(&self) -> PathBuf {
        self.unitdir.clone().unwrap_or_else(|| {
            if self.prefix == Path::new("/usr") {
                PathBuf::from("/lib/systemd/system")
            } else {
                self.prefix.join("lib/systemd/system")
            }
        })
    }
}

pub fn run(root: &Path, args: &InstallArgs) -> anyhow::Result<()> {
    let built = if let Some(dir) = &args.from {
        dir.clone()
    } else {
        shell::cargo(root, &["build", "--workspace", "--release"])?;
        root.join("target/release")
    };
    let stage = |path: &Path| match &args.destdir {
        Some(dest) => dest.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_owned(),
    };
    let prefix = &args.prefix;
    let sbin = prefix.join("sbin");
    copy(&built.join("abissd"), &stage(&sbin).join("abissd"), 0o755)?;
    for bin in ["abissctl", "abiss-lab"] {
        copy(
            &built.join(bin),
            &stage(&prefix.join("bin")).join(bin),
            0o755,
        )?;
    }
    let libdir = args.libdir.clone().unwrap_or_else(|| prefix.join("lib"));
    install_library(root, &built, prefix, &libdir, &stage)?;
    let share = stage(&prefix.join("share"));
    crate::docs::generate(&share.join("man"), &share.join("completions-staging"))
        .context("cannot generate the man pages and completions")?;
    place_completions(&share)?;
    install_unit(root, args, &stage)?;
    let config = stage(&args.sysconfdir().join("abiss/abissd.toml"));
    if config.exists() {
        println!("kept {}", config.display());
    } else {
        write(&config, DEFAULT_CONFIG.as_bytes(), 0o644)?;
    }
    if args.destdir.is_none() {
        // The new library must be found by the dynamic linker, and a running systemd must see
        // the new unit. Neither is fatal: a machine without them still has the files.
        let _ = std::process::Command::new("ldconfig").status();
        if Path::new("/run/systemd/system").exists() {
            let _ = std::process::Command::new("systemctl")
                .arg("daemon-reload")
                .status();
        }
    }
    println!(
        "installed under {}; name the disks in {}, then `systemctl enable --now abissd`",
        stage(prefix).display(),
        args.sysconfdir().join("abiss/abissd.toml").display()
    );
    Ok(())
}

/// The shared library under its versioned name with the SONAME link and the development
/// link, the static library, the header and the pkg-config file.
fn install_library(
    root: &Path,
    built: &Path,
    prefix: &Path,
    libdir: &Path,
    stage: &dyn Fn(&Path) -> PathBuf,
) -> anyhow::Result<()> {
    let lib = stage(libdir);
    let real = format!("libabiss.so.{LIBRARY_VERSION}");
    copy(&built.join("libabiss.so"), &lib.join(&real), 0o755)?;
    symlink(&real, &lib.join(format!("libabiss.so.{LIBRARY_MAJOR}")))?;
    symlink(&real, &lib.join("libabiss.so"))?;
    copy(&built.join("libabiss.a"), &lib.join("libabiss.a"), 0o644)?;
    copy(
        &root.join("abiss-c/include/abiss.h"),
        &stage(&prefix.join("include")).join("abiss.h"),
        0o644,
    )?;
    let pc = format!(
        "prefix={prefix}\nlibdir={libdir}\nincludedir=${{prefix}}/include\n\n\
         Name: abiss\nDescription: ABISS guaranteed-rate file streams (client of abissd)\n\
         Version: {LIBRARY_VERSION}\nLibs: -L${{libdir}} -labiss\n\
         Libs.private: -lpthread -ldl -lm\nCflags: -I${{includedir}}\n",
        prefix = prefix.display(),
        libdir = libdir.display()
    );
    write(&lib.join("pkgconfig/abiss.pc"), pc.as_bytes(), 0o644)
}

/// Moves the generated completions where each shell looks for them (`cargo xtask man` names
/// them as each shell expects: `abissctl`, `_abissctl`, `abissctl.fish`).
fn place_completions(share: &Path) -> anyhow::Result<()> {
    let staging = share.join("completions-staging");
    let places = [
        ("bash", "bash-completion/completions"),
        ("zsh", "zsh/site-functions"),
        ("fish", "fish/vendor_completions.d"),
    ];
    for (shell, dir) in places {
        let Ok(entries) = std::fs::read_dir(staging.join(shell)) else {
            continue;
        };
        for entry in entries.flatten() {
            copy(
                &entry.path(),
                &share.join(dir).join(entry.file_name()),
                0o644,
            )?;
        }
    }
    std::fs::remove_dir_all(&staging).context("cannot remove the staging directory")
}

fn install_unit(
    root: &Path,
    args: &InstallArgs,
    stage: &dyn Fn(&Path) -> PathBuf,
) -> anyhow::Result<()> {
    let template = std::fs::read_to_string(root.join("deploy/systemd/abissd.service"))
        .context("cannot read deploy/systemd/abissd.service")?;
    let sysconfdir = args.sysconfdir();
    let config_args = if sysconfdir == Path::new("/etc") {
        String::new()
    } else {
        format!(
            " --config {}",
            sysconfdir.join("abiss/abissd.toml").display()
        )
    };
    let unit = template
        .replace("@SBINDIR@", &args.prefix.join("sbin").to_string_lossy())
        .replace("@CONFIG_ARGS@", &config_args);
    write(
        &stage(&args.unitdir()).join("abissd.service"),
        unit.as_bytes(),
        0o644,
    )
}

fn copy(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    let bytes = std::fs::read(from).with_context(|| {
        format!(
            "cannot read {}; build first (cargo xtask build --release)",
            from.display()
        )
    })?;
    write(to, &bytes, mode)
}

/// Writes through a temporary file and a rename, so a running program never sees half a file
/// (replacing a running abissd's binary in place would crash it).
fn write(to: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = to.parent().context("a path without a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let temporary = dir.join(format!(
        ".{}.new",
        to.file_name().unwrap_or_default().to_string_lossy()
    ));
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(mode)))
        .and_then(|()| std::fs::rename(&temporary, to))
        .with_context(|| format!("cannot write {}", to.display()))?;
    println!("installed {}", to.display());
    Ok(())
}

fn symlink(target: &str, link: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot replace {}", link.display())),
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} to {target}", link.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(prefix: &str) -> InstallArgs {
        InstallArgs {
            prefix: PathBuf::from(prefix),
            sysconfdir: None,
            unitdir: None,
            libdir: None,
            destdir: None,
            from: None,
        }
    }

    #[test]
    fn a_prefix_keeps_the_configuration_and_the_unit() {
        let home = args("/home/ann/abiss");
        assert_eq!(home.sysconfdir(), Path::new("/home/ann/abiss/etc"));
        assert_eq!(
            home.unitdir(),
            Path::new("/home/ann/abiss/lib/systemd/system")
        );
        let local = args("/usr/local");
        assert_eq!(local.sysconfdir(), Path::new("/usr/local/etc"));
        assert_eq!(local.unitdir(), Path::new("/usr/local/lib/systemd/system"));
    }

    #[test]
    fn the_prefix_usr_uses_the_system_directories() {
        for prefix in ["/usr", "/usr/"] {
            assert_eq!(args(prefix).sysconfdir(), Path::new("/etc"));
            assert_eq!(args(prefix).unitdir(), Path::new("/lib/systemd/system"));
        }
    }

    #[test]
    fn the_options_override_the_prefix() {
        let mut given = args("/opt/abiss");
        given.sysconfdir = Some(PathBuf::from("/etc"));
        given.unitdir = Some(PathBuf::from("/etc/systemd/system"));
        assert_eq!(given.sysconfdir(), Path::new("/etc"));
        assert_eq!(given.unitdir(), Path::new("/etc/systemd/system"));
    }
}
