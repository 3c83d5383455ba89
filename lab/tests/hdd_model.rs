//! The hdd lab through the kernel: outer-zone streaming rate and random access time.

mod common;

use std::time::Duration;

use abiss_lab::model::HddModel;
use abiss_lab::{ModelKind, Op};
use rand::{Rng, SeedableRng};

const GIB: u64 = 1 << 30;

#[test]
fn sequential_direct_read_reaches_the_outer_zone_rate() {
    if !common::lab_possible() {
        return;
    }
    let options = common::options("hdd-seq", ModelKind::Hdd, 4 * GIB);
    let lab = common::up(&options);
    let mut reader = common::DirectReader::open(lab.lab.device(), 1 << 20);
    reader.read(0, 1 << 20); // positions the head
    let mut elapsed = Duration::ZERO;
    let requests = 24u32;
    for i in 1..=u64::from(requests) {
        elapsed += reader.read(i << 20, 1 << 20);
    }
    let rate_mb_s = f64::from(requests) * f64::from(1u32 << 20) / elapsed.as_secs_f64() / 1e6;
    let expected = options.model.hdd.outer_rate_mb_s;
    println!("outer-zone sequential read: {rate_mb_s:.2} MB/s (model {expected} MB/s)");
    assert!(
        (rate_mb_s / expected - 1.0).abs() <= 0.10,
        "{rate_mb_s:.2} MB/s is not within 10% of {expected} MB/s"
    );
}

#[test]
fn random_4k_read_latency_matches_the_mean_access_time() {
    if !common::lab_possible() {
        return;
    }
    let size = 4 * GIB;
    let options = common::options("hdd-random", ModelKind::Hdd, size);
    let lab = common::up(&options);
    let mut reader = common::DirectReader::open(lab.lab.device(), 4096);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let samples = 200u32;
    let mut total = Duration::ZERO;
    for _ in 0..samples {
        let offset = rng.gen_range(0..size / 4096) * 4096;
        total += reader.read(offset, 4096);
    }
    let measured_ms = (total / samples).as_secs_f64() * 1e3;
    let params = &options.model.hdd;
    let model = HddModel::new(params.clone(), size);
    let expected = params.mean_random_seek()
        + params.revolution() / 2
        + model.transfer_time(Op::Read, size / 2, 4096);
    let expected_ms = expected.as_secs_f64() * 1e3;
    println!("random 4 KiB read: mean {measured_ms:.2} ms (model mean access {expected_ms:.2} ms)");
    assert!(
        (measured_ms / expected_ms - 1.0).abs() <= 0.10,
        "{measured_ms:.2} ms is not within 10% of {expected_ms:.2} ms"
    );
}
