//! The boundary where ring-buffer records from the eBPF programs become typed events.
//!
//! Three rings feed the daemon: EVENTS (one record per completed block request, while a
//! `trace` client asks for them), PLAYOUT (a task's access to an attached file) and FORKS (a
//! task made by a raised thread). Each record is decoded here, once, into a Rust type; nothing
//! past this module sees a raw `u32` kind, flag word or a NUL-padded command name. The values
//! of the `RAISED` map are decoded here too ([`inherited_raise`]).

use std::ops::Range;

use abiss_proto::{
    DeviceNumber, IoClass, IoPriority, Operation, RequestRecord, StreamId, PAGE_BYTES,
};
use scheduler_common::{
    playout_kind, raised_flags, ForkEvent, MonotonicNs, PlayoutEvent, RaisedThread, RequestEvent,
    COMM_LEN,
};

/// The task behind an access, as the kernel saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Reader {
    /// Process id.
    pub(crate) tgid: u32,
    /// Thread id: the one whose I/O priority an raise changes.
    pub(crate) pid: u32,
    /// Real user id.
    pub(crate) uid: u32,
    /// Command name.
    pub(crate) command: String,
}

/// What a task did to an attached file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// A read(2)-family call asked the page cache for these bytes.
    Read(Range<u64>),
    /// A fault on a mapping of the file, at these bytes.
    Fault(Range<u64>),
    /// A read of these bytes missed the page cache: the reader waits for the disk.
    Miss(Range<u64>),
    /// The task queued a read of the file below the stream's level (direct I/O, or the
    /// readahead of a miss).
    QueuedLow,
    /// The task added pages of the file to the page cache (where the kernel has no miss
    /// tracepoint): it missed, somewhere at or ahead of where it reads.
    Filled,
    /// An `io_uring` request of the task on the file completed.
    UringComplete {
        /// The request's I/O priority (encoded).
        ioprio: u16,
        /// Submission to completion.
        latency_ns: u64,
    },
}

/// One access of a task to a stream's file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamAccess {
    /// The tag of the file (shared by the file's streams; which of them the access belongs to
    /// is the controller's to route).
    pub(crate) file_tag: u64,
    /// When (the kernel's clock).
    pub(crate) at: MonotonicNs,
    /// Who.
    pub(crate) reader: Reader,
    /// What.
    pub(crate) access: Access,
}

/// The raise a task made by a raised thread started with, as the fork program passed it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InheritedRaise {
    /// The thread abissd raised, whose raise it is.
    pub(crate) root: u32,
    /// The tag of the file the raise is for (shared by the file's streams).
    pub(crate) file_tag: u64,
    /// That thread's priority before the raise (encoded): what the task is put back to.
    pub(crate) previous: u16,
    /// The priority abissd set (encoded): the task still has it if nobody changed it since.
    pub(crate) applied: u16,
    /// Made with `CLONE_IO`: it shares its parent's I/O context, so it cannot be put back
    /// alone; it goes back with its parent.
    pub(crate) shares_io_context: bool,
    /// Made past the bound on such tasks per raise
    /// (`scheduler_common::MAX_SHARED_IO_TASKS_PER_RAISE`): not noted in the map, and the
    /// raise is to be dropped.
    pub(crate) over_bound: bool,
    /// Noted in the map by the fork program (not past the bound, and the map had room): its
    /// entry is there until abissd puts it back or a new task takes its id.
    pub(crate) noted: bool,
    /// When the task started (`task_struct.start_boottime`, ns since boot; 0 if unknown): a
    /// task under its id that started at another time is another task.
    pub(crate) started_ns: u64,
}

/// A task made by a thread whose forks are followed (one the daemon raised, or a task such a
/// thread made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fork {
    /// When (the kernel's clock).
    pub(crate) at: MonotonicNs,
    /// Thread id of the task that made it.
    pub(crate) parent: u32,
    /// Thread id of the new task.
    pub(crate) child: u32,
    /// The raise it started with.
    pub(crate) raise: InheritedRaise,
}

/// A `RAISED` entry the fork program wrote (for a task made by a followed thread); `None`
/// for the daemon's own entries.
#[must_use]
pub(crate) fn inherited_raise(entry: &RaisedThread) -> Option<InheritedRaise> {
    (entry.flags & raised_flags::INHERITED != 0).then_some(InheritedRaise {
        root: entry.root,
        file_tag: entry.stream,
        previous: entry.previous,
        applied: entry.applied,
        shares_io_context: entry.flags & raised_flags::SHARES_IO_CONTEXT != 0,
        over_bound: entry.flags & raised_flags::OVER_BOUND != 0,
        noted: entry.flags & (raised_flags::OVER_BOUND | raised_flags::UNNOTED) == 0,
        started_ns: entry.started_ns,
    })
}

/// Decodes one FORKS record; `None` for a short one, or one that is not an inherited raise.
#[must_use]
pub(crate) fn decode_fork(bytes: &[u8]) -> Option<Fork> {
    let event: ForkEvent = read_record(bytes)?;
    Some(Fork {
        at: MonotonicNs(event.ts_ns),
        parent: event.parent,
        child: event.child,
        raise: inherited_raise(&event.raise)?,
    })
}

/// A kernel command name (`TASK_COMM_LEN` bytes, NUL-padded) as text.
#[must_use]
pub(crate) fn command_name(comm: &[u8; COMM_LEN]) -> String {
    let len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..len]).into_owned()
}

/// Reads a `T` the eBPF side wrote at the start of `bytes`, if there is room for one.
fn read_record<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    // SAFETY: `bytes` holds at least one T; T is a plain-old-data record (every bit pattern is
    // valid, which `aya::Pod` promises), and read_unaligned copes with the ring's
    // alignment.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

/// Decodes one EVENTS record into its protocol form.
#[must_use]
pub(crate) fn decode_request(bytes: &[u8]) -> Option<RequestRecord> {
    let event: RequestEvent = read_record(bytes)?;
    let request = event.request;
    let origin = event.origin;
    Some(RequestRecord {
        completed_ns: event.completed_ns,
        device: DeviceNumber::from_kernel(request.dev),
        operation: Operation::from_kernel(request.op),
        priority: IoPriority {
            class: IoClass::from_kernel(request.class),
            level: request.level,
        },
        sector: request.sector,
        bytes: request.bytes,
        stream: (request.stream != 0).then_some(StreamId(request.stream)),
        tgid: origin.tgid,
        pid: origin.pid,
        uid: origin.uid,
        comm: command_name(&origin.comm),
        inode: (origin.ino != 0).then_some(origin.ino),
        inode_device: (origin.ino != 0).then_some(DeviceNumber::from_kernel(origin.ino_dev)),
        queue_ns: event.queue_ns,
        service_ns: event.service_ns,
        error: event.error,
    })
}

/// Decodes one PLAYOUT record; `None` for a short record or a kind this daemon does not know
/// (from a newer eBPF object, which the build never pairs with it).
#[must_use]
pub(crate) fn decode_access(bytes: &[u8]) -> Option<StreamAccess> {
    let event: PlayoutEvent = read_record(bytes)?;
    let pages = || {
        event.first_page.saturating_mul(PAGE_BYTES)
            ..event.last_page.saturating_add(1).saturating_mul(PAGE_BYTES)
    };
    let access = match event.kind {
        playout_kind::READ => Access::Read(pages()),
        playout_kind::FAULT => Access::Fault(pages()),
        playout_kind::MISS => Access::Miss(pages()),
        playout_kind::QUEUED_LOW => Access::QueuedLow,
        playout_kind::FILLED => Access::Filled,
        playout_kind::URING_COMPLETE => Access::UringComplete {
            ioprio: u16::try_from(event.ioprio).unwrap_or(u16::MAX),
            latency_ns: event.latency_ns,
        },
        _ => return None,
    };
    Some(StreamAccess {
        file_tag: event.stream,
        at: MonotonicNs(event.ts_ns),
        reader: Reader {
            tgid: event.tgid,
            pid: event.pid,
            uid: event.uid,
            command: command_name(&event.comm),
        },
        access,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw<T>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain #[repr(C)] value.
        unsafe {
            std::slice::from_raw_parts(std::ptr::from_ref(value).cast::<u8>(), size_of::<T>())
        }
        .to_vec()
    }

    fn event(kind: u32) -> PlayoutEvent {
        let mut comm = [0u8; COMM_LEN];
        comm[..6].copy_from_slice(b"player");
        PlayoutEvent {
            ts_ns: 5,
            stream: 3,
            first_page: 2,
            last_page: 3,
            tgid: 10,
            pid: 11,
            kind,
            uid: 1000,
            comm,
            ..PlayoutEvent::default()
        }
    }

    #[test]
    fn every_kind_decodes_to_its_access_with_byte_ranges() {
        let read = decode_access(&raw(&event(playout_kind::READ))).expect("read");
        assert_eq!(read.access, Access::Read(8192..16384));
        assert_eq!(read.reader.command, "player");
        assert_eq!(
            (read.file_tag, read.at, read.reader.pid),
            (3, MonotonicNs(5), 11)
        );
        let miss = decode_access(&raw(&event(playout_kind::MISS))).expect("miss");
        assert_eq!(miss.access, Access::Miss(8192..16384));
        let fault = decode_access(&raw(&event(playout_kind::FAULT))).expect("fault");
        assert_eq!(fault.access, Access::Fault(8192..16384));
        let low = decode_access(&raw(&event(playout_kind::QUEUED_LOW))).expect("low");
        assert_eq!(low.access, Access::QueuedLow);
        let mut uring = event(playout_kind::URING_COMPLETE);
        uring.ioprio = 0x2004;
        uring.latency_ns = 99;
        assert_eq!(
            decode_access(&raw(&uring)).expect("uring").access,
            Access::UringComplete {
                ioprio: 0x2004,
                latency_ns: 99
            }
        );
    }

    #[test]
    fn short_records_and_unknown_kinds_are_dropped() {
        let bytes = raw(&event(playout_kind::READ));
        assert!(decode_access(&bytes[..bytes.len() - 1]).is_none());
        assert!(decode_access(&raw(&event(77))).is_none());
        assert!(decode_request(&[0u8; 3]).is_none());
    }

    #[test]
    fn a_fork_record_decodes_with_its_raise_and_a_daemon_entry_is_no_inherited_one() {
        let raise = RaisedThread {
            root: 7,
            previous: 0x4005,
            applied: 0x2000,
            flags: raised_flags::INHERITED | raised_flags::SHARES_IO_CONTEXT,
            generation: 0,
            stream: 3,
            started_ns: 5,
        };
        let event = ForkEvent {
            ts_ns: 9,
            parent: 8,
            child: 12,
            raise,
        };
        let fork = decode_fork(&raw(&event)).expect("fork");
        assert_eq!((fork.at, fork.parent, fork.child), (MonotonicNs(9), 8, 12));
        assert_eq!(
            fork.raise,
            InheritedRaise {
                root: 7,
                file_tag: 3,
                previous: 0x4005,
                applied: 0x2000,
                shares_io_context: true,
                over_bound: false,
                noted: true,
                started_ns: 5,
            }
        );
        let past = RaisedThread {
            flags: raise.flags | raised_flags::OVER_BOUND,
            ..raise
        };
        assert!(inherited_raise(&past).is_some_and(|past| past.over_bound && !past.noted));
        let unnoted = RaisedThread {
            flags: raise.flags | raised_flags::UNNOTED,
            ..raise
        };
        assert!(inherited_raise(&unnoted).is_some_and(|task| !task.noted && !task.over_bound));
        let own = RaisedThread { flags: 0, ..raise };
        assert_eq!(inherited_raise(&own), None);
        assert!(decode_fork(&raw(&event)[..size_of::<ForkEvent>() - 1]).is_none());
    }

    #[test]
    fn command_names_stop_at_the_first_nul_or_the_end() {
        let mut comm = [b'x'; COMM_LEN];
        assert_eq!(command_name(&comm).len(), COMM_LEN);
        comm[2] = 0;
        assert_eq!(command_name(&comm), "xx");
    }
}
