//! `abissd --metrics ADDR`, scraped by a real Prometheus server (Debian's `prometheus`, run
//! as a plain process with its own configuration and storage): a `PromQL` query over its HTTP
//! API returns a stream's misses as the daemon counts them, and a latency quantile that lies
//! in the daemon's own p99 bucket. The Grafana dashboard uses only names abissd exposes. The
//! endpoint answers `GET /metrics` only and bounds its clients, and a bad or busy address
//! stops abissd before it takes anything.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abiss_proto::{Log2Histogram, Operation};
use abiss_tests::http::{exchange, free_address, get, get_with, status_of};
use abiss_tests::{
    assert_fails, binary, chmod, require_root, wait_until, write_cold_file, Daemon, HddLab,
    LoopDevice, Scratch,
};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// One scrape of abissd.
fn scrape(address: SocketAddr) -> String {
    let (status, body) = get(address, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

/// The names of the samples in an exposition (`abiss_x_bucket`, not the family `abiss_x`).
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

/// A URL query component.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A Prometheus server scraping one target every second; killed, and its storage removed,
/// on drop.
struct Prometheus {
    child: Child,
    address: SocketAddr,
    dir: Scratch,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Self {
        assert!(
            Path::new(PROMETHEUS).exists(),
            "{PROMETHEUS} is missing: `cargo xtask setup` installs Debian's prometheus"
        );
        let dir = Scratch::new_in("/tmp", "prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: abiss\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write the configuration");
        let address = free_address();
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={address}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let server = Self {
            child,
            address,
            dir,
        };
        let ready = wait_until(Duration::from_secs(30), || {
            TcpStream::connect(address).is_ok() && get(address, "/-/ready").0 == 200
        });
        assert!(ready, "prometheus did not get ready: {}", server.log());
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// An HTTP API answer's `data`.
    fn api(&self, path: &str) -> serde_json::Value {
        let (status, body) = get(self.address, path);
        let answer: serde_json::Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {status} {body}"));
        assert_eq!(answer["status"], "success", "{path}: {body}");
        answer["data"].clone()
    }

    /// An instant `PromQL` query: each series' labels and value.
    fn query(&self, promql: &str) -> Vec<(serde_json::Value, f64)> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(promql)));
        data["result"]
            .as_array()
            .expect("a vector")
            .iter()
            .map(|series| {
                let value = series["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .expect("a value");
                (series["metric"].clone(), value)
            })
            .collect()
    }

    /// Waits up to 30 s for `promql` to give one series whose value `accept`s; returns it.
    fn wait_for(
        &self,
        promql: &str,
        mut accept: impl FnMut(f64) -> bool,
    ) -> (serde_json::Value, f64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = Vec::new();
        while Instant::now() < deadline {
            last = self.query(promql);
            if let [(labels, value)] = &last[..] {
                if accept(*value) {
                    return (labels.clone(), *value);
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let targets = self.api("/api/v1/targets");
        panic!(
            "{promql} gave {last:?}; targets {targets}; log {}",
            self.log()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kernel.bpf_stats_enabled` set for a while, put back on drop.
struct BpfStats {
    before: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn set(on: bool) -> Self {
        let before = std::fs::read_to_string(BPF_STATS).expect("read the sysctl");
        std::fs::write(BPF_STATS, if on { "1" } else { "0" }).expect("write the sysctl");
        Self { before }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(BPF_STATS, self.before.trim());
    }
}

/// The dashboard's panel queries, and its variables' queries (`label_values(…)`, which are
/// Grafana's, not `PromQL`).
fn dashboard_queries() -> (Vec<String>, Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/abiss.json");
    let text = std::fs::read_to_string(&path).expect("read the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            panels.push(target["expr"].as_str().expect("an expr").to_owned());
        }
    }
    assert!(panels.len() >= 8, "the dashboard has its panels");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .map(|v| v["definition"].as_str().expect("a definition").to_owned())
        .collect();
    (panels, variables)
}

/// Every `abiss_…` name in `queries`.
fn metric_names<'a>(queries: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for query in queries {
        for (at, _) in query.match_indices("abiss_") {
            let name: String = query[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The daemon's own p99 bucket of read service time on `device`, in seconds: `[low, high]`.
fn p99_bucket_seconds(daemon: &Daemon, device: abiss_proto::DeviceNumber) -> (f64, f64) {
    let mut merged = Log2Histogram::default();
    for group in daemon.connect().latency() {
        if group.device == device && group.operation == Operation::Read {
            merged.merge(&group.service);
        }
    }
    let total = merged.count();
    assert!(total > 0, "the reads were traced");
    let rank = (total * 99).div_ceil(100);
    let mut seen = 0;
    let index = merged
        .slots
        .iter()
        .position(|&count| {
            seen += count;
            seen >= rank
        })
        .expect("a bucket");
    let (low, high) = Log2Histogram::bucket_bounds_us(index);
    #[expect(clippy::cast_precision_loss, reason = "bucket bounds in seconds")]
    let bounds = (low as f64 / 1e6, high as f64 / 1e6);
    bounds
}

/// The stream's misses once the kernel's events of the reads have all arrived (the count
/// stays the same for a second).
fn settled_misses(daemon: &Daemon) -> u64 {
    let mut last = daemon.streams()[0].misses;
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
        let now = daemon.streams()[0].misses;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

fn device_number(name: &str) -> abiss_proto::DeviceNumber {
    std::fs::read_to_string(format!("/sys/class/block/{name}/dev"))
        .expect("read dev")
        .trim()
        .parse()
        .expect("major:minor")
}

fn device_name(path: &Path) -> String {
    path.file_name()
        .expect("a device name")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn prometheus_scrapes_a_streams_misses_and_a_latency_quantile() {
    require_root!();
    let lab = HddLab::up("metrics", 1, "none");
    let path: PathBuf = lab.mount().join("movie.bin");
    write_cold_file(&path, 24 << 20);
    let metrics = free_address();
    let daemon = Daemon::start_managing(lab.device(), &["--metrics", &metrics.to_string()]);
    let stream = daemon.attach_at_1mb(&path);
    // Reading far ahead of a 1 MB/s window makes the reads wait for the disk: misses.
    let mut file = std::fs::File::open(&path).expect("open");
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..12 {
        file.read_exact(&mut chunk).expect("read");
    }
    let misses = settled_misses(&daemon);
    assert!(misses > 0, "reading ahead of the window missed");

    let prometheus = Prometheus::start(metrics);
    let device = device_name(lab.device());
    let labels = format!(r#"stream="{stream}",device="{device}",uid="0""#);
    let (_, seen) = prometheus.wait_for(&format!("abiss_stream_misses_total{{{labels}}}"), |v| {
        v > 0.0
    });
    // The reader has stopped, so the count no longer moves: Prometheus has what abissd has.
    let expected = f64::from(u32::try_from(misses).expect("a count that fits"));
    assert!(
        (seen - expected).abs() < 0.5,
        "Prometheus has the daemon's count: {seen} against {misses}"
    );
    assert_eq!(daemon.streams()[0].misses, misses);

    let quantile = format!(
        r#"histogram_quantile(0.99, sum by (le) (abiss_block_service_seconds_bucket{{device="{device}",operation="read"}}))"#
    );
    let mut bucket = (0.0, 0.0);
    let (_, p99) = prometheus.wait_for(&quantile, |v| {
        bucket = p99_bucket_seconds(&daemon, device_number(&device));
        bucket.0 <= v && v <= bucket.1
    });
    eprintln!(
        "p99 read service time on {device}: {:.3} ms from Prometheus, in the daemon's bucket [{:.3}, {:.3}] ms; {misses} misses",
        p99 * 1e3,
        bucket.0 * 1e3,
        bucket.1 * 1e3
    );
    let up = prometheus.query("up");
    assert_eq!(up.len(), 1, "{up:?}");
    assert!((up[0].1 - 1.0).abs() < f64::EPSILON, "the target is up");

    // Every panel's query is PromQL this Prometheus accepts, with Grafana's variables set.
    for panel in &dashboard_queries().0 {
        let promql = panel
            .replace("$__rate_interval", "5s")
            .replace("$device", ".*");
        let _ = prometheus.query(&promql);
    }

    // The programs' run time shows only while the kernel counts it.
    let off = BpfStats::set(false);
    assert!(!scrape(metrics).contains("abiss_bpf_program"));
    drop(off);
    let _on = BpfStats::set(true);
    let exposed = sample_names(&scrape(metrics));
    // The reads above were accesses the loop handled: how late it was shows.
    assert!(
        exposed.contains("abiss_main_loop_late_seconds")
            && exposed.contains("abiss_main_loop_longest_turn_seconds"),
        "{exposed:?}"
    );
    let (panels, variables) = dashboard_queries();
    let missing: Vec<String> = metric_names(panels.iter().chain(&variables))
        .difference(&exposed)
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard uses names abissd does not expose: {missing:?}; it exposes {exposed:?}"
    );
}

#[test]
fn the_endpoint_answers_get_on_metrics_only_and_bounds_its_clients() {
    require_root!();
    let address = free_address();
    let _daemon = Daemon::start_with(&["--metrics", &address.to_string()]);
    let (status, body) = get(address, "/metrics");
    assert_eq!(status, 200);
    assert!(body.contains("abiss_daemon_cpu_seconds_total "), "{body}");
    assert_eq!(get(address, "/").0, 404);
    assert_eq!(get(address, "/metrics/x").0, 404);
    let (status, text) = exchange(
        address,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert!(text.contains("Allow: GET, HEAD\r\n"), "{text}");
    let (status, text) = exchange(address, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(text.ends_with("\r\n\r\n"), "HEAD has no body: {text}");
    assert_eq!(exchange(address, b"hello\r\n\r\n").0, 400);
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(16 << 10)
    );
    assert_eq!(exchange(address, huge.as_bytes()).0, 431);

    slow_clients_do_not_keep_a_scraper_out(address);
}

/// Clients that trickle their request heads, a byte every 100 ms, never finishing them (eight:
/// as many as there are slots). Before, they held every slot and a scraper was turned away
/// (503) until they timed out, and again as soon as they came back. Now a scraper that finds
/// every slot taken takes the slot of the one that has waited longest for its head (which is
/// answered 503), and those left are still let go after the read timeout (5 s) with 408.
fn slow_clients_do_not_keep_a_scraper_out(address: SocketAddr) {
    let started = Instant::now();
    let trickling: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(address).expect("connect");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
                .expect("send");
            stream
        })
        .collect();
    let writers: Vec<TcpStream> = trickling
        .iter()
        .map(|s| s.try_clone().expect("clone"))
        .collect();
    let trickle = std::thread::spawn(move || {
        // Until each is answered (its writes then fail) or 12 s have passed.
        let mut writers: Vec<Option<TcpStream>> = writers.into_iter().map(Some).collect();
        while started.elapsed() < Duration::from_secs(12) && writers.iter().any(Option::is_some) {
            for writer in &mut writers {
                // Once answered, it stops: a byte sent after the server closed would be
                // answered with a reset, which can take the unread answer with it.
                let go_on = writer
                    .as_mut()
                    .is_some_and(|w| !answered(w) && w.write_all(b"a").is_ok());
                if !go_on {
                    *writer = None;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    for scraper in 0..3 {
        let asked = Instant::now();
        let (status, body) = get(address, "/metrics");
        assert_eq!(
            status, 200,
            "scraper {scraper} was kept out by 8 trickling clients: {body}"
        );
        eprintln!("scraper {scraper} answered in {:?}", asked.elapsed());
    }
    let mut statuses = Vec::new();
    for mut stream in trickling {
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        statuses.push(status_of(&String::from_utf8_lossy(&answer)));
    }
    let waited = started.elapsed();
    trickle.join().expect("the trickling thread");
    // The first scraper took the oldest one's slot, and gave it back free for the next.
    assert_eq!(
        statuses,
        [503, 408, 408, 408, 408, 408, 408, 408],
        "the oldest gave way to a scraper, the others timed out"
    );
    assert!(
        waited >= Duration::from_secs(4) && waited < Duration::from_secs(12),
        "the slow clients were let go after the read timeout ({waited:?})"
    );
    assert_eq!(get(address, "/metrics").0, 200, "the slots are free again");
}

/// Whether the server has answered on `stream` or closed it (without waiting).
fn answered(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer that lives across the call, on an open socket.
    let peeked = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            std::ptr::addr_of_mut!(byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    peeked >= 0
}

#[test]
fn with_a_token_file_only_scrapes_that_show_the_token_are_answered() {
    require_root!();
    let dir = Scratch::new_in("/tmp", "metrics-token");
    let token = dir.path().join("token");
    std::fs::write(&token, "n0t-a-guess\n").expect("write the token");
    chmod(&token, 0o600);
    let address = free_address();
    let _daemon = Daemon::start_with(&[
        "--metrics",
        &address.to_string(),
        "--metrics-token-file",
        token.to_str().unwrap(),
    ]);
    let (status, text) = exchange(
        address,
        b"GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("WWW-Authenticate: Bearer"), "{text}");
    assert!(
        !text.contains("abiss_"),
        "no metric without the token: {text}"
    );
    for wrong in ["n0t-a-gues", "n0t-a-guess2", "N0T-A-GUESS", ""] {
        let header = format!("Authorization: Bearer {wrong}\r\n");
        assert_eq!(get_with(address, "/metrics", &header).0, 401, "{wrong:?}");
    }
    assert_eq!(
        get_with(
            address,
            "/metrics",
            "Authorization: Basic bjB0LWEtZ3Vlc3M=\r\n"
        )
        .0,
        401
    );
    let (status, body) = get_with(address, "/metrics", "authorization: bearer n0t-a-guess\r\n");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("abiss_daemon_cpu_seconds_total "), "{body}");
}

#[test]
fn a_bad_or_busy_metrics_address_stops_abissd_before_it_takes_anything() {
    require_root!();
    let dir = Scratch::new_in("/tmp", "metrics-bad");
    let socket = dir.path().join("abiss.sock");
    let disk = LoopDevice::new_in("/dev/shm", 16);
    disk.set_scheduler("none");
    let run_with = |address: &str, more: &[&str]| {
        Command::new(binary("abissd"))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--device")
            .arg(disk.path())
            .args(["--metrics", address])
            .args(more)
            .output()
            .expect("run abissd")
    };
    let run = |address: &str| run_with(address, &[]);
    assert_fails(&run("localhost:9565"), 2, "is not an IP address and port");
    assert_fails(&run("127.0.0.1:0"), 2, "port 0");

    let busy = TcpListener::bind("127.0.0.1:0").expect("take a port");
    let address = busy.local_addr().expect("its address").to_string();
    assert_fails(&run(&address), 19, "the port is in use");
    // Root's view of every stream stays on loopback unless the operator says otherwise.
    let free = free_address().port();
    for anywhere in [format!("0.0.0.0:{free}"), format!("[::]:{free}")] {
        assert_fails(&run(&anywhere), 19, "is not a loopback address");
    }
    assert_fails(
        &run_with("192.0.2.1:9565", &["--metrics-remote"]),
        19,
        "no interface of this machine",
    );
    // A token others may read is anyone's.
    let token = dir.path().join("token");
    std::fs::write(&token, "n0t-a-guess\n").expect("write the token");
    chmod(&token, 0o644);
    let with_token = ["--metrics-token-file", token.to_str().unwrap()];
    assert_fails(
        &run_with(&free_address().to_string(), &with_token),
        19,
        "other users",
    );

    // Nothing was taken: no socket, and the disk keeps its elevator.
    assert!(!socket.exists(), "no control socket was made");
    let scheduler = std::fs::read_to_string(format!("/sys/block/{}/queue/scheduler", disk.name()))
        .expect("read the scheduler");
    assert!(
        scheduler.contains("[none]"),
        "the disk was left alone: {scheduler}"
    );
}
