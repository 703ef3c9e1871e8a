//! `cotune --quick` end to end: every preset runs, the CSV has one row per point with the
//! required columns, and the plot is drawn.

use std::process::Command;

#[test]
fn quick_run_of_every_preset_writes_csv_and_plot() {
    let dir = std::env::temp_dir().join(format!("cotune-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, svg) = (dir.join("quick.csv"), dir.join("quick.svg"));
    let out = Command::new(env!("CARGO_BIN_EXE_cotune"))
        .args(["--quick", "--backend", "pair", "--csv"])
        .arg(&csv)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("run cotune");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = stdout.lines().filter(|l| !l.starts_with('#')).count();
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv_text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "preset",
        "knob",
        "value",
        "frame_size",
        "pps",
        "kicks_per_pkt",
        "irqs_per_pkt",
        "driver_ns_per_pkt",
        "device_ns_per_pkt",
        "ratio_to_baseline",
    ] {
        assert!(header.contains(&col), "missing column {col}");
    }
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // baseline 1 + kick-threshold 3 + tx-completion 3 + xdp-bulk 2 + xsk-zc 2.
    assert_eq!(rows.len(), 11, "{csv_text}");
    assert_eq!(
        table,
        rows.len() + 1,
        "table has a header line and one line per row"
    );
    for preset in [
        "baseline",
        "kick-threshold",
        "tx-completion",
        "xdp-bulk",
        "xsk-zc",
    ] {
        assert!(rows.iter().any(|r| r[0] == preset), "no {preset} row");
    }
    let pps = header.iter().position(|c| *c == "pps").unwrap();
    assert!(
        rows.iter().all(|r| r[pps].parse::<f64>().unwrap() > 0.0),
        "{csv_text}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("kick-threshold"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_cotune"))
        .args(["--duration", "0"])
        .output()
        .expect("run cotune");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
    let out = Command::new(env!("CARGO_BIN_EXE_cotune"))
        .args(["no-such-preset"])
        .output()
        .expect("run cotune");
    assert!(!out.status.success());
}
