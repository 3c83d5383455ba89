//! On the lab hdd with a measured model, streams attached one by one are refused exactly at
//! the capacity `abissctl admit` predicts, and the refusal names the figures.

use std::path::Path;

use abiss_tests::{json_of, require_root, write_cold_file, Daemon, HddLab};

#[test]
fn attaching_one_by_one_is_refused_at_the_predicted_capacity() {
    require_root!();
    let lab = HddLab::up("wt6-admission", 2, "mq-deadline");
    let daemon = Daemon::start_managing(lab.device(), &[]);
    let device = lab.device().to_str().unwrap().to_owned();
    save_quick_profile(&daemon, &device);
    let n_max = predicted_capacity(&daemon, &device);

    for i in 0..=n_max {
        let file = lab.mount().join(format!("stream-{i}.bin"));
        write_cold_file(&file, 2 << 20);
        if i < n_max {
            let _ = daemon.attach_at_1mb(&file);
            continue;
        }
        assert_refused_with_figures(&daemon, &file);
    }
    assert_eq!(daemon.streams().len(), n_max);
    let status = json_of(&daemon.ctl(["status", "--json"]))["devices"].clone();
    assert!(status[0]["admission"]
        .as_str()
        .unwrap()
        .starts_with("statistical"));
    let miss_ppm = status[0]["miss_probability_ppm"].as_u64().unwrap();
    assert!(
        miss_ppm <= 10_000,
        "admitted streams predicted at {miss_ppm} ppm"
    );
    // One more does not fit, and `admit` says so too.
    let again = json_of(&daemon.ctl([
        "admit", "--device", &device, "--rate", "1MB/s", "--count", "1", "--json",
    ]));
    assert_eq!(again["n_max"], 0);
    assert_eq!(again["fits"], false);
}

/// Profiles `device` quickly and saves the model in abissd's model directory.
fn save_quick_profile(daemon: &Daemon, device: &str) {
    // Profiled while abissd runs: it takes the model up at the next attach or question.
    let models = daemon.model_dir();
    let profile = daemon.ctl([
        "profile",
        device,
        "--quick",
        "--save",
        "--model-dir",
        models.to_str().unwrap(),
    ]);
    assert!(
        profile.status.success(),
        "{}",
        String::from_utf8_lossy(&profile.stderr)
    );
}

/// How many 1 MB/s streams `abissctl admit` says fit with the profiled model; fewer fit by
/// deterministic admission.
fn predicted_capacity(daemon: &Daemon, device: &str) -> usize {
    let plan = json_of(&daemon.ctl(["admit", "--device", device, "--rate", "1MB/s", "--json"]));
    assert_eq!(plan["mode"], "statistical");
    assert!(plan["model_source"]
        .as_str()
        .unwrap()
        .contains("quick profile"));
    let n_max = usize::try_from(plan["n_max"].as_u64().expect("n_max")).unwrap();
    assert!((4..40).contains(&n_max), "n_max {n_max}");
    let deterministic = json_of(&daemon.ctl([
        "admit",
        "--device",
        device,
        "--rate",
        "1MB/s",
        "--mode",
        "deterministic",
        "--count",
        "1",
        "--json",
    ]));
    let n_det = usize::try_from(deterministic["n_max"].as_u64().unwrap()).unwrap();
    assert!(n_det < n_max, "deterministic {n_det}, statistical {n_max}");
    assert_eq!(deterministic["fits"], true);
    // The model's price of the streams: within the real-time share at n_max, and more for one
    // stream more.
    let work_ms = |n: usize| {
        let plan = json_of(&daemon.ctl([
            "admit",
            "--device",
            device,
            "--rate",
            "1MB/s",
            "--count",
            &n.to_string(),
            "--json",
        ]));
        plan["mean_work_ms"].as_f64().expect("mean_work_ms")
    };
    let budget_ms = plan["window_ms"].as_f64().unwrap()
        * plan["realtime_share_percent"].as_f64().unwrap()
        / 100.0;
    let (at_n_max, beyond) = (work_ms(n_max), work_ms(n_max + 1));
    assert!(
        at_n_max <= budget_ms && beyond > at_n_max && work_ms(1) < at_n_max,
        "{n_max} streams take {at_n_max} ms, one more {beyond} ms, of a {budget_ms} ms share"
    );
    let said = daemon.ctl([
        "admit", "--device", device, "--rate", "1MB/s", "--count", "2",
    ]);
    let said = String::from_utf8_lossy(&said.stdout);
    assert!(
        said.contains("ms of every 1000 ms window on average"),
        "{said}"
    );
    n_max
}

/// Attaching `file` at 1 MB/s is refused (exit code 9), with the figures in the message.
fn assert_refused_with_figures(daemon: &Daemon, file: &Path) {
    let output = daemon.attach_1mb_output(file, "564KiB");
    let message = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(9), "{message}");
    for figure in [
        "1000000 B/s",
        "predicted miss probability",
        "where 1% is allowed",
        "more fits",
    ] {
        assert!(message.contains(figure), "'{figure}' missing: {message}");
    }
}
