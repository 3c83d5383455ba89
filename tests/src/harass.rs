//! The soak's hostile user (`abiss-hostile-client SOCKET harass SECS FILE DEVICE FUSE_FILE`,
//! run as `nobody` by `cargo xtask bench soak`): eight of the security tests' attacks on
//! abissd, those that load it, all at once and each on a thread of its own, for the soak's
//! whole length. Each is tried again after a failure (abissd is killed and restarted during
//! the soak); one that panics (the shared helpers `expect` what only a broken machine
//! refuses) ends, and its line is missing from what this prints.
//!
//! `FILE` is the user's own file on the managed disk, the file beside it with the extension
//! `rec` one the user may write, `DEVICE` that disk, `FUSE_FILE` a file whose flush its server
//! answers late (`abiss_lab::stalling_fs`). It stops when standard input ends or SECS have
//! passed, and prints one line per attack: `NAME tries T done D`.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use abiss_client::Client;
use abiss_proto::{AttachRequest, StreamId};

/// Where the attacks aim.
struct Target {
    socket: PathBuf,
    file: PathBuf,
    device: String,
    fuse_file: PathBuf,
    stop: Arc<AtomicBool>,
    until: Instant,
}

impl Target {
    fn going_on(&self) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < self.until
    }

    /// Sleeps `period`, or less if it ends meanwhile.
    fn pause(&self, period: Duration) {
        let end = Instant::now() + period;
        while self.going_on() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50).min(end - Instant::now()));
        }
    }

    /// A connection with the user's file attached at `rate` (non-persistent, 64 KiB buffer).
    fn attached(&self, rate: u64) -> Result<(Client, StreamId), String> {
        crate::hostile_raises::try_attach(&self.socket, &self.file, rate)
    }

    fn connect(&self) -> Result<Client, String> {
        Client::connect(&self.socket).map_err(|e| format!("connect: {e}"))
    }
}

/// One attack: what it is called, how often it is made, and one try of it (`Err`: why it did
/// not get as far as it means to).
struct Attack {
    name: &'static str,
    every: Duration,
    once: fn(&Target, &mut Held) -> Result<(), String>,
}

/// What an attack keeps between tries.
#[derive(Default)]
struct Held {
    listener: Option<std::net::TcpListener>,
    child: Option<std::process::Child>,
}

/// A user's closes are done one after another, and one whose close waits holds up the rest:
/// past 16 waiting, abissd takes nothing more from that user. The closes that wait (a
/// lingering socket until the next is passed, 2 s later; a FUSE file's for 1 s every 5 s) come
/// seldom enough that this user's other descriptors (each attach passes one) get through most
/// of the time, so that the other attacks reach abissd; at a lingering socket every 200 ms let
/// go after 3 s, 16 to 66 were waiting and most of them were refused.
const ATTACKS: [Attack; 8] = [
    Attack {
        name: "lingering-sockets",
        every: Duration::from_secs(2),
        once: lingering_socket,
    },
    Attack {
        name: "fuse-files",
        every: Duration::from_secs(5),
        once: fuse_file,
    },
    Attack {
        name: "raised-direct-threads",
        every: Duration::from_millis(500),
        once: raised_direct_threads,
    },
    Attack {
        name: "held-raises",
        every: Duration::from_secs(5),
        once: held_raises,
    },
    Attack {
        name: "rereads",
        every: Duration::from_secs(4),
        once: rereads,
    },
    Attack {
        name: "plans-and-subscriptions",
        every: Duration::from_secs(1),
        once: plan_and_subscribe,
    },
    Attack {
        name: "recordings-moved-ahead",
        every: Duration::from_secs(2),
        once: recording_moved_ahead,
    },
    Attack {
        name: "stuck-uring",
        every: STUCK_URING_EVERY,
        once: stuck_uring,
    },
];

/// `harass`: runs every attack until standard input ends or `secs` have passed (any other
/// `mode` with as many arguments is a usage error).
#[must_use]
pub fn run(
    mode: &str,
    socket: &str,
    secs: &str,
    file: &str,
    device: &str,
    fuse_file: &str,
) -> ExitCode {
    if mode != "harass" {
        eprintln!("usage: abiss-hostile-client SOCKET harass SECS FILE DEVICE FUSE_FILE");
        return ExitCode::from(2);
    }
    let Ok(secs) = secs.parse::<u64>() else {
        eprintln!("SECS is a number");
        return ExitCode::from(2);
    };
    let stop = Arc::new(AtomicBool::new(false));
    let target = Arc::new(Target {
        socket: socket.into(),
        file: file.into(),
        device: device.to_owned(),
        fuse_file: fuse_file.into(),
        stop: Arc::clone(&stop),
        until: Instant::now() + Duration::from_secs(secs),
    });
    // Detached: it ends with the process when standard input never does.
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stop.store(true, Ordering::Relaxed);
    });
    let threads: Vec<_> = ATTACKS
        .iter()
        .map(|attack| {
            let target = Arc::clone(&target);
            std::thread::spawn(move || {
                let (mut tries, mut done, mut held) = (0u64, 0u64, Held::default());
                let mut failures = std::collections::BTreeMap::<String, u64>::new();
                while target.going_on() {
                    tries += 1;
                    match (attack.once)(&target, &mut held) {
                        Ok(()) => done += 1,
                        Err(why) => *failures.entry(why).or_default() += 1,
                    }
                    target.pause(attack.every);
                }
                for (why, times) in failures {
                    eprintln!("{}: {times} times: {why}", attack.name);
                }
                if let Some(mut child) = held.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                (attack.name, tries, done)
            })
        })
        .collect();
    for thread in threads {
        if let Ok((name, tries, done)) = thread.join() {
            // Whoever started it may be gone (a soak ended early): nothing to say then.
            let _ = writeln!(std::io::stdout(), "{name} tries {tries} done {done}");
        }
    }
    ExitCode::SUCCESS
}

/// A TCP socket whose close waits 30 s, let go when the next is passed (the attack's period
/// later); then a `hello` with 4 more descriptors.
fn lingering_socket(target: &Target, held: &mut Held) -> Result<(), String> {
    held.listener = None;
    let socket = target.socket.to_string_lossy();
    let passed = crate::hostile::pass_lingering_socket(&socket, 30, false);
    let _ = crate::hostile::hellos_with_descriptors(&socket, 1, 4);
    held.listener =
        Some(passed.ok_or("refused (abissd down, or this user's closes at their bound)")?);
    Ok(())
}

/// The stalling file system's file, attached (abissd refuses it: it is on no managed disk);
/// its close waits for the server's late flush, in abissd and here.
fn fuse_file(target: &Target, _: &mut Held) -> Result<(), String> {
    let mut client = target.connect()?;
    let file = std::fs::File::open(&target.fuse_file).map_err(|e| format!("open: {e}"))?;
    match client.attach(file, crate::read_request(1000, 64 << 10, 1)) {
        Ok(_) => Err("abissd attached a file on no managed disk".into()),
        // "… is on fuse, which is on no block device …"
        Err(error) if error.to_string().contains(" is on ") => Ok(()),
        Err(error) => Err(format!("attach refused otherwise: {error}")),
    }
}

/// A stream of 1 B/s whose every short-lived thread is said to be about to read it, and
/// then reads 1 MiB of the file with `O_DIRECT`: four at once (issue 33's raises policed per
/// thread). Done when abissd raised any.
fn raised_direct_threads(target: &Target, _: &mut Held) -> Result<(), String> {
    const READ: usize = 256 << 10;
    let (mut client, stream) = target.attached(1)?;
    let mut raised = 0;
    let threads: Vec<_> = (0..4u64)
        .filter_map(|part| {
            let (tid_tx, tid_rx) = mpsc::channel();
            let (go_tx, go_rx) = mpsc::channel::<()>();
            let file = target.file.clone();
            let thread = std::thread::spawn(move || {
                let _ = tid_tx.send(nix::unistd::gettid().as_raw());
                let _ = go_rx.recv();
                let Ok(file) = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(file)
                else {
                    return;
                };
                let mut buffer = abiss_lab::direct_io::AlignedBuffer::new(READ);
                for chunk in 0..4 {
                    let at = (part * 4 + chunk) * READ as u64;
                    let _ = file.read_at(buffer.slice(READ), at);
                }
            });
            let tid = u32::try_from(tid_rx.recv().ok()?).ok()?;
            if client.reader_starts(stream, tid).unwrap_or(false) {
                raised += 1;
            }
            let _ = go_tx.send(());
            Some(thread)
        })
        .collect();
    joined(threads, raised)
}

/// A stream whose 32 waiting threads are each said to be about to read it, held 2 s (the raise
/// allowance that multiplies). Done when abissd raised any.
fn held_raises(target: &Target, _: &mut Held) -> Result<(), String> {
    const THREADS: usize = 32;
    let (mut client, stream) = target.attached(1000)?;
    let (tids, waiting) = mpsc::channel();
    // The threads wait here until the hold ends.
    let released = Arc::new(std::sync::Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (tids, released) = (tids.clone(), Arc::clone(&released));
            std::thread::spawn(move || {
                let _ = tids.send(nix::unistd::gettid().as_raw());
                released.wait();
            })
        })
        .collect();
    let raised = waiting
        .iter()
        .take(THREADS)
        .filter(|tid| {
            u32::try_from(*tid).is_ok_and(|tid| client.reader_starts(stream, tid).unwrap_or(false))
        })
        .count();
    target.pause(Duration::from_secs(2));
    released.wait();
    joined(threads, raised)
}

/// Waits for an attack's `threads`; done if abissd `raised` any of them.
fn joined(threads: Vec<std::thread::JoinHandle<()>>, raised: usize) -> Result<(), String> {
    for thread in threads {
        let _ = thread.join();
    }
    if raised > 0 {
        Ok(())
    } else {
        Err("no thread raised".into())
    }
}

/// The user's attached file's first byte read over and over for 1 s (each read is an event
/// for abissd; the reports are paced per owner).
fn rereads(target: &Target, _: &mut Held) -> Result<(), String> {
    let _attached = target.attached(1000)?;
    let file = std::fs::File::open(&target.file).map_err(|e| format!("open: {e}"))?;
    let until = Instant::now() + Duration::from_secs(1);
    let mut byte = [0u8; 1];
    while Instant::now() < until && target.going_on() {
        let _ = file.read_at(&mut byte, 0);
    }
    Ok(())
}

/// The costliest capacity plan (10 000 streams of 1 B/s), then a connection that attaches,
/// subscribes to request events and hangs up.
fn plan_and_subscribe(target: &Target, _: &mut Held) -> Result<(), String> {
    let mut client = target.connect()?;
    client
        .call(crate::hostile::costliest_plan(&target.device))
        .map_err(|e| format!("plan: {e}"))?;
    drop(client);
    let (mut client, _) = target.attached(1000)?;
    client
        .subscribe_events()
        .map_err(|e| format!("subscribe: {e}"))
}

/// What abissd may hold allocated past a user's writers, all its recordings together
/// (`MAX_PREALLOCATED_AHEAD_PER_USER`).
const AHEAD_PER_USER: u64 = 64 << 20;

/// A recording of the `rec` file at 1 MiB/s with allocation ahead, whose writer writes 1 MiB
/// and then moves the file's end 1 GiB ahead with `ftruncate` (before issue 33, abissd
/// allocated ahead of that end, as root, past the owner's quota), again and again in the soak.
/// Fails if more than the user's bound was allocated past what was written, 1 s later: a net
/// for a gross failure only, since one move gets about 4 s of the rate ahead (4 MiB) from
/// abissd, before issue 33 as now; what bounds many moves (twice the allocation ahead plus
/// the rate times the time) is the property test `allocation_stays_within_its_rate`.
/// The next try empties the file.
fn recording_moved_ahead(target: &Target, _: &mut Held) -> Result<(), String> {
    const WRITTEN: u64 = 1 << 20;
    let path = target.file.with_extension("rec");
    let file = std::fs::File::options()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut client = target.connect()?;
    let request = AttachRequest {
        write: true,
        preallocate: true,
        persistent: false,
        ..crate::read_request(1 << 20, 1 << 20, 1)
    };
    let copy = file.try_clone().map_err(|e| format!("dup: {e}"))?;
    client
        .attach(copy, request)
        .map_err(|e| format!("attach: {e}"))?;
    let data = vec![b'a'; usize::try_from(WRITTEN).unwrap_or(0)];
    file.write_all_at(&data, 0)
        .and_then(|()| file.set_len(1 << 30))
        .map_err(|e| format!("write: {e}"))?;
    target.pause(Duration::from_secs(1));
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&file.metadata().map_err(|e| format!("stat: {e}"))?)
            * 512;
    if allocated > WRITTEN + AHEAD_PER_USER {
        return Err(format!(
            "{} MiB allocated past {} MiB written, over the user's bound",
            (allocated - WRITTEN) >> 20,
            WRITTEN >> 20
        ));
    }
    Ok(())
}

/// How often a new `abiss-stuck-uring` starts; each holds its requests a little less.
const STUCK_URING_EVERY: Duration = Duration::from_secs(60);

/// `abiss-stuck-uring` beside this program: 300 `io_uring` polls that never complete, more
/// than abissd follows of one user, held 55 s at a time. Each try starts a new one and judges
/// the one before: done if it said it had submitted them all (the first try has none to judge).
fn stuck_uring(target: &Target, held: &mut Held) -> Result<(), String> {
    let judged = match held.child.take() {
        Some(mut child) => {
            // It has held its requests its 55 s by now; one still running is stuck itself.
            let _ = child.kill();
            let mut said = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                let _ = stdout.read_to_string(&mut said);
            }
            let _ = child.wait();
            if said.starts_with("stuck ") {
                Ok(())
            } else {
                Err("the last one did not submit its requests (abissd down at its attach?)".into())
            }
        }
        None => Err("the first one, not judged yet".into()),
    };
    let program = std::env::current_exe()
        .ok()
        .and_then(|me| Some(me.parent()?.join("abiss-stuck-uring")))
        .unwrap_or_else(|| Path::new("abiss-stuck-uring").to_path_buf());
    let child = std::process::Command::new(program)
        .arg(&target.socket)
        .arg(&target.file)
        .args(["300", "55"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start abiss-stuck-uring: {e}"))?;
    held.child = Some(child);
    judged
}
