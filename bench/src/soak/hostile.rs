//! The soak's hostile user and root's view of it (issue 33): for the soak's whole length,
//! `nobody` makes the security tests' attacks that load abissd, all at once
//! (`abiss-hostile-client harass`, `abiss_tests::harass`): sockets and FUSE files whose closes
//! wait, raises of short-lived threads and of many waiting ones, rereads of an attached file,
//! the costliest capacity plans, subscriptions that hang up, recordings moved ahead, and
//! `io_uring` requests that never complete. Meanwhile root
//! asks for `status` every 100 ms on a new connection and times each answer: a daemon that
//! waited on a user's object, or did work a user sizes on its loop, would show it there.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_lab::stalling_fs::StallingFs;
use anyhow::Context;
use serde_json::{json, Value};

use crate::latency::LatencyHistogram;

/// How often root asks.
const STATUS_EVERY: Duration = Duration::from_millis(100);

/// How late the stalling file system answers a flush: a close of its file, in abissd's closing
/// thread or in the hostile user, waits this long. Answered at all, so that a `kill -9` of
/// abissd ends (a flush the server has taken is waited for uninterruptibly).
const FLUSH_AFTER: Duration = Duration::from_secs(1);

/// The user the attacks run as.
pub(crate) const NOBODY: u32 = 65534;

/// The hostile user's process, as `nobody`, and the file system it stalls abissd with.
pub(crate) struct HostileUser {
    // The attacker first: its closes of the stalling file wait on the server, which goes after.
    child: Child,
    _stalling: StallingFs,
}

impl HostileUser {
    /// Mounts the stalling file system and starts `abiss-hostile-client harass` from `bin_dir`
    /// against `socket`, with `file` (its own, on the managed `device`).
    pub(crate) fn start(
        bin_dir: &Path,
        socket: &Path,
        file: &Path,
        device: &Path,
    ) -> anyhow::Result<Self> {
        let stalling = StallingFs::mount(
            &bin_dir.join("abiss-stalling-fs"),
            NOBODY,
            Path::new("/tmp"),
            Some(FLUSH_AFTER),
        )
        .context("the hostile user's stalling file system")?;
        let child = crate::process::as_user(&bin_dir.join("abiss-hostile-client"), NOBODY, NOBODY)
            .arg(socket)
            .args(["harass", "86400"])
            .arg(file)
            .arg(device)
            .arg(stalling.file())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context(
                "cannot start the hostile user (abiss-hostile-client; cargo build --workspace)",
            )?;
        Ok(Self {
            child,
            _stalling: stalling,
        })
    }

    /// Stops it (its standard input ends; its sockets' listeners go with it, which ends every
    /// close still waiting); what it says it tried and did, attack by attack. An error if it
    /// reported no attack: the soak would then say nothing of a daemon under attack.
    pub(crate) fn finish(mut self) -> anyhow::Result<Value> {
        drop(self.child.stdin.take());
        let mut attacks = serde_json::Map::new();
        if let Some(stdout) = self.child.stdout.take() {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let [name, "tries", tries, "done", done] =
                    line.split_whitespace().collect::<Vec<_>>().as_slice()
                {
                    attacks.insert(
                        (*name).to_owned(),
                        json!({"tries": tries.parse::<u64>().ok(), "done": done.parse::<u64>().ok()}),
                    );
                }
            }
        }
        let status = self.child.wait()?;
        anyhow::ensure!(
            !attacks.is_empty(),
            "the hostile user reported no attack ({status}); see its errors above"
        );
        Ok(json!({"user": "nobody", "attacks": attacks, "exit": status.to_string()}))
    }
}

impl Drop for HostileUser {
    /// Ends it when the soak ends early: its standard input closes, and it stops within a
    /// second or so (a close of the stalling file waits for its flush).
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// What root's asking saw: answers while abissd ran, answers that overlapped a kill and
/// restart (a new abissd accepts connections before its main loop answers: its start took
/// 1.5 s in the soak), and questions nobody answered.
#[derive(Default)]
struct Asked {
    running: LatencyHistogram,
    restarting: LatencyHistogram,
    unanswered: u64,
}

/// Root's `status`, timed every [`STATUS_EVERY`] until stopped.
pub(crate) struct StatusProbe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Asked>,
    /// The CPUs' ticks and steal when it started: the noise root's answers had to get through.
    cpu_before: Option<(u64, u64)>,
    stolen_before: Option<u64>,
}

impl StatusProbe {
    /// Starts asking abissd on `socket`; `restarting` is set while the soak kills and
    /// restarts it.
    pub(crate) fn start(socket: &Path, restarting: &Arc<AtomicBool>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let socket = socket.to_path_buf();
        let (stopping, restarting) = (Arc::clone(&stop), Arc::clone(restarting));
        let thread = std::thread::spawn(move || {
            let mut asked = Asked::default();
            while !stopping.load(Ordering::Relaxed) {
                let before = restarting.load(Ordering::Relaxed);
                let started = Instant::now();
                let answer = Client::connect(&socket).and_then(|mut root| root.status());
                let took = started.elapsed();
                match answer {
                    Ok(_) if before || restarting.load(Ordering::Relaxed) => {
                        asked.restarting.record(took);
                    }
                    Ok(_) => asked.running.record(took),
                    Err(_) => asked.unanswered += 1,
                }
                std::thread::sleep(STATUS_EVERY);
            }
            asked
        });
        Self {
            stop,
            thread,
            cpu_before: crate::cpu::cpu_times().ok(),
            stolen_before: abiss_lab::system::stolen_ms(),
        }
    }

    /// Stops asking; the answers' latency and how many were not answered.
    pub(crate) fn finish(self) -> Value {
        self.stop.store(true, Ordering::Relaxed);
        let asked = self.thread.join().unwrap_or_default();
        let running = asked.running.summary();
        let restarting = asked.restarting.summary();
        json!({
            "answered": running.reads,
            "p50_ms": running.p50_ms,
            "p99_ms": running.p99_ms,
            "max_ms": running.max_ms,
            "answered_across_a_restart": restarting.reads,
            "max_across_a_restart_ms": restarting.max_ms,
            "unanswered_while_restarting": asked.unanswered,
            "cpu_busy_pct": self.cpu_before.zip(crate::cpu::cpu_times().ok())
                .map(|(before, after)| crate::cpu::busy_pct(before, after)),
            "cpu_stolen_ms": abiss_lab::system::stolen_since(self.stolen_before),
            "load_average_1m": crate::cpu::load_average(),
        })
    }
}

/// The report's paragraph on the hostile user and root's `status` meanwhile.
pub(crate) fn markdown(hostile: &Value) -> String {
    let status = &hostile["root_status"];
    let attacks = hostile["attacks"]
        .as_object()
        .map(|attacks| {
            attacks
                .iter()
                .map(|(name, counts)| format!("{name} {} of {}", counts["done"], counts["tries"]))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    format!(
        "\nMeanwhile `nobody` made {} of the security tests' attacks at once, those that load \
         abissd (`abiss-hostile-client harass`, which ended with {}; done of tried: {attacks}). \
         Root's `status`, asked every 100 ms on a new connection, while abissd ran: {} answered, p50 {:.2} ms, p99 \
         {:.2} ms, max {:.2} ms (issue 33's goal: p99 under 50 ms, max under 200 ms). Across a \
         kill and restart: {} answered (at most {:.0} ms: a new abissd accepts before its main \
         loop answers), {} not answered.\n",
        hostile["attacks"].as_object().map_or(0, serde_json::Map::len),
        hostile["exit"].as_str().unwrap_or("?"),
        status["answered"],
        status["p50_ms"].as_f64().unwrap_or(f64::NAN),
        status["p99_ms"].as_f64().unwrap_or(f64::NAN),
        status["max_ms"].as_f64().unwrap_or(f64::NAN),
        status["answered_across_a_restart"],
        status["max_across_a_restart_ms"]
            .as_f64()
            .unwrap_or(f64::NAN),
        status["unanswered_while_restarting"],
    ) + &format!(
        "The CPUs meanwhile: {:.0} % busy, {} ms stolen by the hypervisor, load average {:.1} \
         (the soak's four workers, the hostile user, abissd, and whatever else ran \
         on the machine).\n",
        status["cpu_busy_pct"].as_f64().unwrap_or(f64::NAN),
        status["cpu_stolen_ms"],
        status["load_average_1m"].as_f64().unwrap_or(f64::NAN),
    )
}
