//! `cargo xtask deb`: a Debian package of abiss, `target/deb/abiss_VERSION_ARCH.deb`.
//!
//! The tree is what `cargo xtask install --prefix /usr --destdir STAGE` stages (one layout for
//! both), made into a package as debhelper would: binaries and the library stripped, man pages
//! compressed, the copyright file and a changelog, `DEBIAN/` with the control file (its
//! `Depends` from `dpkg-shlibdeps`), the conffile `/etc/abiss/abissd.toml`, the `shlibs` file
//! and the `ldconfig` trigger of a package with a public library, md5sums, and the maintainer
//! scripts in `deploy/debian/` (`dh_installsystemd`'s: the unit is enabled and started on install,
//! stopped before removal, which puts the disks back; a purge removes what abissd made).
//! `dpkg-deb --build` builds it: cargo-deb would lay the files out a second time, from its own
//! list in Cargo.toml, and is one more pinned tool for setup to compile.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;

use crate::install::{self, InstallArgs};
use crate::shell;

/// What to package.
#[derive(Debug, clap::Args)]
pub struct DebArgs {
    /// Package the binaries already built in this directory (e.g. target/debug) instead of
    /// building a release.
    #[arg(long)]
    from: Option<PathBuf>,
    /// Where the package goes.
    #[arg(long, default_value = "target/deb")]
    out: PathBuf,
    /// The Debian revision, after the workspace's version.
    #[arg(long, default_value = "1")]
    revision: String,
    /// Then check it with lintian (about a minute and a half), failing on any error or
    /// warning it does not find explained in deploy/debian/lintian-overrides.
    #[arg(long)]
    lintian: bool,
}

const MAINTAINER: &str = "abiss developers <abiss@example.invalid>";
const CONFFILE: &str = "/etc/abiss/abissd.toml";

const DESCRIPTION: &str = "\
guaranteed-rate disk streams for local users (ABISS)
 abissd gives a file read or written at a steady rate (a film, a
 recording) its own guarantee on the disk: it loads a window of the file
 ahead of its reader at real-time I/O priority, admits no more streams
 than the disk can serve, and raises a reader that misses the page cache.
 Every local user may ask for streams through abissctl or the C library
 libabiss; the daemon bounds what each one can take.
 .
 This package has abissd (a systemd service, enabled on install),
 abissctl, the emulated-disk lab abiss-lab, libabiss with its header and
 pkg-config file, man pages and bash, zsh and fish completions.";

pub fn run(root: &Path, args: &DebArgs) -> anyhow::Result<()> {
    let version = format!("{}-{}", env!("CARGO_PKG_VERSION"), args.revision);
    let arch = shell::output(Command::new("dpkg").arg("--print-architecture"))?
        .trim()
        .to_owned();
    let multiarch = shell::output(Command::new("dpkg-architecture").arg("-qDEB_HOST_MULTIARCH"))?
        .trim()
        .to_owned();
    let libdir = format!("usr/lib/{multiarch}");
    let out = root.join(&args.out);
    let name = format!("abiss_{version}_{arch}");
    let stage = out.join(&name);
    if stage.exists() {
        std::fs::remove_dir_all(&stage)
            .with_context(|| format!("cannot remove {}", stage.display()))?;
    }
    install::run(
        root,
        &InstallArgs {
            prefix: PathBuf::from("/usr"),
            sysconfdir: Some(PathBuf::from("/etc")),
            unitdir: Some(PathBuf::from("/lib/systemd/system")),
            libdir: Some(Path::new("/").join(&libdir)),
            destdir: Some(stage.clone()),
            from: args.from.clone(),
        },
    )?;
    let library = format!("{libdir}/libabiss.so.{}", env!("CARGO_PKG_VERSION"));
    strip(&stage, &libdir, &library)?;
    compress_man_pages(&stage.join("usr/share/man"))?;
    write_docs(root, &stage, &version)?;
    let control = stage.join("DEBIAN");
    std::fs::create_dir_all(&control).context("cannot create DEBIAN")?;
    for script in ["postinst", "prerm", "postrm"] {
        copy_mode(
            &root.join("deploy/debian").join(script),
            &control.join(script),
            0o755,
        )?;
    }
    write(&control.join("conffiles"), &format!("{CONFFILE}\n"), 0o644)?;
    write(
        &control.join("shlibs"),
        &format!(
            "libabiss {} abiss (>= {version})\n",
            env!("CARGO_PKG_VERSION_MAJOR")
        ),
        0o644,
    )?;
    // The dynamic linker's cache learns of libabiss.so.0 as debhelper's packages tell it.
    write(
        &control.join("triggers"),
        "activate-noawait ldconfig\n",
        0o644,
    )?;
    let files = regular_files(&stage)?;
    write(&control.join("md5sums"), &md5sums(&stage, &files)?, 0o644)?;
    let depends = dependencies(&stage, &library)?;
    let control_text = format!(
        "Package: abiss\nVersion: {version}\nArchitecture: {arch}\nMaintainer: {MAINTAINER}\n\
         Installed-Size: {size}\nDepends: {depends}\nSection: admin\nPriority: optional\n\
         Homepage: https://example.invalid/abiss\nDescription: {DESCRIPTION}\n",
        size = installed_size(&stage, &files)?,
    );
    write(&control.join("control"), &control_text, 0o644)?;
    let deb = out.join(format!("{name}.deb"));
    shell::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    println!("built {}", deb.display());
    if args.lintian {
        shell::run(
            Command::new("lintian")
                .args(["--fail-on", "error,warning"])
                .arg(&deb),
        )?;
    }
    Ok(())
}

/// Strips the executables and the libraries as `dh_strip` does (the release profile keeps line
/// tables for backtraces; a package ships without them). The shared library is not executable.
fn strip(stage: &Path, libdir: &str, library: &str) -> anyhow::Result<()> {
    let strip = |args: &[&str], file: &str| {
        shell::run(
            Command::new("strip")
                .args(["--remove-section=.comment", "--remove-section=.note"])
                .args(args)
                .arg(stage.join(file)),
        )
    };
    for file in ["usr/sbin/abissd", "usr/bin/abissctl", "usr/bin/abiss-lab"] {
        strip(&[], file)?;
    }
    strip(&["--strip-unneeded"], library)?;
    strip(
        &["--strip-debug", "--enable-deterministic-archives"],
        &format!("{libdir}/libabiss.a"),
    )?;
    set_mode(&stage.join(library), 0o644)
}

/// `gzip -9n` of every page, as Debian ships them.
fn compress_man_pages(man: &Path) -> anyhow::Result<()> {
    for section in std::fs::read_dir(man).context("no man pages staged")? {
        let section = section?.path();
        for page in std::fs::read_dir(&section)? {
            shell::run(Command::new("gzip").args(["-9nf"]).arg(page?.path()))?;
        }
    }
    Ok(())
}

/// `/usr/share/doc/abiss`: the copyright file and the changelog Debian requires, dated by the
/// last commit (the same tree builds the same package).
fn write_docs(root: &Path, stage: &Path, version: &str) -> anyhow::Result<()> {
    let doc = stage.join("usr/share/doc/abiss");
    copy_mode(
        &root.join("deploy/debian/copyright"),
        &doc.join("copyright"),
        0o644,
    )?;
    let epoch =
        shell::output(
            Command::new("git")
                .current_dir(root)
                .args(["log", "-1", "--format=%ct"]),
        )
        .map_or_else(|_| "0".to_owned(), |t| t.trim().to_owned());
    let date = shell::output(
        Command::new("date")
            .args(["-u", "-R", "-d"])
            .arg(format!("@{epoch}")),
    )?;
    let changelog = doc.join("changelog.Debian");
    write(
        &changelog,
        &format!(
            "abiss ({version}) unstable; urgency=medium\n\n  * Built by `cargo xtask deb` from \
             the abiss source tree.\n\n -- {MAINTAINER}  {}\n",
            date.trim()
        ),
        0o644,
    )?;
    shell::run(Command::new("gzip").args(["-9nf"]).arg(&changelog))?;
    let overrides = stage.join("usr/share/lintian/overrides/abiss");
    copy_mode(
        &root.join("deploy/debian/lintian-overrides"),
        &overrides,
        0o644,
    )
}

/// `Depends:` from the executables' and the library's dynamic dependencies
/// (`dpkg-shlibdeps`, which wants a `debian/control` to stand in).
fn dependencies(stage: &Path, library: &str) -> anyhow::Result<String> {
    let work = stage
        .parent()
        .context("the stage's directory")?
        .join("shlibdeps");
    std::fs::create_dir_all(work.join("debian"))?;
    std::fs::write(
        work.join("debian/control"),
        "Source: abiss\n\nPackage: abiss\nArchitecture: any\n",
    )?;
    let mut command = Command::new("dpkg-shlibdeps");
    command.current_dir(&work).arg("-O");
    for file in [
        "usr/sbin/abissd",
        "usr/bin/abissctl",
        "usr/bin/abiss-lab",
        library,
    ] {
        command.arg(format!("-e{}", stage.join(file).display()));
    }
    let found = shell::output(&mut command)?;
    let _ = std::fs::remove_dir_all(&work);
    let shlibs = found
        .lines()
        .find_map(|line| line.strip_prefix("shlibs:Depends="))
        .unwrap_or_default();
    // deb-systemd-helper and deb-systemd-invoke, which the maintainer scripts call.
    Ok(format!("{shlibs}, init-system-helpers (>= 1.54~)")
        .trim_start_matches(", ")
        .to_owned())
}

/// Every regular file of the package, relative to `stage`, sorted; `DEBIAN/` excluded.
fn regular_files(stage: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fn walk(dir: &Path, stage: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                if path != stage.join("DEBIAN") {
                    walk(&path, stage, out)?;
                }
            } else if kind.is_file() {
                out.push(path.strip_prefix(stage)?.to_owned());
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(stage, stage, &mut files)?;
    files.sort();
    Ok(files)
}

/// `DEBIAN/md5sums`: every file but the conffile (dpkg keeps conffiles' sums itself).
fn md5sums(stage: &Path, files: &[PathBuf]) -> anyhow::Result<String> {
    let listed: Vec<&PathBuf> = files
        .iter()
        .filter(|f| Path::new("/").join(f) != Path::new(CONFFILE))
        .collect();
    let sums = shell::output(Command::new("md5sum").current_dir(stage).args(&listed))?;
    Ok(sums)
}

/// KiB the files take, as dpkg-gencontrol counts them (each rounded up).
fn installed_size(stage: &Path, files: &[PathBuf]) -> anyhow::Result<u64> {
    let mut kib = 0;
    for file in files {
        let bytes = std::fs::metadata(stage.join(file))?.len();
        kib += bytes.div_ceil(1024);
    }
    Ok(kib)
}

fn copy_mode(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(from).with_context(|| format!("cannot read {}", from.display()))?;
    write(to, &text, mode)
}

fn write(to: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(to, text).with_context(|| format!("cannot write {}", to.display()))?;
    set_mode(to, mode)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_has_a_synopsis_and_continuation_lines() {
        let mut lines = DESCRIPTION.lines();
        let synopsis = lines.next().unwrap_or_default();
        assert!(synopsis.len() < 80, "{synopsis}");
        assert!(lines.all(|l| l.starts_with(' ') && l.len() <= 75));
        assert!(!DESCRIPTION.ends_with('\n'));
    }
}
