//! The tracer counts every request, in the right priority class, on the right device.

use std::collections::BTreeMap;

use abiss_proto::{IoClass, LatencyGroup, Operation, StreamId};
use abiss_tests::{direct_reads, require_root, set_thread_ioprio, Daemon, LoopDevice};

const READS: u64 = 200;
const BLOCK: usize = 64 * 1024;

type Key = (
    abiss_proto::DeviceNumber,
    Operation,
    abiss_proto::IoPriority,
    Option<StreamId>,
);

fn by_key(groups: Vec<LatencyGroup>) -> BTreeMap<Key, LatencyGroup> {
    groups.into_iter().map(|g| (g.key(), g)).collect()
}

/// Requests per (device, class, level) added between two snapshots.
fn added(
    before: &BTreeMap<Key, LatencyGroup>,
    after: &BTreeMap<Key, LatencyGroup>,
) -> Vec<(Key, u64, u64)> {
    after
        .iter()
        .filter_map(|(key, group)| {
            let delta = before
                .get(key)
                .map_or_else(|| group.clone(), |b| group.since(b));
            (delta.requests > 0).then_some((*key, delta.requests, delta.service.count()))
        })
        .collect()
}

#[test]
fn rt_and_be_direct_reads_are_counted_exactly_on_their_device() {
    require_root!();
    let daemon = Daemon::start();
    // The image lives in memory, so the loop device's own I/O reaches no other block device.
    let device = LoopDevice::new_in("/dev/shm", 64);
    let mut connection = daemon.connect();
    let before = by_key(connection.latency());

    let path = device.path().to_path_buf();
    std::thread::spawn(move || {
        set_thread_ioprio(1, 0);
        direct_reads(&path, BLOCK, 0, READS);
        set_thread_ioprio(2, 7);
        direct_reads(&path, BLOCK, READS, READS);
    })
    .join()
    .expect("reader thread");

    let after = by_key(connection.latency());
    let changes = added(&before, &after);
    let on_device: Vec<_> = changes
        .iter()
        .filter(|(key, _, _)| key.0 == device.number())
        .collect();
    let count = |class: IoClass, level: u8| {
        on_device
            .iter()
            .filter(|(key, _, _)| {
                key.1 == Operation::Read && key.2.class == class && key.2.level == level
            })
            .map(|(_, requests, _)| *requests)
            .sum::<u64>()
    };
    assert_eq!(
        count(IoClass::Rt, 0),
        READS,
        "RT/0 reads on {}: {on_device:?}",
        device.name()
    );
    assert_eq!(
        count(IoClass::Be, 7),
        READS,
        "BE/7 reads on {}: {on_device:?}",
        device.name()
    );
    let total: u64 = on_device.iter().map(|(_, requests, _)| requests).sum();
    assert_eq!(
        total,
        2 * READS,
        "unexpected extra requests on the device: {on_device:?}"
    );
    for (_, requests, in_histogram) in &on_device {
        assert_eq!(
            requests, in_histogram,
            "every request lands in the service histogram"
        );
    }
    // Nothing of this test on any other device: no other device saw RT/0 or BE/7 reads.
    let elsewhere: Vec<_> = changes
        .iter()
        .filter(|(key, _, _)| key.0 != device.number())
        .filter(|(key, _, _)| {
            (key.2.class == IoClass::Rt && key.2.level == 0)
                || (key.2.class == IoClass::Be && key.2.level == 7)
        })
        .collect();
    assert!(
        elsewhere.is_empty(),
        "test reads showed up on other devices: {elsewhere:?}"
    );
}

#[test]
fn abissctl_trace_json_reports_the_interval() {
    require_root!();
    let daemon = Daemon::start();
    let device = LoopDevice::new_in("/dev/shm", 64);
    let trace = std::process::Command::new(abiss_tests::binary("abissctl"))
        .arg("--socket")
        .arg(daemon.socket())
        .args([
            "trace",
            "--json",
            "--interval",
            "2",
            "--count",
            "1",
            "--device",
        ])
        .arg(device.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start abissctl trace");
    // The loop device is not managed: its requests are traced only once abissctl's first
    // request has switched tracing of every disk on (`trace_all`), and its first snapshot is
    // the answer to that same request. A fixed 500 ms wait lost a read to a slow start of
    // abissctl in a full suite (49 of 50 counted).
    let control = abiss_tests::daemon_map_id(daemon.pid(), "CONTROL");
    let tracing = abiss_tests::wait_until(std::time::Duration::from_secs(10), || {
        // `Control`'s fourth u32.
        abiss_tests::control_field(&abiss_tests::map_dump(&control)[0], "trace_all", 3) == 1
    });
    assert!(tracing, "abissctl trace did not switch tracing on");
    std::thread::sleep(std::time::Duration::from_millis(200));
    let path = device.path().to_path_buf();
    std::thread::spawn(move || {
        set_thread_ioprio(1, 3);
        direct_reads(&path, BLOCK, 0, 50);
    })
    .join()
    .expect("reader thread");
    let output = trace.wait_with_output().expect("abissctl trace");
    assert!(output.status.success());
    let text = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON object");
    let groups = report["groups"].as_array().expect("groups");
    let rt3: Vec<_> = groups
        .iter()
        .filter(|g| g["class"] == "rt" && g["level"] == 3 && g["operation"] == "read")
        .collect();
    assert_eq!(rt3.len(), 1, "one rt/3 read group in {text}");
    let group = rt3[0];
    assert_eq!(group["requests"], 50);
    assert_eq!(group["bytes"], 50 * BLOCK as u64);
    assert_eq!(group["device"], device.name());
    assert_eq!(group["dev"], device.number().to_string());
    let service = &group["service"];
    let bucket_total: u64 = service["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(bucket_total, 50);
    assert!(service["p50_us"].as_u64().unwrap() <= service["p99_us"].as_u64().unwrap());
    assert!(service["max_us"].as_f64().unwrap() > 0.0);
    assert!(group["queue"]["slots"].as_array().unwrap().len() == abiss_proto::LATENCY_BUCKETS);
}

/// abissd's statistics over `window_ms` (a `Stats` request does not make a trace client).
fn stats(daemon: &Daemon, window_ms: u64) -> abiss_proto::StatsReport {
    match daemon
        .connect()
        .call(abiss_proto::Request::Stats { window_ms })
    {
        abiss_proto::Response::Stats(report) => report,
        other => panic!("unexpected answer {other:?}"),
    }
}

/// Requests on `device` in a latency snapshot, in all.
fn requests_on(groups: &[LatencyGroup], device: abiss_proto::DeviceNumber) -> u64 {
    groups
        .iter()
        .filter(|g| g.device == device)
        .map(|g| g.requests)
        .sum()
}

#[test]
fn disks_abissd_does_not_manage_are_traced_only_for_trace_clients() {
    require_root!();
    let daemon = Daemon::start();
    let device = LoopDevice::new_in("/dev/shm", 64);
    let path = device.path().to_path_buf();

    // Nobody traces and nothing is managed: reads leave no record, and the block programs do
    // not even run (they are detached while they have nothing to do).
    let reads = {
        let path = path.clone();
        std::thread::spawn(move || {
            // Inside the statistics window below.
            std::thread::sleep(std::time::Duration::from_millis(100));
            direct_reads(&path, BLOCK, 0, READS);
        })
    };
    let during = stats(&daemon, 1000);
    reads.join().expect("reader thread");
    let issue_runs: u64 = during
        .programs
        .iter()
        .filter(|p| p.name == "abiss_issue")
        .map(|p| p.run_count)
        .sum();
    assert_eq!(issue_runs, 0, "block programs ran without a trace client");
    let after = stats(&daemon, 1);
    assert_eq!(
        (after.request_records, after.tracked_requests),
        (0, 0),
        "request records without a trace client"
    );

    // The first latency request makes this connection a trace client, from then on: the
    // reads above are not in its first answer, those below are, exactly.
    let mut client = daemon.connect();
    assert_eq!(
        requests_on(&client.latency(), device.number()),
        0,
        "reads made before any trace client was counted"
    );
    direct_reads(&path, BLOCK, READS, READS);
    let traced = requests_on(&client.latency(), device.number());
    assert_eq!(traced, READS, "reads while a trace client is connected");

    // When the last trace client goes, tracing stops (its records are dropped): reads then
    // are not counted, as the next client sees.
    drop(client);
    assert!(
        abiss_tests::wait_until(std::time::Duration::from_secs(5), || {
            stats(&daemon, 1).request_records == 0
        }),
        "request records kept after the last trace client left"
    );
    direct_reads(&path, BLOCK, 2 * READS, READS);
    let mut next = daemon.connect();
    assert_eq!(
        requests_on(&next.latency(), device.number()),
        traced,
        "reads made between trace clients were counted"
    );
}
