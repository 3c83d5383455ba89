//! A FUSE file system an unprivileged user mounts to stall whoever examines its file, run by
//! the security tests as `nobody`: `abiss-stalling-fs MOUNTPOINT [FLUSH_AFTER_MS]`.
//!
//! It serves one file, `media.ts` (4 MiB of zeros), whose attributes are never cached
//! (time to live 0). Lookups, opens and reads are answered; a request for the file's
//! attributes (`fstat`, `statx` that asks the server) and a flush (which the kernel sends at
//! every close of a descriptor of the file) are never answered: their replies are kept, so the
//! caller waits as long as this process lives (a flush uninterruptibly: not even `SIGKILL`
//! frees it). Any user can mount such a file system
//! (`fusermount3` is set-uid root) and pass a descriptor of its file to abissd, so abissd
//! must never ask the file system anything on behalf of a client before it knows the file
//! is on a disk it manages.
//!
//! `abiss-stalling-fs MOUNTPOINT FLUSH_AFTER_MS` answers each flush that long after it came
//! instead (the fuzzer's slow file system). Prints `serving` once mounted; unmounts when killed (the kernel aborts the connection
//! when the process ends, and every waiting request fails).
use std::ffi::OsStr;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyEmpty, ReplyEntry,
    ReplyOpen, Request,
};

const ROOT_INO: u64 = 1;
const FILE_INO: u64 = 2;
const FILE_NAME: &str = "media.ts";
const FILE_BYTES: u64 = 4 << 20;

/// Never cached: every `stat` of the file asks this server.
const TTL: Duration = Duration::ZERO;

struct StallingFs {
    /// Attribute requests for the file, never answered (dropping one would answer EIO).
    held: Vec<ReplyAttr>,
    /// Flushes of the file, never answered either...
    held_flushes: Vec<ReplyEmpty>,
    /// ...unless this is given: then each is answered this long after it came.
    flush_after: Option<Duration>,
}

fn attr(ino: u64) -> FileAttr {
    let (kind, perm, size, nlink) = if ino == ROOT_INO {
        (FileType::Directory, 0o755, 0, 2)
    } else {
        (FileType::RegularFile, 0o644, FILE_BYTES, 1)
    };
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind,
        perm,
        nlink,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl Filesystem for StallingFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        if parent == ROOT_INO && name == FILE_NAME {
            reply.entry(&TTL, &attr(FILE_INO), 0);
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == FILE_INO {
            self.held.push(reply);
        } else {
            reply.attr(&TTL, &attr(ino));
        }
    }

    fn flush(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _lock_owner: u64,
        reply: ReplyEmpty,
    ) {
        match (ino == FILE_INO, self.flush_after) {
            (true, None) => self.held_flushes.push(reply),
            (true, Some(after)) => {
                std::thread::spawn(move || {
                    std::thread::sleep(after);
                    reply.ok();
                });
            }
            (false, _) => reply.ok(),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if ino == FILE_INO {
            reply.opened(0, 0);
        } else {
            reply.error(libc::EISDIR);
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let offset = u64::try_from(offset).unwrap_or(0).min(FILE_BYTES);
        let bytes = u64::from(size).min(FILE_BYTES - offset);
        reply.data(&vec![0; usize::try_from(bytes).unwrap_or(0)]);
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (mountpoint, flush_after) = match args.as_slice() {
        [_, mountpoint] => (mountpoint, None),
        [_, mountpoint, ms] if ms.parse::<u64>().is_ok() => {
            (mountpoint, ms.parse().ok().map(Duration::from_millis))
        }
        _ => {
            eprintln!("usage: abiss-stalling-fs MOUNTPOINT [FLUSH_AFTER_MS]");
            return ExitCode::from(2);
        }
    };
    let options = [
        MountOption::FSName("abiss-stalling".into()),
        MountOption::RO,
        MountOption::AllowOther,
        MountOption::AutoUnmount,
    ];
    let mut session = match fuser::Session::new(
        StallingFs {
            held: Vec::new(),
            held_flushes: Vec::new(),
            flush_after,
        },
        std::path::Path::new(mountpoint),
        &options,
    ) {
        Ok(session) => session,
        Err(error) => {
            eprintln!("abiss-stalling-fs: cannot mount {mountpoint}: {error}");
            return ExitCode::from(1);
        }
    };
    println!("serving");
    match session.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("abiss-stalling-fs: {error}");
            ExitCode::from(1)
        }
    }
}
