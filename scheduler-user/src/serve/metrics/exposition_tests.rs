//! The exposition of one made-up snapshot, line by line: the log2 buckets as `le` in
//! seconds, the labels, the `_total` counters, the admission state set, and the programs'
//! run time only while the kernel counts it.

use std::collections::BTreeMap;

use abiss_proto::{DeviceNumber, LatencyGroup, Log2Histogram, LATENCY_BUCKETS};
use serde_json::json;

use super::exposition::{render, ProcessFigures, ProgramRun, Snapshot};

const LOOP: DeviceNumber = DeviceNumber { major: 7, minor: 3 };

fn histogram(slots: &[(usize, u64)]) -> Log2Histogram {
    let mut all = vec![0; LATENCY_BUCKETS];
    for &(i, count) in slots {
        all[i] = count;
    }
    Log2Histogram::from_slots(&all, 0)
}

fn group(stream: Option<u64>, service: &[(usize, u64)], inversions: u64) -> LatencyGroup {
    serde_json::from_value(json!({
        "device": LOOP, "operation": "read", "priority": {"class": "rt", "level": 0},
        "stream": stream, "requests": 0, "bytes": 4096, "inversions": inversions,
        "queue": histogram(&[]), "service": histogram(service),
    }))
    .map(|mut g: LatencyGroup| {
        g.requests = g.service.count();
        g
    })
    .expect("a latency group")
}

fn snapshot() -> Snapshot {
    let stream = json!({
        "id": 4, "owner_uid": 1000, "path": "/secret/movie.bin", "file_device": LOOP, "disk": LOOP,
        "inode": 12, "file_bytes": 1, "rate": 1_000_000, "buffer": 577_536, "batch_pages": 20,
        "priority": 2, "persistent": true, "playout_point": 0, "window_start": 0,
        "loaded_end": 0, "resident_bytes": 4096, "locked_bytes": 8192, "credit_bytes": -512,
        "readers": [], "misses": 3, "prefetched_bytes": 65536, "raises": 1,
    });
    let status = json!({"devices": [{
        "name": "loop3", "device": LOOP, "elevator": "mq-deadline", "dispatch_depth": 8,
        "capacity": 20_000_000, "capacity_source": "configured", "realtime_share_percent": 80,
        "reserved": 1_000_000, "free": 15_000_000, "streams": 1,
        "admission": "statistical (p_req 0.01)", "miss_probability_ppm": 2500,
    }]});
    Snapshot {
        // Two groups of the same priority (one of the stream, one of none) merge into one
        // histogram.
        latency: Some(vec![
            group(Some(4), &[(7, 60), (26, 1)], 2),
            group(None, &[(7, 30), (11, 10)], 0),
        ]),
        streams: vec![serde_json::from_value(stream).expect("a stream")],
        status: serde_json::from_value(status).expect("a status"),
        process: ProcessFigures {
            cpu_seconds: 1.5,
            resident_bytes: 1 << 20,
        },
        programs: None,
        device_names: BTreeMap::from([(LOOP, "loop3".to_owned())]),
    }
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing line {line:?} in:\n{text}"
    );
}

#[test]
fn log2_buckets_become_cumulative_le_buckets_in_seconds() {
    let text = render(snapshot());
    let labels = r#"device="loop3",operation="read",class="rt",level="0""#;
    has(&text, "# TYPE abiss_block_service_seconds histogram");
    // Bucket 7 holds [64, 128) µs: counted under le = 128 µs, and every bucket above.
    has(
        &text,
        &format!("abiss_block_service_seconds_bucket{{{labels},le=\"6.4e-05\"}} 0"),
    );
    has(
        &text,
        &format!("abiss_block_service_seconds_bucket{{{labels},le=\"0.000128\"}} 90"),
    );
    has(
        &text,
        &format!("abiss_block_service_seconds_bucket{{{labels},le=\"0.002048\"}} 100"),
    );
    // The last bucket is open-ended: it shows under +Inf only.
    has(
        &text,
        &format!("abiss_block_service_seconds_bucket{{{labels},le=\"33.554432\"}} 100"),
    );
    has(
        &text,
        &format!("abiss_block_service_seconds_bucket{{{labels},le=\"+Inf\"}} 101"),
    );
    has(
        &text,
        &format!("abiss_block_service_seconds_count{{{labels}}} 101"),
    );
    has(
        &text,
        &format!("abiss_block_requests_total{{{labels}}} 101"),
    );
    has(&text, &format!("abiss_block_bytes_total{{{labels}}} 8192"));
}

#[test]
fn streams_and_disks_carry_their_labels() {
    let text = render(snapshot());
    let stream = r#"stream="4",device="loop3",uid="1000""#;
    has(&text, &format!("abiss_stream_misses_total{{{stream}}} 3"));
    has(
        &text,
        &format!("abiss_stream_inversions_total{{{stream}}} 2"),
    );
    has(
        &text,
        &format!("abiss_stream_credit_bytes{{{stream}}} -512.0"),
    );
    has(
        &text,
        &format!("abiss_stream_rate_bytes_per_second{{{stream}}} 1000000.0"),
    );
    assert!(!text.contains("/secret"), "no path leaves the daemon");
    has(
        &text,
        r#"abiss_disk_admission_mode{device="loop3",mode="statistical"} 1"#,
    );
    has(
        &text,
        r#"abiss_disk_admission_mode{device="loop3",mode="share"} 0"#,
    );
    has(
        &text,
        r#"abiss_disk_miss_probability{device="loop3"} 0.0025"#,
    );
    has(
        &text,
        r#"abiss_disk_free_bytes_per_second{device="loop3"} 15000000.0"#,
    );
    has(&text, "abiss_daemon_cpu_seconds_total 1.5");
}

#[test]
fn program_run_time_shows_only_while_counted() {
    assert!(!render(snapshot()).contains("abiss_bpf_program"));
    let mut counted = snapshot();
    counted.programs = Some(vec![ProgramRun {
        name: "block_rq_issue".to_owned(),
        runs: 7,
        run_seconds: 0.25,
    }]);
    let text = render(counted);
    has(
        &text,
        r#"abiss_bpf_program_runs_total{program="block_rq_issue"} 7"#,
    );
    has(
        &text,
        r#"abiss_bpf_program_run_seconds_total{program="block_rq_issue"} 0.25"#,
    );
}
