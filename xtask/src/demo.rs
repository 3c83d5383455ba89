//! `cargo xtask demo`: the main job. An emulated laptop hdd, a best-effort copy loop hammering
//! it, and a 1 MB/s player whose file abissd streams at real-time priority: live latency per
//! priority, the stream's state, the player's read latencies, and a teardown that leaves
//! nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abiss_lab::{FilesystemKind, Lab, LabOptions};
use anyhow::{bail, Context};
use std::os::unix::process::CommandExt;

use abiss_bench::daemon::{DaemonCommand, DaemonProcess};

use crate::shell;

/// Everything the demo made; dropping it removes all of it, also when the demo fails halfway.
struct DemoSetup {
    dir: PathBuf,
    lab_state: Option<PathBuf>,
    daemon: Option<DaemonProcess>,
    workload: Vec<Child>,
}

/// Kills a workload process and everything it forked, and waits for the group to go.
fn kill_group(child: &mut Child) {
    let Ok(group) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) on our own child's process group; no memory is passed.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
    // Orphaned members may linger as zombies until init reaps them; they hold no descriptors.
    let deadline = Instant::now() + Duration::from_secs(2);
    // SAFETY: signal 0 only checks whether any member of the group still exists.
    while unsafe { libc::kill(-group, 0) } == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl DemoSetup {
    fn stop_daemon(&mut self) {
        if let Some(mut daemon) = self.daemon.take() {
            daemon.stop();
        }
    }
}

impl Drop for DemoSetup {
    fn drop(&mut self) {
        for mut child in self.workload.drain(..) {
            kill_group(&mut child);
        }
        self.stop_daemon();
        if let Some(state) = self.lab_state.take() {
            if let Err(error) = Lab::down(&state) {
                eprintln!("xtask: bringing the lab down: {error}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn binary(root: &Path, name: &str) -> PathBuf {
    root.join("target").join("debug").join(name)
}

fn step(text: &str) {
    println!("\n==> {text}");
}

pub fn run(root: &Path, secs: u64) -> anyhow::Result<()> {
    let dir = root.join("target").join("demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).context("cannot create target/demo")?;
    let socket = dir.join("abiss.sock");
    let mut setup = DemoSetup {
        dir: dir.clone(),
        lab_state: None,
        daemon: None,
        workload: Vec::new(),
    };

    let lab = bring_up_lab(&dir, &mut setup)?;
    let device = lab.device().to_string_lossy().into_owned();
    let mount = lab
        .mount_dir()
        .context("the lab did not mount")?
        .to_path_buf();
    let movie = mount.join("movie.bin");
    let source = mount.join("big-copy-source.bin");

    step(&format!("starting abissd managing {device}"));
    start_daemon(root, &device, &mut setup)?;
    let ctl = |args: &[&str]| {
        let mut command = Command::new(binary(root, "abissctl"));
        command.arg("--socket").arg(&socket).args(args);
        command
    };
    shell::run(&mut ctl(&["status"]))?;
    step("capacity planning: how many 1 MB/s streams fit (abissctl admit; no model yet, so the conservative default)");
    shell::run(&mut ctl(&["admit", "--device", &device, "--rate", "1MB/s"]))?;

    step("best-effort load: a copy loop of the 175 MB file, in 128 KiB reads");
    start_copy_loop(&source, &mount.join("copy-target.bin"), &mut setup)?;
    std::thread::sleep(Duration::from_secs(2));

    step("attaching the movie at 1 MB/s with a 564 KiB playout buffer (abissctl attach)");
    let movie_arg = movie.to_string_lossy().into_owned();
    shell::run(&mut ctl(&[
        "attach", &movie_arg, "--rate", "1MB/s", "--buffer", "564KiB",
    ]))?;

    step(&format!(
        "a plain player reads the movie at 1 MB/s in 64 KiB reads for {secs} s (fio, unmodified)"
    ));
    let player_report = dir.join("player.json");
    setup
        .workload
        .push(start_player(&movie_arg, secs, &player_report)?);

    let reports = (secs / 3).max(1).to_string();
    shell::run(&mut ctl(&[
        "trace",
        "-T",
        "--device",
        &device,
        "--interval",
        "3",
        "--count",
        &reports,
    ]))?;
    step("the stream (abissctl list): window, locked pages, credit, misses, raises, readers");
    shell::run(&mut ctl(&["list"]))?;

    if let Some(mut player) = setup.workload.pop() {
        let _ = player.wait();
    }
    step("what the player saw (fio completion latency of its 64 KiB reads)");
    print_player(&player_report);

    step("what tracing cost (kernel BPF statistics over 1 s)");
    shell::run(&mut ctl(&["stats", "--interval", "1"]))?;

    drop(lab);
    tear_down(setup)
}

/// Starts abissd managing `device` (its socket and state in the demo directory), into
/// `setup`, and waits until it answers. Its log (`info`: what it attaches, raises and
/// refuses) is part of what the demo shows.
fn start_daemon(root: &Path, device: &str, setup: &mut DemoSetup) -> anyhow::Result<()> {
    let bin_dir = binary(root, "abissd")
        .parent()
        .context("the binaries' directory")?
        .to_path_buf();
    let daemon = DaemonCommand::new(&bin_dir, &setup.dir)
        .args(["--device", device, "--capacity", "30MB/s"])
        .log("info")
        .start()?;
    setup.daemon = Some(daemon);
    Ok(())
}

/// Starts the best-effort load, copying `source` to `target` over and over in 128 KiB
/// reads, into `setup`'s workload.
fn start_copy_loop(source: &Path, target: &Path, setup: &mut DemoSetup) -> anyhow::Result<()> {
    let copy = format!(
        "while :; do dd if={} of={} bs=128k iflag=nocache oflag=nocache conv=fdatasync status=none; done",
        source.display(),
        target.display()
    );
    setup.workload.push(
        Command::new("sh")
            .args(["-c", &copy])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("cannot start the copy loop")?,
    );
    Ok(())
}

/// Starts the player: fio reading `movie` at 1 MB/s in 64 KiB reads for `secs`, writing its
/// JSON report to `report`.
fn start_player(movie: &str, secs: u64, report: &Path) -> anyhow::Result<Child> {
    Command::new("fio")
        .args([
            "--name=player",
            "--rw=read",
            "--bs=64k",
            // fio reads `1m` as 1 MiB/s: the player asks for exactly the stream's 1 MB/s.
            "--rate=1000000",
            "--ioengine=psync",
        ])
        .args(["--time_based", "--output-format=json"])
        .arg(format!("--filename={movie}"))
        .arg(format!("--runtime={secs}"))
        .arg(format!("--output={}", report.display()))
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot start fio")
}

/// Stops everything and checks that nothing is left.
fn tear_down(mut setup: DemoSetup) -> anyhow::Result<()> {
    step("tearing down");
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
    let leftovers =
        shell::output(Command::new("losetup").args(["--list", "--noheadings", "-O", "BACK-FILE"]))?;
    if leftovers.contains("target/demo") {
        bail!("a loop device of the demo is still attached");
    }
    println!("    no abissd, eBPF program, loop device, mount, emulator or file left behind");
    Ok(())
}

/// The lab hdd with ext4, a movie and a copy source written on it, the page cache cold.
fn bring_up_lab(dir: &Path, setup: &mut DemoSetup) -> anyhow::Result<Lab> {
    step("bringing up an emulated 2.5\" 5400 rpm laptop disk (abiss-lab hdd model) with ext4");
    let options = LabOptions::hdd_in(dir, 2 << 30, Some(FilesystemKind::Ext4))
        .context("cannot find the abiss-lab binary (cargo xtask build builds it)")?;
    setup.lab_state = Some(options.state_dir.clone());
    let lab = Lab::up(&options).context("cannot bring the lab disk up")?;
    let mount = lab
        .mount_dir()
        .context("the lab did not mount")?
        .to_path_buf();
    println!(
        "    {} mounted on {}",
        lab.device().display(),
        mount.display()
    );

    step("writing a 40 MB movie and a 175 MB file for the copy loop (at the disk's own pace)");
    for (name, mib) in [("movie.bin", 40), ("big-copy-source.bin", 175)] {
        shell::run(
            Command::new("dd")
                .args(["if=/dev/urandom", "bs=1M", "status=none", "conv=fsync"])
                .arg(format!("of={}", mount.join(name).display()))
                .arg(format!("count={mib}")),
        )?;
    }
    shell::run(Command::new("sh").args(["-c", "echo 1 > /proc/sys/vm/drop_caches"]))?;
    Ok(lab)
}

/// Prints the player's read latencies from fio's JSON report.
fn print_player(report: &Path) {
    let Ok(text) = std::fs::read_to_string(report) else {
        println!("    (fio wrote no report)");
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        println!("    (fio's report is not JSON)");
        return;
    };
    let read = &json["jobs"][0]["read"];
    let ns = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / 1000.0;
    let clat = &read["clat_ns"];
    println!(
        "    {} reads, {:.1} MB/s; latency µs: p50 {:.0}, p99 {:.0}, p99.9 {:.0}, max {:.0}",
        read["total_ios"],
        read["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        ns(&clat["percentile"]["50.000000"]),
        ns(&clat["percentile"]["99.000000"]),
        ns(&clat["percentile"]["99.900000"]),
        ns(&clat["max"]),
    );
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
