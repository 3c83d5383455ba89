//! Unit and property tests of [`super`] (kept apart so the policy file stays readable).
use super::*;
use proptest::prelude::*;
use scheduler_common::ioprio;

const BE4: u16 = ioprio::encode(ioprio::CLASS_BE, 4);
const RT0: u16 = ioprio::encode(ioprio::CLASS_RT, 0);

fn raise(pid: u32, stream: u64, last_access: u64) -> Raise {
    Raise {
        task: TaskId { pid, start_time: 7 },
        tgid: pid,
        stream: StreamId(stream),
        file_tag: stream,
        previous: BE4,
        applied: RT0,
        last_access: MonotonicNs(last_access),
        raised_at: MonotonicNs::ZERO,
        started_at: None,
        journal: false,
        writer: false,
        uid: 1000,
        account: RaiseAccount::default(),
    }
}

/// A record keeps its times as the plain nanoseconds it always held, under the names it
/// always had: a raised daemon reads its predecessor's records.
#[test]
fn a_record_keeps_its_times_as_nanoseconds() {
    let mut recorded = raise(3, 10, 40);
    recorded.raised_at = MonotonicNs(20);
    recorded.started_at = Some(MonotonicNs(10));
    recorded.uid = 0;
    let text = serde_json::to_string(&recorded).unwrap();
    for field in [
        r#""last_access_ns":40"#,
        r#""raised_ns":20"#,
        r#""started_ns":10"#,
    ] {
        assert!(text.contains(field), "{field} not in {text}");
    }
    assert_eq!(serde_json::from_str::<Raise>(&text).unwrap(), recorded);
    recorded.started_at = None;
    let text = serde_json::to_string(&recorded).unwrap();
    assert!(!text.contains("started_ns"), "{text}");
    assert_eq!(serde_json::from_str::<Raise>(&text).unwrap(), recorded);
}

#[test]
fn a_raise_renewed_by_its_own_thread_keeps_what_it_paid_and_when_it_began() {
    let mut table = RaiseTable::new(5);
    let mut first = raise(7, 1, 10);
    first.raised_at = MonotonicNs(10);
    first.account = RaiseAccount {
        stray_kib: 300,
        own_kib: 200,
    };
    table.insert(first);
    // The same thread, raised again for the same file after it lowered its priority.
    let mut again = raise(7, 1, 50);
    again.raised_at = MonotonicNs(50);
    table.insert(again);
    let kept = table.get(7).unwrap();
    assert_eq!(
        (kept.raised_at, kept.account.stray_kib),
        (MonotonicNs(10), 300)
    );
    assert_eq!(kept.account.own_kib, 200);
    // Raised for another file: what it may read of that one grows from now, and the kernel
    // counts it afresh.
    let mut other = raise(7, 2, 60);
    other.raised_at = MonotonicNs(60);
    table.insert(other);
    let kept = table.get(7).unwrap();
    assert_eq!(
        (kept.raised_at, kept.account.stray_kib),
        (MonotonicNs(60), 300)
    );
    assert_eq!(kept.account.own_kib, 0);
    // Another thread that took the id: nothing of the first.
    let mut stranger = raise(7, 2, 70);
    stranger.task.start_time = 8;
    stranger.raised_at = MonotonicNs(70);
    table.insert(stranger);
    let kept = table.get(7).unwrap();
    assert_eq!(
        (kept.raised_at, kept.account),
        (MonotonicNs(70), RaiseAccount::default())
    );
}

#[test]
fn a_best_effort_reader_is_raised_to_the_streams_level_and_never_lowered() {
    let level = |n| AbissLevel::new(n).expect("a level");
    assert_eq!(raised_priority(BE4, level(0)), Some(RT0));
    assert_eq!(raised_priority(0, level(0)), Some(RT0), "no class is BE/4");
    assert_eq!(raised_priority(RT0, level(0)), None);
    assert_eq!(raised_priority(RT0, level(3)), None, "never lowered");
    assert_eq!(
        raised_priority(ioprio::encode(ioprio::CLASS_RT, 4), level(1)),
        Some(ioprio::encode(ioprio::CLASS_RT, 2))
    );
    assert_eq!(
        raised_priority(BE4, level(6)),
        None,
        "BE/4 is level 6 already"
    );
    assert_eq!(
        raised_priority(ioprio::encode(ioprio::CLASS_IDLE, 0), level(6)),
        Some(BE4)
    );
}

proptest! {
    /// However many threads are offered for raises, in any order over a few streams, a
    /// stream never holds more than its share, and a thread raised for it stays raisable.
    #[test]
    fn a_stream_never_holds_more_raised_threads_than_its_share(
        offers in proptest::collection::vec((1u32..200, 1u64..4), 1..400),
    ) {
        let mut table = RaiseTable::new(1);
        for (pid, number) in offers {
            let stream = StreamId(number);
            if table.has_room(stream, pid, 1000) {
                table.insert(raise(pid, number, 0));
            }
            let raised_here = table.get(pid).is_some_and(|u| u.stream == stream);
            prop_assert!(!raised_here || table.has_room(stream, pid, 1000));
            for stream in (1..4).map(StreamId) {
                let raised = table.all().iter().filter(|u| u.stream == stream).count();
                prop_assert!(raised <= MAX_RAISED_PER_STREAM);
            }
        }
    }
}

proptest! {
    /// However many threads of a few users are offered for raises over many streams, no
    /// user but root holds more than [`MAX_RAISED_PER_USER`] at once; root is not bound.
    #[test]
    fn a_user_never_holds_more_raised_threads_than_the_bound(
        offers in proptest::collection::vec((1u32..400, 1u64..8, 0u32..3, proptest::bool::weighted(0.1)), 1..600),
    ) {
        let mut table = RaiseTable::new(1);
        for (pid, number, uid, ends) in offers {
            if ends {
                table.take_thread(pid);
                continue;
            }
            if table.has_room(StreamId(number), pid, uid) {
                let mut raise = raise(pid, number, 0);
                raise.uid = uid;
                table.insert(raise);
            }
            for uid in 1..3 {
                let held = table.all().iter().filter(|u| u.uid == uid).count();
                prop_assert!(held <= MAX_RAISED_PER_USER);
            }
        }
    }
}

#[test]
fn root_is_not_bound_by_the_users_cap() {
    let mut table = RaiseTable::new(1);
    for pid in 0..200u32 {
        let stream = u64::from(pid / 30);
        assert!(table.has_room(StreamId(stream), pid, 0));
        let mut raise = raise(pid, stream, 0);
        raise.uid = 0;
        table.insert(raise);
    }
    assert_eq!(table.all().len(), 200);
    assert!(
        table.user_has_room(1000),
        "root's raises are not user 1000's"
    );
}

#[test]
fn only_the_owner_or_roots_streams_raise_a_reader() {
    assert!(may_raise(1000, 1000));
    assert!(may_raise(0, 1000));
    assert!(!may_raise(1000, 1001));
    assert!(
        !may_raise(1000, 0),
        "a user's stream cannot be used on root's tasks"
    );
}

#[test]
fn idle_raises_expire_and_accesses_keep_them() {
    let mut table = RaiseTable::new(5_000);
    table.insert(raise(1, 10, 0));
    table.insert(raise(2, 10, 0));
    table.touch(2, StreamId(10), MonotonicNs(4_000));
    table.touch(1, StreamId(11), MonotonicNs(4_000)); // another stream's file does not keep it
    assert_eq!(table.ns_until_next_expiry(MonotonicNs(4_000)), Some(1_000));
    let idle = table.take_idle(MonotonicNs(5_000));
    assert_eq!(idle.iter().map(|u| u.task.pid).collect::<Vec<_>>(), [1]);
    assert!(table.get(2).is_some());
    assert_eq!(table.take_stream(StreamId(10)).len(), 1);
    assert_eq!(table.ns_until_next_expiry(MonotonicNs(5_000)), None);
}

/// A direct recording's writer and the journal thread are never idle: they go with their
/// stream, and they set no expiry to wake up for.
#[test]
fn a_writer_and_a_journal_raise_go_only_with_their_stream() {
    let mut table = RaiseTable::new(5_000);
    let mut writer = raise(1, 10, 0);
    writer.writer = true;
    let mut journal = raise(2, 10, 0);
    journal.journal = true;
    table.insert(writer);
    table.insert(journal);
    table.insert(raise(3, 10, 0));
    assert_eq!(table.ns_until_next_expiry(MonotonicNs(1_000)), Some(4_000));
    let idle = table.take_idle(MonotonicNs(60_000));
    assert_eq!(idle.iter().map(|u| u.task.pid).collect::<Vec<_>>(), [3]);
    assert_eq!(table.ns_until_next_expiry(MonotonicNs(60_000)), None);
    assert_eq!(table.writer_of(StreamId(10)), Some(1));
    assert_eq!(table.writer_of(StreamId(11)), None);
    // Raised again for its stream (a miss), the writer stays the writer.
    table.insert(raise(1, 10, 0));
    assert_eq!(table.writer_of(StreamId(10)), Some(1));
    let ended = table.take_stream(StreamId(10));
    assert_eq!(ended.iter().map(|u| u.task.pid).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn a_second_raise_keeps_the_first_previous_priority() {
    let mut table = RaiseTable::new(5_000);
    table.insert(raise(1, 10, 0));
    let mut again = raise(1, 11, 10);
    again.previous = RT0;
    table.insert(again);
    assert_eq!(table.get(1).unwrap().previous, BE4);
    assert_eq!(table.get(1).unwrap().stream, StreamId(11));
    // A new thread with a reused pid is a different task: its own previous priority.
    let mut reused = raise(1, 12, 20);
    reused.task.start_time = 99;
    reused.previous = 0;
    table.insert(reused);
    assert_eq!(table.get(1).unwrap().previous, 0);
}

#[test]
fn repeated_misses_suggest_a_larger_buffer() {
    let buffer = abiss_proto::ByteSize(564 * 1024);
    assert_eq!(buffer_suggestion(2, buffer, None), None);
    let advice = buffer_suggestion(3, buffer, None).unwrap();
    assert!(advice.contains("--buffer 1128KiB"), "{advice}");
    // An automatic buffer is told to add a part of its own as large as it is now.
    let advice = buffer_suggestion(3, buffer, Some(0)).unwrap();
    assert!(advice.contains("--buffer auto+564KiB"), "{advice}");
    let advice = buffer_suggestion(3, buffer, Some(400 * 1024)).unwrap();
    assert!(advice.contains("--buffer auto+800KiB"), "{advice}");
}

proptest! {
    #[test]
    fn a_raise_is_always_upwards_and_lands_on_the_level(class in 0u8..4, level in 0u8..8, target in 0u8..8) {
        let current = ioprio::encode(class, level);
        let before = AbissLevel::from_kernel(class, level);
        let target = AbissLevel::new(target).expect("a level");
        match raised_priority(current, target) {
            Some(raised) => {
                prop_assert!(before > target);
                prop_assert_eq!(AbissLevel::of_ioprio(raised), target);
            }
            None => prop_assert!(before <= target),
        }
    }
}
