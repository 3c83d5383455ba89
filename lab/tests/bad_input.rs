//! Bad input gets one clear sentence, its own exit code, and leaks nothing.

mod common;

use std::process::Command;

use abiss_lab::Lab;

fn up_args<'a>(dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "up",
        "--state-dir",
        dir,
        "--backing-dir",
        common::BACKING_DIR,
    ];
    args.extend_from_slice(extra);
    args
}

fn check(name: &str, extra: &[&str], expected_code: i32, expected_text: &str) {
    let state_dir = common::state_dir(name);
    let dir = state_dir.to_string_lossy().into_owned();
    let _ = Lab::down(&state_dir);
    let (code, _, stderr) = common::run_cli(&up_args(&dir, extra));
    println!("exit {code}: {stderr}");
    assert_eq!(code, expected_code, "{stderr}");
    assert!(stderr.contains(expected_text), "{stderr}");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "not one sentence: {stderr}"
    );
    common::assert_nothing_left(&state_dir, None);
}

#[test]
fn unknown_model_is_a_usage_error() {
    if !common::lab_possible() {
        return;
    }
    let state_dir = common::state_dir("bad-model");
    let dir = state_dir.to_string_lossy().into_owned();
    let (code, _, stderr) = common::run_cli(&up_args(&dir, &["--model", "ssd", "--size", "256M"]));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("ssd"), "{stderr}");
    common::assert_nothing_left(&state_dir, None);
}

#[test]
fn broken_model_file_names_the_field() {
    if !common::lab_possible() {
        return;
    }
    let file = std::env::temp_dir().join("abiss-lab-test-broken.toml");
    std::fs::write(&file, "[hdd]\nrpm = 5400.0\nouter_rate_mb_s = \"fast\"\n").unwrap();
    let path = file.to_string_lossy().into_owned();
    check(
        "bad-file",
        &["--model", "hdd", "--size", "256M", "--config", &path],
        3,
        "hdd.outer_rate_mb_s",
    );
    std::fs::write(&file, "[hdd]\ninner_rate_mb_s = 80.0\n").unwrap();
    check(
        "bad-file",
        &["--model", "hdd", "--size", "256M", "--config", &path],
        3,
        "hdd.inner_rate_mb_s",
    );
    std::fs::remove_file(&file).unwrap();
}

#[test]
fn too_small_size_is_refused() {
    if !common::lab_possible() {
        return;
    }
    check("small", &["--model", "hdd", "--size", "1M"], 4, "minimum");
}

#[test]
fn leftover_lab_is_detected_and_down_cleans_it() {
    if !common::lab_possible() {
        return;
    }
    let state_dir = common::state_dir("leftover");
    let dir = state_dir.to_string_lossy().into_owned();
    let _ = Lab::down(&state_dir);
    let (code, _, stderr) =
        common::run_cli(&up_args(&dir, &["--model", "cloud", "--size", "256M"]));
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) =
        common::run_cli(&up_args(&dir, &["--model", "cloud", "--size", "256M"]));
    println!("exit {code}: {stderr}");
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("abiss-lab down"), "{stderr}");
    let (code, _, stderr) = common::run_cli(&["down", "--state-dir", &dir]);
    assert_eq!(code, 0, "{stderr}");
    common::assert_nothing_left(&state_dir, None);
}

#[test]
fn missing_fuse_is_reported() {
    if !common::lab_possible() {
        return;
    }
    if Command::new("unshare").arg("--version").output().is_err() {
        eprintln!("skipped: unshare is missing");
        return;
    }
    // In a private mount namespace an empty /dev hides /dev/fuse from the lab.
    let state_dir = common::state_dir("no-fuse");
    let dir = state_dir.to_string_lossy().into_owned();
    let _ = Lab::down(&state_dir);
    let script = format!(
        "mount -t tmpfs none /dev && exec {} up --model hdd --size 256M --state-dir {dir} --backing-dir {}",
        common::BIN,
        common::BACKING_DIR
    );
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("exit {:?}: {stderr}", output.status.code());
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("FUSE is unavailable"), "{stderr}");
    common::assert_nothing_left(&state_dir, None);
}

#[test]
fn a_scheduler_the_kernel_lacks_is_refused_before_anything_is_set_up() {
    if !common::lab_possible() {
        return;
    }
    // No kernel registers an elevator of this name; bfq is refused the same way on kernels
    // built without it.
    check(
        "no-elevator",
        &["--model", "hdd", "--size", "256M", "--scheduler", "cfq"],
        12,
        "this kernel has no 'cfq' I/O scheduler (its schedulers: ",
    );
}
