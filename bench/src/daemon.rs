//! The one way the tests, the benchmarks and the demo start abissd: on a private socket, with
//! its state and model directories beside it, its log level from `ABISS_DAEMON_LOG` (or what
//! the caller chose), ready only once its main loop has answered a `hello` (the socket accepts
//! connections as soon as it is bound, before the programs are loaded and the disks taken).
//! It stops with SIGTERM, abissd's clean shutdown, when it drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How long abissd may take to answer its first `hello`. A start parses the kernel's BTF and
/// loads the programs: 0.3 s on the lab machine, 14 s in the kernel test's emulated guests.
pub const READY_WITHIN: Duration = Duration::from_secs(20);

/// How to start abissd: where it is, where it keeps its socket and state, its arguments.
#[derive(Clone, Debug)]
pub struct DaemonCommand {
    program: PathBuf,
    dir: PathBuf,
    state: Option<PathBuf>,
    args: Vec<String>,
    log: String,
    log_file: Option<PathBuf>,
}

impl DaemonCommand {
    /// abissd from `bin_dir`, with its socket (`abiss.sock`), state (`state/`) and models
    /// (`state/models/`) in `dir`, which must exist; log level `warn` unless
    /// `ABISS_DAEMON_LOG` says otherwise.
    #[must_use]
    pub fn new(bin_dir: &Path, dir: &Path) -> Self {
        Self {
            program: bin_dir.join("abissd"),
            dir: dir.to_path_buf(),
            state: None,
            args: Vec::new(),
            log_file: None,
            log: std::env::var("ABISS_DAEMON_LOG").unwrap_or_else(|_| "warn".to_owned()),
        }
    }

    /// More arguments (`--device`, `--capacity`, …).
    #[must_use]
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|arg| arg.as_ref().to_owned()));
        self
    }

    /// The state directory at `dir` rather than in the daemon's directory (a benchmark that
    /// profiled the disk keeps its model there for the next daemon).
    #[must_use]
    pub fn state_dir_at(mut self, dir: &Path) -> Self {
        self.state = Some(dir.to_path_buf());
        self
    }

    /// abissd's log filter (`RUST_LOG`), where `ABISS_DAEMON_LOG` does not set one.
    #[must_use]
    pub fn log(mut self, filter: &str) -> Self {
        if std::env::var_os("ABISS_DAEMON_LOG").is_none() {
            filter.clone_into(&mut self.log);
        }
        self
    }

    /// Its standard error appended to `file` (a restart keeps what was logged before), at log
    /// level `filter` whatever `ABISS_DAEMON_LOG` says: for a test that reads the log.
    #[must_use]
    pub fn log_to(mut self, file: &Path, filter: &str) -> Self {
        self.log_file = Some(file.to_path_buf());
        filter.clone_into(&mut self.log);
        self
    }

    /// The control socket.
    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("abiss.sock")
    }

    /// The state directory (device and raise records for crash recovery).
    #[must_use]
    pub fn state_dir(&self) -> PathBuf {
        self.state.clone().unwrap_or_else(|| self.dir.join("state"))
    }

    /// The model directory.
    #[must_use]
    pub fn model_dir(&self) -> PathBuf {
        self.state_dir().join("models")
    }

    /// The command [`DaemonCommand::start`] runs, its standard error not redirected: for a
    /// test whose abissd must refuse to start, and which reads the exit code and the message.
    #[must_use]
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--model-dir")
            .arg(self.model_dir())
            .args(&self.args)
            .env("RUST_LOG", &self.log);
        command
    }

    /// Starts abissd and waits until its main loop answers.
    pub fn start(&self) -> anyhow::Result<DaemonProcess> {
        let mut command = self.command();
        if let Some(file) = &self.log_file {
            let log = std::fs::File::options()
                .create(true)
                .append(true)
                .open(file)
                .with_context(|| format!("cannot open {}", file.display()))?;
            command.stderr(log);
        }
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        let mut process = DaemonProcess {
            child: Some(child),
            socket: self.socket(),
        };
        process.wait_ready()?;
        Ok(process)
    }
}

/// A running abissd; stopped with SIGTERM when it drops.
#[derive(Debug)]
pub struct DaemonProcess {
    child: Option<Child>,
    socket: PathBuf,
}

impl DaemonProcess {
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let answered = abiss_client::Client::connect(&self.socket)
                .and_then(|mut client| client.call(abiss_proto::Request::Hello))
                .is_ok();
            if answered {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!("abissd exited with {status} before serving");
            }
            if Instant::now() > deadline {
                self.kill();
                bail!("abissd did not answer within {} s", READY_WITHIN.as_secs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The control socket.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its process id (0 once it has stopped).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Stops it with SIGTERM; its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        self.signal(libc::SIGTERM)
    }

    /// Kills it with SIGKILL, as a crash would; its exit code (none).
    pub fn kill(&mut self) -> Option<i32> {
        self.signal(libc::SIGKILL)
    }

    fn signal(&mut self, signal: libc::c_int) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) on our own child, which we have not reaped yet.
            unsafe { libc::kill(pid, signal) };
        }
        child.wait().ok().and_then(|status| status.code())
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
