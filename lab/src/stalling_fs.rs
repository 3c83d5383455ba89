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
/// gives it mode 0666; this lab's container has 0600) and `user_allow_other` in
/// `/etc/fuse.conf` (an administrator's choice, common where users share `sshfs` mounts). Both
/// are put back as they were when the last value alive drops, whatever order they drop in.
#[derive(Debug)]
pub struct UsersMayShareFuse(());

const FUSE_DEVICE: &str = "/dev/fuse";
const FUSE_CONFIG: &str = "/etc/fuse.conf";

/// How many [`UsersMayShareFuse`] are alive, and the device's mode and the configuration as
/// they were before the first.
#[derive(Debug)]
struct Sharing {
    alive: usize,
    device_mode: u32,
    config: Option<Vec<u8>>,
}

static SHARING: std::sync::Mutex<Option<Sharing>> = std::sync::Mutex::new(None);

impl UsersMayShareFuse {
    /// Allows it until the value drops.
    ///
    /// # Errors
    /// `/dev/fuse` missing, or either setting cannot be written.
    pub fn allow() -> Result<Self, LabError> {
        let mut sharing = SHARING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sharing) = sharing.as_mut() {
            sharing.alive += 1;
            return Ok(Self(()));
        }
        let device_mode = std::fs::metadata(FUSE_DEVICE)
            .map_err(|e| LabError::system("/dev/fuse (install fuse3: cargo xtask setup)", e))?
            .permissions()
            .mode();
        // Missing is a state to put back (by removing it); unreadable is not.
        let config = match std::fs::read(FUSE_CONFIG) {
            Ok(config) => Some(config),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(LabError::system("read /etc/fuse.conf", error)),
        };
        let mut allowed = config.clone().unwrap_or_default();
        allowed.extend_from_slice(b"\nuser_allow_other\n");
        *sharing = Some(Sharing {
            alive: 1,
            device_mode,
            config,
        });
        drop(sharing);
        // From here a failure drops the value, which puts back what was changed.
        let shared = Self(());
        std::fs::set_permissions(FUSE_DEVICE, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| LabError::system("chmod /dev/fuse", e))?;
        std::fs::write(FUSE_CONFIG, allowed)
            .map_err(|e| LabError::system("write /etc/fuse.conf", e))?;
        Ok(shared)
    }
}

impl Drop for UsersMayShareFuse {
    fn drop(&mut self) {
        let mut sharing = SHARING
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(shared) = sharing.as_mut() else {
            return;
        };
        shared.alive -= 1;
        if shared.alive > 0 {
            return;
        }
        let mode = std::fs::Permissions::from_mode(shared.device_mode & 0o7777);
        if let Err(error) = std::fs::set_permissions(FUSE_DEVICE, mode) {
            eprintln!("cannot put back the mode of /dev/fuse: {error}");
        }
        let restored = match shared.config.take() {
            Some(config) => std::fs::write(FUSE_CONFIG, config),
            None => std::fs::remove_file(FUSE_CONFIG),
        };
        if let Err(error) = restored {
            eprintln!("cannot put back /etc/fuse.conf: {error}");
        }
        *sharing = None;
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
