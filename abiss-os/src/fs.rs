//! Replacing a file whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` so that a crash leaves either the old file or the whole new
/// one: a temporary file beside it, synced, renamed over it, and the directory synced.
///
/// The temporary file is created anew (`O_EXCL`), so a symbolic link planted at its name is
/// never followed; a leftover temporary file from a crash is removed first.
pub fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    replace_via_temporary(path, contents, true)
}

/// Replaces `path` with `contents` so that readers see the old file or the whole new one,
/// without waiting for the disk: for files that are rewritten often and need not survive a
/// crash (a status summary), where a sync would stall the writer on every rewrite.
pub fn replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    replace_via_temporary(path, contents, false)
}

fn replace_via_temporary(path: &Path, contents: &[u8], durable: bool) -> io::Result<()> {
    let temporary = temporary_for(path);
    match fs::remove_file(&temporary) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temporary)?;
    let written = file
        .write_all(contents)
        .and_then(|()| if durable { file.sync_all() } else { Ok(()) })
        .and_then(|()| fs::rename(&temporary, path));
    if let Err(error) = written {
        let _ = fs::remove_file(&temporary);
        return Err(error);
    }
    if let Some(dir) = path
        .parent()
        .filter(|dir| durable && !dir.as_os_str().is_empty())
    {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn temporary_for(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("abiss-os-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_remains() {
        let dir = scratch("replace");
        let path = dir.join("state.json");
        write_atomically(&path, b"first").expect("write");
        write_atomically(&path, b"second").expect("rewrite");
        assert_eq!(fs::read(&path).expect("read"), b"second");
        assert_eq!(fs::read_dir(&dir).expect("dir").count(), 1);
        fs::remove_dir_all(dir).expect("cleanup");
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let dir = scratch("link");
        let path = dir.join("state.json");
        let victim = dir.join("victim");
        fs::write(&victim, b"untouched").expect("victim");
        std::os::unix::fs::symlink(&victim, temporary_for(&path)).expect("symlink");
        write_atomically(&path, b"new").expect("write");
        assert_eq!(fs::read(&victim).expect("victim"), b"untouched");
        assert_eq!(fs::read(&path).expect("read"), b"new");
        fs::remove_dir_all(dir).expect("cleanup");
    }
}
