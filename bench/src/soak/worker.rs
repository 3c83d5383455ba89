//! One user's worker: `abiss-bench soak-worker` loops attach, miss, end; the soak starts one per
//! user and counts its cycles from its output.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::StreamTarget;
use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use super::{WorkerArgs, FILE_BYTES, MISS_BYTES, STREAM};

/// One user's worker process and the thread counting its cycles.
pub(super) struct Worker {
    child: Child,
    reader: Option<std::thread::JoinHandle<Value>>,
}

impl Worker {
    pub(super) fn start(
        socket: &Path,
        file: &Path,
        cycles: u64,
        user: Option<&(String, u32, u32)>,
        done: &Arc<AtomicU64>,
    ) -> anyhow::Result<Self> {
        let me = std::env::current_exe()?;
        let mut command = match user {
            None => Command::new(&me),
            Some((_, uid, gid)) => crate::process::as_user(&me, *uid, *gid),
        };
        let mut child = command
            .arg("soak-worker")
            .arg("--socket")
            .arg(socket)
            .arg("--file")
            .arg(file)
            .arg("--cycles")
            .arg(cycles.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a soak worker")?;
        let stdout = child.stdout.take().context("worker stdout")?;
        let done = Arc::clone(done);
        let name = user.map_or_else(|| "root".to_owned(), |(name, _, _)| name.clone());
        let reader = std::thread::spawn(move || {
            let mut last = Value::Null;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line == "." {
                    done.fetch_add(1, Ordering::Relaxed);
                } else if let Ok(mut value) = serde_json::from_str::<Value>(&line) {
                    value["user"] = json!(name);
                    last = value;
                }
            }
            last
        });
        Ok(Self {
            child,
            reader: Some(reader),
        })
    }

    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub(super) fn finish(mut self) -> anyhow::Result<Value> {
        let status = self.child.wait()?;
        let report = self
            .reader
            .take()
            .map(|r| r.join().unwrap_or(Value::Null))
            .unwrap_or_default();
        if !status.success() {
            bail!("a soak worker failed ({status}): {report}");
        }
        Ok(report)
    }
}

impl Drop for Worker {
    /// A soak ended early (an error, Ctrl-C) leaves no worker cycling behind it.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `abiss-bench soak-worker`: the cycles of one user; prints `.` per cycle done, then a JSON
/// line with its counts and whether its thread was still raised at the end.
pub fn worker(args: &WorkerArgs) -> anyhow::Result<()> {
    let initial = crate::ioprio::current_thread_ioprio()?;
    let (mut done, mut refused, mut retried, mut raised_seen) = (0u64, 0u64, 0u64, 0u64);
    let mut refusals: BTreeMap<String, u64> = BTreeMap::new();
    let mut buffer = vec![0u8; usize::try_from(MISS_BYTES)?];
    while done < args.cycles {
        match one_cycle(args, done, &mut buffer) {
            Ok(raised) => {
                done += 1;
                raised_seen += u64::from(raised);
                println!(".");
            }
            // A refused cycle is made again: the soak counts cycles that attached.
            Err(CycleError::Refused(message)) => {
                refused += 1;
                *refusals.entry(message).or_default() += 1;
                if refused > 1000 + args.cycles / 2 {
                    bail!("abissd refused {refused} attaches: {refusals:?}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(CycleError::Down) => {
                retried += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    // The last stream has ended: the raise must be put back.
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut end = crate::ioprio::current_thread_ioprio()?;
    while end != initial && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        end = crate::ioprio::current_thread_ioprio()?;
    }
    println!(
        "{}",
        json!({
            "cycles": done, "refused": refused, "refusals": refusals, "retried": retried,
            "raised_during_cycles": raised_seen, "ioprio_at_start": initial,
            "ioprio_at_end": end, "raised_at_end": end != initial,
        })
    );
    Ok(())
}

enum CycleError {
    /// abissd refused the attach (the message says why).
    Refused(String),
    /// abissd is not there (killed, restarting) or the connection broke.
    Down,
}

/// Attach, miss, end the stream; whether the thread was raised after the miss.
fn one_cycle(args: &WorkerArgs, cycle: u64, buffer: &mut [u8]) -> Result<bool, CycleError> {
    let mut client = Client::connect(&args.socket).map_err(|_| CycleError::Down)?;
    let file = std::fs::File::open(&args.file).map_err(|_| CycleError::Down)?;
    let stream = match client.attach(&file, STREAM) {
        Ok(stream) => stream,
        Err(
            abiss_client::ClientError::NotRunning { .. } | abiss_client::ClientError::Broken { .. },
        ) => return Err(CycleError::Down),
        // The sentence with its file and numbers left out, so that like refusals count
        // together.
        Err(error) => {
            let message = error
                .to_string()
                .replace(&*args.file.to_string_lossy(), "FILE");
            let mut kind = String::new();
            for c in message.chars() {
                if !c.is_ascii_digit() {
                    kind.push(c);
                } else if !kind.ends_with('N') {
                    kind.push('N');
                }
            }
            return Err(CycleError::Refused(kind));
        }
    };
    let offset = (cycle * 7919 % (FILE_BYTES / MISS_BYTES)) * MISS_BYTES;
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(&file),
        i64::try_from(offset).unwrap_or(0),
        i64::try_from(MISS_BYTES).unwrap_or(0),
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    let _ = file.read_exact_at(buffer, offset);
    // The miss reaches abissd through the kernel's ring a moment after the read: the stream
    // is kept until the raise is seen, or for 30 ms.
    let deadline = Instant::now() + Duration::from_millis(30);
    let mut raised = false;
    while !raised && Instant::now() < deadline {
        raised = crate::ioprio::current_thread_ioprio().is_ok_and(|p| p >> 13 == 1);
        std::thread::sleep(Duration::from_millis(1));
    }
    if cycle.is_multiple_of(2) {
        client
            .detach(StreamTarget::Id(stream.id))
            .map_err(|_| CycleError::Down)?;
    }
    // Odd cycles hang up: a non-persistent stream ends with its connection.
    drop(client);
    Ok(raised)
}

/// A count as a float, for rates and chart coordinates (counts here stay far below 2^52).
#[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
pub(super) fn float(count: u64) -> f64 {
    count as f64
}
