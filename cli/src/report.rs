//! `bench --report report.html`: one self-contained HTML page (inline SVG,
//! no scripts, no network fetches) with rows/s over time, the wait of each
//! batch, each stage's busy and blocked fractions and the queue depths, plus
//! the run's settings and summary.

use std::fmt::Write;

use crate::bench::BenchReport;

/// What `bench` samples while it runs, for the report.
#[derive(Default)]
pub struct Timeline {
    /// Per batch: seconds since the start, and the wait in `next()` (ms).
    pub batches: Vec<(f64, f64, u64)>,
    /// Every few batches: seconds since the start, decode queue, output queue.
    pub queues: Vec<(f64, u64, u64)>,
}

/// Batches kept at most: past it, every other sample is dropped (memory
/// stays bounded on long runs; the plots keep their shape).
const MAX_SAMPLES: usize = 20_000;

impl Timeline {
    /// Record a batch of `rows` rows at `t` that waited `wait_ms`.
    pub fn batch(&mut self, t: f64, wait_ms: f64, rows: u64) {
        self.batches.push((t, wait_ms, rows));
        if self.batches.len() > MAX_SAMPLES {
            thin(&mut self.batches);
        }
    }

    /// Record the queue depths at `t`.
    pub fn queues(&mut self, t: f64, decode: u64, output: u64) {
        self.queues.push((t, decode, output));
        if self.queues.len() > MAX_SAMPLES {
            thin(&mut self.queues);
        }
    }
}

fn thin<T: Copy>(v: &mut Vec<T>) {
    let kept: Vec<T> = v.iter().step_by(2).copied().collect();
    *v = kept;
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 260.0;
const MARGIN: f64 = 70.0;

/// A tick label: fewer decimals for larger numbers.
fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A plotted series: name, colour, points.
type Series<'a> = (&'a str, &'a str, Vec<(f64, f64)>);

/// A line chart of `series` with axes and ticks.
fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let points = series.iter().flat_map(|s| s.2.iter());
    let (mut x_max, mut y_max) = (0f64, 0f64);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
    }
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.05 } else { 1.0 };
    let (w, h) = (WIDTH - 2.0 * MARGIN, HEIGHT - 2.0 * MARGIN);
    let px = |x: f64| MARGIN + x / x_max * w;
    let py = |y: f64| HEIGHT - MARGIN - y / y_max * h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<figure><figcaption>{}</figcaption><svg class=\"plot\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\">",
        escape(title)
    );
    let _ = write!(
        svg,
        "<rect x=\"{MARGIN}\" y=\"{MARGIN}\" width=\"{w}\" height=\"{h}\" fill=\"#fafafa\" stroke=\"#999\"/>"
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let (x, y) = (px(f * x_max), py(f * y_max));
        let _ = write!(
            svg,
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>\
             <line x1=\"{MARGIN}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>",
            HEIGHT - MARGIN + 15.0,
            num(f * x_max),
            MARGIN - 5.0,
            y + 4.0,
            num(f * y_max),
            WIDTH - MARGIN,
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{}</text>\
         <text x=\"14\" y=\"{:.1}\" font-size=\"12\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{}</text>",
        WIDTH / 2.0,
        HEIGHT - 12.0,
        escape(x_label),
        HEIGHT / 2.0,
        HEIGHT / 2.0,
        escape(y_label)
    );
    for (i, (name, colour, pts)) in series.iter().enumerate() {
        let mut path = String::new();
        for &(x, y) in pts {
            let _ = write!(path, "{:.1},{:.1} ", px(x), py(y));
        }
        let _ = write!(
            svg,
            "<polyline class=\"series\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"{colour}\">{}</text>",
            path.trim_end(),
            MARGIN + 10.0 + 160.0 * i as f64,
            MARGIN - 8.0,
            escape(name)
        );
    }
    svg.push_str("</svg></figure>\n");
    svg
}

/// Horizontal bars: each stage's busy, blocked-on-input and blocked-on-output fractions.
fn stage_bars(report: &BenchReport) -> String {
    let rows = report.stages.len().max(1) as f64;
    let height = MARGIN + rows * 34.0 + 30.0;
    let w = WIDTH - 2.0 * MARGIN - 180.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<figure><figcaption>Stage time per worker: busy, waiting for input, waiting for room for output (bottleneck: {})</figcaption>\
         <svg class=\"plot\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\">",
        escape(&report.bottleneck)
    );
    for (i, (name, s)) in report.stages.iter().enumerate() {
        let y = MARGIN + i as f64 * 34.0;
        let mut x = MARGIN + 60.0;
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">{}</text>",
            MARGIN + 52.0,
            y + 16.0,
            escape(name)
        );
        for (value, colour) in [
            (s.busy_fraction, "#2b7bb9"),
            (s.blocked_input_fraction, "#e8a33d"),
            (s.blocked_output_fraction, "#9a9a9a"),
        ] {
            let bw = value.clamp(0.0, 1.0) * w;
            let _ = write!(
                svg,
                "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"22\" fill=\"{colour}\"/>"
            );
            x += bw;
        }
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{:.0}% / {:.0}% / {:.0}%</text>",
            x + 6.0,
            y + 15.0,
            100.0 * s.busy_fraction,
            100.0 * s.blocked_input_fraction,
            100.0 * s.blocked_output_fraction
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{MARGIN}\" y=\"{:.1}\" font-size=\"12\"><tspan fill=\"#2b7bb9\">busy</tspan> \
         <tspan fill=\"#e8a33d\">waiting for input</tspan> <tspan fill=\"#9a9a9a\">waiting for output</tspan></text>",
        height - 10.0
    );
    svg.push_str("</svg></figure>\n");
    svg
}

/// The page for `report`, with `settings` (the command's options) listed.
pub fn html(report: &BenchReport, timeline: &Timeline, settings: &[(String, String)]) -> String {
    // Rows per second in ~100 bins of time.
    let end = timeline.batches.last().map_or(1.0, |b| b.0).max(1e-9);
    let bins = 100usize;
    let mut rows = vec![0u64; bins];
    for &(t, _, n) in &timeline.batches {
        rows[((t / end * bins as f64) as usize).min(bins - 1)] += n;
    }
    let bin_s = end / bins as f64;
    let rate: Vec<(f64, f64)> = rows
        .iter()
        .enumerate()
        .map(|(i, &n)| ((i as f64 + 0.5) * bin_s, n as f64 / bin_s))
        .collect();
    let waits: Vec<(f64, f64)> = timeline
        .batches
        .iter()
        .enumerate()
        .map(|(i, b)| (i as f64, b.1))
        .collect();
    let decode_q: Vec<(f64, f64)> = timeline.queues.iter().map(|q| (q.0, q.1 as f64)).collect();
    let output_q: Vec<(f64, f64)> = timeline.queues.iter().map(|q| (q.0, q.2 as f64)).collect();
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>shardfeed bench: {}</title>\
         <style>body{{font-family:sans-serif;margin:24px;color:#222}}figure{{margin:18px 0}}\
         figcaption{{font-weight:bold;margin-bottom:4px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;font-size:13px}}</style></head><body>\n",
        escape(&report.dataset)
    );
    let _ = write!(
        page,
        "<h1>shardfeed bench</h1><p>{} rows, {} batches in {:.2} s: <b>{:.0} rows/s</b>, {:.1} MB/s; first batch after {:.1} ms; \
         waits in next(): p50 {:.2} ms, p95 {:.2} ms, p99 {:.2} ms, max {:.2} ms; bottleneck: <b>{}</b></p>",
        report.rows,
        report.batches,
        report.seconds,
        report.rows_per_s,
        report.mb_per_s,
        report.time_to_first_batch_ms,
        report.wait_p50_ms,
        report.wait_p95_ms,
        report.wait_p99_ms,
        report.wait_max_ms,
        escape(&report.bottleneck)
    );
    page.push('\n');
    page.push_str(&line_chart(
        "Rows per second over time",
        "seconds",
        "rows/s",
        &[("rows/s", "#2b7bb9", rate)],
    ));
    page.push_str(&line_chart(
        "Wait in next() per batch",
        "batch",
        "ms",
        &[("wait (ms)", "#c0392b", waits)],
    ));
    page.push_str(&stage_bars(report));
    page.push_str(&line_chart(
        "Queue depths",
        "seconds",
        "items",
        &[
            ("row groups awaiting decode", "#8e44ad", decode_q),
            ("batches ready for the consumer", "#27ae60", output_q),
        ],
    ));
    page.push_str("<h2>Settings</h2><table>");
    for (k, v) in settings {
        let _ = write!(
            page,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(v)
        );
    }
    page.push_str("</table></body></html>\n");
    page
}
