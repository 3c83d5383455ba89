//! The emulator's `unmodelled` switch: while it is on, requests take no modelled time and are
//! not recorded; once it is off again, the data is there and reads of it are modelled and
//! recorded as before.

mod common;

use std::io::Write;
use std::time::Duration;

use abiss_lab::emulator::UNMODELLED_NAME;
use abiss_lab::model::HddModel;
use abiss_lab::{ModelKind, Op, RequestRecord};

const BLOCK: usize = 64 << 10;
const BLOCKS: u64 = 48;

/// Blocks spread over the whole disk, far apart in turn, so that each costs the model a seek.
fn offsets(size: u64) -> Vec<u64> {
    let stride = size / BLOCKS / 4096 * 4096;
    (0..BLOCKS / 2)
        .flat_map(|i| [i * stride, (BLOCKS - 1 - i) * stride])
        .collect()
}

/// The bytes of block `i`.
fn pattern(i: u64, buf: &mut [u8]) {
    for (j, byte) in buf.iter_mut().enumerate() {
        *byte = u8::try_from((i * 31 + j as u64 * 7) % 251).expect("below 251");
    }
}

fn overlaps(record: &RequestRecord, offsets: &[u64]) -> bool {
    offsets
        .iter()
        .any(|&o| record.offset < o + BLOCK as u64 && o < record.offset + record.len)
}

#[test]
fn unmodelled_requests_take_no_model_time_and_are_not_recorded() {
    if !common::lab_possible() {
        return;
    }
    let size = 1 << 30;
    let options = common::options("unmodelled", ModelKind::Hdd, size);
    let lab = common::up(&options);
    assert!(!lab.lab.unmodelled().expect("read the switch"));

    // Only 0 and 1 are taken.
    let control = lab.lab.state().fuse_mountpoint.join(UNMODELLED_NAME);
    for bad in ["2\n", "on\n", "-1", "01x"] {
        let error = std::fs::OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut file| file.write_all(bad.as_bytes()))
            .expect_err(bad);
        assert_eq!(error.raw_os_error(), Some(libc::EINVAL), "{bad:?}: {error}");
    }
    assert!(!lab.lab.unmodelled().expect("read the switch"));

    let params = &options.model.hdd;
    let model = HddModel::new(params.clone(), size);
    let offsets = offsets(size);
    let modelled: Duration = offsets
        .iter()
        .map(|&o| {
            params.mean_random_seek()
                + params.revolution() / 2
                + model.transfer_time(Op::Write, o, BLOCK as u64)
        })
        .sum();

    let mut cursor = lab.lab.stats_cursor().expect("stats");
    lab.lab.set_unmodelled(true).expect("model off");
    assert!(lab.lab.unmodelled().expect("read the switch"));
    let mut disk = common::DirectReader::open_writable(lab.lab.device(), BLOCK);
    let mut writes = Vec::new();
    for (i, &offset) in (0..).zip(&offsets) {
        pattern(i, disk.buffer(BLOCK));
        writes.push(disk.write(offset, BLOCK));
    }
    lab.lab.set_unmodelled(false).expect("model on");
    assert!(!lab.lab.unmodelled().expect("read the switch"));
    let took: Duration = writes.iter().sum();
    writes.sort_unstable();
    let median = writes[writes.len() / 2];
    let modelled_each = modelled / u32::try_from(BLOCKS).expect("few blocks");
    println!(
        "{BLOCKS} scattered 64 KiB writes unmodelled: {:.1} ms, median {median:?} \
         (the model: {:.1} ms, {modelled_each:?} each)",
        took.as_secs_f64() * 1e3,
        modelled.as_secs_f64() * 1e3
    );
    // The median: one write held up by the backing file system must not fail the test.
    assert!(
        median < modelled_each / 5,
        "unmodelled writes took {median:?} (median), the model {modelled_each:?}"
    );

    // Read back under the model: the data is there, the reads take the model's time and are
    // recorded, the writes are not.
    let mut took = Duration::ZERO;
    let mut expected = vec![0; BLOCK];
    for (i, &offset) in (0..).zip(&offsets) {
        took += disk.read(offset, BLOCK);
        pattern(i, &mut expected);
        assert!(
            disk.buffer(BLOCK) == expected.as_slice(),
            "block {i} at {offset}"
        );
    }
    println!(
        "the same blocks read back modelled: {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(
        took > modelled / 2,
        "modelled reads took {took:?}, the model {modelled:?}"
    );
    // The emulator flushes its records within 100 ms of going idle.
    std::thread::sleep(Duration::from_millis(300));
    let records = cursor.read_new().expect("stats");
    let ours: Vec<_> = records.iter().filter(|r| overlaps(r, &offsets)).collect();
    assert!(
        ours.iter().all(|r| r.op == Op::Read),
        "an unmodelled write was recorded: {ours:?}"
    );
    let read: u64 = ours.iter().map(|r| r.len).sum();
    assert_eq!(read, BLOCKS * BLOCK as u64, "{ours:?}");
}
