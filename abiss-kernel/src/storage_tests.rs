use std::fs;
use std::os::unix::fs::symlink;

use super::*;

/// A fake sysfs under the temp dir, removed on drop.
struct FakeSys(PathBuf);

impl FakeSys {
    fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "abissctl-doctor-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(path.join("dev/block")).unwrap();
        Self(path)
    }

    /// Block device directory `rel` (under `devices/`) with number `dev`, linked from
    /// `dev/block/MAJ:MIN`.
    fn device(&self, rel: &str, dev: &str) -> PathBuf {
        let dir = self.0.join("devices").join(rel);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("dev"), format!("{dev}\n")).unwrap();
        symlink(&dir, self.0.join("dev/block").join(dev)).unwrap();
        dir
    }
}

fn write(dir: &Path, file: &str, text: &str) {
    fs::create_dir_all(dir.join(file).parent().unwrap()).unwrap();
    fs::write(dir.join(file), text).unwrap();
}

/// `holder` is built on `slave` (`holder/slaves/NAME` links to it).
fn slave(holder: &Path, slave: &Path) {
    fs::create_dir_all(holder.join("slaves")).unwrap();
    symlink(
        slave,
        holder.join("slaves").join(slave.file_name().unwrap()),
    )
    .unwrap();
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn number(text: &str) -> DeviceNumber {
    text.parse().unwrap()
}

#[test]
fn a_crypt_device_on_a_partition_goes_down_to_its_disk() {
    let sys = FakeSys::new("crypt");
    sys.device("sda", "8:0");
    let sda2 = sys.device("sda/sda2", "8:2");
    write(&sda2, "partition", "2\n");
    let dm = sys.device("dm-0", "253:0");
    write(&dm, "dm/name", "root\n");
    write(&dm, "dm/uuid", "CRYPT-LUKS2-abc-root\n");
    slave(&dm, &sda2);
    let stack = stack_of(&sys.0, number("253:0")).expect("a stack");
    assert_eq!(
        stack.describe(),
        "dm-0 (253:0, dm-crypt 'root') → sda2 (8:2, partition 2) → sda (8:0, disk)"
    );
    assert_eq!(
        names_of(&stack.serving_disks()),
        ["sda"],
        "a dm device over one device is served from the disk beneath"
    );
    let physical: Vec<&str> = stack.physical().iter().map(|l| l.name.as_str()).collect();
    assert_eq!(physical, ["sda"]);
}

#[test]
fn a_partition_is_served_from_its_disk_and_an_md_array_has_all_its_members() {
    let sys = FakeSys::new("md");
    sys.device("sdb", "8:16");
    let first = sys.device("sdb/sdb1", "8:17");
    write(&first, "partition", "1\n");
    sys.device("sdc", "8:32");
    let second = sys.device("sdc/sdc1", "8:33");
    write(&second, "partition", "1\n");
    let md = sys.device("md0", "9:0");
    write(&md, "md/level", "raid1\n");
    slave(&md, &first);
    slave(&md, &second);
    let stack = stack_of(&sys.0, number("9:0")).unwrap();
    let physical: Vec<&str> = stack.physical().iter().map(|l| l.name.as_str()).collect();
    assert_eq!(physical, ["sdb", "sdc"]);
    assert!(
        stack.describe().starts_with("md0 (9:0, md raid1) → [sdb1"),
        "{}",
        stack.describe()
    );
    let partition = stack_of(&sys.0, number("8:17")).unwrap();
    assert_eq!(names_of(&partition.serving_disks()), ["sdb"]);
}

#[test]
fn a_loop_device_names_its_backing_file() {
    let sys = FakeSys::new("loop");
    let dir = sys.device("loop3", "7:3");
    write(&dir, "loop/backing_file", "/var/tmp/disk.img\n");
    let stack = stack_of(&sys.0, number("7:3")).unwrap();
    assert_eq!(stack.describe(), "loop3 (7:3, loop over /var/tmp/disk.img)");
    assert!(
        stack_of(&sys.0, number("7:4")).is_none(),
        "unknown to sysfs"
    );
}

#[test]
fn btrfs_devices_are_those_of_the_file_system_holding_the_source() {
    let sys = FakeSys::new("btrfs");
    let loop3 = sys.device("loop3", "7:3");
    let loop4 = sys.device("loop4", "7:4");
    let other = sys.device("loop5", "7:5");
    for (fsid, members) in [("aaaa", vec![&loop3, &loop4]), ("bbbb", vec![&other])] {
        let devices = sys.0.join("fs/btrfs").join(fsid).join("devices");
        fs::create_dir_all(&devices).unwrap();
        for member in members {
            symlink(member, devices.join(member.file_name().unwrap())).unwrap();
        }
    }
    let found = btrfs_devices(&sys.0, "loop4");
    assert_eq!(
        found,
        [loop3.canonicalize().unwrap(), loop4.canonicalize().unwrap()]
    );
    assert!(btrfs_devices(&sys.0, "sda").is_empty());
}

#[test]
fn mountinfo_lines_parse_with_their_escapes() {
    let text = "22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw\n\
                40 22 0:45 / /mnt/my\\040media rw shared:20 - btrfs /dev/loop3 rw,subvol=/\n\
                41 22 0:46 / /mnt/my\\040media/sub rw - btrfs /dev/loop3 rw,subvol=/sub\n\
                garbage line\n";
    let mounts = parse_mountinfo(text);
    assert_eq!(mounts.len(), 3);
    assert_eq!(mounts[1].at, PathBuf::from("/mnt/my media"));
    assert_eq!(mounts[1].fs_type, "btrfs");
    assert_eq!(mounts[1].source, "/dev/loop3");
    let by_device = mount_of(&mounts, Path::new("/mnt/my media/a"), number("0:45")).unwrap();
    assert_eq!(by_device.device, number("0:45"));
    // A nested subvolume's files have a device no mount reports: the deepest mount above.
    let nested = mount_of(&mounts, Path::new("/mnt/my media/sub/x/y"), number("0:99")).unwrap();
    assert_eq!(nested.device, number("0:46"));
    let root = mount_of(&mounts, Path::new("/home/u/f"), number("8:2")).unwrap();
    assert_eq!(root.source, "/dev/sda2");
}

#[test]
fn mounts_are_found_by_the_id_statx_reports() {
    let text = "22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw\n\
                40 22 0:45 / /mnt/media rw shared:20 - btrfs /dev/loop3 rw,subvol=/\n";
    let mounts = parse_mountinfo(text);
    assert_eq!(mounts[1].id, 40);
    assert_eq!(mount_by_id(&mounts, 40).unwrap().fs_type, "btrfs");
    assert!(mount_by_id(&mounts, 41).is_none());
}

fn btrfs_mount(source: &str) -> Mount {
    Mount {
        id: 40,
        device: number("0:45"),
        at: PathBuf::from("/mnt/media"),
        fs_type: "btrfs".to_owned(),
        source: source.to_owned(),
    }
}

#[test]
fn a_file_system_is_served_from_the_disks_under_it() {
    let sys = FakeSys::new("serving");
    sys.device("sda", "8:0");
    let sda2 = sys.device("sda/sda2", "8:2");
    write(&sda2, "partition", "2\n");
    let loop3 = sys.device("loop3", "7:3");
    let loop4 = sys.device("loop4", "7:4");
    let names = |disks: Vec<Layer>| disks.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
    // ext4 on a partition: its disk.
    assert_eq!(
        names(serving_disks(&sys.0, None, number("8:2")).unwrap()),
        ["sda"]
    );
    // A btrfs of one device, its files on an anonymous number: that device's disk.
    let devices = sys.0.join("fs/btrfs/aaaa/devices");
    fs::create_dir_all(&devices).unwrap();
    symlink(&loop3, devices.join("loop3")).unwrap();
    let mount = btrfs_mount("/nonexistent/loop3");
    assert_eq!(
        names(serving_disks(&sys.0, Some(&mount), number("0:46")).unwrap()),
        ["loop3"]
    );
    // Two devices: both serve it.
    symlink(&loop4, devices.join("loop4")).unwrap();
    let both = serving_disks(&sys.0, Some(&mount), number("0:46")).unwrap();
    assert_eq!(names(both), ["loop3", "loop4"]);
    // tmpfs is on no block device.
    let tmpfs = Mount {
        fs_type: "tmpfs".to_owned(),
        ..btrfs_mount("tmpfs")
    };
    let error = serving_disks(&sys.0, Some(&tmpfs), number("0:30")).unwrap_err();
    assert!(error
        .reason()
        .starts_with("is on tmpfs, which is on no block device"));
    assert_eq!(
        serving_disks(&sys.0, None, number("8:9")).unwrap_err(),
        Unservable::Unknown {
            device: number("8:9")
        }
    );
}

#[test]
fn a_device_mapper_chain_over_one_disk_is_served_from_it_and_records_only_through_lvm() {
    let sys = FakeSys::new("layers");
    sys.device("sda", "8:0");
    let sda2 = sys.device("sda/sda2", "8:2");
    write(&sda2, "partition", "2\n");
    // LVM on LUKS on a partition, as Debian's and Ubuntu's encrypted installs make it.
    let dm = sys.device("dm-0", "253:0");
    write(&dm, "dm/name", "sda2_crypt\n");
    write(&dm, "dm/uuid", "CRYPT-LUKS2-abc-sda2_crypt\n");
    slave(&dm, &sda2);
    let root = sys.device("dm-1", "253:1");
    write(&root, "dm/name", "vg-root\n");
    write(&root, "dm/uuid", "LVM-abcdef\n");
    slave(&root, &dm);
    let linear = sys.device("dm-2", "253:2");
    write(&linear, "dm/name", "plain\n");
    slave(&linear, &sda2);
    let names = |disks: Vec<Layer>| disks.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
    for dev in ["253:0", "253:1", "253:2"] {
        assert_eq!(
            names(serving_disks(&sys.0, None, number(dev)).unwrap()),
            ["sda"],
            "{dev}"
        );
    }
    // Reading streams pass through every one; recordings only through LVM's.
    let stack = |dev: &str| stack_of(&sys.0, number(dev)).unwrap();
    let reason = recording_reason(&stack("253:1")).expect("LVM on LUKS writes from dm-crypt");
    assert!(
        reason
            .starts_with("is on dm-1 (253:1, LVM 'vg-root') → dm-0 (253:0, dm-crypt 'sda2_crypt')")
            && reason.contains(": dm-crypt 'sda2_crypt' writes a file's pages"),
        "{reason}"
    );
    let reason = recording_reason(&stack("253:2")).expect("an unnamed dm may write its own");
    assert!(
        reason.contains("device mapper 'plain' may write"),
        "{reason}"
    );
    let lvm = sys.device("dm-3", "253:3");
    write(&lvm, "dm/name", "vg-media\n");
    write(&lvm, "dm/uuid", "LVM-ghijkl\n");
    slave(&lvm, &sda2);
    assert_eq!(recording_reason(&stack("253:3")), None);
    assert_eq!(
        physical_disks(&sys.0, number("253:1")).unwrap()[0].name,
        "sda",
        "`--device` naming the top of the stack means the disk"
    );
}

#[test]
fn md_mirrors_and_stripes_and_a_device_mapper_over_several_devices_are_served_from_every_disk() {
    let sys = FakeSys::new("spread-layers");
    // Striped LVM over two disks, an md raid1, and LUKS on the md: served from both disks.
    let sdb = sys.device("sdb", "8:16");
    let sdc = sys.device("sdc", "8:32");
    let striped = sys.device("dm-4", "253:4");
    write(&striped, "dm/name", "vg-striped\n");
    write(&striped, "dm/uuid", "LVM-mnopqr\n");
    slave(&striped, &sdb);
    slave(&striped, &sdc);
    let md = sys.device("md0", "9:0");
    write(&md, "md/level", "raid1\n");
    slave(&md, &sdb);
    slave(&md, &sdc);
    let luks_on_md = sys.device("dm-5", "253:5");
    write(&luks_on_md, "dm/name", "md0_crypt\n");
    write(&luks_on_md, "dm/uuid", "CRYPT-LUKS2-def-md0_crypt\n");
    slave(&luks_on_md, &md);
    let serving = |dev: &str| -> Vec<String> {
        serving_disks(&sys.0, None, number(dev))
            .unwrap()
            .iter()
            .map(|d| d.name.clone())
            .collect()
    };
    for dev in ["253:4", "9:0", "253:5"] {
        assert_eq!(serving(dev), ["sdb", "sdc"], "{dev}");
    }
    // Striped LVM records; through md, only reading streams are served.
    let stack = |dev: &str| stack_of(&sys.0, number(dev)).unwrap();
    assert_eq!(recording_reason(&stack("253:4")), None);
    let reason = recording_reason(&stack("9:0")).expect("md records nothing");
    assert!(
        reason.contains("recordings through md raid1 are not served"),
        "{reason}"
    );
    // raid5 reads through its stripe cache, from md's thread: refused, naming it.
    let md5 = sys.device("md1", "9:1");
    write(&md5, "md/level", "raid5\n");
    slave(&md5, &sdb);
    slave(&md5, &sdc);
    let luks_on_md5 = sys.device("dm-7", "253:7");
    write(&luks_on_md5, "dm/name", "md1_crypt\n");
    write(&luks_on_md5, "dm/uuid", "CRYPT-LUKS2-ghi-md1_crypt\n");
    slave(&luks_on_md5, &md5);
    for dev in ["9:1", "253:7"] {
        let error = serving_disks(&sys.0, None, number(dev)).unwrap_err();
        let Unservable::Layer { layer, .. } = &error else {
            panic!("{error:?}");
        };
        assert_eq!(layer.name, "md1");
        let reason = error.reason();
        assert!(
            reason.contains("md (md1 raid5) reads and writes through its stripe cache"),
            "{reason}"
        );
    }
    let table_only = sys.device("dm-6", "253:6");
    write(&table_only, "dm/name", "zero\n");
    let reason = serving_disks(&sys.0, None, number("253:6"))
        .unwrap_err()
        .reason();
    assert!(reason.contains("is built on no disk"), "{reason}");
    // `--device` naming any level means the disks at the bottom.
    let disks = |dev: &str| -> Vec<String> {
        physical_disks(&sys.0, number(dev))
            .unwrap()
            .iter()
            .map(|d| d.name.clone())
            .collect()
    };
    assert_eq!(disks("253:5"), ["sdb", "sdc"]);
    assert_eq!(disks("9:0"), ["sdb", "sdc"]);
    assert_eq!(disks("8:16"), ["sdb"]);
    assert!(physical_disks(&sys.0, number("1:1")).is_none());
}

fn names_of(layers: &[&Layer]) -> Vec<String> {
    layers.iter().map(|l| l.name.clone()).collect()
}

#[test]
fn a_disk_names_what_is_built_on_it_and_on_its_partitions_every_level_up() {
    let sys = FakeSys::new("built-on");
    let sdb = sys.device("sdb", "8:16");
    let sdb1 = sys.device("sdb/sdb1", "8:17");
    write(&sdb1, "partition", "1\n");
    let sdc = sys.device("sdc", "8:32");
    let md = sys.device("md0", "9:0");
    write(&md, "md/level", "raid1\n");
    slave(&md, &sdb1);
    slave(&md, &sdc);
    let crypt = sys.device("dm-0", "253:0");
    write(&crypt, "dm/name", "md0_crypt\n");
    write(&crypt, "dm/uuid", "CRYPT-LUKS2-abc-md0_crypt\n");
    slave(&crypt, &md);
    // sysfs shows each holder under the device it holds, and the disks under block/.
    let holder = |below: &Path, above: &Path| {
        fs::create_dir_all(below.join("holders")).unwrap();
        symlink(
            above,
            below.join("holders").join(above.file_name().unwrap()),
        )
        .unwrap();
    };
    holder(&sdb1, &md);
    holder(&sdc, &md);
    holder(&md, &crypt);
    fs::create_dir_all(sys.0.join("block")).unwrap();
    for disk in [&sdb, &sdc] {
        symlink(disk, sys.0.join("block").join(disk.file_name().unwrap())).unwrap();
    }
    let above = ["dm-0 (253:0, dm-crypt 'md0_crypt')", "md0 (9:0, md raid1)"];
    assert_eq!(built_on(&sys.0, "sdb"), above, "through its partition");
    assert_eq!(built_on(&sys.0, "sdc"), above);
    assert!(built_on(&sys.0, "sdd").is_empty());
}
