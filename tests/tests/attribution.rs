//! Requests are attributed to the task that submitted them and to the file whose pages they carry.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::time::Duration;

use abiss_proto::{Request, Response};
use abiss_tests::{require_root, Daemon, Ext4Mount, LoopDevice};

#[test]
fn a_buffered_read_is_attributed_to_its_inode_and_reader() {
    require_root!();
    let daemon = Daemon::start();
    let fs = Ext4Mount::new(LoopDevice::new_in("/dev/shm", 128));
    let file_path = fs.path().join("known-file");
    std::fs::write(&file_path, vec![0x5a_u8; 2 << 20]).expect("write file");
    let status = std::process::Command::new("sync").status().expect("sync");
    assert!(status.success());
    let meta = std::fs::metadata(&file_path).expect("stat");
    let (ino, fs_dev) = (meta.ino(), meta.dev());

    let mut events = daemon.connect();
    events.send(Request::Events);
    // The daemon answers once attribution is on: the read below is recorded.
    events.set_timeout(Duration::from_secs(5));
    assert_eq!(events.receive(), Response::Subscribed);

    let mut file = std::fs::File::open(&file_path).expect("open");
    // Evict the file's pages so the read goes to the disk.
    // SAFETY: plain fadvise on an open descriptor.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
    let reader_tid = nix::unistd::gettid().as_raw();
    let mut contents = Vec::new();
    file.read_to_end(&mut contents).expect("read");
    assert_eq!(contents.len(), 2 << 20);

    events.set_timeout(Duration::from_secs(5));
    let mut file_bytes = 0u64;
    let mut seen = Vec::new();
    let device = fs.device().number();
    while file_bytes < 2 << 20 {
        let Response::Event(record) = events.receive() else {
            panic!("expected events");
        };
        // Root's events cover every disk: another test's file may have the same inode number.
        if record.device == device && record.inode == Some(ino) {
            seen.push(record.clone());
            file_bytes += u64::from(record.bytes);
        }
    }
    for record in &seen {
        assert_eq!(
            record.tgid,
            std::process::id(),
            "submitted by this process: {record:?}"
        );
        assert_eq!(
            record.pid,
            u32::try_from(reader_tid).unwrap(),
            "by the reading thread"
        );
        let inode_dev = record.inode_device.expect("inode device");
        assert_eq!(u64::from(inode_dev.major), u64::from(libc::major(fs_dev)));
        assert_eq!(u64::from(inode_dev.minor), u64::from(libc::minor(fs_dev)));
        assert!(!record.comm.is_empty());
    }
}
