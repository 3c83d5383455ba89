//! `cargo xtask demo`: abissd on a scratch disk, two readers at different I/O priorities, live
//! latency per priority, and a teardown that leaves nothing behind.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::shell;

/// Everything the demo made; dropping it removes all of it, also when the demo fails halfway.
struct DemoSetup {
    dir: PathBuf,
    image: PathBuf,
    device: Option<String>,
    daemon: Option<Child>,
    workload: Vec<Child>,
}

impl DemoSetup {
    fn stop_daemon(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            if let Ok(pid) = i32::try_from(daemon.id()) {
                // SIGTERM is abissd's clean shutdown: it detaches its programs.
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let _ = daemon.wait();
        }
    }
}

/// Kills a workload process and everything it forked (fio runs its jobs in child processes),
/// and waits until the whole group is gone, so that nothing holds the device open.
fn kill_group(child: &mut Child) {
    let Ok(group) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) on our own child's process group; no memory is passed.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
    // Orphaned members may linger as zombies until init reaps them; they hold no descriptors.
    let deadline = Instant::now() + Duration::from_secs(1);
    // SAFETY: signal 0 only checks whether any member of the group still exists.
    while unsafe { libc::kill(-group, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for DemoSetup {
    fn drop(&mut self) {
        for mut child in self.workload.drain(..) {
            kill_group(&mut child);
        }
        self.stop_daemon();
        if let Some(device) = self.device.take() {
            let _ = Command::new("losetup").args(["-d", &device]).status();
        }
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary(root: &Path, name: &str) -> PathBuf {
    root.join("target").join("debug").join(name)
}

pub fn run(root: &Path, secs: u64) -> anyhow::Result<()> {
    let dir = root.join("target").join("demo");
    std::fs::create_dir_all(&dir).context("cannot create target/demo")?;
    let socket = dir.join("abiss.sock");
    let mut setup = DemoSetup {
        image: dir.join("disk.img"),
        dir,
        device: None,
        daemon: None,
        workload: Vec::new(),
    };

    println!("==> creating a 512 MiB scratch disk as a loop device");
    let image = std::fs::File::create(&setup.image).context("cannot create the disk image")?;
    image
        .set_len(512 << 20)
        .context("cannot size the disk image")?;
    drop(image);
    let device = shell::output(
        Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&setup.image),
    )?
    .trim()
    .to_owned();
    setup.device = Some(device.clone());
    println!("    {device}");

    println!("==> starting abissd on {}", socket.display());
    let daemon = Command::new(binary(root, "abissd"))
        .arg("--socket")
        .arg(&socket)
        .spawn()
        .context("cannot start abissd")?;
    setup.daemon = Some(daemon);
    wait_for_socket(&socket, setup.daemon.as_mut())?;

    println!("==> workload for {secs} s: an `ionice -c1` (real-time) reader and an `ionice -c2 -n7` (best-effort) reader on {device}");
    setup.workload.push(
        fio_reader(&device, "rt-reader", "1", "0", "64k", secs + 2)
            .context("cannot start the RT reader (fio)")?,
    );
    setup.workload.push(
        fio_reader(&device, "be-reader", "2", "7", "128k", secs + 2)
            .context("cannot start the BE reader (fio)")?,
    );

    let ctl = |args: &[&str]| {
        let mut command = Command::new(binary(root, "abissctl"));
        command.arg("--socket").arg(&socket).args(args);
        command
    };
    let reports = (secs / 2).max(1).to_string();
    shell::run(&mut ctl(&[
        "trace",
        "--device",
        &device,
        "--queued",
        "--interval",
        "2",
        "--count",
        &reports,
    ]))?;
    println!("\n==> what tracing cost (kernel BPF statistics over 1 s)");
    shell::run(&mut ctl(&["stats", "--interval", "1"]))?;

    println!("\n==> tearing down");
    for mut child in setup.workload.drain(..) {
        kill_group(&mut child);
    }
    setup.stop_daemon();
    let deadline = Instant::now() + Duration::from_secs(5);
    // Programs are freed by the kernel shortly after their last reference goes.
    while loaded_abiss_programs() > 0 {
        if Instant::now() > deadline {
            bail!("abissd's eBPF programs are still loaded after it stopped");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(setup);
    let attached = || {
        shell::output(Command::new("losetup").args(["--list", "--noheadings", "-O", "BACK-FILE"]))
            .is_ok_and(|list| list.contains("target/demo/disk.img"))
    };
    // A killed reader finishes its in-flight I/O before it closes the device, and the kernel
    // detaches a device that is still open once it is closed.
    let deadline = Instant::now() + Duration::from_secs(15);
    while attached() {
        if Instant::now() > deadline {
            bail!("the demo's loop device is still attached");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("    no abissd process, eBPF program, loop device or file left behind");
    Ok(())
}

/// A random reader of `device` at I/O priority class/level, in its own process group.
fn fio_reader(
    device: &str,
    name: &str,
    class: &str,
    level: &str,
    block: &str,
    secs: u64,
) -> std::io::Result<Child> {
    Command::new("ionice")
        .args(["-c", class, "-n", level, "fio", "--name", name])
        .arg(format!("--filename={device}"))
        .args([
            "--rw=randread",
            "--direct=1",
            "--ioengine=psync",
            "--time_based",
        ])
        .arg(format!("--bs={block}"))
        .arg(format!("--runtime={secs}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

fn loaded_abiss_programs() -> usize {
    Command::new("bpftool")
        .args(["prog", "show"])
        .output()
        .map_or(0, |o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains("name abiss_"))
                .count()
        })
}

fn wait_for_socket(socket: &Path, daemon: Option<&mut Child>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let Some(daemon) = daemon else {
        bail!("abissd was not started");
    };
    loop {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Ok(());
        }
        if let Some(status) = daemon.try_wait()? {
            bail!("abissd exited with {status} before serving its socket");
        }
        if Instant::now() > deadline {
            bail!("abissd did not open {} within 20 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
