//! What abissd learns from a descriptor a client passed, and the checks it must pass before it
//! becomes a stream's file: a regular file, not `O_PATH`, open for reading (or for writing, to
//! record into it), not empty unless recorded into. Nothing here asks the file's file system.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use abiss_proto::{DeviceNumber, Refusal};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::stat::SFlag;
use scheduler_common::FileKey;

use crate::serve::closer::ClientFd;

/// Why a descriptor or parameters cannot become a stream. Each message is one sentence.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    /// A parameter is out of range.
    #[error("{0}")]
    BadParameter(String),
    /// The descriptor is not a regular file open the way the stream needs it.
    #[error("{0}")]
    WrongFile(String),
}

impl From<AttachError> for Refusal {
    fn from(error: AttachError) -> Self {
        Self::BadRequest(error.to_string())
    }
}

/// What the daemon learns from a client's descriptor.
#[derive(Debug)]
pub(crate) struct CheckedFile {
    /// The descriptor, closed on its user's closing thread.
    pub(crate) fd: ClientFd,
    /// Path as the kernel names it.
    pub(crate) path: String,
    /// Filesystem device and inode, as the kernel's structures carry them: the device is
    /// `file_device` until the serving disk's lookup sets the super block's
    /// ([`crate::disk::file_disk::FileDisk::kernel_device`]).
    pub(crate) key: FileKey,
    /// Filesystem device number, as `stat` reports it (a btrfs subvolume's own).
    pub(crate) file_device: DeviceNumber,
    /// The mount it was opened through, when the kernel says: where its disks are found.
    pub(crate) mount_id: Option<u64>,
    /// Size in bytes.
    pub(crate) bytes: u64,
}

/// What the kernel knows of `fd` without asking its file system (`statx` with
/// `AT_STATX_DONT_SYNC`, `F_GETFL`), or why it can never be a stream's file (a phrase that
/// follows the file's name): it is no regular file, or it was opened with `O_PATH`.
/// abissd examines every passed descriptor so at receipt, and refuses such ones there.
pub(crate) fn examine(fd: BorrowedFd<'_>) -> Result<(abiss_os::fs::CachedStat, OFlag), String> {
    let stat =
        abiss_os::fs::stat_cached(fd).map_err(|error| format!("cannot be examined: {error}"))?;
    let kind = SFlag::from_bits_truncate(stat.mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFREG {
        let what = match kind {
            SFlag::S_IFDIR => "a directory",
            SFlag::S_IFIFO => "a pipe",
            SFlag::S_IFSOCK => "a socket",
            SFlag::S_IFBLK | SFlag::S_IFCHR => "a device",
            _ => "not a regular file",
        };
        return Err(format!("is {what}; only regular files can be streamed"));
    }
    let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)
        .map_err(|error| format!("cannot be examined: {error}"))?;
    let flags = OFlag::from_bits_truncate(flags);
    // An O_PATH descriptor can be had for a file one may not read (search rights on its
    // directory suffice): it proves nothing, so it attaches nothing and reveals nothing.
    if flags.contains(OFlag::O_PATH) {
        return Err(
            "was opened with O_PATH, which gives no right to read it; open it for reading".into(),
        );
    }
    Ok((stat, flags))
}

/// Checks that `fd` is a regular file opened for reading and not empty, or for a write stream
/// (`write`), opened for writing (it may be empty: a recording starts so).
///
/// Nothing here asks the file's file system: the descriptor is the client's, and so may be its
/// file system (a FUSE server that never answers would hold the main loop, and every stream
/// with it). The caller refuses files off managed disks before anything else touches them.
pub(crate) fn check_file(fd: ClientFd, write: bool) -> Result<CheckedFile, AttachError> {
    let path = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_or_else(
        |_| "(unnamed file)".to_owned(),
        |p| p.to_string_lossy().into_owned(),
    );
    let wrong = |what: &str| Err(AttachError::WrongFile(format!("{path} {what}")));
    let (stat, flags) = match examine(fd.as_fd()) {
        Ok(examined) => examined,
        Err(reason) => return wrong(&reason),
    };
    let access = flags & OFlag::O_ACCMODE;
    // The descriptor is the proof: abissd writes back and allocates only files the client
    // could write itself.
    if write && access == OFlag::O_RDONLY {
        return wrong("was opened read-only; open it for writing to record into it");
    }
    if !write && access == OFlag::O_WRONLY {
        return wrong("was opened write-only; open it for reading");
    }
    let bytes = stat.size;
    if bytes == 0 && !write {
        return wrong("is empty; there is nothing to stream");
    }
    let file_device = DeviceNumber {
        major: stat.device.0,
        minor: stat.device.1,
    };
    Ok(CheckedFile {
        fd,
        path,
        key: FileKey {
            dev: file_device.to_kernel(),
            pad: 0,
            ino: stat.ino,
        },
        file_device,
        mount_id: stat.mount_id,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(fd: impl Into<std::os::fd::OwnedFd>) -> ClientFd {
        ClientFd::new(fd.into(), 0, crate::serve::closer::Closer::new())
    }

    #[test]
    fn descriptors_that_are_not_readable_regular_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("abiss-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let directory = std::fs::File::open(&dir).unwrap();
        assert!(check_file(client(directory), false)
            .unwrap_err()
            .to_string()
            .contains("a directory"));
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        assert!(
            check_file(client(std::fs::File::open(&empty).unwrap()), false)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        let data = dir.join("data");
        std::fs::write(&data, b"abc").unwrap();
        let write_only = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
        assert!(check_file(client(write_only.try_clone().unwrap()), false)
            .unwrap_err()
            .to_string()
            .contains("write-only"));
        // A write stream needs a writable descriptor, and may start empty.
        assert_eq!(check_file(client(write_only), true).unwrap().bytes, 3);
        assert!(
            check_file(client(std::fs::File::open(&data).unwrap()), true)
                .unwrap_err()
                .to_string()
                .contains("read-only")
        );
        let empty_for_writing = std::fs::OpenOptions::new()
            .append(true)
            .open(&empty)
            .unwrap();
        assert_eq!(
            check_file(client(empty_for_writing), true).unwrap().bytes,
            0
        );
        let checked = check_file(client(std::fs::File::open(&data).unwrap()), false).unwrap();
        assert_eq!(checked.bytes, 3);
        assert!(checked.path.ends_with("/data"));
        let (reader, _writer) = nix::unistd::pipe().unwrap();
        assert!(check_file(client(reader), true)
            .unwrap_err()
            .to_string()
            .contains("a pipe"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
