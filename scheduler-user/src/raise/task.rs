//! The threads behind raises, as `/proc` shows them, and putting them back: one at a time
//! (an idle or policed raise, a stream's end) or all that an earlier daemon left raised.

use std::io;
use std::path::Path;

use abiss_os::ioprio;
use log::{info, warn};
use scheduler_common::AbissLevel;

use super::RAISES_FILE;
use crate::policy::raise::{Raise, TaskId};

/// Who a thread is, from `/proc`.
pub(super) struct Identity {
    pub(super) task: TaskId,
    pub(super) tgid: u32,
    pub(super) uid: u32,
    /// Its command (`comm`).
    pub(super) command: String,
}

/// Thread `pid`'s identity; `Ok(None)` when there is no such thread (any more), an error when
/// `/proc` could not tell (out of descriptors, say), which is not the same.
pub(super) fn task_identity(pid: u32) -> io::Result<Option<Identity>> {
    let pid_i32 = i32::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let gone = |error: &procfs::ProcError| matches!(error, procfs::ProcError::NotFound(_));
    let process = match procfs::process::Process::new(pid_i32) {
        Ok(process) => process,
        Err(error) if gone(&error) => return Ok(None),
        Err(error) => return Err(io::Error::other(error)),
    };
    let (stat, status) = match (process.stat(), process.status()) {
        (Ok(stat), Ok(status)) => (stat, status),
        (Err(error), _) | (_, Err(error)) if gone(&error) => return Ok(None),
        (Err(error), _) | (_, Err(error)) => return Err(io::Error::other(error)),
    };
    Ok(Some(Identity {
        task: TaskId {
            pid,
            start_time: stat.starttime,
        },
        tgid: status.tgid.unsigned_abs(),
        uid: status.ruid,
        command: status.name,
    }))
}

/// What became of a raised thread at restore.
pub(super) enum Restored {
    /// Its priority is back.
    Yes,
    /// It is gone, the id names another thread now, or its priority was changed since by
    /// someone else: nothing to put back.
    NotNeeded,
    /// It could not be looked at: it may still be raised, so its record must stay.
    Unknown,
}

/// Puts back the priority of an raised thread if it is still the same thread and nobody
/// changed its priority since.
pub(super) fn restore(raise: &Raise) -> Restored {
    let identity = match task_identity(raise.task.pid) {
        Ok(Some(identity)) => identity,
        Ok(None) => return Restored::NotNeeded,
        Err(error) => {
            warn!("cannot look at thread {}: {error}", raise.task.pid);
            return Restored::Unknown;
        }
    };
    if identity.task != raise.task {
        return Restored::NotNeeded; // the pid belongs to another thread now
    }
    if !lowers(raise.previous, raise.applied) {
        // No raise abissd made is undone by raising: this record was not written by abissd.
        warn!(
            "not restoring thread {} to ioprio {:#x}: that is above the {:#x} it was raised to",
            raise.task.pid, raise.previous, raise.applied
        );
        return Restored::NotNeeded;
    }
    match ioprio::get(raise.task.pid) {
        Ok(current) if current == raise.applied => {
            match ioprio::set(raise.task.pid, raise.previous) {
                Ok(()) => Restored::Yes,
                Err(error) => {
                    warn!("cannot restore thread {}: {error}", raise.task.pid);
                    Restored::Unknown
                }
            }
        }
        // Changed by the application (or someone else) since: theirs to keep.
        _ => Restored::NotNeeded,
    }
}

/// Whether putting a thread back from `applied` to `previous` lowers it: a raise always went
/// to a strictly higher ABISS level, so its undoing never raises.
fn lowers(previous: u16, applied: u16) -> bool {
    AbissLevel::of_ioprio(previous) > AbissLevel::of_ioprio(applied)
}

/// Restores the threads a previous daemon raised and did not restore (it crashed), and
/// removes the record; says in the log what it did.
pub(crate) fn restore_leftovers(state_dir: &Path) {
    let path = state_dir.join(RAISES_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let raises: Vec<Raise> = match serde_json::from_str(&text) {
        Ok(raises) => raises,
        Err(error) => {
            warn!("{} is corrupt ({error}); setting it aside", path.display());
            let _ = std::fs::rename(&path, path.with_extension("json.corrupt"));
            return;
        }
    };
    let mut restored = 0;
    let mut unknown = Vec::new();
    for raise in &raises {
        match restore(raise) {
            Restored::Yes => restored += 1,
            Restored::NotNeeded => {}
            Restored::Unknown => unknown.push(raise.clone()),
        }
    }
    let made = super::made_while_down::put_back(&raises);
    if made > 0 {
        info!("put back {made} tasks that raised threads made while no abissd ran");
    }
    // What could not be looked at stays recorded for the next start.
    let kept = if unknown.is_empty() {
        std::fs::remove_file(&path)
    } else {
        serde_json::to_vec(&unknown)
            .map_err(io::Error::other)
            .and_then(|bytes| abiss_os::fs::write_atomically(&path, &bytes))
    };
    if let Err(error) = kept {
        warn!("cannot update {}: {error}", path.display());
    }
    if !raises.is_empty() {
        info!(
            "restored {restored} of {} reader priorities raised by an earlier daemon",
            raises.len()
        );
    }
}
