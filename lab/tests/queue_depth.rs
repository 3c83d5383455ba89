//! The loop device dispatches no more requests at once than the model's queue depth, also
//! after a scheduler is selected (the depth is set through `nr_requests` while the scheduler
//! is `none`, which resizes the driver tags; selecting a scheduler keeps them).

mod common;

use std::process::Command;

use abiss_lab::ModelKind;

#[test]
fn dispatch_depth_matches_the_model_under_an_elevator() {
    if !common::lab_possible() {
        return;
    }
    if Command::new("fio").arg("--version").output().is_err() {
        eprintln!("skipped: fio is not installed");
        return;
    }
    let mut options = common::options("depth", ModelKind::Hdd, 1 << 30);
    options.model.hdd.queue_depth = 6;
    let elevator = common::priority_elevator();
    options.scheduler = Some(elevator.into());
    let lab = common::up(&options);
    let sysfs = abiss_lab::system::sysfs_block(lab.lab.device());
    let scheduler = std::fs::read_to_string(sysfs.join("queue/scheduler")).unwrap();
    assert!(scheduler.contains(&format!("[{elevator}]")), "{scheduler}");
    let rotational = std::fs::read_to_string(sysfs.join("queue/rotational")).unwrap();
    assert_eq!(rotational.trim(), "1");
    if let Some(depth) = lab.lab.state().dispatch_depth {
        assert_eq!(depth, 6, "driver tag depth from debugfs");
    }
    let mut cursor = lab.lab.stats_cursor().unwrap();
    let status = Command::new("fio")
        .args([
            "--name=deep",
            &format!("--filename={}", lab.lab.device().display()),
            "--direct=1",
            "--readonly",
            "--rw=randread",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=32",
            "--time_based",
            "--runtime=3",
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let records = cursor.read_new().unwrap();
    let most = records.iter().map(|r| r.outstanding).max().unwrap_or(0);
    println!(
        "{} requests, at most {most} outstanding in the emulator",
        records.len()
    );
    assert!(records.len() > 100, "too few requests: {}", records.len());
    assert_eq!(most, 6, "the emulator saw {most} requests at once");
}
