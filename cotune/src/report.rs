//! Results: one row per sweep point, printed as a table, written as CSV and drawn as SVG.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

/// One measured point (the median of its repeats).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Preset name.
    pub preset: String,
    /// The knob swept.
    pub knob: String,
    /// The knob's value at this point.
    pub value: String,
    /// Ethernet frame size in bytes (virtio-net header not counted).
    pub frame_size: usize,
    /// Packets per second (the workload's main direction; both directions for bidirectional).
    pub pps: f64,
    /// Driver kicks (notifications written) per packet.
    pub kicks_per_pkt: f64,
    /// Interrupts the driver took per packet.
    pub irqs_per_pkt: f64,
    /// Driver-thread CPU ns per packet (including the charged exit costs).
    pub driver_ns_per_pkt: f64,
    /// Device worker-thread CPU ns per packet.
    pub device_ns_per_pkt: f64,
    /// pps divided by the raw backend write loop's pps measured in the same run.
    pub ratio_to_baseline: f64,
    /// Tx interrupts per packet (interrupts whose status named the tx queue).
    pub tx_irqs_per_pkt: f64,
    /// Kicks the driver skipped because EVENT_IDX said the device did not need one, per packet.
    pub kicks_suppressed_per_pkt: f64,
    /// Backend: pair or tap.
    pub backend: String,
    /// Charged cost of one kick, ns.
    pub kick_cost_ns: u64,
    /// Charged cost of one interrupt, ns.
    pub irq_cost_ns: u64,
}

const CSV_HEADER: &str = "preset,knob,value,frame_size,pps,kicks_per_pkt,irqs_per_pkt,driver_ns_per_pkt,device_ns_per_pkt,ratio_to_baseline,tx_irqs_per_pkt,kicks_suppressed_per_pkt,backend,kick_cost_ns,irq_cost_ns";

/// The rows as CSV (header first).
pub fn to_csv(rows: &[Row]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{:.0},{:.4},{:.4},{:.1},{:.1},{:.3},{:.4},{:.4},{},{},{}",
            r.preset,
            r.knob,
            r.value,
            r.frame_size,
            r.pps,
            r.kicks_per_pkt,
            r.irqs_per_pkt,
            r.driver_ns_per_pkt,
            r.device_ns_per_pkt,
            r.ratio_to_baseline,
            r.tx_irqs_per_pkt,
            r.kicks_suppressed_per_pkt,
            r.backend,
            r.kick_cost_ns,
            r.irq_cost_ns
        );
    }
    s
}

/// The rows as a fixed-width table.
pub fn to_table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<14} {:<22} {:>6} {:>11} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7}\n",
        "preset",
        "knob=value",
        "size",
        "pps",
        "kick/pk",
        "irq/pk",
        "txirq/pk",
        "drv ns/pk",
        "dev ns/pk",
        "xbase"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<14} {:<22} {:>6} {:>11.0} {:>8.4} {:>8.4} {:>8.4} {:>9.1} {:>9.1} {:>7.3}",
            r.preset,
            format!("{}={}", r.knob, r.value),
            r.frame_size,
            r.pps,
            r.kicks_per_pkt,
            r.irqs_per_pkt,
            r.tx_irqs_per_pkt,
            r.driver_ns_per_pkt,
            r.device_ns_per_pkt,
            r.ratio_to_baseline
        );
    }
    s
}

/// Draws pps and kicks/pkt against the knob, one panel pair per preset, into an SVG file.
pub fn plot_svg(rows: &[Row], path: &Path) -> io::Result<()> {
    // The baseline is one point with no kicks: it is the denominator, not a curve.
    let mut presets: Vec<&str> = rows
        .iter()
        .filter(|r| r.preset != "baseline")
        .map(|r| r.preset.as_str())
        .collect();
    presets.dedup();
    let panels = presets.len().max(1);
    let root = SVGBackend::new(path, (1000, 360 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((panels, 2));
    for (p, preset) in presets.iter().enumerate() {
        let pts: Vec<&Row> = rows.iter().filter(|r| r.preset == *preset).collect();
        let one_size = pts.iter().all(|r| r.frame_size == pts[0].frame_size);
        let labels: Vec<String> = pts
            .iter()
            .map(|r| {
                if one_size {
                    r.value.clone()
                } else {
                    format!("{}/{}B", r.value, r.frame_size)
                }
            })
            .collect();
        let long_labels = labels.iter().any(|l| l.len() > 14);
        for (col, (metric, get)) in [
            ("pps", (|r: &Row| r.pps) as fn(&Row) -> f64),
            ("kicks/pkt", |r: &Row| r.kicks_per_pkt),
        ]
        .into_iter()
        .enumerate()
        {
            let area = &areas[p * 2 + col];
            let ymax = pts.iter().map(|r| get(r)).fold(0.0f64, f64::max).max(1e-9) * 1.15;
            let n = pts.len().max(1);
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!(
                        "{preset}: {metric} vs {}",
                        pts.first().map(|r| r.knob.as_str()).unwrap_or("")
                    ),
                    ("sans-serif", 16),
                )
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(70)
                .build_cartesian_2d(0usize..n, 0.0..ymax)
                .map_err(plot_err)?;
            let labels_ref = labels.clone();
            chart
                .configure_mesh()
                .x_labels(n.min(16))
                .x_label_formatter(&move |i: &usize| {
                    labels_ref.get(*i).cloned().unwrap_or_default()
                })
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
        }
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Display>(e: E) -> io::Error {
    io::Error::other(format!("plot: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(value: &str, pps: f64) -> Row {
        Row {
            preset: "kick-threshold".into(),
            knob: "kick_threshold".into(),
            value: value.into(),
            frame_size: 64,
            pps,
            kicks_per_pkt: 0.125,
            irqs_per_pkt: 0.01,
            driver_ns_per_pkt: 300.0,
            device_ns_per_pkt: 400.0,
            ratio_to_baseline: 0.9,
            tx_irqs_per_pkt: 0.01,
            kicks_suppressed_per_pkt: 0.0,
            backend: "pair".into(),
            kick_cost_ns: 1500,
            irq_cost_ns: 2000,
        }
    }

    #[test]
    fn csv_has_the_required_columns_and_one_line_per_row() {
        let csv = to_csv(&[row("1", 1e6), row("8", 2e6)]);
        let mut lines = csv.lines();
        let header = lines.next().unwrap();
        assert!(header.starts_with("preset,knob,value,frame_size,pps,kicks_per_pkt,irqs_per_pkt,driver_ns_per_pkt,device_ns_per_pkt,ratio_to_baseline"));
        let cols = header.split(',').count();
        let rows: Vec<&str> = lines.collect();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.split(',').count() == cols));
        assert!(rows[1].starts_with("kick-threshold,kick_threshold,8,64,2000000,"));
    }

    #[test]
    fn svg_plot_is_written() {
        let path = std::env::temp_dir().join(format!("cotune-test-{}.svg", std::process::id()));
        plot_svg(&[row("1", 1e6), row("8", 2e6)], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("kick-threshold"));
        std::fs::remove_file(path).unwrap();
    }
}
