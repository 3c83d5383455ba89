//! What `abissctl top` draws: a header, the streams, the managed disks and a legend.
//!
//! Colour only emphasises (misses, raised readers, headings): every figure is also written out,
//! and without colour (`NO_COLOR`, `--no-color`) the view has the same text.

use std::time::Duration;

use abiss_proto::{ByteRate, ByteSize, Log2Histogram, StreamInfo};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::{Disk, Sample};

/// Styles for the view, with or without colour.
struct Styles {
    title: Style,
    heading: Style,
    alert: Style,
    raised: Style,
}

impl Styles {
    fn new(colour: bool) -> Self {
        let bold = Style::new().add_modifier(Modifier::BOLD);
        if colour {
            Self {
                title: bold.fg(Color::Cyan),
                heading: bold.fg(Color::Yellow),
                alert: bold.fg(Color::Red),
                raised: Style::new().fg(Color::Magenta),
            }
        } else {
            Self {
                title: bold,
                heading: bold,
                alert: bold,
                raised: Style::new(),
            }
        }
    }
}

/// Draws one sample on the whole frame.
pub fn draw(frame: &mut Frame, sample: &Sample, colour: bool) {
    let styles = Styles::new(colour);
    let disk_rows = u16::try_from(sample.disks.len().max(1)).unwrap_or(u16::MAX);
    // The few disks first, at their height; the streams take the rest.
    let [header, daemon, disks, streams, legend] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(disk_rows.saturating_add(3)),
        Constraint::Min(4),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header_line(sample, &styles)), header);
    frame.render_widget(Paragraph::new(daemon_line(sample)), daemon);
    draw_streams(frame, streams, &sample.streams, &styles);
    draw_disks(frame, disks, &sample.disks, &styles);
    frame.render_widget(Paragraph::new(legend_line(sample.covered)), legend);
}

fn header_line(sample: &Sample, styles: &Styles) -> Line<'static> {
    Line::from(vec![
        Span::styled("abissctl top", styles.title),
        Span::raw(format!(
            "  refresh {} every {:.1} s  {} UTC  {} streams, {} managed disks   q: quit",
            sample.refresh,
            sample.interval.as_secs_f64(),
            sample.clock,
            sample.streams.len(),
            sample.disks.len()
        )),
    ])
}

fn daemon_line(sample: &Sample) -> Line<'static> {
    let raises = &sample.report.raises;
    let memory = &sample.report.memory;
    let raise_line = if raises.enabled {
        format!(
            "reader raises: {} raised now, {} in all",
            raises.active, raises.total
        )
    } else {
        "reader raises: off".to_owned()
    };
    Line::from(format!(
        "{raise_line}   locked memory: {} of {} (reserved {})",
        size(memory.locked_bytes),
        size(memory.budget_bytes),
        size(memory.reserved_bytes)
    ))
}

fn legend_line(covered: Duration) -> Line<'static> {
    let window = if covered.is_zero() {
        "(from the next refresh)".to_owned()
    } else {
        format!("in the last {:.1} s", covered.as_secs_f64())
    };
    Line::from(format!(
        "latency: service time of the requests completed {window} (p50/p99: log2 bucket upper bounds; BE includes class-less requests)   ^: reader raised"
    ))
}

fn heading<'a>(names: &[&'a str], styles: &Styles) -> Row<'a> {
    Row::new(names.iter().map(|&name| Cell::from(name))).style(styles.heading)
}

fn draw_streams(frame: &mut Frame, area: Rect, streams: &[StreamInfo], styles: &Styles) {
    let block = Block::bordered().title(Span::styled(" streams ", styles.title));
    let head = heading(
        &[
            "ID", "FILE", "RATE", "BUFFER", "WINDOW", "RESIDENT", "CREDIT", "MISSES", "RAISED",
            "READERS",
        ],
        styles,
    );
    let rows: Vec<Row> = if streams.is_empty() {
        vec![Row::new([
            Cell::from(""),
            Cell::from("no streams (abissctl attach FILE --rate R)"),
        ])]
    } else {
        streams
            .iter()
            .map(|info| stream_row(info, styles))
            .collect()
    };
    let widths = [
        Constraint::Length(5),
        Constraint::Fill(2),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(17),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths).header(head).block(block);
    frame.render_widget(table, area);
}

fn stream_row<'a>(info: &'a StreamInfo, styles: &Styles) -> Row<'a> {
    let raised = info.readers.iter().filter(|r| r.raised).count();
    let misses = Cell::from(info.misses.to_string());
    let misses = if info.misses > 0 {
        misses.style(styles.alert)
    } else {
        misses
    };
    let raised_cell = Cell::from(format!("{raised}/{}", info.readers.len()));
    let raised_cell = if raised > 0 {
        raised_cell.style(styles.raised)
    } else {
        raised_cell
    };
    Row::new([
        Cell::from(info.id.to_string()),
        Cell::from(left_ellipsis(&info.path, 56)),
        // Exact when short (`1MB/s`, `564KiB`, as usually attached), else three digits.
        Cell::from(info.rate.readable()),
        Cell::from(info.buffer.readable()),
        Cell::from(format!(
            "{}-{}",
            size(info.window_start),
            size(info.loaded_end)
        )),
        Cell::from(size(info.resident_bytes)),
        Cell::from(crate::sizes::signed_size(info.credit_bytes)),
        misses,
        raised_cell,
        Cell::from(readers(info)),
    ])
}

fn readers(info: &StreamInfo) -> String {
    if info.readers.is_empty() {
        return "-".to_owned();
    }
    info.readers
        .iter()
        .map(|r| format!("{}({}){}", r.comm, r.pid, if r.raised { "^" } else { "" }))
        .collect::<Vec<_>>()
        .join(",")
}

fn draw_disks(frame: &mut Frame, area: Rect, disks: &[Disk], styles: &Styles) {
    let block = Block::bordered().title(Span::styled(" managed disks ", styles.title));
    let head = heading(
        &[
            "DISK",
            "DEV",
            "ELEVATOR",
            "ADMISSION",
            "RESERVED",
            "FREE",
            "STREAMS",
            "RT REQS",
            "RT P50",
            "RT P99",
            "BE REQS",
            "BE P50",
            "BE P99",
        ],
        styles,
    );
    let rows: Vec<Row> = if disks.is_empty() {
        vec![Row::new([Cell::from(
            "abissd manages no disk (start it with --device DEV)",
        )])]
    } else {
        disks.iter().map(disk_row).collect()
    };
    let mut widths = vec![Constraint::Length(10), Constraint::Length(7)];
    widths.extend([Constraint::Length(12), Constraint::Length(13)]);
    widths.extend([Constraint::Length(11); 2]);
    widths.push(Constraint::Length(7));
    widths.extend([Constraint::Length(8); 6]);
    if disks.is_empty() {
        widths = vec![Constraint::Fill(1)];
    }
    let table = Table::new(rows, widths).header(head).block(block);
    frame.render_widget(table, area);
}

fn disk_row(disk: &Disk) -> Row<'_> {
    let status = &disk.status;
    Row::new([
        status.name.clone(),
        status.device.to_string(),
        status.elevator.clone(),
        status.admission.clone(),
        rate(status.reserved.0),
        rate(status.free.0),
        status.streams.to_string(),
        disk.rt.count().to_string(),
        quantile(&disk.rt, 0.5),
        quantile(&disk.rt, 0.99),
        disk.be.count().to_string(),
        quantile(&disk.be, 0.5),
        quantile(&disk.be, 0.99),
    ])
}

/// A latency quantile as `812us` or `4.1ms`; `-` without requests.
fn quantile(histogram: &Log2Histogram, q: f64) -> String {
    match histogram.quantile_us(q) {
        None => "-".to_owned(),
        Some(us) if us < 1000 => format!("{us}us"),
        #[expect(clippy::cast_precision_loss, reason = "a rounded figure for people")]
        Some(us) if us < 10_000_000 => format!("{:.1}ms", us as f64 / 1000.0),
        #[expect(clippy::cast_precision_loss, reason = "a rounded figure for people")]
        Some(us) => format!("{:.0}s", us as f64 / 1_000_000.0),
    }
}

/// A byte count as people read it: `812B`, `564KiB`, `1.1MiB`, `12MiB`.
fn size(bytes: u64) -> String {
    ByteSize(bytes).readable()
}

fn rate(bytes_per_second: u64) -> String {
    ByteRate(bytes_per_second).readable()
}

/// The end of `text` in at most `width` characters, with `…` in front when cut: a path's
/// file name matters more than its directories.
fn left_ellipsis(text: &str, width: usize) -> String {
    let count = text.chars().count();
    if count <= width {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(count - width + 1).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use abiss_proto::{
        ByteRate, ByteSize, DeviceNumber, DeviceStatus, ReaderInfo, StatusReport, StreamId,
        LATENCY_BUCKETS,
    };
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    fn stream() -> StreamInfo {
        let disk = DeviceNumber { major: 7, minor: 3 };
        StreamInfo {
            id: StreamId(42),
            owner_uid: 0,
            path: "/mnt/lab/movie.bin".into(),
            file_device: disk,
            disk,
            disks: vec![disk],
            warnings: Vec::new(),
            inode: 12,
            file_bytes: 64 << 20,
            rate: ByteRate(1_000_000),
            buffer: ByteSize(564 << 10),
            batch_pages: 20,
            priority: 0,
            persistent: true,
            playout_point: 1 << 20,
            window_start: 1 << 20,
            loaded_end: (1 << 20) + (564 << 10),
            resident_bytes: 564 << 10,
            locked_bytes: 564 << 10,
            credit_bytes: -4096,
            readers: vec![ReaderInfo {
                pid: 4242,
                comm: "player".into(),
                raised: true,
            }],
            misses: 3,
            seek_waits: 0,
            prefetched_bytes: 2 << 20,
            raises: 1,
            uring_requests: 0,
            suggestion: None,
            start_limited: false,
            policed: 0,
            recording: None,
            buffer_auto: None,
        }
    }

    fn sample() -> Sample {
        let mut slots = vec![0; LATENCY_BUCKETS];
        slots[13] = 10; // [4096, 8192) µs
        Sample {
            refresh: 7,
            clock: "12:34:56".into(),
            covered: Duration::from_secs(1),
            interval: Duration::from_secs(1),
            streams: vec![stream()],
            disks: vec![Disk {
                status: DeviceStatus {
                    name: "loop3".into(),
                    device: DeviceNumber { major: 7, minor: 3 },
                    elevator: "mq-deadline".into(),
                    dispatch_depth: 8,
                    capacity: ByteRate(20_000_000),
                    capacity_source: "configured".into(),
                    realtime_share_percent: 80,
                    reserved: ByteRate(1_000_000),
                    reserved_write: ByteRate(0),
                    free: ByteRate(15_000_000),
                    streams: 1,
                    admission: "share".into(),
                    miss_probability_ppm: 0,
                    built_on: Vec::new(),
                },
                rt: Log2Histogram::from_slots(&slots, 5_000_000),
                be: Log2Histogram::default(),
            }],
            report: StatusReport {
                devices: Vec::new(),
                raises: abiss_proto::RaiseReport::default(),
                capabilities: Vec::new(),
                memory: abiss_proto::MemoryReport::default(),
                main_loop: abiss_proto::LoopReport::default(),
            },
        }
    }

    fn render(colour: bool) -> ratatui::buffer::Buffer {
        let mut terminal = Terminal::new(TestBackend::new(160, 40)).expect("test terminal");
        terminal
            .draw(|frame| draw(frame, &sample(), colour))
            .expect("draw");
        terminal.backend().buffer().clone()
    }

    fn text(buffer: &ratatui::buffer::Buffer) -> String {
        let width = usize::from(buffer.area.width);
        buffer
            .content
            .chunks(width)
            .map(|line| {
                line.iter()
                    .map(ratatui::buffer::Cell::symbol)
                    .collect::<String>()
                    + "\n"
            })
            .collect()
    }

    #[test]
    fn the_view_shows_the_stream_and_the_disk_in_words() {
        let screen = text(&render(true));
        for needle in [
            "refresh 7",
            "/mnt/lab/movie.bin",
            "1MB/s",
            "1MiB-1.55MiB",
            "-4KiB",
            "player(4242)^",
            "1/1",
            "loop3",
            "15MB/s",
            // The RT p50, capped by the 5 ms maximum.
            "5.0ms",
        ] {
            assert!(screen.contains(needle), "{needle} missing from\n{screen}");
        }
    }

    #[test]
    fn without_colour_the_text_is_the_same_and_nothing_is_coloured() {
        let coloured = render(true);
        let plain = render(false);
        assert_eq!(text(&coloured), text(&plain));
        assert!(coloured.content.iter().any(|cell| cell.fg != Color::Reset));
        assert!(plain
            .content
            .iter()
            .all(|cell| cell.fg == Color::Reset && cell.bg == Color::Reset));
    }

    #[test]
    fn figures_are_short() {
        assert_eq!(size(812), "812B");
        assert_eq!(size(564 << 10), "564KiB");
        assert_eq!(size(1_153_434), "1.1MiB");
        assert_eq!(left_ellipsis("/a/b/movie.bin", 10), "…movie.bin");
        assert_eq!(left_ellipsis("movie.bin", 10), "movie.bin");
    }
}
