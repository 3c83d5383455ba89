//! Unit tests of the start-up preroll and the preroll after a seek ([`super::super::preroll`]).
use super::*;
use crate::policy::probe_tail::PROBE_TAIL_BYTES;

/// A start-up preroll loads the head beyond the buffer at once, outside the credit; the window
/// takes over past it, and it exists only at the start.
#[test]
fn a_preroll_loads_the_head_at_once_and_the_window_takes_over_past_it() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let credit = buffer.credit_bytes();
    let preroll = buffer.preroll(5 * MB, false, true);
    assert_eq!(loaded(&preroll), page_ceil(5 * MB) - B);
    assert_eq!(buffer.credit_bytes(), credit, "not paid from the credit");
    complete(&mut buffer, &preroll);
    assert_eq!(buffer.locked_bytes(), page_ceil(5 * MB));
    // Nothing more loads while the preroll covers the window.
    assert_eq!(
        loaded(&buffer.on_read(0..MB, MonotonicNs(1_000_000_000))),
        0
    );
    // Past it, the window loads from the preroll's end on.
    let moves = buffer.on_read(MB..5 * MB, MonotonicNs(2_000_000_000));
    assert!(moves.iter().any(|a| matches!(a,
        WindowAction::Load { range, .. } if range.start == page_ceil(5 * MB))));
    // After a seek there is no preroll.
    let _ = buffer.on_read(50 * MB..50 * MB + 4096, MonotonicNs(3_000_000_000));
    assert!(buffer.preroll(60 * MB, false, true).is_empty());
}

/// A preroll with the file's tail loads the head's next piece, the tail, then the rest of the
/// head, in the order players read them; the player's probe of the tail is no seek, and the
/// tail is let go once the window passes the head preroll, or at a seek.
#[test]
fn a_preroll_with_the_tail_serves_the_probe_of_the_end_without_a_seek() {
    let file = 90 * MB;
    let (mut buffer, actions) = PlayoutBuffer::new(shape(file), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let preroll = buffer.preroll(5 * MB, true, true);
    let ranges = load_ranges(&preroll);
    let [lead, tail, rest] = &ranges[..] else {
        panic!("the head's next piece, the tail, the rest: {preroll:?}");
    };
    assert_eq!((lead.start, lead.end - lead.start), (B, PREROLL_LEAD_BYTES));
    assert_eq!((rest.start, rest.end), (lead.end, page_ceil(5 * MB)));
    let tail = tail.clone();
    assert_eq!(tail.end, page_ceil(file));
    assert_eq!(
        loaded(&preroll),
        page_ceil(5 * MB) - B + (tail.end - tail.start)
    );
    complete(&mut buffer, &preroll);
    assert_eq!(
        buffer.locked_bytes(),
        page_ceil(5 * MB) + (tail.end - tail.start)
    );
    assert_eq!(buffer.locked_ranges().len(), 2);

    // GStreamer: a look at the head, the last 56 kB, then the head again (ffmpeg reads the
    // last 250,000 bytes after 5 MB of the head, and its return to the start is a seek).
    let _ = buffer.on_read(0..135_168, MonotonicNs(1_000_000_000));
    let probe = buffer.on_read(file - 56_400..file, MonotonicNs(1_100_000_000));
    assert!(
        probe.iter().all(|a| !matches!(
            a,
            WindowAction::Release { .. } | WindowAction::CancelGeneration(_)
        )),
        "{probe:?}"
    );
    assert_eq!(buffer.seeks(), 0);
    let _ = buffer.on_read(0..64 * 1024, MonotonicNs(1_200_000_000));
    assert_eq!(buffer.seeks(), 0, "the window stayed at the head");
    assert!(buffer.locked_ranges().contains(&tail));

    // Past the head preroll the tail goes.
    let moves = buffer.on_read(5 * MB - MB..5 * MB + 8192, MonotonicNs(2_000_000_000));
    assert!(
        moves.contains(&WindowAction::Release {
            range: tail.clone()
        }),
        "{moves:?}"
    );
    assert!(!buffer.locked_ranges().contains(&tail));

    // At a seek, too.
    let (mut buffer, actions) = PlayoutBuffer::new(shape(file), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let preroll = buffer.preroll(5 * MB, true, true);
    complete(&mut buffer, &preroll);
    let seek = buffer.on_read(40 * MB..40 * MB + 4096, MonotonicNs(1_000_000_000));
    assert!(
        seek.contains(&WindowAction::Release { range: tail }),
        "{seek:?}"
    );
    complete(&mut buffer, &seek);
    assert!(buffer.locked_bytes() <= B + BATCH);
}

/// A preroll of the only stream starting on its disk is queued with the first window, in
/// reading order, so the stream's real-time queue is never empty while the start loads.
#[test]
fn a_preroll_alone_on_its_disk_goes_with_the_first_window() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    let preroll = buffer.preroll(5 * MB, true, false);
    let ranges = load_ranges(&preroll);
    let [lead, tail, rest] = &ranges[..] else {
        panic!("the head's next piece, the tail, the rest: {preroll:?}");
    };
    assert_eq!((lead.start, lead.end), (B, B + PREROLL_LEAD_BYTES));
    assert_eq!(tail.end, page_ceil(105 * MB));
    assert!(tail.end - tail.start >= PROBE_TAIL_BYTES);
    assert_eq!((rest.start, rest.end), (lead.end, page_ceil(5 * MB)));
    assert_eq!(loaded(&complete(&mut buffer, &actions)), 0, "queued once");
    // The window is in: a wait now is a miss, though the preroll is still loading.
    assert!(!buffer.is_starting());
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss);
    complete(&mut buffer, &preroll);
    assert_eq!(
        buffer.locked_bytes(),
        page_ceil(5 * MB) + (tail.end - tail.start)
    );
}

/// A preroll asked for while another stream's first window is loading on its disk, and its
/// own is too, queues only its first piece with it (so the disk is not left to best effort
/// while abissd queues the rest), and the rest once either is locked: the other window's
/// reads are not queued behind the whole preroll.
#[test]
fn a_preroll_while_another_stream_starts_follows_the_first_lock() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    let lead = buffer.preroll(5 * MB, true, true);
    assert_eq!(
        lead,
        vec![WindowAction::Load {
            range: B..B + PREROLL_LEAD_BYTES,
            generation: 0
        }],
        "only the first piece goes with the window"
    );
    let rest = complete(&mut buffer, &actions);
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss, "the window is in");
    let ranges = load_ranges(&rest);
    let [next, tail, more] = &ranges[..] else {
        panic!("the next piece, the tail, the rest of the head: {rest:?}");
    };
    let head_end = B + 2 * PREROLL_LEAD_BYTES;
    assert_eq!((next.start, next.end), (B + PREROLL_LEAD_BYTES, head_end));
    assert_eq!(tail.end, page_ceil(105 * MB));
    assert_eq!((more.start, more.end), (head_end, page_ceil(5 * MB)));
    assert!(complete(&mut buffer, &lead).is_empty(), "queued once");
    complete(&mut buffer, &rest);
    assert_eq!(
        buffer.locked_bytes(),
        page_ceil(5 * MB) + (tail.end - tail.start)
    );
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss, "started");
    // A seek before the window was locked drops a waiting preroll and its first piece.
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    let lead = buffer.preroll(5 * MB, false, true);
    let seek = buffer.on_read(50 * MB..50 * MB + 4096, MonotonicNs(1_000_000));
    let after = complete(&mut buffer, &actions);
    assert_eq!(loaded(&after), 0, "{after:?}");
    let _ = complete(&mut buffer, &lead);
    let _ = complete(&mut buffer, &seek);
    assert!(buffer.locked_bytes() <= B);
    // The disk may serve the first piece before the window: the rest follows it then.
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    let lead = buffer.preroll(5 * MB, false, true);
    let rest = complete(&mut buffer, &lead);
    assert_eq!(
        loaded(&rest),
        page_ceil(5 * MB) - B - PREROLL_LEAD_BYTES,
        "{rest:?}"
    );
    assert_eq!(
        buffer.reader_wait(),
        ReaderWait::Start,
        "the window is not in"
    );
    assert_eq!(loaded(&complete(&mut buffer, &actions)), 0, "queued once");
    complete(&mut buffer, &rest);
    assert_eq!(buffer.locked_bytes(), page_ceil(5 * MB));
}

/// A failed load of a window queued with its whole preroll asks for the window again, and
/// the preroll's part past it once the window is locked: the window's refill alone stops at
/// its end.
#[test]
fn a_failed_first_window_asks_for_its_preroll_again() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    let preroll = buffer.preroll(5 * MB, false, false);
    for action in &actions {
        if let WindowAction::Load { range, generation } = action {
            buffer.on_failed(range, *generation);
        }
    }
    // The preroll's loads arrive past the rewound window and are let go.
    let arrived = complete(&mut buffer, &preroll);
    assert!(
        arrived
            .iter()
            .all(|a| matches!(a, WindowAction::Release { .. })),
        "{arrived:?}"
    );
    assert_eq!(buffer.locked_bytes(), 0);
    let refill = buffer.on_tick(MonotonicNs(1_000_000));
    assert_eq!(load_ranges(&refill), vec![0..B], "{refill:?}");
    let again = complete(&mut buffer, &refill);
    assert_eq!(
        load_ranges(&again),
        vec![
            B..B + PREROLL_LEAD_BYTES,
            B + PREROLL_LEAD_BYTES..page_ceil(5 * MB)
        ]
    );
    complete(&mut buffer, &again);
    assert_eq!(buffer.locked_bytes(), page_ceil(5 * MB));
}

/// Reads `len` bytes from `at` on in 64 KiB reads, completing every load at once.
fn read_on(buffer: &mut PlayoutBuffer, at: u64, len: u64, now: MonotonicNs) {
    let mut offset = at;
    while offset < at + len {
        let end = (offset + (64 << 10)).min(at + len);
        let actions = buffer.on_read(offset..end, now);
        complete(buffer, &actions);
        offset = end;
    }
}

/// After a seek, the reader reading on from its new point prerolls once, up to the preroll's
/// size from the window's start, as far as the grant allows; a reader still looking for its
/// start (ffmpeg's bisection: 132 KiB at each point, then a jump) prerolls nothing, and
/// neither does a stream that never sought.
#[test]
fn a_reader_that_reads_on_after_a_seek_prerolls_once_and_a_bisection_does_not() {
    const PREROLL: u64 = 6 << 20;
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let unasked = |_: u64| -> u64 { panic!("no preroll is due") };
    read_on(&mut buffer, 0, MB, MonotonicNs(1_000));
    assert!(buffer.preroll_after_seek(PREROLL, unasked).is_empty());
    for (i, point) in [50 * MB, 25 * MB, 37 * MB, 43 * MB].into_iter().enumerate() {
        let now = MonotonicNs(2_000 + i as u64);
        let jump = buffer.on_read(point..point + (128 << 10), now);
        complete(&mut buffer, &jump);
        read_on(&mut buffer, point + (128 << 10), 4 << 10, now);
        assert!(buffer.preroll_after_seek(PREROLL, unasked).is_empty());
    }
    // The last point: the player plays from there.
    let point = 43 * MB;
    read_on(
        &mut buffer,
        point + (132 << 10),
        SETTLED_BYTES,
        MonotonicNs(3_000),
    );
    let (start, from) = (buffer.window_start(), buffer.requested_end());
    assert!(start < point + (132 << 10) + SETTLED_BYTES && from >= start);
    let mut asked = 0;
    let ahead = buffer.preroll_after_seek(PREROLL, |wanted| {
        asked = wanted;
        wanted
    });
    assert_eq!(asked, start + PREROLL - from);
    assert_eq!(load_ranges(&ahead), vec![(from..start + PREROLL)]);
    complete(&mut buffer, &ahead);
    assert_eq!(
        buffer.locked_bytes(),
        PREROLL,
        "the window and the preroll, no more"
    );
    assert!(
        buffer.preroll_after_seek(PREROLL, unasked).is_empty(),
        "once per seek"
    );
    // Passed, it is released like the window; the next seek lets go of the rest.
    let at = buffer.app_point();
    read_on(&mut buffer, at, MB, MonotonicNs(4_000));
    assert!(!buffer.is_resident(start) && buffer.is_resident(start + PREROLL - 1));
    assert!(buffer.locked_bytes() < PREROLL);
    let locked = buffer.locked_bytes();
    let seek = buffer.on_read(90 * MB..90 * MB + 4096, MonotonicNs(5_000));
    assert_eq!(released(&seek), locked, "all of it");
}

/// A stream that jumped to `point` and has read on [`SETTLED_BYTES`] from there.
fn settled_at(point: u64) -> PlayoutBuffer {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let jump = buffer.on_read(point..point + 4096, MonotonicNs(1_000));
    complete(&mut buffer, &jump);
    read_on(&mut buffer, point, SETTLED_BYTES, MonotonicNs(2_000));
    buffer
}

/// A grant short of what the preroll wants loads what it paid for, in whole pages, from what
/// the window asked for on; a preroll no larger than the window loads nothing more.
#[test]
fn a_preroll_after_a_seek_loads_what_was_granted_and_nothing_within_the_window() {
    let mut buffer = settled_at(60 * MB);
    let asked = buffer.requested_end();
    let ahead = buffer.preroll_after_seek(6 << 20, |_| MB + 100);
    assert_eq!(loaded(&ahead), page_floor(MB + 100));
    assert_eq!(load_ranges(&ahead)[0].start, asked);
    assert!(settled_at(60 * MB)
        .preroll_after_seek(B / 2, |_| panic!("nothing to pay"))
        .is_empty());
}
