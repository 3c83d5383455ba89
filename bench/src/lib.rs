//! The benchmark harness behind the `abiss-bench` binary: configurations (elevator, reader
//! I/O class, hooks for ABISS rows), the real-time readers and the copy loop, runs on a
//! private lab disk, and the reports. Needs root and Linux 6.x (tested on 6.18).
//!
//! A benchmark error is reported, not handled, so this harness uses `anyhow` throughout.
//! Every benchmark runs on a lab disk or a loop device over memory, never on one of the
//! machine's disks. abissd runs as its own process from the built binary, driven through
//! `abiss-client` (and, in some benchmarks, `abissctl`): the harness links neither the daemon
//! nor aya.
//!
//! | concern | module |
//! | --- | --- |
//! | what a benchmark compares: elevator, readers' I/O class, hooks around runs and readers | [`configuration`] |
//! | the ABISS rows: abissd manages the lab disk and attaches each reader's file | [`abiss`] |
//! | one run: N readers and the copy on the lab disk, from a cold page cache | [`trial`] |
//! | the two loads: paced real-time readers and the best-effort copy loop | [`workload`] |
//! | fio behind the players and recording loads: lay out, run, add up its report | [`fio`] |
//! | programs started in a group of their own: reaping with CPU time, the tail of stderr | [`process`] |
//! | the readers' schedule and deadlines (pure) | [`schedule`] |
//! | where the files sit on the lab disk, and making them | [`layout`] |
//! | the private lab disk with ext4, taken down on drop | [`lab_disk`] |
//! | I/O priority classes as configurations name them (`rt/4`, `be/7`, `idle`) | [`ioprio`] |
//! | Ctrl-C and SIGTERM: stop early, clean up | [`interrupt`] |
//! | read latency distributions and percentiles | [`latency`] |
//! | repeated runs of a step: the mean and its 95 % interval (pure) | [`repeats`] |
//! | throughput and device activity over a window (pure) | [`throughput`] |
//! | the ABISS slides' reference measurement | [`reference`](mod@reference) |
//! | the saturation sweep: more readers until deadlines are missed | [`sweep`] |
//! | the tracer's own cost (fio on loop devices over memory), per situation | [`overhead`] |
//! | an empty BPF program: the floor of the kernel's BPF statistics | [`empty_program`] |
//! | raise latency: from a page-cache miss to the raised priority | [`raises`] |
//! | admission control's predictions against measured misses | [`admission`] |
//! | zero-miss streams against the locked-memory budget the buffers come from | [`memory`] |
//! | real, unmodified players (GStreamer, ffmpeg, mpv) under a seeky best-effort load | [`players`] |
//! | real recorders (ffmpeg, GStreamer, the test recorder) next to players under a best-effort writer, per file system | [`recording`] |
//! | the soak: attach/detach cycles by four users, abissd killed on the way, what is left | [`soak`] |
//! | the one kind of benchmark row, and `--rows` | [`row`] |
//! | results as JSON, Markdown and a chart under `bench/results/`, through one writer | [`report`] |
//! | SVG charts of the results | [`chart`] |

#![deny(missing_docs)]

pub mod abiss;
pub mod admission;
pub mod chart;
pub mod configuration;
pub mod cpu;
pub mod daemon;
pub mod empty_program;
pub mod fio;
pub mod interrupt;
pub mod ioprio;
pub mod lab_disk;
pub mod latency;
pub mod layout;
pub mod memory;
pub mod overhead;
pub mod players;
pub mod process;
pub mod raises;
pub mod recording;
pub mod reference;
pub mod repeats;
pub mod report;
pub mod request_trace;
pub mod row;
pub mod schedule;
pub mod soak;
pub mod sweep;
pub mod throughput;
pub mod trial;
pub mod workload;
