//! The fio runs behind the players and recording benchmarks' best-effort loads: laying out a
//! job file's files, running it in the background with a JSON report, and adding the report
//! up per job. Each benchmark keeps its own job file and figures; what is here is how fio is
//! driven, which was the same in both.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context as _;

/// Has fio create the files of the job file `jobs` (without running it); `what` names them in
/// the error.
pub fn create_only(jobs: &Path, what: &str) -> anyhow::Result<()> {
    let output = Command::new("fio")
        .arg(jobs)
        .arg("--create_only=1")
        .stdin(Stdio::null())
        .output()
        .context("cannot run fio (cargo xtask setup installs it)")?;
    anyhow::ensure!(
        output.status.success(),
        "fio could not lay out {what}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// How a running fio is ended if it is dropped before [`Load::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrop {
    /// Kill fio itself.
    Kill,
    /// fio leads a process group of its own: kill the group (its jobs are processes of their
    /// own, which outlive fio otherwise), then give the disk a moment to settle.
    KillGroup,
}

/// A load: fio running a job file in the background, its JSON report going to a file and
/// added up by `figures` into an `F` when it ends; killed on drop.
#[derive(Debug)]
pub struct Load<F> {
    child: Option<Child>,
    output: PathBuf,
    on_drop: OnDrop,
    figures: fn(&serde_json::Value) -> F,
}

impl<F> Load<F> {
    /// Writes `job_file` to `dir/load.fio` and starts fio on it, its report into
    /// `dir/load.json` (removed first); [`Load::finish`] adds the report up with `figures`.
    pub fn start(
        dir: &Path,
        job_file: &str,
        on_drop: OnDrop,
        figures: fn(&serde_json::Value) -> F,
    ) -> anyhow::Result<Self> {
        let jobs = dir.join("load.fio");
        std::fs::write(&jobs, job_file)?;
        let output = dir.join("load.json");
        let _ = std::fs::remove_file(&output);
        let mut command = Command::new("fio");
        command
            .arg(&jobs)
            .arg("--output-format=json")
            .arg(format!("--output={}", output.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if on_drop == OnDrop::KillGroup {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        let child = command.spawn().context("cannot run fio")?;
        Ok(Self {
            child: Some(child),
            output,
            on_drop,
            figures,
        })
    }

    /// Waits for fio to end and adds up what it moved.
    pub fn finish(mut self) -> anyhow::Result<F> {
        let status = self.child.take().context("finished already")?.wait()?;
        anyhow::ensure!(status.success(), "fio failed ({status})");
        let text = std::fs::read_to_string(&self.output)
            .with_context(|| format!("cannot read {}", self.output.display()))?;
        // fio may print notes before its JSON.
        let json = text.find('{').map_or("", |start| &text[start..]);
        let report: serde_json::Value = serde_json::from_str(json).context("fio's JSON output")?;
        Ok((self.figures)(&report))
    }
}

impl<F> Drop for Load<F> {
    fn drop(&mut self) {
        // Only on an error or an interrupt.
        let Some(mut child) = self.child.take() else {
            return;
        };
        match self.on_drop {
            OnDrop::Kill => {
                let _ = child.kill();
                let _ = child.wait();
            }
            OnDrop::KillGroup => {
                if let Ok(pid) = i32::try_from(child.id()) {
                    // SAFETY: killpg(2) of the group fio leads.
                    unsafe { libc::killpg(pid, libc::SIGKILL) };
                }
                let _ = child.wait();
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    }
}

/// fio's JSON report, by job.
#[derive(Debug)]
pub struct Report {
    jobs: Vec<serde_json::Value>,
    /// Seconds the longest job ran.
    pub runtime_s: f64,
}

impl Report {
    /// The jobs of `report` and how long they ran.
    #[must_use]
    pub fn new(report: &serde_json::Value) -> Self {
        let jobs = report["jobs"].as_array().cloned().unwrap_or_default();
        let runtime_s = jobs
            .iter()
            .filter_map(|j| j["job_runtime"].as_f64())
            .fold(0.0, f64::max)
            / 1000.0;
        Self { jobs, runtime_s }
    }

    /// `field` of `direction` (`read`, `write`) summed over the jobs called `name` (a job with
    /// `numjobs` appears once per process).
    #[must_use]
    pub fn sum(&self, name: &str, direction: &str, field: &str) -> f64 {
        self.jobs
            .iter()
            .filter(|j| j["jobname"] == name)
            .filter_map(|j| j[direction][field].as_f64())
            .sum()
    }

    /// `value` per second of the run (0 if it did not run).
    #[must_use]
    pub fn per_s(&self, value: f64) -> f64 {
        if self.runtime_s > 0.0 {
            value / self.runtime_s
        } else {
            0.0
        }
    }
}
