//! A kernel's packages found in its distribution's archive index, for when the pinned version
//! is gone from the mirror (security archives keep only the newest build of a series) or when
//! `--newest` asks for the series' current build.
//!
//! The index (`dists/SUITE/main/binary-amd64/Packages.xz`) names every package with its file
//! and SHA-256; the image chosen is the one of the kernel's series with the highest ABI number,
//! and on Ubuntu the modules package of the same ABI and version goes with it.

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::shell;

/// Where a kernel's series is in its distribution's archive.
pub(super) struct Series {
    /// The archive's root (`http://deb.debian.org/debian-security`).
    pub(super) archive: &'static str,
    /// The suite whose index lists the series (`bookworm-security`).
    pub(super) suite: &'static str,
    /// The image package's name around its ABI number: `linux-image-6.1.0-` and
    /// `-cloud-amd64` for `linux-image-6.1.0-57-cloud-amd64`.
    pub(super) image_prefix: &'static str,
    pub(super) image_suffix: &'static str,
    /// Whether the modules are a package of their own (`linux-modules-…`, Ubuntu).
    pub(super) separate_modules: bool,
}

/// A package to download, with the SHA-256 it must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fetched {
    pub(super) url: String,
    pub(super) sha256: String,
    /// Whether it is the pinned version (else the newest in the index).
    pub(super) pinned: bool,
}

/// One stanza of a `Packages` index, as far as choosing needs it.
#[derive(Debug, PartialEq, Eq)]
struct Stanza {
    package: String,
    version: String,
    filename: String,
    sha256: String,
}

/// The stanzas of a `Packages` index that name a package, a file and its SHA-256.
fn stanzas(index: &str) -> Vec<Stanza> {
    index
        .split("\n\n")
        .filter_map(|text| {
            let field = |name: &str| {
                text.lines()
                    .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
                    .map(str::to_owned)
            };
            Some(Stanza {
                package: field("Package")?,
                version: field("Version")?,
                filename: field("Filename")?,
                sha256: field("SHA256")?,
            })
        })
        .collect()
}

/// The ABI number of image package `name` in `series`, if it is one of the series.
fn abi(series: &Series, name: &str) -> Option<u32> {
    name.strip_prefix(series.image_prefix)?
        .strip_suffix(series.image_suffix)?
        .parse()
        .ok()
}

/// The series' newest image in `index` (and its modules package), as packages to fetch.
fn newest(series: &Series, index: &str) -> anyhow::Result<Vec<Fetched>> {
    let all = stanzas(index);
    let image = all
        .iter()
        .filter_map(|s| abi(series, &s.package).map(|abi| (abi, s)))
        .max_by_key(|(abi, _)| *abi)
        .map(|(_, s)| s)
        .with_context(|| {
            format!(
                "{} {} lists no {}N{}",
                series.archive, series.suite, series.image_prefix, series.image_suffix
            )
        })?;
    let mut chosen = vec![image];
    if series.separate_modules {
        let name = image.package.replacen("linux-image-", "linux-modules-", 1);
        let modules = all
            .iter()
            .find(|s| s.package == name && s.version == image.version)
            .with_context(|| format!("{} {} lists no {name}", series.archive, series.suite))?;
        chosen.push(modules);
    }
    Ok(chosen
        .into_iter()
        .map(|s| Fetched {
            url: format!("{}/{}", series.archive, s.filename),
            sha256: s.sha256.clone(),
            pinned: false,
        })
        .collect())
}

/// Downloads the series' index into `cache` and picks its newest packages.
pub(super) fn resolve(cache: &Path, series: &Series) -> anyhow::Result<Vec<Fetched>> {
    let url = format!(
        "{}/dists/{}/main/binary-amd64/Packages.xz",
        series.archive, series.suite
    );
    let dir = cache.join("index");
    std::fs::create_dir_all(&dir)?;
    let xz = dir.join(format!("{}.Packages.xz", series.suite));
    eprintln!("xtask kernels: reading the index {url}");
    shell::run(
        Command::new("curl")
            .args(["-fsSL", "--retry", "3", "-o"])
            .arg(&xz)
            .arg(&url),
    )
    .with_context(|| format!("cannot download the index {url}"))?;
    let index = shell::output(Command::new("xz").arg("-dc").arg(&xz))?;
    newest(series, &index)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INDEX: &str = "\
Package: linux-image-6.1.0-56-cloud-amd64
Version: 6.1.190-1
Filename: pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-56-cloud-amd64_6.1.190-1_amd64.deb
SHA256: aaaa

Package: linux-image-6.1.0-57-cloud-amd64
Version: 6.1.192-3
Filename: pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb
SHA256: bbbb

Package: linux-image-6.1.0-57-cloud-amd64-dbg
Version: 6.1.192-3
Filename: pool/updates/main/l/linux/linux-image-6.1.0-57-cloud-amd64-dbg_6.1.192-3_amd64.deb
SHA256: cccc

Package: linux-image-6.1.0-9-cloud-amd64
Version: 6.1.27-1
Filename: pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-9-cloud-amd64_6.1.27-1_amd64.deb
SHA256: dddd

Package: linux-modules-6.1.0-57-cloud-amd64
Version: 6.1.192-3
Filename: pool/updates/main/l/linux/linux-modules-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb
SHA256: eeee
";

    fn series(separate_modules: bool) -> Series {
        Series {
            archive: "http://deb.debian.org/debian-security",
            suite: "bookworm-security",
            image_prefix: "linux-image-6.1.0-",
            image_suffix: "-cloud-amd64",
            separate_modules,
        }
    }

    #[test]
    fn the_highest_abi_of_the_series_is_chosen_not_the_last_or_the_longest_name() {
        let chosen = newest(&series(false), INDEX).expect("found");
        assert_eq!(
            chosen,
            [Fetched {
                url: "http://deb.debian.org/debian-security/pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb".into(),
                sha256: "bbbb".into(),
                pinned: false,
            }]
        );
    }

    #[test]
    fn separate_modules_come_from_the_same_abi_and_version() {
        let chosen = newest(&series(true), INDEX).expect("found");
        assert_eq!(chosen.len(), 2);
        assert!(chosen[1]
            .url
            .ends_with("linux-modules-6.1.0-57-cloud-amd64_6.1.192-3_amd64.deb"));
        assert_eq!(chosen[1].sha256, "eeee");
    }

    #[test]
    fn a_series_the_index_lacks_is_an_error_naming_it() {
        let other = Series {
            image_prefix: "linux-image-5.10.0-",
            ..series(false)
        };
        let error = newest(&other, INDEX).expect_err("nothing of 5.10");
        assert!(error
            .to_string()
            .contains("linux-image-5.10.0-N-cloud-amd64"));
    }
}
