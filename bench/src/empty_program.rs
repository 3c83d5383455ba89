//! The floor of the kernel's BPF statistics: an empty program (`r0 = 0; exit`) on a raw
//! tracepoint, and what the statistics charge it per run. The kernel times every run with two
//! `sched_clock()` reads around the program, so even a program that does nothing shows a few
//! tens of ns on a virtual machine; the overhead benchmark measures that floor under the same
//! load, so the programs' own work can be told from the clock's.
//!
//! Plain `bpf(2)` calls (the harness does not link aya): `BPF_PROG_LOAD` of two hand-assembled
//! instructions, `BPF_RAW_TRACEPOINT_OPEN`, `BPF_OBJ_GET_INFO_BY_FD` for the run count and time,
//! and `BPF_ENABLE_STATS` for the window. Needs root; Linux 5.8 or newer.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::Context as _;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_ENABLE_STATS: libc::c_long = 32;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_STATS_RUN_TIME: u32 = 0;

/// `mov64 r0, 0` and `exit`, as `struct bpf_insn` (code, registers, offset, immediate).
const EMPTY: [u64; 2] = [0xb7, 0x95];

/// `union bpf_attr` for `BPF_PROG_LOAD`, up to the program name; the rest stays zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    tail: [u64; 8],
}

/// `union bpf_attr` for `BPF_RAW_TRACEPOINT_OPEN`.
#[repr(C)]
#[derive(Default)]
struct RawTracepointOpen {
    name: u64,
    prog_fd: u32,
    pad: u32,
    cookie: u64,
}

/// `union bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
#[derive(Default)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// `union bpf_attr` for `BPF_ENABLE_STATS`.
#[repr(C)]
#[derive(Default)]
struct EnableStats {
    kind: u32,
}

/// `bpf(2)`; a returned descriptor is owned.
fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, zero-padded `union bpf_attr` prefix of the size passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            std::mem::size_of::<T>(),
        )
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

fn owned_fd(fd: libc::c_long) -> anyhow::Result<OwnedFd> {
    let fd = i32::try_from(fd).context("bpf(2) returned no descriptor")?;
    // SAFETY: the kernel just returned this descriptor to us, and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An empty program attached to a raw tracepoint; detached and unloaded on drop.
#[derive(Debug)]
pub struct EmptyProgram {
    program: OwnedFd,
    _link: OwnedFd,
}

impl EmptyProgram {
    /// Loads the empty program and attaches it to `tracepoint` (e.g. `block_rq_issue`).
    pub fn attach(tracepoint: &str) -> anyhow::Result<Self> {
        let license = c"GPL";
        let mut name = [0u8; 16];
        name[..11].copy_from_slice(b"abiss_floor");
        let mut load = ProgLoad {
            prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
            insn_cnt: 2,
            insns: EMPTY.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            ..ProgLoad::default()
        };
        let program =
            owned_fd(bpf(BPF_PROG_LOAD, &mut load).context("cannot load an empty BPF program")?)?;
        let tracepoint_name = CString::new(tracepoint)?;
        let mut open = RawTracepointOpen {
            name: tracepoint_name.as_ptr() as u64,
            prog_fd: u32::try_from(program.as_raw_fd())?,
            ..RawTracepointOpen::default()
        };
        let link = owned_fd(
            bpf(BPF_RAW_TRACEPOINT_OPEN, &mut open)
                .with_context(|| format!("cannot attach an empty BPF program to {tracepoint}"))?,
        )?;
        Ok(Self {
            program,
            _link: link,
        })
    }

    /// (runs, run time in ns) so far, as counted while statistics were on.
    pub fn runs(&self) -> anyhow::Result<(u64, u64)> {
        // `struct bpf_prog_info`: run_time_ns at byte 192, run_cnt at 200.
        let mut info = [0u64; 32];
        let mut attr = InfoByFd {
            bpf_fd: u32::try_from(self.program.as_raw_fd())?,
            info_len: u32::try_from(std::mem::size_of_val(&info))?,
            info: info.as_mut_ptr() as u64,
        };
        bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).context("cannot read the program's statistics")?;
        Ok((info[25], info[24]))
    }
}

/// Switches the kernel's BPF run-time statistics on until the returned descriptor is dropped.
pub fn enable_stats() -> anyhow::Result<OwnedFd> {
    let mut attr = EnableStats {
        kind: BPF_STATS_RUN_TIME,
    };
    owned_fd(bpf(BPF_ENABLE_STATS, &mut attr).context("cannot switch on BPF statistics")?)
}
