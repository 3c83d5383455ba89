//! How a failed call reaches C: an `errno` value and a one-sentence message kept per thread
//! for `abiss_strerror`.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::io;

use abiss_client::ClientError;

/// What `abiss_strerror` answers before anything failed on the thread.
const NO_FAILURE: &CStr = c"no abiss call has failed on this thread";
/// What `abiss_strerror` answers while the thread's storage is being torn down.
const UNAVAILABLE: &CStr = c"the abiss error message is unavailable while this thread exits";

thread_local! {
    /// The message of the last failed call on this thread. Replaced only by the next failure,
    /// so the pointer `abiss_strerror` returns stays valid until then.
    static LAST_FAILURE: RefCell<CString> = RefCell::new(CString::from(NO_FAILURE));
}

/// A failed call: the `errno` to set and the sentence for `abiss_strerror`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) errno: c_int,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(errno: c_int, message: impl Into<String>) -> Self {
        Self {
            errno,
            message: message.into(),
        }
    }

    /// A NULL pointer or an argument out of range.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(libc::EINVAL, message)
    }

    /// A panic inside the library: a bug, reported instead of unwinding into C.
    pub(crate) fn internal() -> Self {
        Self::new(
            libc::EIO,
            "libabiss failed internally (a bug, please report it); the stream's state is unknown",
        )
    }

    /// An I/O error of `what` (e.g. "cannot read /x"). Errors of the daemon connection carry a
    /// [`ClientError`] inside, whose kind decides `errno`.
    pub(crate) fn io(what: &str, error: &io::Error) -> Self {
        if let Some(client) = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<ClientError>())
        {
            return Self::new(client_errno(client), format!("{what}: {client}"));
        }
        Self::new(
            error.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {error}"),
        )
    }

    /// Sets `errno` and the thread's last message.
    pub(crate) fn record(self) {
        // A message cannot hold NUL; paths cannot either, so this only guards daemon text.
        let message = CString::new(self.message.replace('\0', " "))
            .unwrap_or_else(|_| CString::from(c"abiss call failed"));
        // During thread teardown the storage is gone; errno still tells what happened.
        let _ = LAST_FAILURE.try_with(|last| *last.borrow_mut() = message);
        set_errno(self.errno);
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        Self::new(client_errno(&error), error.to_string())
    }
}

/// The `errno` for a daemon or connection failure.
pub(crate) fn client_errno(error: &ClientError) -> c_int {
    match error {
        ClientError::NotRunning { .. } => libc::ECONNREFUSED,
        ClientError::PermissionDenied { .. } => libc::EACCES,
        ClientError::BadRequest { .. } => libc::EINVAL,
        // Admission control said no: the disk's real-time share is taken (for now).
        ClientError::Refused { .. } => libc::EBUSY,
        ClientError::NotFound { .. } => libc::ENOENT,
        ClientError::UnknownDevice { .. } => libc::ENODEV,
        ClientError::ModelUnusable { .. } => libc::EUCLEAN,
        ClientError::NotASocket { .. }
        | ClientError::VersionMismatch { .. }
        | ClientError::Daemon { .. }
        | ClientError::Broken { .. } => libc::EIO,
    }
}

/// The thread's last failure message, valid until the next failure on this thread.
pub(crate) fn last_message() -> *const c_char {
    LAST_FAILURE
        .try_with(|last| last.borrow().as_ptr())
        .unwrap_or(UNAVAILABLE.as_ptr())
}

fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno, valid for the thread's life.
    unsafe { *libc::__errno_location() = errno };
}

/// Runs one C entry point: a failure sets `errno` and the message and yields `on_failure`; a
/// panic never unwinds into C but fails the call with `EIO`.
pub(crate) fn entry_point<T>(on_failure: T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    // The handle a panicking call touched is not used to decide anything after the panic
    // except being freed: asserting unwind safety is sound here.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(failure)) => {
            failure.record();
            on_failure
        }
        Err(_) => {
            Failure::internal().record();
            on_failure
        }
    }
}
