//! `abissctl`: the ABISS command line.
//!
//! It talks to abissd only through the protocol (`abiss-proto`, via `abiss-client`) and never
//! links aya or the eBPF side. The one thing it does without the daemon is `profile`, which
//! reads a disk itself and has `abiss-model` fit the model; `doctor` asks the kernel what it
//! allows through `abiss-kernel`, the probes abissd makes.
//!
//! The command line is a library so that its clap definition ([`cli::Cli`]) is one value that
//! both the binary (`src/main.rs`) and `cargo xtask man` (man pages, shell completions) use.
//!
//! | concern | module |
//! | --- | --- |
//! | arguments, subcommands, dispatch | `cli` |
//! | block device names as users type them: `loop0`, `/dev/loop0`, `7:0` | `devices` |
//! | `doctor`: what this machine allows abiss, and whether it can serve a path | `doctor` |
//! | the kernel's parts, cgroups, device mapper, md and elevators, for `doctor` | `doctor::kernel` |
//! | a path's file system, stack and serving disk, for `doctor` | `doctor::path` |
//! | mountinfo and the sysfs block stack (partitions, dm, md, loop, btrfs members) | `doctor::stack` |
//! | errors and their exit codes | `error` |
//! | `admit`: capacity planning answered by abissd's admission control; nothing is attached | `planning` |
//! | `profile`: measuring a disk with `O_DIRECT` and fitting its model | `profile` |
//! | what `profile` prints without `--json` | `profile::report` |
//! | `record`: standard input written to a file past the page cache at a guaranteed rate | `record` |
//! | sizes and rates as people read them (`5.88GiB`, `1MB/s`) | `sizes` |
//! | `stats`: what the eBPF programs and the daemon cost | `stats` |
//! | `attach`, `detach`, `run`, `list`: streams | `streams` |
//! | `status`: the daemon's figures and managed devices | `status` |
//! | `top`: a live view of the streams and the managed disks | `top` |
//! | what `top` draws | `top::view` |
//! | `trace`: live latency by device, operation and I/O priority, or by stream | `trace` |

pub mod cli;
mod devices;
mod doctor;
mod error;
mod interval;
mod json;
mod planning;
mod profile;
mod record;
mod sizes;
mod stats;
mod status;
mod streams;
mod top;
mod trace;
