//! `abiss-stuck-uring SOCKET FILE COUNT SECS`: what a user who means to fill abissd's table of
//! `io_uring` requests does, run by the security tests as an unprivileged user. It attaches
//! FILE at 1000 B/s and reads its first byte (so the programs take its process for a reader of
//! an attached file, whose `io_uring` requests they follow), then submits COUNT polls on the
//! read end of a pipe nobody writes, which never complete, and holds them (and its stream)
//! for SECS seconds. Prints `stuck N` once all N are submitted.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::ExitCode;

use abiss_client::Client;
use abiss_proto::AttachRequest;
use io_uring::{opcode, types, IoUring};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, socket, file, count, secs] = args.as_slice() else {
        eprintln!("usage: abiss-stuck-uring SOCKET FILE COUNT SECS");
        return ExitCode::from(2);
    };
    let (Ok(count), Ok(secs)) = (count.parse::<u32>(), secs.parse::<u64>()) else {
        eprintln!("COUNT and SECS are numbers");
        return ExitCode::from(2);
    };
    let mut client = Client::connect(Path::new(socket)).expect("connect");
    let opened = std::fs::File::open(file).expect("open");
    let _stream = client
        .attach(
            opened.try_clone().expect("dup"),
            AttachRequest {
                persistent: false,
                ..abiss_tests::read_request(1000, 64 << 10, 1)
            },
        )
        .expect("attach");
    let mut byte = [0u8; 1];
    let _ = opened.read_at(&mut byte, 0);
    // The programs remember the reader from the kernel's report of that read.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (reader, _writer) = nix::unistd::pipe().expect("pipe");
    let mut ring = IoUring::new(1024).expect("io_uring");
    let mut submitted = 0;
    while submitted < count {
        let batch = (count - submitted).min(1024);
        for _ in 0..batch {
            let poll =
                opcode::PollAdd::new(types::Fd(reader.as_raw_fd()), libc::POLLIN as u32).build();
            // SAFETY: a poll holds no buffer.
            unsafe { ring.submission().push(&poll) }.expect("push");
        }
        ring.submit().expect("submit");
        submitted += batch;
    }
    println!("stuck {submitted}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(std::time::Duration::from_secs(secs));
    ExitCode::SUCCESS
}
