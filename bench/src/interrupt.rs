//! Ctrl-C and SIGTERM end a benchmark early but cleanly: the handler only sets a flag, the
//! readers and the copy loop stop at their next read, and the lab guard takes the lab down.

use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the handler for SIGINT, SIGTERM and SIGHUP.
pub fn install() -> anyhow::Result<()> {
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }?;
    }
    Ok(())
}

/// Whether a stop was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An error if a stop was asked for.
pub fn check() -> anyhow::Result<()> {
    if interrupted() {
        anyhow::bail!("interrupted");
    }
    Ok(())
}
