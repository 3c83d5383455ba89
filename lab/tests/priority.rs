//! Priority works in the lab: under bfq (mq-deadline where the kernel lacks bfq), a reader in
//! the real-time I/O class keeps a low tail latency next to a greedy best-effort reader, and the
//! same reader in the best-effort class does not.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use abiss_lab::ModelKind;

const PROBE_SECONDS: u32 = 8;

fn fio_available() -> bool {
    Command::new("fio").arg("--version").output().is_ok()
}

/// Runs the probe reader in I/O class `class` next to a greedy reader at depth 16 and returns
/// the probe's p99 completion latency in ms.
fn probe_p99_ms(device: &Path, class: u32) -> f64 {
    let device = device.to_string_lossy();
    let filename = format!("--filename={device}");
    let greedy = Command::new("fio")
        .args([
            "--name=greedy",
            &filename,
            "--direct=1",
            "--readonly",
            "--rw=randread",
            "--bs=64k",
            "--ioengine=libaio",
            "--iodepth=16",
            "--time_based",
            &format!("--runtime={}", PROBE_SECONDS + 2),
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("starting the greedy fio");
    std::thread::sleep(std::time::Duration::from_secs(1));
    let probe = Command::new("ionice")
        .args([&format!("-c{class}"), "-n0", "fio"])
        .args([
            "--name=probe",
            &filename,
            "--direct=1",
            "--readonly",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=psync",
            "--rate_iops=20",
            "--time_based",
            &format!("--runtime={PROBE_SECONDS}"),
            "--output-format=json",
        ])
        .output()
        .expect("running the probe fio");
    let mut greedy = greedy;
    greedy.wait().expect("greedy fio");
    assert!(probe.status.success(), "probe fio failed");
    let json: serde_json::Value = serde_json::from_slice(&probe.stdout).expect("fio JSON");
    let read = &json["jobs"][0]["read"];
    let p99_nanos = read["clat_ns"]["percentile"]["99.000000"]
        .as_f64()
        .expect("p99 in fio output");
    let ios = read["total_ios"].as_u64().unwrap_or(0);
    let p99_ms = p99_nanos / 1e6;
    println!("ionice -c{class}: probe p99 {p99_ms:.1} ms over {ios} reads");
    p99_ms
}

#[test]
fn realtime_reader_beats_best_effort_under_a_priority_elevator() {
    if !common::lab_possible() {
        return;
    }
    if !fio_available() {
        eprintln!("skipped: fio is not installed");
        return;
    }
    let mut options = common::options("priority", ModelKind::Hdd, 4 << 30);
    options.scheduler = Some(common::priority_elevator().into());
    let lab = common::up(&options);
    let realtime = probe_p99_ms(lab.lab.device(), 1);
    let best_effort = probe_p99_ms(lab.lab.device(), 2);
    println!("p99 latency: ionice -c1 {realtime:.1} ms, ionice -c2 {best_effort:.1} ms");
    assert!(
        realtime * 3.0 < best_effort,
        "the real-time reader's p99 ({realtime:.1} ms) is not clearly below the best-effort one ({best_effort:.1} ms)"
    );
}
