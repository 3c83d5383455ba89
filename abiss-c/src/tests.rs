//! The C entry points without a daemon: argument checks, NULL handles, errno and messages.

use std::ffi::{c_char, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{null, null_mut};

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

/// `abiss_fopen_opts` at 1 MB/s with Rust strings; the errno and message of a failure.
fn fopen_opts_failure(path: &CStr, mode: &CStr, opts: *const AbissOptions) -> (i32, String) {
    set_errno(0);
    // SAFETY: NUL-terminated strings; opts is NULL or points to at least its size's bytes.
    let fp = unsafe { abiss_fopen_opts(path.as_ptr(), mode.as_ptr(), 1_000_000, opts) };
    assert!(
        fp.is_null(),
        "abiss_fopen_opts({path:?}, {mode:?}) succeeded"
    );
    (errno(), message())
}

/// `stream::open` against a socket where no daemon runs.
fn open_without_daemon(path: &CStr) -> Failure {
    let socket = Path::new("/nonexistent-abiss-test/abiss.sock");
    stream::open(path, c"r", 1_000_000, OpenOptions::default(), || {
        Client::connect(socket)
    })
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
        let options = AbissOptions::default();
        set_errno(0);
        assert!(
            abiss_fopen_opts(std::ptr::null(), c"r".as_ptr(), 1000, &raw const options).is_null()
        );
        assert_eq!(errno(), libc::EINVAL);
        assert!(message().contains("path pointer is NULL"), "{}", message());
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
fn options_out_of_range_fail_with_einval_before_the_file_is_touched() {
    // The file is missing: were it looked at first, these would fail with ENOENT.
    let missing = c"/nonexistent-abiss-test";
    let cases = [
        (-1, 0, 0, "app_buffer of -1 bytes is negative"),
        (0, -1, 0, "preroll of -1 bytes is negative"),
        (0, c_long::MIN, 0, "is negative"),
        (0, 0, 4, "flags 0x4 are unknown"),
        (0, 0, 7, "flags 0x4 are unknown"),
        (0, 0, 1 << (c_ulong::BITS - 1), "are unknown"),
    ];
    for (app_buffer, preroll, flags, words) in cases {
        let options = AbissOptions {
            app_buffer,
            preroll,
            flags,
            ..AbissOptions::default()
        };
        let (errno, message) = fopen_opts_failure(missing, c"r", &raw const options);
        assert_eq!(errno, libc::EINVAL, "{options:?}: {message}");
        assert!(message.contains(words), "{options:?}: {message}");
    }
    // A recording has no preroll: refused before its file is created.
    let path = std::env::temp_dir().join(format!("abiss-c-preroll-{}", std::process::id()));
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    for mode in [c"w", c"a", c"wb"] {
        let options = AbissOptions {
            preroll: 1 << 20,
            ..AbissOptions::default()
        };
        let (errno, message) = fopen_opts_failure(&c_path, mode, &raw const options);
        assert_eq!(errno, libc::EINVAL, "{mode:?}: {message}");
        assert!(
            message.contains("recording has no preroll"),
            "{mode:?}: {message}"
        );
        assert!(!path.exists(), "{mode:?} created {}", path.display());
        // Nor a buffer abissd sizes.
        let options = AbissOptions {
            flags: 1,
            ..AbissOptions::default()
        };
        let (errno, message) = fopen_opts_failure(&c_path, mode, &raw const options);
        assert_eq!(errno, libc::EINVAL, "{mode:?}: {message}");
        assert!(message.contains("ABISS_BUFFER_AUTO"), "{mode:?}: {message}");
        assert!(!path.exists(), "{mode:?} created {}", path.display());
    }
}

/// A `struct abiss_options` of a later version, with two fields added.
#[repr(C)]
struct Later {
    options: AbissOptions,
    added: [c_long; 2],
}

#[test]
fn the_options_size_tells_their_version() {
    // The layout abiss.h declares: four words, no padding.
    assert_eq!(OPTIONS_SIZE_V1, 4 * std::mem::size_of::<usize>());
    assert_eq!(
        std::mem::offset_of!(AbissOptions, app_buffer),
        OPTIONS_SIZE_V1 / 4
    );
    assert_eq!(
        std::mem::offset_of!(AbissOptions, preroll),
        OPTIONS_SIZE_V1 / 2
    );
    assert_eq!(
        std::mem::offset_of!(AbissOptions, flags),
        OPTIONS_SIZE_V1 / 4 * 3
    );
    // Past the options, the missing file is what fails.
    let missing = c"/nonexistent-abiss-test";
    let (errno, message) = fopen_opts_failure(missing, c"r", null());
    assert_eq!(
        errno,
        libc::ENOENT,
        "NULL options are the defaults: {message}"
    );
    let (errno, message) = fopen_opts_failure(missing, c"r", &AbissOptions::default());
    assert_eq!(errno, libc::ENOENT, "{message}");
    for size in [0, 8, OPTIONS_SIZE_V1 - 1, OPTIONS_SIZE_MAX + 1, usize::MAX] {
        let options = AbissOptions {
            size,
            ..AbissOptions::default()
        };
        let (errno, message) = fopen_opts_failure(missing, c"r", &raw const options);
        assert_eq!(errno, libc::EINVAL, "size {size}: {message}");
        assert!(message.contains("ABISS_OPTIONS_INIT"), "{message}");
    }
    // A later version's struct: its own fields are read, and its new ones must be zero.
    let mut later = Later {
        options: AbissOptions {
            size: std::mem::size_of::<Later>(),
            ..AbissOptions::default()
        },
        added: [0, 0],
    };
    let opts = |later: &Later| std::ptr::from_ref(later).cast::<AbissOptions>();
    let (errno, message) = fopen_opts_failure(missing, c"r", opts(&later));
    assert_eq!(errno, libc::ENOENT, "{message}");
    later.options.preroll = -1;
    let (errno, message) = fopen_opts_failure(missing, c"r", opts(&later));
    assert_eq!(errno, libc::EINVAL, "{message}");
    assert!(message.contains("preroll of -1"), "{message}");
    later.options.preroll = 0;
    later.added[1] = 1;
    let (errno, message) = fopen_opts_failure(missing, c"r", opts(&later));
    assert_eq!(errno, libc::E2BIG, "{message}");
    assert!(message.contains("does not know"), "{message}");
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

#[test]
fn a_direct_recording_is_asked_with_w_and_refused_where_the_file_system_does_no_direct_io() {
    let options = AbissOptions {
        flags: 2,
        ..AbissOptions::default()
    };
    // A read stream or an append cannot be direct: refused before the file is touched.
    let path = std::env::temp_dir().join(format!("abiss-c-direct-{}", std::process::id()));
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    for mode in [c"r", c"a", c"ab"] {
        let (errno, message) = fopen_opts_failure(&c_path, mode, &raw const options);
        assert_eq!(errno, libc::EINVAL, "{mode:?}: {message}");
        assert!(message.contains("with \"w\""), "{mode:?}: {message}");
        assert!(!path.exists(), "{mode:?} created {}", path.display());
    }
    // /dev/shm is tmpfs, which does no direct I/O: EOPNOTSUPP, before any daemon is asked
    // (none runs at this socket), and the file fopen made is gone again.
    let shm = Path::new("/dev/shm").join(format!("abiss-c-direct-{}", std::process::id()));
    let c_shm = CString::new(shm.as_os_str().as_bytes()).expect("no NUL");
    let socket = Path::new("/nonexistent-abiss-test/abiss.sock");
    let failure = stream::open(
        &c_shm,
        c"w",
        1_000_000,
        OpenOptions {
            flags: 2,
            ..OpenOptions::default()
        },
        || Client::connect(socket),
    )
    .expect_err("tmpfs does no direct I/O");
    assert_eq!(failure.errno, libc::EOPNOTSUPP, "{}", failure.message);
    assert!(
        failure.message.contains("direct I/O"),
        "{}",
        failure.message
    );
    assert!(!shm.exists(), "{} left behind", shm.display());
}
