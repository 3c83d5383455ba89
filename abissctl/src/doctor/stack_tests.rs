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
        stack.serving_disk().name,
        "dm-0",
        "abissd serves by the dm device"
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
    assert_eq!(partition.serving_disk().name, "sdb");
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
