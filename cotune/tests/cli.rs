//! `cotune --quick` end to end: every preset runs, the CSV has one row per point with the
//! required columns, and the plot is drawn.

mod common;

use common::{cotune, run_ok, temp_dir};

#[test]
fn quick_run_of_every_preset_writes_csv_and_plot() {
    let dir = temp_dir("cli");
    let (csv, svg) = (dir.join("quick.csv"), dir.join("quick.svg"));
    let stdout = run_ok(
        cotune()
            .args(["--quick", "--csv"])
            .arg(&csv)
            .arg("--plot")
            .arg(&svg),
    );
    // The table: the lines after the header's, up to the blank line before the adaptive
    // preset's comparison.
    let table = stdout
        .lines()
        .filter(|l| !l.starts_with('#'))
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .count();
    assert!(
        stdout.contains("adaptive against fixed knobs"),
        "the comparison follows the table: {stdout}"
    );
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv_text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    for col in [
        "preset",
        "target",
        "knob",
        "value",
        "knob2",
        "value2",
        "frame_size",
        "kick_threshold",
        "tx_completion",
        "event_idx",
        "xdp_bulk",
        "xsk_mode",
        "burst",
        "pause_us",
        "coalesce_packets",
        "coalesce_usecs",
        "dev_event_idx",
        "tx_budget",
        "busy_poll_us",
        "busy_poll_sleep_us",
        "kick_coalesce_packets",
        "kick_coalesce_usecs",
        "pps",
        "kicks_per_pkt",
        "irqs_per_pkt",
        "driver_ns_per_pkt",
        "device_ns_per_pkt",
        "driver_cpu_pct",
        "device_cpu_pct",
        "busy_poll_found_per_pkt",
        "busy_poll_pct",
        "ratio_to_baseline",
        "vm_sim_ratio",
        "loadavg1",
    ] {
        assert!(header.contains(&col), "missing column {col}");
    }
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // baseline 1 + kick-threshold 3 + tx-completion 3 + xdp-bulk 2 + xsk-zc 2 + busy-poll 2
    // + busy-poll-sleep 3 (no poll, spinning, sleeping) + tx-budget 2 + rx-sparse-reads 2
    // + four 2-D presets of 2x2 (kick-coalesce among them)
    // + the four seed presets, rx-coalesce, rx-busy-poll, pingpong and mixed, 2 each, on their
    // own backends
    // + ring-layout 3 (lazy on each layout)
    // + adaptive 24 (fwd, pingpong and mixed through its loop: the defaults, 4 fixed points,
    // each side adaptive and both) and its paired re-runs, 2 per workload.
    assert_eq!(rows.len(), 85, "{csv_text}");
    let setting = header.iter().position(|c| *c == "value2").unwrap();
    let paired: Vec<_> = rows
        .iter()
        .filter(|r| r[setting].starts_with("paired:"))
        .collect();
    assert_eq!(paired.len(), 6, "{csv_text}");
    assert_eq!(
        paired
            .iter()
            .filter(|r| r[setting] == "paired:adaptive")
            .count(),
        3
    );
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
        "busy-poll",
        "kick-busy-poll",
        "busy-poll-sleep",
        "kick-coalesce",
        "rx-sparse-reads",
        "completion-coalesce",
        "bulk-coalesce",
    ] {
        assert!(rows.iter().any(|r| r[0] == preset), "no {preset} row");
    }
    // The regimes: each seed preset on its measurement backend, whatever --backend says.
    let backend = header.iter().position(|c| *c == "backend").unwrap();
    let workload = header.iter().position(|c| *c == "workload").unwrap();
    for (preset, on, doing) in [
        ("seed-kick-threshold", "sink", "xsk-tx"),
        ("seed-zc", "sink", "xsk-tx"),
        ("seed-tx-completion", "loop", "fwd"),
        ("seed-xdp-bulk", "loop", "fwd"),
        ("rx-coalesce", "source", "rx"),
        ("rx-busy-poll", "source", "rx"),
        ("pingpong", "loop", "pingpong"),
        ("mixed", "loop", "mixed"),
    ] {
        let mine: Vec<_> = rows.iter().filter(|r| r[0] == preset).collect();
        assert_eq!(mine.len(), 2, "{preset}: {csv_text}");
        for r in mine {
            assert_eq!((r[backend], r[workload]), (on, doing), "{preset}");
        }
    }
    // Round-trip percentiles: on the rows of the pingpong and mixed workloads only (mixed:
    // its trickles'), positive and in order.
    let col = |name: &str| header.iter().position(|c| *c == name).unwrap();
    for r in &rows {
        let rtt: Vec<&str> = ["p50_us", "p99_us", "p999_us"]
            .iter()
            .map(|c| r[col(c)])
            .collect();
        if r[workload] != "pingpong" && r[workload] != "mixed" {
            assert_eq!(rtt, ["", "", ""], "{csv_text}");
            continue;
        }
        let rtt: Vec<f64> = rtt.iter().map(|v| v.parse().unwrap()).collect();
        assert!(
            rtt[0] > 0.0 && rtt[0] <= rtt[1] && rtt[1] <= rtt[2],
            "{csv_text}"
        );
    }
    let pps = header.iter().position(|c| *c == "pps").unwrap();
    assert!(
        rows.iter().all(|r| r[pps].parse::<f64>().unwrap() > 0.0),
        "{csv_text}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("kick-threshold"));
    // The 2-D presets go to a heatmap file beside it, 4 metrics each: four of 2x2 cells,
    // busy-poll-sleep's 2x2 (its 3 points and the empty cell of a sleep without a window),
    // ring-layout's 3 layouts
    // x 1 completion mode, and adaptive's 3 workloads x 8 settings.
    let heat = std::fs::read_to_string(dir.join("quick-heatmap.svg")).unwrap();
    assert_eq!(
        heat.matches(r#"class="cell""#).count(),
        (4 * 4 + 4 + 3 + 3 * 8) * 4
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    let out = cotune()
        .args(["--duration", "0"])
        .output()
        .expect("run cotune");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
    let out = cotune()
        .args(["no-such-preset"])
        .output()
        .expect("run cotune");
    assert!(!out.status.success());
    for (args, says) in [
        (&["--kick-cost-ns", "soon"][..], "--kick-cost-ns"),
        (&["--irq-cost-ns=-5"][..], "--irq-cost-ns"),
        (&["--target", "cloud"][..], "--target"),
        (&["--vm-frames", "100000"][..], "--vm-frames needs --target"),
        (
            &["--target", "vm", "--vm-frames", "5"][..],
            "--vm-frames must be",
        ),
        (&["--paired-rounds", "0"][..], "--paired-rounds must be"),
        (&["--tx-completion", "sometimes"][..], "--tx-completion"),
        (
            &["--quick", "--tx-completion", "lazy", "seed-tx-completion"][..],
            "sweeps the tx completion",
        ),
        (&["--busy-poll-sleep-us", "0"][..], "--busy-poll-sleep-us"),
        (
            &["--busy-poll-sleep-us", "1001"][..],
            "--busy-poll-sleep-us",
        ),
        (
            &["--quick", "--busy-poll-sleep-us", "20", "busy-poll-sleep"][..],
            "sweeps the busy-poll's sleep",
        ),
        (
            &["--target", "vm", "--vmm", "/nonexistent/vmm"][..],
            "/nonexistent/vmm",
        ),
    ] {
        let out = cotune().args(args).output().expect("run cotune");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn the_paired_re_run_takes_the_rounds_asked_for() {
    let dir = temp_dir("paired");
    let csv = dir.join("adaptive.csv");
    run_ok(
        cotune()
            .args(["adaptive", "--quick", "--paired-rounds", "4", "--csv"])
            .arg(&csv),
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    let paired: Vec<&str> = text.lines().filter(|l| l.contains(",paired:")).collect();
    assert_eq!(paired.len(), 6, "{text}");
    for row in paired {
        assert!(row.contains("median of 4 alternated trials"), "{row}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
