//! abissd's own use of a stream's file is no access by the user: attaching a file, mapping it
//! and loading its window leave the file's access time as it was. On ext4 an access-time
//! update is a journal handle, and while a commit holds the journal the daemon's `mmap` at
//! attach waited for it in the main loop (4 s in the recording benchmark, with every client
//! and every stream's window waiting with it); the daemon maps its own `O_NOATIME` descriptor.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use abiss_tests::{
    attached_id, evict, require_root, resident_bytes, wait_until, Daemon, Ext4Mount, LoopDevice,
};

const MIB: u64 = 1 << 20;

/// Sets the file's access time an hour before its modification time, so that under the
/// default `relatime` the next access of the file updates it.
fn age_access_time(file: &File) {
    let modified = file.metadata().expect("stat").modified().expect("mtime");
    let times = std::fs::FileTimes::new().set_accessed(modified - Duration::from_secs(3600));
    file.set_times(times).expect("set the access time");
}

#[test]
fn attaching_and_loading_a_file_leave_its_access_time_alone() {
    require_root!();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 64));
    let path = fs.path().join("media.ts");
    std::fs::write(
        &path,
        vec![0x47_u8; usize::try_from(8 * MIB).expect("size")],
    )
    .expect("write the file");
    // The test's own looks at the page cache map the file too: without updating its atime.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(&path)
        .expect("open");
    file.sync_all().expect("sync");
    evict(&file);
    age_access_time(&file);
    let before = std::fs::metadata(&path)
        .expect("stat")
        .accessed()
        .expect("atime");
    let daemon = Daemon::start_managing(fs.device().path(), &[]);
    let output = daemon.attach_1mb_output(&path, "2MiB");
    let id = attached_id(&output);
    assert!(
        wait_until(Duration::from_secs(10), || resident_bytes(
            &file,
            0,
            2 * MIB
        ) == 2 * MIB),
        "the window is loaded"
    );
    let output = daemon.ctl(["detach", &id.to_string()]);
    assert!(output.status.success(), "{output:?}");
    let after = std::fs::metadata(&path)
        .expect("stat")
        .accessed()
        .expect("atime");
    assert_eq!(
        after, before,
        "abissd's mapping and loads changed the file's access time"
    );
    // The check can fail: a read of the file by anyone updates it.
    let mut byte = [0u8; 1];
    std::io::Read::read(&mut File::open(&path).expect("open"), &mut byte).expect("read");
    let read = std::fs::metadata(&path)
        .expect("stat")
        .accessed()
        .expect("atime");
    assert!(
        read > before,
        "a read updates the access time under relatime"
    );
}
