//! `up` and `down` leave nothing behind: no loop device, mount or FUSE process, and no queue
//! setting on the loop device, also after the emulator was killed with SIGKILL.

mod common;

use std::path::PathBuf;

use abiss_lab::{FilesystemKind, Lab, LabError, ModelKind};

#[test]
fn up_then_down_leaves_nothing() {
    if !common::lab_possible() {
        return;
    }
    let mut options = common::options("lifecycle", ModelKind::Cloud, 256 << 20);
    let mount_dir = PathBuf::from("/run/abiss-lab-test-lifecycle-mnt");
    options.mkfs = Some(FilesystemKind::Ext4);
    options.mount_dir = Some(mount_dir.clone());
    let lab = common::up(&options);
    std::fs::write(mount_dir.join("hello"), b"written through the lab").unwrap();
    assert!(lab.lab.device().to_string_lossy().starts_with("/dev/loop"));
    let removed = Lab::down(&lab.state_dir).unwrap();
    println!("{removed:#?}");
    common::assert_nothing_left(&options.state_dir, Some(&mount_dir));
    assert!(
        !mount_dir.exists(),
        "mount directory created by up was not removed"
    );
    std::mem::forget(lab); // already down
}

#[test]
fn down_recovers_after_the_emulator_is_killed() {
    if !common::lab_possible() {
        return;
    }
    let mut options = common::options("killed", ModelKind::Hdd, 256 << 20);
    let mount_dir = PathBuf::from("/run/abiss-lab-test-killed-mnt");
    options.mkfs = Some(FilesystemKind::Ext4);
    options.mount_dir = Some(mount_dir.clone());
    options.scheduler = Some(common::priority_elevator().into());
    let lab = common::up(&options);
    let device = lab.lab.device().to_path_buf();
    let emulator = lab.lab.state().emulator.expect("emulator pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(emulator.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    // The dead lab is still there: `up` refuses and says to run `down`.
    let again = Lab::up(&options);
    assert!(matches!(again, Err(LabError::Leftover { .. })), "{again:?}");
    let removed = Lab::down(&lab.state_dir).unwrap();
    println!("{removed:#?}");
    common::assert_nothing_left(&options.state_dir, Some(&mount_dir));
    // The loop device outlives the lab: its queue is as a new one's, not the hdd's depth of 4
    // under an elevator, which the next user of the device would inherit.
    let sysfs = abiss_lab::system::sysfs_block(&device);
    let scheduler = abiss_lab::system::read_attr(&sysfs.join("queue/scheduler")).unwrap();
    assert!(scheduler.contains("[none]"), "{scheduler}");
    // The depth where the kernel shows it (blk-mq's debugfs): `nr_requests` shows the allocated
    // depth after an elevator is switched off whatever the live one is, so it proves nothing.
    let allocated: u32 = abiss_lab::system::read_attr(&sysfs.join("mq/0/nr_tags"))
        .unwrap()
        .parse()
        .unwrap();
    match abiss_lab::lab::driver_tag_depth(&device) {
        Some(depth) => assert_eq!(depth, allocated, "the driver depth after down"),
        None => eprintln!("this kernel does not show the live driver depth: not checked"),
    }
    std::mem::forget(lab);
}

#[test]
fn cli_up_and_down_leave_nothing() {
    if !common::lab_possible() {
        return;
    }
    let state_dir = common::state_dir("cli");
    let dir = state_dir.to_string_lossy().into_owned();
    let _ = Lab::down(&state_dir);
    let (code, stdout, stderr) = common::run_cli(&[
        "up",
        "--model",
        "hdd",
        "--size",
        "256M",
        "--state-dir",
        &dir,
        "--backing-dir",
        common::BACKING_DIR,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("device: /dev/loop"), "{stdout}");
    let (code, stdout, stderr) = common::run_cli(&["down", "--state-dir", &dir]);
    assert_eq!(code, 0, "{stderr}");
    println!("{stdout}");
    common::assert_nothing_left(&state_dir, None);
}
