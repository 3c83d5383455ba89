//! `abissctl profile` on the lab hdd recovers what the emulator was configured with, saves a
//! model abissd takes up, and bad devices and bad model files get clear errors.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use abiss_bench::daemon::DaemonCommand;
use abiss_lab::model::HddParams;
use abiss_model::{DeviceIdentity, DeviceModel};
use abiss_proto::DeviceNumber;
use abiss_tests::{
    abissd_command, assert_fails, binary, require_root, stderr, Daemon, Ext4Mount, HddLab,
    LoopDevice, Scratch,
};

fn abissctl(args: &[&str]) -> Output {
    Command::new(binary("abissctl"))
        .args(args)
        .output()
        .expect("run abissctl")
}

fn number_of(device: &Path) -> DeviceNumber {
    let name = device.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn within(measured: f64, expected: f64, percent: f64) -> bool {
    ((measured - expected) / expected).abs() * 100.0 <= percent
}

#[test]
fn quick_profile_recovers_the_emulators_zone_rates_and_access_time() {
    require_root!();
    let lab = HddLab::up_raw("wt6-profile", 2, "none");
    let state = Scratch::new_in("/tmp", "wt6-profile-state");
    let device = lab.device().to_str().unwrap().to_owned();
    let started = Instant::now();
    let output = abissctl(&[
        "profile",
        &device,
        "--quick",
        "--json",
        "--save",
        "--model-dir",
        state.path().to_str().unwrap(),
    ]);
    let took = started.elapsed();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        took < Duration::from_secs(60),
        "quick profile took {took:?}"
    );
    // Not on a terminal: no progress bar.
    assert!(!stderr(&output).contains('['), "{}", stderr(&output));
    let model: DeviceModel = serde_json::from_slice(&output.stdout).expect("a model as JSON");

    let params = HddParams::default();
    assert!(model.zones.len() >= 16);
    for zone in &model.zones {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a zone index"
        )]
        let index = (zone.position * f64::from(params.zones)) as u32;
        let expected = params.zone_rate_bps(index);
        assert!(
            within(zone.read_bps, expected, 10.0),
            "zone at {:.1}%: {:.1} MB/s measured, {:.1} MB/s configured",
            zone.position * 100.0,
            zone.read_bps / 1e6,
            expected / 1e6
        );
    }
    let expected_access_ms =
        (params.mean_random_seek() + params.revolution() / 2).as_secs_f64() * 1e3;
    assert!(
        within(model.mean_access_ms, expected_access_ms, 10.0),
        "mean access {:.2} ms measured, {expected_access_ms:.2} ms configured",
        model.mean_access_ms
    );
    let revolution_ms = params.revolution().as_secs_f64() * 1e3;
    assert!(
        within(model.revolution_ms, revolution_ms, 15.0),
        "revolution {:.2} ms measured, {revolution_ms:.2} ms configured",
        model.revolution_ms
    );
    assert!(!model.writes_measured);

    // Saved where abissd looks, for this very device.
    let identity = DeviceIdentity::of(number_of(lab.device())).unwrap();
    let saved = DeviceModel::load(&identity.model_path(state.path()), &identity).unwrap();
    assert_eq!(saved.zones, model.zones);
}

#[test]
fn profile_refuses_unknown_small_and_busy_devices_and_never_writes_unasked() {
    require_root!();
    assert_fails(
        &abissctl(&["profile", "wt6-no-such-disk", "--quick"]),
        5,
        "no block device",
    );
    let small = LoopDevice::new_in("/dev/shm", 32);
    assert_fails(
        &abissctl(&["profile", small.path().to_str().unwrap(), "--quick"]),
        14,
        "less than",
    );
    // --write without --yes off a terminal: refused before anything is opened.
    assert_fails(
        &abissctl(&["profile", small.path().to_str().unwrap(), "--write"]),
        2,
        "--yes",
    );
    // A mounted device is busy for --write.
    let mounted = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 80));
    let device = mounted.device().path().to_str().unwrap().to_owned();
    assert_fails(
        &abissctl(&["profile", &device, "--quick", "--write", "--yes"]),
        13,
        "in use",
    );
    // Reading a device with data on it is fine, and changes nothing.
    let raw = LoopDevice::new_in("/dev/shm", 80);
    std::fs::write(raw.path(), vec![0x5au8; 8 << 20]).unwrap();
    let before = std::fs::read(raw.path()).unwrap();
    let output = abissctl(&["profile", raw.path().to_str().unwrap(), "--quick"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("sequential read"));
    let after = std::fs::read(raw.path()).unwrap();
    assert!(before == after, "a read-only profile changed the device");
}

/// abissd on `device` with its socket, state and models in `dir`, run until it exits (a start
/// that must fail), logging at warn whatever `ABISS_DAEMON_LOG` says.
fn failed_start(command: &DaemonCommand) -> std::process::Output {
    command
        .command()
        .env("RUST_LOG", "warn")
        .output()
        .expect("run abissd")
}

#[test]
fn corrupt_or_foreign_models_are_errors_never_used() {
    require_root!();
    let disk = LoopDevice::new_in("/dev/shm", 96);
    let identity = DeviceIdentity::of(disk.number()).unwrap();
    let dir = Scratch::new_in("/tmp", "wt6-model-state");
    let abissd = abissd_command(dir.path()).args(["--device", &disk.path().to_string_lossy()]);
    let path = identity.model_path(&abissd.model_dir());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();

    // A corrupt model: abissd does not start (exit 17), and says which file.
    std::fs::write(&path, b"{\"version\": 1, \"zones\": [").unwrap();
    let output = failed_start(&abissd);
    assert_fails(&output, 17, "not a usable device model");
    assert!(stderr(&output).contains(path.to_str().unwrap()));

    // A model of another device (same key, another size): also refused.
    let mut foreign = DeviceModel::conservative_default(DeviceIdentity {
        size_bytes: identity.size_bytes * 2,
        ..identity.clone()
    });
    foreign.mean_access_ms = 10.0;
    std::fs::write(&path, serde_json::to_vec(&foreign).unwrap()).unwrap();
    let output = failed_start(&abissd);
    assert_fails(&output, 17, "describes device");

    // A model that turns corrupt after the start refuses attaches (exit 15), and `admit`.
    std::fs::remove_file(&path).unwrap();
    let mounted = Ext4Mount::new(disk);
    let daemon = Daemon::start_managing(mounted.device().path(), &[]);
    let status = daemon.ctl(["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let devices = &status["devices"];
    assert_eq!(devices[0]["admission"], "share");
    assert!(devices[0]["capacity_source"]
        .as_str()
        .unwrap()
        .contains("conservative default"));
    let path = identity.model_path(&daemon.model_dir());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"not json").unwrap();
    let file = mounted.path().join("clip.bin");
    std::fs::write(&file, vec![1u8; 1 << 20]).unwrap();
    assert_fails(
        &daemon.ctl(["attach", file.to_str().unwrap(), "--rate", "1MB/s"]),
        15,
        "not a usable device model",
    );
    let device = mounted.device().name();
    assert_fails(
        &daemon.ctl(["admit", "--device", &device, "--rate", "1MB/s"]),
        15,
        "not a usable device model",
    );
}

#[test]
fn bad_probabilities_rates_and_devices_are_refused() {
    require_root!();
    for p in ["0", "1", "1.5", "-0.1", "nan", "x"] {
        let output = Command::new(binary("abissd"))
            .arg(format!("--p-req={p}"))
            .args(["--socket", "/nonexistent/s.sock"])
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(2),
            "--p-req {p}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).contains("p-req"), "{}", stderr(&output));
    }
    let disk = LoopDevice::new_in("/dev/shm", 64);
    let daemon = Daemon::start_managing(disk.path(), &[]);
    let device = disk.name();
    // A rate too large to parse, and one beyond what a stream may ask.
    assert_fails(
        &daemon.ctl([
            "admit",
            "--device",
            &device,
            "--rate",
            "99999999999999999999999",
        ]),
        2,
        "rate",
    );
    assert_fails(
        &daemon.ctl(["admit", "--device", &device, "--rate", "2000GB/s"]),
        8,
        "outside 1 B/s to 1 TB/s",
    );
    assert_fails(
        &daemon.ctl([
            "admit", "--device", &device, "--rate", "1MB/s", "--count", "0",
        ]),
        2,
        "count",
    );
    assert_fails(
        &daemon.ctl(["admit", "--device", "wt6-no-such-disk", "--rate", "1MB/s"]),
        5,
        "no block device",
    );
    let other = LoopDevice::new_in("/dev/shm", 64);
    assert_fails(
        &daemon.ctl(["admit", "--device", &other.name(), "--rate", "1MB/s"]),
        5,
        "does not manage",
    );
    // Without a model the answer comes from the configured capacity: 16 MB/s of 20.
    let output = daemon.ctl(["admit", "--device", &device, "--rate", "1MB/s", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["n_max"], 16);
    assert!(report["miss_probability"].is_null());
}
