//! The protocol fuzzer: hostile requests and descriptor sets from an unprivileged user, through
//! the real socket of a real abissd that manages a real (loop) disk.
//!
//! cargo-fuzz needs a nightly compiler, which this project does not use, so the generator is
//! proptest's: well-formed requests with hostile numbers, other versions, unknown kinds, random
//! JSON, truncated lines, lines over [`MAX_LINE_BYTES`], raw bytes, deep nesting, and 0 to 12
//! descriptors per message (regular file, directory, `O_PATH` of a file `nobody` may not read,
//! of a directory and of a file on the managed disk, pipe, socket, /dev/null, a file on the
//! managed disk, a file on another disk, a TCP socket with unsent data and `SO_LINGER`, FIFOs:
//! opened both ways, each end alone, and one with no writer, memfd, a FUSE file whose flushes
//! are answered after 200 ms, a pseudo-terminal, eventfd, pidfd: `abiss-fuzz-client` lists
//! them), over several connections at once. The test (root) generates each case;
//! `abiss-fuzz-client`, run as `nobody`, sends it; then the test checks the daemon as root:
//! - it is alive, and answers root's `status` within 1 s; and, asked every 50 ms from
//!   another thread through the whole run, within [`STATUS_BOUND`] every time;
//! - once the case's connections are gone (and streams they left on purpose, persistent ones,
//!   are detached), its descriptors and threads are back to where they were, and it locks no
//!   memory; at the end the kernel maps of streams and raises are empty.
//!
//! Before the generated cases, each kind that can never be a stream's is handed over alone with
//! a well-formed attach, and must get one plain error and nothing else; after them, a file on a
//! FUSE file system whose flushes are never answered is handed over: root's `status` is
//! answered within [`STATUS_BOUND`] while abissd's close of it waits (a close on the loop would
//! hold it until the server is gone).
//!
//! A failing case is shrunk and its seed kept in `fuzz_protocol.proptest-regressions` next to
//! this file, which proptest replays first on every run; the hand-written hostile lines of
//! `tests/fuzz-corpus/*.line` are replayed every run too (each once bare, once with 9
//! descriptors). `ABISS_FUZZ_CASES` sets the number of generated cases (default 500; each run
//! draws new ones, so CI runs add up to far more).

use std::cell::RefCell;
use std::time::Instant;

use abiss_proto::{Envelope, Request, Response, PROTOCOL_VERSION};
use abiss_tests::{require_root, Daemon};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestRunner};
use serde_json::json;

// A test file is the root of its crate, so its modules are found beside it unless named.
#[path = "fuzz_protocol/generator.rs"]
mod generator;
#[path = "fuzz_protocol/harness.rs"]
mod harness;

use generator::{case, corpus_cases, request};
use harness::{bad_hand_overs, footprint, quantile, Harness, StatusProbe};

/// The longest root's `status` may take, asked every 50 ms on a new connection from another
/// thread for the whole run ([`StatusProbe`]): a debug build, on a machine of 2 CPUs that
/// other test runs and builds share.
const STATUS_BOUND: std::time::Duration = std::time::Duration::from_secs(1);

/// One message: bytes, and the kinds of the descriptors sent with them.
#[derive(Clone)]
struct Message {
    bytes: Vec<u8>,
    fds: Vec<&'static str>,
}

/// The bytes as text, long runs cut short: a failing case is printed, and kept with its seed
/// in the regressions file, in a readable size.
impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.bytes);
        let shown: String = if text.chars().count() > 240 {
            let head: String = text.chars().take(160).collect();
            let tail: String = text.chars().skip(text.chars().count() - 60).collect();
            format!("{head}…{tail}")
        } else {
            text.into_owned()
        };
        write!(
            f,
            "{} bytes {shown:?} with fds {:?}",
            self.bytes.len(),
            self.fds
        )
    }
}

/// One hostile connection: its messages, and whether it hangs up at once after them (rather
/// than shutting its sending side and reading the answers).
#[derive(Clone, Debug)]
struct HostileConnection {
    messages: Vec<Message>,
    hang_up: bool,
}

fn generated_cases() -> u32 {
    std::env::var("ABISS_FUZZ_CASES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(500)
}

#[test]
fn hostile_requests_and_descriptors_never_crash_stall_or_leak() {
    require_root!();
    // proptest's strategy trees of this size, unoptimised, outgrow a test thread's 2 MiB
    // stack; an overflow aborts the process, which would leave the daemon and the disk behind.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(fuzz)
        .expect("spawn the fuzzer")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

fn fuzz() {
    let started = Instant::now();
    let harness = RefCell::new(Harness::new());
    harness.borrow_mut().the_checks_see_a_held_connection();
    let device = harness.borrow().targets.managed.device().name();
    let probe = StatusProbe::start(harness.borrow().daemon.socket());

    harness.borrow_mut().the_hand_over_check_sees_an_attach();
    for kind in bad_hand_overs() {
        harness.borrow_mut().hand_over(kind);
    }

    for (label, case) in corpus_cases(&device) {
        if let Err(failure) = harness.borrow_mut().check(&case) {
            harness
                .borrow_mut()
                .totals
                .failures
                .push(format!("corpus {label}: {failure}"));
        }
    }
    let corpus = harness.borrow().totals.cases;

    let mut runner = TestRunner::new(Config {
        cases: generated_cases(),
        max_shrink_iters: 64,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    });
    let generated = runner.run(&case(&device), |case| {
        harness
            .borrow_mut()
            .check(&case)
            .map_err(TestCaseError::fail)
    });
    if let Err(failure) = generated {
        harness
            .borrow_mut()
            .totals
            .failures
            .push(format!("generated: {failure}"));
    }

    let mut harness = harness.into_inner();
    harness.a_fuse_file_whose_flush_never_answers();
    let took = probe.finish();
    let end = final_state(&harness.daemon);
    let totals = &harness.totals;
    println!(
        "fuzz_protocol: {} cases ({corpus} corpus replays, {} generated incl. shrinking), {} connections, {} answers, {} streams attached, {} descriptors sent, {} persistent streams detached by root, {} crashes, {:.0} s",
        totals.cases,
        totals.cases - corpus,
        totals.connections,
        totals.answers,
        totals.attached,
        totals.fds_sent,
        totals.persistent_detached,
        totals.crashes,
        started.elapsed().as_secs_f64()
    );
    println!("fuzz_protocol: at the end {end}");
    status_was_prompt(&took);
    assert_eq!(totals.crashes, 0, "abissd died: {:#?}", totals.failures);
    assert!(totals.failures.is_empty(), "{:#?}", totals.failures);
    assert!(harness.daemon.streams().is_empty(), "no stream is left");
    assert_eq!(
        harness.daemon.stop(),
        Some(0),
        "abissd stops cleanly after it all"
    );
}

/// Root's `status` asked through the run (`took`, fastest first) was answered within
/// [`STATUS_BOUND`] every time: asserted, and its quantiles printed.
fn status_was_prompt(took: &[std::time::Duration]) {
    let slowest = quantile(took, 1.0);
    println!(
        "fuzz_protocol: root's status, asked {} times through the run: p50 {:?}, p99 {:?}, max {slowest:?}",
        took.len(),
        quantile(took, 0.5),
        quantile(took, 0.99)
    );
    assert!(
        slowest <= STATUS_BOUND,
        "root's status took {slowest:?} at its slowest"
    );
}

/// No stream, nothing locked, no raised reader: asserted, and described for the report.
fn final_state(daemon: &Daemon) -> String {
    let mut root = daemon.connect();
    let Response::Devices(status) = root.call(Request::Status) else {
        panic!("status");
    };
    let streams = daemon.streams().len();
    assert_eq!(streams, 0, "streams left");
    assert_eq!(status.memory.locked_bytes, 0, "memory still locked");
    assert_eq!(status.raises.active, 0, "readers still raised");
    let fp = footprint(daemon.pid()).expect("footprint");
    // The kernel maps that hold streams and raises are empty again.
    for map in ["ATTACHED", "RAISED", "RAISE_COUNTS"] {
        let left = abiss_tests::daemon_map_dump(daemon.pid(), map);
        assert!(left.is_empty(), "{map} still holds {left:?}");
    }
    format!(
        "{streams} streams, {} B locked (VmLck {} kB), {} raised readers, {} descriptors, {} threads",
        status.memory.locked_bytes, fp.locked_kib, status.raises.active, fp.fds, fp.threads
    )
}

/// Keeps [`Envelope`] in view: the generator writes its JSON by hand so that it can also
/// write what no `Envelope` can hold; this checks that the hand-written form is the real one.
#[test]
fn the_generators_well_formed_lines_decode_as_envelopes() {
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&request("loop0"), |request| {
            let line = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
            // Admit plans with an unknown mode are meant not to decode; every other generated
            // request must, or the fuzzer would stop at the decoder.
            let decoded = abiss_proto::decode_line::<Envelope>(line.as_bytes());
            let meant_to_fail = request["mode"] == json!("bogus");
            prop_assert!(decoded.is_ok() || meant_to_fail, "{line}: {decoded:?}");
            Ok(())
        })
        .expect("well-formed lines decode");
}
