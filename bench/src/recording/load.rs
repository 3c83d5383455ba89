//! The best-effort load, all from one fio, of one of two kinds ([`LoadKind`]): the seeky load
//! (a sequential writer of 1 MiB buffered write(2) calls into a new file, a copy or a download:
//! every block newly allocated, its pages dirty until writeback; and two random 16 KiB
//! `O_DIRECT` readers of one 512 MiB file), or ABISS's greedy load (issue 36): 8 greedy
//! best-effort streams, 4 buffered writers of large new files and 4 sequential readers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::fio::{self, OnDrop};
use crate::layout::drop_cached_pages;

/// Which best-effort load a run puts beside its recorders and players.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum LoadKind {
    /// One buffered sequential writer and two random direct readers.
    #[default]
    Seeky,
    /// ABISS's measurement: 4 buffered sequential writers of large new files and 4 sequential
    /// readers, each as fast as it can.
    Greedy,
}

/// How many writers and readers the greedy load runs.
const GREEDY_WRITERS: u64 = 4;
const GREEDY_READERS: u64 = 4;
/// Each greedy writer's file (written over from its start when full).
const GREEDY_WRITE_FILE_BYTES: u64 = 512 << 20;

impl LoadKind {
    /// What it is, for the report.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Seeky => {
                "(fio, `--load seeky`): one sequential writer of 1 MiB buffered write(2) calls \
                 into a new file, two random 16 KiB `O_DIRECT` readers of a 512 MiB file"
            }
            Self::Greedy => {
                "(fio, `--load greedy`): 8 greedy streams as in ABISS's measurement, 4 \
                 sequential writers of 1 MiB buffered write(2) calls, each into a new 512 MiB \
                 file, and 4 sequential readers of 256 KiB `O_DIRECT` reads, each over its own \
                 quarter of a 512 MiB file"
            }
        }
    }

    /// The writers' files in `dir` (removed before each row, so their blocks are allocated
    /// anew).
    #[must_use]
    pub fn write_files(self, dir: &Path) -> Vec<PathBuf> {
        match self {
            Self::Seeky => vec![dir.join("load-write.dat")],
            Self::Greedy => (0..GREEDY_WRITERS)
                .map(|n| dir.join(format!("load-write.{n}.dat")))
                .collect(),
        }
    }
}

/// The readers' file.
const READ_FILE_BYTES: u64 = 512 << 20;
/// How far the writer writes before it starts over in its file (more than a row writes).
const WRITE_FILE_BYTES: u64 = 2 << 30;

/// The load's files on the lab disk.
#[derive(Clone, Debug, Serialize)]
pub struct LoadFiles {
    /// Which load.
    pub kind: LoadKind,
    /// What the readers read.
    pub read: PathBuf,
    /// Where the writers write ([`LoadKind::write_files`]).
    pub dir: PathBuf,
}

fn reader_job(files: &LoadFiles) -> String {
    format!(
        "[be-readers]\nfilename={}\nsize={READ_FILE_BYTES}\nrw=randread\nbs=16k\ndirect=1\n\
         ioengine=psync\nnumjobs=2\n",
        files.read.display()
    )
}

fn job_file(files: &LoadFiles, runtime: Duration) -> String {
    let global = format!(
        "[global]\ntime_based=1\nruntime={runtime}ms\nrandrepeat=0\n",
        runtime = runtime.as_millis()
    );
    match files.kind {
        LoadKind::Seeky => format!(
            "{global}[be-writer]\nfilename={write}\nsize={WRITE_FILE_BYTES}\nrw=write\nbs=1m\n\
             direct=0\nioengine=psync\nfallocate=none\ncreate_on_open=1\n{readers}",
            write = files.dir.join("load-write.dat").display(),
            readers = reader_job(files),
        ),
        LoadKind::Greedy => format!(
            "{global}[be-writer]\ndirectory={dir}\nfilename_format=load-write.$jobnum.dat\n\
             size={GREEDY_WRITE_FILE_BYTES}\nrw=write\nbs=1m\ndirect=0\nioengine=psync\n\
             fallocate=none\ncreate_on_open=1\nnumjobs={GREEDY_WRITERS}\n\
             [be-readers]\nfilename={read}\nsize={quarter}\noffset_increment={quarter}\n\
             rw=read\nbs=256k\ndirect=1\nioengine=psync\nnumjobs={GREEDY_READERS}\n",
            dir = files.dir.display(),
            read = files.read.display(),
            quarter = READ_FILE_BYTES / GREEDY_READERS,
        ),
    }
}

/// Lays out the readers' file in `dir` (fio writes it once) and drops it from the page cache.
pub fn lay_out(dir: &Path, scratch: &Path, kind: LoadKind) -> anyhow::Result<LoadFiles> {
    let files = LoadFiles {
        kind,
        read: dir.join("load-read.dat"),
        dir: dir.to_path_buf(),
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
    /// MB/s (10^6) the writers wrote (into the page cache: over a run, what the dirty limits
    /// let through to the disk, give or take the 64 MB they hold).
    pub write_mb_s: f64,
    /// MB/s the readers read together.
    pub read_mb_s: f64,
    /// Reads per second, all readers.
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
    fn the_greedy_loads_writers_write_the_files_a_row_removes_and_its_readers_split_the_file() {
        let files = LoadFiles {
            kind: LoadKind::Greedy,
            read: PathBuf::from("/lab/load-read.dat"),
            dir: PathBuf::from("/lab"),
        };
        let jobs = job_file(&files, Duration::from_secs(1));
        let written: Vec<PathBuf> = (0..GREEDY_WRITERS)
            .map(|n| {
                let name = "load-write.$jobnum.dat".replace("$jobnum", &n.to_string());
                files.dir.join(name)
            })
            .collect();
        assert!(
            jobs.contains("filename_format=load-write.$jobnum.dat"),
            "{jobs}"
        );
        assert_eq!(LoadKind::Greedy.write_files(&files.dir), written);
        assert!(
            jobs.contains(&format!("numjobs={GREEDY_WRITERS}")),
            "{jobs}"
        );
        let quarter = READ_FILE_BYTES / GREEDY_READERS;
        assert!(
            jobs.contains(&format!("size={quarter}\noffset_increment={quarter}")),
            "{jobs}"
        );
        let seeky = job_file(
            &LoadFiles {
                kind: LoadKind::Seeky,
                ..files.clone()
            },
            Duration::from_secs(1),
        );
        let seeky_written = LoadKind::Seeky.write_files(&files.dir);
        assert!(
            seeky.contains(&format!("filename={}", seeky_written[0].display())),
            "{seeky}"
        );
    }

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
