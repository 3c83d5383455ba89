//! A kernel's boot files: its packages downloaded once and checked, unpacked, and an
//! initramfs of the common archive (this build's binaries, busybox, the host programs) and
//! the kernel's own modules.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::archive::{self, Fetched};
use super::{Kernel, BUILD_BINARIES, HOST_PROGRAMS, INIT, LOAD, MODULES};
use crate::shell;

/// The file name a URL ends in.
pub(super) fn file_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// Downloads `package` into `debs` unless it is there with the right hash.
pub(super) fn fetch(debs: &Path, package: &Fetched) -> anyhow::Result<PathBuf> {
    let path = debs.join(file_name(&package.url));
    if path.exists() && sha256(&path)? == package.sha256 {
        return Ok(path);
    }
    std::fs::create_dir_all(debs)?;
    let partial = path.with_extension("partial");
    eprintln!("xtask kernels: downloading {}", package.url);
    shell::run(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&partial)
            .arg(&package.url),
    )
    .with_context(|| format!("cannot download {}", package.url))?;
    let got = sha256(&partial)?;
    if got != package.sha256 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{} has SHA-256 {got}, not the {} {}",
            package.url,
            if package.pinned { "pinned" } else { "index's" },
            package.sha256
        );
    }
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

/// The kernel's packages downloaded into `debs`: the pinned ones, or (with `newest`, or
/// when a pinned one cannot be downloaded) the newest of its series in the archive's index.
fn fetch_kernel(
    cache: &Path,
    kernel: &Kernel,
    newest: bool,
) -> anyhow::Result<Vec<(Fetched, PathBuf)>> {
    let debs = cache.join("debs");
    if !newest {
        let pinned: Vec<Fetched> = kernel
            .packages
            .iter()
            .map(|p| Fetched {
                url: p.url.to_owned(),
                sha256: p.sha256.to_owned(),
                pinned: true,
            })
            .collect();
        let fetched: anyhow::Result<Vec<PathBuf>> =
            pinned.iter().map(|p| fetch(&debs, p)).collect();
        match fetched {
            Ok(paths) => return Ok(pinned.into_iter().zip(paths).collect()),
            Err(error) => eprintln!(
                "xtask kernels: {}: the pinned packages are unusable ({error:#}); taking the newest of the series from the archive's index",
                kernel.name
            ),
        }
    }
    let mut chosen = archive::resolve(cache, &kernel.series)?;
    for package in &mut chosen {
        // The newest may be the pinned build itself.
        package.pinned = kernel.packages.iter().any(|p| p.url == package.url);
    }
    chosen
        .into_iter()
        .map(|p| fetch(&debs, &p).map(|path| (p, path)))
        .collect()
}

pub(super) fn sha256(path: &Path) -> anyhow::Result<String> {
    let out = shell::output(Command::new("sha256sum").arg(path))?;
    Ok(out.split_whitespace().next().unwrap_or_default().to_owned())
}

/// What a kernel boots with.
pub(super) struct Boot {
    pub(super) vmlinuz: PathBuf,
    pub(super) initramfs: PathBuf,
    /// The packages it came from.
    pub(super) packages: Vec<Fetched>,
}

/// Downloads and unpacks the kernel's packages (once): the tree they unpacked into, and what
/// they are.
pub(super) fn unpacked(
    cache: &Path,
    kernel: &Kernel,
    newest: bool,
) -> anyhow::Result<(PathBuf, Vec<Fetched>)> {
    let tree = cache.join("unpacked").join(kernel.name);
    // The stamp names the files unpacked, so another choice (`--newest`, a pin gone) unpacks
    // anew.
    let stamp = tree.join(".unpacked");
    let packages = fetch_kernel(cache, kernel, newest)?;
    let names: String = packages
        .iter()
        .flat_map(|(p, _)| [file_name(&p.url), "\n"])
        .collect();
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(names.as_str()) {
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree)?;
        for (_, deb) in &packages {
            shell::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&tree))?;
        }
        std::fs::write(&stamp, names)?;
    }
    Ok((tree, packages.into_iter().map(|(p, _)| p).collect()))
}

/// Downloads and unpacks the kernel's packages (once) and makes its initramfs: the common
/// archive followed by one with its modules (the kernel reads concatenated archives).
pub(super) fn prepare(
    cache: &Path,
    kernel: &Kernel,
    common: &Path,
    newest: bool,
) -> anyhow::Result<Boot> {
    let (tree, packages) = unpacked(cache, kernel, newest)?;
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
    Ok(Boot {
        vmlinuz,
        initramfs,
        packages,
    })
}

pub(super) fn find_in(
    dir: &Path,
    wanted: impl Fn(&str) -> bool,
) -> anyhow::Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        if entry.file_name().to_str().is_some_and(&wanted) {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// `kernel/drivers/block/loop.ko.xz` → `loop.ko`.
pub(super) fn uncompressed_name(relative: &str) -> String {
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
pub(super) fn module_load_order(
    modules_dir: &Path,
    wanted: &[&str],
) -> anyhow::Result<Vec<String>> {
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
pub(super) fn decompress(source: &Path, dest: &Path) -> anyhow::Result<()> {
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
pub(super) fn common_initramfs(cache: &Path, bin_dir: &Path) -> anyhow::Result<PathBuf> {
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
    std::fs::write(staging.join("load.sh"), LOAD)?;
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

pub(super) fn set_executable(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The shared libraries `program` loads (and the dynamic loader), by the paths `ldd` gives.
pub(super) fn linked_libraries(program: &Path) -> anyhow::Result<Vec<String>> {
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
pub(super) fn cpio(dir: &Path, archive: &Path) -> anyhow::Result<()> {
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
