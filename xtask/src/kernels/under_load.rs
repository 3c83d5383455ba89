//! `cargo xtask kernels --stacks-under-load` (issue 35): the storage stacks users have, on two
//! virtual disks qemu throttles to an hdd's pace, under a best-effort copy loop. The guest
//! (`load.sh`) builds each stack in turn over the disks, and reads a stream file with the
//! paced reader, first with stock mq-deadline and no abissd, then attached to abissd at 1 MB/s,
//! recording every request of the file at the disks. This reads what it reported and writes
//! `stacks-under-load.{md,json}`: per stack, both readers' misses and tail, abissd's count of
//! page-cache misses, and the file's requests at each disk by priority. It fails when a stack
//! could not be built, the attached reader missed a deadline, or a request of the file reached
//! a disk below the stream's level.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::image::Boot;
use super::report::conditions;
use super::vm::{run_vm, Extra, Serial};
use super::{first_lines, Kernel, KernelsArgs};

/// The stacks `load.sh` builds, in its order, with how the results name them.
const STACKS: &[(&str, &str)] = &[
    ("luks", "LUKS (dm-crypt) on vda"),
    (
        "luks-inline",
        "LUKS on vda, no_read_workqueue and no_write_workqueue",
    ),
    ("lvm-on-luks", "LVM on LUKS on vda"),
    ("md-raid1", "md raid1 of vda and vdb"),
    ("lvm-striped", "LVM striped over vda and vdb (64 KiB)"),
];

/// Each virtual disk's size, and the pace qemu holds it to: an hdd's random and sequential
/// limits, as the issue asks (100 IOPS, 20 MB/s).
const DISK_BYTES: u64 = 256 << 20;
const DISK_IOPS: u32 = 100;
const DISK_BPS: u64 = 20_000_000;

/// One run of the paced reader, as `abiss-test-reader` summed it up.
#[derive(Debug, Default)]
struct Reader {
    reads: u64,
    misses: u64,
    p99_ms: f64,
    max_ms: f64,
}

impl Reader {
    fn json(&self) -> Value {
        json!({"reads": self.reads, "misses": self.misses, "p99_ms": self.p99_ms, "max_ms": self.max_ms})
    }

    fn of(block: &str) -> Option<Self> {
        let value: Value = serde_json::from_str(block.lines().next()?).ok()?;
        let ms = |key: &str| value.get(key).and_then(Value::as_f64).unwrap_or(0.0) / 1e6;
        Some(Self {
            reads: value.get("reads")?.as_u64()?,
            misses: value.get("misses")?.as_u64()?,
            p99_ms: ms("p99_ns"),
            max_ms: ms("max_ns"),
        })
    }
}

/// What one stack showed.
#[derive(Debug)]
struct StackResult {
    stack: &'static str,
    name: &'static str,
    /// Why it was not measured, when it was not.
    failed: Option<String>,
    bare: Option<Reader>,
    abiss: Option<Reader>,
    /// Page-cache misses abissd counted for the stream.
    abissd_misses: Option<u64>,
    /// The stream's requests at the disks, by disk and priority (`253:0 rt/0`).
    requests: BTreeMap<String, u64>,
    /// Of those, below the stream's level (real time 0).
    below_level: u64,
    /// Every request at the disks meanwhile (the copy loop's too).
    all_requests: u64,
    /// Whether `abissctl attach` warned of dm-crypt's workers.
    warned: bool,
}

impl StackResult {
    fn json(&self) -> Value {
        json!({
            "stack": self.stack,
            "name": self.name,
            "failed": self.failed,
            "stock": self.bare.as_ref().map(Reader::json),
            "abiss": self.abiss.as_ref().map(Reader::json),
            "abissd_misses": self.abissd_misses,
            "requests_of_the_file": self.requests,
            "below_level": self.below_level,
            "all_requests": self.all_requests,
            "attach_warned_of_kcryptd": self.warned,
            "kept": passes(self),
        })
    }
}

/// Boots each kernel with the two slow disks and writes the results under `out`.
pub(super) fn run(
    root: &Path,
    out: &Path,
    args: &KernelsArgs,
    boots: &[(&'static Kernel, Boot)],
) -> anyhow::Result<()> {
    let disks_dir = root.join("target/kernels/load-disks");
    std::fs::create_dir_all(&disks_dir)?;
    let mut kernels = Vec::new();
    for (kernel, boot) in boots {
        let (secs, results) = measure(kernel, boot, args, &disks_dir)?;
        kernels.push((*kernel, secs, results));
    }
    std::fs::create_dir_all(out)?;
    let conditions = format!(
        "{}; two virtio disks of {} MiB, each throttled by qemu to {DISK_IOPS} IOPS and {} MB/s; copy loop: dd of a 64 MB file, O_DIRECT reads, buffered writes, fsync; paced reader 1 MB/s in 64 KiB reads for {} s per run",
        conditions(root, args),
        DISK_BYTES >> 20,
        DISK_BPS / 1_000_000,
        args.read_secs
    );
    std::fs::write(
        out.join("stacks-under-load.md"),
        markdown(&conditions, &kernels),
    )?;
    let json = json!({
        "conditions": conditions,
        "kernels": kernels.iter().map(|(kernel, secs, results)| json!({
            "name": kernel.name,
            "vm_secs": secs,
            "stacks": results.iter().map(StackResult::json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(
        out.join("stacks-under-load.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    eprintln!(
        "xtask kernels: results in {}",
        out.join("stacks-under-load.md").display()
    );
    let failed: Vec<String> = kernels
        .iter()
        .flat_map(|(kernel, _, results)| {
            results
                .iter()
                .filter(|r| !passes(r))
                .map(move |r| format!("{} on {}", r.stack, kernel.name))
        })
        .collect();
    if !failed.is_empty() {
        bail!("not kept: {}", failed.join(", "));
    }
    Ok(())
}

/// Boots `kernel` with two fresh slow disks (images in `disks_dir`) and judges each stack: the
/// VM's seconds and the stacks' results.
fn measure(
    kernel: &Kernel,
    boot: &Boot,
    args: &KernelsArgs,
    disks_dir: &Path,
) -> anyhow::Result<(f64, Vec<StackResult>)> {
    let mut qemu = Vec::new();
    for name in ["vda", "vdb"] {
        let image = disks_dir.join(format!("{name}.img"));
        let file = std::fs::File::create(&image)
            .with_context(|| format!("cannot make {}", image.display()))?;
        file.set_len(DISK_BYTES)?;
        qemu.push("-drive".to_owned());
        qemu.push(format!(
            "file={},if=virtio,format=raw,throttling.iops-total={DISK_IOPS},throttling.bps-total={DISK_BPS}",
            image.display()
        ));
    }
    let extra = Extra {
        qemu,
        cmdline: " abiss_load=1".to_owned(),
    };
    eprintln!(
        "xtask kernels: {} with the stacks on two slow disks",
        kernel.name
    );
    let console = run_vm(boot, args, &extra)?;
    let serial = Serial::parse(&console.lines);
    if serial.say("load-done").is_none() {
        let tail: Vec<&String> = console.lines.iter().rev().take(20).collect();
        bail!(
            "{}: the guest did not finish the stacks (qemu {}); its last lines: {tail:?}",
            kernel.name,
            console.status
        );
    }
    let results: Vec<StackResult> = STACKS
        .iter()
        .map(|&(stack, name)| judge(&serial, stack, name))
        .collect();
    for result in &results {
        eprintln!("xtask kernels: {}: {result:?}", kernel.name);
    }
    Ok((console.wall_secs, results))
}

/// Whether abiss kept the stream on the stack: measured, no deadline missed, no request of
/// the file below its level.
fn passes(result: &StackResult) -> bool {
    result.failed.is_none()
        && result
            .abiss
            .as_ref()
            .is_some_and(|r| r.misses == 0 && r.reads > 0)
        && result.below_level == 0
}

fn judge(serial: &Serial, stack: &'static str, name: &'static str) -> StackResult {
    let mut result = StackResult {
        stack,
        name,
        failed: None,
        bare: Reader::of(serial.block(&format!("{stack}-bare-reader"))),
        abiss: Reader::of(serial.block(&format!("{stack}-abiss-reader"))),
        abissd_misses: None,
        requests: BTreeMap::new(),
        below_level: 0,
        warned: serial
            .block(&format!("{stack}-attach-stderr"))
            .contains("kcryptd workers"),
        all_requests: serial
            .number(&format!("{stack}-events-all"))
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or(0),
    };
    if let Some(why) = serial.say(&format!("{stack}-failed")) {
        result.failed = Some(format!(
            "{why}: {}",
            first_lines(serial.block(&format!("{stack}-failed-stderr")), 3)
        ));
        return result;
    }
    let stream = serial
        .say(&format!("{stack}-attach"))
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u64>().ok());
    if stream.is_none() {
        result.failed = Some(format!(
            "attach failed: {}",
            first_lines(serial.block(&format!("{stack}-attach-stderr")), 3)
        ));
        return result;
    }
    let list: Value =
        serde_json::from_str(serial.block(&format!("{stack}-list-json"))).unwrap_or(Value::Null);
    result.abissd_misses = list
        .as_array()
        .and_then(|streams| streams.first())
        .and_then(|s| s.get("misses"))
        .and_then(Value::as_u64);
    for event in serial
        .block(&format!("{stack}-events"))
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|event| event.get("stream").and_then(Value::as_u64) == stream)
    {
        let priority = event.get("priority").cloned().unwrap_or(Value::Null);
        let class = priority.get("class").and_then(Value::as_str).unwrap_or("?");
        let level = priority.get("level").and_then(Value::as_u64).unwrap_or(9);
        if (class, level) != ("rt", 0) {
            result.below_level += 1;
        }
        let device = event.get("device").cloned().unwrap_or(Value::Null);
        let disk = format!(
            "{}:{}",
            device.get("major").and_then(Value::as_u64).unwrap_or(0),
            device.get("minor").and_then(Value::as_u64).unwrap_or(0)
        );
        *result
            .requests
            .entry(format!("{disk} {class}/{level}"))
            .or_default() += 1;
    }
    result
}

fn markdown(conditions: &str, kernels: &[(&Kernel, f64, Vec<StackResult>)]) -> String {
    let mut md = String::from("# Storage stacks on slow disks, under a copy loop\n\n");
    md.push_str("Made by `cargo xtask kernels --stacks-under-load` (xtask/src/kernels/under_load.rs, load.sh): each stack is built in the guest over two virtual disks that qemu throttles to an hdd's pace; a paced reader reads a cold file on it under a best-effort copy loop on the same file system, first with stock mq-deadline and no abissd, then attached to abissd at 1 MB/s. \"Requests of the file\" are the requests at the disks that `abissctl trace --events` tagged with the stream (abissd's loads and the reader's own reads), by disk and priority; the stream's level is rt/0.\n\n");
    let _ = write!(md, "Conditions: {conditions}.\n\n");
    for (kernel, secs, results) in kernels {
        let _ = write!(
            md,
            "## {} ({}), {secs:.0} s in the VM\n\n| stack | stock: reads, misses, p99, max | abiss: reads, misses, p99, max | abissd's page-cache misses | requests of the file at the disks | below its level | all requests at the disks | attach warned of kcryptd |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
            kernel.name, kernel.version
        );
        for r in results {
            let reader = |reader: &Option<Reader>| {
                reader.as_ref().map_or_else(
                    || "—".to_owned(),
                    |r| {
                        format!(
                            "{}, {}, {:.1} ms, {:.1} ms",
                            r.reads, r.misses, r.p99_ms, r.max_ms
                        )
                    },
                )
            };
            if let Some(why) = &r.failed {
                let _ = writeln!(md, "| {} | not measured: {why} | | | | | | |", r.name);
                continue;
            }
            let requests: Vec<String> = r
                .requests
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                reader(&r.bare),
                reader(&r.abiss),
                r.abissd_misses
                    .map_or_else(|| "?".to_owned(), |m| m.to_string()),
                requests.join(", "),
                r.below_level,
                r.all_requests,
                if r.warned { "yes" } else { "no" }
            );
        }
        md.push('\n');
    }
    md
}
