//! C ABI of abiss, after the ABISS slides' application API ("API: request ABISS service on
//! file", "API: update playout point"): `abiss_fopen(path, mode, byterate, app_buffer)`
//! attaches a file to `abissd` with a guaranteed byterate and a playout buffer, `abiss_fread`
//! reads it like `fread` and tells the daemon the playout point, `abiss_position` sends the
//! slides' "position" message explicitly, and `abiss_fclose` detaches it.
//!
//! Built as `libabiss.so` and `libabiss.a`; the declarations are in `include/abiss.h`. Every
//! function is implemented on [`abiss_client`]: this crate adds no protocol of its own. Failures
//! return the documented error value, set `errno`, and leave a one-sentence message for
//! `abiss_strerror` on the calling thread. NULL pointers and out-of-range arguments fail with
//! `EINVAL`; nothing panics across the boundary. Needs a running `abissd`, so Linux 5.15 or
//! later with BTF; on kernels without read tracking (before 6.12) the position messages this
//! library sends keep the guarantee (docs/kernels.md).
//!
//! An `ABISS_FILE` may be used by one thread at a time (as with `FILE` under
//! `flockfile`): the library does not lock it.
//!
//! | concern | module |
//! | --- | --- |
//! | the `extern "C"` entry points (`abiss_fopen` … `abiss_strerror`) and `struct abiss_options` ([`AbissOptions`]) | crate root (`lib.rs`) |
//! | the handle behind `ABISS_FILE`: stdio's position, end-of-file and error state ([`AbissStdioFile`]) | `stream` |
//! | how a failure reaches C: `errno` and the per-thread message | `failure` |
//! | the entry points without a daemon: argument checks, NULL handles, errno (tests only) | `tests` |
#![deny(missing_docs)]

mod failure;
mod stream;

use std::ffi::{c_char, c_int, c_long, c_ulong, c_void, CStr};

use abiss_client::Client;

use crate::failure::{entry_point, Failure};
use crate::stream::OpenOptions;
pub use crate::stream::{AbissStdioFile, DEFAULT_APP_BUFFER_BYTES};

/// `struct abiss_options` of `abiss.h`: what [`abiss_fopen_opts`] asks for beyond the path,
/// mode and rate. Every field is a `size_t`, `long` or `unsigned long`, so the struct has no
/// padding on Linux's ILP32 and LP64 ABIs: no uninitialised bytes a later version could
/// mistake for a field it added.
///
/// Versions: `size` is the size of the struct the caller was compiled with
/// (`ABISS_OPTIONS_INIT` sets it). A later library that adds fields at the end reads the
/// fields `size` covers and takes the defaults for the others; this one refuses a larger
/// struct whose extra bytes are not all zero (`E2BIG`), since it cannot do what they ask.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbissOptions {
    /// `sizeof(struct abiss_options)` as the caller's header declared it.
    pub size: usize,
    /// Playout buffer in bytes, 0 for [`DEFAULT_APP_BUFFER_BYTES`] (`abiss_fopen`'s
    /// `app_buffer`).
    pub app_buffer: c_long,
    /// Bytes of the file's head loaded at once when a read stream starts, beyond the buffer
    /// (a player's start-up probe); 0 for none.
    pub preroll: c_long,
    /// `ABISS_*` flags; none is defined yet, so it must be 0.
    pub flags: c_ulong,
}

impl Default for AbissOptions {
    /// `ABISS_OPTIONS_INIT`: this version's size, every option at its default.
    fn default() -> Self {
        Self {
            size: OPTIONS_SIZE_V1,
            app_buffer: 0,
            preroll: 0,
            flags: 0,
        }
    }
}

/// The size of the first published `struct abiss_options`: nothing smaller is one.
const OPTIONS_SIZE_V1: usize = std::mem::size_of::<AbissOptions>();

/// The largest `size` taken for a struct of a later version; a larger one is a struct whose
/// `size` was never set (not initialised with `ABISS_OPTIONS_INIT`), and reading that far
/// past it could fault.
const OPTIONS_SIZE_MAX: usize = 4096;

/// The options behind `opts`, NULL meaning the defaults, checked for their size (see
/// [`AbissOptions`]); their values are checked by `stream::open`.
///
/// # Safety
/// `opts` is NULL or points to a `struct abiss_options` whose `size` bytes are readable.
unsafe fn read_options(opts: *const AbissOptions) -> Result<OpenOptions, Failure> {
    if opts.is_null() {
        return Ok(OpenOptions::default());
    }
    // SAFETY: a non-NULL opts starts with its size field; only that field is read here.
    let size = unsafe { std::ptr::addr_of!((*opts).size).read() };
    if !(OPTIONS_SIZE_V1..=OPTIONS_SIZE_MAX).contains(&size) {
        return Err(Failure::invalid(format!(
            "the options' size is {size}, not that of a struct abiss_options ({OPTIONS_SIZE_V1} bytes here); initialise them with ABISS_OPTIONS_INIT"
        )));
    }
    // SAFETY: the caller's struct has `size` readable bytes, at least this version's.
    let (options, later) = unsafe {
        (
            opts.read(),
            std::slice::from_raw_parts(
                opts.cast::<u8>().add(OPTIONS_SIZE_V1),
                size - OPTIONS_SIZE_V1,
            ),
        )
    };
    if later.iter().any(|&byte| byte != 0) {
        return Err(Failure::new(
            libc::E2BIG,
            format!(
                "the options ({size} bytes) set fields this libabiss ({OPTIONS_SIZE_V1} bytes) does not know; link a newer libabiss or leave those fields 0"
            ),
        ));
    }
    Ok(OpenOptions {
        app_buffer: long(options.app_buffer),
        preroll: long(options.preroll),
        flags: ulong(options.flags),
    })
}

/// A C `long` as `i64`.
#[allow(
    clippy::useless_conversion,
    reason = "long is i64 here but i32 on 32-bit targets"
)]
fn long(value: c_long) -> i64 {
    i64::from(value)
}

/// A C `unsigned long` as `u64`.
#[allow(
    clippy::useless_conversion,
    reason = "unsigned long is u64 here but u32 on 32-bit targets"
)]
fn ulong(value: c_ulong) -> u64 {
    u64::from(value)
}

/// The handle behind a non-NULL `fp`, or `EINVAL`.
///
/// # Safety
/// `fp` is NULL or a pointer returned by [`abiss_fopen`] and not yet closed, used by no other
/// thread during the call.
unsafe fn handle<'a>(fp: *mut AbissStdioFile) -> Result<&'a mut AbissStdioFile, Failure> {
    // SAFETY: per this function's contract, a non-NULL fp is a live, exclusive handle.
    unsafe { fp.as_mut() }.ok_or_else(|| Failure::invalid("the ABISS_FILE pointer is NULL"))
}

/// The bytes of an `fread`/`fwrite` buffer of `nmemb` items of `size` bytes: `None` when there
/// is nothing to move, `EINVAL` for a NULL buffer or a size that does not fit in memory.
fn buffer_bytes(null: bool, size: usize, nmemb: usize) -> Result<Option<usize>, Failure> {
    if size == 0 || nmemb == 0 {
        return Ok(None);
    }
    if null {
        return Err(Failure::invalid("the buffer pointer is NULL"));
    }
    size.checked_mul(nmemb)
        .filter(|&bytes| isize::try_from(bytes).is_ok())
        .map(Some)
        .ok_or_else(|| {
            Failure::invalid(format!(
                "{nmemb} items of {size} bytes do not fit in one buffer"
            ))
        })
}

/// A C string argument, or `EINVAL` when NULL.
///
/// # Safety
/// `text` is NULL or points to a NUL-terminated string that lives through the call.
unsafe fn c_string<'a>(text: *const c_char, name: &str) -> Result<&'a CStr, Failure> {
    if text.is_null() {
        return Err(Failure::invalid(format!("the {name} pointer is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per this function's contract.
    Ok(unsafe { CStr::from_ptr(text) })
}

/// Opens `path` for reading (`mode` "r") and attaches it to `abissd` (socket from
/// `ABISS_SOCKET`, else `/run/abiss/abiss.sock`) at `byterate` bytes/s with a playout buffer of
/// `app_buffer` bytes (0: [`DEFAULT_APP_BUFFER_BYTES`]); or, with "w" (truncate) or "a"
/// (append), opens it for writing, created if missing, as a recording whose dirty pages abissd
/// writes back `app_buffer` behind the writer ([`abiss_fwrite`]). Returns NULL with `errno` set
/// on failure. [`abiss_fopen_opts`] with only `app_buffer` set.
///
/// # Safety
/// `path` and `mode` are NULL or NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fopen(
    path: *const c_char,
    mode: *const c_char,
    byterate: c_long,
    app_buffer: c_long,
) -> *mut AbissStdioFile {
    let options = AbissOptions {
        app_buffer,
        ..AbissOptions::default()
    };
    // SAFETY: the caller passes NULL or NUL-terminated strings; the options are this
    // version's struct.
    unsafe { abiss_fopen_opts(path, mode, byterate, &raw const options) }
}

/// [`abiss_fopen`] with the options of a `struct abiss_options` ([`AbissOptions`]; NULL for
/// the defaults): the buffer, a start-up preroll for a read stream, flags. Returns NULL with
/// `errno` set on failure.
///
/// # Safety
/// `path` and `mode` are NULL or NUL-terminated strings; `opts` is NULL or points to a
/// `struct abiss_options` whose `size` bytes are readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fopen_opts(
    path: *const c_char,
    mode: *const c_char,
    byterate: c_long,
    opts: *const AbissOptions,
) -> *mut AbissStdioFile {
    entry_point(std::ptr::null_mut(), || {
        // SAFETY: the caller passes NULL or NUL-terminated strings, and NULL or options of
        // their declared size.
        let (path, mode, options) = unsafe {
            (
                c_string(path, "path")?,
                c_string(mode, "mode")?,
                read_options(opts)?,
            )
        };
        let file = stream::open(path, mode, long(byterate), options, Client::connect_default)?;
        Ok(Box::into_raw(Box::new(file)))
    })
}

/// Reads up to `nmemb` items of `size` bytes into `ptr`, as `fread`: returns the number of
/// whole items read, fewer only at the end of the file or on an error (`errno` set, see
/// [`abiss_ferror`]). Bytes of a partial last item are stored and consumed.
///
/// # Safety
/// `ptr` is NULL or points to `size * nmemb` writable bytes; `fp` is NULL or an open handle
/// no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fread(
    ptr: *mut c_void,
    size: usize,
    nmemb: usize,
    fp: *mut AbissStdioFile,
) -> usize {
    entry_point(0, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        let Some(bytes) = buffer_bytes(ptr.is_null(), size, nmemb)? else {
            return Ok(0);
        };
        let ptr = ptr.cast::<u8>();
        // SAFETY: the caller's buffer holds `bytes` writable bytes. Zeroing them first makes
        // every byte initialized, so the slice below is a valid `&mut [u8]`.
        let buffer = unsafe {
            ptr.write_bytes(0, bytes);
            std::slice::from_raw_parts_mut(ptr, bytes)
        };
        Ok(file.read_fully(buffer) / size)
    })
}

/// Writes `nmemb` items of `size` bytes from `ptr` to a stream opened to record (`"w"`,
/// `"a"`), as `fwrite`: returns the number of whole items written, fewer only on an error
/// (`errno` set, see [`abiss_ferror`]; `EBADF` for a stream opened to read).
///
/// # Safety
/// `ptr` is NULL or points to `size * nmemb` readable bytes; `fp` is NULL or an open handle
/// no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fwrite(
    ptr: *const c_void,
    size: usize,
    nmemb: usize,
    fp: *mut AbissStdioFile,
) -> usize {
    entry_point(0, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        let Some(bytes) = buffer_bytes(ptr.is_null(), size, nmemb)? else {
            return Ok(0);
        };
        // SAFETY: the caller's buffer holds `bytes` readable, initialized bytes.
        let data = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), bytes) };
        Ok(file.write_fully(data) / size)
    })
}

/// Moves the read position as `fseek` (`whence` is `SEEK_SET`, `SEEK_CUR` or `SEEK_END`) and
/// tells the daemon the new playout point; clears the end-of-file flag. Returns 0, or -1 with
/// `errno` set.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fseek(
    fp: *mut AbissStdioFile,
    offset: c_long,
    whence: c_int,
) -> c_int {
    entry_point(-1, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        file.seek(long(offset), whence)?;
        Ok(0)
    })
}

/// The read position in bytes, or -1 with `errno` set.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_ftell(fp: *mut AbissStdioFile) -> c_long {
    entry_point(-1, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        c_long::try_from(file.position()).map_err(|_| {
            Failure::new(
                libc::EOVERFLOW,
                format!("the position {} does not fit in a long", file.position()),
            )
        })
    })
}

/// Tells the daemon the playout point explicitly (the slides' "position" message) without
/// moving the read position: the daemon keeps the playout buffer loaded from `offset` on.
/// Returns 0, or -1 with `errno` set.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_position(fp: *mut AbissStdioFile, offset: c_long) -> c_int {
    entry_point(-1, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        let offset = u64::try_from(offset).map_err(|_| {
            Failure::invalid(format!(
                "the playout point {offset} is before the file's start"
            ))
        })?;
        file.set_playout_point(offset)?;
        Ok(0)
    })
}

/// Gives the stream another guaranteed rate, `byterate` bytes per second (fast-forward, slow
/// motion), if its disk admits it; its buffer stays. Returns 0, or -1 with `errno` set
/// (`EINVAL` for a rate outside 1 B/s to 1 TB/s, `EBUSY` when the disk cannot take it); the
/// stream then keeps its rate.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_set_rate(fp: *mut AbissStdioFile, byterate: c_long) -> c_int {
    entry_point(-1, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        let rate = u64::try_from(byterate)
            .ok()
            .filter(|rate| *rate > 0)
            .ok_or_else(|| Failure::invalid(format!("a rate of {byterate} B/s is not positive")))?;
        file.set_rate(abiss_proto::ByteRate(rate))?;
        Ok(0)
    })
}

/// The daemon's id of the stream, or -1 with `errno` set.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_stream_id(fp: *mut AbissStdioFile) -> c_long {
    entry_point(-1, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        c_long::try_from(file.stream_id()).map_err(|_| {
            Failure::new(
                libc::EOVERFLOW,
                format!("stream id {} does not fit in a long", file.stream_id()),
            )
        })
    })
}

/// Nonzero once a read reached the end of the file (until a seek); 0 otherwise, and 0 with
/// `errno` `EINVAL` for NULL.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_feof(fp: *mut AbissStdioFile) -> c_int {
    entry_point(0, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        Ok(c_int::from(file.at_eof()))
    })
}

/// Nonzero once a read failed; 0 otherwise, and 0 with `errno` `EINVAL` for NULL.
///
/// # Safety
/// `fp` is NULL or an open handle no other thread uses during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_ferror(fp: *mut AbissStdioFile) -> c_int {
    entry_point(0, || {
        // SAFETY: the caller passes NULL or an open, unshared handle.
        let file = unsafe { handle(fp) }?;
        Ok(c_int::from(file.failed()))
    })
}

/// Detaches the stream, closes the file and frees the handle, which is invalid afterwards
/// even when this fails. Returns 0, or `EOF` (-1) with `errno` set.
///
/// # Safety
/// `fp` is NULL or an open handle that no other thread uses, now or later.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn abiss_fclose(fp: *mut AbissStdioFile) -> c_int {
    entry_point(libc::EOF, || {
        if fp.is_null() {
            return Err(Failure::invalid("the ABISS_FILE pointer is NULL"));
        }
        // SAFETY: fp came from Box::into_raw in abiss_fopen_opts and is given back exactly once.
        let file = unsafe { Box::from_raw(fp) };
        file.close()?;
        Ok(0)
    })
}

/// The message of the last failed abiss call on this thread, one sentence; valid until the
/// next failure on this thread. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn abiss_strerror() -> *const c_char {
    failure::last_message()
}

#[cfg(test)]
mod tests;
