//! This build's abissd and abissctl on the distribution kernels users run: Debian 11's 5.10
//! (below the floor: abissd must refuse it with one sentence and exit 11, leaving nothing
//! behind), Ubuntu 22.04's 5.15, Debian 12's 6.1, Ubuntu 24.04's 6.8 and Debian 13's 6.12 (it
//! must start with the documented parts on, keep a 1 MB/s stream's guarantee, and stop
//! cleanly; then, on LVM on LUKS over one loop device, serve a stream from that loop device
//! with abissd's loads at real time and refuse a recording; serve a file on an md raid1 of two
//! loop devices and one on LVM striped over two more from their members, refuse a recording on
//! the raid1, and leave every disk as it was: xtask/src/kernels/stacks.rs). Each kernel is booted from its own package in qemu by `xtask kernels`
//! (xtask/src/kernels.rs), which downloads the packages once into target/kernels.
//!
//! qemu runs under TCG: this lab's /dev/kvm is PVM, which cannot boot stock distribution
//! kernels, and TCG runs the same kernels on any machine. So the test needs qemu, not KVM.

use std::process::Command;

use abiss_tests::{binary, Scratch};

#[test]
fn abissd_runs_on_the_kernels_users_have_and_refuses_older_ones() {
    let qemu_present = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        qemu_present,
        "this test boots distribution kernels in qemu, and qemu-system-x86_64 is missing: run `cargo xtask setup`"
    );
    let xtask = binary("xtask");
    let abissd = binary("abissd");
    let bin_dir = abissd.parent().expect("the binaries' directory");
    let out = Scratch::new_in("/tmp", "kernels");
    let output = Command::new(&xtask)
        .arg("kernels")
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.path())
        // 4 s of the paced reader (61 reads) show the stream is kept on each kernel; the
        // benchmark (`cargo xtask kernels`) reads 8 s.
        .args(["--read-secs", "4"])
        // Two guests at a time: each has two vCPUs, so the pair shares the machine's two
        // CPUs. The guests' paced readers still missed nothing; their slowest read was 6 to
        // 71 ms against 4 to 14 ms one guest at a time (2026-12-06).
        .args(["--jobs", "2"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run xtask kernels");
    let log = String::from_utf8_lossy(&output.stderr);
    eprintln!("{log}");
    let results = std::fs::read_to_string(out.path().join("kernels.json")).unwrap_or_default();
    if !output.status.success() {
        // The report (and, for a kernel that failed a check, abissd's log in the guest) is
        // in the scratch directory, which goes with the test: keep it in the test's output.
        let report = std::fs::read_to_string(out.path().join("kernels.md")).unwrap_or_default();
        eprintln!("{report}");
    }
    assert!(
        output.status.success(),
        "xtask kernels failed ({}): see the log above",
        output.status
    );
    let results: serde_json::Value = serde_json::from_str(&results).expect("kernels.json");
    let kernels = results["kernels"].as_array().expect("kernels");
    assert_eq!(kernels.len(), 5, "every kernel ran");
    for kernel in kernels {
        let checks = kernel["checks"].as_array().expect("checks");
        assert!(
            checks.len() >= 5,
            "{}: the run got past booting",
            kernel["name"]
        );
        for check in checks {
            assert_eq!(
                check["pass"], true,
                "{}: {} ({})",
                kernel["name"], check["name"], check["detail"]
            );
        }
    }
}
