//! Replacing a file whole, checking that a directory root keeps state in is root's alone, and
//! examining a descriptor without asking its file system.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` so that a crash leaves either the old file or the whole new
/// one: a temporary file beside it, synced, renamed over it, and the directory synced.
///
/// The temporary file is created anew (`O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0644), so a
/// symbolic link planted at its name is never followed; a leftover temporary file from a crash
/// is removed first (a link is removed, not followed). `rename` replaces a link at `path`
/// itself, never its target.
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
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
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

/// Whether `dir` is on tmpfs (as `/run` is), where writing a file never waits for a disk.
///
/// # Errors
/// If `dir` cannot be looked at.
pub fn is_in_memory(dir: &Path) -> io::Result<bool> {
    let fs_type = nix::sys::statfs::statfs(dir)?.filesystem_type();
    Ok(fs_type == nix::sys::statfs::TMPFS_MAGIC)
}

/// Creates `dir` (mode 0755) if it is missing, then checks that only root (or this process's
/// user) can change what is in it: it and every directory above it are owned by root or by
/// this process's effective user, and none is writable by group or others unless it is
/// sticky, as `/tmp` is (then nobody else can rename or remove what is in it). A process
/// that restores settings as root from a directory someone else could write would let them
/// choose the settings. The error is one sentence naming the directory and the fix.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)?;
    }
    let dir = fs::canonicalize(dir)?;
    let me = nix::unistd::geteuid().as_raw();
    for ancestor in dir.ancestors() {
        let meta = fs::metadata(ancestor)?;
        let unsafe_dir = |why: String| {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} {why}, so another user could plant or change the state kept in {}; {}",
                    ancestor.display(),
                    dir.display(),
                    if ancestor == dir {
                        "make it root's and not writable by group or others (chown root: and chmod go-w), or choose another directory"
                    } else {
                        "choose a directory under root-owned directories"
                    }
                ),
            ))
        };
        let (owner, mode) = (meta.uid(), meta.mode());
        if owner != 0 && owner != me {
            return unsafe_dir(format!("belongs to uid {owner}, not root"));
        }
        let sticky = mode & 0o1000 != 0 && ancestor != dir;
        if mode & 0o022 != 0 && !sticky {
            return unsafe_dir(format!(
                "is writable by group or others (mode {:04o})",
                mode & 0o7777
            ));
        }
    }
    Ok(())
}

/// What the kernel knows of an open file without asking its file system (see [`stat_cached`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedStat {
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// The file system's device: major and minor number. btrfs gives each subvolume an
    /// anonymous number of its own, which is not its super block's.
    pub device: (u32, u32),
    /// The mount it was opened through (`/proc/self/mountinfo`'s first field), when the
    /// kernel says (Linux 5.8, `STATX_MNT_ID`): where to find its file system and devices.
    pub mount_id: Option<u64>,
}

/// Examines the open file `fd` with `statx(2)` and `AT_STATX_DONT_SYNC`.
///
/// A disk file system answers from the inode, as `fstat` does. A FUSE or network file system
/// answers from what the kernel has cached, without asking its server. A root daemon that
/// examines a descriptor a user passed must not ask: any user may run a FUSE server (and,
/// where the administrator allows `allow_other`, let root into it). FUSE waits for its server
/// without a timeout, uninterruptibly once the server has read the request, so a server that
/// never answers would hold the examining thread for as long as it likes.
///
/// # Errors
/// As `statx(2)`: the file system refuses (FUSE refuses other users without `allow_other`).
pub fn stat_cached(fd: BorrowedFd<'_>) -> io::Result<CachedStat> {
    let mut buffer = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the path is a NUL-terminated empty string, `fd` is open for the call, and
    // `buffer` is a writable `statx` the kernel fills on success.
    let result = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE
                | libc::STATX_MODE
                | libc::STATX_INO
                | libc::STATX_SIZE
                | libc::STATX_MNT_ID,
            buffer.as_mut_ptr(),
        )
    };
    if result != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx succeeded, so it filled the buffer (which was zeroed besides).
    let stat = unsafe { buffer.assume_init() };
    Ok(CachedStat {
        mode: u32::from(stat.stx_mode),
        ino: stat.stx_ino,
        size: stat.stx_size,
        device: (stat.stx_dev_major, stat.stx_dev_minor),
        // The mount id is the VFS's, filled without the file system.
        mount_id: (stat.stx_mask & libc::STATX_MNT_ID != 0).then_some(stat.stx_mnt_id),
    })
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
    fn a_cached_stat_says_what_fstat_says_of_a_local_file() {
        use std::os::fd::AsFd;
        let dir = scratch("statx");
        let path = dir.join("file");
        fs::write(&path, vec![7u8; 12_345]).expect("write");
        let file = File::open(&path).expect("open");
        let cached = stat_cached(file.as_fd()).expect("statx");
        let meta = file.metadata().expect("fstat");
        assert_eq!(cached.mode, meta.mode());
        assert_eq!(cached.ino, meta.ino());
        assert_eq!(cached.size, 12_345);
        let dev = meta.dev();
        assert_eq!(cached.device, (libc::major(dev), libc::minor(dev)));
        let mount_id = cached.mount_id.expect("Linux 5.8 or newer says");
        let fdinfo =
            fs::read_to_string(format!("/proc/self/fdinfo/{}", file.as_raw_fd())).expect("fdinfo");
        assert!(
            fdinfo.contains(&format!("mnt_id:\t{mount_id}\n")),
            "{fdinfo}"
        );
        fs::remove_dir_all(dir).expect("cleanup");
    }

    #[test]
    fn tmpfs_is_told_from_other_file_systems() {
        assert!(is_in_memory(Path::new("/dev/shm")).expect("statfs /dev/shm"));
        assert!(!is_in_memory(Path::new("/proc")).expect("statfs /proc"));
        assert!(is_in_memory(Path::new("/no/such/dir")).is_err());
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
    fn a_directory_others_can_write_is_not_private() {
        let dir = scratch("private");
        let state = dir.join("state");
        ensure_private_dir(&state).expect("a fresh directory is private");
        assert_eq!(fs::metadata(&state).expect("made").mode() & 0o777, 0o755);
        fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .expect("chmod");
        let error = ensure_private_dir(&state).unwrap_err().to_string();
        assert!(
            error.contains("writable by group or others (mode 0777)"),
            "{error}"
        );
        // A sticky directory above (like /tmp) is fine; the state directory itself is not.
        fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o1777))
            .expect("chmod");
        assert!(ensure_private_dir(&state).is_err());
        fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(&state, Some(nix::unistd::Uid::from_raw(65534)), None)
                .expect("chown");
            let error = ensure_private_dir(&state).unwrap_err().to_string();
            assert!(error.contains("belongs to uid 65534"), "{error}");
        }
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
