//! `cotune autotune PRESET`: searches a preset's grid of knobs (both sides) for the best point
//! of an objective with far fewer trials than the grid, and optionally runs the grid to say
//! how close it came.
//!
//! The search is a compass (pattern) search on the grid's index lattice, then a confirmation
//! round: it starts in the middle of every axis, measures the neighbours one step away along
//! each axis (one trial each), moves to any that is better, and halves the step when none is,
//! until the step is one and no neighbour is better. A sweep's axes are ordered (kick
//! threshold, busy-poll µs, coalescing packets, bulk size) and their objective is close to
//! unimodal along each, which is what a compass search needs; it visits about
//! `2·log2(len)` points per axis where the grid visits `len`. Single trials are noisy, so the
//! two best points seen are then measured until each has `repeat` trials and the best median
//! wins (successive halving's last round).

use std::collections::{HashMap, HashSet};
use std::io;

use crate::point::{Measured, Point};
use crate::sweep::{self, Options, Preset};

/// What autotune maximises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Objective {
    /// Packets per second.
    Pps,
    /// Packets per CPU-second of the driver (vCPU) thread and the device worker together.
    PpsPerCpu,
    /// Round trips' 99th percentile, lower is better: scored as its inverse (per second), so
    /// ratios of scores are ratios of latencies (request/response workloads).
    P99,
    /// Packets per second over the round trips' 99th percentile in µs: throughput and tail
    /// latency at once (the `mixed` workload: floods' rate, trickles' latency).
    PpsPerP99,
}

impl Objective {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Pps => "pps",
            Objective::PpsPerCpu => "pps-per-cpu",
            Objective::P99 => "p99",
            Objective::PpsPerP99 => "pps-per-p99",
        }
    }

    /// The score of one trial (higher is better), or why it has none.
    pub fn score(self, m: &Measured) -> Result<f64, String> {
        match self {
            Objective::Pps => Ok(m.pps()),
            Objective::PpsPerCpu => {
                let cpu_s = (m.driver_cpu_ns + m.device_cpu_ns) as f64 / 1e9;
                if !m.cpu_secs.is_finite() || cpu_s <= 0.0 {
                    return Err(
                        "pps-per-cpu needs the threads' CPU times, which this trial \
                                did not read"
                            .into(),
                    );
                }
                Ok(m.packets as f64 / cpu_s)
            }
            Objective::P99 => Ok(1e9 / p99_ns(m)?),
            Objective::PpsPerP99 => Ok(m.pps() / (p99_ns(m)? / 1e3)),
        }
    }
}

/// A trial's round-trip p99 in ns, or why it has none.
fn p99_ns(m: &Measured) -> Result<f64, String> {
    match &m.latency {
        Some(l) if l.p99_ns > 0 => Ok(l.p99_ns as f64),
        _ => Err("a latency objective needs a request/response workload (pingpong, mixed)".into()),
    }
}

/// A position on the grid: one index per axis.
pub type Pos = Vec<usize>;

/// One step of the search, in the order it was taken.
#[derive(Clone, Debug, PartialEq)]
pub struct Visit {
    /// Where.
    pub pos: Pos,
    /// The trial's score (`None`: the point cannot run on this target).
    pub score: Option<f64>,
    /// Why the search measured it.
    pub why: &'static str,
}

/// What a search found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The best point.
    pub best: Pos,
    /// Its median score over its trials.
    pub best_score: f64,
    /// Every trial, in order.
    pub path: Vec<Visit>,
    /// Trials run.
    pub trials: usize,
}

/// The median of `v` (not empty).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The search's state: every score measured per position.
struct Search<F> {
    measure: F,
    scores: HashMap<Pos, Vec<f64>>,
    refused: HashSet<Pos>,
    path: Vec<Visit>,
}

impl<F: FnMut(&[usize]) -> io::Result<Option<f64>>> Search<F> {
    /// One more trial at `pos`.
    fn trial(&mut self, pos: &[usize], why: &'static str) -> io::Result<Option<f64>> {
        let score = (self.measure)(pos)?;
        self.path.push(Visit {
            pos: pos.to_vec(),
            score,
            why,
        });
        match score {
            Some(s) => self.scores.entry(pos.to_vec()).or_default().push(s),
            None => {
                self.refused.insert(pos.to_vec());
            }
        }
        Ok(score)
    }

    /// Every position with at least `min_trials` scores, with its median, best first.
    fn ranked(&self, min_trials: usize) -> Vec<(Pos, f64)> {
        let mut ranked: Vec<(Pos, f64)> = self
            .scores
            .iter()
            .filter(|(_, v)| v.len() >= min_trials)
            .map(|(p, v)| (p.clone(), median(v)))
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked
    }

    /// `pos`'s screening score, measuring it once if it has none yet.
    fn screen(&mut self, pos: &[usize], why: &'static str) -> io::Result<Option<f64>> {
        if self.refused.contains(pos) {
            return Ok(None);
        }
        if let Some(v) = self.scores.get(pos) {
            return Ok(Some(median(v)));
        }
        self.trial(pos, why)
    }
}

/// Searches the grid of axis lengths `dims` for the position whose score is highest, measuring
/// one trial at a position with `measure` (`None`: that point cannot run, skip it); the two
/// best positions seen end with `repeat` trials each. Errors of `measure` end the search.
pub fn search(
    dims: &[usize],
    repeat: usize,
    measure: impl FnMut(&[usize]) -> io::Result<Option<f64>>,
) -> io::Result<Outcome> {
    if dims.is_empty() || dims.contains(&0) {
        return Err(io::Error::other("an empty grid has nothing to search"));
    }
    let mut s = Search {
        measure,
        scores: HashMap::new(),
        refused: HashSet::new(),
        path: Vec::new(),
    };
    let mut pos: Pos = dims.iter().map(|&n| (n - 1) / 2).collect();
    let mut step: Vec<usize> = dims.iter().map(|&n| (n / 4).max(1)).collect();
    let mut here = s.screen(&pos, "start")?.unwrap_or(f64::NEG_INFINITY);
    loop {
        let mut moved = false;
        for axis in 0..dims.len() {
            for dir in [-1isize, 1] {
                // A point that cannot run is stepped over, not a wall.
                let mut dist = step[axis];
                let mut last = None;
                while let Some(next) = neighbour(&pos, axis, dir, dist, dims[axis]) {
                    if last.as_ref() == Some(&next) {
                        break; // clamped to the edge twice: nothing further that way
                    }
                    match s.screen(&next, "neighbour")? {
                        Some(v) => {
                            if v > here {
                                (pos, here, moved) = (next, v, true);
                            }
                            break;
                        }
                        None => (dist, last) = (dist + step[axis], Some(next)),
                    }
                }
            }
        }
        if !moved {
            if step.iter().all(|&st| st == 1) {
                break;
            }
            step.iter_mut().for_each(|st| *st = (*st / 2).max(1));
        }
    }
    confirm(&mut s, repeat)?;
    // The best median among the positions confirmed to `repeat` trials (all of them with
    // `--repeat 1`); among all measured ones if no confirmation could finish.
    let (best, best_score) = s
        .ranked(repeat)
        .into_iter()
        .next()
        .or_else(|| s.ranked(1).into_iter().next())
        .ok_or_else(|| io::Error::other("no point of the grid could run on this target"))?;
    let trials = s.path.len();
    Ok(Outcome {
        best,
        best_score,
        path: s.path,
        trials,
    })
}

/// The position `step` away from `pos` along `axis` in direction `dir`, clamped to the grid;
/// `None` when that is `pos` itself.
fn neighbour(pos: &[usize], axis: usize, dir: isize, step: usize, len: usize) -> Option<Pos> {
    let i = pos[axis] as isize + dir * step as isize;
    let i = i.clamp(0, len as isize - 1) as usize;
    (i != pos[axis]).then(|| {
        let mut p = pos.to_vec();
        p[axis] = i;
        p
    })
}

/// The two best positions by screening score get `repeat` trials each.
fn confirm<F: FnMut(&[usize]) -> io::Result<Option<f64>>>(
    s: &mut Search<F>,
    repeat: usize,
) -> io::Result<()> {
    for (pos, _) in s.ranked(1).into_iter().take(2) {
        while s.scores.get(&pos).map_or(0, Vec::len) < repeat {
            if s.trial(&pos, "confirm")?.is_none() {
                break;
            }
        }
    }
    Ok(())
}

/// The grid the points of a preset make: the values of each axis in the order they first
/// appear, and the point at each position.
#[derive(Clone, Debug)]
pub struct Grid {
    /// Per axis: its knob and its values.
    pub axes: Vec<(&'static str, Vec<String>)>,
    /// Point index per position (row-major over `axes`).
    cells: HashMap<Pos, usize>,
}

impl Grid {
    /// The grid of `points` (one or two axes each, all the same knobs); an error when the
    /// points do not fill a grid.
    pub fn of(points: &[Point]) -> io::Result<Grid> {
        let first = points
            .first()
            .ok_or_else(|| io::Error::other("the preset has no points to search"))?;
        let mut axes: Vec<(&'static str, Vec<String>)> =
            first.axes.iter().map(|(k, _)| (*k, Vec::new())).collect();
        let mut cells = HashMap::new();
        for (i, p) in points.iter().enumerate() {
            if p.axes.len() != axes.len() || p.axes.iter().zip(&axes).any(|(a, b)| a.0 != b.0) {
                return Err(io::Error::other(
                    "the preset's points sweep different knobs",
                ));
            }
            let pos: Pos = p
                .axes
                .iter()
                .zip(axes.iter_mut())
                .map(|((_, v), (_, values))| {
                    values.iter().position(|x| x == v).unwrap_or_else(|| {
                        values.push(v.clone());
                        values.len() - 1
                    })
                })
                .collect();
            if cells.insert(pos, i).is_some() {
                return Err(io::Error::other(format!(
                    "two points of the preset at {}",
                    p.label()
                )));
            }
        }
        let size: usize = axes.iter().map(|(_, v)| v.len()).product();
        if size != points.len() {
            return Err(io::Error::other(format!(
                "the preset's {} points do not fill a {} grid",
                points.len(),
                axes.iter()
                    .map(|(_, v)| v.len().to_string())
                    .collect::<Vec<_>>()
                    .join("×")
            )));
        }
        Ok(Grid { axes, cells })
    }

    /// The length of each axis.
    pub fn dims(&self) -> Vec<usize> {
        self.axes.iter().map(|(_, v)| v.len()).collect()
    }

    /// The index (into the points) of the point at `pos`.
    pub fn point_at(&self, pos: &[usize]) -> usize {
        self.cells[pos]
    }

    /// `knob=value …` of `pos`.
    pub fn label(&self, pos: &[usize]) -> String {
        pos.iter()
            .zip(&self.axes)
            .map(|(&i, (k, v))| format!("{k}={}", v[i]))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The full grid measured: every point's median score over `repeat` trials.
#[derive(Clone, Debug)]
pub struct GridResult {
    /// Per point (in the points' order): the median score, `None` where it cannot run.
    pub scores: Vec<Option<f64>>,
    /// Trials run.
    pub trials: usize,
}

impl GridResult {
    /// The best point's index and score.
    pub fn best(&self) -> Option<(usize, f64)> {
        self.scores
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|s| (i, s)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// Measures every one of `n` points `repeat` times with `measure`.
pub fn run_grid(
    n: usize,
    repeat: usize,
    mut measure: impl FnMut(usize) -> io::Result<Option<f64>>,
) -> io::Result<GridResult> {
    let mut scores = Vec::with_capacity(n);
    let mut trials = 0;
    for i in 0..n {
        let mut v = Vec::new();
        for _ in 0..repeat {
            trials += 1;
            match measure(i)? {
                Some(s) => v.push(s),
                None => break,
            }
        }
        scores.push((!v.is_empty()).then(|| median(&v)));
    }
    Ok(GridResult { scores, trials })
}

/// What `cotune autotune` found on a preset.
#[derive(Clone, Debug)]
pub struct Tuned {
    /// The preset's points.
    pub points: Vec<Point>,
    /// Their grid.
    pub grid: Grid,
    /// The search.
    pub outcome: Outcome,
    /// The full grid, with `--check-grid`.
    pub grid_result: Option<GridResult>,
    /// The objective.
    pub objective: Objective,
    /// Trials per point of the grid (and of the search's finalists).
    pub repeat: usize,
}

/// Searches `preset`'s grid for `objective` on one target (`opts.target`: sim or vm), then,
/// with `check_grid`, measures the full grid too. `progress` hears of every trial.
pub fn autotune(
    preset: Preset,
    opts: &Options,
    objective: Objective,
    check_grid: bool,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Tuned> {
    if opts.target == sweep::Target::Both {
        return Err(io::Error::other(
            "autotune searches one target: --target sim or --target vm",
        ));
    }
    let vm = opts.target.vm();
    let opts = &sweep::in_regime(preset, opts);
    let points = sweep::preset_points(preset, opts)?;
    let grid = Grid::of(&points)?;
    let mut n = 0;
    let mut measure = |i: usize, what: &str| -> io::Result<Option<f64>> {
        n += 1;
        let p = &points[i];
        progress(&format!(
            "autotune {} [{n}] {what} {}",
            preset.name(),
            p.label()
        ));
        match sweep::trial(p, opts, vm)? {
            Ok(m) => objective.score(&m).map(Some).map_err(io::Error::other),
            Err(_unsupported) => Ok(None),
        }
    };
    let outcome = search(&grid.dims(), opts.repeat, |pos| {
        measure(grid.point_at(pos), "search")
    })?;
    let grid_result = if check_grid {
        Some(run_grid(points.len(), opts.repeat, |i| measure(i, "grid"))?)
    } else {
        None
    };
    Ok(Tuned {
        points,
        grid,
        outcome,
        grid_result,
        objective,
        repeat: opts.repeat,
    })
}

impl Tuned {
    /// The report: the path, the best point, and the grid's verdict when it ran.
    pub fn report(&self) -> String {
        let g = &self.grid;
        let o = &self.outcome;
        let mut s = format!(
            "# autotune objective={} grid={} points repeat={} (the grid's trials: {})\n",
            self.objective.name(),
            self.points.len(),
            self.repeat,
            self.points.len() * self.repeat
        );
        for (i, v) in o.path.iter().enumerate() {
            let score = v
                .score
                .map_or_else(|| "cannot run".into(), |x| format!("{x:.0}"));
            s += &format!(
                "{:>4}  {:<9} {:<48} {score}\n",
                i + 1,
                v.why,
                g.label(&v.pos)
            );
        }
        s += &format!(
            "best: {} ({} {:.0}, median of its trials) after {} trials ({:.0} % of the grid's)\n",
            g.label(&o.best),
            self.objective.name(),
            o.best_score,
            o.trials,
            100.0 * o.trials as f64 / (self.points.len() * self.repeat) as f64
        );
        if let Some(r) = &self.grid_result {
            match r.best() {
                Some((i, opt)) => {
                    let found = r.scores[g.point_at(&o.best)].unwrap_or(f64::NAN);
                    s += &format!(
                        "grid: best {} ({:.0}); autotune's point measured by the grid {:.0} = {:.3} × \
                         the grid's best, with {} of its {} trials\n",
                        self.points[i].label(),
                        opt,
                        found,
                        found / opt,
                        o.trials,
                        r.trials
                    );
                    s += &self.grid_table(r, i, opt);
                }
                None => s += "grid: no point could run\n",
            }
        }
        s
    }

    /// Every grid point's median score and its ratio to the grid's best, in the points'
    /// order, then how many points lie within 5 % of the best: how flat the grid is says how
    /// much the choice of its best point can be trusted.
    /// `best` and `opt` are the grid's best point and its score ([`GridResult::best`]).
    fn grid_table(&self, r: &GridResult, best: usize, opt: f64) -> String {
        let found = self.grid.point_at(&self.outcome.best);
        let mut s = String::new();
        for (i, (p, score)) in self.points.iter().zip(&r.scores).enumerate() {
            let mark = match (i == best, i == found) {
                (true, true) => "  (the grid's best; autotune's point)",
                (true, false) => "  (the grid's best)",
                (false, true) => "  (autotune's point)",
                (false, false) => "",
            };
            s += &match score {
                Some(v) => format!(
                    "  grid      {:<48} {v:.0} = {:.3} ×{mark}\n",
                    p.label(),
                    v / opt
                ),
                None => format!("  grid      {:<48} cannot run{mark}\n", p.label()),
            };
        }
        let near = r
            .scores
            .iter()
            .flatten()
            .filter(|&&v| v >= 0.95 * opt)
            .count();
        s + &format!(
            "grid: {near} of its {} points within 5 % of its best\n",
            r.scores.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic noise source (xorshift), ±`amp` relative.
    struct Noise(u64, f64);

    impl Noise {
        fn apply(&mut self, v: f64) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            let u = (self.0 % 10_000) as f64 / 10_000.0 * 2.0 - 1.0;
            v * (1.0 + self.1 * u)
        }
    }

    /// Runs the search on `f` over `dims` with `repeat`, and the grid, and returns
    /// (found's true value / true optimum, search trials / grid trials).
    fn against_grid(
        dims: &[usize],
        repeat: usize,
        f: impl Fn(&[usize]) -> f64,
        noise: f64,
    ) -> (f64, f64) {
        let mut n = Noise(0x9e37_79b9_7f4a_7c15, noise);
        let out = search(dims, repeat, |p| Ok(Some(n.apply(f(p))))).unwrap();
        let mut all: Vec<Pos> = vec![vec![]];
        for &d in dims {
            all = all
                .into_iter()
                .flat_map(|p| {
                    (0..d).map(move |i| {
                        let mut q = p.clone();
                        q.push(i);
                        q
                    })
                })
                .collect();
        }
        let opt = all.iter().map(|p| f(p)).fold(f64::NEG_INFINITY, f64::max);
        let grid_trials = all.len() * repeat;
        assert_eq!(out.trials, out.path.len());
        (f(&out.best) / opt, out.trials as f64 / grid_trials as f64)
    }

    #[test]
    fn finds_a_one_dimensional_optimum_with_a_third_of_the_grids_trials() {
        // Kick threshold 1..64 as in the seed: rises to N = 8, then falls off.
        for peak in [0usize, 3, 7, 11] {
            let f = |p: &[usize]| 1e6 - 5e4 * (p[0] as f64 - peak as f64).abs();
            let (quality, cost) = against_grid(&[12], 3, f, 0.0);
            assert!(quality >= 0.95, "peak {peak}: {quality}");
            assert!(cost <= 0.34, "peak {peak}: {cost}");
        }
    }

    #[test]
    fn finds_a_two_dimensional_optimum_within_5_percent_with_30_percent_of_the_trials() {
        // Kick threshold × busy-poll: a bowl with its top off the centre, noisy by ±3 %.
        for (pi, pj) in [(0usize, 0usize), (5, 3), (2, 1), (4, 0)] {
            let f = |p: &[usize]| {
                let (di, dj) = (p[0] as f64 - pi as f64, p[1] as f64 - pj as f64);
                2e6 - 4e4 * di * di - 1e5 * dj * dj
            };
            let (quality, cost) = against_grid(&[6, 4], 3, f, 0.03);
            assert!(quality >= 0.95, "peak ({pi},{pj}): {quality}");
            assert!(cost <= 0.30, "peak ({pi},{pj}): {cost}");
        }
    }

    #[test]
    fn unrunnable_points_are_skipped_and_an_all_unrunnable_grid_is_an_error() {
        let out = search(&[5], 2, |p| Ok((p[0] != 2).then_some(p[0] as f64))).unwrap();
        assert_eq!(out.best, vec![4]);
        assert!(out
            .path
            .iter()
            .any(|v| v.pos == vec![2] && v.score.is_none()));
        assert!(search(&[3], 2, |_| Ok(None)).is_err());
        assert!(search(&[], 2, |_| Ok(Some(1.0))).is_err());
    }

    #[test]
    fn the_best_two_end_with_repeat_trials_and_a_lucky_single_trial_does_not_win() {
        // The search moves to position 1 on a lucky first trial; confirmed, it loses to 2.
        let mut calls: HashMap<usize, usize> = HashMap::new();
        let out = search(&[5], 3, |p| {
            let k = calls.entry(p[0]).or_default();
            *k += 1;
            Ok(Some(match (p[0], *k) {
                (1, 1) => 200.0,
                (1, _) => 10.0,
                (2, _) => 100.0,
                _ => 0.0,
            }))
        })
        .unwrap();
        assert_eq!(out.best, vec![2], "{:?}", out.path);
        let confirmed = out.path.iter().filter(|v| v.why == "confirm").count();
        assert_eq!(
            confirmed, 4,
            "two points topped up to 3 trials: {:?}",
            out.path
        );
    }

    #[test]
    fn an_error_of_a_trial_ends_the_search() {
        let e = search(&[4], 1, |_| Err(io::Error::other("boom"))).unwrap_err();
        assert_eq!(e.to_string(), "boom");
    }

    #[test]
    fn grids_are_read_from_points_and_refused_when_they_are_not_grids() {
        use crate::sweep::{points, Options, Preset};
        let opts = Options::for_tests(false);
        let pts = points(Preset::KickBusyPoll, &opts);
        let g = Grid::of(&pts).unwrap();
        assert_eq!(g.dims(), vec![6, 4]);
        for (i, p) in pts.iter().enumerate() {
            let pos: Pos = p
                .axes
                .iter()
                .zip(&g.axes)
                .map(|((_, v), (_, values))| values.iter().position(|x| x == v).unwrap())
                .collect();
            assert_eq!(g.point_at(&pos), i);
            assert_eq!(g.label(&pos), p.label());
        }
        // Points are listed busy-poll by busy-poll: the first 6 fill a 6×1 grid, 7 do not.
        assert_eq!(Grid::of(&pts[..6]).unwrap().dims(), vec![6, 1]);
        assert!(Grid::of(&pts[..7]).is_err(), "a ragged grid");
        assert!(Grid::of(&[]).is_err());
        let mut twice = pts[..2].to_vec();
        twice[1] = twice[0].clone();
        assert!(Grid::of(&twice).is_err());
    }

    #[test]
    fn the_grid_runs_every_point_repeat_times_and_names_the_best() {
        let r = run_grid(4, 3, |i| Ok((i != 1).then_some((i * 10) as f64))).unwrap();
        assert_eq!(r.trials, 3 * 3 + 1);
        assert_eq!(r.scores, vec![Some(0.0), None, Some(20.0), Some(30.0)]);
        assert_eq!(r.best(), Some((3, 30.0)));
    }

    #[test]
    fn the_report_lists_the_grid_and_how_flat_it_is() {
        use crate::sweep::{points, Options, Preset};
        // kick_threshold 1 / 8 / 64: 64 cannot run, 8 is the best, autotune chose 1 at 0.96 ×.
        let pts = points(Preset::KickThreshold, &Options::for_tests(true));
        let grid = Grid::of(&pts).unwrap();
        let t = Tuned {
            outcome: Outcome {
                best: vec![0],
                best_score: 97.0,
                path: vec![],
                trials: 2,
            },
            grid_result: Some(GridResult {
                scores: vec![Some(96.0), Some(100.0), None],
                trials: 3,
            }),
            points: pts,
            grid,
            objective: Objective::Pps,
            repeat: 1,
        };
        let report = t.report();
        let lines: Vec<&str> = report.lines().filter(|l| l.starts_with("  grid")).collect();
        assert_eq!(lines.len(), 3, "{report}");
        assert!(lines[0].contains("kick_threshold=1"), "{report}");
        assert!(
            lines[0].ends_with("96 = 0.960 ×  (autotune's point)"),
            "{report}"
        );
        assert!(
            lines[1].ends_with("100 = 1.000 ×  (the grid's best)"),
            "{report}"
        );
        assert!(lines[2].ends_with("cannot run"), "{report}");
        assert!(
            report.ends_with("grid: 2 of its 3 points within 5 % of its best\n"),
            "{report}"
        );
    }

    #[test]
    fn autotune_runs_a_preset_in_co_simulation_and_checks_the_grid() {
        let opts = Options {
            backend: crate::point::BackendKind::Sink,
            ..Options::for_tests(true)
        };
        let mut said = 0;
        let t = autotune(
            Preset::KickThreshold,
            &opts,
            Objective::Pps,
            true,
            &mut |_| said += 1,
        )
        .unwrap();
        let r = t.grid_result.as_ref().unwrap();
        assert_eq!(r.trials, t.points.len());
        assert_eq!(said, t.outcome.trials + r.trials);
        assert!(t.outcome.best_score > 0.0);
        let report = t.report();
        assert!(report.contains("best: kick_threshold="), "{report}");
        assert!(report.contains("× the grid's best"), "{report}");
        // Every point of the grid has its line, the best one named.
        for p in &t.points {
            let line = format!("  grid      {:<48} ", p.label());
            assert_eq!(report.matches(&line).count(), 1, "{line:?} in {report}");
        }
        assert_eq!(report.matches("the grid's best").count(), 2, "{report}");
        assert!(report.contains("1.000 ×"), "{report}");
        assert!(
            report.contains(" points within 5 % of its best"),
            "{report}"
        );
        let both = Options {
            target: crate::sweep::Target::Both,
            ..opts
        };
        assert!(autotune(
            Preset::KickThreshold,
            &both,
            Objective::Pps,
            false,
            &mut |_| {}
        )
        .is_err());
    }

    #[test]
    fn objectives_score_a_trial() {
        let m = Measured {
            secs: 2.0,
            packets: 2_000_000,
            driver_cpu_ns: 1_000_000_000,
            device_cpu_ns: 1_000_000_000,
            cpu_secs: 2.0,
            ..Measured::default()
        };
        assert_eq!(Objective::Pps.score(&m), Ok(1e6));
        assert_eq!(Objective::PpsPerCpu.score(&m), Ok(1e6));
        let no_cpu = Measured {
            cpu_secs: f64::NAN,
            ..m
        };
        assert!(Objective::PpsPerCpu.score(&no_cpu).is_err());
        assert!(Objective::P99.score(&m).is_err(), "no round trips timed");
        let timed = Measured {
            latency: Some(crate::workloads::Latency {
                p99_ns: 50_000,
                ..Default::default()
            }),
            ..m
        };
        assert_eq!(Objective::P99.score(&timed), Ok(20_000.0));
        assert_eq!(Objective::PpsPerP99.score(&timed), Ok(1e6 / 50.0));
    }
}
