//! SVG charts of the results (plotters): latency percentile curves per configuration,
//! deadline misses against the number of streams, and the tracer's cost per I/O.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::latency::PercentilePoint;

const SIZE: (u32, u32) = (960, 600);

/// A thin black horizontal line at `y` across `[0, width]`, with its legend entry: a deadline
/// or a goal the curves are read against.
pub(crate) fn reference_line<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    width: f64,
    y: f64,
    label: String,
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(
            [(0.0, y), (width, y)],
            BLACK.stroke_width(1),
        ))?
        .label(label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));
    Ok(())
}

/// Draws the legend in the upper left and writes the file.
pub(crate) fn finish<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    root: &DrawingArea<SVGBackend<'b>, Shift>,
) -> anyhow::Result<()> {
    legend(chart)?;
    root.present()?;
    Ok(())
}

/// Draws a chart's legend in its upper left.
pub(crate) fn legend<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// A bar chart with one slot per row, as the players and recording benchmarks draw it.
pub(crate) type RowChart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

/// Draws a bar chart with one slot per row into `path`: `caption` in sans-serif of
/// `font_size`, x from 0 to the number of `rows`, each slot named under its middle, and a
/// log-scale y axis over `y_range` described by `y_desc`; `draw` adds the bars and lines, then
/// the legend goes in and the file is written.
pub(crate) fn row_bars(
    path: &Path,
    caption: String,
    font_size: u32,
    rows: &[&str],
    (floor, top): (f64, f64),
    y_desc: &str,
    draw: impl FnOnce(&mut RowChart<'_, '_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    #[expect(clippy::cast_precision_loss, reason = "a handful of rows")]
    let width = rows.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", font_size))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..width, (floor..top).log_scale())?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(rows.len() * 2 + 1)
        .x_label_formatter(&|x| {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a bar index"
            )]
            let index = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                rows.get(index)
                    .map_or_else(String::new, |r| (*r).to_owned())
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()?;
    draw(&mut chart)?;
    finish(&mut chart, &root)
}

/// One configuration's percentile curve.
#[derive(Debug)]
pub struct LatencySeries<'a> {
    /// The configuration's name.
    pub name: &'a str,
    /// Its curve.
    pub curve: &'a [PercentilePoint],
}

/// The label of a position on the "nines" axis: 0 %, 90 %, 99 %, 99.9 %, …; nothing between.
#[must_use]
pub fn nines_label(nines: f64) -> String {
    let rounded = nines.round();
    if (nines - rounded).abs() > 1e-6 || rounded < 0.0 {
        return String::new();
    }
    if rounded == 0.0 {
        return "0%".to_owned();
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a small whole number of nines"
    )]
    let decimals = (rounded as usize).saturating_sub(2);
    format!("{:.*}%", decimals, 100.0 * (1.0 - 10f64.powf(-rounded)))
}

/// Enough labels on a nines axis reaching `max_nines` for every whole position to get one.
fn axis_labels(max_nines: f64) -> usize {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a small whole number of nines"
    )]
    let whole = max_nines.max(0.0) as usize;
    (whole + 1) * 2
}

/// Latency (log scale) against percentile (on a "nines" axis, so the tail gets as much room
/// as the body), one line per configuration, with the deadline slack B/R as a reference
/// line: a read issued on time that takes longer misses.
pub fn latency_percentiles(
    path: &Path,
    title: &str,
    series: &[LatencySeries<'_>],
    slack_ms: f64,
) -> anyhow::Result<()> {
    let points = || series.iter().flat_map(|s| s.curve.iter());
    let max_nines = points()
        .filter_map(PercentilePoint::nines)
        .fold(1.0, f64::max)
        .ceil();
    let (low, high) = points()
        .map(|p| p.latency_ms)
        .filter(|ms| *ms > 0.0)
        .fold((slack_ms, slack_ms), |(lo, hi), ms| {
            (lo.min(ms), hi.max(ms))
        });
    let low = 10f64.powf(low.log10().floor());
    let high = 10f64.powf(high.log10().ceil());

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..max_nines, (low..high).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile of reads")
        .y_desc("read(2) latency (ms)")
        .x_labels(axis_labels(max_nines))
        .x_label_formatter(&|x| nines_label(*x))
        .y_label_formatter(&|y| format!("{y}"))
        .draw()?;
    for (index, one) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let line = one
            .curve
            .iter()
            .filter_map(|p| p.nines().map(|x| (x, p.latency_ms.max(low))));
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(one.name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    reference_line(
        &mut chart,
        max_nines,
        slack_ms,
        format!("deadline slack B/R = {slack_ms:.0} ms"),
    )?;
    finish(&mut chart, &root)
}

/// One configuration's misses per step of the sweep.
#[derive(Debug)]
pub struct MissSeries<'a> {
    /// The configuration's name.
    pub name: &'a str,
    /// (streams, fraction of reads that missed) per step.
    pub steps: Vec<(usize, f64)>,
}

/// Fraction of reads that missed their deadline against the number of streams.
pub fn misses_by_streams(
    path: &Path,
    title: &str,
    series: &[MissSeries<'_>],
) -> anyhow::Result<()> {
    let max_streams = series
        .iter()
        .flat_map(|s| s.steps.iter().map(|(n, _)| *n))
        .max()
        .unwrap_or(1);
    let max_percent = series
        .iter()
        .flat_map(|s| s.steps.iter().map(|(_, f)| f * 100.0))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0..max_streams + 1, 0f64..max_percent * 1.1)?;
    chart
        .configure_mesh()
        .x_desc("real-time streams at 1 MB/s")
        .y_desc("reads that missed their deadline (%)")
        .draw()?;
    for (index, one) in series.iter().enumerate() {
        let points: Vec<(usize, f64)> = one.steps.iter().map(|(n, f)| (*n, f * 100.0)).collect();
        marked_line(&mut chart, index, one.name, points, 3)?;
    }
    finish(&mut chart, &root)
}

/// Draws `points` as the `index`th line of a chart, in the palette's `index`th colour, with a
/// dot of `radius` at each point and `name` in the legend.
pub(crate) fn marked_line<X, Y>(
    chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
    index: usize,
    name: &str,
    points: Vec<(X::ValueType, Y::ValueType)>,
    radius: u32,
) -> anyhow::Result<()>
where
    X: Ranged,
    Y: Ranged,
    X::ValueType: Clone + 'static,
    Y::ValueType: Clone + 'static,
{
    let color = Palette99::pick(index).to_rgba();
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(
        points
            .into_iter()
            .map(move |p| Circle::new(p, radius, color.filled())),
    )?;
    Ok(())
}

/// One situation's eBPF cost per I/O.
#[derive(Debug)]
pub struct CostBar<'a> {
    /// The situation, short.
    pub name: &'a str,
    /// Run time of all programs per I/O, as the kernel's statistics count it, in ns.
    pub ns_per_io: f64,
    /// The same less what the statistics charge an empty program per run.
    pub net_ns_per_io: f64,
}

/// ns per I/O per situation, as bars: the statistics' figure, and inside it the figure less
/// the statistics' own floor; `goals` are drawn as labelled horizontal lines.
pub fn cost_per_io(
    path: &Path,
    title: &str,
    bars: &[CostBar<'_>],
    goals: &[(&str, f64)],
) -> anyhow::Result<()> {
    let top = bars
        .iter()
        .map(|b| b.ns_per_io)
        .chain(goals.iter().map(|(_, ns)| *ns))
        .fold(100.0, f64::max)
        * 1.15;
    #[expect(clippy::cast_precision_loss, reason = "a handful of bars")]
    let width = bars.len() as f64;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..width, 0f64..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let slot = x - x.floor();
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a bar index"
            )]
            let index = x.floor() as usize;
            if (slot - 0.5).abs() < 0.01 {
                bars.get(index)
                    .map_or_else(String::new, |b| b.name.to_owned())
            } else {
                String::new()
            }
        })
        .y_desc("eBPF run time per I/O (ns)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let total = Palette99::pick(0).to_rgba();
    let net = Palette99::pick(1).to_rgba();
    chart
        .draw_series(bars.iter().enumerate().map(|(i, bar)| {
            #[expect(clippy::cast_precision_loss, reason = "a bar index")]
            let x = i as f64;
            Rectangle::new([(x + 0.15, 0.0), (x + 0.85, bar.ns_per_io)], total.filled())
        }))?
        .label("as the kernel's statistics count it")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], total.filled()));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, bar)| {
            #[expect(clippy::cast_precision_loss, reason = "a bar index")]
            let x = i as f64;
            Rectangle::new([(x + 0.3, 0.0), (x + 0.7, bar.net_ns_per_io)], net.filled())
        }))?
        .label("less the statistics' floor (an empty program's ns per run)")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], net.filled()));
    for (name, ns) in goals {
        reference_line(&mut chart, width, *ns, format!("{name}: {ns:.0} ns"))?;
    }
    finish(&mut chart, &root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_drawn_as_a_marked_line_with_its_legend() {
        let path = std::env::temp_dir().join(format!("abiss-chart-{}.svg", std::process::id()));
        let series = [
            MissSeries {
                name: "first row",
                steps: vec![(1, 0.0), (2, 0.01), (4, 0.2)],
            },
            MissSeries {
                name: "second row",
                steps: vec![(1, 0.0), (2, 0.0)],
            },
        ];
        misses_by_streams(&path, "misses", &series).expect("draw");
        let svg = std::fs::read_to_string(&path).expect("the chart");
        let _ = std::fs::remove_file(&path);
        assert!(svg.contains("first row") && svg.contains("second row"));
        // One dot per step.
        assert_eq!(svg.matches("<circle").count(), 5, "{svg}");
    }

    #[test]
    fn nines_are_labelled_at_whole_positions_only() {
        assert_eq!(nines_label(0.0), "0%");
        assert_eq!(nines_label(1.0), "90%");
        assert_eq!(nines_label(2.0), "99%");
        assert_eq!(nines_label(3.0), "99.9%");
        assert_eq!(nines_label(4.0), "99.99%");
        assert_eq!(nines_label(1.5), "");
    }

    #[test]
    fn charts_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("abiss-bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let curve = [
            PercentilePoint {
                percentile: 0.0,
                latency_ms: 0.01,
            },
            PercentilePoint {
                percentile: 90.0,
                latency_ms: 5.0,
            },
            PercentilePoint {
                percentile: 99.0,
                latency_ms: 80.0,
            },
            PercentilePoint {
                percentile: 100.0,
                latency_ms: 300.0,
            },
        ];
        let latency = dir.join("latency.svg");
        latency_percentiles(
            &latency,
            "test",
            &[LatencySeries {
                name: "bfq",
                curve: &curve,
            }],
            577.5,
        )
        .unwrap();
        let text = std::fs::read_to_string(&latency).unwrap();
        assert!(text.starts_with("<svg") && text.contains("bfq") && text.contains("99%"));
        let misses = dir.join("misses.svg");
        misses_by_streams(
            &misses,
            "test",
            &[MissSeries {
                name: "none",
                steps: vec![(1, 0.0), (2, 0.01)],
            }],
        )
        .unwrap();
        assert!(std::fs::read_to_string(&misses).unwrap().contains("none"));
        let cost = dir.join("cost.svg");
        cost_per_io(
            &cost,
            "test",
            &[CostBar {
                name: "idle",
                ns_per_io: 150.0,
                net_ns_per_io: 20.0,
            }],
            &[("goal", 100.0)],
        )
        .unwrap();
        assert!(std::fs::read_to_string(&cost).unwrap().contains("idle"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
