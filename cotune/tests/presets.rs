//! A 2-D preset end to end in co-simulation (pair backend, `--quick`): every knob of both sides
//! is its own CSV column and matches the point's axes, and `--plot` draws one heatmap cell per
//! point and metric. The calibrate line the driver guest prints parses.

use std::collections::HashMap;
mod common;

use common::{cotune, run_ok, temp_dir};

fn csv_rows(text: &str) -> Vec<HashMap<String, String>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(f.len(), header.len(), "{l}");
            header
                .iter()
                .zip(f)
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn completion_coalesce_quick_has_both_sides_knobs_and_a_heatmap() {
    let dir = temp_dir("2d");
    let (csv, svg) = (dir.join("cc.csv"), dir.join("cc.svg"));
    run_ok(
        cotune()
            .args([
                "--quick",
                "--backend",
                "pair",
                "completion-coalesce",
                "--csv",
            ])
            .arg(&csv)
            .arg("--plot")
            .arg(&svg),
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let rows = csv_rows(&text);
    let points: Vec<_> = rows
        .iter()
        .filter(|r| r["preset"] == "completion-coalesce")
        .collect();
    assert_eq!(points.len(), 4, "2x2 with --quick:\n{text}");
    let mut grid = std::collections::BTreeSet::new();
    for r in &points {
        assert_eq!(r["target"], "sim");
        assert_eq!(r["knob"], "tx_completion");
        assert_eq!(r["knob2"], "coalesce_packets");
        // The axes are the knobs' own columns.
        assert_eq!(r["value"], r["tx_completion"]);
        assert_eq!(r["value2"], r["coalesce_packets"]);
        let usecs: u32 = r["coalesce_usecs"].parse().unwrap();
        assert_eq!(usecs > 0, r["coalesce_packets"] != "0", "{r:?}");
        for col in [
            "kick_threshold",
            "event_idx",
            "xdp_bulk",
            "dev_event_idx",
            "tx_budget",
            "busy_poll_us",
            "burst",
            "pause_us",
        ] {
            assert!(r[col].parse::<u32>().is_ok(), "{col}={:?}", r[col]);
        }
        assert_eq!(r["xsk_mode"], "", "not an AF_XDP workload");
        assert!(r["pps"].parse::<f64>().unwrap() > 0.0);
        for col in ["loadavg1", "driver_cpu_pct", "device_cpu_pct"] {
            let v: f64 = r[col]
                .parse()
                .unwrap_or_else(|_| panic!("{col}={:?}", r[col]));
            assert!(v >= 0.0, "{col}={v}");
        }
        let dev_pct: f64 = r["device_cpu_pct"].parse().unwrap();
        assert!(
            dev_pct > 1.0 && dev_pct < 150.0,
            "the worker ran: {dev_pct}%"
        );
        grid.insert((r["value"].clone(), r["value2"].clone()));
    }
    assert_eq!(grid.len(), 4, "four distinct points");
    let heat = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(
        heat.matches(r#"class="cell""#).count(),
        4 * 4,
        "4 cells x 4 metrics"
    );
    for metric in ["pps", "kicks/pkt", "irqs/pkt", "device CPU ns/pkt"] {
        assert!(
            heat.contains(&format!(
                ">{metric}: tx_completion across, coalesce_packets down<"
            )),
            "{metric}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn calibrate_line_parses() {
    let line = r#"{"calibrate":{"ring":3,"tsc_khz":2445406,"samples":2000,"kick_ns":1712,"exit_ns":1530,"irq_ns":2650,"irq_latency_ns":4100}}"#;
    let c = cotune::calib::parse_line(line).unwrap();
    assert_eq!((c.kick_ns, c.irq_ns, c.samples), (1712.0, 2650.0, 2000));
    assert!(cotune::calib::parse_line(&line.replace("1712", "-1")).is_err());
}
