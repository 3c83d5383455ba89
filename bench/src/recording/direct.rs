//! The direct rows' sink (issue 36): a recorder writes into a FIFO that `abissctl record FILE`
//! reads and writes past the page cache, as `ffmpeg … -f mpegts - | abissctl record FILE`
//! would, with the recorder's own command unchanged but for its output.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context as _;

use crate::process;

/// `abissctl record` between a recorder and its file (the direct rows): the recorder writes
/// into a FIFO, which `abissctl record FILE` reads and writes past the page cache. It runs
/// outside the recorder's cgroup, so perf times the recorder's writes into the pipe only.
#[derive(Clone, Debug)]
pub struct RecordSink {
    /// The abissctl executable.
    pub abissctl: PathBuf,
    /// abissd's socket.
    pub socket: PathBuf,
    /// `--rate`.
    pub rate: String,
    /// `--buffer`: the ring.
    pub buffer: String,
    /// `--preallocate`: abissd allocates the file ahead of the writes.
    pub preallocate: bool,
}

/// A running `abissctl record`, and its FIFO.
#[derive(Debug)]
pub(super) struct RunningRecord {
    /// `None` once reaped by [`Self::finish`].
    child: Option<Child>,
    pub(super) fifo: PathBuf,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl RecordSink {
    /// Makes `file`'s FIFO and starts `abissctl record FILE` reading it (its open waits for
    /// the recorder's). The FIFO is on tmpfs, as a shell's pipe is on pipefs: every write into
    /// a FIFO updates its time stamps, and on the lab's ext4 that waited in the journal (the
    /// recorders' writes into FIFOs beside their files had a p99.9 of 89 to 130 ms, against
    /// 0.2 to 4.9 ms on xfs).
    pub(super) fn start(&self, file: &Path) -> anyhow::Result<RunningRecord> {
        let name = file.file_name().context("a recording has a file name")?;
        let fifo = Path::new("/dev/shm").join(format!(
            "abiss-bench-{}-{}.fifo",
            std::process::id(),
            name.to_string_lossy()
        ));
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .with_context(|| format!("cannot make the FIFO {}", fifo.display()))?;
        let preallocate = if self.preallocate {
            " --preallocate"
        } else {
            ""
        };
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                r#"exec "$0" --socket "$1" record "$2" --rate "$3" --buffer "$4"{preallocate} --json < "$5""#
            ))
            .arg(&self.abissctl)
            .arg(&self.socket)
            .arg(file)
            .arg(&self.rate)
            .arg(&self.buffer)
            .arg(&fifo)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .context("cannot start abissctl record")?;
        let stdout = process::output_of(child.stdout.take().context("no stdout")?);
        let stderr = child.stderr.take().context("no stderr")?;
        Ok(RunningRecord {
            child: Some(child),
            fifo,
            stdout: Some(stdout),
            stderr: Some(process::stderr_tail(stderr)),
        })
    }
}

impl RunningRecord {
    /// Waits for `abissctl record` to write the tail and end (killed 10 s after
    /// `signalled`), and reads its summary; the FIFO goes.
    pub(super) fn finish(mut self, signalled: Instant) -> anyhow::Result<serde_json::Value> {
        let child = self.child.take().context("finished already")?;
        let (ended, _) = process::wait_for(i32::try_from(child.id())?, signalled)?;
        let join = |thread: Option<JoinHandle<String>>| {
            thread.and_then(|t| t.join().ok()).unwrap_or_default()
        };
        let stdout = join(self.stdout.take());
        let stderr = join(self.stderr.take());
        serde_json::from_str(stdout.trim())
            .with_context(|| format!("abissctl record gave no summary ({ended}): {stderr}"))
    }
}

impl Drop for RunningRecord {
    /// Also when its recorder never started (a launch that failed after it): a `sh` still
    /// waiting to open the FIFO is killed, and the FIFO goes.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.fifo);
    }
}
