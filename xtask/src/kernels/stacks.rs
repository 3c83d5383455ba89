//! Judging the guest's storage stacks (issue 35): LVM on LUKS (dm-linear over dm-crypt, made
//! with dmsetup) over one loop device, served from that loop device; an md raid1 of two loop
//! devices and LVM striped over two more (dm-striped), each served from both. See `init.sh`'s
//! second part.

use std::collections::BTreeMap;

use serde_json::Value;

use super::vm::Serial;
use super::{check, first_lines, Check};

/// Seconds the paced reader reads the file on the stack (`init.sh` says the same): short,
/// since TCG decrypts slowly and the main run has read for long.
const STACK_READ_SECS: u64 = 4;

/// The checks of the stack run; their details carry its figures (the reader's misses,
/// abissd's requests at the loop device by operation and priority) into the report. Where
/// abissd follows readers (read-tracking) it must have seen no page-cache miss; before that,
/// as on the plain loop device, the paced reader reads some pages itself and is raised.
pub(super) fn judge_stacks(
    serial: &Serial,
    follows_readers: bool,
    priority_in_bio: bool,
    checks: &mut Vec<Check>,
) {
    if let Some(disk) = serial.say("main-disk") {
        let plain = Loads {
            label: "plain ext4",
            attach: "attach",
            run: "",
            devices: vec![disk],
        };
        judge_loads(serial, &plain, priority_in_bio, checks);
    }
    let built = serial.say("stack");
    check(
        checks,
        "stacks built: LVM on LUKS over one loop device, md raid1 over two, LVM striped over two",
        built.is_some(),
        built.map_or_else(
            || {
                format!(
                    "{}: {}",
                    serial.say("stack-failed").unwrap_or("not reached"),
                    first_lines(serial.block("stack-failed-stderr"), 2)
                )
            },
            |line| format!("loop, its number, the LVM volume, its number, md members: {line}"),
        ),
    );
    let Some(line) = built else {
        return;
    };
    let fields: Vec<&str> = line.split_whitespace().collect();
    let loop_number = fields.get(1).copied().unwrap_or("?");
    let doctor = serial.block("stack-doctor");
    check(
        checks,
        "`abissctl doctor` shows the stack, served from the loop device, and (as root) dm-crypt's workqueues",
        doctor.contains("LVM 'abiss-vg-lv'")
            && doctor.contains("dm-crypt 'abiss-crypt'")
            && doctor.contains(&format!("abiss can serve it from {}", fields[0]))
            && doctor.contains("decrypts reads in its kcryptd workers"),
        doctor_lines(doctor),
    );
    judge_refused_recording(
        serial,
        (
            "stack",
            "a recording through dm-crypt is refused with one sentence naming it",
        ),
        "dm-crypt 'abiss-crypt' writes",
        checks,
    );
    let attach = serial.block("stack-attach-stderr");
    check(
        checks,
        "LUKS: attach warns that dm-crypt decrypts in its kcryptd workers, naming the fix",
        attach.contains("dm-crypt 'abiss-crypt', which decrypts reads in its kcryptd workers")
            && attach.contains("--perf-no_read_workqueue"),
        first_lines(attach, 2),
    );
    judge_reader(serial, "stack", follows_readers, checks);
    let stack = Loads {
        label: "stack",
        attach: "stack-attach",
        run: "stack-",
        devices: vec![loop_number],
    };
    judge_loads(serial, &stack, priority_in_bio, checks);
    for spread in [("md", "md raid1"), ("striped", "LVM 'abiss-vg-striped'")] {
        judge_spread(serial, spread, follows_readers, priority_in_bio, checks);
    }
    judge_unserved(serial, checks);
    judge_stack_end(serial, checks);
}

/// The stacks abissd does not serve, md raid5 (`md5`) and LVM's raid5 (`lvm5`, dm-raid): an
/// attach of a file on either is refused (abissctl's exit 5, a device not served) with one
/// sentence naming the layer, and
/// doctor, run as root, says the same.
fn judge_unserved(serial: &Serial, checks: &mut Vec<Check>) {
    for (run, label, named, label_in_sentence) in [
        (
            "md5",
            "md raid5",
            "md (md1 raid5) reads and writes through its stripe cache",
            "/mnt/md5/stream.bin is on md1 (",
        ),
        (
            "lvm5",
            "LVM raid5 (dm-raid)",
            "is a raid5_ls array (LVM's raid, dm-raid)",
            "the device mapper's 'abiss-vg-raid5'",
        ),
    ] {
        let attach = serial.number(&format!("{run}-attach"));
        let stderr = serial.block(&format!("{run}-attach-stderr"));
        let doctor = serial.block(&format!("{run}-doctor"));
        check(
            checks,
            &format!("{label}: attach is refused with one sentence naming it, and doctor says so"),
            attach == Some(5)
                && stderr.trim().lines().count() == 1
                && [named, label_in_sentence]
                    .iter()
                    .all(|n| stderr.contains(n) && doctor.contains(n)),
            match serial.say(&format!("{run}-failed")) {
                Some(_) => format!(
                    "not built: {}",
                    first_lines(serial.block(&format!("{run}-failed-stderr")), 2)
                ),
                None => format!(
                    "exit {attach:?}: {}; doctor: {}",
                    first_lines(stderr, 2),
                    doctor_lines(doctor)
                ),
            },
        );
    }
}

/// The stream on stack `run` (`stack`, `md`): attached, its paced reader on schedule with no
/// deadline missed, and (where abissd follows readers) no page-cache miss seen by abissd.
fn judge_reader(serial: &Serial, run: &str, follows_readers: bool, checks: &mut Vec<Check>) {
    let attach = serial.number(&format!("{run}-attach"));
    check(
        checks,
        &format!("`abissctl attach --rate 1MB/s` on the {run} succeeds"),
        attach == Some(0),
        format!(
            "exit {attach:?}: {}",
            first_lines(serial.block(&format!("{run}-attach-stderr")), 2)
        ),
    );
    let reader: Value = serde_json::from_str(
        serial
            .block(&format!("{run}-reader"))
            .lines()
            .next()
            .unwrap_or_default(),
    )
    .unwrap_or(Value::Null);
    let reads = reader.get("reads").and_then(Value::as_u64).unwrap_or(0);
    let misses = reader.get("misses").and_then(Value::as_u64);
    let scheduled = STACK_READ_SECS * 1_000_000 / 65_536;
    check(
        checks,
        &format!("{run}: paced reader kept its schedule, 0 deadline misses"),
        misses == Some(0) && reads * 100 >= scheduled * 95,
        format!(
            "{reads} reads of {scheduled} scheduled, misses {:?}, max {} µs",
            misses,
            reader.get("max_ns").and_then(Value::as_u64).unwrap_or(0) / 1000
        ),
    );
    let daemon_misses = stream_misses(serial.block(&format!("{run}-list-json")));
    if follows_readers {
        check(
            checks,
            &format!(
                "{run}: abissd counted 0 page-cache misses (the pages were resident when read)"
            ),
            daemon_misses.len() == 1 && daemon_misses.iter().all(|&m| m == 0),
            format!("misses per stream: {daemon_misses:?}"),
        );
    } else {
        check(
            checks,
            &format!("{run}: abissd saw the stream (page-cache misses reported, not judged: no read-tracking)"),
            daemon_misses.len() == 1,
            format!("misses per stream: {daemon_misses:?}"),
        );
    }
}

/// Whose loads [`judge_loads`] judges: the stream attached as say `attach` (exit code and id),
/// by the abissd of run `run` (its `{run}abissd-pid` and `{run}events` blocks), at loop
/// devices `devices` (their numbers), named `label` in the check.
struct Loads<'a> {
    label: &'a str,
    attach: &'a str,
    run: &'a str,
    devices: Vec<&'a str>,
}

/// abissd's loads (its requests at the loop devices of `loads`, from the request events
/// `abissctl trace --events --json` streamed: the guest's `{run}events` block) were all at
/// the stream's level, real time 0, and some carried the stream's tag (the file's own pages
/// reached the disk); the other tasks' requests there are reported beside them. Before Linux
/// 6.0 (`priority_in_bio` false) a buffered read's bio carries no task's priority at all
/// (6.0's "block: Always initialize bio IO priority on submit" puts it there), so on a plain
/// disk as through a stack the loads must be at none/0 there.
fn judge_loads(serial: &Serial, loads: &Loads, priority_in_bio: bool, checks: &mut Vec<Check>) {
    let Loads {
        label,
        attach,
        run,
        devices,
    } = loads;
    let stream = serial
        .say(attach)
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u64>().ok());
    let pid = serial.number(&format!("{run}abissd-pid"));
    let events: Vec<Value> = serial
        .block(&format!("{run}events"))
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|event: &Value| devices.contains(&device_text(event).as_str()))
        .collect();
    let expected = if priority_in_bio {
        ("rt", 0)
    } else {
        ("none", 0)
    };
    let mut loads_by_priority: BTreeMap<String, u64> = BTreeMap::new();
    let mut tagged = 0;
    let mut count = 0;
    let mut off_level = 0;
    for event in events
        .iter()
        .filter(|e| e.get("tgid").and_then(Value::as_i64) == pid)
    {
        count += 1;
        let priority = event.get("priority").cloned().unwrap_or(Value::Null);
        let class = priority.get("class").and_then(Value::as_str).unwrap_or("?");
        let level = priority.get("level").and_then(Value::as_u64).unwrap_or(9);
        if (class, level) != expected {
            off_level += 1;
        }
        if event.get("stream").and_then(Value::as_u64) == stream {
            tagged += 1;
        }
        let operation = event
            .get("operation")
            .and_then(Value::as_str)
            .unwrap_or("?");
        // Over several devices, which of them served each load.
        let at = if devices.len() > 1 {
            format!("{} ", device_text(event))
        } else {
            String::new()
        };
        *loads_by_priority
            .entry(format!("{at}{operation} {class}/{level}"))
            .or_default() += 1;
    }
    let others = by_task_and_priority(
        events
            .iter()
            .filter(|e| e.get("tgid").and_then(Value::as_i64) != pid),
    );
    check(
        checks,
        &format!(
            "{label}: abissd's loads reach the loop device{} at {}/{}, tagged with the stream{}",
            if devices.len() > 1 { "s" } else { "" },
            expected.0,
            expected.1,
            if priority_in_bio {
                ""
            } else {
                " (before 6.0 a buffered read's bio carries no task's priority)"
            }
        ),
        count > 0 && off_level == 0 && tagged > 0,
        format!(
            "{count} requests of abissd at {} ({tagged} tagged with stream {stream:?}), by operation and priority {loads_by_priority:?}; other tasks' requests there: {others:?}",
            devices.join(" and ")
        ),
    );
}

/// A stack over two loop devices, `run` (`md`: the md raid1; `striped`: LVM striped over two),
/// named `label`: doctor serves it from both, a reading stream is served (attached, read on
/// schedule, abissd's loads at the members at the stream's level); on the raid1 a recording
/// is refused with one sentence naming md.
fn judge_spread(
    serial: &Serial,
    (run, label): (&str, &str),
    follows_readers: bool,
    priority_in_bio: bool,
    checks: &mut Vec<Check>,
) {
    if run == "md" {
        // 30 MB/s configured, 80 % of it for real-time streams, 1 MB/s held on each member
        // by the attached stream: 23 more.
        let admit: Value = serde_json::from_str(serial.block("md-admit")).unwrap_or(Value::Null);
        let source = admit
            .get("model_source")
            .and_then(Value::as_str)
            .unwrap_or_default();
        check(
            checks,
            "md raid1: `abissctl admit --device md0` plans on its members, each charged the stream",
            admit.get("n_max").and_then(Value::as_u64) == Some(23)
                && source.contains("the fullest of md0's disks"),
            format!(
                "n_max {:?} (23 expected); {source}",
                admit.get("n_max").and_then(Value::as_u64)
            ),
        );
        let status: Value = serde_json::from_str(serial.block("md-status")).unwrap_or(Value::Null);
        let under_md: Vec<&str> = status
            .get("devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|d| {
                d.get("built_on")
                    .and_then(Value::as_array)
                    .is_some_and(|above| {
                        above
                            .iter()
                            .any(|a| a.as_str().is_some_and(|a| a.starts_with("md0 (")))
                    })
            })
            .filter_map(|d| d.get("name").and_then(Value::as_str))
            .collect();
        check(
            checks,
            "md raid1: `abissctl status` shows md0 built on both members",
            under_md.len() == 2,
            format!("managed disks under md0: {under_md:?}"),
        );
        judge_refused_recording(
            serial,
            (
                "md",
                "md raid1: a recording is refused with one sentence naming md",
            ),
            "recordings through md raid1 are not served",
            checks,
        );
    }
    let doctor = serial.block(&format!("{run}-doctor"));
    let members: Vec<&str> = serial
        .say(&format!("{run}-members"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    check(
        checks,
        &format!("{label}: `abissctl doctor` serves it from both members"),
        doctor.contains(label) && doctor.contains("abiss can serve it from loop"),
        doctor_lines(doctor),
    );
    judge_reader(serial, run, follows_readers, checks);
    let attach = format!("{run}-attach");
    let loads = Loads {
        label,
        attach: &attach,
        run: "stack-",
        devices: members,
    };
    judge_loads(serial, &loads, priority_in_bio, checks);
}

/// The end of the stack run: abissd's disks put back and nothing of it left.
fn judge_stack_end(serial: &Serial, checks: &mut Vec<Check>) {
    let before = serial.say("stack-elevators-before").unwrap_or("?");
    let after = serial.say("stack-elevators-after").unwrap_or("!");
    check(
        checks,
        "stack run: abissd exits 0 and puts every disk's elevator back",
        serial.number("stack-abissd-exit") == Some(0) && before == after,
        format!(
            "exit {:?}; elevators of the loop, md members, striped members before: {before}; after: {after}",
            serial.number("stack-abissd-exit")
        ),
    );
    let (bpf_before, bpf_after) = (
        serial.number("stack-bpf-before"),
        serial.number("stack-bpf-after"),
    );
    let leftovers = serial.say("stack-leftovers").unwrap_or("?");
    check(
        checks,
        "stack run: no BPF programs, pins or socket left",
        bpf_before.is_some() && bpf_before == bpf_after && leftovers.is_empty(),
        format!("programs before {bpf_before:?}, after {bpf_after:?}; left: {leftovers:?}"),
    );
}

/// Request events counted by task and priority (`kworker/0:1H be/4`).
fn by_task_and_priority<'a>(events: impl Iterator<Item = &'a Value>) -> BTreeMap<String, u64> {
    events.fold(BTreeMap::new(), |mut by, event| {
        let comm = event.get("comm").and_then(Value::as_str).unwrap_or("?");
        let priority = event.get("priority").cloned().unwrap_or(Value::Null);
        *by.entry(format!(
            "{comm} {}/{}",
            priority.get("class").and_then(Value::as_str).unwrap_or("?"),
            priority.get("level").and_then(Value::as_u64).unwrap_or(9)
        ))
        .or_default() += 1;
        by
    })
}

/// The recording run `run` tried (`init.sh`'s `refused_recording`) was refused with one
/// sentence that says `needle`; the check is named `name`.
fn judge_refused_recording(
    serial: &Serial,
    (run, name): (&str, &str),
    needle: &str,
    checks: &mut Vec<Check>,
) {
    let refusal = serial.block(&format!("{run}-write-stderr"));
    check(
        checks,
        name,
        serial
            .number(&format!("{run}-write-attach"))
            .is_some_and(|code| code != 0)
            && refusal.contains(needle)
            && refusal.trim().lines().count() == 1,
        first_lines(refusal, 2),
    );
}

/// The page-cache misses of each stream of an `abissctl list --json`.
fn stream_misses(list: &str) -> Vec<u64> {
    let list: Value = serde_json::from_str(list).unwrap_or(Value::Null);
    list.as_array()
        .or_else(|| list.get("streams").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("misses").and_then(Value::as_u64))
        .collect()
}

/// An event's device as `MAJ:MIN`.
fn device_text(event: &Value) -> String {
    let device = event.get("device").cloned().unwrap_or(Value::Null);
    match (
        device.get("major").and_then(Value::as_u64),
        device.get("minor").and_then(Value::as_u64),
    ) {
        (Some(major), Some(minor)) => format!("{major}:{minor}"),
        _ => device.as_str().unwrap_or("?").to_owned(),
    }
}

/// The doctor's stack and served lines.
fn doctor_lines(doctor: &str) -> String {
    doctor
        .lines()
        .filter(|l| {
            ["stack", "served", "disk", "warning"]
                .iter()
                .any(|topic| l.starts_with(topic))
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(" / ")
}
