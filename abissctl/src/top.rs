//! `abissctl top`: a live view of the streams and the managed disks, refreshed every interval.
//!
//! Each refresh asks abissd what `list` and `status` print, and its cumulative latency
//! histograms (as `trace` does); the disks' latency is the difference of two snapshots, so it
//! covers the last interval only. Asking for latency makes this connection a trace client, so
//! abissd traces every disk while `top` runs (only the managed ones are shown). What is drawn
//! is in [`view`]; this module owns the terminal, the keys and the sampling.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use abiss_client::Client;
use abiss_proto::{
    DeviceNumber, IoClass, IoPriority, LatencyGroup, Log2Histogram, Operation, StatusReport,
    StreamId, StreamInfo,
};
use nix::sys::signal::{self, SaFlags, SigAction, SigHandler, SigSet, Signal};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};

use crate::error::CliError;

mod view;

/// Everything one refresh shows.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Refreshes so far (1 for the first view).
    pub refresh: u64,
    /// Wall-clock time of the sample, `HH:MM:SS` UTC.
    pub clock: String,
    /// The interval the latency figures cover (zero for the first view).
    pub covered: Duration,
    /// The refresh interval asked for.
    pub interval: Duration,
    /// The streams, as `list` reports them.
    pub streams: Vec<StreamInfo>,
    /// The managed disks with their latency over `covered`.
    pub disks: Vec<Disk>,
    /// Daemon-wide figures: raises and locked memory (the devices are in `disks`).
    pub report: StatusReport,
}

/// A managed disk and the service time of its requests completed in the last interval.
#[derive(Debug, Clone)]
pub struct Disk {
    /// What `status` reports.
    pub status: abiss_proto::DeviceStatus,
    /// Real-time requests.
    pub rt: Log2Histogram,
    /// Best-effort requests, and requests without a class (the kernel serves them as best
    /// effort).
    pub be: Log2Histogram,
}

type Snapshot = BTreeMap<(DeviceNumber, Operation, IoPriority, Option<StreamId>), LatencyGroup>;

/// Reads a sample from abissd each refresh, keeping the previous latency snapshot.
struct Sampler {
    previous: Snapshot,
    taken: Instant,
    refreshes: u64,
    interval: Duration,
}

impl Sampler {
    fn new(client: &mut Client, interval: Duration) -> Result<Self, CliError> {
        Ok(Self {
            previous: snapshot(client)?,
            taken: Instant::now(),
            refreshes: 0,
            interval,
        })
    }

    fn sample(&mut self, client: &mut Client) -> Result<Sample, CliError> {
        let streams = client.list()?;
        let mut report = client.status_report()?;
        let current = snapshot(client)?;
        let covered = self.taken.elapsed();
        self.taken = Instant::now();
        let latency = by_class(&current, &self.previous);
        self.previous = current;
        self.refreshes += 1;
        let disks = std::mem::take(&mut report.devices)
            .into_iter()
            .map(|status| {
                let (rt, be) = latency.get(&status.device).cloned().unwrap_or_default();
                Disk { status, rt, be }
            })
            .collect();
        Ok(Sample {
            refresh: self.refreshes,
            clock: wall_clock(),
            covered: if self.refreshes == 1 {
                Duration::ZERO
            } else {
                covered
            },
            interval: self.interval,
            streams,
            disks,
            report,
        })
    }
}

fn snapshot(client: &mut Client) -> Result<Snapshot, CliError> {
    let (_, groups) = client.latency()?;
    Ok(groups
        .into_iter()
        .map(|group| (group.key(), group))
        .collect())
}

/// Service time of the requests completed between two snapshots, per disk: (RT, BE).
/// Requests without a class count as best effort, as the kernel serves them; idle-class
/// requests are left out.
fn by_class(
    current: &Snapshot,
    previous: &Snapshot,
) -> BTreeMap<DeviceNumber, (Log2Histogram, Log2Histogram)> {
    let mut disks: BTreeMap<DeviceNumber, (Log2Histogram, Log2Histogram)> = BTreeMap::new();
    for (key, group) in current {
        let delta = previous.get(key).map_or_else(
            || group.service.clone(),
            |before| group.service.since(&before.service),
        );
        if delta.count() == 0 {
            continue;
        }
        let (rt, be) = disks.entry(group.device).or_default();
        match group.priority.class {
            IoClass::Rt => rt.merge(&delta),
            IoClass::Be | IoClass::None => be.merge(&delta),
            IoClass::Idle | IoClass::Invalid => {}
        }
    }
    disks
}

fn wall_clock() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    format!(
        "{:02}:{:02}:{:02}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

/// Whether to draw in colour: not with `--no-color`, nor when `NO_COLOR` is set and not empty
/// (<https://no-color.org>).
fn use_colour(no_color: bool) -> bool {
    !no_color && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

/// The terminal in raw mode on the alternate screen; put back as it was on drop, whichever way
/// `top` ends (a quit key, an error from abissd, a panic: ratatui's panic hook restores too).
struct Screen {
    terminal: ratatui::DefaultTerminal,
}

impl Screen {
    fn take() -> Result<Self, CliError> {
        ratatui::try_init()
            .map(|terminal| Self { terminal })
            .map_err(|error| {
                ratatui::restore();
                CliError::Usage(format!(
                    "`top` cannot use this terminal ({error}); use `abissctl list` and `abissctl status` instead"
                ))
            })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The signal that asked `top` to end (SIGTERM, SIGHUP, or SIGINT sent with kill(1): in raw
/// mode Ctrl-C is a key), 0 while none has. The terminal is put back before `top` dies of it.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Longest wait between two looks at [`STOP_SIGNAL`] (a signal need not wake the key poll).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

extern "C" fn note_stop(signal: nix::libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::Relaxed);
}

/// Catches the signals that end `top`, so that the screen is restored before it ends.
fn catch_stop_signals() -> Result<(), CliError> {
    let action = SigAction::new(
        SigHandler::Handler(note_stop),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for stop in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { signal::sigaction(stop, &action) }
            .map_err(|error| CliError::Usage(format!("`top` cannot catch {stop}: {error}")))?;
    }
    Ok(())
}

/// Dies of the signal that stopped `top`, if one did (the screen is restored by then), so
/// that its parent sees what ended it, as it would have without `top` catching it.
fn die_of_stop_signal() {
    let Ok(stop) = Signal::try_from(STOP_SIGNAL.load(Ordering::Relaxed)) else {
        return;
    };
    // SAFETY: putting back the default action of a signal.
    let _ = unsafe { signal::signal(stop, SigHandler::SigDfl) };
    let _ = signal::raise(stop);
}

/// What ended a wait between refreshes.
enum Wake {
    /// Time for the next refresh.
    Refresh,
    /// The terminal changed size: draw again.
    Redraw,
    /// `q`, `Q`, Escape or Ctrl-C.
    Quit,
}

/// Waits for a key until `deadline`.
fn wait(deadline: Instant) -> std::io::Result<Wake> {
    loop {
        if STOP_SIGNAL.load(Ordering::Relaxed) != 0 {
            return Ok(Wake::Quit);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Wake::Refresh);
        }
        if !event::poll(left.min(SIGNAL_CHECK))? {
            continue;
        }
        match event::read()? {
            Event::Key(key) if key.kind != KeyEventKind::Release => {
                let ctrl_c = key.modifiers.contains(KeyModifiers::CONTROL)
                    && matches!(key.code, KeyCode::Char('c' | 'C'));
                if ctrl_c || matches!(key.code, KeyCode::Char('q' | 'Q') | KeyCode::Esc) {
                    return Ok(Wake::Quit);
                }
            }
            Event::Resize(..) => return Ok(Wake::Redraw),
            _ => {}
        }
    }
}

/// Runs the live view until a quit key. Needs a terminal on stdout; connects (so reports
/// "not running") before taking the terminal, so errors print on a normal screen.
pub fn run(
    interval: Duration,
    no_color: bool,
    connect: impl FnOnce() -> Result<Client, CliError>,
) -> Result<(), CliError> {
    if !std::io::stdout().is_terminal() {
        return Err(CliError::Usage(
            "`top` draws a live view and needs a terminal on stdout; for scripts use `abissctl list --json` and `abissctl status --json`".into(),
        ));
    }
    let colour = use_colour(no_color);
    let mut client = connect()?;
    let mut sampler = Sampler::new(&mut client, interval)?;
    let mut sample = sampler.sample(&mut client)?;
    catch_stop_signals()?;
    let screen = Screen::take()?;
    let shown = show(screen, &mut client, &mut sampler, &mut sample, colour);
    // The screen is back to normal here, whatever ended the view.
    die_of_stop_signal();
    shown
}

/// Draws and refreshes until a quit key, a stop signal or an error; drops (so restores) the
/// screen on the way out.
fn show(
    mut screen: Screen,
    client: &mut Client,
    sampler: &mut Sampler,
    sample: &mut Sample,
    colour: bool,
) -> Result<(), CliError> {
    let interval = sampler.interval;
    let mut next = Instant::now() + interval;
    loop {
        // The terminal went away (e.g. its window was closed): nothing left to show.
        if screen
            .terminal
            .draw(|frame| view::draw(frame, sample, colour))
            .is_err()
        {
            return Ok(());
        }
        match wait(next) {
            Ok(Wake::Quit) | Err(_) => return Ok(()),
            Ok(Wake::Redraw) => {}
            Ok(Wake::Refresh) => {
                *sample = sampler.sample(client)?;
                // After a stall (a suspended terminal, a slow daemon), refresh on the interval
                // from now rather than catching up in a burst.
                next = (next + interval).max(Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abiss_proto::LATENCY_BUCKETS;

    fn group(class: IoClass, stream: Option<u64>, slot: usize, count: u64) -> LatencyGroup {
        let mut slots = vec![0; LATENCY_BUCKETS];
        slots[slot] = count;
        LatencyGroup {
            device: DeviceNumber { major: 7, minor: 0 },
            operation: Operation::Read,
            priority: IoPriority { class, level: 0 },
            stream: stream.map(StreamId),
            requests: count,
            bytes: count * 4096,
            inversions: 0,
            queue: Log2Histogram::from_slots(&slots, 0),
            service: Log2Histogram::from_slots(&slots, (1 << slot) * 1000),
        }
    }

    fn snapshot_of(groups: Vec<LatencyGroup>) -> Snapshot {
        groups.into_iter().map(|g| (g.key(), g)).collect()
    }

    #[test]
    fn latency_covers_only_the_last_interval_and_splits_rt_from_be() {
        let before = snapshot_of(vec![
            group(IoClass::Rt, Some(1), 10, 100),
            group(IoClass::Be, None, 14, 5),
        ]);
        let after = snapshot_of(vec![
            group(IoClass::Rt, Some(1), 10, 130),
            group(IoClass::Rt, None, 12, 10),
            group(IoClass::Be, None, 14, 5),
            group(IoClass::None, None, 16, 2),
            group(IoClass::Idle, None, 20, 7),
        ]);
        let disks = by_class(&after, &before);
        let (rt, be) = &disks[&DeviceNumber { major: 7, minor: 0 }];
        // 30 new requests of the stream and 10 other RT ones; the 5 BE ones are old.
        assert_eq!(rt.count(), 40);
        assert_eq!(rt.quantile_us(0.5), Some(1 << 10));
        // Only the two class-less ones are new on the best-effort side; idle is not shown.
        assert_eq!(be.count(), 2);
        assert_eq!(be.quantile_us(0.99), Some(1 << 16));
    }

    #[test]
    fn no_color_means_no_colour_unless_empty() {
        // One test sets and clears the variable, so no other test sees it half-set.
        std::env::remove_var("NO_COLOR");
        assert!(use_colour(false));
        assert!(!use_colour(true));
        std::env::set_var("NO_COLOR", "1");
        assert!(!use_colour(false));
        std::env::set_var("NO_COLOR", "");
        assert!(use_colour(false));
        std::env::remove_var("NO_COLOR");
    }
}
