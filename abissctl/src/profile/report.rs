//! The profile for people: what `abissctl profile` prints without `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use abiss_model::DeviceModel;

use abiss_proto::{ByteRate, ByteSize};

use super::{as_f64, KIB};

/// A measured rate as people read it (`57.2MiB/s`; rounded down to whole bytes per second).
fn rate(bytes_per_second: f64) -> String {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a measured rate in B/s, for people"
    )]
    ByteRate(bytes_per_second.max(0.0) as u64).readable()
}

/// The model for people.
#[must_use]
pub fn describe(model: &DeviceModel, took: Duration) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "device {}: {} profile in {:.0} s",
        model.identity,
        if model.quick { "quick" } else { "full" },
        took.as_secs_f64()
    );
    let _ = writeln!(
        text,
        "sequential read: {} (outer) to {} (slowest zone); writes {}",
        rate(model.zones.first().map_or(0.0, |z| z.read_bps)),
        rate(model.min_read_bps()),
        if model.writes_measured {
            format!(
                "at {:.0}% of reads (measured)",
                model.write_read_ratio * 100.0
            )
        } else {
            format!(
                "not measured (assumed {:.0}% of reads; --write measures them)",
                model.write_read_ratio * 100.0
            )
        }
    );
    let _ = writeln!(text, "\n  position        read       write");
    for zone in &model.zones {
        let _ = writeln!(
            text,
            "  {:>7.1}%  {:>10}  {:>10}",
            zone.position * 100.0,
            rate(zone.read_bps),
            zone.write_bps.map_or_else(|| "-".to_owned(), rate)
        );
    }
    describe_access(model, &mut text);
    text
}

/// The access-time part: rotation, the seek curve and the measured points beside it, and the
/// random reads by size and by requests in flight.
fn describe_access(model: &DeviceModel, text: &mut String) {
    let (seek_mean, _) = model.seek.random_seek_moments();
    let _ = writeln!(
        text,
        "\naccess time: {:.2} ms mean at random positions (σ {:.2} ms); rotation {:.2} ms per revolution ({:.0} rpm); random seek {:.2} ms",
        model.mean_access_ms,
        model.access_stdev_ms,
        model.revolution_ms,
        if model.revolution_ms > 0.0 { 60_000.0 / model.revolution_ms } else { 0.0 },
        seek_mean
    );
    let _ = writeln!(
        text,
        "seek curve: {:.2} ms minimum, {:.2} ms at {:.0}% of the disk (square root below, linear above), {:.2} ms full stroke",
        model.seek.min_ms,
        model.seek.knee_ms,
        model.seek.knee_fraction * 100.0,
        model.seek.full_stroke_ms
    );
    let _ = writeln!(text, "\n  distance   access ms   fitted seek + rotation/2");
    for point in &model.seek_points {
        let _ = writeln!(
            text,
            "  {:>7.2}%  {:>10.2}  {:>10.2}",
            point.distance * 100.0,
            point.access_ms,
            model.seek.seek_ms(point.distance) + model.revolution_ms / 2.0
        );
    }
    let _ = writeln!(text, "\n  random read size   ms per read        rate");
    for point in &model.request_sizes {
        let _ = writeln!(
            text,
            "  {:>16}  {:>11.2}  {:>10}",
            ByteSize(point.bytes).readable(),
            point.service_ms,
            rate(as_f64(point.bytes) / point.service_ms * 1e3)
        );
    }
    let _ = writeln!(
        text,
        "\n  in flight   ms per {} read",
        ByteSize(64 * KIB).readable()
    );
    for point in &model.queue_depths {
        let _ = writeln!(text, "  {:>9}   {:>10.2}", point.depth, point.service_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abiss_model::fixtures::{laptop_disk, LAPTOP_REVOLUTION_MS};

    #[test]
    fn the_description_names_the_device_its_rates_and_its_rotation() {
        let text = describe(
            &laptop_disk(1.0, LAPTOP_REVOLUTION_MS),
            Duration::from_secs(42),
        );
        assert!(
            text.starts_with(
                "device dev-7_0-4294967296 (7:0, 4294967296 bytes): full profile in 42 s"
            ),
            "{text}"
        );
        assert!(text.contains("60MB/s (outer) to 35MB/s"), "{text}");
        assert!(text.contains("(5400 rpm)"), "{text}");
    }
}
