//! The journal of a file system that holds a recording is raised with the recording.
//!
//! On ext4 a recorder's `write(2)` waits for the journal: the time stamps of each write update
//! the inode in the running transaction (ext4 keeps `i_version`, so even `lazytime` does not
//! spare it), and a transaction being committed holds the next one back. The journal thread
//! (`jbd2/DEV-8`) commits at its own I/O priority, best effort (`journal_ioprio`, BE/3). With
//! streams' real-time requests ahead of it, and the best-effort load around it, its commits took
//! seconds, and every recorder on the file system waited them out: measured with real
//! recorders on the lab hdd (`bench/results/recording.md`), abiss made ext4 recorders overflow
//! more than stock mq-deadline did, a priority inversion through the journal.
//!
//! So while a file system holds a recording, its journal thread is raised to the recording's
//! level, as a reader would be: recorded (a crash leaves nothing raised), put back when the
//! last recording on the file system ends or abissd stops, and never put back for idleness. It
//! is not policed: it writes the metadata of every file of the file system, which is the point.
//! File systems without a journal thread (XFS logs through shared workqueues) get nothing.

use std::io;

use abiss_os::{clock::monotonic_ns, ioprio};
use abiss_proto::DeviceNumber;
use log::{info, warn};

use super::task::task_identity;
use super::{RaiseFor, ReaderUpgrades};
use crate::policy::stray::RaiseAccount;
use crate::policy::upgrade::{raised_priority, Upgrade};

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags: the journal thread is a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;

impl ReaderUpgrades {
    /// Raises the journal thread of the file system on `fs_device` to ABISS `level` for
    /// recording `stream`, unless it is raised already (for another recording) or there is
    /// none; whether it is raised now.
    pub fn raise_journal(&mut self, stream: RaiseFor, fs_device: DeviceNumber, level: u8) -> bool {
        if !self.enabled {
            return false;
        }
        let tid = match journal_thread(fs_device) {
            Ok(Some(tid)) => tid,
            Ok(None) => return false,
            Err(error) => {
                warn!("cannot look for the journal thread of {fs_device}: {error}");
                return false;
            }
        };
        if self.table.get(tid).is_some() {
            return true;
        }
        let (Ok(current), Ok(Some(identity))) = (ioprio::get(tid), task_identity(tid)) else {
            return false;
        };
        let Some(target) = raised_priority(current, level) else {
            return false;
        };
        let now = monotonic_ns();
        let upgrade = Upgrade {
            task: identity.task,
            tgid: identity.tgid,
            stream: stream.stream,
            file_tag: stream.file_tag,
            previous: current,
            applied: target,
            last_access_ns: now,
            raised_ns: now,
            started_ns: None,
            journal: true,
            uid: identity.uid,
            account: RaiseAccount::default(),
        };
        // Recorded first: unlike a reader, nothing waits on this raise right now.
        if !self.record_with(&upgrade) {
            return false;
        }
        if let Err(error) = ioprio::set(tid, target) {
            warn!(
                "stream {}: cannot raise journal thread {tid}: {error}",
                stream.stream
            );
            return false;
        }
        info!(
            "stream {}: raised the journal thread {tid} of {fs_device} from ioprio {current:#x} to {target:#x}",
            stream.stream
        );
        self.table.insert(upgrade);
        true
    }
}

/// The journal thread (`jbd2/NAME-…`) of the file system on block device `fs_device`, if it
/// has one.
fn journal_thread(fs_device: DeviceNumber) -> io::Result<Option<u32>> {
    let uevent = std::fs::read_to_string(format!(
        "/sys/dev/block/{}:{}/uevent",
        fs_device.major, fs_device.minor
    ))?;
    let Some(name) = uevent
        .lines()
        .find_map(|line| line.strip_prefix("DEVNAME="))
    else {
        return Ok(None);
    };
    // A command name is at most 15 bytes: a long device name is cut short in it.
    let wanted = format!("jbd2/{name}-");
    let wanted = &wanted.as_bytes()[..wanted.len().min(15)];
    let processes = procfs::process::all_processes().map_err(io::Error::other)?;
    for process in processes.filter_map(Result::ok) {
        let Ok(stat) = process.stat() else {
            continue;
        };
        if stat.flags & PF_KTHREAD != 0 && stat.comm.as_bytes().starts_with(wanted) {
            return Ok(u32::try_from(stat.pid).ok());
        }
    }
    Ok(None)
}
