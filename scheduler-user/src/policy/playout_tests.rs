//! Unit and property tests of [`super`] (kept apart so the policy file stays readable).
use super::*;
use proptest::prelude::*;

use super::preroll::SETTLED_BYTES;

const MB: u64 = 1_000_000;
const B: u64 = 564 * 1024;
const BATCH: u64 = 20 * PAGE;

fn shape(file_bytes: u64) -> PlayoutShape {
    PlayoutShape {
        file_bytes,
        buffer_bytes: B,
        batch_bytes: BATCH,
        rate_bps: MB,
        credit_limit_bytes: 2 * B,
    }
}

/// Completes every load at once, as an infinitely fast disk would.
fn complete(buffer: &mut PlayoutBuffer, actions: &[WindowAction]) -> Vec<WindowAction> {
    let mut follow_up = Vec::new();
    for action in actions {
        if let WindowAction::Load { range, generation } = action {
            follow_up.extend(buffer.on_loaded(range.clone(), *generation));
        }
    }
    follow_up
}

/// The ranges `actions` load, in order.
fn load_ranges(actions: &[WindowAction]) -> Vec<Range<u64>> {
    actions
        .iter()
        .filter_map(|action| match action {
            WindowAction::Load { range, .. } => Some(range.clone()),
            _ => None,
        })
        .collect()
}

fn loaded(actions: &[WindowAction]) -> u64 {
    actions
        .iter()
        .map(|a| match a {
            WindowAction::Load { range, .. } => range.end - range.start,
            _ => 0,
        })
        .sum()
}

fn released(actions: &[WindowAction]) -> u64 {
    actions
        .iter()
        .map(|a| match a {
            WindowAction::Release { range } => range.end - range.start,
            _ => 0,
        })
        .sum()
}

#[test]
fn the_initial_fill_loads_the_whole_buffer_in_one_request() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    assert_eq!(loaded(&actions), B);
    assert_eq!(actions.len(), 1);
    complete(&mut buffer, &actions);
    assert_eq!(buffer.locked_bytes(), B);
    assert!(buffer.is_resident(0) && buffer.is_resident(B - 1) && !buffer.is_resident(B));
}

#[test]
fn a_reader_at_the_rate_always_finds_the_next_buffer_loaded() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let read = 64 * 1024;
    let period_ns = read * 1_000_000_000 / MB;
    for i in 1..1000u64 {
        let now = i * period_ns;
        let actions = buffer.on_tick(MonotonicNs(now));
        complete(&mut buffer, &actions);
        // Everything up to the end of the next read is resident before the read is made.
        assert!(
            buffer.is_resident(i * read + read - 1),
            "read {i} would miss"
        );
        let actions = buffer.on_position(i * read + read, MonotonicNs(now));
        complete(&mut buffer, &actions);
        assert!(buffer.locked_bytes() <= B + BATCH);
    }
}

#[test]
fn a_reader_at_four_times_the_rate_gets_no_more_than_the_rate() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let read = 64 * 1024;
    let period_ns = read * 1_000_000_000 / (4 * MB);
    let mut now = 0;
    for i in 1..400u64 {
        now = i * period_ns;
        let actions = buffer.on_position(i * read, MonotonicNs(now));
        complete(&mut buffer, &actions);
    }
    let allowed = 2 * B + MB * now / 1_000_000_000 + BATCH;
    assert!(
        buffer.prefetched_bytes() <= allowed,
        "{} > {allowed}",
        buffer.prefetched_bytes()
    );
    assert_eq!(buffer.seeks(), 0, "reading ahead is not seeking");
}

#[test]
fn a_seek_cancels_releases_and_refills_from_the_new_point() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let target = 50 * MB + 123;
    let actions = buffer.on_position(target, MonotonicNs(1_000_000_000));
    assert_eq!(actions.first(), Some(&WindowAction::CancelGeneration(0)));
    assert!(actions.contains(&WindowAction::Release { range: 0..B }));
    assert_eq!(buffer.window_start(), page_floor(target));
    // A completion of the old generation arriving late is released, not kept.
    assert_eq!(
        buffer.on_loaded(0..BATCH, 0),
        vec![WindowAction::Release { range: 0..BATCH }]
    );
    complete(&mut buffer, &actions);
    assert!(buffer.is_resident(target) && buffer.is_resident(page_floor(target) + B - 1));
    assert_eq!(buffer.seeks(), 1);
}

#[test]
fn late_reports_of_earlier_reads_are_not_seeks() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    let read = 64 * 1024;
    // The client's position messages run one read ahead of the kernel's read events.
    for i in 1..200u64 {
        let now = i * 65_536_000;
        let position = buffer.on_position((i + 1) * read, MonotonicNs(now));
        complete(&mut buffer, &position);
        let event = buffer.on_read((i - 1) * read..i * read, MonotonicNs(now));
        complete(&mut buffer, &event);
    }
    assert_eq!(buffer.seeks(), 0);
    assert_eq!(buffer.app_point(), 200 * read);
}

#[test]
fn nothing_is_loaded_past_the_end_of_the_file() {
    let file = 300 * 1024 + 17;
    let (mut buffer, actions) = PlayoutBuffer::new(shape(file), MonotonicNs::ZERO);
    assert_eq!(loaded(&actions), page_ceil(file));
    complete(&mut buffer, &actions);
    let actions = buffer.on_position(file, MonotonicNs(10_000_000_000));
    assert_eq!(loaded(&actions), 0);
}

#[derive(Clone, Debug)]
enum Event {
    Tick(u64),
    Read(u64),
    Seek(u64),
    CompleteOldest,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (1u64..200_000_000).prop_map(Event::Tick),
        (1u64..300_000).prop_map(Event::Read),
        (0u64..105 * MB).prop_map(Event::Seek),
        Just(Event::CompleteOldest),
    ]
}

fn hostile_event() -> impl Strategy<Value = (u8, u64, u64)> {
    (0u8..5, any::<u64>(), any::<u64>())
}

proptest! {
    /// Numbers from a client or the kernel can be anything (`u64::MAX`, a range that ends
    /// before it starts, a generation never issued): the buffer neither panics nor breaks
    /// its bounds, a preroll after a seek included (it locks no more than the preroll).
    #[test]
    fn any_numbers_keep_the_bounds(events in proptest::collection::vec(hostile_event(), 1..200)) {
        const PREROLL: u64 = 6 << 20;
        let (mut buffer, _) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
        let mut now = 0u64;
        for (kind, a, b) in events {
            let _ = match kind {
                0 => buffer.on_position(a, MonotonicNs(now)),
                1 => buffer.on_read(a..b, MonotonicNs(now)),
                2 => buffer.on_loaded(a.min(b)..a.max(b), u32::try_from(b % 4).unwrap_or(0)),
                3 => buffer.preroll_after_seek(PREROLL, |wanted| b % wanted.saturating_add(1)),
                _ => { now = now.saturating_add(a % 1_000_000_000); buffer.on_tick(MonotonicNs(now)) }
            };
            prop_assert!(buffer.locked_bytes() <= (B + BATCH).max(PREROLL));
            prop_assert!(buffer.app_point() <= (105 * MB).div_ceil(PAGE) * PAGE);
        }
    }

    /// Whatever the reader and the disk do: locked memory stays within B plus a batch, the
    /// prefetch stays within the credit limit plus rate × time, and everything locked is
    /// in the window.
    #[test]
    fn invariants_hold_for_any_event_sequence(events in proptest::collection::vec(event(), 1..300)) {
        let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
        let mut pending: std::collections::VecDeque<(Range<u64>, u32)> = actions
            .iter()
            .filter_map(|a| match a { WindowAction::Load { range, generation } => Some((range.clone(), *generation)), _ => None })
            .collect();
        let mut now = 0;
        let mut position = 0u64;
        let mut sought_to = 0u64;
        for event in events {
            let seeks = buffer.seeks();
            let from = match event {
                Event::Read(_) => position,
                Event::Seek(to) => to.min(105 * MB),
                _ => 0,
            };
            let actions = match event {
                Event::Tick(dt) => { now += dt; buffer.on_tick(MonotonicNs(now)) }
                Event::Read(len) => { position += len; buffer.on_read(position - len..position, MonotonicNs(now)) }
                Event::Seek(to) => { position = to; buffer.on_position(to, MonotonicNs(now)) }
                Event::CompleteOldest => match pending.pop_front() {
                    Some((range, generation)) => buffer.on_loaded(range, generation),
                    None => Vec::new(),
                },
            };
            for action in actions {
                if let WindowAction::Load { range, generation } = action {
                    pending.push_back((range, generation));
                }
            }
            prop_assert!(buffer.locked_bytes() <= B + BATCH);
            for range in buffer.locked_ranges() {
                prop_assert!(range.start >= buffer.window_start());
                prop_assert!(range.end <= buffer.requested_end());
            }
            let allowed = 2 * B + MB * now / 1_000_000_000;
            prop_assert!(buffer.prefetched_bytes() <= allowed);
            if buffer.seeks() > seeks {
                sought_to = from;
            }
            // A wait is the seek's only while a seek's window is still loading or its reader
            // has not read on from where it sought, and it is never both the start and a seek.
            let settled = buffer.app_point() >= sought_to + SETTLED_BYTES;
            if buffer.reader_wait() == ReaderWait::Seek {
                prop_assert!(buffer.seeks() > 0 && (!buffer.window_locked() || !settled));
            }
            if buffer.window_locked() && buffer.seeks() > 0 && settled {
                prop_assert_eq!(buffer.reader_wait(), ReaderWait::Miss);
            }
        }
    }
}

/// A recording watched a few seconds behind: the file grows at the rate while the reader
/// follows. The window stops at the data written so far, then takes in what is written next.
#[test]
fn a_window_follows_a_file_that_grows_under_it() {
    let read = 64 * 1024;
    let period_ns = read * 1_000_000_000 / MB;
    // The reader starts three seconds behind the writer.
    let lead = 3 * MB;
    let (mut buffer, actions) = PlayoutBuffer::new(shape(lead), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    assert!(!buffer.reaches_file_end());
    for i in 1..400u64 {
        let now = i * period_ns;
        let written = lead + i * read;
        let mut actions = buffer.file_grew(written, MonotonicNs(now));
        actions.extend(buffer.on_tick(MonotonicNs(now)));
        complete(&mut buffer, &actions);
        let reader_end = i * read;
        assert!(
            buffer.requested_end() <= page_ceil(written),
            "never past the data"
        );
        assert!(
            buffer.is_resident(reader_end.min(written) - 1),
            "read {i}: the reader's next bytes are loaded"
        );
        let more = buffer.on_read((i - 1) * read..reader_end, MonotonicNs(now));
        complete(&mut buffer, &more);
    }
    // Near the end of the data, the window reaches the file's end; a shrink changes nothing.
    let end = buffer.requested_end();
    assert!(buffer
        .file_grew(MB, MonotonicNs(400 * period_ns))
        .is_empty());
    assert_eq!(buffer.requested_end(), end);
}

/// A stream is starting until its first window is locked; after that, a window that is not
/// yet locked again (it moved) is a miss, not a start.
#[test]
fn a_stream_starts_until_its_first_window_is_locked() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    assert!(buffer.is_starting());
    complete(&mut buffer, &actions);
    assert!(!buffer.is_starting());
    let seek = buffer.on_read(50 * MB..50 * MB + 4096, MonotonicNs(1_000_000));
    assert!(!seek.is_empty());
    assert!(!buffer.is_starting(), "a seek is not a start");
}

/// After seeks that spent the banked credit, the window lacks a buffer; credit granted from
/// outside the rate (the owner's allowance) fills it at once, and no more than it lacks.
#[test]
fn a_seek_refill_granted_from_outside_the_rate_fills_the_window_at_once() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    // Two seeks in a row: the first is paid by the banked credit, the second finds none.
    let first = buffer.on_read(20 * MB..20 * MB + 4096, MonotonicNs(1_000));
    complete(&mut buffer, &first);
    let second = buffer.on_read(60 * MB..60 * MB + 4096, MonotonicNs(2_000));
    complete(&mut buffer, &second);
    let shortfall = buffer.refill_shortfall();
    assert!(shortfall > B / 2, "a thin window: {shortfall}");
    let granted = buffer.grant_credit(shortfall, MonotonicNs(3_000));
    complete(&mut buffer, &granted);
    assert_eq!(buffer.refill_shortfall(), 0);
    assert!(buffer.is_resident(60 * MB) && buffer.is_resident(60 * MB + B - PAGE - 4096));
    // Credit beyond the limit is not kept.
    let _ = buffer.grant_credit(100 * B, MonotonicNs(4_000));
    assert!(buffer.credit_bytes() <= 2 * B);
}

/// A reader that jumped waits for the window its jump asked for: a seek's wait until that
/// window is locked and the reader has read on from where it jumped (what it reads behind
/// that point no window held), a miss after it.
#[test]
fn a_reader_waits_for_a_seek_until_it_reads_on_from_its_window_then_misses() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    assert_eq!(buffer.reader_wait(), ReaderWait::Start);
    complete(&mut buffer, &actions);
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss);
    let seek = buffer.on_read(50 * MB..50 * MB + 4096, MonotonicNs(1_000_000));
    assert_eq!(buffer.reader_wait(), ReaderWait::Seek);
    // A late completion of the old window does not end the seek's wait.
    let _ = buffer.on_loaded(0..BATCH, 0);
    assert_eq!(buffer.reader_wait(), ReaderWait::Seek);
    complete(&mut buffer, &seek);
    // A look behind the point it jumped to (mpv reads 20 KiB before it) is still the seek's.
    let _ = buffer.on_read(50 * MB - (20 << 10)..50 * MB, MonotonicNs(1_500_000));
    assert_eq!(buffer.reader_wait(), ReaderWait::Seek);
    let _ = buffer.on_read(
        50 * MB..50 * MB + SETTLED_BYTES - 4096,
        MonotonicNs(1_600_000),
    );
    assert_eq!(buffer.reader_wait(), ReaderWait::Seek);
    let _ = buffer.on_read(50 * MB..50 * MB + SETTLED_BYTES, MonotonicNs(1_700_000));
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss);
    // Reading on, the window moves and refills at the rate: waits then are misses.
    let on = buffer.on_read(50 * MB + 4096..50 * MB + 2 * B, MonotonicNs(2_000_000_000));
    assert!(!on.is_empty());
    assert_eq!(buffer.reader_wait(), ReaderWait::Miss);
}

/// The wait for the next load counts from when the credit last accrued, not from when it is
/// asked: the daemon asks after every event, and asked again sooner than it ends, it still
/// ends on time.
#[test]
fn the_wait_for_the_next_load_does_not_start_again_when_asked_again() {
    let (mut buffer, actions) = PlayoutBuffer::new(shape(105 * MB), MonotonicNs::ZERO);
    complete(&mut buffer, &actions);
    // A dash through three buffers spends the credit (the first refill takes what is left):
    // the window lacks what it cannot pay for.
    for dash in [0..2 * B, 2 * B..3 * B] {
        let loads = buffer.on_read(dash, MonotonicNs(1_000));
        complete(&mut buffer, &loads);
    }
    let first = buffer
        .ns_until_next_load(MonotonicNs(1_000))
        .expect("the window lacks");
    assert!(first > 0);
    assert_eq!(
        buffer.ns_until_next_load(MonotonicNs(1_000 + first / 2)),
        Some(first - first / 2)
    );
    assert_eq!(
        buffer.ns_until_next_load(MonotonicNs(1_000 + first)),
        Some(0)
    );
}

#[path = "playout_preroll_tests.rs"]
mod preroll_tests;
