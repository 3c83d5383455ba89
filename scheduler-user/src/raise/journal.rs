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

use std::collections::HashMap;
use std::io;

use abiss_os::{clock::monotonic_now, ioprio};
use abiss_proto::DeviceNumber;
use log::{info, warn};
use scheduler_common::{AbissLevel, MonotonicNs};

use super::task::task_identity;
use super::{RaiseFor, ReaderRaises};
use crate::policy::raise::{raised_priority, Raise};
use crate::policy::stray::RaiseAccount;

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags: the journal thread is a kernel thread.
const PF_KTHREAD: u32 = 0x0020_0000;
/// How long a file system found without a journal thread is believed to have none.
pub(crate) const NO_JOURNAL_RECHECK_NS: u64 = 10_000_000_000;

/// The journal threads found, per file system. Finding one scans every process in `/proc`,
/// which any user can make many of, and a user may start and end recordings as fast as they
/// like (issue 33): so it is scanned for once per file system, and again only when the thread
/// found is gone or no longer that file system's journal (the file system was mounted anew),
/// or, for a file system without one, after [`NO_JOURNAL_RECHECK_NS`].
#[derive(Debug, Default)]
pub(super) struct JournalThreads {
    found: HashMap<DeviceNumber, Found>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Thread(u32),
    Nothing { at: MonotonicNs },
}

impl JournalThreads {
    /// The journal thread of the file system on `fs_device`, if it has one.
    fn thread(&mut self, fs_device: DeviceNumber, now: MonotonicNs) -> io::Result<Option<u32>> {
        let Some(wanted) = journal_name(fs_device)? else {
            return Ok(None);
        };
        self.thread_with(fs_device, now, &wanted, scan_for, is_named)
    }

    /// [`Self::thread`] with the scan of `/proc` and the look at one thread given.
    fn thread_with(
        &mut self,
        fs_device: DeviceNumber,
        now: MonotonicNs,
        wanted: &[u8],
        scan: impl FnOnce(&[u8]) -> io::Result<Option<u32>>,
        still: impl FnOnce(u32, &[u8]) -> bool,
    ) -> io::Result<Option<u32>> {
        match self.found.get(&fs_device) {
            Some(&Found::Thread(tid)) if still(tid, wanted) => return Ok(Some(tid)),
            Some(&Found::Nothing { at }) if now.saturating_since(at) < NO_JOURNAL_RECHECK_NS => {
                return Ok(None)
            }
            _ => {}
        }
        let found = scan(wanted)?;
        self.found.insert(
            fs_device,
            found.map_or(Found::Nothing { at: now }, Found::Thread),
        );
        Ok(found)
    }
}

impl ReaderRaises {
    /// Raises the journal thread of the file system on `fs_device` to ABISS `level` for
    /// recording `stream`, unless it is raised already (for another recording) or there is
    /// none; whether it is raised now.
    pub(crate) fn raise_journal(
        &mut self,
        stream: RaiseFor,
        fs_device: DeviceNumber,
        level: AbissLevel,
    ) -> bool {
        if !self.enabled {
            return false;
        }
        let tid = match self.journals.thread(fs_device, monotonic_now()) {
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
        let now = monotonic_now();
        let raise = Raise {
            task: identity.task,
            tgid: identity.tgid,
            stream: stream.stream,
            file_tag: stream.file_tag,
            previous: current,
            applied: target,
            last_access: now,
            raised_at: now,
            started_at: None,
            journal: true,
            writer: false,
            uid: identity.uid,
            account: RaiseAccount::default(),
        };
        // Recorded first: unlike a reader, nothing waits on this raise right now.
        if !self.record_with(&raise) {
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
        self.table.insert(raise);
        true
    }
}

/// The start of the journal thread's command name (`jbd2/NAME-…`, at most 15 bytes) of the
/// file system on block device `fs_device`, if the device has a name.
fn journal_name(fs_device: DeviceNumber) -> io::Result<Option<Vec<u8>>> {
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
    let wanted = format!("jbd2/{name}-").into_bytes();
    Ok(Some(wanted[..wanted.len().min(15)].to_vec()))
}

/// Whether `stat` is a kernel thread whose name starts with `wanted`.
fn named(stat: &procfs::process::Stat, wanted: &[u8]) -> bool {
    stat.flags & PF_KTHREAD != 0 && stat.comm.as_bytes().starts_with(wanted)
}

/// Whether thread `tid` is still the kernel thread named `wanted…`.
fn is_named(tid: u32, wanted: &[u8]) -> bool {
    i32::try_from(tid)
        .ok()
        .and_then(|pid| procfs::process::Process::new(pid).ok())
        .and_then(|process| process.stat().ok())
        .is_some_and(|stat| named(&stat, wanted))
}

/// The first kernel thread in `/proc` named `wanted…`.
fn scan_for(wanted: &[u8]) -> io::Result<Option<u32>> {
    let processes = procfs::process::all_processes().map_err(io::Error::other)?;
    for process in processes.filter_map(Result::ok) {
        let Ok(stat) = process.stat() else {
            continue;
        };
        if named(&stat, wanted) {
            return Ok(u32::try_from(stat.pid).ok());
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const DEVICE: DeviceNumber = DeviceNumber { major: 7, minor: 0 };

    /// Recordings that start over and over find the journal thread with one scan of `/proc`;
    /// a thread that is gone (the file system mounted anew) is looked for again, and a file
    /// system without one at most every `NO_JOURNAL_RECHECK_NS`.
    #[test]
    fn the_journal_thread_is_scanned_for_once_per_file_system() {
        let mut journals = JournalThreads::default();
        let scans = Cell::new(0);
        let scan = |found: Option<u32>| {
            let scans = &scans;
            move |_: &[u8]| {
                scans.set(scans.get() + 1);
                Ok(found)
            }
        };
        for round in 0..1000 {
            let found = journals.thread_with(
                DEVICE,
                MonotonicNs(round),
                b"jbd2/loop0-",
                scan(Some(42)),
                |tid, _| tid == 42,
            );
            assert_eq!(found.expect("found"), Some(42));
        }
        assert_eq!(scans.get(), 1);
        // Gone: scanned again, the new thread found.
        let found = journals.thread_with(
            DEVICE,
            MonotonicNs(1000),
            b"jbd2/loop0-",
            scan(Some(43)),
            |_, _| false,
        );
        assert_eq!(found.expect("found"), Some(43));
        assert_eq!(scans.get(), 2);
        // A file system without a journal thread.
        let other = DeviceNumber { major: 7, minor: 1 };
        for round in 0..1000 {
            let found = journals.thread_with(
                other,
                MonotonicNs(round),
                b"jbd2/loop1-",
                scan(None),
                |_, _| true,
            );
            assert_eq!(found.expect("found"), None);
        }
        assert_eq!(scans.get(), 3);
        let _ = journals.thread_with(
            other,
            MonotonicNs(NO_JOURNAL_RECHECK_NS),
            b"jbd2/loop1-",
            scan(None),
            |_, _| true,
        );
        assert_eq!(scans.get(), 4);
    }
}
