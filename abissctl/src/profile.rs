//! `abissctl profile`: measures a disk through the kernel with `O_DIRECT` (no page cache) and
//! fits an [`abiss_model::DeviceModel`] to the measurements ([`abiss_model::fit()`]).
//!
//! The measurements follow Johnson & Miller ("Performance Measurements of Tertiary Storage
//! Devices", reference 003): sequential transfer rate at many positions (the zone profile),
//! access time against seek distance for short and long seeks, the rotational latency (the
//! spread of access times at one distance: uniform over a revolution), and the effect of
//! request size and of requests in flight. The model's shape is TRAC's (reference 000).
//!
//! Profiling only reads, unless `--write` (with `--yes` or a typed confirmation) also
//! measures the write rate by writing back, in place, the data it has just read.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use abiss_model::{
    fit, DeviceIdentity, Measurements, QueueDepthPoint, RequestSizePoint, ZonePoint,
};
use abiss_proto::DeviceNumber;

use crate::error::CliError;

mod report;

pub use report::describe;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The smallest device worth profiling: seeks over less mean nothing.
pub const MIN_PROFILE_BYTES: u64 = 64 * MIB;
/// Large sequential reads: the block layer splits each into requests that reach the device
/// together, so the kernel's round trip between two reads is a small part of the time.
const SEQ_REQUEST: u64 = 4 * MIB;
const SMALL_READ: u64 = 4 * KIB;

/// What to measure and where the model goes: the arguments of `abissctl profile`.
#[derive(Debug, clap::Args)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "the command's flags, as typed"
)]
pub struct ProfileOptions {
    /// The whole disk: NAME, /dev/NAME or MAJOR:MINOR.
    pub device: String,
    /// A short profile (at most a minute on a laptop disk) instead of the full one.
    #[arg(long)]
    pub quick: bool,
    /// Print the model as JSON.
    #[arg(long, short = 'j')]
    pub json: bool,
    /// Save the model where abissd finds it (`MODEL_DIR/IDENTITY.json`).
    #[arg(long)]
    pub save: bool,
    /// Also measure writes, by rewriting in place the data just read (needs a device nobody
    /// has open, and --yes or a typed confirmation).
    #[arg(long)]
    pub write: bool,
    /// Do not ask before --write.
    #[arg(long, requires = "write")]
    pub yes: bool,
    /// abissd's model directory (its `--model-dir`).
    #[arg(long, default_value = abiss_model::DEFAULT_MODEL_DIR)]
    pub model_dir: PathBuf,
}

/// How much of each measurement a profile takes.
#[derive(Clone, Copy, Debug)]
struct Plan {
    zone_positions: u32,
    zone_requests: u64,
    seek_distances: &'static [f64],
    seek_pairs: u32,
    random_reads: u32,
    size_reads: u32,
    depth_reads: u32,
}

const QUICK: Plan = Plan {
    zone_positions: 16,
    zone_requests: 2,
    seek_distances: &[0.001, 0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9],
    seek_pairs: 24,
    random_reads: 300,
    size_reads: 20,
    depth_reads: 80,
};

const FULL: Plan = Plan {
    zone_positions: 64,
    zone_requests: 4,
    seek_distances: &[
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6,
        0.7, 0.8, 0.9, 0.97,
    ],
    seek_pairs: 60,
    random_reads: 1000,
    size_reads: 60,
    depth_reads: 300,
};

const REQUEST_SIZES: [u64; 4] = [4 * KIB, 64 * KIB, 256 * KIB, MIB];
const QUEUE_DEPTHS: [u32; 4] = [1, 2, 4, 8];
const DEPTH_REQUEST: u64 = 64 * KIB;

/// A buffer aligned for `O_DIRECT`.
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
}

impl AlignedBuffer {
    fn new(len: u64) -> Self {
        let len = usize::try_from(len).unwrap_or(usize::MAX - 4096);
        let storage = vec![0u8; len + 4096];
        let start = storage.as_ptr().align_offset(4096);
        Self { storage, start }
    }

    fn slice(&mut self, len: u64) -> &mut [u8] {
        let len = usize::try_from(len).unwrap_or(0);
        &mut self.storage[self.start..self.start + len]
    }
}

/// A tiny deterministic generator for positions (xorshift); profiling needs no better.
struct Positions(u64);

impl Positions {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A 4 KiB-aligned offset where `len` bytes fit below `limit`.
    fn offset(&mut self, limit: u64, len: u64) -> u64 {
        let slots = (limit.saturating_sub(len) / SMALL_READ).max(1);
        (self.next() % slots) * SMALL_READ
    }
}

/// Width of the progress bar.
const WIDTH: u64 = 30;

/// Progress on a terminal; nothing on a pipe.
struct Progress {
    show: bool,
    total: u64,
    done: u64,
    phase: &'static str,
}

impl Progress {
    fn new(total: u64) -> Self {
        Self {
            show: std::io::stderr().is_terminal(),
            total: total.max(1),
            done: 0,
            phase: "",
        }
    }

    fn phase(&mut self, phase: &'static str) {
        self.phase = phase;
        self.draw();
    }

    fn step(&mut self, steps: u64) {
        self.done = (self.done + steps).min(self.total);
        self.draw();
    }

    fn draw(&self) {
        if !self.show {
            return;
        }
        let filled = self.done * WIDTH / self.total;
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        eprint!(
            "\r[{bar}] {:>3}% {:<28}",
            self.done * 100 / self.total,
            self.phase
        );
        let _ = std::io::stderr().flush();
    }

    fn finish(&self) {
        if self.show {
            eprint!("\r{:<72}\r", "");
        }
    }
}

struct Device {
    file: File,
    size: u64,
}

impl Device {
    fn read(&self, buf: &mut AlignedBuffer, offset: u64, len: u64) -> Result<Duration, CliError> {
        let slice = buf.slice(len);
        let started = Instant::now();
        self.file.read_exact_at(slice, offset).map_err(|e| {
            CliError::Profile(format!("O_DIRECT read of {len} bytes at {offset}: {e}"))
        })?;
        Ok(started.elapsed())
    }

    fn write(&self, buf: &mut AlignedBuffer, offset: u64, len: u64) -> Result<Duration, CliError> {
        let slice = buf.slice(len);
        let started = Instant::now();
        self.file.write_all_at(slice, offset).map_err(|e| {
            CliError::Profile(format!("O_DIRECT write of {len} bytes at {offset}: {e}"))
        })?;
        Ok(started.elapsed())
    }
}

fn align_down(value: u64, alignment: u64) -> u64 {
    value / alignment * alignment
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    reason = "a position within the device"
)]
fn at_fraction(size: u64, fraction: f64) -> u64 {
    (size as f64 * fraction.clamp(0.0, 1.0)) as u64
}

#[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
fn as_f64(value: u64) -> f64 {
    value as f64
}

fn find_devnode(number: DeviceNumber) -> PathBuf {
    let by_number = PathBuf::from(format!("/dev/block/{number}"));
    if by_number.exists() {
        return by_number;
    }
    std::fs::read_to_string(format!("/sys/dev/block/{number}/uevent"))
        .ok()
        .and_then(|uevent| {
            uevent.lines().find_map(|l| {
                l.strip_prefix("DEVNAME=")
                    .map(|n| PathBuf::from("/dev").join(n))
            })
        })
        .unwrap_or(by_number)
}

fn confirm_write(options: &ProfileOptions, node: &std::path::Path) -> Result<(), CliError> {
    if !options.write || options.yes {
        return Ok(());
    }
    eprint!(
        "profiling with --write rewrites data in place on {}; a crash or power loss meanwhile can damage it. Type 'yes' to go on: ",
        node.display()
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    if answer.trim() == "yes" {
        Ok(())
    } else {
        Err(CliError::Usage("not confirmed; nothing was written".into()))
    }
}

fn open_device(options: &ProfileOptions) -> Result<(Device, DeviceIdentity), CliError> {
    if options.write && !options.yes && !std::io::stdin().is_terminal() {
        return Err(CliError::Usage(
            "--write needs --yes when abissctl does not run on a terminal".into(),
        ));
    }
    let number = crate::devices::resolve(&options.device)?;
    if std::path::Path::new(&format!("/sys/dev/block/{number}/partition")).exists() {
        return Err(CliError::UnknownDevice(format!(
            "{} is a partition; profile its whole disk (admission is per disk)",
            options.device
        )));
    }
    if !nix_is_root() {
        return Err(CliError::PermissionDenied(
            "profiling reads the raw device: run abissctl profile as root".into(),
        ));
    }
    let identity =
        DeviceIdentity::of(number).map_err(|e| CliError::UnknownDevice(e.to_string()))?;
    if identity.size_bytes < MIN_PROFILE_BYTES {
        return Err(CliError::TooSmall(format!(
            "{} holds {} bytes, less than the {} MiB a profile needs for its seeks to mean anything",
            options.device,
            identity.size_bytes,
            MIN_PROFILE_BYTES / MIB
        )));
    }
    let node = find_devnode(number);
    confirm_write(options, &node)?;
    let mut flags = libc::O_DIRECT;
    if options.write {
        // Writes only to a device nobody has open exclusively (mounted, in use by md/dm).
        flags |= libc::O_EXCL;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(options.write)
        .custom_flags(flags)
        .open(&node)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => CliError::Busy(format!(
                "{} is in use (mounted or held by another driver); --write needs a device nobody uses",
                node.display()
            )),
            Some(libc::ENOENT | libc::ENXIO | libc::ENODEV) => {
                CliError::UnknownDevice(format!("{}: {e}", node.display()))
            }
            Some(libc::EACCES | libc::EPERM) => {
                CliError::PermissionDenied(format!("{}: {e}", node.display()))
            }
            _ => CliError::Profile(format!("cannot open {}: {e}", node.display())),
        })?;
    // One profile at a time per device: two would measure each other.
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(CliError::Busy(format!(
            "{} is busy: another profile of it is running",
            node.display()
        )));
    }
    Ok((
        Device {
            file,
            size: identity.size_bytes,
        },
        identity,
    ))
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `abissctl profile`.
pub fn run(options: &ProfileOptions) -> Result<(), CliError> {
    let (device, identity) = open_device(options)?;
    let plan = if options.quick { QUICK } else { FULL };
    // Measure from a real-time thread so a loaded machine delays the timing less; without the
    // privilege it simply runs at normal priority.
    let param = libc::sched_param { sched_priority: 5 };
    // SAFETY: `param` outlives the call; pid 0 is this thread.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &raw const param) };
    let started = Instant::now();
    let measurements = measure(&device, &plan, options.write)?;
    let model = fit(identity, options.quick, &measurements);
    model.validate().map_err(|reason| {
        CliError::Profile(format!("the measurements do not fit a model: {reason}"))
    })?;
    let mut out = std::io::stdout().lock();
    if options.json {
        crate::json::print(&mut out, &model);
    } else {
        let _ = write!(out, "{}", describe(&model, started.elapsed()));
    }
    if options.save {
        let path = model
            .save(&options.model_dir)
            .map_err(|e| CliError::Profile(e.to_string()))?;
        eprintln!(
            "saved {}; abissd admits by it for streams attached from now on",
            path.display()
        );
    }
    Ok(())
}

fn measure(device: &Device, plan: &Plan, write: bool) -> Result<Measurements, CliError> {
    let size = device.size;
    let mut buf = AlignedBuffer::new(SEQ_REQUEST);
    let mut positions = Positions(0x9e37_79b9_7f4a_7c15 ^ size);
    let seek_steps = plan.seek_distances.len() as u64 * u64::from(plan.seek_pairs);
    let mut progress = Progress::new(
        u64::from(plan.zone_positions)
            + seek_steps
            + u64::from(plan.random_reads)
            + REQUEST_SIZES.len() as u64 * u64::from(plan.size_reads)
            + QUEUE_DEPTHS.len() as u64 * u64::from(plan.depth_reads),
    );
    let mut m = Measurements {
        zones: measure_zones(device, plan, &mut buf, write, &mut progress)?,
        ..Measurements::default()
    };

    progress.phase("access time by distance");
    for &distance in plan.seek_distances {
        let gap = align_down(at_fraction(size, distance), SMALL_READ).max(SMALL_READ * 16);
        let mut samples = Vec::new();
        for _ in 0..plan.seek_pairs {
            let first = positions.offset(size.saturating_sub(gap), SMALL_READ);
            device.read(&mut buf, first, SMALL_READ)?;
            let took = device.read(&mut buf, first + gap, SMALL_READ)?;
            samples.push(took.as_secs_f64() * 1e3);
            progress.step(1);
        }
        m.seeks.push((as_f64(gap) / as_f64(size), samples));
    }

    progress.phase("random access time");
    for _ in 0..plan.random_reads {
        let offset = positions.offset(size, SMALL_READ);
        m.random_ms
            .push(device.read(&mut buf, offset, SMALL_READ)?.as_secs_f64() * 1e3);
        progress.step(1);
    }

    progress.phase("request size");
    for &bytes in &REQUEST_SIZES {
        let mut total = Duration::ZERO;
        for _ in 0..plan.size_reads {
            let offset = positions.offset(size, bytes);
            total += device.read(&mut buf, offset, bytes)?;
            progress.step(1);
        }
        m.sizes.push(RequestSizePoint {
            bytes,
            service_ms: total.as_secs_f64() * 1e3 / f64::from(plan.size_reads),
        });
    }

    progress.phase("requests in flight");
    m.depths = measure_depths(device, plan, &mut positions, &mut progress)?;
    progress.finish();
    Ok(m)
}

/// The zone profile: a few large sequential reads (and, with `write`, rewrites) at evenly
/// spread positions, the first of each run only bringing the head there.
fn measure_zones(
    device: &Device,
    plan: &Plan,
    buf: &mut AlignedBuffer,
    write: bool,
    progress: &mut Progress,
) -> Result<Vec<ZonePoint>, CliError> {
    progress.phase("zone profile");
    let size = device.size;
    let mut zones = Vec::new();
    let span = (plan.zone_requests + ZONE_EXTRA_REQUESTS + 1) * SEQ_REQUEST;
    let usable = size.saturating_sub(span);
    for i in 0..plan.zone_positions {
        let fraction = (f64::from(i) + 0.5) / f64::from(plan.zone_positions);
        let start = align_down(at_fraction(usable, fraction), MIB);
        // The first request brings the head there; the rest stream.
        device.read(buf, start, SEQ_REQUEST)?;
        let mut took = Vec::new();
        let mut r = 1;
        // Streaming requests of one zone take the same time; when they disagree, one was
        // slowed by something else (the host, another process), so a few more are read and
        // the median kept.
        while r <= plan.zone_requests
            || (r <= plan.zone_requests + ZONE_EXTRA_REQUESTS && !agree(&took))
        {
            took.push(device.read(buf, start + r * SEQ_REQUEST, SEQ_REQUEST)?);
            r += 1;
        }
        let bytes = as_f64(plan.zone_requests * SEQ_REQUEST);
        let elapsed = median(&mut took) * u32::try_from(plan.zone_requests).unwrap_or(1);
        let write_bps = if write {
            // Write back what is there: read a request, then rewrite it in place, streaming.
            let mut elapsed = Duration::ZERO;
            for r in 0..=plan.zone_requests {
                let offset = start + r * SEQ_REQUEST;
                device.read(buf, offset, SEQ_REQUEST)?;
                let took = device.write(buf, offset, SEQ_REQUEST)?;
                if r > 0 {
                    elapsed += took;
                }
            }
            Some(bytes / elapsed.as_secs_f64())
        } else {
            None
        };
        zones.push(ZonePoint {
            position: (as_f64(start) + as_f64(span) / 2.0) / as_f64(size),
            read_bps: bytes / elapsed.as_secs_f64(),
            write_bps,
        });
        progress.step(1);
    }
    Ok(zones)
}

/// How many more streaming requests a zone may take when its first ones disagree.
const ZONE_EXTRA_REQUESTS: u64 = 3;

/// Whether streaming request times agree within 5 %.
fn agree(took: &[Duration]) -> bool {
    let (Some(fastest), Some(slowest)) = (took.iter().min(), took.iter().max()) else {
        return true;
    };
    slowest.as_secs_f64() <= fastest.as_secs_f64() * 1.05
}

/// The median of the times, by the workspace's one quantile ([`abiss_units::quantile`]:
/// nearest rank, so the lower of the middle two of an even count).
fn median(took: &mut [Duration]) -> Duration {
    took.sort_unstable();
    abiss_units::quantile(took, 0.5).unwrap_or(Duration::ZERO)
}

/// Random 64 KiB reads with several requests in flight (a thread each).
fn measure_depths(
    device: &Device,
    plan: &Plan,
    positions: &mut Positions,
    progress: &mut Progress,
) -> Result<Vec<QueueDepthPoint>, CliError> {
    let size = device.size;
    let mut depths = Vec::new();
    for &depth in &QUEUE_DEPTHS {
        let per_thread = plan.depth_reads.div_ceil(depth);
        let seeds: Vec<u64> = (0..depth).map(|_| positions.next()).collect();
        let started = Instant::now();
        let results: Vec<Result<(), CliError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = seeds
                .iter()
                .map(|&seed| {
                    scope.spawn(move || {
                        let mut buf = AlignedBuffer::new(DEPTH_REQUEST);
                        let mut positions = Positions(seed | 1);
                        for _ in 0..per_thread {
                            let offset = positions.offset(size, DEPTH_REQUEST);
                            device.read(&mut buf, offset, DEPTH_REQUEST)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(CliError::Profile("a reader thread failed".into())))
                })
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        let reads = per_thread * depth;
        depths.push(QueueDepthPoint {
            depth,
            service_ms: started.elapsed().as_secs_f64() * 1e3 / f64::from(reads),
            request_bytes: DEPTH_REQUEST,
        });
        progress.step(u64::from(plan.depth_reads));
    }
    Ok(depths)
}
