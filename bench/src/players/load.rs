//! The seeky best-effort load, all from one fio: random 16 KiB `O_DIRECT` reads at iodepth 16,
//! four buffered random readers (16 KiB read(2) calls; fio's default `fadvise_hint` makes them
//! random to the kernel, so no readahead), and one random 64 KiB `O_DIRECT` writer (direct, so
//! that it loads the disk steadily rather than in writeback bursts).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::fio::{self, OnDrop};
use crate::layout::drop_cached_pages;

/// The file the readers read (1 GiB: their seeks span a quarter of the lab disk).
const READ_FILE_BYTES: u64 = 1 << 30;
/// The file the writer writes.
const WRITE_FILE_BYTES: u64 = 256 << 20;

/// The load's files on the lab disk.
#[derive(Clone, Debug, Serialize)]
pub struct LoadFiles {
    /// What the readers read.
    pub read: PathBuf,
    /// What the writer writes.
    pub write: PathBuf,
}

fn job_file(files: &LoadFiles, runtime: Duration) -> String {
    format!(
        "[global]\n\
         time_based=1\nruntime={runtime}ms\nrandrepeat=0\n\
         [direct-reader]\nfilename={read}\nsize={read_size}\nrw=randread\nbs=16k\ndirect=1\n\
         ioengine=libaio\niodepth=16\n\
         [buffered-readers]\nfilename={read}\nsize={read_size}\nrw=randread\nbs=16k\ndirect=0\n\
         ioengine=psync\nnumjobs=4\n\
         [writer]\nfilename={write}\nsize={write_size}\nrw=randwrite\nbs=64k\ndirect=1\n\
         ioengine=psync\n",
        runtime = runtime.as_millis(),
        read = files.read.display(),
        write = files.write.display(),
        read_size = READ_FILE_BYTES,
        write_size = WRITE_FILE_BYTES,
    )
}

/// Lays the files out (fio writes them once) in `dir` and drops them from the page cache.
pub fn lay_out(dir: &Path) -> anyhow::Result<LoadFiles> {
    let files = LoadFiles {
        read: dir.join("load-read.dat"),
        write: dir.join("load-write.dat"),
    };
    let jobs = dir.join("load.fio");
    std::fs::write(&jobs, job_file(&files, Duration::from_secs(1)))?;
    fio::create_only(&jobs, "the load's files")?;
    std::fs::File::open(&files.read)?.sync_all()?;
    std::fs::File::open(&files.write)?.sync_all()?;
    drop_cached_pages(&files.read)?;
    drop_cached_pages(&files.write)?;
    Ok(files)
}

/// What the load moved.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadFigures {
    /// Seconds fio ran.
    pub runtime_s: f64,
    /// MB/s (10^6) of the `O_DIRECT` reader.
    pub direct_read_mb_s: f64,
    /// MB/s of the four buffered readers together.
    pub buffered_read_mb_s: f64,
    /// MB/s of the writer.
    pub write_mb_s: f64,
    /// All of it.
    pub total_mb_s: f64,
}

/// A running load; killed on drop.
pub type Load = fio::Load<LoadFigures>;

/// Starts the load for `runtime` on `files` (job file and output in `dir`), from a cold page
/// cache.
pub fn start(dir: &Path, files: &LoadFiles, runtime: Duration) -> anyhow::Result<Load> {
    drop_cached_pages(&files.read)?;
    Load::start(dir, &job_file(files, runtime), OnDrop::Kill, figures)
}

/// MB/s per part of the load from fio's JSON report.
#[must_use]
pub fn figures(report: &serde_json::Value) -> LoadFigures {
    let report = fio::Report::new(report);
    let rate =
        |name: &str, direction: &str| report.per_s(report.sum(name, direction, "io_bytes")) / 1e6;
    let direct = rate("direct-reader", "read");
    let buffered = rate("buffered-readers", "read");
    let write = rate("writer", "write");
    LoadFigures {
        runtime_s: report.runtime_s,
        direct_read_mb_s: direct,
        buffered_read_mb_s: buffered,
        write_mb_s: write,
        total_mb_s: direct + buffered + write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_add_up_the_jobs_by_name() {
        let report = serde_json::json!({"jobs": [
            {"jobname": "direct-reader", "job_runtime": 2000, "read": {"io_bytes": 4_000_000}, "write": {"io_bytes": 0}},
            {"jobname": "buffered-readers", "job_runtime": 2000, "read": {"io_bytes": 1_000_000}, "write": {"io_bytes": 0}},
            {"jobname": "buffered-readers", "job_runtime": 2000, "read": {"io_bytes": 1_000_000}, "write": {"io_bytes": 0}},
            {"jobname": "writer", "job_runtime": 2000, "read": {"io_bytes": 0}, "write": {"io_bytes": 6_000_000}},
        ]});
        let f = figures(&report);
        assert!((f.runtime_s - 2.0).abs() < 1e-9);
        assert!((f.direct_read_mb_s - 2.0).abs() < 1e-9);
        assert!((f.buffered_read_mb_s - 1.0).abs() < 1e-9);
        assert!((f.write_mb_s - 3.0).abs() < 1e-9);
        assert!((f.total_mb_s - 6.0).abs() < 1e-9);
    }
}
