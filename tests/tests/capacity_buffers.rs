//! Memory buys disk time. A window is refilled in loads of a third of its buffer, one disk
//! access each, so with a model of its disk abissd enlarges automatic buffers (`--buffer auto`)
//! until the disk admits streams it would refuse at their latency-sized buffers, within the
//! locked-memory budget. Only the asking user's streams grow, and a refusal changes nothing.

use std::path::{Path, PathBuf};
use std::process::Output;

use abiss_proto::{DeviceNumber, StreamId, StreamInfo};
use abiss_tests::{
    abissctl_as_nobody, chmod, json_of, require_root, write_cold_file, Daemon, HddLab,
};

const BUDGET: u64 = 96 << 20;
/// More files than the budget can hold streams of.
const FILES: usize = 48;

/// The device number of a block device node, from sysfs.
fn device_number(device: &Path) -> DeviceNumber {
    let name = device.file_name().unwrap().to_str().unwrap();
    let text = std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).unwrap();
    let (major, minor) = text.trim().split_once(':').unwrap();
    DeviceNumber {
        major: major.parse().unwrap(),
        minor: minor.parse().unwrap(),
    }
}

fn buffers(streams: &[StreamInfo]) -> Vec<(StreamId, u64)> {
    streams.iter().map(|s| (s.id, s.buffer.0)).collect()
}

#[test]
fn automatic_buffers_grow_until_the_disk_admits_more_streams() {
    require_root!();
    let lab = HddLab::up("capacity", 2, "mq-deadline");
    // Written before abissd starts: the files are on the disk before the experiment.
    let files: Vec<_> = (0..FILES)
        .map(|i| lab.mount().join(format!("stream-{i}.bin")))
        .collect();
    for file in &files {
        write_cold_file(file, 4 << 20);
    }
    let nobody_file = lab.mount().join("nobody.bin");
    write_cold_file(&nobody_file, 4 << 20);
    let budget = BUDGET.to_string();
    let daemon = Daemon::start_managing(lab.device(), &["--locked-memory", &budget]);
    // The lab hdd is the laptop disk the fixture models (5400 rpm, 4 requests at once).
    let model = abiss_model::DeviceModel {
        identity: abiss_model::DeviceIdentity::of(device_number(lab.device())).expect("identity"),
        ..abiss_model::fixtures::laptop_disk(1.0, abiss_model::fixtures::LAPTOP_REVOLUTION_MS)
    };
    model.save(&daemon.model_dir()).expect("save the model");
    let device = lab.device().to_str().unwrap().to_owned();
    let fixed = json_of(&daemon.ctl([
        "admit", "--device", &device, "--rate", "1MB/s", "--buffer", "564KiB", "--json",
    ]));
    let fixed_n_max = usize::try_from(fixed["n_max"].as_u64().expect("n_max")).unwrap();
    assert!((2..40).contains(&fixed_n_max), "{fixed}");

    let (attached, refusal) = attach_until_refused(&daemon, &files);
    let message = String::from_utf8_lossy(&refusal.stderr);
    assert_eq!(refusal.status.code(), Some(9), "{message}");
    eprintln!(
        "564 KiB buffers: the model admits {fixed_n_max}; automatic buffers within {BUDGET} B: \
         {attached}, refused then with: {message}"
    );
    assert!(
        attached > fixed_n_max,
        "automatic buffers admitted {attached}, fixed ones {fixed_n_max}"
    );
    // With buffers large enough the disk takes more 1 MB/s streams than the budget can lock
    // buffers for: the refusal names memory as what stopped this one, not only the disk.
    assert!(
        message.contains("would make room on the disk") && message.contains("--locked-memory"),
        "{message}"
    );

    let streams = daemon.streams();
    let largest = streams.iter().map(|s| s.buffer.0).max().unwrap();
    let grown: Vec<&StreamInfo> = streams
        .iter()
        .filter(|s| {
            s.buffer_auto
                .as_ref()
                .and_then(|a| a.for_capacity_bytes)
                .is_some()
        })
        .collect();
    // Every stream that came after the disk was full at 564 KiB grew, and so did the ones
    // before it: each growth takes the owner's automatic streams to one common size.
    assert!(grown.len() > attached - fixed_n_max, "{streams:#?}");
    assert!(largest > 564 << 10);
    let locked: u64 = streams.iter().map(|s| s.buffer.0 + 20 * 4096).sum();
    assert!(
        locked <= BUDGET,
        "{locked} B locked at most, budget {BUDGET}"
    );
    let list = String::from_utf8_lossy(&daemon.ctl(["list"]).stdout).into_owned();
    assert!(
        list.contains("so that the disk admits it next to the other streams"),
        "{list}"
    );
    let status = json_of(&daemon.ctl(["status", "--json"]))["devices"][0].clone();
    let miss_ppm = status["miss_probability_ppm"].as_u64().unwrap();
    assert!(miss_ppm <= 10_000, "admitted at {miss_ppm} ppm: {status}");

    nobody_grows_no_buffer_of_roots(&daemon, &nobody_file, lab.mount());
}

/// Attaches the files at 1 MB/s with automatic buffers until abissd refuses one; how many it
/// took, and the refusal. A refusal grows nobody's buffer.
fn attach_until_refused(daemon: &Daemon, files: &[PathBuf]) -> (usize, Output) {
    let mut attached = 0;
    loop {
        let file = &files[attached];
        let before = buffers(&daemon.streams());
        let output = daemon.attach_1mb_output(file, "auto+564KiB");
        if !output.status.success() {
            assert_eq!(buffers(&daemon.streams()), before);
            return (attached, output);
        }
        attached += 1;
        assert!(attached < FILES, "no refusal within the budget");
    }
}

/// Another user's automatic stream may only grow its own buffer: on a disk that root's
/// streams fill, it does not fit, and root's buffers stay as they are.
fn nobody_grows_no_buffer_of_roots(daemon: &Daemon, file: &Path, mount: &Path) {
    chmod(file, 0o644);
    chmod(mount, 0o755);
    let before = buffers(&daemon.streams());
    let output = abissctl_as_nobody(
        daemon.socket(),
        &[
            "attach",
            file.to_str().unwrap(),
            "--rate",
            "1MB/s",
            "--buffer",
            "auto",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(buffers(&daemon.streams()), before);
}
