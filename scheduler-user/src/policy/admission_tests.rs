//! Unit and property tests of [`super`] (kept apart so the policy file stays readable).
use super::*;
use abiss_proto::PAGE_BYTES;

#[test]
fn normal_tail_matches_known_values() {
    assert!((normal_upper_tail(0.0) - 0.5).abs() < 1e-7);
    assert!((normal_upper_tail(2.326_348) - 0.01).abs() < 1e-6);
    assert!((normal_upper_tail(-1.644_854) - 0.95).abs() < 1e-6);
    assert!(normal_upper_tail(40.0) < 1e-100);
}
use abiss_model::fixtures::laptop_disk as laptop;
use proptest::prelude::*;

fn control(mode: AdmissionMode, model: DeviceModel, p_req: f64, share: u32) -> AdmissionControl {
    AdmissionControl::new(
        "loop0".into(),
        model,
        "test model".into(),
        mode,
        p_req,
        share,
    )
}

fn reference_stream() -> StreamDemand {
    StreamDemand::playback(1_000_000, 564 * 1024, 20 * 4096)
}

#[test]
fn playback_loads_are_a_third_of_the_buffer_in_whole_batches() {
    assert_eq!(reference_stream().load_bytes, 3 * 20 * 4096);
    assert_eq!(StreamDemand::playback(1, 8192, 4096).load_bytes, 4096);
    assert_eq!(
        StreamDemand::playback(1, 1 << 20, 4096).load_bytes,
        349_525 / 4096 * 4096
    );
}

#[test]
fn statistical_admits_more_than_deterministic_on_the_laptop_disk() {
    let stream = reference_stream();
    let det = control(AdmissionMode::Deterministic, laptop(1.0, 11.1), 0.01, 95);
    let n_det = det
        .n_max(AdmissionMode::Deterministic, &[], &stream)
        .unwrap();
    let n_stat = det.n_max(AdmissionMode::Statistical, &[], &stream).unwrap();
    assert!(n_det >= 5, "{n_det}");
    assert!(
        f64::from(n_stat) >= 1.2 * f64::from(n_det),
        "{n_stat} vs {n_det}"
    );
}

#[test]
fn refusals_name_requested_available_and_miss_probability() {
    let admission = control(AdmissionMode::Statistical, laptop(1.0, 11.1), 0.01, 80);
    let stream = reference_stream();
    let n = admission
        .n_max(AdmissionMode::Statistical, &[], &stream)
        .unwrap() as usize;
    let existing = vec![stream; n];
    assert!(admission.admit(&existing[..n - 1], &stream).is_ok());
    let refusal = admission.admit(&existing, &stream).unwrap_err();
    let message = refusal.to_string();
    assert!(message.contains("1000000 B/s"), "{message}");
    assert!(message.contains("predicted miss probability"), "{message}");
    assert!(message.contains("1%"), "{message}");
    assert!(refusal.available_bps < 1_000_000, "{message}");
}

#[test]
fn writes_cost_more_than_reads() {
    let mut model = laptop(1.0, 11.1);
    model.write_read_ratio = 0.5;
    let admission = control(AdmissionMode::Statistical, model, 0.01, 80);
    let read = StreamDemand::playback(4_000_000, 4 << 20, 4096);
    let write = StreamDemand {
        write: true,
        ..read
    };
    let n_read = admission
        .n_max(AdmissionMode::Statistical, &[], &read)
        .unwrap();
    let n_write = admission
        .n_max(AdmissionMode::Statistical, &[], &write)
        .unwrap();
    assert!(n_write < n_read, "{n_write} vs {n_read}");
}

fn demand_strategy() -> impl Strategy<Value = StreamDemand> {
    (1u64..20_000_000, 0u64..2_000_000, 1u64..2048, any::<bool>()).prop_map(
        |(rate, stdev, pages, write)| StreamDemand {
            rate_bps: rate,
            rate_stdev_bps: stdev,
            load_bytes: pages * PAGE_BYTES,
            ahead_bytes: pages * PAGE_BYTES * 2,
            write,
        },
    )
}

fn model_strategy() -> impl Strategy<Value = DeviceModel> {
    (0.2f64..3.0, 0.0f64..20.0).prop_map(|(scale, rev)| laptop(scale, rev))
}

proptest! {
    /// Fewer streams, or a lower rate, never turn an admission into a refusal, and never
    /// raise the predicted miss probability where admission could accept.
    #[test]
    fn admission_is_monotone_in_streams_and_rate(
        model in model_strategy(),
        demands in proptest::collection::vec(demand_strategy(), 1..12),
        less in 0u64..20_000_000,
        p_req in 0.001f64..0.2,
        share in 1u32..=95,
        statistical: bool,
    ) {
        let mode = if statistical { AdmissionMode::Statistical } else { AdmissionMode::Deterministic };
        let admission = control(mode, model, p_req, share);
        let all = admission.predict(&demands);
        let fewer = admission.predict(&demands[..demands.len() - 1]);
        if all.miss_probability <= 0.5 {
            prop_assert!(fewer.miss_probability <= all.miss_probability + 1e-12);
        }
        if admission.fits(mode, &demands) {
            prop_assert!(admission.fits(mode, &demands[..demands.len() - 1]));
            let mut slower = demands.clone();
            let last = slower.last_mut().unwrap();
            last.rate_bps = last.rate_bps.saturating_sub(less).max(1);
            prop_assert!(admission.fits(mode, &slower));
            prop_assert!(admission.predict(&slower).miss_probability <= all.miss_probability + 1e-12);
        }
    }

    /// Statistical admission never admits more than the device can move, nor more work
    /// than the window holds.
    #[test]
    fn statistical_stays_within_physical_capacity(
        model in model_strategy(),
        demands in proptest::collection::vec(demand_strategy(), 1..40),
        p_req in 0.0001f64..0.5,
        share in 1u32..=95,
    ) {
        let admission = control(AdmissionMode::Statistical, model, p_req, share);
        if admission.fits(AdmissionMode::Statistical, &demands) {
            let sum: u64 = demands.iter().map(|d| d.rate_bps).sum();
            #[expect(clippy::cast_precision_loss, reason = "a comparison of rates")]
            let sum = sum as f64;
            prop_assert!(sum <= admission.model.max_read_bps());
            prop_assert!(admission.predict(&demands).mean_work_s <= SERVICE_WINDOW_S);
        }
    }

    /// Whatever the deterministic mode admits, the statistical one admits too.
    #[test]
    fn deterministic_never_admits_more_than_statistical(
        model in model_strategy(),
        demands in proptest::collection::vec(demand_strategy(), 1..20),
        p_req in 0.0001f64..0.5,
        share in 1u32..=95,
    ) {
        let admission = control(AdmissionMode::Statistical, model, p_req, share);
        if admission.fits(AdmissionMode::Deterministic, &demands) {
            prop_assert!(admission.fits(AdmissionMode::Statistical, &demands));
        }
        let stream = demands[0];
        let n_det = admission.n_max(AdmissionMode::Deterministic, &[], &stream);
        let n_stat = admission.n_max(AdmissionMode::Statistical, &[], &stream);
        prop_assert!(n_det <= n_stat);
    }
}
