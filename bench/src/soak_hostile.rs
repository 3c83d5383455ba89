//! The soak's hostile user and root's view of it (issue 33): for the soak's whole length,
//! `nobody` passes abissd sockets whose closes wait (`abiss-hostile-client harass`), while root
//! asks for `status` every 100 ms on a new connection and times each answer. What the soak
//! reports is root's `status` latency: a daemon that waited on a user's close would show it
//! there.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use anyhow::Context;
use serde_json::{json, Value};

use crate::latency::LatencyHistogram;

/// How often root asks.
const STATUS_EVERY: Duration = Duration::from_millis(100);

/// The hostile user's process, as `nobody`.
pub(crate) struct HostileUser(Child);

impl HostileUser {
    /// Starts `abiss-hostile-client harass` from `bin_dir` against `socket` for `secs`.
    pub(crate) fn start(bin_dir: &Path, socket: &Path, secs: u64) -> anyhow::Result<Self> {
        let child = crate::process::as_user(&bin_dir.join("abiss-hostile-client"), 65534, 65534)
            .arg(socket)
            .args(["harass", &secs.to_string(), "0"])
            .stdout(Stdio::piped())
            .spawn()
            .context(
                "cannot start the hostile user (abiss-hostile-client; cargo build --workspace)",
            )?;
        Ok(Self(child))
    }

    /// Stops it (its sockets' listeners go with it, which ends every close still waiting); what
    /// it said it passed.
    pub(crate) fn finish(mut self) -> Value {
        // SAFETY: kill(2) on our own child.
        if let Ok(pid) = i32::try_from(self.0.id()) {
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.0.wait();
        json!({"user": "nobody", "attack": "abiss-hostile-client harass: every 200 ms a TCP socket whose close waits 30 s (let go 3 s later) and a hello with 4 descriptors"})
    }
}

/// Root's `status`, timed every [`STATUS_EVERY`] until stopped.
pub(crate) struct StatusProbe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(LatencyHistogram, u64)>,
}

impl StatusProbe {
    /// Starts asking abissd on `socket`.
    pub(crate) fn start(socket: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = socket.to_path_buf();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut answered = LatencyHistogram::new();
            let mut unanswered = 0;
            while !stopping.load(Ordering::Relaxed) {
                let started = Instant::now();
                // While the soak has abissd killed and restarting, there is nobody to answer.
                match Client::connect(&socket).and_then(|mut root| root.status()) {
                    Ok(_) => answered.record(started.elapsed()),
                    Err(_) => unanswered += 1,
                }
                std::thread::sleep(STATUS_EVERY);
            }
            (answered, unanswered)
        });
        Self { stop, thread }
    }

    /// Stops asking; the answers' latency and how many were not answered.
    pub(crate) fn finish(self) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        let (answered, unanswered) = self.thread.join().unwrap_or_default();
        let summary = answered.summary();
        json!({
            "answered": summary.reads,
            "unanswered_while_restarting": unanswered,
            "p50_ms": summary.p50_ms,
            "p99_ms": summary.p99_ms,
            "max_ms": summary.max_ms,
        })
    }
}

/// The report's paragraph on the hostile user and root's `status` meanwhile.
pub(crate) fn markdown(hostile: &Value) -> String {
    let status = &hostile["root_status"];
    format!(
        "\nMeanwhile `nobody` passed abissd, every 200 ms, a TCP socket whose close waits 30 s \
         (`abiss-hostile-client harass`). Root's `status`, asked every 100 ms on a new \
         connection: {} answered, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (issue 33's goal: \
         p99 under 50 ms, max under 200 ms); {} not answered while abissd was killed and \
         restarting.\n",
        status["answered"],
        status["p50_ms"].as_f64().unwrap_or(f64::NAN),
        status["p99_ms"].as_f64().unwrap_or(f64::NAN),
        status["max_ms"].as_f64().unwrap_or(f64::NAN),
        status["unanswered_while_restarting"],
    )
}
