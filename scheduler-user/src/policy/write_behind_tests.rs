//! Unit and property tests of [`super`].
use super::*;
use abiss_proto::PAGE_BYTES as PAGE;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const BATCH: u64 = 20 * PAGE;
const SECOND: u64 = 1_000_000_000;

fn shape(buffer_bytes: u64, rate_bps: u64) -> WriteBehindShape {
    WriteBehindShape {
        buffer_bytes,
        batch_bytes: BATCH,
        rate_bps,
        credit_limit_bytes: 2 * buffer_bytes,
        preallocate: true,
    }
}

fn write_backs(actions: &[WriteAction]) -> Vec<Range<u64>> {
    actions
        .iter()
        .filter_map(|a| match a {
            WriteAction::WriteBack(range) => Some(range.clone()),
            WriteAction::Preallocate(_) => None,
        })
        .collect()
}

/// Completes every write-back at once, as an infinitely fast disk would; returns all ranges
/// written back.
fn complete(
    window: &mut WriteBehind,
    actions: &[WriteAction],
    now: MonotonicNs,
) -> Vec<Range<u64>> {
    let mut done = Vec::new();
    let mut queue = write_backs(actions);
    while let Some(range) = queue.pop() {
        let next = window.on_written_back(&range, now);
        queue.extend(write_backs(&next));
        done.push(range);
    }
    done
}

#[test]
fn nothing_is_written_back_before_a_request_is_written() {
    let mut window = WriteBehind::new(shape(MIB, MIB), 0, 2 * MIB, MonotonicNs::ZERO);
    assert!(write_backs(&window.on_size(100 * 1024, MonotonicNs(1_000))).is_empty());
    let request = shape(MIB, MIB).request_bytes();
    let written = write_backs(&window.on_size(request, MonotonicNs(2_000)));
    assert_eq!(written, vec![0..request]);
}

#[test]
fn an_idle_writer_has_its_last_whole_pages_written_back() {
    let mut window = WriteBehind::new(shape(MIB, MIB), 0, 2 * MIB, MonotonicNs::ZERO);
    assert!(write_backs(&window.on_size(10 * PAGE + 100, MonotonicNs::ZERO)).is_empty());
    assert_eq!(
        window.ns_until_next_write_back(MonotonicNs::ZERO),
        Some(IDLE_FLUSH_NS),
        "the loop wakes when the writer counts as idle"
    );
    assert_eq!(
        write_backs(&window.on_tick(MonotonicNs(IDLE_FLUSH_NS))),
        vec![0..10 * PAGE]
    );
}

#[test]
fn a_truncated_file_is_written_back_from_its_new_end() {
    let mut window = WriteBehind::new(shape(MIB, MIB), 0, 2 * MIB, MonotonicNs::ZERO);
    let actions = window.on_size(2 * MIB, MonotonicNs::ZERO);
    complete(&mut window, &actions, MonotonicNs::ZERO);
    window.on_size(PAGE, MonotonicNs(1));
    assert_eq!(window.written_back_end(), PAGE);
    assert_eq!(window.written_end(), PAGE);
}

#[test]
fn the_file_is_allocated_a_few_seconds_ahead_in_large_steps() {
    let s = shape(MIB, MIB);
    let mut window = WriteBehind::new(s, 0, 2 * MIB, MonotonicNs::ZERO);
    let first: Vec<_> = window
        .on_size(0, MonotonicNs::ZERO)
        .into_iter()
        .filter(|a| matches!(a, WriteAction::Preallocate(_)))
        .collect();
    assert_eq!(first, vec![WriteAction::Preallocate(0..4 * MIB)]);
    // Nothing more until half of it is written into.
    assert!(!window
        .on_size(MIB, MonotonicNs(SECOND))
        .iter()
        .any(|a| matches!(a, WriteAction::Preallocate(_))));
    let again: Vec<_> = window
        .on_size(2 * MIB, MonotonicNs(2 * SECOND))
        .into_iter()
        .filter(|a| matches!(a, WriteAction::Preallocate(_)))
        .collect();
    assert_eq!(again, vec![WriteAction::Preallocate(4 * MIB..6 * MIB)]);
}

/// A stream holds no more ahead than its user's budget leaves it, and takes up what is left
/// once the room is there again, in whole units (issue 33).
#[test]
fn a_stream_allocates_ahead_only_within_its_users_room() {
    let s = shape(MIB, MIB);
    let mut window = WriteBehind::new(s, 0, 2 * MIB, MonotonicNs::ZERO);
    window.set_allocation_room(MIB + MIB / 2);
    let allocations = |actions: Vec<WriteAction>| -> Vec<WriteAction> {
        actions
            .into_iter()
            .filter(|a| matches!(a, WriteAction::Preallocate(_)))
            .collect()
    };
    assert_eq!(
        allocations(window.on_size(0, MonotonicNs::ZERO)),
        vec![WriteAction::Preallocate(0..MIB + MIB / 2)]
    );
    assert_eq!(window.allocated_ahead(), MIB + MIB / 2);
    // Less than a unit of room past what it holds: nothing.
    assert!(allocations(window.on_size(MIB / 2, MonotonicNs(SECOND))).is_empty());
    window.set_allocation_room(0);
    assert!(allocations(window.on_size(MIB, MonotonicNs(2 * SECOND))).is_empty());
    window.set_allocation_room(u64::MAX);
    assert_eq!(
        allocations(window.on_size(MIB, MonotonicNs(3 * SECOND))),
        vec![WriteAction::Preallocate(MIB + MIB / 2..5 * MIB)]
    );
    assert_eq!(allocation_room(65_534, MAX_PREALLOCATED_AHEAD_PER_USER), 0);
    assert_eq!(
        allocation_room(0, MAX_PREALLOCATED_AHEAD_PER_USER),
        u64::MAX
    );
}

proptest! {
    /// A writer that moves its end up with `ftruncate` as fast as it likes has the stream
    /// allocate at most twice its allocation ahead plus its rate times the time (issue 33).
    #[test]
    fn allocation_stays_within_its_rate(
        rate_kib in 1u64..65536,
        steps in prop::collection::vec((1u64..1 << 30, 1u64..100_000_000), 1..300),
    ) {
        let s = shape(MIB, rate_kib * 1024);
        let mut window = WriteBehind::new(s, 0, s.credit_limit_bytes, MonotonicNs::ZERO);
        let (mut now, mut end) = (0u64, 0u64);
        for (grow, dt) in steps {
            now += dt;
            end += grow;
            window.on_size(end, MonotonicNs(now));
            let allowed = 2 * s.preallocate_ahead() + u64::try_from(
                u128::from(now) * u128::from(s.rate_bps) / u128::from(SECOND)
            ).unwrap();
            prop_assert!(
                window.preallocated_bytes() <= allowed,
                "{} allocated, {allowed} allowed", window.preallocated_bytes()
            );
        }
    }

    /// Whatever the writer does, a stream writes back at most its credit limit plus its rate
    /// times the time (it is admitted for that rate), and never a byte twice.
    #[test]
    fn write_back_stays_within_the_credit(
        rate_kib in 1u64..4096,
        buffer_kib in 200u64..8192,
        steps in prop::collection::vec((1u64..4 * MIB, 1u64..500_000_000), 1..200),
    ) {
        let s = shape(buffer_kib * 1024, rate_kib * 1024);
        let mut window = WriteBehind::new(s, 0, s.credit_limit_bytes, MonotonicNs::ZERO);
        let (mut now, mut end, mut total, mut next_start) = (0u64, 0u64, 0u64, 0u64);
        for (grow, dt) in steps {
            now += dt;
            end += grow;
            let actions = window.on_size(end, MonotonicNs(now));
            for range in complete(&mut window, &actions, MonotonicNs(now)) {
                prop_assert_eq!(range.start, next_start, "in order, no byte twice");
                next_start = range.end;
                total += range.end - range.start;
            }
            let allowed = s.credit_limit_bytes + u64::try_from(
                u128::from(now) * u128::from(s.rate_bps) / 1_000_000_000
            ).unwrap();
            prop_assert!(total <= allowed, "{total} > {allowed}");
        }
    }

    /// A direct recording (its client writes past the page cache): whatever the writer does,
    /// nothing is ever written back, the allocation keeps within the same bounds as a
    /// page-cache recording's, and nothing counts as dirty.
    #[test]
    fn a_direct_recording_is_only_allocated_ahead_within_its_rate(
        rate_kib in 1u64..65536,
        steps in prop::collection::vec((0u64..64 * MIB, 1u64..500_000_000, any::<bool>()), 1..200),
    ) {
        let s = shape(MIB, rate_kib * 1024);
        let mut window = WriteBehind::new(s, 0, s.credit_limit_bytes, MonotonicNs::ZERO);
        let (mut now, mut end) = (0u64, 0u64);
        for (grow, dt, truncate) in steps {
            now += dt;
            end = if truncate { end.saturating_sub(grow) } else { end + grow };
            let actions = window.on_written_directly(end, MonotonicNs(now));
            prop_assert!(write_backs(&actions).is_empty(), "{actions:?}");
            for action in &actions {
                if let WriteAction::Preallocate(range) = action {
                    prop_assert!(range.start >= end, "allocated {range:?} below the end {end}");
                }
            }
            prop_assert_eq!(window.behind_bytes(), end - page_floor(end));
            let allowed = 2 * s.preallocate_ahead() + u64::try_from(
                u128::from(now) * u128::from(s.rate_bps) / u128::from(SECOND)
            ).unwrap();
            prop_assert!(window.preallocated_bytes() <= allowed);
            prop_assert!(window.allocated_end() <= end + s.preallocate_ahead() + MIB);
        }
    }

    /// A writer that keeps to its rate, in writes of up to a batch, never has more than its
    /// buffer plus a batch dirty (with write-backs finishing at once), and everything it wrote
    /// in whole pages is written back once it stops.
    #[test]
    fn a_writer_at_its_rate_stays_within_its_buffer(
        rate_kib in 16u64..4096,
        buffer_kib in 200u64..8192,
        write_pages in 1u64..20,
        writes in 10usize..400,
    ) {
        let s = shape(buffer_kib * 1024, rate_kib * 1024);
        let mut window = WriteBehind::new(s, 0, s.credit_limit_bytes, MonotonicNs::ZERO);
        let write = write_pages * PAGE;
        let period_ns = write * 1_000_000_000 / s.rate_bps + 1;
        let mut now = 0;
        for i in 1..=writes as u64 {
            now = i * period_ns;
            let actions = window.on_size(i * write, MonotonicNs(now));
            complete(&mut window, &actions, MonotonicNs(now));
            prop_assert!(
                window.behind_bytes() <= s.buffer_bytes + BATCH,
                "{} dirty with a {} buffer", window.behind_bytes(), s.buffer_bytes
            );
            prop_assert!(window.allocated_end() >= window.written_end());
            prop_assert!(
                window.allocated_end() <= window.written_end() + s.preallocate_ahead() + MIB
            );
        }
        // Stopped: idle, then as much credit as the rest needs.
        let later = now + IDLE_FLUSH_NS + 2 * s.credit_limit_bytes * 1_000_000_000 / s.rate_bps;
        let actions = window.on_tick(MonotonicNs(later));
        complete(&mut window, &actions, MonotonicNs(later));
        prop_assert_eq!(window.written_back_end(), writes as u64 * write);
    }
}
