//! The players' own program files (executable, shared libraries, plugins), put in the page
//! cache before each launch.
//!
//! The lab machine runs a proactive reclaim (a DAMON `pageout` scheme over physical memory):
//! between two launches a player's libraries leave the page cache, and its next start reads
//! them from the root disk again. `GStreamer` with its `libav` plugin read 8 to 12 MiB of them
//! (`libcodec2`, `libplacebo`, …) at the start of the slow runs of the arriving row, and such
//! starts took up to 5.4 s with no load at all. That is neither the load's doing nor abiss's:
//! the load is on the lab disk, the programs are on the root disk. So each launch, in the
//! baselines and in the rows alike, first reads the files the player mapped during its
//! baseline, which makes those launches start from the same page cache.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The program files of each kind of player, by its name, as its baseline run mapped them.
static PROGRAM_FILES: Mutex<BTreeMap<&'static str, Vec<PathBuf>>> = Mutex::new(BTreeMap::new());

/// A mapped file larger than this is no program file (and reading it would cost more than
/// it could explain).
const LARGEST_PROGRAM_FILE: u64 = 256 << 20;

/// Notes the regular files process `pid` (a player of kind `kind`, playing) has mapped,
/// leaving out those on the device of `media` (the lab disk) and any over
/// [`LARGEST_PROGRAM_FILE`]. Nothing if its maps cannot be read (it ended).
pub fn remember(kind: &'static str, pid: u32, media: &Path) {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return;
    };
    let media_device = std::fs::metadata(media).map(|m| m.dev()).ok();
    let files: BTreeSet<PathBuf> = maps
        .lines()
        // address perms offset dev inode path: the path is the sixth field, and may hold spaces.
        .filter_map(|line| line.splitn(6, char::is_whitespace).nth(5))
        .map(str::trim)
        .filter(|path| path.starts_with('/') && !path.ends_with(" (deleted)"))
        .map(PathBuf::from)
        .filter(|path| {
            std::fs::metadata(path).is_ok_and(|m| {
                m.is_file() && Some(m.dev()) != media_device && m.len() <= LARGEST_PROGRAM_FILE
            })
        })
        .collect();
    if let Ok(mut known) = PROGRAM_FILES.lock() {
        known.insert(kind, files.into_iter().collect());
    }
}

/// Reads the program files of `kind` noted so far, whole: a page-cache hit costs a copy, a
/// page the reclaim took costs a read of the root disk now rather than in the launch that
/// follows. Returns the bytes read; files that cannot be read are skipped.
pub fn warm(kind: &str) -> u64 {
    let files = PROGRAM_FILES
        .lock()
        .ok()
        .and_then(|known| known.get(kind).cloned())
        .unwrap_or_default();
    files.iter().map(|path| warm_file(path)).sum()
}

/// Reads `path` whole, as [`warm`] does a player's files: the launcher a row runs the player
/// through (abissctl) is a program file of that launch too. In a players test on the lab VM
/// the reclaim had taken abissctl's pages, and `abissctl run` attached 100 ms after its
/// launch instead of 4 to 11 ms: it waited 61 ms in page faults on the root disk and 28 ms
/// for a request of it. Returns the bytes read (0 if it cannot be).
#[must_use]
pub fn warm_file(path: &Path) -> u64 {
    let Ok(mut file) = File::open(path) else {
        return 0;
    };
    let mut buffer = vec![0u8; 1 << 20];
    let mut total = 0u64;
    while let Ok(read) = file.read(&mut buffer) {
        if read == 0 {
            break;
        }
        total += read as u64;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`remember`] notes for process `pid` with `media`'s device left out.
    fn remembered(kind: &'static str, pid: u32, media: &Path) -> Vec<PathBuf> {
        remember(kind, pid, media);
        PROGRAM_FILES.lock().unwrap().get(kind).cloned().unwrap()
    }

    #[test]
    fn a_process_own_executable_and_libraries_are_noted_and_read_but_not_the_media_disks() {
        let pid = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        // Media on tmpfs, another device than the program's.
        let media = PathBuf::from(format!("/dev/shm/abiss-program-test-{pid}"));
        std::fs::write(&media, b"media").unwrap();
        let noted = remembered("this-test", pid, &media);
        assert!(noted.contains(&exe), "{noted:?}");
        assert!(
            noted.iter().any(|p| p.to_string_lossy().contains("libc")),
            "{noted:?}"
        );
        assert!(warm("this-test") >= std::fs::metadata(&exe).unwrap().len());
        assert_eq!(warm("never-noted"), 0);
        // Files on the media's device are left out: with the executable standing in for the
        // media, the executable is not noted.
        let noted = remembered("this-test-2", pid, &exe);
        assert!(!noted.contains(&exe), "{noted:?}");
        std::fs::remove_file(&media).unwrap();
    }
}
