//! `abissd --metrics ADDR`: Prometheus metrics on `GET /metrics`.
//!
//! Like a client connection, a scrape asks the main loop for what only it may touch (the
//! latency histograms, the streams, the disks) through the existing [`Command`]s, then renders
//! the answers ([`exposition`]); it reads the daemon's own CPU and memory and the programs'
//! run time itself. It never sees the controller. Its HTTP is the least Prometheus needs
//! ([`http`]), bounded so that no client can hold the daemon: at most
//! [`MAX_CONNECTIONS`] at once, where a new connection takes the slot of the one that has
//! waited longest for its request head ([`slots`]; others get 503 at once), a request head of
//! at most [`MAX_HEAD_BYTES`], read within [`READ_TIMEOUT`], an answer written within
//! [`WRITE_TIMEOUT`], and a whole exchange within [`EXCHANGE_TIMEOUT`].
//!
//! The metrics are root's view: every stream's owner, rate and disk. So they are served on a
//! loopback address unless the operator says otherwise (`--metrics-remote`), and with
//! `--metrics-token-file` only to scrapes that show the token.

pub(crate) mod exposition;
pub(crate) mod http;
mod slots;
mod token;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use abiss_proto::DeviceNumber;
use aya::programs::loaded_programs;
use log::{info, warn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

use crate::serve::{Command, Reply};
use exposition::{ProcessFigures, ProgramRun, Snapshot};
use http::Route;
use slots::{Slot, Slots};
use token::Token;

/// Most scrapes served at once.
pub(crate) const MAX_CONNECTIONS: usize = 8;
/// Largest request head accepted.
pub(crate) const MAX_HEAD_BYTES: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing one answer may take: a client that sends its head and then reads
/// nothing (or reads slowly) holds a slot while abissd writes to it, once the answer is larger
/// than the sockets' buffers; past this the connection is reset and the slot is free.
/// Prometheus reads an answer of a few hundred KiB well within it.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one exchange (request, snapshot, response) may take in all.
pub(crate) const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(20);

/// Where and to whom the metrics are served (`--metrics`, `--metrics-remote`,
/// `--metrics-token-file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MetricsSettings {
    /// The address to listen on.
    pub(crate) address: SocketAddr,
    /// An address other than loopback is allowed.
    pub(crate) remote: bool,
    /// The file whose first line is the token a scrape must show, if any.
    pub(crate) token_file: Option<PathBuf>,
}

/// The metrics could not be served as asked. The daemon stops before it takes anything else.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {address}: {why}")]
pub(crate) struct MetricsError {
    address: SocketAddr,
    why: String,
}

/// Parses `--metrics ADDR`: an IP address and a port other than 0.
pub(crate) fn parse_address(text: &str) -> Result<SocketAddr, String> {
    match text.trim().parse::<SocketAddr>() {
        Ok(address) if address.port() != 0 => Ok(address),
        Ok(_) => Err(format!(
            "'{text}' has port 0; give the port Prometheus scrapes, such as 127.0.0.1:9565"
        )),
        Err(_) => Err(format!(
            "'{text}' is not an IP address and port such as 127.0.0.1:9565 or [::1]:9565"
        )),
    }
}

/// The bound metrics socket, taken at start so that a busy port stops the daemon before it
/// touches anything.
#[derive(Debug)]
pub(crate) struct MetricsListener {
    listener: TcpListener,
    token: Option<Token>,
}

impl MetricsListener {
    /// Checks the address and reads the token, then binds. Must be called inside a tokio
    /// runtime.
    pub(crate) fn bind(settings: &MetricsSettings) -> Result<Self, MetricsError> {
        let address = settings.address;
        if !settings.remote && !address.ip().to_canonical().is_loopback() {
            return Err(MetricsError {
                address,
                why: "it is not a loopback address, and the metrics show every user's streams \
                      to whoever reaches it; give 127.0.0.1:PORT or [::1]:PORT, or add \
                      --metrics-remote (with --metrics-token-file) to serve them there"
                    .to_owned(),
            });
        }
        let token = (settings.token_file.as_deref())
            .map(Token::read)
            .transpose()
            .map_err(|why| MetricsError { address, why })?;
        let failed = |error: std::io::Error| {
            let why = match error.kind() {
                std::io::ErrorKind::AddrInUse => "the port is in use".to_owned(),
                std::io::ErrorKind::AddrNotAvailable => {
                    "no interface of this machine has that address".to_owned()
                }
                std::io::ErrorKind::PermissionDenied => {
                    "ports below 1024 need CAP_NET_BIND_SERVICE".to_owned()
                }
                _ => error.to_string(),
            };
            MetricsError {
                address,
                why: format!("{why}; choose another --metrics address"),
            }
        };
        let listener = std::net::TcpListener::bind(address).map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        let listener = TcpListener::from_std(listener).map_err(failed)?;
        Ok(Self { listener, token })
    }

    /// The address it listens on.
    #[must_use]
    pub(crate) fn address(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }
}

/// What a scrape reads from: the main loop, and the programs whose cost it shows.
#[derive(Debug)]
struct Sources {
    commands: mpsc::Sender<Command>,
    program_ids: Vec<(String, u32)>,
    token: Option<Token>,
}

/// Serves scrapes until the runtime ends. `program_ids` are the daemon's programs (their run
/// time is shown while the kernel's BPF statistics are on).
pub(crate) async fn serve(
    listener: MetricsListener,
    commands: mpsc::Sender<Command>,
    program_ids: Vec<(String, u32)>,
) {
    if let Some(address) = listener.address() {
        info!("metrics on http://{address}{}", http::METRICS_PATH);
    }
    let sources = Arc::new(Sources {
        commands,
        program_ids,
        token: listener.token,
    });
    let slots = Slots::new(MAX_CONNECTIONS);
    loop {
        let stream = match listener.listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, say: wait rather than spin.
                warn!("metrics: accept failed: {error}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            // Every slot serves a request: say so at once rather than queue; a best-effort
            // write to a fresh socket.
            let busy = http::error(503, "too many metrics connections at once; retry");
            let _ = stream.try_write(&busy);
            continue;
        };
        let sources = Arc::clone(&sources);
        tokio::spawn(async move {
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange(stream, slot, &sources)).await;
        });
    }
}

/// The request head, once it is all there; `Err` carries the error response.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let read = stream
            .read(&mut chunk)
            .await
            .map_err(|_| http::error(400, "the request could not be read"))?;
        if read == 0 {
            return Err(http::error(400, "the request ended before its blank line"));
        }
        head.extend_from_slice(&chunk[..read]);
        if let Some(length) = http::head_length(&head) {
            head.truncate(length);
            return Ok(head);
        }
        if head.len() > MAX_HEAD_BYTES {
            return Err(http::error(
                431,
                &format!("request heads are limited to {MAX_HEAD_BYTES} bytes"),
            ));
        }
    }
}

/// Serves one connection in `slot`: one request, one answer, then it closes. A newer
/// connection may take the slot while the head is read; this one is then dropped.
async fn exchange(mut stream: TcpStream, mut slot: Slot, sources: &Sources) {
    let read = tokio::select! {
        read = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)) => read,
        () = slot.pushed_out() => {
            let busy = http::error(503, "other connections came while this one's request head did not; send it at once");
            let _ = stream.try_write(&busy);
            return;
        }
    };
    if !slot.serve() {
        return;
    }
    let response = match read {
        Err(_) => http::error(408, "the request head took too long"),
        Ok(Err(response)) => response,
        Ok(Ok(head)) if !admitted(sources, &head) => http::error(
            401,
            "abissd's metrics need the token of its --metrics-token-file, as Authorization: Bearer TOKEN",
        ),
        Ok(Ok(head)) => match http::route(&head) {
            Route::Metrics { head_only } => match gather(sources).await {
                Some(snapshot) => http::response(
                    200,
                    exposition::CONTENT_TYPE,
                    exposition::render(snapshot).as_bytes(),
                    head_only,
                ),
                None => http::error(503, "abissd is shutting down"),
            },
            Route::NotFound => http::error(404, "abissd serves its metrics on /metrics only"),
            Route::MethodNotAllowed => http::error(405, "/metrics answers GET and HEAD only"),
            Route::BadRequest => http::error(400, "not an HTTP/1 request line"),
        },
    };
    let written = tokio::time::timeout(WRITE_TIMEOUT, async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    })
    .await;
    if written.is_err() {
        // Reset rather than closed: the kernel would otherwise keep trying to send what is
        // left to a client that does not read it, long after the slot is free.
        // A zero linger never waits: the close sends a reset at once (tokio deprecates
        // `set_linger` for the lingers that do wait).
        let reset = nix::libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let _ = nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &reset);
    }
}

/// Whether the request may have an answer: any, unless a token is set.
fn admitted(sources: &Sources, head: &[u8]) -> bool {
    sources
        .token
        .as_ref()
        .is_none_or(|token| token.admits(http::bearer_token(head)))
}

/// Asks the main loop and waits for its answer; `None` once it has stopped.
async fn ask<T>(sources: &Sources, make: impl FnOnce(Reply<T>) -> Command) -> Option<T> {
    let (reply, answer) = oneshot::channel();
    sources.commands.send(make(reply)).await.ok()?;
    answer.await.ok()
}

/// One scrape's figures. Root's view (uid 0): every stream; no path leaves the daemon.
async fn gather(sources: &Sources) -> Option<Snapshot> {
    let latency = match ask(sources, Command::Latency).await? {
        Ok(groups) => Some(groups),
        Err(error) => {
            warn!("metrics: cannot read the latency histograms: {error}");
            None
        }
    };
    let streams = ask(sources, |reply| Command::List { uid: 0, reply }).await?;
    let status = ask(sources, |reply| Command::Status { uid: 0, reply }).await?;
    let mut snapshot = Snapshot {
        latency,
        streams,
        status,
        process: process_figures(),
        programs: program_runs(&sources.program_ids),
        device_names: BTreeMap::new(),
    };
    snapshot.device_names = device_names(&snapshot);
    Some(snapshot)
}

/// Kernel names of every disk the snapshot mentions: managed disks by their status, the others
/// from sysfs.
fn device_names(snapshot: &Snapshot) -> BTreeMap<DeviceNumber, String> {
    let mut names: BTreeMap<DeviceNumber, String> = snapshot
        .status
        .devices
        .iter()
        .map(|d| (d.device, d.name.clone()))
        .collect();
    let others = snapshot.latency.iter().flatten().map(|g| g.device).chain(
        snapshot
            .streams
            .iter()
            .flat_map(|s| s.disks.iter().copied()),
    );
    for number in others {
        if let std::collections::btree_map::Entry::Vacant(entry) = names.entry(number) {
            let link = std::fs::read_link(format!("/sys/dev/block/{number}"));
            if let Some(name) = link.ok().as_deref().and_then(std::path::Path::file_name) {
                entry.insert(name.to_string_lossy().into_owned());
            }
        }
    }
    names
}

/// The daemon's CPU time so far and its resident memory.
fn process_figures() -> ProcessFigures {
    let cpu = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default();
    let resident_bytes = procfs::process::Process::myself()
        .and_then(|me| me.status())
        .ok()
        .and_then(|status| status.vmrss)
        .map_or(0, |kib| kib * 1024);
    ProcessFigures {
        cpu_seconds: cpu.as_secs_f64(),
        resident_bytes,
    }
}

/// The programs' cumulative run counts and times, while `kernel.bpf_stats_enabled` is on
/// (by the sysctl, or while `abissctl stats` measures). Off, the kernel counts nothing, and
/// the metrics are left out rather than shown as a stale or zero figure.
fn program_runs(ids: &[(String, u32)]) -> Option<Vec<ProgramRun>> {
    let enabled = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    if enabled.trim() != "1" {
        return None;
    }
    let mut runs: Vec<ProgramRun> = ids
        .iter()
        .map(|(name, _)| ProgramRun {
            name: name.clone(),
            runs: 0,
            run_seconds: 0.0,
        })
        .collect();
    for program in loaded_programs().flatten() {
        if let Some(index) = ids.iter().position(|(_, id)| *id == program.id()) {
            runs[index].runs = program.run_count();
            runs[index].run_seconds = program.run_time().as_secs_f64();
        }
    }
    Some(runs)
}

#[cfg(test)]
mod exposition_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_needs_an_ip_and_a_port() {
        assert_eq!(
            parse_address("127.0.0.1:9565"),
            Ok("127.0.0.1:9565".parse().unwrap())
        );
        assert!(parse_address("[::1]:9565").is_ok());
        for bad in ["localhost:9565", "9565", "127.0.0.1", "127.0.0.1:99999", ""] {
            let message = parse_address(bad).unwrap_err();
            assert!(message.contains("127.0.0.1:9565"), "{message}");
        }
        assert!(parse_address("127.0.0.1:0").unwrap_err().contains("port 0"));
    }
}
