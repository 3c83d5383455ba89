//! Checks made before anything is loaded, so that a missing privilege is one plain sentence
//! instead of a verifier or permission error from deep inside the loader.

/// Capability numbers from `linux/capability.h`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Whether the effective capability set `cap_eff` allows loading and attaching tracing programs.
#[must_use]
pub(crate) fn can_trace(cap_eff: u64) -> bool {
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// This process's effective capability set, from `/proc/self/status`.
pub(crate) fn effective_capabilities() -> std::io::Result<u64> {
    let status = procfs::process::Process::myself()
        .and_then(|me| me.status())
        .map_err(std::io::Error::other)?;
    Ok(status.capeff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_needs_bpf_and_perfmon_or_sys_admin() {
        assert!(can_trace(1 << CAP_SYS_ADMIN));
        assert!(can_trace((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!can_trace(1 << CAP_BPF));
        assert!(!can_trace(0));
    }
}
