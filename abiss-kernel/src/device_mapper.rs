//! A device-mapper device's table, as the kernel holds it (`DM_TABLE_STATUS` on
//! `/dev/mapper/control`, which needs `CAP_SYS_ADMIN`): what sysfs does not say, such as whether
//! a dm-crypt device decrypts its reads in its own workers.
//!
//! Only the target types and the words of their parameters that say how they work are kept:
//! a crypt target's parameters hold its key, which never leaves this module.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

use crate::storage::{Kind, Layer};

/// `struct dm_ioctl`'s size; its fields' offsets, from `include/uapi/linux/dm-ioctl.h`.
const HEADER_BYTES: usize = 312;
const DATA_SIZE_AT: usize = 12;
const DATA_START_AT: usize = 16;
const TARGET_COUNT_AT: usize = 20;
const FLAGS_AT: usize = 28;
const NAME_AT: usize = 48;
const NAME_BYTES: usize = 128;
/// `struct dm_target_spec`: sector start, length, status, next, then the type's 16 bytes.
const SPEC_BYTES: usize = 40;
const SPEC_NEXT_AT: usize = 20;
const SPEC_TYPE_AT: usize = 24;
/// The interface version asked for (4, as every kernel since 2.6 speaks).
const VERSION: [u32; 3] = [4, 0, 0];
/// `DM_STATUS_TABLE_FLAG`: the table as loaded, not the targets' status.
const STATUS_TABLE_FLAG: u32 = 1 << 4;
/// `DM_SECURE_DATA_FLAG`: the kernel wipes its copy of the answer, which holds a crypt key.
const SECURE_DATA_FLAG: u32 = 1 << 15;
/// `DM_BUFFER_FULL_FLAG`: the answer did not fit.
const BUFFER_FULL_FLAG: u32 = 1 << 8;
/// Room for the answer: a few targets' parameters.
const BUFFER_BYTES: usize = 16 << 10;

nix::ioctl_readwrite_bad!(
    /// `DM_TABLE_STATUS` on a buffer that starts with a `struct dm_ioctl`.
    dm_table_status,
    // _IOWR(0xfd, 12, struct dm_ioctl): DM_TABLE_STATUS.
    0xC138_FD0C,
    u8
);

/// One target of a table: its type (`crypt`, `linear`, `striped`) and the words of its
/// parameters that are flags (`no_read_workqueue`, see `is_flag`), never the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The target type.
    pub target_type: String,
    /// Its flag words.
    pub flags: Vec<String>,
    /// A `raid` target's level (`raid1`, `raid5_ls`): its first parameter.
    pub raid_level: Option<String>,
}

/// Whether a dm-crypt table decrypts reads, or encrypts writes, in dm-crypt's own kcryptd
/// workers: unless opened with `no_read_workqueue` (`no_write_workqueue`), Linux 5.9.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CryptQueues {
    /// Reads are decrypted in kcryptd workers, after other readers' in the queue.
    pub read_workqueue: bool,
    /// Writes are encrypted in kcryptd workers and submitted from `dmcrypt_write`.
    pub write_workqueue: bool,
}

impl CryptQueues {
    /// Of the first crypt target of `targets`; `None` when there is none.
    #[must_use]
    pub fn of(targets: &[Target]) -> Option<Self> {
        let crypt = targets.iter().find(|t| t.target_type == "crypt")?;
        let has = |flag: &str| crypt.flags.iter().any(|f| f == flag);
        Some(Self {
            read_workqueue: !has("no_read_workqueue"),
            write_workqueue: !has("no_write_workqueue"),
        })
    }
}

/// The table of device-mapper device `name` (`dm/name` in sysfs).
///
/// # Errors
/// `/dev/mapper/control` cannot be opened (no such file, or no `CAP_SYS_ADMIN`), the kernel
/// refused the request, or its answer did not parse.
pub fn table(name: &str) -> std::io::Result<Vec<Target>> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")?;
    let mut buffer = request(name)?;
    // SAFETY: `buffer` is `BUFFER_BYTES` long and its header says so (data_size), so the kernel
    // writes no further than its end; the descriptor is open for the call.
    let asked = unsafe { dm_table_status(control.as_raw_fd(), buffer.as_mut_ptr()) };
    let targets = asked
        .map_err(std::io::Error::from)
        .and_then(|_| parse(&buffer));
    // The answer holds a crypt target's key: wiped before the memory goes back.
    buffer.fill(0);
    std::hint::black_box(&buffer);
    targets
}

/// What the device-mapper tables under a file system say, as ends of sentences that begin
/// with the file's name (see [`findings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Why a stream cannot be served through them: LVM's raid4, 5 or 6 (dm-raid runs md's
    /// raid5 personality, stripe cache and thread, which md raid4/5/6 is refused for).
    pub refusal: Option<String>,
    /// What they cost a stream that abiss cannot take away: a dm-crypt device that decrypts
    /// reads in its kcryptd workers (no `no_read_workqueue`), where a read's pages wait, after
    /// the disk, behind every other reader's decryption. Measured on slow disks under a copy
    /// loop, a stream missed deadlines there with abiss as without (docs/kernels.md). Each once.
    pub warnings: Vec<String>,
}

/// Reads the table of every device-mapper layer of `stacks` (the stacks under one file
/// system); says nothing of a table it cannot read (no `CAP_SYS_ADMIN`).
#[must_use]
pub fn findings(stacks: &[Layer]) -> Findings {
    let mut found = Findings::default();
    for stack in stacks {
        let mut layers: Vec<&Layer> = vec![stack];
        while let Some(layer) = layers.pop() {
            layers.extend(layer.below.iter());
            let Kind::DeviceMapper { name, .. } = &layer.kind else {
                continue;
            };
            let Ok(targets) = table(name) else {
                continue;
            };
            if let Some(level) =
                targets
                    .iter()
                    .filter_map(|t| t.raid_level.as_deref())
                    .find(|level| {
                        ["raid4", "raid5", "raid6"]
                            .iter()
                            .any(|p| level.starts_with(p))
                    })
            {
                found.refusal.get_or_insert_with(|| {
                    format!(
                        "is on {}: the device mapper's '{name}' ({}) is a {level} array (LVM's raid, dm-raid), which reads and writes through md's stripe cache from its own thread, so abissd cannot keep a stream's priority through it; LVM's raid1 and raid10 are served",
                        stack.describe(),
                        layer.name
                    )
                });
            }
            let warning = format!(
                "is read through dm-crypt '{name}', which decrypts reads in its kcryptd workers, where they wait behind other readers' and abiss cannot put them first: open it with --perf-no_read_workqueue --perf-no_write_workqueue (`cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue --persistent {name}`)"
            );
            if CryptQueues::of(&targets).is_some_and(|q| q.read_workqueue)
                && !found.warnings.contains(&warning)
            {
                found.warnings.push(warning);
            }
        }
    }
    found
}

/// A `DM_TABLE_STATUS` request for device `name`, in a buffer of `BUFFER_BYTES`.
fn request(name: &str) -> std::io::Result<Vec<u8>> {
    if name.is_empty() || name.len() >= NAME_BYTES || name.contains('\0') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("'{name}' is not a device-mapper name"),
        ));
    }
    let mut buffer = vec![0_u8; BUFFER_BYTES];
    for (i, part) in VERSION.iter().enumerate() {
        put_u32(&mut buffer, i * 4, *part);
    }
    put_u32(
        &mut buffer,
        DATA_SIZE_AT,
        u32::try_from(BUFFER_BYTES).unwrap_or(u32::MAX),
    );
    put_u32(
        &mut buffer,
        DATA_START_AT,
        u32::try_from(HEADER_BYTES).unwrap_or(0),
    );
    put_u32(&mut buffer, FLAGS_AT, STATUS_TABLE_FLAG | SECURE_DATA_FLAG);
    buffer[NAME_AT..NAME_AT + name.len()].copy_from_slice(name.as_bytes());
    Ok(buffer)
}

/// The targets of a `DM_TABLE_STATUS` answer.
fn parse(buffer: &[u8]) -> std::io::Result<Vec<Target>> {
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned());
    if get_u32(buffer, FLAGS_AT).ok_or_else(|| bad("short answer"))? & BUFFER_FULL_FLAG != 0 {
        return Err(bad("the table is larger than the buffer"));
    }
    let start = get_u32(buffer, DATA_START_AT).ok_or_else(|| bad("short answer"))? as usize;
    let count = get_u32(buffer, TARGET_COUNT_AT).ok_or_else(|| bad("short answer"))?;
    let data = buffer
        .get(start..)
        .ok_or_else(|| bad("data outside the answer"))?;
    let mut targets = Vec::new();
    let mut at = 0_usize;
    for _ in 0..count {
        let spec = data
            .get(at..at.saturating_add(SPEC_BYTES))
            .ok_or_else(|| bad("target outside the answer"))?;
        let target_type = c_string(&spec[SPEC_TYPE_AT..]);
        // The parameters are read in place, word by word; only flag words, and a raid
        // target's level, are copied out (a crypt key is neither).
        let params = data
            .get(at.saturating_add(SPEC_BYTES)..)
            .unwrap_or_default();
        let params = &params[..params.iter().position(|&b| b == 0).unwrap_or(params.len())];
        let mut words = params
            .split(u8::is_ascii_whitespace)
            .filter(|word| !word.is_empty());
        let raid_level = (target_type == "raid")
            .then(|| words.clone().next())
            .flatten()
            .map(|word| String::from_utf8_lossy(word).into_owned());
        let flags = words
            .by_ref()
            .filter_map(|word| std::str::from_utf8(word).ok())
            .filter(|word| is_flag(word))
            .map(str::to_owned)
            .collect();
        targets.push(Target {
            target_type,
            flags,
            raid_level,
        });
        let next = get_u32(spec, SPEC_NEXT_AT).ok_or_else(|| bad("short target"))? as usize;
        if next <= at {
            break;
        }
        at = next;
    }
    Ok(targets)
}

/// A flag word of a table's parameters (`no_read_workqueue`, `allow_discards`): letters with
/// an `_` between. A crypt key (hex digits, or `:32:logon:…`) never is one.
fn is_flag(word: &str) -> bool {
    word.contains('_') && word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

fn put_u32(buffer: &mut [u8], at: usize, value: u32) {
    buffer[at..at + 4].copy_from_slice(&value.to_ne_bytes());
}

fn get_u32(buffer: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(buffer.get(at..at + 4)?.try_into().ok()?))
}

/// The text up to the first NUL (or the end).
fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as the kernel writes it: header, then each spec, its parameters and padding
    /// to 8 bytes, `next` counted from the start of the data.
    fn answer(targets: &[(&str, &str)]) -> Vec<u8> {
        let mut buffer = request("media").unwrap();
        let mut data = Vec::new();
        for (target_type, params) in targets {
            let at = data.len();
            data.extend_from_slice(&[0; SPEC_BYTES]);
            data[at + SPEC_TYPE_AT..at + SPEC_TYPE_AT + target_type.len()]
                .copy_from_slice(target_type.as_bytes());
            data.extend_from_slice(params.as_bytes());
            data.push(0);
            while data.len() % 8 != 0 {
                data.push(0);
            }
            let next = u32::try_from(data.len()).unwrap();
            data[at + SPEC_NEXT_AT..at + SPEC_NEXT_AT + 4].copy_from_slice(&next.to_ne_bytes());
        }
        buffer[HEADER_BYTES..HEADER_BYTES + data.len()].copy_from_slice(&data);
        put_u32(
            &mut buffer,
            TARGET_COUNT_AT,
            u32::try_from(targets.len()).unwrap(),
        );
        buffer
    }

    #[test]
    fn a_crypt_tables_flags_say_where_it_decrypts_and_its_key_is_not_kept() {
        let key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let plain = answer(&[("crypt", &format!("aes-xts-plain64 {key} 0 7:1 0"))]);
        assert!(!is_flag("abcdefabcdef") && !is_flag(":32:logon:cryptsetup:x_y"));
        let targets = parse(&plain).unwrap();
        assert_eq!(targets[0].target_type, "crypt");
        assert!(
            targets[0].flags.iter().all(|f| !f.contains("0102")),
            "{targets:?}"
        );
        assert_eq!(
            CryptQueues::of(&targets),
            Some(CryptQueues {
                read_workqueue: true,
                write_workqueue: true
            })
        );
        let inline = answer(&[(
            "crypt",
            &format!("aes-xts-plain64 {key} 0 7:1 0 2 no_read_workqueue no_write_workqueue"),
        )]);
        assert_eq!(
            CryptQueues::of(&parse(&inline).unwrap()),
            Some(CryptQueues {
                read_workqueue: false,
                write_workqueue: false
            })
        );
        let raid = answer(&[(
            "raid",
            "raid5_ls 3 128 region_size 1024 3 - 7:1 - 7:2 - 7:3",
        )]);
        let targets = parse(&raid).unwrap();
        assert_eq!(targets[0].raid_level.as_deref(), Some("raid5_ls"));
        assert_eq!(targets[0].flags, ["region_size"]);
        let striped = answer(&[("striped", "2 128 7:1 0 7:2 0"), ("linear", "7:3 0")]);
        let targets = parse(&striped).unwrap();
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[1].target_type, "linear");
        assert_eq!(targets[1].raid_level, None);
        assert_eq!(CryptQueues::of(&targets), None);
    }

    #[test]
    fn a_name_the_kernel_cannot_take_is_refused_before_asking() {
        assert!(request("").is_err());
        assert!(request(&"x".repeat(NAME_BYTES)).is_err());
        assert!(request("a\0b").is_err());
        let mut full = answer(&[("linear", "7:3 0")]);
        put_u32(&mut full, FLAGS_AT, STATUS_TABLE_FLAG | BUFFER_FULL_FLAG);
        assert!(parse(&full).is_err());
    }
}
