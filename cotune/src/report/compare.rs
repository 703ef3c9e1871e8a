//! The adaptive preset's comparison: per target and workload, both sides adaptive against the
//! defaults and the best fixed point of the grid, each scored by the workload's objective.
//!
//! The grid's best point is the largest of many noisy scores, so its own score flatters it
//! (the winner's curse: with a spread of ±20 % between trials, the best of 18 equal points
//! reads ~30 % above their median). The preset therefore also re-runs the best fixed point
//! and the adaptive point in alternation after the grid ([`PAIRED_PREFIX`] rows), and the
//! comparison gives that paired ratio beside the grid's.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::Row;

/// The adaptive preset's `setting` of the defaults.
pub const DEFAULT_SETTING: &str = "default";
/// The adaptive preset's `setting` with both sides adaptive.
pub const ADAPTIVE_SETTING: &str = "adaptive";
/// The prefix of the `setting` of a paired re-run row: `paired:` and the setting re-run.
pub const PAIRED_PREFIX: &str = "paired:";

/// A workload's objective: its name and a row's score (higher is better; NaN: not measured).
pub fn objective(workload: &str) -> (&'static str, fn(&Row) -> f64) {
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
    /// The paired re-runs (best fixed, adaptive), and adaptive's score over the best fixed
    /// point's in them: the comparison without the grid's selection in it.
    pub paired: Option<(Row, Row, f64)>,
    /// The `mixed` workload's ceiling for adaptation: the grid's row with the best floods
    /// (highest pps), its row with the best trickles (lowest p99), and the score the two
    /// phases would reach together over the best fixed point's ([`phase_ceiling`]).
    pub phase_ceiling: Option<(Row, Row, f64)>,
}

/// One target's and workload's measured fixed points of the grid: not a paired re-run, not
/// adapting, with a finite score.
fn fixed_points<'a, 'r>(
    rows: &'r [&'a Row],
    workload: &str,
) -> impl Iterator<Item = &'a Row> + use<'a, 'r> {
    let (_, score) = objective(workload);
    rows.iter()
        .copied()
        .filter(|r| !r.dev_adaptive && !r.drv_adaptive && !r.value2.starts_with(PAIRED_PREFIX))
        .filter(move |r| score(r).is_finite())
}

/// The best fixed point among one target's and workload's grid rows (not a paired re-run, not
/// adapting, measured).
pub fn best_fixed<'a>(rows: &[&'a Row], workload: &str) -> Option<&'a Row> {
    let (_, score) = objective(workload);
    fixed_points(rows, workload).max_by(|a, b| score(a).total_cmp(&score(b)))
}

/// How much a setting that follows the `mixed` workload's phases could gain over the best
/// fixed point of the grid, at most: the objective is the floods' pps over the trickles' p99,
/// so the best one can do with the grid's points is the best floods of one point with the best
/// trickles of another. `(best floods, best trickles, their score over best fixed's)`; a ratio
/// near 1 (the same point best in both phases, or points that differ by less than the trials'
/// spread) says adaptation can reach the best fixed point on this workload but not measurably
/// beat it. The maximum and minimum of noisy figures flatter the ceiling as the best point
/// flatters itself: it is an upper bound. `None` for another workload or without a measured
/// fixed point.
pub fn phase_ceiling(rows: &[&Row], workload: &str) -> Option<(Row, Row, f64)> {
    if workload != "mixed" {
        return None;
    }
    let (_, score) = objective(workload);
    let best = best_fixed(rows, workload)?;
    // Latencies are positive, and a p99 of zero leaves no finite score.
    let floods = fixed_points(rows, workload).max_by(|a, b| a.pps.total_cmp(&b.pps))?;
    let trickles = fixed_points(rows, workload).min_by(|a, b| a.p99_us.total_cmp(&b.p99_us))?;
    let ratio = floods.pps / trickles.p99_us / score(best);
    Some((floods.clone(), trickles.clone(), ratio))
}

/// The row of `rows` with the median score by `workload`'s objective (the lower middle of an
/// even count); `None` when none was measured.
pub fn median_by_objective(mut rows: Vec<Row>, workload: &str) -> Option<Row> {
    let (_, score) = objective(workload);
    rows.retain(|r| score(r).is_finite());
    rows.sort_by(|a, b| score(a).total_cmp(&score(b)));
    let mid = rows.len().checked_sub(1)? / 2;
    Some(rows.swap_remove(mid))
}

/// The coverage an interval for a median must reach at least (the sign test's interval).
const MEDIAN_INTERVAL_COVERAGE: f64 = 0.90;

/// A distribution-free interval for the median of `values` (the finite ones): the order
/// statistics `v(j)` and `v(n + 1 − j)` of the sorted values, with the largest `j` whose
/// coverage, `1 − 2·P(X < j)` for `X ~ Binomial(n, ½)`, is at least 90 % (the interval a
/// sign test gives; it assumes nothing of the values' distribution, only that the rounds are
/// independent). `(low, high, coverage)`; `None` under five values, where even the whole range
/// covers less.
pub fn median_interval(values: &[f64]) -> Option<(f64, f64, f64)> {
    use statrs::distribution::{Binomial, DiscreteCDF};
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let binomial = Binomial::new(0.5, u64::try_from(n).ok()?).ok()?;
    // P(X < j) = P(X ≤ j − 1).
    let coverage = |j: usize| 1.0 - 2.0 * binomial.cdf(j as u64 - 1);
    let j = (1..=n / 2)
        .take_while(|&j| coverage(j) >= MEDIAN_INTERVAL_COVERAGE)
        .last()?;
    Some((v[j - 1], v[n - j], coverage(j)))
}

/// What the paired re-run's rounds say on their own (appended to the adaptive paired row's
/// note): each round runs the best fixed point and the adaptive one back to back, so the ratio
/// of their scores within a round leaves out what drifts between rounds (the host's pace); its
/// median and range over the rounds, and from five rounds on an interval for that median
/// ([`median_interval`]): a bound such as 0.95 inside it is a tie at this host's spread, one
/// under it is beaten. Empty without a round where both were measured.
pub fn round_ratios_note(ratios: &[f64]) -> String {
    let v: Vec<f64> = ratios.iter().copied().filter(|r| r.is_finite()).collect();
    let (Some(min), Some(max)) = (
        v.iter().copied().min_by(f64::total_cmp),
        v.iter().copied().max_by(f64::total_cmp),
    ) else {
        return String::new();
    };
    let mut note = format!(
        "; adaptive / best fixed within a round: median {:.2} ({min:.2}–{max:.2}, {} rounds)",
        crate::autotune::median(&v),
        v.len()
    );
    if let Some((low, high, coverage)) = median_interval(&v) {
        let _ = write!(
            note,
            "; {:.0} % interval for that median (sign test): {low:.2}–{high:.2}",
            coverage * 100.0
        );
    }
    note
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
        let Some(best_fixed) = best_fixed(&rows, &workload) else {
            continue;
        };
        let paired = find(&format!("{PAIRED_PREFIX}{}", best_fixed.value2))
            .zip(find(&format!("{PAIRED_PREFIX}{ADAPTIVE_SETTING}")))
            .map(|(b, a)| (b.clone(), a.clone(), score(a) / score(b)));
        let phase_ceiling = phase_ceiling(&rows, &workload);
        out.push(Comparison {
            target,
            objective,
            vs_best: score(adaptive) / score(best_fixed),
            vs_default: score(adaptive) / score(default),
            default: default.clone(),
            best_fixed: (*best_fixed).clone(),
            adaptive: adaptive.clone(),
            paired,
            phase_ceiling,
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
         adaptive / best fixed | adaptive / default | paired re-run: best fixed, adaptive | \
         paired: adaptive / best fixed |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &cmp {
        let w = c.workload.as_str();
        let (paired, paired_ratio) = match &c.paired {
            Some((b, a, ratio)) => (
                format!("{}, {}", describe(w, b), describe(w, a)),
                format!("{ratio:.2}"),
            ),
            None => ("-".to_owned(), "-".to_owned()),
        };
        let _ = writeln!(
            s,
            "| {} | {w} | {} | {} | {} ({}) | {} | {:.2} | {:.2} | {paired} | {paired_ratio} |",
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
    for c in &cmp {
        if let Some((floods, trickles, ratio)) = &c.phase_ceiling {
            let _ = write!(
                s,
                "\n{} {}: the grid's best floods ({:.0} k pps, {}) with its best trickles \
                 (p99 {:.1} µs, {}) would score {ratio:.2} × its best fixed point: the most that \
                 following the phases with the grid's points could gain over it.\n",
                c.target,
                c.workload,
                floods.pps / 1e3,
                floods.value2,
                trickles.p99_us,
                trickles.value2,
            );
        }
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
            // The paired re-runs of the best fixed point and of adaptive.
            row("vm", "pingpong", "paired:bp64-kt1", 30.0, 24.0),
            row("vm", "pingpong", "paired:adaptive", 25.0, 25.0),
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
        assert!(c[0].paired.is_none());
        let (b, a, ratio) = c[1].paired.as_ref().expect("paired rows");
        assert_eq!((b.p99_us, a.p99_us), (24.0, 25.0));
        assert!((ratio - 0.96).abs() < 1e-9, "{ratio}");
        let table = comparison_table(&rows);
        assert!(table.contains("| vm | pingpong | p99 (lower is better) | p99 40.0 µs | p99 20.0 µs (bp64-kt1) | p99 25.0 µs | 0.80 | 1.60 | p99 24.0 µs, p99 25.0 µs | 0.96 |"), "{table}");
        assert!(table.contains("| 2.85 | - | - |"), "{table}");
        assert_eq!(comparison_table(&rows[9..]), "");
    }

    #[test]
    fn the_mixed_loads_ceiling_joins_the_best_floods_with_the_best_trickles() {
        let mut adapting = row("vm", "mixed", ADAPTIVE_SETTING, 900.0, 5.0);
        adapting.dev_adaptive = true;
        let rows = vec![
            row("vm", "mixed", DEFAULT_SETTING, 100.0, 40.0),
            // Best by the objective: 300 / 10 = 30.
            row("vm", "mixed", "bp64-kt1", 300.0, 10.0),
            // The best floods (400 / 20 = 20).
            row("vm", "mixed", "bp0-kt32", 400.0, 20.0),
            // The best trickles (200 / 8 = 25).
            row("vm", "mixed", "bp16-kt8", 200.0, 8.0),
            row("vm", "mixed", "bp0-kt1", f64::NAN, 1.0),
            // Neither a paired re-run nor an adapting row counts.
            row("vm", "mixed", "paired:bp64-kt1", 1000.0, 1.0),
            adapting,
        ];
        let refs: Vec<&Row> = rows.iter().collect();
        let (floods, trickles, ratio) = phase_ceiling(&refs, "mixed").expect("mixed");
        assert_eq!(
            (floods.value2.as_str(), trickles.value2.as_str()),
            ("bp0-kt32", "bp16-kt8")
        );
        // (400 / 8) / 30.
        assert!((ratio - 50.0 / 30.0).abs() < 1e-9, "{ratio}");
        assert!(phase_ceiling(&refs, "fwd").is_none());
        assert!(phase_ceiling(&refs[..1], "pingpong").is_none());
        // One point best in both phases: the ceiling is that point.
        let (_, _, one) = phase_ceiling(&refs[..2], "mixed").expect("mixed");
        assert!((one - 1.0).abs() < 1e-9, "{one}");
        let table = comparison_table(&rows);
        assert!(
            table.contains(
                "vm mixed: the grid's best floods (0 k pps, bp0-kt32) with its best trickles \
                 (p99 8.0 µs, bp16-kt8) would score 1.67 × its best fixed point"
            ),
            "{table}"
        );
    }

    #[test]
    fn a_paired_rerun_is_never_the_best_fixed_point_and_the_median_is_by_objective() {
        let grid = [
            row("sim", "pingpong", "bp0-kt1", 10.0, 50.0),
            row("sim", "pingpong", "paired:bp0-kt1", 10.0, 5.0),
        ];
        let refs: Vec<&Row> = grid.iter().collect();
        assert_eq!(
            best_fixed(&refs, "pingpong").map(|r| r.value2.as_str()),
            Some("bp0-kt1")
        );
        let trials = vec![
            row("sim", "pingpong", "x", 1.0, 30.0),
            row("sim", "pingpong", "x", 1.0, 10.0),
            row("sim", "pingpong", "x", 1.0, f64::NAN),
            row("sim", "pingpong", "x", 1.0, 20.0),
        ];
        let m = median_by_objective(trials, "pingpong").expect("measured");
        assert_eq!(m.p99_us, 20.0);
        assert!(median_by_objective(Vec::new(), "fwd").is_none());
    }

    #[test]
    fn the_rounds_ratio_note_gives_the_median_and_range_of_the_finite_ratios() {
        assert_eq!(round_ratios_note(&[]), "");
        assert_eq!(round_ratios_note(&[f64::NAN, f64::INFINITY]), "");
        let odd = round_ratios_note(&[1.3, 0.7, f64::NAN, 1.0]);
        assert_eq!(
            odd,
            "; adaptive / best fixed within a round: median 1.00 (0.70–1.30, 3 rounds)"
        );
        let even = round_ratios_note(&[0.9, 1.2, 1.0, 0.5]);
        assert!(even.contains("median 0.95 (0.50–1.20, 4 rounds)"), "{even}");
        // Four rounds: no interval (the whole range would cover 87.5 %).
        assert!(!even.contains("interval"), "{even}");
        let nine = round_ratios_note(&[1.1, 0.8, 1.0, 0.9, 1.3, 0.95, 1.05, 0.7, 1.2]);
        assert!(
            nine.ends_with("; 96 % interval for that median (sign test): 0.80–1.20"),
            "{nine}"
        );
    }

    #[test]
    fn the_median_interval_takes_the_order_statistics_a_sign_test_allows() {
        assert_eq!(median_interval(&[1.0, 2.0, 3.0, 4.0]), None);
        // Five values: only the whole range covers 90 % (1 − 2/32 = 93.75 %).
        let (low, high, c) = median_interval(&[5.0, 1.0, 4.0, 2.0, 3.0]).expect("five");
        assert_eq!((low, high), (1.0, 5.0));
        assert!((c - 0.9375).abs() < 1e-9, "{c}");
        // Nine: the second smallest and second largest (1 − 2·10/512 = 96.1 %); the third
        // pair would cover only 82 %.
        let nine: Vec<f64> = (1..=9).map(f64::from).collect();
        let (low, high, c) = median_interval(&nine).expect("nine");
        assert_eq!((low, high), (2.0, 8.0));
        assert!((c - (1.0 - 20.0 / 512.0)).abs() < 1e-9, "{c}");
        // Twenty-five: the eighth pair (1 − 2·P(X ≤ 7) = 95.7 %; the ninth, 89.2 %).
        let many: Vec<f64> = (1..=25).map(f64::from).collect();
        let (low, high, c) = median_interval(&many).expect("many");
        assert_eq!((low, high), (8.0, 18.0), "{c}");
        // Values that were not measured are left out.
        let gappy = [f64::NAN, 1.0, 2.0, 3.0, 4.0, 5.0, f64::INFINITY];
        assert_eq!(
            median_interval(&gappy).map(|(l, h, _)| (l, h)),
            Some((1.0, 5.0))
        );
    }
}
