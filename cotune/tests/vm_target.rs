//! `--target both --quick` boots the driver guest through the `vmm` binary (root, /dev/kvm, the
//! guest artefacts and `vmm` built beside `cotune`, as `cargo test --workspace` does): a tx
//! point and an echo point give VM rows with counters and a vm/sim ratio; a point the guest
//! cannot run is a skipped row with a reason.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

mod common;

use common::run_ok;

#[test]
fn quick_vm_and_sim_points_side_by_side() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/kvm").exists() {
        eprintln!("skipped: needs root and /dev/kvm");
        return;
    }
    let exe = Path::new(env!("CARGO_BIN_EXE_cotune"));
    let vmm = exe.with_file_name("vmm");
    if !vmm.is_file() {
        eprintln!(
            "skipped: no {} (cargo test --workspace builds it)",
            vmm.display()
        );
        return;
    }
    let csv = std::env::temp_dir().join(format!("cotune-vm-{}.csv", std::process::id()));
    run_ok(
        Command::new(exe)
            .args([
                "--quick",
                "--target",
                "both",
                "--backend",
                "tap",
                "--vm-frames",
                "5000",
            ])
            .args(["xsk-zc", "xdp-bulk", "--csv"])
            .arg(&csv)
            .arg("--vmm")
            .arg(&vmm),
    );
    let text = std::fs::read_to_string(&csv).unwrap();
    std::fs::remove_file(&csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<HashMap<&str, &str>> = lines
        .map(|l| header.iter().copied().zip(l.split(',')).collect())
        .collect();
    let find = |preset: &str, target: &str, value: &str| {
        rows.iter()
            .find(|r| r["preset"] == preset && r["target"] == target && r["value"] == value)
            .unwrap_or_else(|| panic!("no {preset}/{target}/{value} row:\n{text}"))
    };
    let f = |r: &HashMap<&str, &str>, c: &str| r[c].parse::<f64>().unwrap_or(f64::NAN);
    for (preset, value) in [
        ("xsk-zc", "zero-copy"),
        ("xdp-bulk", "1"),
        ("xdp-bulk", "16"),
    ] {
        let (sim, vm) = (find(preset, "sim", value), find(preset, "vm", value));
        assert!(f(vm, "pps") > 1000.0, "{preset} {value}: {vm:?}");
        assert!(f(vm, "kicks_per_pkt").is_finite() && f(vm, "irqs_per_pkt").is_finite());
        assert!(
            f(vm, "driver_cpu_pct") > 0.0 && f(vm, "device_cpu_pct") > 0.0,
            "{vm:?}"
        );
        let ratio = f(vm, "vm_sim_ratio");
        let expect = f(vm, "pps") / f(sim, "pps");
        assert!(
            (ratio - expect).abs() <= 0.002 * expect.max(1.0),
            "{ratio} vs {expect}"
        );
        assert_eq!(vm["backend"], "tap");
        assert_eq!(vm["kick_cost_ns"], "", "no charged cost in a VM");
    }
    // The echo points ran the guest's echo workload: the guest saw rx traffic and echoed it.
    assert!(find("xdp-bulk", "vm", "16")["note"].contains("echo"));
    let skipped = find("xsk-zc", "vm", "copy");
    assert_eq!(skipped["pps"], "");
    assert!(skipped["note"].starts_with("skipped:"), "{skipped:?}");
    // A baseline (raw tap loop) was measured for the VM rows.
    assert!(f(find("xsk-zc", "vm", "zero-copy"), "ratio_to_baseline") > 0.0);
}
