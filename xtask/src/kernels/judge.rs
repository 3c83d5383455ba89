//! Booting a kernel and judging what its guest reported: the stream, the refusal below the
//! floor, nothing left behind.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::image::Boot;
use super::stacks::judge_stacks;
use super::vm::{run_vm, Console, Serial};
use super::{check, first_lines, Check, Expect, Kernel, KernelsArgs, Outcome};

/// Console lines printed when a guest fails a check.
const CONSOLE_TAIL: usize = 40;

/// Boots `kernel` and judges what its `/init` reports.
pub(super) fn boot_and_judge(
    kernel: &'static Kernel,
    boot: &Boot,
    args: &KernelsArgs,
) -> anyhow::Result<Outcome> {
    let mut console = run_vm(boot, args, &super::vm::Extra::default())?;
    // A guest whose kernel panicked is booted once more, and the report says so. Under TCG
    // the Debian 13 guest's kernel panicked in two fresh-clone runs of the suite beside
    // its lanes: once at 1.65 s, before `/init` ran anything of abiss ("Fatal exception in
    // interrupt"), and once 26 s in, after the storage stacks were built (its console was
    // not kept; the VM ended 12 s early, as `panic=-1` with `-no-reboot` ends it); it passed
    // every check in each run alone. A panic in both boots fails the kernel, with both.
    let mut first_panic = None;
    if let Some(panic) = console.lines.iter().find(|l| l.contains("Kernel panic")) {
        eprintln!(
            "xtask kernels: {}'s kernel panicked ({}); booting it once more. Its console, \
             the last {CONSOLE_TAIL} lines:\n{}",
            kernel.name,
            panic.trim(),
            last_lines(&console.lines)
        );
        first_panic = Some(panic.trim().to_owned());
        console = run_vm(boot, args, &super::vm::Extra::default())?;
    }
    let Console {
        lines,
        booted_after: booted_at,
        status,
        wall_secs,
    } = console;
    let serial = Serial::parse(&lines);
    let mut checks = Vec::new();
    let booted = booted_at.is_some();
    checks.push(Check {
        name: "boots to /init".into(),
        pass: booted,
        detail: if booted {
            match &first_panic {
                Some(panic) => format!("qemu {status}, at the second boot (the first: {panic})"),
                None => format!("qemu {status}"),
            }
        } else {
            format!(
                "no `@@ booted` on the console; qemu {status}; last lines: {}",
                tail(&lines, 8)
            )
        },
    });
    let mut outcome = judge(
        kernel,
        &serial,
        booted,
        args.read_secs,
        checks,
        booted_at,
        wall_secs,
    );
    outcome.packages.clone_from(&boot.packages);
    if outcome.checks.iter().any(|c| !c.pass) {
        // The console is the only witness of what the guest did last (a panic mid-run shows
        // only there: `panic=-1` reboots at once, and qemu ends as on a power-off).
        eprintln!(
            "xtask kernels: {}'s console, its last {CONSOLE_TAIL} lines:\n{}",
            kernel.name,
            last_lines(&lines)
        );
    }
    Ok(outcome)
}

/// The checks of what the guest reported, and the outcome.
pub(super) fn judge(
    kernel: &'static Kernel,
    serial: &Serial,
    booted: bool,
    read_secs: u64,
    mut checks: Vec<Check>,
    booted_at: Option<Duration>,
    wall_secs: f64,
) -> Outcome {
    let uname = serial
        .say("booted")
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_owned();
    let capability_line = serial
        .block("abissd-log")
        .lines()
        .find_map(|l| {
            l.split_once(" listening on ")
                .map(|(_, rest)| rest.split_once("; ").map_or(rest, |(_, parts)| parts))
        })
        .unwrap_or("")
        .trim()
        .to_owned();
    let status_json: Value =
        serde_json::from_str(serial.block("status-json")).unwrap_or(Value::Null);
    let capabilities = status_json
        .get("capabilities")
        .cloned()
        .unwrap_or(Value::Null);
    if booted {
        for (key, _) in serial
            .says
            .iter()
            .filter(|(k, _)| k == "setup-failed" || k == "module-failed")
        {
            checks.push(Check {
                name: key.clone(),
                pass: false,
                detail: serial.say(key).unwrap_or_default().to_owned(),
            });
        }
        match kernel.expect {
            Expect::Runs { on } => {
                judge_run(serial, on, &capabilities, read_secs, &mut checks);
                let follows_readers = capabilities.as_array().into_iter().flatten().any(|c| {
                    c.get("name").and_then(Value::as_str) == Some("read-tracking")
                        && c.get("on").and_then(Value::as_bool) == Some(true)
                });
                // Linux 6.0 puts the task's priority in every bio it submits.
                let priority_in_bio = uname
                    .split(['.', '-', '+'])
                    .next()
                    .and_then(|major| major.parse::<u32>().ok())
                    .is_some_and(|major| major >= 6);
                judge_stacks(serial, follows_readers, priority_in_bio, &mut checks);
            }
            Expect::Refuses { exit_code } => judge_refusal(serial, exit_code, &mut checks),
        }
    }
    let log = [
        "abissd-log",
        "plain-stderr",
        "attach-stderr",
        "reader-stderr",
        "stack-failed-stderr",
        "stack-abissd-log",
        "stack-attach-stderr",
        "stack-reader-stderr",
        "dmesg",
    ]
    .iter()
    .map(|name| (name, serial.block(name)))
    .filter(|(_, body)| !body.is_empty())
    .map(|(name, body)| format!("--- {name}\n{body}"))
    .collect::<Vec<_>>()
    .join("\n");
    Outcome {
        kernel,
        packages: Vec::new(),
        uname,
        boot_secs: booted_at.map_or(f64::NAN, |d| d.as_secs_f64()),
        wall_secs,
        capability_line,
        capabilities,
        checks,
        log,
    }
}

/// A console's last [`CONSOLE_TAIL`] lines, one per line.
fn last_lines(lines: &[String]) -> String {
    lines[lines.len().saturating_sub(CONSOLE_TAIL)..].join("\n")
}

pub(super) fn tail(lines: &[String], count: usize) -> String {
    lines[lines.len().saturating_sub(count)..].join(" | ")
}

/// A kernel abissd must run on: it answers, reports the documented parts, keeps a stream's
/// guarantee and leaves nothing behind.
pub(super) fn judge_run(
    serial: &Serial,
    expected_on: &[&str],
    capabilities: &Value,
    read_secs: u64,
    checks: &mut Vec<Check>,
) {
    let answered = serial.say("answered-after").is_some();
    let exit = serial.number("abissd-exit");
    check(
        checks,
        "abissd starts and answers `abissctl status`",
        answered,
        match (answered, exit) {
            (true, _) => format!(
                "answered (guest uptime at start, at answer: {})",
                serial.say("answered-after").unwrap_or_default()
            ),
            (false, code) => format!(
                "abissd exited with {code:?}: {}",
                first_lines(serial.block("plain-stderr"), 3)
            ),
        },
    );
    if !answered {
        return;
    }
    let on: BTreeSet<&str> = capabilities
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c.get("on").and_then(Value::as_bool) == Some(true))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let expected: BTreeSet<&str> = expected_on.iter().copied().collect();
    let stand_ins: Vec<&str> = capabilities
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c.get("stand_in").is_some_and(|v| !v.is_null()))
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    check(
        checks,
        "optional parts on as documented",
        on == expected,
        format!("on: {on:?} (through a stand-in: {stand_ins:?}); documented: {expected:?}"),
    );
    let attach = serial.number("attach");
    check(
        checks,
        "`abissctl attach --rate 1MB/s` succeeds",
        attach == Some(0),
        format!(
            "exit {attach:?}: {}",
            first_lines(serial.block("attach-stderr"), 2)
        ),
    );
    stream_checks(serial, read_secs, on.contains("read-tracking"), checks);
    let detach = serial.number("detach");
    check(
        checks,
        "`abissctl detach` succeeds",
        detach == Some(0),
        format!("exit {detach:?}"),
    );
    check(
        checks,
        "abissd exits 0 on SIGTERM",
        exit == Some(0),
        format!("exit {exit:?}"),
    );
    leaves_nothing(serial, checks);
}

/// The attached stream: the paced reader kept its schedule and missed no deadline. Where
/// abissd follows readers (read-tracking) it must also have seen no page-cache miss; without
/// it the paced reader, which sends no position messages, outruns the window as documented
/// (docs/kernels.md), and its misses are reported, not judged.
pub(super) fn stream_checks(
    serial: &Serial,
    read_secs: u64,
    follows_readers: bool,
    checks: &mut Vec<Check>,
) {
    let reader: Value = serde_json::from_str(serial.block("reader").lines().next().unwrap_or(""))
        .unwrap_or(Value::Null);
    let reads = reader.get("reads").and_then(Value::as_u64).unwrap_or(0);
    let misses = reader.get("misses").and_then(Value::as_u64);
    let scheduled = read_secs * 1_000_000 / 65_536;
    check(
        checks,
        "paced reader: schedule kept, 0 deadline misses",
        misses == Some(0) && reads * 100 >= scheduled * 95,
        format!(
            "{reads} reads of {scheduled} scheduled, misses {misses:?}, max {} µs",
            reader.get("max_ns").and_then(Value::as_u64).unwrap_or(0) / 1000
        ),
    );
    let list: Value = serde_json::from_str(serial.block("list-json")).unwrap_or(Value::Null);
    let streams: Vec<&Value> = list
        .as_array()
        .or_else(|| list.get("streams").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .collect();
    let daemon_misses: Vec<u64> = streams
        .iter()
        .filter_map(|s| s.get("misses").and_then(Value::as_u64))
        .collect();
    if follows_readers {
        check(
            checks,
            "abissd counted 0 page-cache misses",
            !daemon_misses.is_empty() && daemon_misses.iter().all(|&m| m == 0),
            format!("misses per stream: {daemon_misses:?}"),
        );
    } else {
        check(
            checks,
            "abissd saw the stream (page-cache misses reported, not judged: no read-tracking)",
            !daemon_misses.is_empty(),
            format!("misses per stream: {daemon_misses:?}"),
        );
    }
}

/// A kernel below the floor: one sentence, the documented exit code, nothing left behind.
pub(super) fn judge_refusal(serial: &Serial, exit_code: i64, checks: &mut Vec<Check>) {
    let answered = serial.say("answered-after").is_some();
    let exit = serial.number("plain-exit");
    check(
        checks,
        &format!("abissd refuses to start with exit {exit_code}"),
        !answered && exit == Some(exit_code),
        format!("answered: {answered}; exit {exit:?}"),
    );
    let stderr = serial.block("plain-stderr");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    check(
        checks,
        "one plain sentence on stderr",
        lines.len() == 1 && !stderr.contains("panicked"),
        format!("{lines:?}"),
    );
    leaves_nothing(serial, checks);
}

pub(super) fn leaves_nothing(serial: &Serial, checks: &mut Vec<Check>) {
    let (before, after) = (serial.number("bpf-before"), serial.number("bpf-after"));
    check(
        checks,
        "no BPF programs left loaded",
        before.is_some() && before == after,
        format!("programs before abissd {before:?}, after {after:?}"),
    );
    let leftovers = serial.say("leftovers").unwrap_or("?");
    check(
        checks,
        "no socket or BPF pins left",
        leftovers.is_empty(),
        format!("left: {leftovers:?}"),
    );
}
