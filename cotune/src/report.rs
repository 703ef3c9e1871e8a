//! Results: one row per sweep point, printed as a table, written as CSV and drawn as SVG.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

mod compare;

pub use compare::{
    best_fixed, comparison_table, comparisons, median_by_objective, median_interval, objective,
    phase_ceiling, round_ratios_note, Comparison, ADAPTIVE_SETTING, DEFAULT_SETTING, PAIRED_PREFIX,
};

/// One measured point (the median of its repeats): every knob of both sides, where it was
/// measured, and the metrics. A metric that was not measured (a skipped point) is NaN and an
/// empty CSV field.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Preset name.
    pub preset: String,
    /// `sim` or `vm`.
    pub target: String,
    /// The (first) knob swept.
    pub knob: String,
    /// Its value at this point.
    pub value: String,
    /// The second knob of a 2-D sweep ("" for 1-D).
    pub knob2: String,
    /// Its value ("" for 1-D).
    pub value2: String,
    /// The workload (`xsk-tx`, `bidirectional`, `xdp-bounce`, `raw-write`).
    pub workload: String,
    /// Ethernet frame size in bytes (virtio-net header not counted).
    pub frame_size: usize,
    /// Driver: kick threshold.
    pub kick_threshold: u16,
    /// Driver: tx completion mode.
    pub tx_completion: String,
    /// Driver: EVENT_IDX negotiated.
    pub event_idx: bool,
    /// Driver: XDP_TX bulk queue.
    pub xdp_bulk: u16,
    /// Driver: AF_XDP mode (`zero-copy`, `copy`, "" when the workload is not AF_XDP).
    pub xsk_mode: String,
    /// Driver workload pacing: frames per burst (0: unpaced).
    pub burst: u32,
    /// Driver workload pacing: µs spun after each burst.
    pub pause_us: u32,
    /// Device: coalescing max_packets.
    pub coalesce_packets: u16,
    /// Device: coalescing max_usecs.
    pub coalesce_usecs: u32,
    /// Device: honour the driver's used_event.
    pub dev_event_idx: bool,
    /// Device: frames per tx call.
    pub tx_budget: u16,
    /// Device: busy-poll µs.
    pub busy_poll_us: u32,
    /// Device: the busy-poll's sleep between looks, µs (0: it spins).
    pub busy_poll_sleep_us: u32,
    /// Device: kick coalescing, buffers queued without a kick past a drained ring (0: off).
    pub kick_coalesce_packets: u16,
    /// Device: kick coalescing, µs before the device looks by itself.
    pub kick_coalesce_usecs: u32,
    /// Device: sparse rx reads.
    pub rx_sparse_reads: bool,
    /// Both sides: the virtqueue layout (`split`, `packed`, `packed+in_order`, ...).
    pub ring: String,
    /// Device: adapts its busy-poll window and coalescing (`adaptive=on`).
    pub dev_adaptive: bool,
    /// Driver: adapts its kick threshold, XDP bulk and rx coalescing (`adaptive=1`).
    pub drv_adaptive: bool,
    /// Packets per second (the workload's main direction; both directions for bidirectional).
    pub pps: f64,
    /// Round trip, median, µs (request/response workloads; NaN, an empty CSV field, for the
    /// others).
    pub p50_us: f64,
    /// Round trip, 99th percentile, µs.
    pub p99_us: f64,
    /// Round trip, 99.9th percentile, µs.
    pub p999_us: f64,
    /// Driver kicks (notifications written) per packet.
    pub kicks_per_pkt: f64,
    /// Interrupts the driver took per packet.
    pub irqs_per_pkt: f64,
    /// Tx interrupts per packet (the device's tx-queue interrupts).
    pub tx_irqs_per_pkt: f64,
    /// Kicks the driver skipped because EVENT_IDX said the device did not need one, per packet.
    pub kicks_suppressed_per_pkt: f64,
    /// Driver (vCPU) thread CPU ns per packet (including charged exit costs in sim).
    pub driver_ns_per_pkt: f64,
    /// Device worker-thread CPU ns per packet.
    pub device_ns_per_pkt: f64,
    /// CPU the driver (vCPU) thread got over the trial, % of wall time.
    pub driver_cpu_pct: f64,
    /// CPU the device worker got over the trial, % of wall time.
    pub device_cpu_pct: f64,
    /// Device busy-poll windows that found work (a kick or wake-up saved), per packet.
    pub busy_poll_found_per_pkt: f64,
    /// Time the device spent busy-polling, % of wall time.
    pub busy_poll_pct: f64,
    /// pps divided by the raw backend write loop's pps measured in the same run.
    pub ratio_to_baseline: f64,
    /// pps in the VM over pps in co-simulation (`--target both`).
    pub vm_sim_ratio: f64,
    /// 1-minute load average when the point started.
    pub loadavg1: f64,
    /// Backend: pair or tap.
    pub backend: String,
    /// Where the device ran: `in-process`, or `vhost-user` (a VM's device in `vhost-user-net`).
    pub device: String,
    /// Charged cost of one kick, ns (sim only).
    pub kick_cost_ns: Option<u64>,
    /// Charged cost of one interrupt, ns (sim only).
    pub irq_cost_ns: Option<u64>,
    /// Why a point was skipped, or how the VM's numbers map to the co-simulation's.
    pub note: String,
}

/// The CSV header (one column per field of [`Row`], in order).
pub const CSV_HEADER: &str = "preset,target,knob,value,knob2,value2,workload,frame_size,\
kick_threshold,tx_completion,event_idx,xdp_bulk,xsk_mode,burst,pause_us,\
coalesce_packets,coalesce_usecs,dev_event_idx,tx_budget,busy_poll_us,busy_poll_sleep_us,kick_coalesce_packets,kick_coalesce_usecs,rx_sparse_reads,ring,\
dev_adaptive,drv_adaptive,pps,p50_us,p99_us,p999_us,kicks_per_pkt,irqs_per_pkt,tx_irqs_per_pkt,kicks_suppressed_per_pkt,driver_ns_per_pkt,device_ns_per_pkt,\
driver_cpu_pct,device_cpu_pct,busy_poll_found_per_pkt,busy_poll_pct,ratio_to_baseline,vm_sim_ratio,loadavg1,backend,device,kick_cost_ns,irq_cost_ns,note";

/// `v` with `prec` decimals, or "" when it is not a number.
fn num(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        String::new()
    }
}

/// A CSV field without separators.
fn field(s: &str) -> String {
    s.replace([',', '\n', '\r'], ";")
}

/// The rows as CSV (header first).
pub fn to_csv(rows: &[Row]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in rows {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let fields = [
            field(&r.preset),
            field(&r.target),
            field(&r.knob),
            field(&r.value),
            field(&r.knob2),
            field(&r.value2),
            field(&r.workload),
            r.frame_size.to_string(),
            r.kick_threshold.to_string(),
            field(&r.tx_completion),
            u8::from(r.event_idx).to_string(),
            r.xdp_bulk.to_string(),
            field(&r.xsk_mode),
            r.burst.to_string(),
            r.pause_us.to_string(),
            r.coalesce_packets.to_string(),
            r.coalesce_usecs.to_string(),
            u8::from(r.dev_event_idx).to_string(),
            r.tx_budget.to_string(),
            r.busy_poll_us.to_string(),
            r.busy_poll_sleep_us.to_string(),
            r.kick_coalesce_packets.to_string(),
            r.kick_coalesce_usecs.to_string(),
            u8::from(r.rx_sparse_reads).to_string(),
            field(&r.ring),
            u8::from(r.dev_adaptive).to_string(),
            u8::from(r.drv_adaptive).to_string(),
            num(r.pps, 0),
            num(r.p50_us, 3),
            num(r.p99_us, 3),
            num(r.p999_us, 3),
            num(r.kicks_per_pkt, 4),
            num(r.irqs_per_pkt, 4),
            num(r.tx_irqs_per_pkt, 4),
            num(r.kicks_suppressed_per_pkt, 4),
            num(r.driver_ns_per_pkt, 1),
            num(r.device_ns_per_pkt, 1),
            num(r.driver_cpu_pct, 1),
            num(r.device_cpu_pct, 1),
            num(r.busy_poll_found_per_pkt, 4),
            num(r.busy_poll_pct, 1),
            num(r.ratio_to_baseline, 3),
            num(r.vm_sim_ratio, 3),
            num(r.loadavg1, 2),
            field(&r.backend),
            field(&r.device),
            opt(r.kick_cost_ns),
            opt(r.irq_cost_ns),
            field(&r.note),
        ];
        s.push_str(&fields.join(","));
        s.push('\n');
    }
    s
}

/// The rows as a fixed-width table.
pub fn to_table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<19} {:<3} {:<34} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>5} {:>5} {:>6} {:>6} {:>5}  {}\n",
        "preset",
        "at",
        "knob=value",
        "size",
        "pps",
        "p50 us",
        "p99 us",
        "kick/pk",
        "irq/pk",
        "txirq/pk",
        "drv ns/pk",
        "dev ns/pk",
        "drv%",
        "dev%",
        "xbase",
        "vm/sim",
        "load",
        "note"
    );
    for r in rows {
        let mut knob = format!("{}={}", r.knob, r.value);
        if !r.knob2.is_empty() {
            knob += &format!(" {}={}", r.knob2, r.value2);
        }
        let f = |v: f64, w: usize, p: usize| {
            if v.is_finite() {
                format!("{v:>w$.p$}")
            } else {
                format!("{:>w$}", "-")
            }
        };
        let _ = writeln!(
            s,
            "{:<19} {:<3} {:<34} {:>5} {} {} {} {} {} {} {} {} {} {} {} {} {}  {}",
            r.preset,
            r.target,
            knob,
            r.frame_size,
            f(r.pps, 9, 0),
            f(r.p50_us, 8, 1),
            f(r.p99_us, 8, 1),
            f(r.kicks_per_pkt, 8, 4),
            f(r.irqs_per_pkt, 8, 4),
            f(r.tx_irqs_per_pkt, 8, 4),
            f(r.driver_ns_per_pkt, 9, 1),
            f(r.device_ns_per_pkt, 9, 1),
            f(r.driver_cpu_pct, 5, 0),
            f(r.device_cpu_pct, 5, 0),
            f(r.ratio_to_baseline, 6, 3),
            f(r.vm_sim_ratio, 6, 3),
            f(r.loadavg1, 5, 2),
            r.note
        );
    }
    s
}

/// Draws the rows into `path`: 1-D sweeps as today's line plots; 2-D sweeps as heatmaps
/// (into `path` when there is no 1-D sweep, else into `<stem>-heatmap.svg` beside it).
/// Returns the files written.
pub fn plot(rows: &[Row], path: &Path) -> io::Result<Vec<PathBuf>> {
    // The adaptive preset's paired re-runs measure grid points again: not cells of their own.
    let (two, one): (Vec<Row>, Vec<Row>) = rows
        .iter()
        .filter(|r| !r.value2.starts_with(PAIRED_PREFIX))
        .cloned()
        .partition(|r| !r.knob2.is_empty());
    let one: Vec<Row> = one.into_iter().filter(|r| r.pps.is_finite()).collect();
    let mut written = Vec::new();
    let has_one = one.iter().any(|r| r.preset != "baseline");
    if has_one || two.is_empty() {
        plot_svg(&one, path)?;
        written.push(path.to_path_buf());
    }
    if !two.is_empty() {
        let hpath = if has_one {
            let stem = path
                .file_stem()
                .map_or_else(|| "cotune".into(), |s| s.to_string_lossy().into_owned());
            path.with_file_name(format!("{stem}-heatmap.svg"))
        } else {
            path.to_path_buf()
        };
        std::fs::write(&hpath, heatmap_svg(&two))?;
        written.push(hpath);
    }
    Ok(written)
}

/// A heatmap metric: its name, how to read it from a row, and decimals in a cell.
type HeatMetric = (&'static str, fn(&Row) -> f64, usize);

/// The metrics a heatmap shows.
const HEAT_METRICS: [HeatMetric; 4] = [
    ("pps", |r| r.pps, 0),
    ("kicks/pkt", |r| r.kicks_per_pkt, 3),
    ("irqs/pkt", |r| r.irqs_per_pkt, 3),
    ("device CPU ns/pkt", |r| r.device_ns_per_pkt, 0),
];

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Values in first-seen order.
fn distinct<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for s in it {
        if !v.contains(&s) {
            v.push(s);
        }
    }
    v
}

/// A cell's colour: white (lowest) to dark blue (highest); grey when not measured.
fn heat_colour(v: f64, lo: f64, hi: f64) -> String {
    if !v.is_finite() {
        return "#dddddd".into();
    }
    let t = if hi > lo {
        ((v - lo) / (hi - lo)).clamp(0.0, 1.0)
    } else {
        0.5
    };
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!(
        "#{:02x}{:02x}{:02x}",
        mix(247.0, 8.0),
        mix(251.0, 48.0),
        mix(255.0, 107.0)
    )
}

fn cell_text(v: f64, prec: usize) -> String {
    if !v.is_finite() {
        "n/a".into()
    } else if prec == 0 && v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.prec$}")
    }
}

const CELL_W: usize = 84;
const CELL_H: usize = 34;
const LEFT: usize = 110;
const TOP: usize = 46;
const GAP: usize = 30;

/// The rows of each heatmap: one group per (preset, target, frame size), in first-seen order.
fn heat_groups(rows: &[Row]) -> Vec<Vec<&Row>> {
    let mut groups = Vec::new();
    for p in distinct(rows.iter().map(|r| r.preset.as_str())) {
        let of_p: Vec<&Row> = rows.iter().filter(|r| r.preset == p).collect();
        for t in distinct(of_p.iter().map(|r| r.target.as_str())) {
            let of_t: Vec<&Row> = of_p.iter().copied().filter(|r| r.target == t).collect();
            let mut sizes: Vec<usize> = of_t.iter().map(|r| r.frame_size).collect();
            sizes.dedup();
            for s in sizes {
                groups.push(of_t.iter().copied().filter(|r| r.frame_size == s).collect());
            }
        }
    }
    groups
}

/// One heatmap: its rows, the first knob's values (across) and the second's (down).
struct Heat<'a> {
    rows: &'a [&'a Row],
    xs: Vec<&'a str>,
    ys: Vec<&'a str>,
}

impl<'a> Heat<'a> {
    fn new(rows: &'a [&'a Row]) -> Self {
        Heat {
            rows,
            xs: distinct(rows.iter().map(|r| r.value.as_str())),
            ys: distinct(rows.iter().map(|r| r.value2.as_str())),
        }
    }

    fn panel_w(&self) -> usize {
        LEFT + self.xs.len() * CELL_W + GAP
    }

    fn panel_h(&self) -> usize {
        TOP + self.ys.len() * CELL_H + 36
    }

    /// One metric's panel with its top-left corner at (px, py): title, axis labels, cells.
    fn panel(&self, body: &mut String, (metric, get, prec): &HeatMetric, px: usize, py: usize) {
        let (knob, knob2) = (&self.rows[0].knob, &self.rows[0].knob2);
        let vals: Vec<f64> = self
            .rows
            .iter()
            .map(|r| get(r))
            .filter(|v| v.is_finite())
            .collect();
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            body,
            r#"<text x="{}" y="{}" font-size="13">{}: {} across, {} down</text>"#,
            px + 10,
            py + 16,
            xml(metric),
            xml(knob),
            xml(knob2)
        );
        for (i, x) in self.xs.iter().enumerate() {
            let _ = writeln!(
                body,
                r#"<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
                px + LEFT + i * CELL_W + CELL_W / 2,
                py + TOP - 6,
                xml(x)
            );
        }
        for (j, y) in self.ys.iter().enumerate() {
            let cy = py + TOP + j * CELL_H;
            let _ = writeln!(
                body,
                r#"<text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>"#,
                px + LEFT - 6,
                cy + CELL_H / 2 + 4,
                xml(y)
            );
            for (i, x) in self.xs.iter().enumerate() {
                let v = self
                    .rows
                    .iter()
                    .find(|r| r.value == *x && r.value2 == *y)
                    .map_or(f64::NAN, |r| get(r));
                let label = format!(
                    "{} {}={} {}={}",
                    xml(metric),
                    xml(knob),
                    xml(x),
                    xml(knob2),
                    xml(y)
                );
                heat_cell(
                    body,
                    (px + LEFT + i * CELL_W, cy),
                    v,
                    (lo, hi),
                    *prec,
                    &label,
                );
            }
        }
    }
}

/// One cell at (cx, cy): coloured by `v` within [lo, hi], its tooltip `label: value`, its
/// value printed in it.
fn heat_cell(
    body: &mut String,
    (cx, cy): (usize, usize),
    v: f64,
    (lo, hi): (f64, f64),
    prec: usize,
    label: &str,
) {
    let fill = heat_colour(v, lo, hi);
    let t = if v.is_finite() && hi > lo && (v - lo) / (hi - lo) > 0.55 {
        "white"
    } else {
        "black"
    };
    let _ = writeln!(
        body,
        r##"<rect class="cell" x="{cx}" y="{cy}" width="{CELL_W}" height="{CELL_H}" fill="{fill}" stroke="#ffffff"><title>{label}: {}</title></rect>"##,
        cell_text(v, prec)
    );
    let _ = writeln!(
        body,
        r#"<text x="{}" y="{}" font-size="11" text-anchor="middle" fill="{t}">{}</text>"#,
        cx + CELL_W / 2,
        cy + CELL_H / 2 + 4,
        cell_text(v, prec)
    );
}

/// 2-D sweeps as heatmaps, hand-written SVG: for each (preset, target, frame size) four panels
/// (pps, kicks/pkt, irqs/pkt, device CPU ns/pkt), the first knob across, the second down, every
/// cell (`class="cell"`) labelled with its value. Hand-written rather than with plotters: each
/// cell carries its class and a tooltip (`<title>`) naming the point and its value.
pub fn heatmap_svg(rows: &[Row]) -> String {
    let mut body = String::new();
    let mut y0 = 10usize;
    let mut width = 0usize;
    for g in &heat_groups(rows) {
        let heat = Heat::new(g);
        let (panel_w, panel_h) = (heat.panel_w(), heat.panel_h());
        let _ = writeln!(
            body,
            r#"<text x="10" y="{}" font-size="15" font-weight="bold">{} ({}, {} B)</text>"#,
            y0 + 14,
            xml(&g[0].preset),
            xml(&g[0].target),
            g[0].frame_size
        );
        y0 += 22;
        for (m, metric) in HEAT_METRICS.iter().enumerate() {
            let px = (m % 2) * panel_w;
            let py = y0 + (m / 2) * panel_h;
            width = width.max(px + panel_w);
            heat.panel(&mut body, metric, px, py);
        }
        y0 += 2 * panel_h + 10;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n",
        w = width.max(200) + 10,
        h = y0 + 10,
    )
}

/// Draws pps and kicks/pkt against the knob, one panel pair per preset, into an SVG file.
pub fn plot_svg(rows: &[Row], path: &Path) -> io::Result<()> {
    // The baseline is one point with no kicks: it is the denominator, not a curve.
    // One panel pair per (preset, target), in first-seen order (`both` interleaves targets).
    let mut presets: Vec<(&str, &str)> = Vec::new();
    for r in rows.iter().filter(|r| r.preset != "baseline") {
        let key = (r.preset.as_str(), r.target.as_str());
        if !presets.contains(&key) {
            presets.push(key);
        }
    }
    let panels = presets.len().max(1);
    let root = SVGBackend::new(path, (1000, 360 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((panels, 2));
    for (p, &(preset, target)) in presets.iter().enumerate() {
        let pts: Vec<&Row> = rows
            .iter()
            .filter(|r| r.preset == preset && r.target == target)
            .collect();
        let labels = x_labels(&pts);
        for (col, (metric, get)) in [
            ("pps", (|r: &Row| r.pps) as fn(&Row) -> f64),
            ("kicks/pkt", |r: &Row| r.kicks_per_pkt),
        ]
        .into_iter()
        .enumerate()
        {
            let caption = format!(
                "{preset} ({target}): {metric} vs {}",
                pts.first().map(|r| r.knob.as_str()).unwrap_or("")
            );
            line_chart(&areas[p * 2 + col], &caption, &pts, &labels, get)?;
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

/// The x axis's labels: the knob's values, with the frame size when the points have several.
fn x_labels(pts: &[&Row]) -> Vec<String> {
    let one_size = pts.iter().all(|r| r.frame_size == pts[0].frame_size);
    pts.iter()
        .map(|r| {
            if one_size {
                r.value.clone()
            } else {
                format!("{}/{}B", r.value, r.frame_size)
            }
        })
        .collect()
}

/// One panel: `get` of each point against its x label, a line with a dot per point.
fn line_chart(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    caption: &str,
    pts: &[&Row],
    labels: &[String],
    get: fn(&Row) -> f64,
) -> io::Result<()> {
    let long_labels = labels.iter().any(|l| l.len() > 14);
    let ymax = pts.iter().map(|r| get(r)).fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let n = pts.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0usize..n, 0.0..ymax)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_labels(n.min(16))
        .x_label_formatter(&|i: &usize| labels.get(*i).cloned().unwrap_or_default())
        .x_label_style(("sans-serif", if long_labels { 8 } else { 11 }))
        .y_label_formatter(&move |v: &f64| {
            if ymax >= 100.0 {
                format!("{v:.0}")
            } else if ymax >= 0.01 {
                format!("{v:.4}")
            } else {
                format!("{v:.1e}")
            }
        })
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(LineSeries::new(
            pts.iter().enumerate().map(|(i, r)| (i, get(r))),
            &BLUE,
        ))
        .map_err(plot_err)?;
    chart
        .draw_series(
            pts.iter()
                .enumerate()
                .map(|(i, r)| Circle::new((i, get(r)), 3, BLUE.filled())),
        )
        .map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(format!("plot: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row of the kick-threshold preset (for other modules' tests).
    pub(super) fn sample_row() -> Row {
        row("8", 1e6)
    }

    fn row(value: &str, pps: f64) -> Row {
        Row {
            preset: "kick-threshold".into(),
            target: "sim".into(),
            knob: "kick_threshold".into(),
            value: value.into(),
            knob2: String::new(),
            value2: String::new(),
            workload: "xsk-tx".into(),
            frame_size: 64,
            kick_threshold: value.parse().unwrap_or(1),
            tx_completion: "clean-from-rx".into(),
            event_idx: true,
            xdp_bulk: 16,
            xsk_mode: "zero-copy".into(),
            burst: 0,
            pause_us: 0,
            coalesce_packets: 0,
            coalesce_usecs: 0,
            dev_event_idx: true,
            tx_budget: 256,
            busy_poll_us: 0,
            busy_poll_sleep_us: 0,
            kick_coalesce_packets: 0,
            kick_coalesce_usecs: 0,
            rx_sparse_reads: true,
            ring: "split".into(),
            dev_adaptive: false,
            drv_adaptive: false,
            pps,
            p50_us: f64::NAN,
            p99_us: f64::NAN,
            p999_us: f64::NAN,
            kicks_per_pkt: 0.125,
            irqs_per_pkt: 0.01,
            tx_irqs_per_pkt: 0.01,
            kicks_suppressed_per_pkt: 0.0,
            driver_ns_per_pkt: 300.0,
            device_ns_per_pkt: 400.0,
            driver_cpu_pct: 99.0,
            device_cpu_pct: 80.0,
            busy_poll_found_per_pkt: 0.0,
            busy_poll_pct: 0.0,
            ratio_to_baseline: 0.9,
            vm_sim_ratio: f64::NAN,
            loadavg1: 0.2,
            backend: "pair".into(),
            device: "in-process".into(),
            kick_cost_ns: Some(1500),
            irq_cost_ns: Some(2000),
            note: "a, b".into(),
        }
    }

    fn grid(xs: &[&str], ys: &[&str]) -> Vec<Row> {
        let mut v = Vec::new();
        for (j, y) in ys.iter().enumerate() {
            for (i, x) in xs.iter().enumerate() {
                let mut r = row(x, 1e5 * (1 + i + 10 * j) as f64);
                r.preset = "kick-busy-poll".into();
                r.knob2 = "busy_poll_us".into();
                r.value2 = (*y).into();
                v.push(r);
            }
        }
        v
    }

    #[test]
    fn csv_has_a_column_per_field_and_one_line_per_row() {
        let mut skipped = row("8", f64::NAN);
        skipped.target = "vm".into();
        let csv = to_csv(&[row("1", 1e6), skipped]);
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let fields = serde_json::to_value(row("1", 1.0)).unwrap();
        let names: Vec<&String> = fields.as_object().unwrap().keys().collect();
        assert_eq!(header.len(), names.len(), "one column per Row field");
        for n in names {
            assert!(header.contains(&n.as_str()), "no column {n}");
        }
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.len() == header.len()), "{csv}");
        let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
        assert_eq!(rows[0][col("pps")], "1000000");
        assert_eq!(
            rows[0][col("note")],
            "a; b",
            "commas in a field are replaced"
        );
        assert_eq!(rows[1][col("pps")], "", "an unmeasured metric is empty");
        assert_eq!(rows[1][col("target")], "vm");
        assert_eq!(rows[0][col("kick_cost_ns")], "1500");
        for c in ["p50_us", "p99_us", "p999_us"] {
            assert_eq!(rows[0][col(c)], "", "{c}: empty without round trips");
        }
        let mut pp = row("4", 1e5);
        (pp.p50_us, pp.p99_us, pp.p999_us) = (12.5, 40.25, 101.0);
        let csv = to_csv(&[pp]);
        let line: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
        assert_eq!(
            [
                line[col("p50_us")],
                line[col("p99_us")],
                line[col("p999_us")]
            ],
            ["12.500", "40.250", "101.000"]
        );
    }

    #[test]
    fn svg_plot_is_written() {
        let path = std::env::temp_dir().join(format!("cotune-test-{}.svg", std::process::id()));
        let files = plot(&[row("1", 1e6), row("8", 2e6)], &path).unwrap();
        assert_eq!(files, vec![path.clone()]);
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("kick-threshold"));
        let one_pair = svg.len();
        // sim and vm rows interleaved (--target both): one panel pair per target, not per row.
        let mut rows = Vec::new();
        for v in ["1", "2", "4", "8"] {
            rows.push(row(v, 1e6));
            let mut vm = row(v, 9e5);
            vm.target = "vm".into();
            rows.push(vm);
        }
        plot(&rows, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("kick-threshold (sim)") && svg.contains("kick-threshold (vm)"));
        assert!(svg.contains(r#"height="720""#), "two panel rows of 360");
        assert!(svg.len() < 4 * one_pair);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn heatmap_has_one_labelled_cell_per_point_and_metric() {
        let rows = grid(&["1", "2", "8"], &["0", "50"]);
        let svg = heatmap_svg(&rows);
        assert_eq!(
            svg.matches(r#"class="cell""#).count(),
            3 * 2 * HEAT_METRICS.len()
        );
        // The highest pps (x=8, y=50: 1.3 Mpps) is labelled and darkest; the lowest is white.
        assert!(svg.contains(">1300k</text>"), "{svg}");
        assert!(svg.contains(r##"fill="#08306b""##) && svg.contains(r##"fill="#f7fbff""##));
        assert_eq!(svg.matches("<svg").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
        // A missing point is a grey n/a cell, not a hole.
        let mut missing = rows.clone();
        missing.remove(0);
        let svg = heatmap_svg(&missing);
        assert_eq!(
            svg.matches(r#"class="cell""#).count(),
            3 * 2 * HEAT_METRICS.len()
        );
        assert!(svg.contains(">n/a</text>"));
    }

    #[test]
    fn plot_splits_line_plots_and_heatmaps() {
        let dir = std::env::temp_dir().join(format!("cotune-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut rows = vec![row("1", 1e6), row("8", 2e6)];
        rows.extend(grid(&["1", "8"], &["0", "50"]));
        let files = plot(&rows, &dir.join("out.svg")).unwrap();
        assert_eq!(
            files,
            vec![dir.join("out.svg"), dir.join("out-heatmap.svg")]
        );
        let heat = std::fs::read_to_string(dir.join("out-heatmap.svg")).unwrap();
        assert_eq!(
            heat.matches(r#"class="cell""#).count(),
            4 * HEAT_METRICS.len()
        );
        let only2d = plot(&grid(&["1", "8"], &["0", "50"]), &dir.join("h.svg")).unwrap();
        assert_eq!(only2d, vec![dir.join("h.svg")]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
