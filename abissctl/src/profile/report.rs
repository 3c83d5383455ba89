//! The profile for people: what `abissctl profile` prints without `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use abiss_model::DeviceModel;

use super::{as_f64, KIB};

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
        "sequential read: {:.1} MB/s (outer) to {:.1} MB/s (slowest zone); writes {}",
        model.zones.first().map_or(0.0, |z| z.read_bps / 1e6),
        model.min_read_bps() / 1e6,
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
    let _ = writeln!(text, "\n  position   read MB/s  write MB/s");
    for zone in &model.zones {
        let _ = writeln!(
            text,
            "  {:>7.1}%  {:>10.1}  {:>10}",
            zone.position * 100.0,
            zone.read_bps / 1e6,
            zone.write_bps
                .map_or_else(|| "-".to_owned(), |w| format!("{:.1}", w / 1e6))
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
    let _ = writeln!(text, "\n  random read size   ms per read   MB/s");
    for point in &model.request_sizes {
        let _ = writeln!(
            text,
            "  {:>12} KiB  {:>11.2}  {:>6.1}",
            point.bytes / KIB,
            point.service_ms,
            as_f64(point.bytes) / point.service_ms / 1e3
        );
    }
    let _ = writeln!(text, "\n  in flight   ms per 64 KiB read");
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
        assert!(text.contains("60.0 MB/s (outer) to 35.0 MB/s"), "{text}");
        assert!(text.contains("(5400 rpm)"), "{text}");
    }
}
