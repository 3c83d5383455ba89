//! The soak: many attach/detach cycles by four users at once (root and three unprivileged
//! users), with abissd killed (`kill -9`) and restarted every so many cycles; then what is
//! left is counted: the daemon's descriptors and threads, entries of its eBPF hash maps,
//! locked memory, raised threads, loop devices and mounts; and after each kill, whether the
//! disk's elevator and driver depth were put back.
//!
//! Each user runs one worker process (`abiss-bench soak-worker`, started through `setpriv` for
//! the unprivileged users) that loops: connect, attach its own file (non-persistent, level 0),
//! drop 64 KiB of the file from the page cache and read it (a miss: abissd raises the reader),
//! then end the stream, by `detach` on even cycles and by hanging up on odd ones. While abissd
//! is down a cycle fails and is tried again. The disk is a loop device over /dev/shm with ext4,
//! which makes cycles fast; the lab hdd would only slow them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use abiss_proto::{AttachRequest, ByteRate, ByteSize};
use anyhow::{bail, Context as _};
use serde_json::json;

use crate::report::{Results, Row};
use crate::row::{self, RowsArg};
use daemon::Soak;
use system::System;

mod daemon;
mod hostile;
mod system;
mod table;
mod worker;

pub use worker::worker;

/// `abiss-bench soak`.
#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Attach/detach cycles in all, shared by the four users.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(4..=1_000_000))]
    pub cycles: u64,
    /// abissd is killed with SIGKILL and restarted after every this many cycles.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub kill_every: u64,
    /// Its one row, `four-users`: root and three unprivileged users at once, one more user
    /// harassing abissd.
    #[command(flatten)]
    pub rows: RowsArg,
    /// Where the results go.
    #[arg(long, default_value = "bench/results")]
    pub results_dir: PathBuf,
}

/// `abiss-bench soak-worker` (started by `soak`, one per user).
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// abissd's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The user's file on the managed disk.
    #[arg(long)]
    pub file: PathBuf,
    /// Cycles to make.
    #[arg(long)]
    pub cycles: u64,
}

/// The unprivileged users the soak runs as (made with `useradd` if missing).
const USERS: [&str; 3] = ["abiss-soak1", "abiss-soak2", "abiss-soak3"];
const FILE_BYTES: u64 = 16 << 20;
const MISS_BYTES: u64 = 64 << 10;
/// What a cycle's stream asks: small, so that four users' streams always fit.
const STREAM: AttachRequest = AttachRequest::read(ByteRate(500_000), ByteSize(256 << 10), 8, 0);

/// The soak's one row.
const ROW: &str = "four-users";

/// Runs the soak and writes soak.{json,md,svg}.
pub fn run(args: &SoakArgs) -> anyhow::Result<()> {
    let begun = Instant::now();
    args.rows.select(vec![ROW], |row| row, row::always)?;
    let bin_dir = std::env::var_os("ABISS_BIN_DIR")
        .map(PathBuf::from)
        .context("needs ABISS_BIN_DIR (where abissd is); run it through `cargo xtask bench`")?;
    let users = ensure_users()?;
    let disk = ShmDisk::up()?;
    let files = disk.user_files(&users)?;
    let baseline_file = disk.mount.join("baseline.data");
    write_file(&baseline_file, 0, 0)?;
    let hostile_file = disk.mount.join("nobody.data");
    write_file(&hostile_file, hostile::NOBODY, hostile::NOBODY)?;
    // The recording it moves ahead (`abiss_tests::harass`), written only by it.
    let recording = hostile_file.with_extension("rec");
    std::fs::File::create(&recording)?;
    std::os::unix::fs::chown(&recording, Some(hostile::NOBODY), Some(hostile::NOBODY))?;
    let before = System::now(&disk.name);
    let mut soak = Soak::new(&bin_dir, &disk)?;
    let figures = soak.cycle(args, &users, &files, &hostile_file, &baseline_file)?;
    let end = soak.finish()?;
    let after = System::now(&disk.name);
    drop(disk);
    let after_teardown = System::now("");

    let all_users: Vec<&str> = std::iter::once("root").chain(USERS).collect();
    let row = Row::new(
        ROW,
        json!({
            "users": all_users,
            "hostile_user": "nobody, making the security tests' attacks that load abissd at once",
        }),
        json!({
            "cycles": figures.to_json(),
            "kills": soak.kills,
            "end": end,
            "system_before": before.to_json(),
            "system_after": after.to_json(),
            "system_after_teardown": after_teardown.to_json(),
        }),
    );
    let results = Results::new(
        "soak",
        begun,
        json!({
            "cycles": args.cycles,
            "kill_every": args.kill_every,
            "users": all_users,
            "users_created": users.created,
            "stream": {"rate_bps": STREAM.rate.0, "buffer_bytes": STREAM.buffer.0, "level": 0},
            "miss_read_bytes": MISS_BYTES,
            "disk": "loop device over /dev/shm, ext4, 256 MiB",
            "abissd": format!("{}, default options", bin_dir.display()),
        }),
        vec![row],
    );
    let markdown = table::markdown(&results);
    results.write(&args.results_dir, "soak", &markdown, |svg| {
        table::chart_samples(svg, &figures.samples, &soak.kills)
    })
}

/// The users of the soak; `created` names those made for it.
struct Users {
    created: Vec<String>,
    ids: Vec<(String, u32, u32)>,
}

/// Makes the soak's users if they are missing (system users, no home, no shell).
fn ensure_users() -> anyhow::Result<Users> {
    let mut created = Vec::new();
    let mut ids = Vec::new();
    for user in USERS {
        if nix::unistd::User::from_name(user)?.is_none() {
            let status = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    user,
                ])
                .status()
                .context("cannot run useradd")?;
            if !status.success() {
                bail!("useradd {user} failed");
            }
            created.push(user.to_owned());
        }
        let entry = nix::unistd::User::from_name(user)?.context("the user just made")?;
        ids.push((user.to_owned(), entry.uid.as_raw(), entry.gid.as_raw()));
    }
    if created.is_empty() {
        println!("soak: users {} exist", USERS.join(", "));
    } else {
        println!(
            "soak: made the users {} (useradd --system)",
            created.join(", ")
        );
    }
    Ok(Users { created, ids })
}

/// A loop device over an image in /dev/shm with ext4 mounted; taken down on drop.
struct ShmDisk {
    dir: PathBuf,
    device: PathBuf,
    name: String,
    mount: PathBuf,
}

impl ShmDisk {
    fn up() -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("/dev/shm/abiss-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let image = dir.join("disk.img");
        std::fs::File::create(&image)?.set_len(256 << 20)?;
        let output = Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&image)
            .output()
            .context("cannot run losetup")?;
        if !output.status.success() {
            bail!(
                "losetup: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let device = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        let name = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mount = dir.join("mnt");
        let disk = Self {
            dir,
            device,
            name,
            mount,
        };
        run_quiet(
            Command::new("mkfs.ext4")
                .args(["-q", "-F"])
                .arg(&disk.device),
        )?;
        std::fs::create_dir_all(&disk.mount)?;
        run_quiet(Command::new("mount").arg(&disk.device).arg(&disk.mount))?;
        for path in [&disk.dir, &disk.mount] {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        }
        let _ = Command::new("udevadm").arg("settle").status();
        Ok(disk)
    }

    /// One file per user (root's first), owned by and readable only by that user.
    fn user_files(&self, users: &Users) -> anyhow::Result<Vec<PathBuf>> {
        let mut files = Vec::new();
        let owners = std::iter::once(("root".to_owned(), 0, 0)).chain(users.ids.iter().cloned());
        for (user, uid, gid) in owners {
            let path = self.mount.join(format!("{user}.data"));
            write_file(&path, uid, gid)?;
            files.push(path);
        }
        Ok(files)
    }
}

impl Drop for ShmDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A [`FILE_BYTES`] file at `path`, owned by and readable only by `uid`.
fn write_file(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    let block: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut file = std::fs::File::create(path)?;
    for _ in 0..FILE_BYTES >> 20 {
        std::io::Write::write_all(&mut file, &block)?;
    }
    file.sync_all()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(())
}

fn run_quiet(command: &mut Command) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
