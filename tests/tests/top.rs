//! `abissctl top` in a real terminal: tmux runs it in a detached 160×40 pane next to a real
//! abissd managing the lab hdd, with a stream attached and read. The pane must show the stream
//! (id and file) and the disk with its real-time latency, refresh, end on `q` with the shell
//! back, and carry colour only when colour is allowed (neither `NO_COLOR` nor `--no-color`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use abiss_proto::StreamId;
use abiss_tests::{binary, require_root, wait_until, write_cold_file, Daemon, HddLab, Scratch};

/// The shell prompt in the pane (as `capture-pane` shows it, without its trailing space): its
/// return means abissctl has ended.
const PROMPT: &str = "top-test-ready>";

/// A tmux server of its own, on a socket in a scratch directory (`tmux -S`, so that nothing is
/// left in /tmp/tmux-UID), with one detached 160×40 session running a plain bash; the server,
/// and whatever runs in it, is killed on drop, also when a test fails.
struct Tmux {
    socket: PathBuf,
    _dir: Scratch,
}

impl Tmux {
    fn start(tag: &str) -> Self {
        let dir = Scratch::new_in("/tmp", &format!("tmux-{tag}"));
        let tmux = Self {
            socket: dir.path().join("tmux.sock"),
            _dir: dir,
        };
        let shell = format!("env PS1='{PROMPT} ' bash --norc --noprofile");
        let output = tmux.run(&[
            "new-session",
            "-d",
            "-x",
            "160",
            "-y",
            "40",
            "-s",
            "top",
            &shell,
        ]);
        assert!(output.status.success(), "tmux new-session: {output:?}");
        assert!(
            wait_until(Duration::from_secs(5), || tmux.screen().contains(PROMPT)),
            "the shell in tmux did not start:\n{}",
            tmux.screen()
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run tmux")
    }

    /// Types `text` and presses Enter.
    fn type_line(&self, text: &str) {
        let output = self.run(&["send-keys", "-t", "top", "-l", text]);
        assert!(output.status.success(), "tmux send-keys: {output:?}");
        self.key("Enter");
    }

    /// Sends one key (`q`, `Enter`, `C-c`).
    fn key(&self, key: &str) {
        let output = self.run(&["send-keys", "-t", "top", key]);
        assert!(output.status.success(), "tmux send-keys {key}: {output:?}");
    }

    /// The pane's text.
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    /// The pane's text with its escape sequences (colours, bold).
    fn screen_with_escapes(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-e", "-t", "top"]).stdout)
            .into_owned()
    }

    /// The command running in the pane now (`bash` once abissctl has ended).
    fn pane_command(&self) -> String {
        let output = self.run(&[
            "display-message",
            "-p",
            "-t",
            "top",
            "#{pane_current_command}",
        ]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Waits until the pane's text satisfies `check`; fails with the screen otherwise.
    fn wait_for(&self, what: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
        let mut screen = String::new();
        let found = wait_until(timeout, || {
            screen = self.screen();
            check(&screen)
        });
        assert!(found, "{what} did not appear within {timeout:?}:\n{screen}");
        screen
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// A thread reading `path` at about 800 KB/s, below the stream's 1 MB/s, as a player that
/// knows nothing of abiss: its reads move the stream's window, so the stream loads at its
/// real-time priority while `top` watches. Stopped on drop.
struct Player {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Player {
    fn start(path: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut file = std::fs::File::open(&path).expect("open the stream's file");
            let mut chunk = vec![0u8; 64 << 10];
            while !stopped.load(Ordering::Relaxed) {
                if file.read(&mut chunk).expect("read") == 0 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(80));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Player {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The refresh count in the header (`refresh 7 every 1.0 s`).
fn refresh_count(screen: &str) -> Option<u64> {
    let rest = screen.split("refresh ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

/// The words of the table row that starts with `first` (borders dropped).
fn row<'a>(screen: &'a str, first: &str) -> Option<Vec<&'a str>> {
    screen.lines().find_map(|line| {
        let words: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == '│')
            .filter(|w| !w.is_empty())
            .collect();
        (words.first() == Some(&first)).then_some(words)
    })
}

/// Whether an SGR escape in `screen` sets a colour (30–38, 40–48, 90–97, 100–107); 39 and 49
/// only put the default colours back.
fn has_colour(screen: &str) -> bool {
    screen.split("\x1b[").skip(1).any(|sequence| {
        let Some(end) = sequence.find('m') else {
            return false;
        };
        let params = &sequence[..end];
        if params.contains(|c: char| !(c.is_ascii_digit() || c == ';')) {
            return false;
        }
        params.split(';').any(|p| {
            matches!(
                p.parse::<u32>(),
                Ok(30..=38 | 40..=48 | 90..=97 | 100..=107)
            )
        })
    })
}

/// How `top` is asked for colour, or not.
#[derive(Clone, Copy, Debug)]
enum Colour {
    Allowed,
    NoColorVariable,
    NoColorOption,
}

/// Runs `top` in a fresh tmux pane and checks the view, its refresh and its end on `q`.
fn watch(daemon: &Daemon, stream: StreamId, file: &Path, disk: &str, colour: Colour) {
    let tmux = Tmux::start(&format!("{colour:?}"));
    let (env, option) = match colour {
        Colour::Allowed => ("", ""),
        Colour::NoColorVariable => ("NO_COLOR=1 ", ""),
        Colour::NoColorOption => ("", " --no-color"),
    };
    let no_color = !matches!(colour, Colour::Allowed);
    tmux.type_line(&format!(
        "{env}{} --socket {} top{option}",
        binary("abissctl").display(),
        daemon.socket().display()
    ));
    let file_name = file.file_name().expect("a file name").to_string_lossy();
    let id = stream.to_string();
    let screen = tmux.wait_for(
        "the stream and the disk",
        Duration::from_secs(10),
        |screen| {
            row(screen, &id).is_some_and(|words| words.iter().any(|w| w.ends_with(&*file_name)))
                && row(screen, disk).is_some()
        },
    );
    let first = refresh_count(&screen).expect("a refresh count in the header");

    // The view refreshes, and the disk's RT column fills in as the stream loads for its
    // reader: requests, then p50 and p99 that are latencies, not "-".
    let screen = tmux.wait_for(
        "two more refreshes with real-time requests on the disk",
        Duration::from_secs(15),
        |screen| {
            let rt = row(screen, disk).map(|words| {
                // DISK DEV ELEVATOR ADMISSION RESERVED FREE STREAMS RT-REQS RT-P50 RT-P99 …
                (
                    words.get(7).and_then(|n| n.parse::<u64>().ok()),
                    words.get(8).copied(),
                )
            });
            refresh_count(screen).is_some_and(|n| n >= first + 2)
                && rt.is_some_and(|(requests, p50)| {
                    requests.is_some_and(|n| n > 0)
                        && p50.is_some_and(|p| p.ends_with("us") || p.ends_with("ms"))
                })
        },
    );
    // What the view looked like, for the log (`--show-output`).
    eprintln!("abissctl top ({colour:?}):\n{screen}");
    let disk_row = row(&screen, disk).expect("the disk row");
    assert_eq!(
        disk_row.get(6),
        Some(&"1"),
        "one stream on the disk: {disk_row:?}"
    );

    let escapes = tmux.screen_with_escapes();
    assert_eq!(
        has_colour(&escapes),
        !no_color,
        "colour only when allowed ({colour:?}):\n{escapes:?}"
    );

    tmux.key("q");
    tmux.wait_for(
        "the shell prompt after q",
        Duration::from_secs(5),
        |screen| screen.lines().rev().find(|l| !l.trim().is_empty()) == Some(PROMPT),
    );
    assert_eq!(tmux.pane_command(), "bash", "abissctl has ended");
    tmux.type_line("echo top-exit=$?");
    tmux.wait_for("abissctl's exit status", Duration::from_secs(5), |screen| {
        screen.lines().any(|l| l == "top-exit=0")
    });
}

#[test]
fn top_shows_the_stream_and_the_disk_refreshes_and_quits_on_q() {
    require_root!();
    let lab = HddLab::up("top", 1, "none");
    let file = lab.mount().join("movie.bin");
    write_cold_file(&file, 48 << 20);
    let daemon = Daemon::start_managing(lab.device(), &[]);
    let stream = daemon.attach_at_1mb(&file);
    let _player = Player::start(file.clone());
    let disk = lab
        .device()
        .file_name()
        .expect("a device name")
        .to_string_lossy()
        .into_owned();
    for colour in [
        Colour::Allowed,
        Colour::NoColorVariable,
        Colour::NoColorOption,
    ] {
        watch(&daemon, stream, &file, &disk, colour);
    }
}

/// SIGTERM or SIGHUP (a closed terminal window, `kill`) ends `top` with the terminal put back:
/// out of raw mode and off the alternate screen, and the shell sees death by that signal.
#[test]
fn top_restores_the_terminal_when_killed() {
    require_root!();
    let daemon = Daemon::start_with(&[]);
    for (signal, status) in [("TERM", 143), ("HUP", 129)] {
        let tmux = Tmux::start(&format!("kill-{signal}"));
        tmux.type_line(&format!(
            "{} --socket {} top; echo top-exit=$?",
            binary("abissctl").display(),
            daemon.socket().display()
        ));
        tmux.wait_for("top's header", Duration::from_secs(10), |screen| {
            refresh_count(screen).is_some()
        });
        let killed = Command::new("pkill")
            .args([
                &format!("-{signal}"),
                "-f",
                &format!("{} top", daemon.socket().display()),
            ])
            .status()
            .expect("pkill");
        assert!(killed.success(), "pkill found abissctl top");
        let screen = tmux.wait_for("the exit status", Duration::from_secs(5), |screen| {
            screen.lines().any(|l| l.starts_with("top-exit="))
        });
        assert!(
            screen.lines().any(|l| l == format!("top-exit={status}")),
            "died of SIG{signal} ({status}):\n{screen}"
        );
        // Back on the normal screen: the command line typed before top is visible again.
        assert!(
            screen.contains("top-exit=$?"),
            "normal screen back:\n{screen}"
        );
        tmux.type_line("stty -a | grep -o -- ' -icanon' ; echo stty-checked");
        let screen = tmux.wait_for("stty's answer", Duration::from_secs(5), |screen| {
            screen.lines().any(|l| l == "stty-checked")
        });
        assert!(
            !screen.lines().any(|l| l == " -icanon"),
            "the terminal left raw mode (canonical input is back):\n{screen}"
        );
    }
}

#[test]
fn top_says_when_abissd_is_not_running() {
    let tmux = Tmux::start("absent");
    tmux.type_line(&format!(
        "{} --socket /nonexistent/abiss.sock top; echo top-exit=$?",
        binary("abissctl").display()
    ));
    // The typed line holds `top-exit=` too: the status is the line that starts with it.
    let screen = tmux.wait_for("the error", Duration::from_secs(5), |screen| {
        screen.lines().any(|l| l.starts_with("top-exit="))
    });
    assert!(
        screen.lines().any(|l| l == "top-exit=3"),
        "exit code 3:\n{screen}"
    );
    assert!(screen.contains("abissd is not running"), "{screen}");
}

#[test]
fn top_needs_a_terminal() {
    // Here stdout is a pipe: a usage error (2) in one sentence, before connecting anywhere.
    let output = Command::new(binary("abissctl"))
        .args(["--socket", "/nonexistent/abiss.sock", "top"])
        .output()
        .expect("run abissctl");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(output.stdout.is_empty(), "nothing on stdout");
}
