//! The adaptive preset's comparison: per target and workload, both sides adaptive against the
//! defaults and the best fixed point of the grid, each scored by the workload's objective.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Row;

/// The adaptive preset's `setting` of the defaults.
pub const DEFAULT_SETTING: &str = "default";
/// The adaptive preset's `setting` with both sides adaptive.
pub const ADAPTIVE_SETTING: &str = "adaptive";

/// A workload's objective: its name and a row's score (higher is better; NaN: not measured).
fn objective(workload: &str) -> (&'static str, fn(&Row) -> f64) {
    match workload {
        // Lower latency is better: the inverse, so ratios of scores are ratios of latencies.
        "pingpong" => ("p99 (lower is better)", |r| 1.0 / r.p99_us),
        "mixed" => ("flood pps / trickle p99 µs", |r| r.pps / r.p99_us),
        _ => ("pps", |r| r.pps),
    }
}

/// What a row measured, in the workload's terms.
fn describe(workload: &str, r: &Row) -> String {
    match workload {
        "pingpong" => format!("p99 {:.1} µs", r.p99_us),
        "mixed" => format!("{:.0} k pps, p99 {:.1} µs", r.pps / 1e3, r.p99_us),
        _ => format!("{:.0} k pps", r.pps / 1e3),
    }
}

/// One target's and workload's comparison.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// `sim` or `vm`.
    pub target: String,
    /// The workload.
    pub workload: String,
    /// The objective's name.
    pub objective: &'static str,
    /// The defaults' row, the best fixed row (the defaults are a fixed point too) and the
    /// adaptive row.
    pub default: Row,
    /// The best fixed point.
    pub best_fixed: Row,
    /// Both sides adaptive.
    pub adaptive: Row,
    /// Adaptive's score over the best fixed point's.
    pub vs_best: f64,
    /// Adaptive's score over the defaults'.
    pub vs_default: f64,
}

/// The comparisons of the adaptive preset's rows (none when it did not run, or a group lacks
/// the defaults, the adaptive point or a measured fixed point).
pub fn comparisons(rows: &[Row]) -> Vec<Comparison> {
    let mut groups: BTreeMap<(String, String), Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.preset == "adaptive") {
        groups
            .entry((r.target.clone(), r.workload.clone()))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((target, workload), rows) in groups {
        let (objective, score) = objective(&workload);
        let find = |setting: &str| rows.iter().find(|r| r.value2 == setting).copied();
        let (Some(default), Some(adaptive)) = (find(DEFAULT_SETTING), find(ADAPTIVE_SETTING))
        else {
            continue;
        };
        let best_fixed = rows
            .iter()
            .filter(|r| !r.dev_adaptive && !r.drv_adaptive && score(r).is_finite())
            .max_by(|a, b| score(a).total_cmp(&score(b)));
        let Some(best_fixed) = best_fixed else {
            continue;
        };
        out.push(Comparison {
            target,
            objective,
            vs_best: score(adaptive) / score(best_fixed),
            vs_default: score(adaptive) / score(default),
            default: default.clone(),
            best_fixed: (*best_fixed).clone(),
            adaptive: adaptive.clone(),
            workload,
        });
    }
    out
}

/// The comparisons as a Markdown table ("" when there are none).
pub fn comparison_table(rows: &[Row]) -> String {
    let cmp = comparisons(rows);
    if cmp.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "| target | workload | objective | default | best fixed | adaptive (both sides) | \
         adaptive / best fixed | adaptive / default |\n|---|---|---|---|---|---|---|---|\n",
    );
    for c in &cmp {
        let w = c.workload.as_str();
        let _ = writeln!(
            s,
            "| {} | {w} | {} | {} | {} ({}) | {} | {:.2} | {:.2} |",
            c.target,
            c.objective,
            describe(w, &c.default),
            describe(w, &c.best_fixed),
            c.best_fixed.value2,
            describe(w, &c.adaptive),
            c.vs_best,
            c.vs_default,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, workload: &str, setting: &str, pps: f64, p99_us: f64) -> Row {
        Row {
            preset: "adaptive".into(),
            target: target.into(),
            knob: "workload".into(),
            value: workload.into(),
            knob2: "setting".into(),
            value2: setting.into(),
            workload: workload.into(),
            pps,
            p99_us,
            ..super::super::tests::sample_row()
        }
    }

    #[test]
    fn adaptive_is_compared_with_the_best_fixed_point_by_the_workloads_objective() {
        let rows = vec![
            row("sim", "fwd", DEFAULT_SETTING, 100.0, f64::NAN),
            row("sim", "fwd", "bp64-kt32", 300.0, f64::NAN),
            row("sim", "fwd", "bp0-kt1", f64::NAN, f64::NAN),
            row("sim", "fwd", ADAPTIVE_SETTING, 285.0, f64::NAN),
            // Ping-pong: the lowest p99 is the best.
            row("vm", "pingpong", DEFAULT_SETTING, 10.0, 40.0),
            row("vm", "pingpong", "bp64-kt1", 30.0, 20.0),
            row("vm", "pingpong", ADAPTIVE_SETTING, 25.0, 25.0),
            // No adaptive row: no comparison.
            row("vm", "mixed", DEFAULT_SETTING, 10.0, 40.0),
        ];
        let c = comparisons(&rows);
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].target.as_str(), c[0].workload.as_str()),
            ("sim", "fwd")
        );
        assert_eq!(c[0].best_fixed.value2, "bp64-kt32");
        assert!((c[0].vs_best - 0.95).abs() < 1e-9 && (c[0].vs_default - 2.85).abs() < 1e-9);
        assert_eq!(c[1].best_fixed.value2, "bp64-kt1");
        assert!((c[1].vs_best - 0.8).abs() < 1e-9, "{}", c[1].vs_best);
        assert!((c[1].vs_default - 1.6).abs() < 1e-9);
        let table = comparison_table(&rows);
        assert!(table.contains("| vm | pingpong | p99 (lower is better) | p99 40.0 µs | p99 20.0 µs (bp64-kt1) | p99 25.0 µs | 0.80 | 1.60 |"), "{table}");
        assert_eq!(comparison_table(&rows[7..]), "");
    }
}
