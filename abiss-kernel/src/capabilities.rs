//! The parts of abiss that need kernel hooks some kernels lack. The block-layer programs are
//! the core and required (Linux 5.15: `request_queue.disk`, and the block tracepoints' `(rq)`
//! arguments from 5.11); each part below is optional: abissd attaches what the kernel has,
//! switches the rest off, and says so at start and in `abissctl status`.
//!
//! The first releases are those of `docs/building.md` ("Kernel history").

use abiss_proto::Capability;
use scheduler_common::names::program;

/// An optional part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum Feature {
    /// Following unmodified readers' playout point from their buffered reads and faults.
    ReadTracking,
    /// Raising a reader the moment it misses the page cache on an attached file
    /// (`miss-upgrades`, its earlier name, is still taken).
    #[value(alias = "miss-upgrades")]
    MissRaises,
    /// Counting `io_uring` requests on attached files and their latency and priority.
    UringReports,
    /// Finding the file of direct I/O requests, so they are tagged with their stream.
    DirectIoTagging,
}

impl Feature {
    /// Every optional part.
    pub const ALL: [Self; 4] = [
        Self::ReadTracking,
        Self::MissRaises,
        Self::UringReports,
        Self::DirectIoTagging,
    ];

    /// The name users give it (`--disable read-tracking`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::ReadTracking => "read-tracking",
            Self::MissRaises => "miss-raises",
            Self::UringReports => "uring-reports",
            Self::DirectIoTagging => "direct-io-tagging",
        }
    }

    /// Its programs and the tracepoints they attach to.
    #[must_use]
    pub fn programs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::ReadTracking => &[
                (program::GET_PAGES, "mm_filemap_get_pages"),
                (program::FAULT, "mm_filemap_fault"),
            ],
            Self::MissRaises => &[(program::SYNC_RA, "page_cache_sync_ra")],
            Self::UringReports => &[
                (program::URING_SUBMIT, "io_uring_submit_req"),
                (program::URING_COMPLETE, "io_uring_complete"),
            ],
            // Done inside the block programs, when the layout has the fields and the symbol.
            Self::DirectIoTagging => &[],
        }
    }

    /// Older programs that stand in when [`Self::programs`] cannot run (the kernel lacks
    /// them, or the operator switched them off as on such a kernel), and what they do less.
    #[must_use]
    pub fn stand_in(self) -> Option<(&'static [(&'static str, &'static str)], &'static str)> {
        match self {
            Self::MissRaises => Some((
                &[(program::CACHE_FILL, "mm_filemap_add_to_page_cache")],
                "standing in: filemap:mm_filemap_add_to_page_cache (pages a reader adds to the page cache); misses are counted and the reader is raised, but the window does not jump to where it missed",
            )),
            Self::ReadTracking | Self::UringReports | Self::DirectIoTagging => None,
        }
    }

    fn gives(self) -> &'static str {
        match self {
            Self::ReadTracking => "the window follows unmodified readers (read(2), mmap)",
            Self::MissRaises => "a reader that misses the page cache is raised at once",
            Self::UringReports => "io_uring requests on attached files are counted per stream",
            Self::DirectIoTagging => {
                "direct I/O requests carry their stream and raise their reader"
            }
        }
    }

    fn needs(self) -> &'static str {
        match self {
            Self::ReadTracking => "filemap:mm_filemap_get_pages and mm_filemap_fault (Linux 6.12)",
            Self::MissRaises => "readahead:page_cache_sync_ra (Linux 6.18)",
            Self::UringReports => {
                "io_uring:io_uring_submit_req (Linux 6.4) and io_uring_complete with its request (5.18), io_kiocb.cmd (6.0)"
            }
            Self::DirectIoTagging => {
                "iomap_dio_bio_end_io in /proc/kallsyms and struct iomap_dio.iocb in BTF"
            }
        }
    }

    /// What still works without it.
    fn without(self) -> &'static str {
        match self {
            Self::ReadTracking => {
                "unmodified readers' windows stay where they were filled; readers that send position messages (libabiss, abiss-client) are followed"
            }
            Self::MissRaises => "raises on low-priority requests still work",
            Self::UringReports => "io_uring reads are still prefetched and tagged; only the counts are missing",
            Self::DirectIoTagging => "buffered reads are tagged as before",
        }
    }

    /// The capability, on or off with the reason.
    #[must_use]
    pub fn report(self, off_because: Option<&str>) -> Capability {
        Capability {
            name: self.name().to_owned(),
            on: off_because.is_none(),
            gives: self.gives().to_owned(),
            needs: self.needs().to_owned(),
            off_because: off_because.map(|why| format!("{why}: {}", self.without())),
            stand_in: None,
        }
    }

    /// The capability, on through its stand-in because its own hooks are off for `why`.
    #[must_use]
    pub fn report_standing_in(self, why: &str) -> Capability {
        Capability {
            stand_in: self.stand_in().map(|(_, does)| format!("{why}; {does}")),
            ..self.report(None)
        }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_optional_program_belongs_to_one_feature() {
        let mut programs: Vec<&str> = Feature::ALL
            .iter()
            .flat_map(|f| f.programs().iter().map(|(program, _)| *program))
            .collect();
        let count = programs.len();
        programs.sort_unstable();
        programs.dedup();
        assert_eq!(programs.len(), count);
        assert_eq!(count, 5);
    }

    #[test]
    fn an_off_capability_says_why_and_what_still_works() {
        let off = Feature::MissRaises.report(Some("switched off (--disable miss-raises)"));
        assert!(!off.on);
        let why = off.off_because.expect("reason");
        assert!(
            why.contains("--disable") && why.contains("low-priority"),
            "{why}"
        );
        assert!(Feature::ReadTracking.report(None).on);
    }
}
