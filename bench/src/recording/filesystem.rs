//! The file systems the rows compare on the lab disk, and a small machine's dirty limits.
//!
//! The lab makes ext4; the other variants are made here over it (unmounted, made again,
//! mounted at the same place), so the lab's teardown unmounts whichever is mounted.

use std::path::Path;
use std::process::Command;

use anyhow::Context as _;
use serde::Serialize;

/// A file system and how it is mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileSystem {
    /// ext4 as made and mounted by default: `data=ordered`, so a journal commit first writes
    /// out the data of the blocks it allocates.
    Ext4,
    /// ext4 mounted `data=writeback`: commits do not wait for data.
    Ext4Writeback,
    /// xfs with its defaults (delayed logging, no ordered data mode).
    Xfs,
}

impl FileSystem {
    /// Short name for the reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Ext4 => "ext4",
            Self::Ext4Writeback => "ext4 data=writeback",
            Self::Xfs => "xfs",
        }
    }

    /// mkfs and its arguments (the lab's ext4 options: no discard, lazy initialisation).
    fn mkfs(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Self::Ext4 | Self::Ext4Writeback => (
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                ],
            ),
            Self::Xfs => ("mkfs.xfs", &["-q", "-f", "-K"]),
        }
    }

    /// Mount options (ext4's inode tables are not zeroed in the background: that writing would
    /// land in the first rows).
    #[must_use]
    pub fn mount_options(self) -> &'static str {
        match self {
            Self::Ext4 => "noinit_itable",
            Self::Ext4Writeback => "data=writeback,noinit_itable",
            Self::Xfs => "defaults",
        }
    }

    /// Unmounts `mount_dir`, makes this file system on `device` and mounts it there.
    pub fn make(self, device: &Path, mount_dir: &Path) -> anyhow::Result<()> {
        run(Command::new("umount").arg(mount_dir))?;
        let (mkfs, args) = self.mkfs();
        run(Command::new(mkfs).args(args).arg(device)).with_context(|| {
            format!(
                "cannot make {} ({mkfs}; xfsprogs has mkfs.xfs)",
                self.name()
            )
        })?;
        run(Command::new("mount")
            .args(["-o", self.mount_options()])
            .arg(device)
            .arg(mount_dir))
    }
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", command.get_program().display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{:?} failed: {}",
        command,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// `vm.dirty_bytes` and `vm.dirty_background_bytes` of a small machine while this lives; the
/// previous settings are put back on drop (errors and Ctrl-C end the benchmark by unwinding to
/// here; only SIGKILL skips it, and the values it replaced are printed when it starts).
#[derive(Debug)]
pub struct DirtyLimits {
    saved: Vec<(&'static str, String)>,
}

/// What each key was, for the report.
pub type SavedSettings = Vec<(&'static str, String)>;

const KEYS: [&str; 4] = [
    "dirty_ratio",
    "dirty_bytes",
    "dirty_background_ratio",
    "dirty_background_bytes",
];

fn vm_path(key: &str) -> String {
    format!("/proc/sys/vm/{key}")
}

impl DirtyLimits {
    /// Sets the limits (`dirty_bytes`, `background_bytes`).
    pub fn set(dirty_bytes: u64, background_bytes: u64) -> anyhow::Result<Self> {
        let saved = KEYS
            .iter()
            .map(|key| {
                let value = std::fs::read_to_string(vm_path(key))
                    .with_context(|| format!("cannot read vm.{key}"))?;
                Ok((*key, value.trim().to_owned()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let limits = Self { saved };
        eprintln!(
            "recording: vm dirty settings were {} (put back at the end)",
            limits.describe_saved()
        );
        for (key, value) in [
            ("dirty_bytes", dirty_bytes),
            ("dirty_background_bytes", background_bytes),
        ] {
            std::fs::write(vm_path(key), value.to_string())
                .with_context(|| format!("cannot set vm.{key} = {value}"))?;
        }
        Ok(limits)
    }

    /// The settings this replaced.
    #[must_use]
    pub fn saved(&self) -> &SavedSettings {
        &self.saved
    }

    fn describe_saved(&self) -> String {
        self.saved
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn value(&self, key: &str) -> &str {
        self.saved
            .iter()
            .find(|(k, _)| *k == key)
            .map_or("", |(_, v)| v.as_str())
    }
}

impl Drop for DirtyLimits {
    fn drop(&mut self) {
        // Writing a ratio clears its bytes twin and back: write the one that was in force.
        for (ratio, bytes) in [
            ("dirty_ratio", "dirty_bytes"),
            ("dirty_background_ratio", "dirty_background_bytes"),
        ] {
            let key = if self.value(bytes) == "0" {
                ratio
            } else {
                bytes
            };
            if let Err(error) = std::fs::write(vm_path(key), self.value(key)) {
                eprintln!(
                    "abiss-bench: cannot put vm.{key} back to {} ({error})",
                    self.value(key)
                );
            }
        }
    }
}
