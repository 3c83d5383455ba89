//! abissd leaves nothing behind: request records stay bounded under load, nothing is in flight
//! once the disk is idle, and no program survives the daemon.

use std::io::Write;
use std::time::Duration;

use abiss_proto::{Request, Response};
use abiss_tests::{
    direct_reads, program_loaded, require_root, wait_until, Daemon, Ext4Mount, LoopDevice,
};

fn stats(daemon: &Daemon) -> abiss_proto::StatsReport {
    match daemon.connect().call(Request::Stats { window_ms: 200 }) {
        Response::Stats(report) => report,
        other => panic!("unexpected answer {other:?}"),
    }
}

#[test]
fn no_tracked_request_leaks_and_no_program_survives_the_daemon() {
    require_root!();
    let mut daemon = Daemon::start();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 256));
    // Under an elevator, buffered writes merge (block_rq_merge) and reads are inserted first.
    fs.device().set_scheduler("mq-deadline");

    // 10 000 requests of several kinds: direct reads, and small buffered writes that the
    // elevator merges, with flushes.
    let mut connection = daemon.connect();
    let on_device = |connection: &mut abiss_tests::Connection| -> u64 {
        connection
            .latency()
            .iter()
            .filter(|g| g.device == fs.device().number())
            .map(|g| g.requests)
            .sum()
    };
    let before = on_device(&mut connection);
    let records_before = stats(&daemon).request_records;
    direct_reads(fs.device().path(), 4096, 0, 10_000);
    let mut file = std::fs::File::create(fs.path().join("merge-me")).expect("create");
    for round in 0u8..20 {
        for _ in 0..256 {
            file.write_all(&[round; 4096]).expect("write");
        }
        file.sync_all().expect("fsync");
    }
    drop(file);
    let _ = std::process::Command::new("sync").status();

    let completed = on_device(&mut connection) - before;
    assert!(
        completed >= 10_000,
        "only {completed} requests completed on the device"
    );

    let report = stats(&daemon);
    // Idle disks: whatever is still tracked must drain to (almost) nothing; the root disk may
    // have a request or two in flight at any moment.
    assert!(
        wait_until(Duration::from_secs(5), || stats(&daemon).tracked_requests
            <= 4),
        "tracked requests did not drain: {}",
        stats(&daemon).tracked_requests
    );

    // Records are reused per kernel request struct: 10 000 requests add at most one record per
    // struct in the device's pools (scheduler tags, driver tags, its flush request). abissd
    // without --device traces every disk, so the machine's own disks (builds, logs: anything
    // else running) may add records of their pools too, but no more.
    let pool_of = |name: &str| -> u64 {
        let read_number = |file: &str| -> u64 {
            std::fs::read_to_string(format!("/sys/block/{name}/{file}"))
                .map_or(0, |text| text.trim().parse().unwrap_or(0))
        };
        read_number("queue/nr_requests") + read_number("mq/0/nr_tags") + 1
    };
    let other_disks: u64 = std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|name| !name.starts_with("loop") && !name.starts_with("ram"))
        .map(|name| pool_of(&name))
        .sum();
    let pool = pool_of(&fs.device().name()) + other_disks;
    let grown = report.request_records.saturating_sub(records_before);
    assert!(
        grown <= pool,
        "{grown} new records for a pool of {pool} requests: records leak"
    );

    let ids: Vec<u32> = report.programs.iter().map(|p| p.id).collect();
    assert_eq!(ids.len(), 11, "eleven programs attached");
    assert!(ids.iter().all(|&id| program_loaded(id)));
    assert_eq!(daemon.stop(), Some(0), "clean exit on SIGTERM");
    assert!(
        wait_until(Duration::from_secs(5), || ids
            .iter()
            .all(|&id| !program_loaded(id))),
        "programs still loaded after abissd stopped"
    );
    assert!(!daemon.socket().exists(), "socket removed on exit");
}
