//! The configurations a benchmark compares: an elevator, the readers' I/O class, and optional
//! hooks around each run and each reader. Stock rows need no hooks; ABISS rows add a
//! [`RunHook`] that starts abissd for the run and attaches each reader's file:
//!
//! ```ignore
//! struct Abiss { level: u8 }                     // e.g. the ABISS level the streams get
//! impl RunHook for Abiss {
//!     fn name(&self) -> &'static str { "abiss" }
//!     fn start_run(&self, run: &RunContext<'_>) -> anyhow::Result<Box<dyn RunSetup>> {
//!         // start abissd from run.bin_dir managing run.device; stop it in Drop
//!     }
//! }
//! impl RunSetup for AbissRun {
//!     fn start_reader(&self, reader: &ReaderContext<'_>) -> anyhow::Result<Box<dyn ReaderSetup>> {
//!         // attach reader.file at reader.stream.rate_bps with reader.stream.buffer_bytes,
//!         // wait until its window is loaded; detach in Drop
//!     }
//! }
//! impl ReaderSetup for Attached {
//!     fn after_read(&mut self, offset: u64, len: u64) -> anyhow::Result<()> {
//!         // send the playout point, offset + len
//!     }
//! }
//! // in all_configurations():
//! Configuration::new("abiss-mq-deadline", "ABISS over mq-deadline", "mq-deadline")
//!     .with_hook(Abiss { level: 0 })
//! ```

use std::fmt;
use std::fs::File;
use std::path::Path;

use serde::Serialize;

use crate::ioprio::IoClass;
use crate::schedule::StreamSpec;

/// One row of a benchmark.
pub struct Configuration {
    /// Short name, used by `--rows` and in the reports (e.g. `bfq-rt`).
    pub name: String,
    /// What the row is, for the reports (e.g. "bfq, readers in ionice -c1").
    pub description: String,
    /// The elevator selected on the lab device for the run.
    pub elevator: String,
    /// The I/O class each reader thread sets with `ioprio_set` before its first read; `None`
    /// leaves the default (best effort, level from the nice value).
    pub reader_class: Option<IoClass>,
    /// What else the row does around a run and around each reader.
    pub hook: Box<dyn RunHook>,
    /// Run only when named in `--rows` (a comparison row, not part of every run).
    pub on_request: bool,
}

impl Configuration {
    /// A row with plain readers in the default I/O class and no hooks.
    #[must_use]
    pub fn new(name: &str, description: &str, elevator: &str) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            elevator: elevator.to_owned(),
            reader_class: None,
            hook: Box::new(NoHook),
            on_request: false,
        }
    }

    /// The same row, run only when named.
    #[must_use]
    pub fn on_request(mut self) -> Self {
        self.on_request = true;
        self
    }

    /// The same row with the readers in `class`.
    #[must_use]
    pub fn with_reader_class(mut self, class: IoClass) -> Self {
        self.reader_class = Some(class);
        self
    }

    /// The same row with `hook` around each run.
    #[must_use]
    pub fn with_hook(mut self, hook: impl RunHook + 'static) -> Self {
        self.hook = Box::new(hook);
        self
    }

    /// What the reports record about the row.
    #[must_use]
    pub fn describe(&self) -> ConfigurationInfo {
        ConfigurationInfo {
            name: self.name.clone(),
            description: self.description.clone(),
            elevator: self.elevator.clone(),
            reader_class: self
                .reader_class
                .map_or_else(|| "default".to_owned(), |c| c.to_string()),
            hook: self.hook.name().to_owned(),
        }
    }
}

impl fmt::Debug for Configuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Configuration")
            .field("name", &self.name)
            .field("elevator", &self.elevator)
            .field("reader_class", &self.reader_class)
            .field("hook", &self.hook.name())
            .finish_non_exhaustive()
    }
}

/// A configuration as the reports record it.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigurationInfo {
    /// Short name.
    pub name: String,
    /// What the row is.
    pub description: String,
    /// The elevator.
    pub elevator: String,
    /// The readers' I/O class (`default`, `rt/4`, `be/0`, …).
    pub reader_class: String,
    /// The hook's name (`none` for stock rows).
    pub hook: String,
}

/// The rows of the reference measurement, in report order: every stock elevator with plain
/// readers, then the strongest stock setups, bfq and mq-deadline with the readers in the
/// real-time class as `ionice -c1` puts them (level 4, ionice's default).
#[must_use]
pub fn stock_configurations() -> Vec<Configuration> {
    let rt = IoClass::RealTime(4);
    vec![
        Configuration::new("none", "no elevator", "none"),
        Configuration::new("mq-deadline", "mq-deadline", "mq-deadline"),
        Configuration::new("kyber", "kyber", "kyber"),
        Configuration::new("bfq", "bfq", "bfq"),
        Configuration::new("bfq-rt", "bfq, readers in ionice -c1", "bfq").with_reader_class(rt),
        Configuration::new(
            "mq-deadline-rt",
            "mq-deadline, readers in ionice -c1",
            "mq-deadline",
        )
        .with_reader_class(rt),
    ]
}

/// What a run's hook gets to know: the lab and the streams about to be read.
#[derive(Clone, Copy, Debug)]
pub struct RunContext<'a> {
    /// The configuration's name.
    pub configuration: &'a str,
    /// The lab's block device (e.g. `/dev/loop3`).
    pub device: &'a Path,
    /// Where the lab's file system is mounted.
    pub mount_dir: &'a Path,
    /// Rate, read size and buffer of every stream.
    pub stream: StreamSpec,
    /// How many real-time readers the run has.
    pub streams: usize,
    /// Where abissd and abissctl are (`$ABISS_BIN_DIR`), if set.
    pub bin_dir: Option<&'a Path>,
}

/// What a reader's hook gets to know: the reader's file, open, before its first read.
#[derive(Clone, Copy, Debug)]
pub struct ReaderContext<'a> {
    /// The reader's number within the run (0-based).
    pub reader: usize,
    /// The stream file.
    pub path: &'a Path,
    /// The open file the reader will read(2) from.
    pub file: &'a File,
    /// Rate, read size and buffer of the stream.
    pub stream: StreamSpec,
}

/// What a run's daemon counted (abissd, for the ABISS rows).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DaemonFigures {
    /// Block requests tagged with a stream (prefetch, readers, readahead).
    pub stream_requests: u64,
    /// Those that ran below their stream's level (priority inversions).
    pub inversions: u64,
    /// Reader threads raised after a page-cache miss.
    pub raises: u64,
    /// Miss event to raised priority, median and 99th percentile, µs.
    pub raise_latency_p50_us: Option<u64>,
    /// See `raise_latency_p50_us`.
    pub raise_latency_p99_us: Option<u64>,
    /// The smallest and the largest playout buffer abissd gave the streams, bytes (it sizes
    /// them itself with `--buffer auto`).
    pub buffer_bytes: Option<(u64, u64)>,
    /// What abissd's model predicted for the streams as they were attached when the readers
    /// started (with a model, admission on or off): the statistical miss probability, and
    /// the mean disk time of a 1000 ms window, ms.
    pub predicted: Option<StreamsPrediction>,
}

/// abissd's prediction for a run's streams: what admission would have decided on.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StreamsPrediction {
    /// That the real-time backlog outgrows the least buffered stream's slack.
    pub miss_probability: f64,
    /// The mean disk time a window takes, ms.
    pub work_ms: f64,
}

/// Extra setup of a configuration around each run (e.g. start abissd). Called on the
/// benchmark's main thread after the elevator is selected and the page cache dropped, before
/// the best-effort load starts.
pub trait RunHook: Send + Sync {
    /// A short name for the reports.
    fn name(&self) -> &'static str;

    /// Sets the run up. The returned value lives until the run's readers and load have ended;
    /// dropping it tears the setup down (and must not fail).
    fn start_run(&self, run: &RunContext<'_>) -> anyhow::Result<Box<dyn RunSetup>>;
}

/// A run's setup while the run lasts (e.g. a running abissd).
pub trait RunSetup: Send + Sync {
    /// Called on each reader's thread, after its I/O class is set and its file opened, before
    /// the readers' common start (e.g. attach the file with the stream's rate and buffer).
    /// The returned value lives until the reader's last read; dropping it detaches.
    fn start_reader(&self, reader: &ReaderContext<'_>) -> anyhow::Result<Box<dyn ReaderSetup>>;

    /// Called once every reader is set up and waiting for the common start (e.g. note what
    /// the daemon predicts for the streams attached).
    fn readers_ready(&self) {}

    /// What the run's daemon counted, after the readers finished (none without a daemon).
    fn daemon_figures(&self) -> Option<DaemonFigures> {
        None
    }
}

/// A reader's setup while the reader runs.
pub trait ReaderSetup: Send {
    /// Called after each read(2) returned, outside the measured latency (e.g. ABISS's
    /// "position" message that moves the playout point). `offset` is where the read started.
    fn after_read(&mut self, offset: u64, len: u64) -> anyhow::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// The hook of stock rows: nothing around runs or readers.
#[derive(Clone, Copy, Debug)]
pub struct NoHook;

/// Nothing to set up or tear down.
#[derive(Clone, Copy, Debug)]
pub struct NoSetup;

impl RunHook for NoHook {
    fn name(&self) -> &'static str {
        "none"
    }

    fn start_run(&self, _run: &RunContext<'_>) -> anyhow::Result<Box<dyn RunSetup>> {
        Ok(Box::new(NoSetup))
    }
}

impl RunSetup for NoSetup {
    fn start_reader(&self, _reader: &ReaderContext<'_>) -> anyhow::Result<Box<dyn ReaderSetup>> {
        Ok(Box::new(NoSetup))
    }
}

impl ReaderSetup for NoSetup {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abiss::all_configurations;

    fn names(configurations: &[Configuration]) -> Vec<&str> {
        configurations.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn stock_rows_are_the_elevators_then_the_real_time_setups() {
        let all = stock_configurations();
        assert_eq!(
            names(&all),
            [
                "none",
                "mq-deadline",
                "kyber",
                "bfq",
                "bfq-rt",
                "mq-deadline-rt"
            ]
        );
        let bfq_rt = all[4].describe();
        assert_eq!(
            (bfq_rt.elevator.as_str(), bfq_rt.reader_class.as_str()),
            ("bfq", "rt/4")
        );
        assert_eq!(all[0].describe().reader_class, "default");
    }

    #[test]
    fn rows_keep_the_stock_order_and_comparison_rows_run_only_when_named() {
        let rows = |names: &[&str]| crate::row::RowsArg {
            rows: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        let pick = |names: &[&str], all: Vec<Configuration>| {
            rows(names).select(all, |c| &c.name, |c| !c.on_request)
        };
        let picked = pick(&["bfq", "none"], stock_configurations()).unwrap();
        assert_eq!(names(&picked), ["none", "bfq"]);
        assert_eq!(pick(&[], stock_configurations()).unwrap().len(), 6);
        let error = pick(&["cfq"], stock_configurations()).unwrap_err();
        assert!(error.to_string().contains("unknown row \"cfq\""));
        let everything = names(&pick(&[], all_configurations()).unwrap())
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<Vec<_>>();
        assert!(!everything.contains(&"abiss-bfq-fixed".to_owned()));
        assert!(everything.contains(&"abiss-mq-deadline-fixed".to_owned()));
        let named = pick(&["abiss-bfq-fixed"], all_configurations()).unwrap();
        assert_eq!(names(&named), ["abiss-bfq-fixed"]);
    }
}
