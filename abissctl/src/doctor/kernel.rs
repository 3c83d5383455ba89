//! What this kernel allows abiss, each part with why it matters: BTF and the block programs'
//! fields, the optional parts' tracepoints (the `tp_btf` hooks, probed as `abissd` probes them,
//! through `abiss-kernel`), `io_uring`, I/O priorities, the cgroup controllers, device mapper
//! and md, and the elevators each disk offers. Reads only what every user may read.

use std::path::Path;

use abiss_kernel::capabilities::Feature;
use abiss_kernel::layout::{self, KERNEL_BTF};
use abiss_proto::Capability;

use super::{Finding, State};

/// The kernel findings; `daemon` is what a running abissd says of its optional parts.
pub(super) fn findings(daemon: Option<&[Capability]>, root: bool) -> Vec<Finding> {
    let mut out = vec![Finding::info(
        "kernel",
        format!("Linux {}", layout::kernel_release()),
    )];
    out.extend(btf_and_parts(daemon, root));
    out.push(io_uring());
    out.push(ioprio());
    out.extend(cgroups());
    out.extend(stacking());
    out.push(Finding::info(
        "debugfs",
        "not needed: abissd reads the driver's tag depth there and mounts it privately, in a \
         mount namespace of its own, when it is not mounted; doctor reads nothing there",
    ));
    out.extend(elevators(Path::new("/sys/block")));
    out
}

/// The kernel's BTF is there.
fn btf_there() -> Finding {
    Finding::new(
        "btf",
        State::Yes,
        format!("{KERNEL_BTF}: abissd reads its programs' struct offsets from it"),
    )
}

/// BTF, the block programs' fields, and each optional part.
fn btf_and_parts(daemon: Option<&[Capability]>, root: bool) -> Vec<Finding> {
    let (support, stand_ins) = match layout::probe(Path::new(KERNEL_BTF)) {
        Ok(found) => found,
        Err(error @ layout::LayoutError::Missing { .. }) => {
            return vec![
                btf_there(),
                Finding::new(
                    "block programs",
                    State::No,
                    format!("{error}: abissd cannot run here"),
                ),
            ];
        }
        Err(error) => {
            return vec![Finding::new(
                "btf",
                State::No,
                format!("{error}: abissd cannot run here"),
            )];
        }
    };
    let mut out = vec![
        btf_there(),
        Finding::new(
            "block programs",
            State::Yes,
            "the request, bio and queue fields the required block tracepoint programs read are there (Linux 5.15)",
        ),
    ];
    for feature in Feature::ALL {
        let missing = support.missing.iter().find(|(f, _)| *f == feature);
        let from_daemon = daemon.and_then(|parts| parts.iter().find(|c| c.name == feature.name()));
        out.push(part(
            feature,
            missing.map(|(_, why)| why.as_str()),
            stand_ins.contains(&feature),
            from_daemon,
            root,
        ));
    }
    out
}

/// One optional part: what the kernel has, and what a running abissd made of it.
fn part(
    feature: Feature,
    missing: Option<&str>,
    stand_in: bool,
    daemon: Option<&Capability>,
    root: bool,
) -> Finding {
    let topic = format!("part {}", feature.name());
    let kernel = feature.report(missing);
    let daemon_says =
        daemon.map(
            |capability| match (&capability.off_because, &capability.stand_in) {
                (None, None) => "; abissd has it on".to_owned(),
                (None, Some(how)) => format!("; abissd: on ({how})"),
                (Some(why), _) => format!("; abissd has it OFF: {why}"),
            },
        );
    let daemon_off = daemon.is_some_and(|capability| !capability.on);
    let tail = daemon_says.unwrap_or_default();
    match missing {
        None if daemon_off => Finding::new(topic, State::Off, format!("the kernel has {} ({}){tail}", kernel.needs, kernel.gives)),
        None => Finding::new(topic, State::Yes, format!("{} ({}){tail}", kernel.gives, kernel.needs)),
        // Other users see kallsyms with its addresses zeroed (kptr_restrict).
        Some(why) if !root && why.contains("kallsyms") => Finding::new(
            topic,
            State::Unknown,
            format!("cannot tell as a user other than root: /proc/kallsyms hides its addresses; it needs {}{tail}", kernel.needs),
        ),
        Some(_) => {
            let stand = feature
                .stand_in()
                .filter(|_| stand_in)
                .map(|(_, does)| format!("; abissd stands in: {does}"))
                .unwrap_or_default();
            Finding::new(
                topic,
                State::No,
                format!("{}{stand} (needs {}){tail}", kernel.off_because.unwrap_or_default(), kernel.needs),
            )
        }
    }
}

/// `io_uring`, which abissd loads the streams' windows with.
fn io_uring() -> Finding {
    let why = "abissd loads the streams' windows through it";
    match std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").map(|t| t.trim().to_owned()) {
        Ok(value) if value == "2" => Finding::new(
            "io_uring",
            State::No,
            format!("disabled for every process (kernel.io_uring_disabled = 2); {why}"),
        ),
        Ok(value) if value == "1" => Finding::new(
            "io_uring",
            State::Yes,
            format!("for root and kernel.io_uring_group only (kernel.io_uring_disabled = 1), which abissd as root is; {why}"),
        ),
        Ok(_) => Finding::new("io_uring", State::Yes, why),
        // Before Linux 6.6 there is no switch: ask the kernel for a ring.
        Err(_) => match uring_setup() {
            Ok(()) => Finding::new("io_uring", State::Yes, why),
            Err(error) => Finding::new("io_uring", State::No, format!("io_uring_setup: {error}; {why}")),
        },
    }
}

/// Asks for a one-entry ring and closes it.
fn uring_setup() -> std::io::Result<()> {
    // struct io_uring_params: 120 bytes, all zero for a plain ring.
    let mut params = [0u8; 120];
    // SAFETY: io_uring_setup reads and writes `params`, a buffer of the size the kernel expects.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the descriptor was just returned to this thread and nothing else holds it.
    unsafe { libc::close(i32::try_from(fd).unwrap_or(-1)) };
    Ok(())
}

/// I/O priorities: what abissd gives stream requests.
fn ioprio() -> Finding {
    match abiss_os::ioprio::get(abiss_os::ioprio::CALLING_THREAD) {
        Ok(_) => Finding::new(
            "ioprio",
            State::Yes,
            "ioprio_get(2) answers; abissd gives stream loads and raised readers the real-time class, which mq-deadline and bfq serve first",
        ),
        Err(error) => Finding::new("ioprio", State::No, format!("ioprio_get(2): {error}")),
    }
}

/// The cgroup version and its memory and io controllers.
fn cgroups() -> Vec<Finding> {
    let memory_why = "the pages abissd locks are charged to its cgroup, whose memory.max must leave room for --locked-memory";
    let (version, controllers) = match std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
    {
        Ok(text) => ("v2", v2_controllers(&text)),
        Err(_) => (
            "v1",
            std::fs::read_to_string("/proc/cgroups")
                .map(|text| v1_controllers(&text))
                .unwrap_or_default(),
        ),
    };
    let (io_name, io_why) = if version == "v2" {
        ("io", "a cgroup's io.prio.class can change the priority abiss gives requests (promote-to-rt, restrict-to-be), and its io.max limits hold abissd's loads too")
    } else {
        (
            "blkio",
            "its throttling limits hold abissd's loads as any process's",
        )
    };
    let state = |name: &str| {
        if controllers.iter().any(|c| c == name) {
            State::Yes
        } else {
            State::No
        }
    };
    vec![
        Finding::new(
            "cgroup memory",
            state("memory"),
            format!("{version} memory controller: {memory_why}"),
        ),
        Finding::new(
            "cgroup io",
            state(io_name),
            format!("{version} {io_name} controller: {io_why}"),
        ),
    ]
}

/// The controllers of a v2 `cgroup.controllers` (`cpuset cpu io memory pids`).
pub(super) fn v2_controllers(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_owned).collect()
}

/// The enabled controllers of `/proc/cgroups` (`#subsys_name hierarchy num_cgroups enabled`).
pub(super) fn v1_controllers(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 4 && fields[3] == "1").then(|| fields[0].to_owned())
        })
        .collect()
}

/// Device mapper and md: whether the kernel has them, and how many devices each has now.
fn stacking() -> Vec<Finding> {
    let count = |prefix: &str| {
        std::fs::read_dir("/sys/block").map_or(0, |entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
    };
    let why = "abissd serves a file by the device its file system is on, so a file there needs that device managed";
    let dm = Path::new("/sys/class/misc/device-mapper").exists();
    let md = Path::new("/proc/mdstat").exists();
    vec![
        Finding::new(
            "device mapper",
            if dm { State::Yes } else { State::No },
            format!("{} dm devices (LVM, dm-crypt); {why}", count("dm-")),
        ),
        Finding::new(
            "md",
            if md { State::Yes } else { State::No },
            format!("{} md arrays; {why}", count("md")),
        ),
    ]
}

/// The elevators each disk with a medium offers (`queue/scheduler`, the one in use in brackets).
fn elevators(block: &Path) -> Vec<Finding> {
    let mut disks: Vec<String> = std::fs::read_dir(block)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    disks.sort();
    disks
        .into_iter()
        .filter_map(|disk| {
            let dir = block.join(&disk);
            let size = std::fs::read_to_string(dir.join("size")).ok()?;
            if size.trim() == "0" {
                return None;
            }
            let offered = std::fs::read_to_string(dir.join("queue/scheduler")).ok()?;
            Some(elevator_finding(&disk, offered.trim()))
        })
        .collect()
}

/// One disk's elevators: abissd runs it with mq-deadline or bfq, which serve by priority.
pub(super) fn elevator_finding(disk: &str, offered: &str) -> Finding {
    let names: Vec<&str> = offered
        .split_whitespace()
        .map(|name| name.trim_matches(['[', ']']))
        .collect();
    let by_priority = names.iter().any(|n| matches!(*n, "mq-deadline" | "bfq"));
    let topic = format!("elevator {disk}");
    if by_priority {
        Finding::new(
            topic,
            State::Yes,
            format!("{offered} (abissd uses mq-deadline or bfq, which serve by priority)"),
        )
    } else if names == ["none"] {
        Finding::new(
            topic,
            State::No,
            format!("{offered}: no elevator can run on this queue (a stacked or bio-based device)"),
        )
    } else {
        Finding::new(topic, State::No, format!("{offered}: neither mq-deadline nor bfq is loaded; abissd loads one (modprobe) when it manages the disk"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_controllers_of_either_version() {
        assert_eq!(
            v2_controllers("cpuset cpu io memory pids\n"),
            ["cpuset", "cpu", "io", "memory", "pids"]
        );
        let v1 = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t2\t1\t1\nmemory\t0\t1\t0\nblkio\t4\t1\t1\n";
        assert_eq!(
            v1_controllers(v1),
            ["cpuset", "blkio"],
            "memory is there but disabled"
        );
    }

    #[test]
    fn an_elevator_that_serves_by_priority_is_named() {
        let yes = elevator_finding("sda", "[mq-deadline] kyber bfq none");
        assert_eq!(yes.state, State::Yes);
        let dm = elevator_finding("dm-0", "none");
        assert_eq!(dm.state, State::No);
        assert!(dm.detail.contains("no elevator"), "{}", dm.detail);
        let kyber = elevator_finding("nvme0n1", "[none] kyber");
        assert!(kyber.detail.contains("modprobe"), "{}", kyber.detail);
    }

    #[test]
    fn a_part_the_daemon_switched_off_is_off_not_missing() {
        let daemon = Feature::MissRaises.report(Some("switched off (--disable miss-raises)"));
        let finding = part(Feature::MissRaises, None, true, Some(&daemon), true);
        assert_eq!(finding.state, State::Off);
        assert!(
            finding.detail.contains("--disable miss-raises"),
            "{}",
            finding.detail
        );
        let hidden = part(
            Feature::DirectIoTagging,
            Some("iomap_dio_bio_end_io is not in /proc/kallsyms (or its addresses are hidden)"),
            false,
            None,
            false,
        );
        assert_eq!(hidden.state, State::Unknown);
        let missing = part(
            Feature::MissRaises,
            Some("tracepoint page_cache_sync_ra missing from this kernel"),
            true,
            None,
            false,
        );
        assert_eq!(missing.state, State::No);
        assert!(missing.detail.contains("stands in"), "{}", missing.detail);
    }
}
