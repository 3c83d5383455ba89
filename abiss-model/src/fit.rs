//! Fitting a [`DeviceModel`] to raw [`Measurements`]: the zone profile and the measured points
//! are kept, the rotation comes from the spread of access times at one distance, and a seek
//! curve is fitted to the access times with the rotation taken out.

use std::time::SystemTime;

use statrs::statistics::{Data, OrderStatistics};

use crate::{
    DeviceIdentity, DeviceModel, QueueDepthPoint, RequestSizePoint, SeekCurve, SeekPoint,
    ZonePoint, ASSUMED_WRITE_READ_RATIO, DEVICE_MODEL_VERSION,
};

/// The raw measurements a model is fitted to, as `abissctl profile` takes them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurements {
    /// Sequential rates by position, ordered by position (they become the model's zones).
    pub zones: Vec<ZonePoint>,
    /// Access times (ms) of small reads at each seek distance (a fraction of the capacity).
    pub seeks: Vec<(f64, Vec<f64>)>,
    /// Access times (ms) of small reads at random positions, one after another.
    pub random_ms: Vec<f64>,
    /// Random reads by request size.
    pub sizes: Vec<RequestSizePoint>,
    /// Random reads by requests in flight.
    pub depths: Vec<QueueDepthPoint>,
}

#[expect(clippy::cast_precision_loss, reason = "sample counts far below 2^52")]
fn count(values: &[f64]) -> f64 {
    values.len() as f64
}

/// The arithmetic mean; 0 of nothing.
fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / count(values)
}

/// The sample variance (n − 1); 0 of fewer than two values.
fn variance(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let m = mean(values);
    values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (count(values) - 1.0)
}

/// The samples at or below Tukey's upper fence (the third quartile plus 1.5 interquartile
/// ranges). A device's own spread never reaches it (uniform rotational latency ends half an
/// interquartile range above the third quartile), but a sample that the host stalled does, and
/// one such sample among two dozen would double the variance the rotation is read from. Only
/// the upper side is fenced: interference adds time, it never takes any away.
fn below_upper_fence(values: &[f64]) -> Vec<f64> {
    if values.len() < 4 {
        return values.to_vec();
    }
    let mut data = Data::new(values.to_vec());
    let fence = data.upper_quartile() + 1.5 * data.interquartile_range();
    values.iter().copied().filter(|v| *v <= fence).collect()
}

/// Fits the model to the measurements; only the time stamp comes from outside them (the
/// clock, now).
#[must_use]
pub fn fit(identity: DeviceIdentity, quick: bool, m: &Measurements) -> DeviceModel {
    // Rotation: at one distance the seek is fixed and the rotational latency uniform over a
    // revolution, so the spread of the access times there is the revolution's: σ² = rev²/12.
    // Pooled over distances; the longest distances are left out (their seek varies most), and
    // so are samples the host stalled (see `below_upper_fence`).
    let pooled: Vec<f64> = m
        .seeks
        .iter()
        .filter(|(d, s)| *d <= 0.5 && s.len() >= 2)
        .map(|(_, s)| variance(&below_upper_fence(s)))
        .collect();
    let revolution_ms = (12.0 * mean(&pooled)).sqrt();
    let seek_points: Vec<SeekPoint> = m
        .seeks
        .iter()
        .map(|(distance, samples)| SeekPoint {
            distance: *distance,
            access_ms: mean(samples),
            samples: u32::try_from(samples.len()).unwrap_or(u32::MAX),
        })
        .collect();
    let seek = fit_seek_curve(&seek_points, revolution_ms / 2.0);
    let ratios: Vec<f64> = m
        .zones
        .iter()
        .filter_map(|z| z.write_bps.map(|w| w / z.read_bps))
        .collect();
    let writes_measured = !ratios.is_empty();
    DeviceModel {
        version: DEVICE_MODEL_VERSION,
        identity,
        measured_at_unix_s: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        quick,
        zones: m.zones.clone(),
        write_read_ratio: if writes_measured {
            mean(&ratios).clamp(0.01, 2.0)
        } else {
            ASSUMED_WRITE_READ_RATIO
        },
        writes_measured,
        seek_points,
        seek,
        revolution_ms,
        mean_access_ms: mean(&m.random_ms),
        access_stdev_ms: variance(&m.random_ms).sqrt(),
        request_sizes: m.sizes.clone(),
        queue_depths: m.depths.clone(),
    }
}

/// Fits the seek curve to the mean access times with the mean rotational latency taken out:
/// the shortest distance gives the minimum; for each candidate knee the knee and full-stroke
/// times follow by least squares (the curve is linear in both); the best knee wins.
#[must_use]
pub fn fit_seek_curve(points: &[SeekPoint], mean_rotation_ms: f64) -> SeekCurve {
    let seeks: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.distance, (p.access_ms - mean_rotation_ms).max(0.0)))
        .collect();
    let min_ms = seeks
        .iter()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map_or(0.0, |p| p.1);
    let mut best: Option<(f64, SeekCurve)> = None;
    for step in 1..=40 {
        let knee = f64::from(step) * 0.02;
        if knee >= 0.95 {
            break;
        }
        // Each point is a·K + b·F + c with K the knee time and F the full stroke.
        let rows: Vec<(f64, f64, f64, f64)> = seeks
            .iter()
            .map(|&(d, t)| {
                if d < knee {
                    let s = (d / knee).sqrt();
                    (s, 0.0, min_ms * (1.0 - s), t)
                } else {
                    let u = (d - knee) / (1.0 - knee);
                    (1.0 - u, u, 0.0, t)
                }
            })
            .collect();
        let (mut aa, mut ab, mut bb, mut ay, mut by) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(a, b, c, t) in &rows {
            let y = t - c;
            aa += a * a;
            ab += a * b;
            bb += b * b;
            ay += a * y;
            by += b * y;
        }
        let det = aa * bb - ab * ab;
        if det.abs() < 1e-12 {
            continue;
        }
        let knee_ms = ((ay * bb - by * ab) / det).max(min_ms);
        let full_ms = ((aa * by - ab * ay) / det).max(knee_ms);
        let curve = SeekCurve {
            min_ms,
            knee_fraction: knee,
            knee_ms,
            full_stroke_ms: full_ms,
        };
        let error: f64 = seeks
            .iter()
            .map(|&(d, t)| (curve.seek_ms(d) - t).powi(2))
            .sum();
        if best.as_ref().is_none_or(|(e, _)| error < *e) {
            best = Some((error, curve));
        }
    }
    best.map_or(
        SeekCurve {
            min_ms,
            knee_fraction: 0.2,
            knee_ms: min_ms,
            full_stroke_ms: min_ms,
        },
        |(_, curve)| curve,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seek_fit_recovers_a_known_curve() {
        let truth = SeekCurve {
            min_ms: 1.0,
            knee_fraction: 0.2,
            knee_ms: 6.0,
            full_stroke_ms: 11.5,
        };
        let points: Vec<SeekPoint> = [0.001, 0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9]
            .iter()
            .map(|&d| SeekPoint {
                distance: d,
                access_ms: truth.seek_ms(d) + 5.0,
                samples: 10,
            })
            .collect();
        let fitted = fit_seek_curve(&points, 5.0);
        for d in [0.05, 0.3, 0.6, 1.0] {
            assert!(
                (fitted.seek_ms(d) - truth.seek_ms(d)).abs() < 0.6,
                "at {d}: {fitted:?}"
            );
        }
        let (truth_mean, _) = truth.random_seek_moments();
        let (fit_mean, _) = fitted.random_seek_moments();
        assert!((truth_mean - fit_mean).abs() / truth_mean < 0.05);
    }

    /// `n` access times at seek distance `d`: a fixed seek and a rotational latency spread
    /// evenly over an 11.1 ms revolution.
    fn uniform_access_ms(d: f64, n: u32) -> Vec<f64> {
        (0..n)
            .map(|i| 3.0 + d * 10.0 + 11.1 * (f64::from(i) + 0.5) / f64::from(n))
            .collect()
    }

    /// The model fitted to `seeks` and fixed zone and random-access figures.
    fn fit_seeks(seeks: Vec<(f64, Vec<f64>)>) -> DeviceModel {
        let m = Measurements {
            zones: vec![ZonePoint {
                position: 0.5,
                read_bps: 50e6,
                write_bps: None,
            }],
            seeks,
            random_ms: vec![12.0, 13.0],
            ..Measurements::default()
        };
        fit(crate::fixtures::laptop_identity(), true, &m)
    }

    #[test]
    fn rotation_comes_from_the_spread_at_one_distance() {
        // Uniform latencies over 11.1 ms on top of fixed seeks.
        let seeks = [0.01, 0.1, 0.3]
            .iter()
            .map(|&d| (d, uniform_access_ms(d, 1000)))
            .collect();
        let model = fit_seeks(seeks);
        assert!(
            (model.revolution_ms - 11.1).abs() < 0.1,
            "{}",
            model.revolution_ms
        );
        assert!(model.validate().is_ok());
        assert!(!model.writes_measured);
    }

    #[test]
    fn a_few_stalled_samples_do_not_stretch_the_revolution() {
        // 24 samples at each distance, uniform over 11.1 ms, as a quick profile takes them;
        // at two distances one sample was stalled by the host for 60 ms.
        let seeks = [0.001, 0.01, 0.05, 0.1, 0.2, 0.35, 0.5]
            .iter()
            .enumerate()
            .map(|(k, &d)| {
                let mut samples = uniform_access_ms(d, 24);
                if k % 3 == 0 {
                    samples[k] += 60.0;
                }
                (d, samples)
            })
            .collect();
        let model = fit_seeks(seeks);
        assert!(
            (model.revolution_ms - 11.1).abs() < 0.3,
            "{}",
            model.revolution_ms
        );
    }
}
