//! The protocol fuzzer's generator: proptest strategies for hostile lines, descriptor sets and
//! connections, and the hand-written corpus of `tests/fuzz-corpus/*.line`.

use std::path::{Path, PathBuf};

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

use abiss_proto::{MAX_LINE_BYTES, PROTOCOL_VERSION};

use super::{HostileConnection, Message};

/// Kinds of descriptor a message may carry (`abiss-fuzz-client` opens them).
pub(super) const FD_KINDS: [&str; 21] = [
    "file",
    "directory",
    "opath",
    "pipe",
    "socket",
    "null",
    "managed",
    "other_disk",
    "linger",
    "fifo",
    "fifo_read",
    "fifo_write",
    "fifo_no_writer",
    "memfd",
    "sealed_ring",
    "fuse",
    "tty",
    "eventfd",
    "pidfd",
    "opath_dir",
    "opath_managed",
];

/// Numbers a hostile client would try: the edges of every integer type, and anything.
fn hostile_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1u64),
        Just(4096u64),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) + 1),
        Just(i64::MAX as u64),
        Just(u64::MAX - 1),
        Just(u64::MAX),
        1u64..(1 << 32),
        any::<u64>(),
    ]
}

fn hostile_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1u32),
        Just(20u32),
        Just(10_000u32),
        Just(10_001u32),
        Just(u32::MAX),
        any::<u32>(),
    ]
}

/// A request of a kind the daemon knows, with hostile parameters, as JSON.
pub(super) fn request(device: &str) -> impl Strategy<Value = Value> {
    let devices = prop_oneof![
        Just(device.to_owned()),
        Just(format!("/dev/{device}")),
        Just("7:0".to_owned()),
        Just("../../../etc/passwd".to_owned()),
        Just(String::new()),
        "[a-z0-9:/.]{0,40}",
    ];
    prop_oneof![
        1 => Just(json!({"kind": "hello"})),
        1 => Just(json!({"kind": "latency"})),
        1 => Just(json!({"kind": "events"})),
        1 => Just(json!({"kind": "list"})),
        1 => Just(json!({"kind": "status"})),
        // Windows the daemon honours are short here: a valid 60 s window is answered after
        // 60 s, which is no fault.
        1 => prop_oneof![Just(0u64), 1u64..200, Just(60_001), Just(u64::MAX)]
            .prop_map(|window_ms| json!({"kind": "stats", "window_ms": window_ms})),
        // Sane figures most of the time, so that attaches get past the checks to the streams
        // (a stream is what the other requests can then steer).
        3 => prop_oneof![
            3 => (1_000u64..4_000_000, 4_096u64..(8 << 20), 1u32..64, 0u8..8),
            1 => (hostile_u64(), hostile_u64(), hostile_u32(), any::<u8>()),
        ]
        .prop_flat_map(|parameters| (Just(parameters), any::<bool>()))
        .prop_map(|((rate, buffer, batch_pages, priority), persistent)| json!({
            "kind": "attach", "rate": rate, "buffer": buffer, "batch_pages": batch_pages,
            "priority": priority, "persistent": persistent,
        })),
        1 => prop_oneof![
            hostile_u64().prop_map(|id| json!({"id": id})),
            (hostile_u32(), hostile_u32(), hostile_u64()).prop_map(|(major, minor, inode)| {
                json!({"file": {"device": {"major": major, "minor": minor}, "inode": inode}})
            }),
        ]
        .prop_map(|target| json!({"kind": "detach", "target": target})),
        // A recorder's ring for a stream of this run (most of them) or any other; the
        // session passes a memfd with it, the framed lines any descriptor.
        1 => prop_oneof![0u64..2000, hostile_u64()]
            .prop_map(|stream| json!({"kind": "lock_ring", "stream": stream})),
        // Stream ids are small and counted up: most of these name a stream of this run.
        2 => (
            prop_oneof![0u64..2000, hostile_u64()],
            hostile_u64(),
            proptest::option::of(hostile_u64())
        )
            .prop_map(|(stream, offset, at_ns)| json!({
                "kind": "position", "stream": stream, "offset": offset, "at_ns": at_ns,
            })),
        1 => (
            devices,
            hostile_u64(),
            hostile_u64(),
            hostile_u64(),
            proptest::option::of(hostile_u32()),
            proptest::option::of(hostile_u32()),
            prop_oneof![
                Just(Value::Null),
                Just(json!("deterministic")),
                Just(json!("statistical")),
                Just(json!("off")),
                Just(json!("bogus")),
            ],
            any::<bool>(),
        )
            .prop_map(
                |(device, rate, rate_stdev, buffer, batch_pages, count, mode, write)| json!({
                    "kind": "admit", "device": device, "rate": rate, "rate_stdev": rate_stdev,
                    "buffer": buffer, "batch_pages": batch_pages, "count": count,
                    "mode": mode, "write": write,
                })
            ),
    ]
}

/// Any JSON, nested a little.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,20}".prop_map(Value::String),
        prop_oneof![
            Just("kind"),
            Just("version"),
            Just("request"),
            Just("attach")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            vec(
                (
                    prop_oneof![
                        Just("kind".to_owned()),
                        Just("version".to_owned()),
                        Just("request".to_owned()),
                        "[a-z_]{0,10}",
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// Number literals that JSON allows and no field of the protocol fits, or that fit barely.
fn number_literal() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(vec![
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999999999999999999",
        "-1",
        "-9223372036854775809",
        "1e400",
        "-0",
        "0.5",
        "1E2",
        "4294967296",
        "255",
        "256",
        "00",
        "NaN",
        "Infinity",
    ])
}

/// A well-formed request with one numeric field replaced by a literal of [`number_literal`].
fn huge_numbers() -> impl Strategy<Value = Vec<u8>> {
    let templates = proptest::sample::select(vec![
        r#"{"version":N,"request":{"kind":"hello"}}"#,
        r#"{"version":5,"request":{"kind":"stats","window_ms":N}}"#,
        r#"{"version":5,"request":{"kind":"position","stream":1,"offset":N,"at_ns":N}}"#,
        r#"{"version":5,"request":{"kind":"position","stream":N,"offset":0}}"#,
        r#"{"version":5,"request":{"kind":"detach","target":{"id":N}}}"#,
        r#"{"version":5,"request":{"kind":"attach","rate":N,"buffer":65536,"batch_pages":1,"priority":0,"persistent":false}}"#,
        r#"{"version":5,"request":{"kind":"attach","rate":1000,"buffer":N,"batch_pages":N,"priority":N,"persistent":false}}"#,
        r#"{"version":5,"request":{"kind":"admit","device":"loop0","rate":N,"buffer":N,"count":N,"mode":null}}"#,
    ]);
    (templates, number_literal())
        .prop_map(|(template, number)| format!("{}\n", template.replace('N', number)).into_bytes())
}

/// Lines around [`MAX_LINE_BYTES`]: a long string in a valid request, or plain spaces (valid
/// JSON whitespace), with or without the newline.
fn oversized() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(MAX_LINE_BYTES - 1),
            Just(MAX_LINE_BYTES),
            Just(MAX_LINE_BYTES + 1),
            MAX_LINE_BYTES..MAX_LINE_BYTES + 20_000,
            Just(4 * MAX_LINE_BYTES),
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(length, inside_a_string, newline)| {
            // A long string in a valid request, or plain spaces (valid JSON whitespace).
            let mut line = if inside_a_string {
                let head = format!(
                    r#"{{"version":{PROTOCOL_VERSION},"request":{{"kind":"admit","device":""#
                );
                let mut line = head.into_bytes();
                line.resize(length.max(line.len()), b'a');
                line
            } else {
                vec![b' '; length]
            };
            if newline {
                line.push(b'\n');
            }
            line
        })
}

/// Arrays or objects nested up to 2000 deep.
fn nested() -> impl Strategy<Value = Vec<u8>> {
    (1usize..2000, any::<bool>()).prop_map(|(depth, objects)| {
        let (open, close) = if objects {
            (r#"{"a":"#, "}")
        } else {
            ("[", "]")
        };
        format!("{}{}\n", open.repeat(depth), close.repeat(depth)).into_bytes()
    })
}

/// One line, hostile in one of many ways.
fn line(device: &str) -> impl Strategy<Value = Vec<u8>> {
    let well_formed = request(device).prop_map(|request| {
        let mut line = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
        line.push('\n');
        line.into_bytes()
    });
    let other_version = (
        prop_oneof![
            Just(json!(0)),
            Just(json!(PROTOCOL_VERSION - 1)),
            Just(json!(PROTOCOL_VERSION + 1)),
            Just(json!(u32::MAX)),
            Just(json!(-1)),
            Just(json!(4.5)),
            Just(json!("4")),
            Just(Value::Null),
        ],
        request(device),
    )
        .prop_map(|(version, request)| {
            format!("{}\n", json!({"version": version, "request": request})).into_bytes()
        });
    let unknown_kind = prop_oneof![
        Just(json!("Hello")),
        Just(json!("HELLO")),
        Just(json!("")),
        Just(json!(7)),
        Just(Value::Null),
        "[a-z_]{1,16}".prop_map(Value::String),
    ]
    .prop_flat_map(|kind| {
        prop_oneof![
            Just(json!(PROTOCOL_VERSION)),
            Just(json!(PROTOCOL_VERSION + 1))
        ]
        .prop_map(move |version| {
            format!(
                "{}\n",
                json!({"version": version, "request": {"kind": kind}})
            )
            .into_bytes()
        })
    });
    let truncated = (
        request(device),
        any::<proptest::sample::Index>(),
        any::<bool>(),
    )
        .prop_map(|(request, cut, newline)| {
            let full = json!({"version": PROTOCOL_VERSION, "request": request}).to_string();
            let mut line = full.as_bytes()[..cut.index(full.len())].to_vec();
            if newline {
                line.push(b'\n');
            }
            line
        });
    prop_oneof![
        8 => well_formed,
        1 => other_version,
        1 => unknown_kind,
        1 => json_value().prop_map(|value| format!("{value}\n").into_bytes()),
        1 => truncated,
        1 => oversized(),
        1 => vec(any::<u8>(), 0..300),
        1 => huge_numbers(),
        1 => nested(),
    ]
}

/// The descriptors sent with one message: mostly none or one, sometimes up to 12.
fn fd_set() -> impl Strategy<Value = Vec<&'static str>> {
    // A file on the managed disk as often as all others together: what an attach needs.
    let kind = prop_oneof![
        1 => proptest::sample::select(FD_KINDS.to_vec()),
        1 => Just("managed"),
    ];
    prop_oneof![
        3 => Just(Vec::new()),
        3 => vec(kind.clone(), 1..=1),
        2 => vec(kind, 2..=12),
    ]
}

/// One connection: hostile lines framed into messages at random, or a client's session of
/// well-formed requests with hostile figures.
fn connection(device: &str) -> impl Strategy<Value = HostileConnection> {
    prop_oneof![
        2 => framed_at_random(device),
        1 => client_session(device),
    ]
}

/// Lines cut into messages at random places, or one line per message, each message with a
/// descriptor set.
fn framed_at_random(device: &str) -> impl Strategy<Value = HostileConnection> {
    let lines = vec(line(device), 1..5);
    let cuts = vec((1usize..3000, fd_set()), 1..5);
    (lines, cuts, any::<bool>(), any::<bool>()).prop_map(|(lines, cuts, per_line, hang_up)| {
        let messages = if per_line {
            let sets = cuts
                .into_iter()
                .map(|(_, fds)| fds)
                .chain(std::iter::repeat(Vec::new()));
            lines
                .into_iter()
                .zip(sets)
                .filter(|(bytes, _)| !bytes.is_empty())
                .map(|(bytes, fds)| Message { bytes, fds })
                .collect()
        } else {
            split(&lines.concat(), cuts)
        };
        HostileConnection { messages, hang_up }
    })
}

/// Well-formed requests one per message, an attach with a file of the managed disk as a
/// client sends it: streams come to be, for the other requests to steer and end.
fn client_session(device: &str) -> impl Strategy<Value = HostileConnection> {
    (vec(request(device), 1..8), any::<bool>()).prop_map(|(requests, hang_up)| {
        let messages = requests
            .into_iter()
            .map(|request| {
                let fds = if request["kind"] == json!("attach") {
                    vec!["managed"]
                } else if request["kind"] == json!("lock_ring") {
                    vec!["sealed_ring"]
                } else {
                    Vec::new()
                };
                let line = json!({"version": PROTOCOL_VERSION, "request": request});
                Message {
                    bytes: format!("{line}\n").into_bytes(),
                    fds,
                }
            })
            .collect();
        HostileConnection { messages, hang_up }
    })
}

/// `bytes` cut into messages of the cuts' sizes (the last takes the rest).
fn split(bytes: &[u8], cuts: Vec<(usize, Vec<&'static str>)>) -> Vec<Message> {
    let mut messages = Vec::new();
    let mut rest = bytes;
    let count = cuts.len();
    for (index, (size, fds)) in cuts.into_iter().enumerate() {
        if rest.is_empty() {
            break;
        }
        let take = if index + 1 == count {
            rest.len()
        } else {
            size.min(rest.len())
        };
        messages.push(Message {
            bytes: rest[..take].to_vec(),
            fds,
        });
        rest = &rest[take..];
    }
    messages
}

/// A case: a few connections at once.
pub(super) fn case(device: &str) -> impl Strategy<Value = Vec<HostileConnection>> {
    vec(connection(device), 1..4)
}

// ---------------------------------------------------------------------------------------------
// The test.

/// The hand-written hostile lines, each replayed bare, with one descriptor of a file on the
/// managed disk (for their attach requests), and with 9 descriptors. `@DEVICE@` in a line
/// stands for the managed disk's name.
pub(super) fn corpus_cases(device: &str) -> Vec<(String, Vec<HostileConnection>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz-corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "line"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *.line in {}", dir.display());
    let mut cases = Vec::new();
    for path in files {
        let text = std::fs::read(&path).expect("read corpus line");
        let bytes = replace(&text, b"@DEVICE@", device.as_bytes());
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for fds in [Vec::new(), vec!["managed"], vec!["null"; 9]] {
            let label = format!("{name} with {} descriptors", fds.len());
            let message = Message {
                bytes: bytes.clone(),
                fds,
            };
            let connection = HostileConnection {
                messages: vec![message],
                hang_up: false,
            };
            cases.push((label, vec![connection]));
        }
    }
    cases
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        if rest.starts_with(from) {
            out.extend_from_slice(to);
            rest = &rest[from.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}
