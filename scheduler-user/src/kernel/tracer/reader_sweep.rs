//! The followed reader processes (`FILE_READERS`) swept of those that are gone, on a thread of
//! its own: users can fill the table (256 each, 16 384 in all), and a walk of it with a signal
//! 0 to every process took up to 98 ms of abissd's main loop every 10 s (release build, 64
//! users of 256 live readers each, 2026-12-07). The thread has handles of its own to the maps,
//! opened by their ids, and is the one writer of what users are given back (`READER_GIVEN`), so
//! its read-and-write races with nobody; it also empties the three maps when the last file is
//! detached, for the same reason.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use aya::maps::{HashMap, MapData};
use log::{info, warn};
use scheduler_common::{FileReader, MAX_FILE_READERS};

/// How often the gone are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The sweeping thread; it ends when this drops.
#[derive(Debug)]
pub(crate) struct ReaderSweep {
    forget: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// The thread's own handles to the maps.
pub(super) struct ReaderMaps {
    pub(super) readers: HashMap<MapData, u32, FileReader>,
    pub(super) added: HashMap<MapData, u32, u64>,
    pub(super) given: HashMap<MapData, u32, u64>,
}

impl ReaderSweep {
    /// Starts the thread over `maps`.
    pub(super) fn start(mut maps: ReaderMaps) -> std::io::Result<Self> {
        let (forget, orders) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("abiss-sweep-readers".into())
            .spawn(move || loop {
                match orders.recv_timeout(SWEEP_EVERY) {
                    Ok(()) => maps.forget(),
                    Err(RecvTimeoutError::Timeout) => match maps.sweep() {
                        0 => {}
                        gone => info!("stopped following {gone} reader processes that are gone"),
                    },
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            })?;
        Ok(Self {
            forget: Some(forget),
            thread: Some(thread),
        })
    }

    /// Empties the maps (no file is attached any more): on the thread, after what it is doing.
    pub(crate) fn forget(&self) {
        if let Some(forget) = &self.forget {
            let _ = forget.send(());
        }
    }
}

impl Drop for ReaderSweep {
    fn drop(&mut self) {
        drop(self.forget.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl ReaderMaps {
    /// Drops the followed readers whose process is gone, and counts their users' room given
    /// back; how many. A process id taken again by a new process keeps the entry, counted
    /// against the user it was made for, until that process is gone too.
    fn sweep(&mut self) -> usize {
        // A walk whose key is deleted meanwhile starts over: it is cut at one pass's worth of
        // steps, and what it saw twice counts once.
        let mut gone: Vec<(u32, u32)> = self
            .readers
            .iter()
            .take(MAX_FILE_READERS as usize)
            .filter_map(Result::ok)
            .filter(|&(tgid, _)| !process_exists(tgid))
            .map(|(tgid, reader)| (tgid, reader.uid))
            .collect();
        gone.sort_unstable();
        gone.dedup();
        let mut removed = 0;
        for (tgid, uid) in gone {
            if self.readers.remove(&tgid).is_ok() {
                removed += 1;
                let count = self.given.get(&uid, 0).unwrap_or(0);
                let _ = self.given.insert(uid, count.saturating_add(1), 0);
            }
        }
        removed
    }

    /// Empties the readers and both counts.
    fn forget(&mut self) {
        let readers: Vec<u32> = self
            .readers
            .keys()
            .take(MAX_FILE_READERS as usize)
            .filter_map(Result::ok)
            .collect();
        for tgid in readers {
            let _ = self.readers.remove(&tgid);
        }
        for counts in [&mut self.added, &mut self.given] {
            let users: Vec<u32> = counts
                .keys()
                .take(MAX_FILE_READERS as usize)
                .filter_map(Result::ok)
                .collect();
            for uid in users {
                if let Err(error) = counts.remove(&uid) {
                    warn!("cannot forget a reader count: {error}");
                }
            }
        }
    }
}

/// Whether process `tgid` exists (a signal 0 finds it; abissd is root, so it may signal any).
fn process_exists(tgid: u32) -> bool {
    let Ok(pid) = i32::try_from(tgid) else {
        return false;
    };
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}
