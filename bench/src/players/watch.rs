//! What abissd counts while the players play: its stream list is polled (a stream ends with
//! its player, and its figures with it), and so are the latency histograms of the streams'
//! requests, every second (a stream that ended keeps the last it showed: a recorder that stops
//! by itself before the players showed none at the end), and once more before the players
//! are stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use abiss_client::Client;
use abiss_proto::{LatencyGroup, Log2Histogram, StreamId, StreamInfo};
use serde::Serialize;

/// The streams as abissd last showed them, and their requests' latency groups.
#[derive(Debug, Default)]
struct Seen {
    streams: BTreeMap<StreamId, StreamInfo>,
    groups: BTreeMap<StreamId, Vec<LatencyGroup>>,
}

/// With [`StreamWatch::start_polling_latency`], the latency groups are polled every this many
/// polls of the streams (each 250 ms).
const LATENCY_EVERY: u32 = 4;

/// Polls abissd's streams until dropped or [`StreamWatch::finish`]ed.
#[derive(Debug)]
pub struct StreamWatch {
    socket: PathBuf,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// One stream as abissd last showed it.
#[derive(Clone, Debug, Serialize)]
pub struct StreamFigures {
    /// Stream id.
    pub id: StreamId,
    /// The attached file.
    pub path: String,
    /// Granted rate, B/s.
    pub rate_bps: u64,
    /// Playout buffer, bytes.
    pub buffer_bytes: u64,
    /// Reads that waited for the disk, as abissd counts them (its deadline misses).
    pub misses: u64,
    /// Reads that waited for a seek's refill, as abissd counts them.
    pub seek_waits: u64,
    /// Reader threads raised.
    pub raises: u64,
    /// Bytes its prefetch loaded.
    pub prefetched_bytes: u64,
    /// abissd's advice, if any.
    pub suggestion: Option<String>,
    /// Block requests of the stream (prefetch, readers, readahead).
    pub requests: u64,
    /// Of those, the ones that ran below the stream's level.
    pub inversions: u64,
    /// Service time (dispatch to completion) p99 of the stream's requests, ms (log2 bucket
    /// bound).
    pub service_p99_ms: Option<f64>,
    /// Queue time (insert to dispatch) p99, ms.
    pub queue_p99_ms: Option<f64>,
    /// Queue time max, ms.
    pub queue_max_ms: Option<f64>,
}

impl StreamWatch {
    /// Starts polling the abissd at `socket`'s streams every 250 ms; their latency is taken
    /// at [`StreamWatch::finish`] only (asking for it as root switches on abissd's tracing of
    /// every disk, which a players' row does not otherwise have).
    #[must_use]
    pub fn start(socket: &Path) -> Self {
        Self::spawn(socket, false)
    }

    /// [`StreamWatch::start`], and the latency every second as well, for a row whose streams
    /// may end before the players (a recorder that stops by itself) and whose requests are
    /// traced anyway.
    #[must_use]
    pub fn start_polling_latency(socket: &Path) -> Self {
        Self::spawn(socket, true)
    }

    fn spawn(socket: &Path, latency: bool) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (socket, seen, stop) = (socket.to_path_buf(), seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut client = None;
                let mut polls = 0_u32;
                while !stop.load(Ordering::Relaxed) {
                    if client.is_none() {
                        client = Client::connect(&socket).ok();
                    }
                    if let Some(connected) = client.as_mut() {
                        if poll(
                            connected,
                            &seen,
                            latency && polls.is_multiple_of(LATENCY_EVERY),
                        )
                        .is_err()
                        {
                            client = None;
                        }
                    }
                    polls = polls.wrapping_add(1);
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
        };
        Self {
            socket: socket.to_path_buf(),
            seen,
            stop,
            thread: Some(thread),
        }
    }

    /// Takes the streams and their latency now (call it before the players stop) and stops
    /// polling.
    pub fn finish(mut self) -> anyhow::Result<Vec<StreamFigures>> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let mut client = Client::connect(&self.socket)?;
        poll(&mut client, &self.seen, true)?;
        let Seen { streams, groups } = std::mem::take(&mut *self.seen.lock().expect("streams"));
        Ok(streams
            .into_values()
            .map(|stream| {
                let mine = groups.get(&stream.id).into_iter().flatten();
                let (mut service, mut queue) = (empty(), empty());
                let (mut requests, mut inversions) = (0, 0);
                for group in mine {
                    service.merge(&group.service);
                    queue.merge(&group.queue);
                    requests += group.requests;
                    inversions += group.inversions;
                }
                let ms = |h: &Log2Histogram, q: f64| h.quantile_us(q).map(us_to_ms);
                StreamFigures {
                    id: stream.id,
                    path: stream.path,
                    rate_bps: stream.rate.0,
                    buffer_bytes: stream.buffer.0,
                    misses: stream.misses,
                    seek_waits: stream.seek_waits,
                    raises: stream.raises,
                    prefetched_bytes: stream.prefetched_bytes,
                    suggestion: stream.suggestion,
                    requests,
                    inversions,
                    service_p99_ms: ms(&service, 0.99),
                    queue_p99_ms: ms(&queue, 0.99),
                    queue_max_ms: ms(&queue, 1.0),
                }
            })
            .collect())
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn empty() -> Log2Histogram {
    Log2Histogram::from_slots(&[], 0)
}

#[expect(clippy::cast_precision_loss, reason = "µs of a latency")]
fn us_to_ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Lists the streams, and with `latency` their latency groups, into `seen`.
fn poll(client: &mut Client, seen: &Mutex<Seen>, latency: bool) -> anyhow::Result<()> {
    let streams = client.list()?;
    let groups = if latency {
        Some(client.latency()?.1)
    } else {
        None
    };
    let mut seen = seen.lock().expect("streams");
    for stream in streams {
        seen.streams.insert(stream.id, stream);
    }
    if let Some(groups) = groups {
        let mut by_stream: BTreeMap<StreamId, Vec<LatencyGroup>> = BTreeMap::new();
        for group in groups {
            if let Some(stream) = group.stream {
                by_stream.entry(stream).or_default().push(group);
            }
        }
        // A stream's groups hold all its requests so far: the latest replace the last.
        seen.groups.extend(by_stream);
    }
    Ok(())
}

/// Appends to `text` the per-stream table of the rows that have streams: `intro` (the
/// paragraph and the table's head) and a line per stream, `| row | id | file | misses |
/// seek waits | raises | requests | inversions | service p99 | queue p99 | queue max | suggestion |`.
/// Nothing if no row has streams.
pub(crate) fn streams_table(
    text: &mut String,
    intro: &str,
    rows: &[(&str, Option<&[StreamFigures]>)],
) {
    use std::fmt::Write as _;
    if rows.iter().all(|(_, streams)| streams.is_none()) {
        return;
    }
    text.push_str(intro);
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), crate::report::ms);
    for (row, streams) in rows {
        for stream in streams.iter().copied().flatten() {
            let file = Path::new(&stream.path)
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            let _ = writeln!(
                text,
                "| {row} | {} | {file} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                stream.id,
                stream.misses,
                stream.seek_waits,
                stream.raises,
                stream.requests,
                stream.inversions,
                ms(stream.service_p99_ms),
                ms(stream.queue_p99_ms),
                ms(stream.queue_max_ms),
                stream.suggestion.as_deref().unwrap_or(""),
            );
        }
    }
}
