//! Presets: which knobs of the driver and of the device each sweeps (one axis or two), over
//! which workload, and how a point is measured: in co-simulation (fresh rig per repeat), in a
//! real VM (one boot of the driver guest per repeat, `vm.rs`), or both; the median by pps.
//!
//! By concern: this file holds the presets, the options, and running a preset (baselines,
//! repeats, paired re-runs); `presets` each preset's points; `trials` one point in
//! co-simulation; `rows` a measured point as a report row.

use std::io;
use std::time::Duration;

use devices::virtio::net::KickCoalescing;
use vnet_driver::TxCompletion;

use crate::baseline::BareSyscall;
use crate::noise::loadavg1;
pub use crate::point::{BackendKind, DevKnobs, HostPath, Measured, Point, RingLayout};
use crate::report::Row;
use crate::transport::TransportKind;
use crate::vm::VmEnv;
use crate::workloads::Workload;

mod presets;
mod rows;
#[cfg(test)]
mod tests;
mod trials;

use self::presets::*;
use self::rows::*;
use self::trials::*;

/// Where a point is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Co-simulation: the driver crate and the device model on host threads.
    Sim,
    /// The driver guest (`ring=3`) booted through the `vmm` binary on a tap.
    Vm,
    /// Both, with a vm/sim pps ratio.
    Both,
}

impl Target {
    /// Runs the co-simulation.
    pub fn sim(self) -> bool {
        self != Target::Vm
    }

    /// Boots VMs.
    pub fn vm(self) -> bool {
        self != Target::Sim
    }
}

/// A named sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// N = 1..64 on zero-copy transmit.
    KickThreshold,
    /// tx-interrupt / clean-from-rx / lazy × EVENT_IDX on/off, bidirectional.
    TxCompletion,
    /// XDP_TX bulk B = 1..16 on an rx → XDP_TX bounce.
    XdpBulk,
    /// Zero-copy vs copy transmit at 64, 512 and 1456 B.
    XskZc,
    /// Device busy-poll 0, 10, 50, 200 µs on zero-copy transmit.
    BusyPoll,
    /// Kick threshold × device busy-poll (2-D), zero-copy transmit.
    KickBusyPoll,
    /// A busy-poll that spins against one that sleeps 10 / 20 / 50 µs between looks, and no
    /// busy-poll, on zero-copy transmit in bursts of 64 frames 50 µs apart: what each costs
    /// the device's CPU (`device_cpu_pct`) for the rate it gives.
    BusyPollSleep,
    /// The driver's kick threshold × the device's kick coalescing (off, 64 and 192 buffers
    /// without a kick, 50 µs looks) on unpaced zero-copy transmit: the two sides' kick
    /// batching together, busy-poll off.
    KickCoalesce,
    /// The device's tx budget per call 1, 16, 256 on zero-copy transmit.
    TxBudget,
    /// The device's sparse rx reads off/on, bidirectional (the VM: echo, one frame per wake-up
    /// or a few).
    RxSparseReads,
    /// Tx completion mode × interrupt coalescing max_packets (max_usecs 100), bidirectional.
    CompletionCoalesce,
    /// XDP_TX bulk × interrupt coalescing max_packets (max_usecs 100), rx → XDP_TX bounce.
    BulkCoalesce,
    /// The raw backend write loop alone.
    Baseline,
    /// Seed 000's shape: kick threshold N = 1..64 (fine over 3..13) on zero-copy transmit,
    /// against a `sink` (a host side faster than the guest).
    SeedKickThreshold,
    /// Seed 001's: zero-copy against copy transmit at 64, 512 and 1456 B, against a `sink`.
    SeedZc,
    /// Seed 002's: tx-interrupt against clean-from-rx (and lazy) completion on forwarding
    /// (`fwd`, 256 frames in flight) through a `loop`.
    SeedTxCompletion,
    /// Seed 004's: XDP_TX bulk B = 1..16 on forwarding through a `loop`.
    SeedXdpBulk,
    /// Receive at rate from a `source`, with the device's interrupt coalescing max_packets
    /// 0 / 8 / 32 / 128 (max_usecs 100).
    RxCoalesce,
    /// Receive at rate from a `source` (on a tap: fed by the host injector), with the
    /// device's busy-poll 0 / 10 / 50 / 200 µs: the worker polls the backend before it sleeps.
    RxBusyPoll,
    /// The virtqueue layout (split / packed / packed + IN_ORDER, on both sides) × the tx
    /// completion modes: transmit on a tap or a `sink`, receive from a `source`, forwarding
    /// through a `loop`.
    RingLayout,
    /// Request/response latency: W = 1, 4, 16, 64 frames in flight, each round trip timed,
    /// through a `loop` (`pingpong`; p50/p99/p99.9 columns).
    Pingpong,
    /// A workload that changes under the knobs: request/response alternating 10 ms floods
    /// (64 frames in flight) and 10 ms trickles (one), through a `loop`, with the device's
    /// interrupt coalescing max_packets 0 / 8 / 32 / 128 (max_usecs 100): `pps` is the floods'
    /// rate, p50/p99/p99.9 the trickles' round trips (`mixed`).
    Mixed,
    /// Adaptation against fixed knobs, per workload of the backend (a `loop`: forwarding,
    /// ping-pong with one frame in flight and `mixed`; a `sink`: zero-copy transmit): the
    /// defaults, a grid of fixed points (device busy-poll × coalescing × driver kick
    /// threshold) and both sides adaptive (`adaptive`; the comparison follows the table).
    Adaptive,
}

impl Preset {
    /// All presets, in report order.
    pub const ALL: [Preset; 23] = [
        Preset::Baseline,
        Preset::KickThreshold,
        Preset::TxCompletion,
        Preset::XdpBulk,
        Preset::XskZc,
        Preset::BusyPoll,
        Preset::KickBusyPoll,
        Preset::BusyPollSleep,
        Preset::KickCoalesce,
        Preset::TxBudget,
        Preset::RxSparseReads,
        Preset::CompletionCoalesce,
        Preset::BulkCoalesce,
        Preset::SeedKickThreshold,
        Preset::SeedZc,
        Preset::SeedTxCompletion,
        Preset::SeedXdpBulk,
        Preset::RxCoalesce,
        Preset::RxBusyPoll,
        Preset::RingLayout,
        Preset::Pingpong,
        Preset::Mixed,
        Preset::Adaptive,
    ];

    /// The seed presets, in seed order.
    pub const SEEDS: [Preset; 4] = [
        Preset::SeedKickThreshold,
        Preset::SeedZc,
        Preset::SeedTxCompletion,
        Preset::SeedXdpBulk,
    ];

    /// The backend the preset always runs on (its regime), if it has one; the others run on
    /// `--backend`.
    pub fn backend(self) -> Option<BackendKind> {
        match self {
            Preset::SeedKickThreshold | Preset::SeedZc => Some(BackendKind::Sink),
            Preset::SeedTxCompletion
            | Preset::SeedXdpBulk
            | Preset::Pingpong
            | Preset::Mixed
            | Preset::Adaptive => Some(BackendKind::Loop),
            Preset::RxCoalesce | Preset::RxBusyPoll => Some(BackendKind::Source),
            _ => None,
        }
    }

    /// The preset's name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::KickThreshold => "kick-threshold",
            Preset::TxCompletion => "tx-completion",
            Preset::XdpBulk => "xdp-bulk",
            Preset::XskZc => "xsk-zc",
            Preset::BusyPoll => "busy-poll",
            Preset::KickBusyPoll => "kick-busy-poll",
            Preset::BusyPollSleep => "busy-poll-sleep",
            Preset::KickCoalesce => "kick-coalesce",
            Preset::TxBudget => "tx-budget",
            Preset::RxSparseReads => "rx-sparse-reads",
            Preset::CompletionCoalesce => "completion-coalesce",
            Preset::BulkCoalesce => "bulk-coalesce",
            Preset::Baseline => "baseline",
            Preset::SeedKickThreshold => "seed-kick-threshold",
            Preset::SeedZc => "seed-zc",
            Preset::SeedTxCompletion => "seed-tx-completion",
            Preset::SeedXdpBulk => "seed-xdp-bulk",
            Preset::RxCoalesce => "rx-coalesce",
            Preset::RxBusyPoll => "rx-busy-poll",
            Preset::RingLayout => "ring-layout",
            Preset::Pingpong => "pingpong",
            Preset::Mixed => "mixed",
            Preset::Adaptive => "adaptive",
        }
    }
}

/// How to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// Measured time per co-simulation trial.
    pub duration: Duration,
    /// Warm-up per co-simulation trial.
    pub warmup: Duration,
    /// Trials per point (the median is reported).
    pub repeat: usize,
    /// Rounds of the adaptive preset's paired re-run (at least `repeat`).
    pub paired_rounds: usize,
    /// Frame size override (Ethernet bytes); presets have their own defaults.
    pub frame_size: Option<usize>,
    /// Co-simulation backend (and the VMs' when it is a measurement backend).
    pub backend: BackendKind,
    /// The seed presets, rx-coalesce and rx-busy-poll run on their own backends (`--backend`
    /// not given).
    pub own_regimes: bool,
    /// Exit-cost model.
    pub kick_cost_ns: u64,
    /// Exit-cost model.
    pub irq_cost_ns: u64,
    /// Fewer points (CI).
    pub quick: bool,
    /// Where points are measured.
    pub target: Target,
    /// Pin the driver (vCPU) thread and the device worker to these two CPUs.
    pub pin: Option<(usize, usize)>,
    /// The VMM, the guest and the frame count, when `target` boots VMs.
    pub vm: Option<VmEnv>,
    /// The co-simulation's device transport.
    pub transport: TransportKind,
    /// The raw write loop's system call.
    pub bare: BareSyscall,
    /// The tap's host path (with `--backend tap` and in VMs on a tap).
    pub host_path: HostPath,
    /// The ring layout of every point (both sides), except the ring-layout preset's, which
    /// sweeps it.
    pub ring: RingLayout,
    /// The driver's tx completion for every point of a preset that does not sweep it (`None`:
    /// each preset's own).
    pub tx_completion: Option<TxCompletion>,
    /// The device busy-poll's sleep between looks for every point of a preset that does not
    /// sweep it (`None`: each point's own, 0 unless the preset says).
    pub busy_poll_sleep_us: Option<u32>,
    /// The device's kick coalescing for every point of a preset that does not sweep it
    /// (`None`: each point's own, off unless the preset says).
    pub kick_coalescing: Option<KickCoalescing>,
    /// The device may not poll (an operator who grants it no core): no point has a busy-poll
    /// window, adapting devices run with `adaptive_max_busy_poll_us=0`, and the adaptive
    /// preset's grid sweeps kick coalescing where it would sweep the window.
    pub no_polling: bool,
    /// The adaptive preset's workloads to run, by name (empty: all of the backend's).
    pub workloads: Vec<String>,
}

#[cfg(test)]
impl Options {
    /// Options for unit tests: co-simulation on the pair backend, 100 ms trials, one repeat.
    pub(crate) fn for_tests(quick: bool) -> Options {
        Options {
            duration: Duration::from_millis(100),
            warmup: Duration::ZERO,
            repeat: 1,
            paired_rounds: PAIRED_ROUNDS,
            frame_size: None,
            backend: BackendKind::Pair,
            own_regimes: true,
            kick_cost_ns: 0,
            irq_cost_ns: 0,
            quick,
            target: Target::Sim,
            pin: None,
            vm: None,
            transport: TransportKind::Mmio,
            bare: BareSyscall::Write,
            host_path: HostPath::Stack,
            ring: RingLayout::SPLIT,
            tx_completion: None,
            busy_poll_sleep_us: None,
            kick_coalescing: None,
            no_polling: false,
            workloads: Vec::new(),
        }
    }
}

/// The points of `preset`.
pub fn points(preset: Preset, opts: &Options) -> Vec<Point> {
    let pts = match preset {
        Preset::Baseline => Vec::new(),
        Preset::KickThreshold => kick_threshold_points(opts),
        Preset::TxCompletion => tx_completion_points(opts),
        Preset::XdpBulk => xdp_bulk_points(opts),
        Preset::XskZc => xsk_points(opts),
        Preset::BusyPoll => busy_poll_points(opts),
        Preset::KickBusyPoll => kick_busy_poll_points(opts),
        Preset::BusyPollSleep => busy_poll_sleep_points(opts),
        Preset::KickCoalesce => kick_coalesce_points(opts),
        Preset::TxBudget => tx_budget_points(opts),
        Preset::RxSparseReads => rx_sparse_reads_points(opts),
        Preset::CompletionCoalesce => completion_coalesce_points(opts),
        Preset::BulkCoalesce => bulk_coalesce_points(opts),
        Preset::SeedKickThreshold => seed_kick_threshold_points(opts),
        Preset::SeedZc => xsk_points(opts),
        Preset::SeedTxCompletion => fwd_completion_points(opts),
        Preset::SeedXdpBulk => xdp_bulk_points(opts),
        Preset::RxCoalesce => rx_coalesce_points(opts),
        Preset::RxBusyPoll => rx_busy_poll_points(opts),
        Preset::Pingpong => pingpong_points(opts),
        Preset::Mixed => mixed_points(opts),
        Preset::Adaptive => adaptive_points(opts),
        Preset::RingLayout => return ring_layout_points(opts),
    };
    pts.into_iter().map(|p| p.on_ring(opts.ring)).collect()
}

/// Runs `preset`, calling `progress` before each trial. Returns its rows (with a baseline row
/// per target for each frame size it uses).
pub fn run_preset(
    preset: Preset,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Row>> {
    let opts = &in_regime(preset, opts);
    let pts = preset_points(preset, opts)?;
    let mut rows = Vec::new();
    let baselines = run_baselines(preset, &pts, opts, progress, &mut rows)?;
    let base = |target: &str, size: usize| {
        baselines
            .iter()
            .find(|(t, s, _)| *t == target && *s == size)
            .map_or(f64::NAN, |b| b.2)
    };
    for (i, p) in pts.iter().enumerate() {
        let load = loadavg1();
        let mut say = |target: &str, r: usize| {
            progress(&format!(
                "{} [{}/{}] {target} {} {} B, trial {}/{}",
                preset.name(),
                i + 1,
                pts.len(),
                p.label(),
                p.frame_size,
                r + 1,
                opts.repeat
            ))
        };
        let mut sim_row = None;
        if opts.target.sim() {
            let mut runs = Vec::new();
            for r in 0..opts.repeat {
                say("sim", r);
                runs.push(sim_trial(p, opts)?);
            }
            let m = median(runs);
            let base = base("sim", p.frame_size);
            sim_row = Some(point_row(preset, "sim", p, Some(&m), base, load, opts));
        }
        let mut vm_row = None;
        if let (true, Some(env)) = (opts.target.vm(), &opts.vm) {
            let base = base("vm", p.frame_size);
            vm_row = Some(vm_point_row(preset, p, env, base, load, opts, &mut say)?);
        }
        if let (Some(s), Some(v)) = (&mut sim_row, &mut vm_row) {
            let ratio = v.pps / s.pps;
            s.vm_sim_ratio = ratio;
            v.vm_sim_ratio = ratio;
        }
        rows.extend(sim_row);
        rows.extend(vm_row);
    }
    if matches!(preset, Preset::Adaptive) {
        confirm_adaptive(&pts, opts, &mut rows, progress)?;
    }
    Ok(rows)
}

/// Alternated trials of the best fixed point and of adaptation, per target and workload, in
/// the adaptive preset's paired re-run (`--paired-rounds`' default).
pub const PAIRED_ROUNDS: usize = 3;

/// The adaptive preset's paired re-run: per target and workload, the grid's best fixed point
/// and the adaptive point (both sides) again, in alternation (A B, B A, …) over
/// `max(repeat, paired_rounds)` rounds, each kept as the median trial by the workload's
/// objective in a row whose setting is `paired:` and the setting re-run. The grid chose the
/// best point by its own noisy scores; these trials did not take part in the choice.
fn confirm_adaptive(
    pts: &[Point],
    opts: &Options,
    rows: &mut Vec<Row>,
    progress: &mut dyn FnMut(&str),
) -> io::Result<()> {
    let rounds = opts.repeat.max(opts.paired_rounds);
    let mut extra = Vec::new();
    let targets = [
        ("sim", opts.target.sim()),
        ("vm", opts.target.vm() && opts.vm.is_some()),
    ];
    for (target, on) in targets {
        let mut workloads: Vec<&str> = pts.iter().map(|p| p.axes[0].1.as_str()).collect();
        workloads.dedup();
        for workload in workloads.into_iter().filter(|_| on) {
            let group: Vec<&Row> = rows
                .iter()
                .filter(|r| r.target == target && r.value == workload)
                .collect();
            let Some(best) = crate::report::best_fixed(&group, workload) else {
                continue;
            };
            let find = |setting: &str| {
                pts.iter()
                    .find(|p| p.axes[0].1 == workload && p.axes[1].1 == setting)
            };
            let (Some(fixed), Some(adaptive)) =
                (find(&best.value2), find(crate::report::ADAPTIVE_SETTING))
            else {
                continue;
            };
            let pair = [fixed, adaptive];
            let mut trials: [Vec<Row>; 2] = Default::default();
            let mut ratios = Vec::new();
            for round in 0..rounds {
                let mut scores = [f64::NAN; 2];
                for i in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
                    progress(&format!(
                        "adaptive: paired re-run {target} {}, round {}/{rounds}",
                        pair[i].label(),
                        round + 1
                    ));
                    if let Ok(m) = trial(pair[i], opts, target == "vm")? {
                        let p = pair[i];
                        let row = point_row(
                            Preset::Adaptive,
                            target,
                            p,
                            Some(&m),
                            f64::NAN,
                            loadavg1(),
                            opts,
                        );
                        scores[i] = (crate::report::objective(workload).1)(&row);
                        trials[i].push(row);
                    }
                }
                let ratio = scores[1] / scores[0];
                if ratio.is_finite() {
                    ratios.push(ratio);
                }
            }
            for (i, runs) in trials.into_iter().enumerate() {
                if let Some(mut row) = crate::report::median_by_objective(runs, workload) {
                    row.value2 = format!("{}{}", crate::report::PAIRED_PREFIX, pair[i].axes[1].1);
                    row.note = format!("paired re-run: median of {rounds} alternated trials");
                    if i == 1 {
                        row.note += &crate::report::round_ratios_note(&ratios);
                    }
                    extra.push(row);
                }
            }
        }
    }
    rows.extend(extra);
    Ok(())
}

/// `opts` on the backend `preset` runs on: its own regime (a seed preset's sink, loop or
/// source) unless `--backend` was given, else `opts.backend`; in co-simulation and in VMs.
pub fn in_regime(preset: Preset, opts: &Options) -> Options {
    let backend = preset
        .backend()
        .filter(|_| opts.own_regimes)
        .unwrap_or(opts.backend);
    let mut opts = opts.clone();
    opts.backend = backend;
    if let Some(vm) = &mut opts.vm {
        vm.backend = backend;
    }
    opts
}

/// One trial of `point` on one target: in co-simulation, or (`vm`) by booting the driver guest
/// (`opts.vm` set). `Ok(Err(why))`: the target cannot run the point (why: from
/// [`crate::vm::unsupported`] or the guest).
pub fn trial(point: &Point, opts: &Options, vm: bool) -> io::Result<Result<Measured, String>> {
    if !vm {
        return sim_trial(point, opts).map(Ok);
    }
    let Some(env) = &opts.vm else {
        return Ok(Err(
            "no VM environment (the vmm and the driver guest)".into()
        ));
    };
    if let Some(why) = crate::vm::unsupported(point, env.backend) {
        return Ok(Err(why.into()));
    }
    Ok(match crate::vm::run_point(env, point, opts.pin)? {
        crate::vm::VmRun::Measured(m, _) => Ok(*m),
        crate::vm::VmRun::Unsupported(why) => Err(why),
    })
}

/// Sets the knob `knob` picks to `value` on every point, when an option gives one; refused
/// (`InvalidInput`) for a preset whose points differ in it, i.e. that sweeps it. `what`: the
/// knob's name and the option's, for the message.
fn override_knob<T: Copy + PartialEq>(
    preset: Preset,
    pts: &mut [Point],
    value: Option<T>,
    knob: fn(&mut Point) -> &mut T,
    (name, option): (&str, &str),
) -> io::Result<()> {
    let Some(value) = value else {
        return Ok(());
    };
    let mut own = pts.iter_mut().map(|p| *knob(p));
    if let Some(first) = own.next() {
        if own.any(|v| v != first) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "preset {} sweeps {name}: {option} does not apply",
                    preset.name()
                ),
            ));
        }
    }
    for p in pts {
        *knob(p) = value;
    }
    Ok(())
}

/// `--no-polling`: no point may have a busy-poll window (a preset that sets one refuses the
/// option), and adapting devices may not open one.
fn forbid_polling(preset: Preset, pts: &mut [Point]) -> io::Result<()> {
    if pts.iter().any(|p| p.dev.busy_poll_us > 0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "preset {} sets the device's busy-poll window: --no-polling does not apply",
                preset.name()
            ),
        ));
    }
    for p in pts {
        p.dev.adaptive_max_busy_poll_us = 0;
    }
    Ok(())
}

/// `--workloads`: only the adaptive preset's workloads named (a name it does not run, or
/// another preset, refuses the option).
fn keep_workloads(preset: Preset, opts: &Options, pts: &mut Vec<Point>) -> io::Result<()> {
    if opts.workloads.is_empty() {
        return Ok(());
    }
    let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
    if preset != Preset::Adaptive {
        return invalid(format!(
            "--workloads applies to the adaptive preset, not to {}",
            preset.name()
        ));
    }
    let names: Vec<&str> = adaptive_workloads(opts.backend)
        .into_iter()
        .map(workload_name)
        .collect();
    if let Some(bad) = opts.workloads.iter().find(|w| !names.contains(&w.as_str())) {
        return invalid(format!(
            "--workloads: the adaptive preset on --backend {} runs {}, not {bad:?}",
            opts.backend.name(),
            names.join(", ")
        ));
    }
    pts.retain(|p| {
        opts.workloads
            .iter()
            .any(|w| w == workload_name(p.workload))
    });
    Ok(())
}

/// The preset's points, their workloads adapted to `opts`' backend and target; an
/// `Unsupported` error when the backend cannot run one.
pub fn preset_points(preset: Preset, opts: &Options) -> io::Result<Vec<Point>> {
    let backend = opts.backend;
    let mut pts = points(preset, opts);
    keep_workloads(preset, opts, &mut pts)?;
    override_knob(
        preset,
        &mut pts,
        opts.tx_completion,
        |p| &mut p.config.tx_completion,
        ("the tx completion", "--tx-completion"),
    )?;
    override_knob(
        preset,
        &mut pts,
        opts.busy_poll_sleep_us,
        |p| &mut p.dev.busy_poll_sleep_us,
        ("the busy-poll's sleep", "--busy-poll-sleep-us"),
    )?;
    override_knob(
        preset,
        &mut pts,
        opts.kick_coalescing,
        |p| &mut p.dev.kick_coalescing,
        ("the kick coalescing", "--kick-coalesce"),
    )?;
    if opts.no_polling {
        forbid_polling(preset, &mut pts)?;
    }
    for p in &mut pts {
        p.workload = backend.adapt(opts.host_path, p.workload);
        if let Some(why) = backend.refuses(opts.host_path, p.workload) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "preset {} cannot run on --backend {}: {why}",
                    preset.name(),
                    backend.name()
                ),
            ));
        }
    }
    if opts.target.vm() {
        // The VM's only receiving workload is the driver guest's echo with a host peer that
        // keeps 64 frames in flight: run exactly that on both sides, so vm/sim compares like
        // with like (`--target sim` keeps the flooding bidirectional and bounce workloads).
        for p in &mut pts {
            if matches!(p.workload, Workload::Bidirectional | Workload::XdpBounce) {
                p.workload = Workload::Echo;
            }
        }
    }
    Ok(pts)
}

/// Measures the raw write loop of each target's backend for each frame size `pts` use (the
/// default size when none), adding a row for each to `rows` for the baseline preset.
/// Returns (target, size, pps) for each.
fn run_baselines(
    preset: Preset,
    pts: &[Point],
    opts: &Options,
    progress: &mut dyn FnMut(&str),
    rows: &mut Vec<Row>,
) -> io::Result<Vec<(&'static str, usize, f64)>> {
    // Receive-only presets compare with a read loop of the tap, fed by the injector.
    let receive_only = !pts.is_empty() && pts.iter().all(|p| p.workload == Workload::Rx);
    let mut sizes: Vec<usize> = pts.iter().map(|p| p.frame_size).collect();
    if sizes.is_empty() {
        sizes.push(opts.frame_size.unwrap_or(64));
    }
    sizes.sort_unstable();
    sizes.dedup();
    let mut baselines = Vec::new();
    let mut targets = Vec::new();
    if opts.target.sim() {
        targets.push(("sim", opts.backend));
    }
    if opts.target.vm() {
        // A VM's device writes to a tap (its floor is the raw tap loop), or to the
        // measurement backend (compared with the raw tap loop too).
        let vm_backend = if opts.backend.is_measurement() {
            opts.backend
        } else {
            BackendKind::Tap
        };
        targets.push(("vm", vm_backend));
    }
    for &s in &sizes {
        for &(target, backend) in &targets {
            progress(&format!(
                "{}: raw {} write loop, {s} B",
                preset.name(),
                backend.baseline_backend().name()
            ));
            let b = baseline(backend, s, opts, receive_only)?;
            baselines.push((target, s, b.pps));
            if preset == Preset::Baseline {
                rows.push(baseline_row(target, backend, s, &b, opts));
            }
        }
    }
    Ok(baselines)
}
