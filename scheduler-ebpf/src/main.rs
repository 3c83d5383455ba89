//! abiss eBPF programs: block-layer request tracing and stream tagging.
//!
//! The programs hold no policy. They follow each block request from its first sight (insert or
//! issue) to its completion, tag it with the stream whose attached file its pages belong to
//! (whichever task submits it), attribute it to the task that submitted its first bio, and add
//! its queue and service time to per-CPU log2 histograms keyed by (device, operation, I/O
//! priority, stream). They report reads, faults, page-cache misses and `io_uring` requests on
//! attached files to the daemon. The daemon reads the maps and decides.
//!
//! Ten programs on BTF tracepoints, by subsystem:
//! - [`block`]: `block_rq_insert`, `block_rq_issue`, `block_rq_complete`, `block_rq_merge`,
//!   `block_rq_requeue`;
//! - [`page_cache`]: `mm_filemap_get_pages`, `mm_filemap_fault`, `page_cache_sync_ra`;
//! - [`io_uring`]: `io_uring_submit_req`, `io_uring_complete`.
//!
//! They share the maps in [`maps`] and the helpers in [`kernel`]; the subsystem modules use
//! those two and never each other.
//!
//! Kernel struct offsets come from `KERNEL_LAYOUT`, which `abissd` fills in from the running
//! kernel's BTF before loading (Rust eBPF has no CO-RE field relocations).
#![no_std]
#![no_main]

mod block;
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
