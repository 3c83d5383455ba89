//! The C entry points without a daemon: argument checks, NULL handles, errno and messages.

use std::ffi::{c_char, CStr};
use std::path::Path;
use std::ptr::null_mut;

use abiss_client::Client;

use super::*;

/// One entry point called with NULL, its result widened.
type Call<'a> = Box<dyn Fn() -> i64 + 'a>;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(value: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = value };
}

fn message() -> String {
    // SAFETY: abiss_strerror never returns NULL and the text lives until the next failure.
    unsafe { CStr::from_ptr(abiss_strerror()) }
        .to_string_lossy()
        .into_owned()
}

/// `abiss_fopen` with Rust strings; the errno and message of a failure.
fn fopen_failure(path: &CStr, mode: &CStr, byterate: c_long, app_buffer: c_long) -> (i32, String) {
    set_errno(0);
    // SAFETY: NUL-terminated strings.
    let fp = unsafe { abiss_fopen(path.as_ptr(), mode.as_ptr(), byterate, app_buffer) };
    assert!(fp.is_null(), "abiss_fopen({path:?}, {mode:?}) succeeded");
    (errno(), message())
}

/// `stream::open` against a socket where no daemon runs.
fn open_without_daemon(path: &CStr) -> Failure {
    let socket = Path::new("/nonexistent-abiss-test/abiss.sock");
    stream::open(path, c"r", 1_000_000, 0, || Client::connect(socket))
        .expect_err("no daemon, so no stream")
}

#[test]
fn null_pointers_fail_with_einval() {
    let fp: *mut AbissStdioFile = null_mut();
    let mut buffer = [0_u8; 16];
    let buffer = buffer.as_mut_ptr().cast();
    // SAFETY: every call gets NULL for a pointer it must check, and valid memory otherwise.
    unsafe {
        set_errno(0);
        assert!(abiss_fopen(std::ptr::null(), c"r".as_ptr(), 1000, 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(message().contains("path pointer is NULL"), "{}", message());
        set_errno(0);
        assert!(abiss_fopen(c"/etc/hostname".as_ptr(), std::ptr::null(), 1000, 0).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(message().contains("mode pointer is NULL"), "{}", message());
        let calls: [(&str, Call<'_>, i64); 8] = [
            (
                "abiss_fread",
                Box::new(|| i64::try_from(abiss_fread(buffer, 1, 16, fp)).unwrap_or(-2)),
                0,
            ),
            (
                "abiss_fseek",
                Box::new(|| i64::from(abiss_fseek(fp, 0, 0))),
                -1,
            ),
            ("abiss_ftell", Box::new(|| abiss_ftell(fp)), -1),
            (
                "abiss_position",
                Box::new(|| i64::from(abiss_position(fp, 0))),
                -1,
            ),
            ("abiss_stream_id", Box::new(|| abiss_stream_id(fp)), -1),
            ("abiss_feof", Box::new(|| i64::from(abiss_feof(fp))), 0),
            ("abiss_ferror", Box::new(|| i64::from(abiss_ferror(fp))), 0),
            ("abiss_fclose", Box::new(|| i64::from(abiss_fclose(fp))), -1),
        ];
        for (name, call, expected) in calls {
            set_errno(0);
            assert_eq!(call(), expected, "{name}(NULL)");
            assert_eq!(errno(), libc::EINVAL, "{name}(NULL) errno");
            assert!(
                message().contains("ABISS_FILE pointer is NULL"),
                "{name}: {}",
                message()
            );
        }
    }
}

#[test]
fn only_read_and_record_modes_are_accepted() {
    for mode in [c"r+", c"rb+", c"w+", c"a+", c"", c"rw", c"x", c"wr"] {
        let (errno, message) = fopen_failure(c"/etc/hostname", mode, 1_000_000, 0);
        assert_eq!(errno, libc::EINVAL, "mode {mode:?}");
        assert!(message.contains("not a stream mode"), "{message}");
    }
    for mode in [c"r", c"rb", c"re", c"rbe"] {
        // Past the mode check, the missing file is what fails.
        let (errno, _) = fopen_failure(c"/nonexistent-abiss-test", mode, 1_000_000, 0);
        assert_eq!(errno, libc::ENOENT, "mode {mode:?}");
    }
    for mode in [c"w", c"wb", c"a", c"ae"] {
        // A recording's file is created, but not in a directory that does not exist.
        let (errno, _) = fopen_failure(c"/nonexistent-abiss-dir/rec", mode, 1_000_000, 0);
        assert_eq!(errno, libc::ENOENT, "mode {mode:?}");
    }
}

#[test]
fn rates_and_buffers_out_of_range_fail_with_einval() {
    for rate in [0, -1, c_long::MIN] {
        let (errno, message) = fopen_failure(c"/etc/hostname", c"r", rate, 0);
        assert_eq!(errno, libc::EINVAL);
        assert!(message.contains("not positive"), "{message}");
    }
    let (errno, message) = fopen_failure(c"/etc/hostname", c"r", 1_000_000, -1);
    assert_eq!(errno, libc::EINVAL);
    assert!(message.contains("negative"), "{message}");
}

#[test]
fn paths_are_checked_before_the_daemon_is_asked() {
    let cases: [(&CStr, i32, &str); 4] = [
        (c"/nonexistent-abiss-test/file", libc::ENOENT, "cannot open"),
        (c"", libc::ENOENT, "path is empty"),
        (c"/", libc::EISDIR, "is a directory"),
        (c"/dev/null", libc::EINVAL, "not a regular file"),
    ];
    for (path, expected, words) in cases {
        let failure = open_without_daemon(path);
        assert_eq!(failure.errno, expected, "{path:?}: {}", failure.message);
        assert!(
            failure.message.contains(words),
            "{path:?}: {}",
            failure.message
        );
    }
}

#[test]
fn a_missing_daemon_is_econnrefused() {
    let manifest =
        std::ffi::CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).expect("no NUL");
    let failure = open_without_daemon(&manifest);
    assert_eq!(failure.errno, libc::ECONNREFUSED, "{}", failure.message);
    assert!(
        failure.message.contains("abissd is not running"),
        "{}",
        failure.message
    );
}

#[test]
fn the_message_is_per_thread_and_stays_until_the_next_failure() {
    std::thread::spawn(|| {
        assert_eq!(message(), "no abiss call has failed on this thread");
        let _ = fopen_failure(c"/", c"w+", 1, 0);
        let first: *const c_char = abiss_strerror();
        // Asking again neither replaces nor moves it.
        assert_eq!(abiss_strerror(), first);
        assert!(message().contains("not a stream mode"));
        std::thread::spawn(|| {
            assert_eq!(message(), "no abiss call has failed on this thread");
        })
        .join()
        .expect("inner thread");
        assert!(message().contains("not a stream mode"));
    })
    .join()
    .expect("thread");
}
