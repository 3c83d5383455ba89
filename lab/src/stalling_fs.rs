//! A medium that does not answer: a FUSE file system mounted by an unprivileged user, whose
//! server (a program the caller names) holds requests for its file as long as it likes. The
//! security tests and the soak hand its file to a daemon to check that nothing the daemon does
//! with a user's object waits on it.

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::LabError;

/// What an ordinary Debian machine lets a user do with FUSE: `/dev/fuse` open to all (udev
/// gives it mode 0666; some containers have 0600) and `user_allow_other` in
/// `/etc/fuse.conf` (an administrator's choice, common where users share `sshfs` mounts). Both
/// are put back as they were when the last value alive on the machine drops, whatever process
/// holds it and whatever order they drop in: the test binaries that run at once share one
/// ledger ([`LEDGER`]). Before, each process kept its own count, so one that started while
/// another had FUSE shared took the shared state for the original and left it behind
/// (`/dev/fuse` 0666 after the suite), or put it back under the other's feet.
#[derive(Debug)]
pub struct UsersMayShareFuse(());

const FUSE_DEVICE: &str = "/dev/fuse";
const FUSE_CONFIG: &str = "/etc/fuse.conf";
/// The state to put back and the processes holding a [`UsersMayShareFuse`], read and written
/// only under an exclusive `flock` of [`LEDGER_LOCK`]. In `/run`, which a boot empties, as it
/// puts `/dev/fuse` back.
const LEDGER: &str = "/run/abiss-lab-fuse-sharing.json";
const LEDGER_LOCK: &str = "/run/abiss-lab-fuse-sharing.lock";

/// The device's mode and the configuration as they were before the first holder, and one
/// entry per value alive: its process and that process's start time (clock ticks after boot),
/// so that a holder that died without dropping (killed) is told from a new process with its id.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Ledger {
    device_mode: u32,
    config: Option<Vec<u8>>,
    holders: Vec<(i32, u64)>,
}

impl Ledger {
    /// The ledger on disk, if there is one.
    fn read() -> Result<Option<Self>, LabError> {
        match std::fs::read(LEDGER) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| LabError::system(format!("read {LEDGER}"), e)),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(LabError::system(format!("read {LEDGER}"), error)),
        }
    }

    fn write(&self) -> Result<(), LabError> {
        let bytes = serde_json::to_vec(self).map_err(|e| LabError::system("ledger", e))?;
        let next = format!("{LEDGER}.next");
        std::fs::write(&next, bytes)
            .and_then(|()| std::fs::rename(&next, LEDGER))
            .map_err(|e| LabError::system(format!("write {LEDGER}"), e))
    }

    /// Forgets the holders that are gone.
    fn prune(&mut self) {
        self.holders
            .retain(|&(pid, started)| start_ticks(pid) == Some(started));
    }
}

/// Process `pid`'s start time in clock ticks after boot, if it is alive.
fn start_ticks(pid: i32) -> Option<u64> {
    procfs::process::Process::new(pid)
        .and_then(|process| process.stat())
        .ok()
        .filter(|stat| stat.state != 'Z')
        .map(|stat| stat.starttime)
}

/// Runs `change` on the ledger under the machine-wide lock.
fn with_ledger<T>(
    change: impl FnOnce(Option<Ledger>) -> Result<T, LabError>,
) -> Result<T, LabError> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LEDGER_LOCK)
        .map_err(|e| LabError::system(format!("open {LEDGER_LOCK}"), e))?;
    let _locked = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| LabError::system(format!("lock {LEDGER_LOCK}"), e))?;
    change(Ledger::read()?)
}

/// Puts `/dev/fuse`'s mode and `/etc/fuse.conf` back as `ledger` has them, and removes the
/// ledger: nobody holds the sharing any more. Under the lock.
fn put_back(mut ledger: Ledger) -> Result<(), LabError> {
    let mode = std::fs::Permissions::from_mode(ledger.device_mode & 0o7777);
    std::fs::set_permissions(FUSE_DEVICE, mode)
        .map_err(|e| LabError::system("put back the mode of /dev/fuse", e))?;
    match ledger.config.take() {
        Some(config) => std::fs::write(FUSE_CONFIG, config),
        None => std::fs::remove_file(FUSE_CONFIG),
    }
    .map_err(|e| LabError::system("put back /etc/fuse.conf", e))?;
    std::fs::remove_file(LEDGER).map_err(|e| LabError::system("remove the ledger", e))
}

impl UsersMayShareFuse {
    /// Allows it until the value drops.
    ///
    /// # Errors
    /// `/dev/fuse` missing, the ledger unusable, or either setting cannot be written.
    pub fn allow() -> Result<Self, LabError> {
        let me = std::process::id().cast_signed();
        let started = start_ticks(me).ok_or_else(|| LabError::system("/proc/self", "gone"))?;
        with_ledger(|ledger| {
            let mut ledger = match ledger {
                // Holders that all died leave their original behind: it is still the one.
                Some(mut ledger) => {
                    ledger.prune();
                    ledger
                }
                None => Ledger {
                    device_mode: std::fs::metadata(FUSE_DEVICE)
                        .map_err(|e| {
                            LabError::system("/dev/fuse (install fuse3: cargo xtask setup)", e)
                        })?
                        .permissions()
                        .mode(),
                    // Missing is a state to put back (by removing it); unreadable is not.
                    config: match std::fs::read(FUSE_CONFIG) {
                        Ok(config) => Some(config),
                        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
                        Err(error) => return Err(LabError::system("read /etc/fuse.conf", error)),
                    },
                    holders: Vec::new(),
                },
            };
            let first = ledger.holders.is_empty();
            if first {
                let mut allowed = ledger.config.clone().unwrap_or_default();
                allowed.extend_from_slice(b"\nuser_allow_other\n");
                // Written first: a crash below leaves what to put back on record.
                ledger.write()?;
                let shared =
                    std::fs::set_permissions(FUSE_DEVICE, std::fs::Permissions::from_mode(0o666))
                        .map_err(|e| LabError::system("chmod /dev/fuse", e))
                        .and_then(|()| {
                            std::fs::write(FUSE_CONFIG, allowed)
                                .map_err(|e| LabError::system("write /etc/fuse.conf", e))
                        });
                if let Err(error) = shared {
                    // Nobody holds it: what was changed goes back now.
                    let _ = put_back(ledger);
                    return Err(error);
                }
            }
            ledger.holders.push((me, started));
            if let Err(error) = ledger.write() {
                if first {
                    let _ = put_back(ledger);
                }
                return Err(error);
            }
            Ok(Self(()))
        })
    }
}

impl Drop for UsersMayShareFuse {
    fn drop(&mut self) {
        let me = std::process::id().cast_signed();
        let done = with_ledger(|ledger| {
            let Some(mut ledger) = ledger else {
                return Ok(());
            };
            if let Some(at) = ledger.holders.iter().position(|&(pid, _)| pid == me) {
                ledger.holders.swap_remove(at);
            }
            ledger.prune();
            if !ledger.holders.is_empty() {
                return ledger.write();
            }
            put_back(ledger)
        });
        if let Err(error) = done {
            eprintln!("{error}");
        }
    }
}

/// A stalling file system's server, run as user and group `uid` on a mountpoint of its own,
/// with what users need to share FUSE allowed meanwhile. Unmounted when it drops (the server
/// goes first, which fails every request still waiting on it).
#[derive(Debug)]
pub struct StallingFs {
    server: Child,
    mountpoint: PathBuf,
    directory: PathBuf,
    _fuse: UsersMayShareFuse,
}

impl StallingFs {
    /// Starts `server MOUNTPOINT [FLUSH_AFTER_MS]` as `uid` (as any user can mount, through
    /// set-uid `fusermount3`) on a new directory under `base`, and waits for it to print
    /// `serving`.
    ///
    /// # Errors
    /// FUSE cannot be shared, the directory cannot be made, or the server did not say it
    /// serves.
    pub fn mount(
        server: &Path,
        uid: u32,
        base: &Path,
        flush_after: Option<Duration>,
    ) -> Result<Self, LabError> {
        // One directory per mount: a test may hold two at once.
        static MOUNTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let fuse = UsersMayShareFuse::allow()?;
        let mount = MOUNTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let directory = base.join(format!("abiss-stalling-fs-{}-{mount}", std::process::id()));
        let mountpoint = directory.join("mnt");
        // Made here, never found: a directory someone else put at this name in a shared base
        // is refused, neither used nor removed (mkdir follows no link), and only root may
        // write the new one, so nobody can swap the mountpoint before its chown.
        let mut builder = std::fs::DirBuilder::new();
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o755);
        builder
            .create(&directory)
            .map_err(|e| LabError::system(format!("make {}", directory.display()), e))?;
        let made = builder
            .create(&mountpoint)
            .and_then(|()| std::os::unix::fs::chown(&mountpoint, Some(uid), None));
        if let Err(error) = made {
            let _ = std::fs::remove_dir_all(&directory);
            return Err(LabError::system(
                format!("make {}", mountpoint.display()),
                error,
            ));
        }
        // With the ordinary bounding set: without it, set-uid fusermount3 is powerless.
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .args(["--clear-groups", "--inh-caps=-all"])
            .arg(server)
            .arg(&mountpoint)
            .stdout(Stdio::piped());
        if let Some(after) = flush_after {
            command.arg(after.as_millis().to_string());
        }
        let started = command.spawn();
        let mut stalling = match started {
            Ok(server) => Self {
                server,
                mountpoint,
                directory,
                _fuse: fuse,
            },
            Err(error) => {
                let _ = std::fs::remove_dir_all(&directory);
                return Err(LabError::system(
                    format!("start {}", server.display()),
                    error,
                ));
            }
        };
        let mut said = String::new();
        if let Some(stdout) = stalling.server.stdout.as_mut() {
            let _ = std::io::BufReader::new(stdout).read_line(&mut said);
        }
        if said.trim() != "serving" {
            return Err(LabError::system(
                format!("{} as user {uid}", server.display()),
                "it did not mount its file system",
            ));
        }
        Ok(stalling)
    }

    /// Where it is mounted.
    #[must_use]
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Its one file.
    #[must_use]
    pub fn file(&self) -> PathBuf {
        self.mountpoint.join("media.ts")
    }
}

impl Drop for StallingFs {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        // fusermount3 unmounts a dead server's mount in its own time, and a mount still there
        // keeps its directory; detached here, it goes at once. An error is a mount already
        // gone.
        let _ = nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}
