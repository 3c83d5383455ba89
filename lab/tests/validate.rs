//! `validate` passes on both models: the devices behave like their models through the kernel.

mod common;

use abiss_lab::ModelKind;

fn validate_model(name: &str, kind: ModelKind) {
    if !common::lab_possible() {
        return;
    }
    let options = common::options(name, kind, 1 << 30);
    let lab = common::up(&options);
    let dir = lab.state_dir.to_string_lossy().into_owned();
    let (code, stdout, stderr) = common::run_cli(&["validate", "--state-dir", &dir]);
    println!("{stdout}{stderr}");
    // Exit 11: every run was disturbed by the hypervisor taking the CPUs (steal, printed with
    // each run), so the model could not be checked on this machine now. That is said, not
    // passed over: the figures are in the output above.
    if code == 11 {
        eprintln!("validate for {kind} was inconclusive under CPU steal: {stderr}");
        return;
    }
    // The report goes into the failure message too: CI logs keep the failure section.
    assert_eq!(code, 0, "validate failed for {kind}:\n{stdout}{stderr}");
}

#[test]
fn validate_passes_on_hdd() {
    validate_model("validate-hdd", ModelKind::Hdd);
}

#[test]
fn validate_passes_on_cloud() {
    validate_model("validate-cloud", ModelKind::Cloud);
}
