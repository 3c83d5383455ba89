//! One file, several streams: viewers of one popular file at different points, and a recording
//! watched while it is being recorded (timeshift).
//!
//! The kernel sees one entry per file (its tag, the most urgent level, whose reads to report), and
//! every access it reports names the file, not the stream. Which stream an access belongs to is
//! decided here: the stream that process is known to read (`abissctl run` and the libraries name
//! their player before it reads; otherwise it is the stream it was first routed to), else the
//! stream whose window holds the bytes read, else a stream still waiting for its first reader.
//! Each stream keeps its own window and its own mapping: windows that overlap lock the same
//! page-cache pages, which are read from the disk once.

use std::ops::Range;

use abiss_proto::StreamId;
use scheduler_common::{AbissLevel, AttachedFile, ANY_READER};

/// The most streams one file may have. Each is a stream of its owner (counted against the
/// daemon's and the user's limits); this bounds the work of routing one access.
pub(crate) const MAX_STREAMS_PER_FILE: usize = 16;

/// The most streams one user (root exempt) may have of one file: a quarter of
/// [`MAX_STREAMS_PER_FILE`], so one user's persistent 1 B/s streams cannot take every slot of
/// a popular file and lock other users out of it.
pub(crate) const MAX_STREAMS_PER_USER_PER_FILE: usize = MAX_STREAMS_PER_FILE / 4;

/// One stream of a file, as routing and the kernel entry see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileStream {
    /// Stream id.
    pub(crate) id: StreamId,
    /// Its owner.
    pub(crate) owner_uid: u32,
    /// Its ABISS level.
    pub(crate) level: AbissLevel,
    /// A write stream (a recording): reads are not its.
    pub(crate) recording: bool,
    /// Where its reader is and how far ahead it holds data: the bytes whose reads are its.
    pub(crate) window: Range<u64>,
    /// The process of the access was seen reading it.
    pub(crate) known_reader: bool,
    /// No reader was seen on it yet (just attached: its player is starting).
    pub(crate) waiting_for_reader: bool,
}

/// The kernel's entry for a file whose streams are `streams` (at least one), tagged `tag`, at
/// the most urgent of their levels: a request below it is reported, and abissd holds it
/// against the reader's own stream (a raise to a level the thread has already is none).
#[must_use]
pub(crate) fn kernel_entry(tag: u64, streams: &[FileStream]) -> AttachedFile {
    let level = streams
        .iter()
        .map(|s| s.level)
        .min()
        .unwrap_or(AbissLevel::HIGHEST);
    let mut owners: Vec<u32> = streams.iter().map(|s| s.owner_uid).collect();
    owners.sort_unstable();
    owners.dedup();
    // Root's streams follow any reader (root attaches for services that read as themselves).
    let readers = match owners.as_slice() {
        [one] if *one != 0 => [*one, *one],
        [first, second] if *first != 0 => [*first, *second],
        _ => [ANY_READER, ANY_READER],
    };
    // The map's entry keeps the ABI's plain number.
    AttachedFile::new(tag, level.get(), readers)
}

/// The stream of `streams` that an access by user `uid` belongs to: one at `range` (a read,
/// fault or miss), or somewhere (`None`: a request queued low, pages added, an `io_uring`
/// completion). Only the owner's streams take a user's accesses (root's take those of users
/// with no stream of their own on the file); reads go to read streams, and to a recording
/// only when the file has no read stream of the user.
#[must_use]
pub(crate) fn route(
    streams: &[FileStream],
    uid: u32,
    range: Option<&Range<u64>>,
) -> Option<StreamId> {
    // A user's own streams take the user's accesses; root's take them only when the user has
    // none on the file (a service reading a file root attached for it).
    let owns = streams.iter().any(|s| s.owner_uid == uid);
    let theirs = |s: &&FileStream| s.owner_uid == uid || (!owns && s.owner_uid == 0);
    let mut readers: Vec<&FileStream> = streams
        .iter()
        .filter(theirs)
        .filter(|s| !s.recording)
        .collect();
    if readers.is_empty() {
        return streams.iter().find(theirs).map(|s| s.id);
    }
    // A process known to read a stream reads for that stream wherever it reads: a read outside
    // its window is its own jump (a viewer's probe of the head, its seek), not a read in another
    // viewer's window. Before, eight viewers of one file started together stole each other's
    // reads whenever a viewer's window had moved on and another's, still waiting for its
    // player, held the bytes: that window followed the wrong player and its own player's first
    // reads missed (9 and 10 misses with no load at all, `abiss-8-viewers-no-load`).
    if readers.iter().any(|s| s.known_reader) {
        readers.retain(|s| s.known_reader);
        return holding(&readers, range).or_else(|| nearest(&readers, range));
    }
    // A process no stream knows: the window holding the bytes; for a jump, or an access with
    // no place, a stream whose player has not read yet, else the one nearest the bytes.
    holding(&readers, range)
        .or_else(|| readers.iter().find(|s| s.waiting_for_reader).map(|s| s.id))
        .or_else(|| nearest(&readers, range))
}

/// Of `streams`, the one whose window holds `range`'s start; of overlapping windows, the one
/// whose reader is nearest behind it.
fn holding(streams: &[&FileStream], range: Option<&Range<u64>>) -> Option<StreamId> {
    let start = range?.start;
    streams
        .iter()
        .filter(|s| s.window.contains(&start))
        .min_by_key(|s| start - s.window.start)
        .map(|s| s.id)
}

/// Of `streams`, the one whose window starts nearest behind `range` (the file's start for an
/// access with no place), else nearest ahead of it.
fn nearest(streams: &[&FileStream], range: Option<&Range<u64>>) -> Option<StreamId> {
    let start = range.map_or(0, |r| r.start);
    streams
        .iter()
        .min_by_key(|s| (s.window.start > start, start.abs_diff(s.window.start), s.id))
        .map(|s| s.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn level(number: u8) -> AbissLevel {
        AbissLevel::new(number).expect("a level")
    }

    fn viewer(id: u64, owner_uid: u32, window: Range<u64>) -> FileStream {
        FileStream {
            id: StreamId(id),
            owner_uid,
            level: level(1),
            recording: false,
            window,
            known_reader: false,
            waiting_for_reader: false,
        }
    }

    #[test]
    fn a_read_belongs_to_the_window_that_holds_it() {
        let streams = [viewer(1, 1000, 0..1_000), viewer(2, 1000, 50_000..51_000)];
        assert_eq!(
            route(&streams, 1000, Some(&(50_100..50_200))),
            Some(StreamId(2))
        );
        assert_eq!(route(&streams, 1000, Some(&(10..20))), Some(StreamId(1)));
        // Overlapping windows: the reader nearest behind, unless the process is known.
        let mut overlapping = [viewer(1, 1000, 0..1_000), viewer(2, 1000, 400..1_400)];
        assert_eq!(
            route(&overlapping, 1000, Some(&(500..600))),
            Some(StreamId(2))
        );
        overlapping[0].known_reader = true;
        assert_eq!(
            route(&overlapping, 1000, Some(&(500..600))),
            Some(StreamId(1))
        );
    }

    #[test]
    fn a_jump_goes_to_the_process_s_stream_then_to_one_waiting_for_its_player() {
        let mut streams = [viewer(1, 1000, 0..1_000), viewer(2, 1000, 50_000..51_000)];
        assert_eq!(
            route(&streams, 1000, Some(&(90_000..90_100))),
            Some(StreamId(2))
        );
        streams[0].known_reader = true;
        assert_eq!(
            route(&streams, 1000, Some(&(90_000..90_100))),
            Some(StreamId(1))
        );
        streams[0].known_reader = false;
        streams[0].waiting_for_reader = true;
        assert_eq!(route(&streams, 1000, None), Some(StreamId(1)));
    }

    #[test]
    fn a_known_reader_s_reads_stay_on_its_stream_even_in_another_viewer_s_window() {
        // Viewer 1 jumped to 50 000; viewer 2 waits for its player with its window at the head.
        let mut streams = [viewer(1, 1000, 50_000..51_000), viewer(2, 1000, 0..6_000)];
        streams[1].waiting_for_reader = true;
        // An unknown process reading the head reads in viewer 2's window.
        assert_eq!(route(&streams, 1000, Some(&(10..20))), Some(StreamId(2)));
        // Viewer 1's player reading the head again (its probe) jumps its own stream back.
        streams[0].known_reader = true;
        assert_eq!(route(&streams, 1000, Some(&(10..20))), Some(StreamId(1)));
        assert_eq!(route(&streams, 1000, None), Some(StreamId(1)));
        // A process with two streams of the file: the one whose window holds the bytes, else
        // the one nearest behind them.
        streams[1].known_reader = true;
        assert_eq!(route(&streams, 1000, Some(&(10..20))), Some(StreamId(2)));
        assert_eq!(
            route(&streams, 1000, Some(&(60_000..60_100))),
            Some(StreamId(1))
        );
        assert_eq!(
            route(&streams, 1000, Some(&(20_000..20_100))),
            Some(StreamId(2))
        );
    }

    #[test]
    fn users_steer_only_their_own_streams_and_reads_skip_recordings() {
        let mut recording = viewer(1, 1000, 0..0);
        recording.recording = true;
        let streams = [recording.clone(), viewer(2, 1001, 0..1_000)];
        assert_eq!(route(&streams, 1000, Some(&(10..20))), Some(StreamId(1)));
        assert_eq!(route(&streams, 1001, Some(&(10..20))), Some(StreamId(2)));
        assert_eq!(route(&streams, 1002, Some(&(10..20))), None);
        let with_reader = [recording, viewer(2, 1000, 0..1_000)];
        assert_eq!(
            route(&with_reader, 1000, Some(&(10..20))),
            Some(StreamId(2))
        );
        // Root's streams take the reads of users with none of their own.
        let shared = [viewer(3, 0, 0..10), viewer(4, 1001, 100..200)];
        assert_eq!(route(&shared, 1002, Some(&(5..6))), Some(StreamId(3)));
        assert_eq!(route(&shared, 1001, Some(&(5..6))), Some(StreamId(4)));
        assert_eq!(route(&shared, 0, Some(&(150..160))), Some(StreamId(3)));
    }

    #[test]
    fn the_kernel_entry_reports_the_owners_at_the_most_urgent_level() {
        let mut streams = vec![viewer(4, 1000, 0..1)];
        assert_eq!(kernel_entry(4, &streams).reader_uids, [1000, 1000]);
        streams.push(FileStream {
            level: level(3),
            ..viewer(5, 1001, 0..1)
        });
        let entry = kernel_entry(4, &streams);
        assert_eq!((entry.stream, entry.level), (4, 1));
        // Another user's least urgent stream does not hide the first's requests.
        streams.push(FileStream {
            level: AbissLevel::LOWEST,
            ..viewer(8, 1001, 0..1)
        });
        assert_eq!(kernel_entry(4, &streams).level, 1);
        streams.pop();
        assert_eq!(entry.reader_uids, [1000, 1001]);
        assert!(entry.reports(1001) && !entry.reports(1002));
        streams.push(viewer(6, 1002, 0..1));
        assert!(kernel_entry(4, &streams).reports(4242));
        assert!(kernel_entry(4, &[viewer(7, 0, 0..1)]).reports(4242));
    }

    fn streams_strategy() -> impl Strategy<Value = Vec<FileStream>> {
        let one = (
            0..4u32,
            any::<bool>(),
            0..100_000u64,
            0..20_000u64,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(
                |(owner, recording, start, len, known, waiting)| FileStream {
                    id: StreamId(0),
                    owner_uid: owner,
                    level: level(1),
                    recording,
                    window: start..start + len,
                    known_reader: known,
                    waiting_for_reader: waiting,
                },
            );
        proptest::collection::vec(one, 1..MAX_STREAMS_PER_FILE).prop_map(|mut streams| {
            for (id, stream) in (1..).zip(&mut streams) {
                stream.id = StreamId(id);
            }
            streams
        })
    }

    proptest! {
        /// An access goes to a stream the user may steer, a read goes to a recording only when
        /// the user has no read stream on the file, and a known reader's access to a stream
        /// that knows it; the kernel reports every owner.
        #[test]
        fn accesses_go_only_to_streams_the_user_may_steer(
            streams in streams_strategy(),
            uid in 0..5u32,
            at in proptest::option::of(0..150_000u64),
        ) {
            let range = at.map(|at| at..at + 4096);
            let routed = route(&streams, uid, range.as_ref());
            let owns = streams.iter().any(|s| s.owner_uid == uid);
            let may = |s: &FileStream| s.owner_uid == uid || (!owns && s.owner_uid == 0);
            match routed {
                None => prop_assert!(!streams.iter().any(may)),
                Some(id) => {
                    let chosen = streams.iter().find(|s| s.id == id).unwrap();
                    prop_assert!(may(chosen));
                    if chosen.recording {
                        prop_assert!(!streams.iter().any(|s| may(s) && !s.recording));
                    }
                    // A process that a read stream the user may steer knows reads only
                    // streams that know it.
                    if streams.iter().any(|s| may(s) && !s.recording && s.known_reader) {
                        prop_assert!(chosen.known_reader && !chosen.recording);
                    }
                }
            }
            let entry = kernel_entry(streams[0].id.0, &streams);
            for stream in &streams {
                prop_assert!(entry.reports(stream.owner_uid) || stream.owner_uid == 0);
                prop_assert!(entry.level <= stream.level.get());
            }
        }
    }
}
