//! The players: real programs, unmodified, started plainly, under `ionice -c1`, or under
//! `abissctl run`, each in a process group of its own. What each says about its media time
//! is collected as [`Event`]s while it plays:
//!
//! | player | command | media time from |
//! | --- | --- | --- |
//! | `GStreamer` | `playbin` with `fakesink sync=true` sinks, from `bench/players/gst_player.py` | the video sink's `handoff` per rendered frame: its PTS, stamped by the helper with `CLOCK_MONOTONIC` |
//! | ffmpeg | `ffmpeg -re -i FILE -progress pipe:1 -stats_period 0.02 -f null -` | `out_time_us` of each progress report, stamped on arrival |
//! | mpv | `mpv --vo=null --ao=null --cache=no --input-ipc-server=SOCK FILE` | `time-pos` change events (one per displayed frame) over its JSON IPC, stamped on arrival |

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use abiss_os::clock::monotonic_ns;
use anyhow::Context as _;
use serde::Serialize;

use super::stall::Event;
use crate::interrupt;
use crate::process::{self, is_zombie};

/// The `GStreamer` helper (playbin from Python: gst-launch cannot report positions).
const GST_PLAYER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/players/gst_player.py");
/// Debian's Python, which has the `GStreamer` bindings (`python3-gst-1.0`).
const PYTHON: &str = "/usr/bin/python3";

/// Which program plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PlayerKind {
    /// `GStreamer`'s `playbin`.
    Gstreamer,
    /// `ffmpeg -re` into the null muxer.
    Ffmpeg,
    /// mpv without output devices or cache.
    Mpv,
}

impl PlayerKind {
    /// Short name for the reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Gstreamer => "gst",
            Self::Ffmpeg => "ffmpeg",
            Self::Mpv => "mpv",
        }
    }
}

/// One player of a run.
#[derive(Clone, Debug, Serialize)]
pub struct PlayerSpec {
    /// The program.
    pub kind: PlayerKind,
    /// The media file.
    pub file: PathBuf,
    /// Where playback starts in the media, s.
    pub start_s: u32,
    /// Seek to a random position this often, s (`GStreamer` only: ffmpeg cannot seek mid-run).
    pub seek_every_s: Option<u32>,
}

/// How a player (or, in the recording benchmark, a recorder) is started.
#[derive(Clone, Debug)]
pub enum Wrapper {
    /// As it is.
    Plain,
    /// `ionice -c1 -n4`: the real-time I/O class at its default level.
    RealTime,
    /// `abissctl run ARGS… FILE -- …` against the abissd at `socket`.
    Abiss {
        /// The abissctl executable.
        abissctl: PathBuf,
        /// abissd's socket.
        socket: PathBuf,
        /// What follows `run`: `--rate 1.1MB/s`, then options such as `--buffer 6MiB` (a
        /// recorder's start with `--write`).
        args: Vec<String>,
    },
}

impl Wrapper {
    /// The wrapper's part of the command line that runs a program on `file`, up to where the
    /// program follows: `ionice -c1 -n4 --`, `abissctl run ARGS… FILE --`; `None` when plain.
    pub(crate) fn command(&self, file: &Path) -> Option<Command> {
        match self {
            Self::Plain => None,
            Self::RealTime => {
                let mut command = Command::new("ionice");
                command.args(["-c1", "-n4", "--"]);
                Some(command)
            }
            Self::Abiss {
                abissctl,
                socket,
                args,
            } => {
                let mut command = Command::new(abissctl);
                command
                    .env("ABISS_SOCKET", socket)
                    .arg("run")
                    .args(args)
                    .arg(file)
                    .arg("--");
                Some(command)
            }
        }
    }
}

impl PlayerSpec {
    /// The player's command line.
    fn command_line(&self, ipc_socket: &Path) -> Vec<String> {
        let file = self.file.display().to_string();
        let start = self.start_s.to_string();
        let mut line: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| line.extend(items.iter().map(|s| (*s).to_owned()));
        match self.kind {
            PlayerKind::Gstreamer => {
                push(&[PYTHON, GST_PLAYER, "--start", &start]);
                if let Some(every) = self.seek_every_s {
                    push(&["--seek-every", &every.to_string()]);
                }
                push(&[&file]);
            }
            PlayerKind::Ffmpeg => {
                push(&["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error"]);
                if self.start_s > 0 {
                    push(&["-ss", &start]);
                }
                push(&["-re", "-i", &file, "-progress", "pipe:1", "-stats_period"]);
                push(&["0.02", "-f", "null", "-"]);
            }
            PlayerKind::Mpv => {
                push(&[
                    "mpv",
                    "--no-config",
                    "--no-terminal",
                    "--vo=null",
                    "--ao=null",
                ]);
                push(&["--cache=no", &format!("--start={start}")]);
                push(&[
                    &format!("--input-ipc-server={}", ipc_socket.display()),
                    &file,
                ]);
            }
        }
        line
    }
}

/// A player that is playing.
#[derive(Debug)]
pub struct RunningPlayer {
    spec: PlayerSpec,
    child: Option<Child>,
    launched_ns: u64,
    events: Arc<Mutex<Vec<Event>>>,
    stopping: Arc<AtomicBool>,
    collector: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<String>>,
    exec: Option<JoinHandle<Option<u64>>>,
}

/// What a player did, once stopped.
#[derive(Debug)]
pub struct PlayerRun {
    /// The player.
    pub spec: PlayerSpec,
    /// When it was launched (`CLOCK_MONOTONIC`, ns).
    pub launched_ns: u64,
    /// When the wrapper (`abissctl run`) started the player, if there is a wrapper.
    pub exec_ns: Option<u64>,
    /// When it was told to stop.
    pub stopped_ns: u64,
    /// Its reports.
    pub events: Vec<Event>,
    /// CPU time of the player (and its wrapper), user + system, s.
    pub cpu_s: f64,
    /// How it ended (`exit 0`, `signal 15`, …).
    pub ended: String,
    /// Whether it ended by itself before it was told to stop.
    pub ended_early: bool,
    /// The end of what it wrote on stderr (abissctl's refusals come here).
    pub stderr: String,
}

impl RunningPlayer {
    /// Launches `spec` through `wrapper`; `scratch` holds its IPC socket (mpv).
    pub fn launch(spec: &PlayerSpec, wrapper: &Wrapper, scratch: &Path) -> anyhow::Result<Self> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // Its program from memory, as in every launch ([`super::program`]).
        super::program::warm(spec.kind.name());
        if let Wrapper::Abiss { abissctl, .. } = wrapper {
            let _ = super::program::warm_file(abissctl);
        }
        let ipc = scratch.join(format!("mpv-{}.sock", NEXT.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_file(&ipc);
        let line = spec.command_line(&ipc);
        let mut command = match wrapper.command(&spec.file) {
            Some(mut command) => {
                command.arg(&line[0]);
                command
            }
            None => Command::new(&line[0]),
        };
        command
            .args(&line[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let launched_ns = monotonic_ns();
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", line[0]))?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stopping = Arc::new(AtomicBool::new(false));
        let stdout = child.stdout.take().context("no stdout")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let collector = {
            let (events, stopping, kind) = (events.clone(), stopping.clone(), spec.kind);
            std::thread::spawn(move || match kind {
                PlayerKind::Gstreamer => collect_gstreamer(stdout, &events),
                PlayerKind::Ffmpeg => collect_ffmpeg(stdout, &events),
                PlayerKind::Mpv => {
                    let drain = std::thread::spawn(move || drain(stdout));
                    collect_mpv(&ipc, &events, &stopping);
                    let _ = drain.join();
                    let _ = std::fs::remove_file(&ipc);
                }
            })
        };
        let stderr = process::stderr_tail(stderr);
        let exec = matches!(wrapper, Wrapper::Abiss { .. }).then(|| {
            let (pid, stopping) = (child.id(), stopping.clone());
            std::thread::spawn(move || watch_exec(pid, &stopping))
        });
        Ok(Self {
            spec: spec.clone(),
            child: Some(child),
            launched_ns,
            events,
            stopping,
            collector: Some(collector),
            stderr: Some(stderr),
            exec,
        })
    }

    /// The process id of what was launched (the player, or its wrapper), while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the player (or its wrapper) has ended by itself (it is not reaped here).
    pub fn has_ended(&mut self) -> bool {
        self.child
            .as_ref()
            .is_none_or(|c| i32::try_from(c.id()).is_ok_and(is_zombie))
    }

    /// Tells the player to stop (SIGTERM to its process group) at `stopped_ns`; then
    /// [`StoppingPlayer::collect`] what it did up to that moment.
    pub fn signal_stop(mut self, stopped_ns: u64) -> anyhow::Result<StoppingPlayer> {
        let child = self
            .child
            .take()
            .context("the player was stopped already")?;
        let pid = i32::try_from(child.id())?;
        let ended_early = is_zombie(pid);
        // SAFETY: killpg(2) of the group this player leads.
        unsafe { libc::killpg(pid, libc::SIGTERM) };
        Ok(StoppingPlayer {
            player: self,
            pid,
            ended_early,
            stopped_ns,
        })
    }
}

/// A player told to stop.
#[derive(Debug)]
pub struct StoppingPlayer {
    player: RunningPlayer,
    pid: i32,
    ended_early: bool,
    stopped_ns: u64,
}

impl StoppingPlayer {
    /// Waits for the player to end and collects what it did before it was told to stop.
    /// `abissctl run` starts its command with SIGTERM blocked, so a player under it does not
    /// end by itself: 1 s after `signalled` the started process's children get SIGKILL, after
    /// 5 s its whole group.
    pub fn collect(mut self, signalled: Instant) -> anyhow::Result<PlayerRun> {
        let (ended, cpu_s) = wait_with_usage(self.pid, signalled)?;
        let player = &mut self.player;
        player.stopping.store(true, Ordering::Relaxed);
        if let Some(collector) = player.collector.take() {
            let _ = collector.join();
        }
        let stderr = player
            .stderr
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let exec_ns = player.exec.take().and_then(|t| t.join().ok()).flatten();
        let stopped_ns = self.stopped_ns;
        let mut events = std::mem::take(&mut *player.events.lock().expect("events"));
        events.retain(|e| match *e {
            Event::Frame { at_ns, .. } | Event::Seek { at_ns } => at_ns <= stopped_ns,
        });
        Ok(PlayerRun {
            spec: player.spec.clone(),
            launched_ns: player.launched_ns,
            exec_ns,
            stopped_ns,
            events,
            cpu_s,
            ended,
            ended_early: self.ended_early,
            stderr,
        })
    }
}

impl Drop for RunningPlayer {
    fn drop(&mut self) {
        // Only on an error or an interrupt: the whole group goes, and is reaped.
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: killpg(2) of the group this player leads.
                unsafe { libc::killpg(pid, libc::SIGKILL) };
            }
            let _ = child.wait();
        }
        self.stopping.store(true, Ordering::Relaxed);
    }
}

/// Waits for `pid`, which was sent SIGTERM at `started`: a second after that its children are
/// killed, after 5 s its group. How it ended, and the CPU time it and its waited-for
/// descendants used.
fn wait_with_usage(pid: i32, started: Instant) -> anyhow::Result<(String, f64)> {
    let (mut children_killed, mut group_killed) = (false, false);
    process::reap(pid, || {
        if !children_killed && started.elapsed() > Duration::from_secs(1) {
            children_killed = true;
            for child in children(pid) {
                // SAFETY: kill(2) of a child of our child, in the group we started.
                unsafe { libc::kill(child, libc::SIGKILL) };
            }
        }
        if !group_killed && started.elapsed() > Duration::from_secs(5) {
            group_killed = true;
            // SAFETY: killpg(2) of the group this player leads.
            unsafe { libc::killpg(pid, libc::SIGKILL) };
        }
    })
}

/// When `pid` (`abissctl run`) started its command: its first child, looked for every 2 ms.
fn watch_exec(pid: u32, stopping: &AtomicBool) -> Option<u64> {
    let pid = i32::try_from(pid).ok()?;
    while !stopping.load(Ordering::Relaxed) && !is_zombie(pid) {
        if !children(pid).is_empty() {
            return Some(monotonic_ns());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// The children of `pid` (of its main thread, which starts them in the wrappers).
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|list| {
            list.split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn push(events: &Mutex<Vec<Event>>, event: Event) {
    events.lock().expect("events").push(event);
}

/// `frame MONOTONIC_NS PTS_NS` and `seek MONOTONIC_NS` lines of the `GStreamer` helper.
fn collect_gstreamer(stdout: impl std::io::Read, events: &Mutex<Vec<Event>>) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let mut words = line.split_whitespace();
        let (kind, at, pts) = (words.next(), words.next(), words.next());
        let Some(at_ns) = at.and_then(|a| a.parse::<u64>().ok()) else {
            continue;
        };
        match (kind, pts.and_then(|p| p.parse::<i64>().ok())) {
            (Some("frame"), Some(media_ns)) => push(events, Event::Frame { at_ns, media_ns }),
            (Some("seek"), _) => push(events, Event::Seek { at_ns }),
            _ => {}
        }
    }
}

/// ffmpeg's `-progress` blocks (`key=value` lines ending with `progress=…`): one event per
/// block once a frame has been output.
fn collect_ffmpeg(stdout: impl std::io::Read, events: &Mutex<Vec<Event>>) {
    let (mut frame, mut out_time_us) = (0u64, None::<i64>);
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        let at_ns = monotonic_ns();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "frame" => frame = value.trim().parse().unwrap_or(0),
            "out_time_us" => out_time_us = value.trim().parse().ok(),
            "progress" => {
                if let (true, Some(us)) = (frame >= 1, out_time_us) {
                    if us >= 0 {
                        push(
                            events,
                            Event::Frame {
                                at_ns,
                                media_ns: us * 1000,
                            },
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

fn drain(mut stdout: impl std::io::Read) {
    let _ = std::io::copy(&mut stdout, &mut std::io::sink());
}

/// Connects to mpv's IPC socket as soon as it exists, observes `time-pos`, and records each
/// change until mpv closes the connection.
fn collect_mpv(socket: &Path, events: &Mutex<Vec<Event>>, stopping: &AtomicBool) {
    let stream = loop {
        if stopping.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(stream) = UnixStream::connect(socket) {
            break stream;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    if writer
        .write_all(b"{\"command\":[\"observe_property\",1,\"time-pos\"]}\n")
        .is_err()
    {
        return;
    }
    for line in BufReader::new(stream).lines().map_while(Result::ok) {
        let at_ns = monotonic_ns();
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["event"] == "property-change" && message["name"] == "time-pos" {
            if let Some(seconds) = message["data"].as_f64() {
                #[expect(clippy::cast_possible_truncation, reason = "ns of a media time")]
                let media_ns = (seconds * 1e9).round() as i64;
                push(events, Event::Frame { at_ns, media_ns });
            }
        }
    }
}

/// Lets `players` play until `secs` after their launch (or the first ends early), runs
/// `before_stop`, then stops them all.
pub(crate) fn play_for(
    mut players: Vec<RunningPlayer>,
    secs: Duration,
    before_stop: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<PlayerRun>> {
    let until = Instant::now() + secs;
    while Instant::now() < until {
        interrupt::check()?;
        if players.iter_mut().all(RunningPlayer::has_ended) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }
    before_stop()?;
    let (stopped_ns, signalled) = (monotonic_ns(), Instant::now());
    let stopping = players
        .into_iter()
        .map(|p| p.signal_stop(stopped_ns))
        .collect::<anyhow::Result<Vec<_>>>()?;
    stopping.into_iter().map(|p| p.collect(signalled)).collect()
}
