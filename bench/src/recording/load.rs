//! The best-effort load, all from one fio: a sequential writer of 1 MiB buffered write(2)
//! calls into a new file (a copy or a download: every block newly allocated, its pages dirty
//! until writeback), and two random 16 KiB `O_DIRECT` readers of one 512 MiB file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::fio::{self, OnDrop};
use crate::layout::drop_cached_pages;

/// The readers' file.
const READ_FILE_BYTES: u64 = 512 << 20;
/// How far the writer writes before it starts over in its file (more than a row writes).
const WRITE_FILE_BYTES: u64 = 2 << 30;

/// The load's files on the lab disk.
#[derive(Clone, Debug, Serialize)]
pub struct LoadFiles {
    /// What the readers read.
    pub read: PathBuf,
    /// What the writer writes (removed before each row, so its blocks are allocated anew).
    pub write: PathBuf,
}

fn reader_job(files: &LoadFiles) -> String {
    format!(
        "[be-readers]\nfilename={}\nsize={READ_FILE_BYTES}\nrw=randread\nbs=16k\ndirect=1\n\
         ioengine=psync\nnumjobs=2\n",
        files.read.display()
    )
}

fn job_file(files: &LoadFiles, runtime: Duration) -> String {
    format!(
        "[global]\ntime_based=1\nruntime={runtime}ms\nrandrepeat=0\n\
         [be-writer]\nfilename={write}\nsize={WRITE_FILE_BYTES}\nrw=write\nbs=1m\ndirect=0\n\
         ioengine=psync\nfallocate=none\ncreate_on_open=1\n{readers}",
        runtime = runtime.as_millis(),
        write = files.write.display(),
        readers = reader_job(files),
    )
}

/// Lays out the readers' file in `dir` (fio writes it once) and drops it from the page cache.
pub fn lay_out(dir: &Path, scratch: &Path) -> anyhow::Result<LoadFiles> {
    let files = LoadFiles {
        read: dir.join("load-read.dat"),
        write: dir.join("load-write.dat"),
    };
    let jobs = scratch.join("layout.fio");
    std::fs::write(&jobs, reader_job(&files))?;
    fio::create_only(&jobs, "the readers' file")?;
    std::fs::File::open(&files.read)?.sync_all()?;
    drop_cached_pages(&files.read)?;
    Ok(files)
}

/// What the load moved.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadFigures {
    /// Seconds fio ran.
    pub runtime_s: f64,
    /// MB/s (10^6) the writer wrote (into the page cache: over a run, what the dirty limits
    /// let through to the disk, give or take the 64 MB they hold).
    pub write_mb_s: f64,
    /// MB/s the two readers read together.
    pub read_mb_s: f64,
    /// Reads of 16 KiB per second, both readers.
    pub read_iops: f64,
}

/// A running load; killed on drop, with fio's jobs (processes of their own, in its group).
pub type Load = fio::Load<LoadFigures>;

/// Starts the load for `runtime` on `files` (job file and output in `scratch`), from a cold
/// page cache and a new file for the writer.
pub fn start(scratch: &Path, files: &LoadFiles, runtime: Duration) -> anyhow::Result<Load> {
    drop_cached_pages(&files.read)?;
    Load::start(
        scratch,
        &job_file(files, runtime),
        OnDrop::KillGroup,
        figures,
    )
}

/// MB/s per part of the load from fio's JSON report.
#[must_use]
pub fn figures(report: &serde_json::Value) -> LoadFigures {
    let report = fio::Report::new(report);
    let per_s =
        |name: &str, direction: &str, field: &str| report.per_s(report.sum(name, direction, field));
    LoadFigures {
        runtime_s: report.runtime_s,
        write_mb_s: per_s("be-writer", "write", "io_bytes") / 1e6,
        read_mb_s: per_s("be-readers", "read", "io_bytes") / 1e6,
        read_iops: per_s("be-readers", "read", "total_ios"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_add_up_the_jobs_by_name() {
        let report = serde_json::json!({"jobs": [
            {"jobname": "be-writer", "job_runtime": 2000, "read": {"io_bytes": 0, "total_ios": 0}, "write": {"io_bytes": 40_000_000}},
            {"jobname": "be-readers", "job_runtime": 2000, "read": {"io_bytes": 1_000_000, "total_ios": 61}, "write": {"io_bytes": 0}},
            {"jobname": "be-readers", "job_runtime": 1900, "read": {"io_bytes": 1_000_000, "total_ios": 61}, "write": {"io_bytes": 0}},
        ]});
        let f = figures(&report);
        assert!((f.runtime_s - 2.0).abs() < 1e-9);
        assert!((f.write_mb_s - 20.0).abs() < 1e-9);
        assert!((f.read_mb_s - 1.0).abs() < 1e-9);
        assert!((f.read_iops - 61.0).abs() < 1e-9);
    }
}
