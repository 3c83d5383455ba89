//! Helpers shared by the programs of more than one subsystem: kernel field reads (`layout!`,
//! `field`, `read`), the clock, inode lookups (a bio's, an inode pointer's, a direct I/O's),
//! the attached-file lookups in `ATTACHED`, and the reporting path to the `PLAYOUT` ring.
//!
//! No tracepoints here. Every helper stays `#[inline(always)]`, as before the split: each one
//! is inlined into the programs that call it, so every program is a single function.

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_uid_gid,
    bpf_probe_read_kernel, generated::bpf_ktime_get_ns,
};
use aya_ebpf::maps::HashMap;
use scheduler_common::{
    raised_flags, AttachedFile, FileKey, FileReader, PlayoutEvent, RaiseCounts, RaisedThread,
    MAX_FILE_READERS_PER_USER,
};

use crate::maps::{
    ATTACHED, CONTROL, FILE_READERS, PLAYOUT, RAISED, RAISED_CONTEXTS, RAISE_COUNTS, READER_GIVEN,
    READER_USERS,
};

/// `PF_KTHREAD`: the task is a kernel thread.
pub(crate) const PF_KTHREAD: u32 = 0x0020_0000;

/// The offset (or other value) `$field` of `KERNEL_LAYOUT`, as the running kernel has it.
macro_rules! layout {
    ($field:ident) => {{
        // Some callers use it inside their own `unsafe` block, where this one is redundant.
        #[allow(unused_unsafe)]
        // SAFETY: reading a plain u32 from the program's own read-only data.
        let value =
            unsafe { core::ptr::read_volatile(&raw const $crate::maps::KERNEL_LAYOUT.$field) };
        value
    }};
}
pub(crate) use layout;

/// Loads a field of a BTF-typed kernel pointer (a tracepoint argument, or a pointer loaded from
/// one). The offsets live in frozen read-only data, so the verifier knows them as constants and
/// checks each access against the kernel's BTF; the load is a plain instruction with fault
/// handling, several times cheaper than a `bpf_probe_read_kernel` call.
#[inline(always)]
pub(crate) fn field<T: Copy>(base: u64, offset: u32) -> T {
    // SAFETY: verified by the kernel against BTF; faults read as zero.
    unsafe { core::ptr::read_volatile((base + u64::from(offset)) as *const T) }
}

/// Reads a `T` at `base + offset` where `base` was computed (not loaded from a typed field), so
/// the verifier cannot type it.
#[inline(always)]
pub(crate) fn read<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely on bad addresses and returns an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
}

#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// Inode number and filesystem device of the file a bio reads or writes, if any: through the
/// kiocb of an iomap direct I/O, else through the page-cache page the bio starts with.
#[inline(always)]
pub(crate) fn bio_inode(bio: u64) -> (u64, u32) {
    if bio == 0 {
        return (0, 0);
    }
    // Direct I/O first: two plain loads tell it (a function pointer and a `void *` read as
    // numbers, which the verifier allows), where the page route would cost two probe reads
    // only to find user memory.
    let end_io = layout!(iomap_dio_end_io);
    if end_io != 0 && field::<u64>(bio, layout!(bio_end_io)) == end_io {
        return direct_io_inode(field(bio, layout!(bio_private)));
    }
    let vec: u64 = field(bio, layout!(bio_io_vec));
    if vec == 0 {
        return (0, 0);
    }
    let mut page: u64 = field(vec, layout!(bvec_page));
    if page == 0 {
        return (0, 0);
    }
    // A tail page of a large folio points to its head with bit 0 set; the head has the mapping.
    // Read as a number: the verifier types this union slot as `lru.next`, a pointer.
    let head = read::<u64>(page, layout!(page_compound_head)).unwrap_or(0);
    if head & 1 == 1 {
        page = head - 1;
    }
    // From here on the pointers are read as plain numbers: the mapping's low bits must be
    // tested, which the verifier forbids on typed pointers.
    let Some(mapping) = read::<u64>(page, layout!(page_mapping)) else {
        return (0, 0);
    };
    // Anonymous and KSM pages (direct I/O into user memory, other than iomap's) tag the low
    // bits: no file to find.
    if mapping == 0 || mapping & 3 != 0 {
        return (0, 0);
    }
    let Some(inode) = read::<u64>(mapping, layout!(mapping_host)) else {
        return (0, 0);
    };
    inode_key(inode)
}

/// Inode number and filesystem device of an inode (an untyped pointer).
#[inline(always)]
pub(crate) fn inode_key(inode: u64) -> (u64, u32) {
    let ino = read::<u64>(inode, layout!(inode_ino)).unwrap_or(0);
    let dev = read::<u64>(inode, layout!(inode_sb))
        .and_then(|sb| read::<u32>(sb, layout!(sb_dev)))
        .unwrap_or(0);
    (ino, dev)
}

/// The file of an iomap direct I/O (ext4, xfs, btrfs …), from its bio's `bi_private`: the
/// bio completes in `iomap_dio_bio_end_io` with `bi_private` pointing at its `iomap_dio`,
/// whose kiocb names the file, whether read(2) or `io_uring` issued it.
#[inline(always)]
fn direct_io_inode(dio: u64) -> (u64, u32) {
    let inode = read::<u64>(dio, layout!(iomap_dio_iocb))
        .and_then(|iocb| read::<u64>(iocb, layout!(kiocb_filp)))
        .and_then(|file| read::<u64>(file, layout!(file_inode)));
    match inode {
        Some(inode) => inode_key(inode),
        None => (0, 0),
    }
}

/// The stream an inode belongs to, if its file is attached. `inode` is a BTF-typed pointer.
#[inline(always)]
pub(crate) fn attached_stream(inode: u64) -> Option<AttachedFile> {
    if inode == 0 {
        return None;
    }
    let sb: u64 = field(inode, layout!(inode_sb));
    if sb == 0 {
        return None;
    }
    attached_file((field(inode, layout!(inode_ino)), field(sb, layout!(sb_dev))))
}

/// The stream of file (inode number, filesystem device), if it is attached.
#[inline(always)]
pub(crate) fn attached_file((ino, dev): (u64, u32)) -> Option<AttachedFile> {
    if ino == 0 {
        return None;
    }
    let key = FileKey { dev, pad: 0, ino };
    // SAFETY: pointer to a live map value, copied.
    ATTACHED.get_ptr(key).map(|found| unsafe { *found })
}

/// Sends `event` about the current task, a reader of the event's stream, and remembers its
/// process as one; abissd's own tasks are no readers.
#[inline(always)]
pub(crate) fn report_reader(event: PlayoutEvent) {
    let Some((tgid, pid)) = current_task_unless_daemon() else {
        return;
    };
    remember_reader(tgid, event.stream);
    report(PlayoutEvent {
        ts_ns: now_ns(),
        tgid,
        pid,
        ..event
    });
}

/// The current task as (tgid, pid), unless it is abissd itself.
#[inline(always)]
pub(crate) fn current_task_unless_daemon() -> Option<(u32, u32)> {
    let daemon_tgid = CONTROL.get(0).map_or(0, |control| control.daemon_tgid);
    current_task_unless(daemon_tgid)
}

/// The current task as (tgid, pid), unless its process is `daemon_tgid` (abissd, as the
/// caller read it from `CONTROL`).
#[inline(always)]
pub(crate) fn current_task_unless(daemon_tgid: u32) -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    #[expect(clippy::cast_possible_truncation, reason = "the helper packs two u32s")]
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    (tgid != daemon_tgid).then_some((tgid, pid))
}

/// Whether any file is attached: while none is, the page-cache and `io_uring` programs return
/// at once (one read of `CONTROL`, an array the JIT inlines).
#[inline(always)]
pub(crate) fn files_attached() -> bool {
    CONTROL
        .get(0)
        .is_some_and(|control| control.attached_files != 0)
}

/// Sends one event about an attached file to abissd.
#[inline(always)]
pub(crate) fn report(event: PlayoutEvent) {
    if let Some(mut entry) = PLAYOUT.reserve::<PlayoutEvent>(0) {
        #[expect(clippy::cast_possible_truncation, reason = "the helper packs two u32s")]
        entry.write(PlayoutEvent {
            comm: bpf_get_current_comm().unwrap_or_default(),
            uid: bpf_get_current_uid_gid() as u32,
            ..event
        });
        entry.submit(0);
    }
}

/// Notes process `tgid` as a reader of `stream`'s file (a lookup, and an update only when
/// new), within its user's room: past `MAX_FILE_READERS_PER_USER` of one user's, the process is
/// not followed, and no other user's room is taken.
#[inline(always)]
fn remember_reader(tgid: u32, stream: u64) {
    if let Some(found) = FILE_READERS.get_ptr_mut(tgid) {
        // SAFETY: a live map value; the stream is one aligned u64.
        unsafe {
            if (*found).stream != stream {
                (*found).stream = stream;
            }
        }
        return;
    }
    #[expect(clippy::cast_possible_truncation, reason = "the low half is the uid")]
    let uid = bpf_get_current_uid_gid() as u32;
    let Some(count) = take_room(&READER_USERS, &READER_GIVEN, uid, MAX_FILE_READERS_PER_USER)
    else {
        return;
    };
    let reader = FileReader {
        stream,
        uid,
        pad: 0,
    };
    // Two CPUs making it at once make it once: the other gives its room back.
    if FILE_READERS
        .insert(tgid, reader, u64::from(BPF_NOEXIST))
        .is_err()
    {
        add_to(count, u64::MAX);
    }
}

/// Takes one of user `uid`'s room: adds one to its count in `added` (atomically), unless what
/// it holds, that count less what abissd gave back (`given`, which abissd alone writes), is past
/// `bound` already, in which case the one is taken back. The count, if the room was taken.
#[inline(always)]
pub(crate) fn take_room(
    added: &HashMap<u32, u64>,
    given: &HashMap<u32, u64>,
    uid: u32,
    bound: u64,
) -> Option<*mut u64> {
    let count = user_count(added, uid)?;
    add_to(count, 1);
    // SAFETY: a lookup of a plain u64, copied.
    let given = unsafe { given.get(&uid) }.copied().unwrap_or(0);
    // SAFETY: an aligned u64 of a live map value.
    if unsafe { count.read_volatile() }.saturating_sub(given) > bound {
        add_to(count, u64::MAX);
        return None;
    }
    Some(count)
}

/// User `uid`'s count in `counts`, made at its first use.
#[inline(always)]
fn user_count(counts: &HashMap<u32, u64>, uid: u32) -> Option<*mut u64> {
    if let Some(found) = counts.get_ptr_mut(uid) {
        return Some(found);
    }
    // Two CPUs making it at once make it once.
    let _ = counts.insert(uid, 0, u64::from(BPF_NOEXIST));
    counts.get_ptr_mut(uid)
}

/// Adds `delta` (wrapping: `u64::MAX` takes one away) to the count at `count`, with BPF's
/// atomic add (several CPUs count for one user at once; `core`'s atomics need compare and
/// swap, which this target lacks).
#[inline(always)]
pub(crate) fn add_to(count: *mut u64, delta: u64) {
    // SAFETY: an aligned u64 of a live map value.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(count, delta) };
}

/// The current task's I/O context (`task_struct.io_context`), if it has one.
#[inline(always)]
fn current_io_context() -> Option<u64> {
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    read::<u64>(task, layout!(task_io_context)).filter(|&context| context != 0)
}

/// Remembers the current thread's I/O context if abissd raised it, for
/// [`raise_of_shared_context`]. Called where a raised reader must be seen: its reads and
/// misses of an attached file (a raise idles out without them), and its own real-time
/// requests. One `CONTROL` read while nothing is raised.
#[inline(always)]
pub(crate) fn note_raised_context() {
    if CONTROL.get(0).map_or(0, |control| control.raised_threads) == 0 {
        return;
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the low half is the thread id"
    )]
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(raise) = RAISED.get_ptr_mut(tid) else {
        return;
    };
    remember_raised_context(tid, raise);
}

/// Remembers the current thread's I/O context: it is `tid`, raised as `raise` (its live
/// `RAISED` entry) says. The raise's counts keep the context too, so abissd can forget it with
/// the raise.
#[inline(always)]
pub(crate) fn remember_raised_context(tid: u32, raise: *const RaisedThread) {
    // SAFETY: pointer to a live map value of this type.
    let raise = unsafe { &*raise };
    // A task the raised thread made has an entry of its own (the fork program's).
    if raise.flags & raised_flags::INHERITED != 0 {
        return;
    }
    let Some(context) = current_io_context() else {
        return;
    };
    let Some(counts) = counts_of(tid) else {
        return;
    };
    // SAFETY: pointer to a live map value of this type.
    let counts = unsafe { &mut *counts };
    if counts.io_context != context {
        counts.io_context = context;
    }
    // SAFETY: pointer to a live map value, copied.
    if RAISED_CONTEXTS
        .get_ptr(context)
        .map(|found| unsafe { *found })
        != Some(tid)
    {
        let _ = RAISED_CONTEXTS.insert(context, tid, 0);
    }
}

/// Thread `tid`'s entry in `RAISED`, unless it is a task's entry (the fork program's) that
/// names another task than the one under that id now, which started at `started_ns()`: a
/// task's entry outlives the task until abissd sweeps it, and a task that takes the id in
/// between is not the one that started with the raise. Asked only of a task's entry.
#[inline(always)]
pub(crate) fn raised_entry(
    tid: u32,
    started_ns: impl FnOnce() -> u64,
) -> Option<*mut RaisedThread> {
    let entry = RAISED.get_ptr_mut(tid)?;
    // SAFETY: pointer to a live map value of this type, two fields read.
    let (flags, noted) = unsafe { ((*entry).flags, (*entry).started_ns) };
    if flags & raised_flags::INHERITED == 0 || noted == 0 || noted == started_ns() {
        Some(entry)
    } else {
        None
    }
}

/// When the current task started (`task_struct.start_boottime`); 0 if it cannot be read.
#[inline(always)]
pub(crate) fn current_started_ns() -> u64 {
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() };
    read::<u64>(task, layout!(task_start_boottime)).unwrap_or(0)
}

/// What the programs count of the raise of thread `root`, whose own `RAISED` entry the caller
/// found: its `RAISE_COUNTS` entry, made here at the first count. (Should abissd delete both
/// entries between the caller's look and this one, an entry is made for a raise that has
/// ended; abissd's sweep deletes such entries.)
#[inline(always)]
pub(crate) fn counts_of(root: u32) -> Option<*mut RaiseCounts> {
    if let Some(found) = RAISE_COUNTS.get_ptr_mut(root) {
        return Some(found);
    }
    // Two CPUs counting a new raise at once make it once.
    let _ = RAISE_COUNTS.insert(root, RaiseCounts::default(), u64::from(BPF_NOEXIST));
    RAISE_COUNTS.get_ptr_mut(root)
}

/// The raise of the thread whose I/O context the current task shares, if that thread is raised:
/// an `io_uring` worker or `SQPOLL` thread of a raised reader queues requests at its priority.
#[inline(always)]
pub(crate) fn raise_of_shared_context() -> Option<*mut RaisedThread> {
    raise_of_context(current_io_context()?)
}

/// The raise of the thread whose I/O context is `context`, if that thread is raised. The
/// raise's own record of its context must agree: a context freed and reused at the same
/// address by an unrelated task is not the raised thread's.
#[inline(always)]
pub(crate) fn raise_of_context(context: u64) -> Option<*mut RaisedThread> {
    // SAFETY: pointer to a live map value, copied.
    let root = RAISED_CONTEXTS
        .get_ptr(context)
        .map(|found| unsafe { *found })?;
    let raise = RAISED.get_ptr_mut(root)?;
    // SAFETY: pointer to a live map value of this type.
    let own = unsafe { &*raise };
    // SAFETY: as above, copied.
    let seen = RAISE_COUNTS
        .get_ptr(root)
        .map(|counts| unsafe { (*counts).io_context });
    (own.flags & raised_flags::INHERITED == 0 && seen == Some(context)).then_some(raise)
}
