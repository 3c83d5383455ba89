//! abiss eBPF programs: block-layer request tracing and stream tagging.
//!
//! The programs hold no policy. They follow each block request from its first sight (insert or
//! issue) to its completion, tag it with the stream whose attached file its pages belong to
//! (whichever task submits it), attribute it to the task that submitted its first bio, and add
//! its queue and service time to per-CPU log2 histograms keyed by (device, operation, I/O
//! priority, stream). They report reads, faults, page-cache misses and `io_uring` requests on
//! attached files to the daemon. The daemon reads the maps and decides.
//!
//! Eleven programs on BTF tracepoints, by subsystem; the subsystem modules use `maps` and
//! `kernel` and never each other:
//!
//! | module | what |
//! | --- | --- |
//! | `block` | `block_rq_insert`, `block_rq_issue`, `block_rq_complete`, `block_rq_merge`, `block_rq_requeue`: requests on followed disks (managed, or all while a client traces every disk) traced, tagged, added to the latency histograms and sent as events |
//! | `page_cache` | `mm_filemap_get_pages`, `mm_filemap_fault`, `page_cache_sync_ra`: reads, faults and misses of attached files |
//! | `io_uring` | `io_uring_submit_req`, `io_uring_complete`: `io_uring` requests on attached files |
//! | `fork` | `sched_process_fork`: tasks made by threads abissd raised, for it to put back |
//! | `kernel` | helpers shared by the subsystems: kernel field reads, the clock, inode and attached-file lookups, reporting to `PLAYOUT` |
//! | `maps` | every map shared with abissd, and the `KERNEL_LAYOUT` global |
//!
//! Kernel struct offsets come from `KERNEL_LAYOUT`, which `abissd` fills in from the running
//! kernel's BTF before loading (Rust eBPF has no CO-RE field relocations).
#![no_std]
#![no_main]
// BPF's atomic add, for a count several CPUs may add to at once (see `fork`).
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "core::intrinsics::atomic_xadd is BPF's atomic add; core's atomics need CAS"
)]

mod block;
mod fork;
mod io_uring;
mod kernel;
mod maps;
mod page_cache;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[no_mangle]
#[link_section = "license"]
static LICENSE: [u8; 4] = *b"GPL\0";
