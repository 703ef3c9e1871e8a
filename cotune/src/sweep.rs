//! Presets: which knobs of the driver and of the device each sweeps (one axis or two), over
//! which workload, and how a point is measured: in co-simulation (fresh rig per repeat), in a
//! real VM (one boot of the driver guest per repeat, `vm.rs`), or both; the median by pps.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use devices::backend::{LoopBackend, NetBackend, PairBackend, SinkBackend, SourceBackend};
use devices::test_utils::link::PacketSocket;
use devices::test_utils::netns::NetNs;

use devices::virtio::net::{adapt, KickCoalescing};
use vnet_driver::xsk::XskMode;
use vnet_driver::{Config, TxCompletion};

use crate::baseline::{raw_read_loop, raw_write_loop, BareSyscall, BaselineResult};
use crate::env::Sink;
use crate::injector::{Injector, InjectorStats};
use crate::noise::{cpu_pct, loadavg1};
pub use crate::point::{BackendKind, DevKnobs, HostPath, Measured, Point, RingLayout};
use crate::report::Row;
use crate::rig::{Rig, RigConfig};
use crate::transport::TransportKind;
use crate::vm::VmEnv;
use crate::workloads::{self, peer_loop, Pace, Workload};

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

/// The layouts the ring-layout preset compares.
const RING_LAYOUTS: [RingLayout; 3] = [
    RingLayout::SPLIT,
    RingLayout::PACKED,
    RingLayout::PACKED_IN_ORDER,
];

/// Each ring layout × each tx completion mode (lazy only with `--quick`), on the workload of
/// the backend: receive from a source, forwarding through a loop, transmit elsewhere.
fn ring_layout_points(opts: &Options) -> Vec<Point> {
    let modes = if opts.quick {
        &COMPLETIONS[2..]
    } else {
        &COMPLETIONS[..]
    };
    let workload = match opts.backend {
        BackendKind::Source => Workload::Rx,
        BackendKind::Loop => Workload::Fwd,
        _ => Workload::XskTx(XskMode::ZeroCopy),
    };
    let mut v = Vec::new();
    for &(mode, name) in modes {
        for ring in RING_LAYOUTS {
            let point = Point {
                axes: vec![("ring", ring.name().into()), ("tx_completion", name.into())],
                config: Config {
                    tx_completion: mode,
                    ..Config::default()
                },
                dev: DevKnobs::default(),
                workload,
                pace: None,
                frame_size: opts.frame_size.unwrap_or(64),
            };
            v.push(point.on_ring(ring));
        }
    }
    v
}

/// Seed 000: N = 1..64, every N over 3..13 (the seed's median range), zero-copy transmit.
fn seed_kick_threshold_points(opts: &Options) -> Vec<Point> {
    let ns: &[u16] = if opts.quick {
        &[1, 8]
    } else {
        &[
            1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 24, 32, 48, 64,
        ]
    };
    ns.iter()
        .map(|&n| {
            let axes = vec![("kick_threshold", n.to_string())];
            zc_tx_point(opts, axes, n, DevKnobs::default(), None)
        })
        .collect()
}

/// Seed 002: the tx completion modes on forwarding.
fn fwd_completion_points(opts: &Options) -> Vec<Point> {
    let modes = if opts.quick {
        &COMPLETIONS[..2]
    } else {
        &COMPLETIONS[..]
    };
    modes
        .iter()
        .map(|&(mode, name)| Point {
            axes: vec![("tx_completion", name.into())],
            config: Config {
                tx_completion: mode,
                ..Config::default()
            },
            dev: DevKnobs::default(),
            workload: Workload::Fwd,
            pace: None,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

/// Request/response with W = 1, 4, 16, 64 frames in flight (1 and 16 with `--quick`).
fn pingpong_points(opts: &Options) -> Vec<Point> {
    let windows: &[u32] = if opts.quick {
        &[1, 16]
    } else {
        &[1, 4, 16, 64]
    };
    windows
        .iter()
        .map(|&w| Point {
            axes: vec![("window", w.to_string())],
            config: Config::default(),
            dev: DevKnobs::default(),
            workload: Workload::PingPong(w),
            pace: None,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

/// Frames in flight during the `mixed` preset's floods.
pub const MIXED_WINDOW: u32 = 64;
/// How long each of the `mixed` preset's phases lasts.
pub const MIXED_PHASE: Duration = Duration::from_millis(10);

/// Floods of [`MIXED_WINDOW`] alternating with trickles, phases of [`MIXED_PHASE`], with the
/// device's coalescing max_packets 0, 8, 32, 128 (0 and 32 with `--quick`): coalescing that
/// helps the floods' rate costs the trickles' latency.
fn mixed_points(opts: &Options) -> Vec<Point> {
    coalesce_points(
        opts,
        Workload::Mixed {
            window: MIXED_WINDOW,
            phase: MIXED_PHASE,
        },
    )
}

/// The adaptive preset's workloads on `backend`.
fn adaptive_workloads(backend: BackendKind) -> Vec<Workload> {
    match backend {
        BackendKind::Loop => vec![
            Workload::Fwd,
            Workload::PingPong(1),
            Workload::Mixed {
                window: MIXED_WINDOW,
                phase: MIXED_PHASE,
            },
        ],
        _ => vec![Workload::XskTx(XskMode::ZeroCopy)],
    }
}

/// A point of the adaptive preset's fixed grid: the device's busy-poll window (µs), its
/// interrupt coalescing (32 µs / 64 frames) on, the driver's kick threshold, and the device's
/// kick coalescing.
type GridPoint = (u32, bool, u16, KickCoalescing);

/// The kick coalescing the adaptive preset's grid sweeps with `--no-polling`: off, and what
/// the device's adapter chooses between (192 buffers without a kick, 50 and 20 µs looks).
const NO_POLLING_KICK_COALESCING: [KickCoalescing; 3] = [
    KickCoalescing {
        max_packets: 0,
        max_usecs: 0,
    },
    KickCoalescing {
        max_packets: adapt::KICK_AHEAD,
        max_usecs: adapt::KICK_LOOK_US,
    },
    KickCoalescing {
        max_packets: adapt::KICK_AHEAD,
        max_usecs: adapt::SHORT_LOOK_US,
    },
];

/// The adaptive preset's fixed grid. A device that may not poll (`no_polling`) sweeps kick
/// coalescing instead of the busy-poll window.
fn adaptive_grid(quick: bool, no_polling: bool) -> Vec<GridPoint> {
    let (polls, coalescing, kicks): (&[u32], &[bool], &[u16]) = if quick {
        (&[0, 64], &[false], &[1, 32])
    } else {
        (&[0, 16, 64], &[false, true], &[1, 8, 32])
    };
    let (polls, kick_coalescing): (&[u32], &[KickCoalescing]) = if no_polling {
        (&[0], &NO_POLLING_KICK_COALESCING)
    } else {
        (polls, &NO_POLLING_KICK_COALESCING[..1])
    };
    let mut grid = Vec::new();
    for &b in polls {
        for &c in coalescing {
            for &k in kicks {
                for &kc in kick_coalescing {
                    grid.push((b, c, k, kc));
                }
            }
        }
    }
    grid
}

/// A grid point's label: `bp64-coal32-kt8`, `bp0-kt32-kc192/20`.
fn grid_label((b, c, k, kc): GridPoint) -> String {
    let coal = if c { "-coal32" } else { "" };
    let kicks = if kc.is_enabled() {
        format!("-kc{}/{}", kc.max_packets, kc.max_usecs)
    } else {
        String::new()
    };
    format!("bp{b}{coal}-kt{k}{kicks}")
}

/// Per workload: the defaults, each fixed grid point and both sides adaptive.
fn adaptive_points(opts: &Options) -> Vec<Point> {
    let defaults = (
        0,
        false,
        Config::default().kick_threshold,
        KickCoalescing::default(),
    );
    let mut settings: Vec<(String, DevKnobs, Config)> = Vec::new();
    let mut grid = adaptive_grid(opts.quick, opts.no_polling);
    if !grid.contains(&defaults) {
        grid.insert(0, defaults);
    }
    for point @ (b, c, k, kc) in grid {
        let label = if point == defaults {
            crate::report::DEFAULT_SETTING.to_owned()
        } else {
            grid_label(point)
        };
        let dev = DevKnobs {
            busy_poll_us: b,
            coalesce_packets: if c { 64 } else { 0 },
            coalesce_usecs: if c { 32 } else { 0 },
            kick_coalescing: kc,
            ..DevKnobs::default()
        };
        let config = Config {
            kick_threshold: k,
            ..Config::default()
        };
        settings.push((label, dev, config));
    }
    // Each side alone, then both.
    for (label, dev, drv) in [
        ("adaptive-device", true, false),
        ("adaptive-driver", false, true),
        (crate::report::ADAPTIVE_SETTING, true, true),
    ] {
        let dev = DevKnobs {
            adaptive: dev,
            ..DevKnobs::default()
        };
        let config = Config {
            adaptive: drv,
            ..Config::default()
        };
        settings.push((label.to_owned(), dev, config));
    }
    let mut v = Vec::new();
    for workload in adaptive_workloads(opts.backend) {
        for (label, dev, config) in &settings {
            v.push(Point {
                axes: vec![
                    ("workload", workload_name(workload).into()),
                    ("setting", label.clone()),
                ],
                config: *config,
                dev: *dev,
                workload,
                pace: None,
                frame_size: opts.frame_size.unwrap_or(64),
            });
        }
    }
    v
}

/// Receive from a source with the device's coalescing max_packets (max_usecs 100).
fn rx_coalesce_points(opts: &Options) -> Vec<Point> {
    coalesce_points(opts, Workload::Rx)
}

/// Receive with the device's busy-poll window 0, 10, 50, 200 µs (0 and 50 with `--quick`).
fn rx_busy_poll_points(opts: &Options) -> Vec<Point> {
    busy_poll_windows(opts)
        .iter()
        .map(|&b| Point {
            axes: vec![("busy_poll_us", b.to_string())],
            config: Config::default(),
            dev: DevKnobs {
                busy_poll_us: b,
                ..DevKnobs::default()
            },
            workload: Workload::Rx,
            pace: None,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

/// `workload` with the device's coalescing max_packets 0, 8, 32, 128 (max_usecs 100; 0 and
/// 32 with `--quick`).
fn coalesce_points(opts: &Options, workload: Workload) -> Vec<Point> {
    let packets: &[u16] = if opts.quick {
        &[0, 32]
    } else {
        &[0, 8, 32, 128]
    };
    packets
        .iter()
        .map(|&p| Point {
            axes: vec![("coalesce_packets", p.to_string())],
            config: Config::default(),
            dev: coalescing(p),
            workload,
            pace: None,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

/// Zero-copy transmit with the kick threshold `n` and clean-from-rx completion.
fn zc_tx_point(
    opts: &Options,
    axes: Vec<(&'static str, String)>,
    n: u16,
    dev: DevKnobs,
    pace: Option<Pace>,
) -> Point {
    Point {
        pace,
        axes,
        config: Config {
            kick_threshold: n,
            tx_completion: TxCompletion::CleanFromRx,
            ..Config::default()
        },
        dev,
        workload: Workload::XskTx(XskMode::ZeroCopy),
        frame_size: opts.frame_size.unwrap_or(64),
    }
}

/// Kick threshold N on zero-copy AF_XDP transmit (the seed's shape: N≈8 best).
fn kick_threshold_points(opts: &Options) -> Vec<Point> {
    let ns: &[u16] = if opts.quick {
        &[1, 8, 64]
    } else {
        &[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    };
    ns.iter()
        .map(|&n| {
            let axes = vec![("kick_threshold", n.to_string())];
            zc_tx_point(opts, axes, n, DevKnobs::default(), None)
        })
        .collect()
}

/// The busy-poll presets' transmit: bursts of 8 frames, 20 µs apart, so that the device
/// drains each burst and goes idle for a pause shorter than the longer polls.
const BUSY_POLL_PACE: Pace = Pace {
    burst: 8,
    pause_us: 20,
};

/// The busy-poll windows the 1-D busy-poll presets sweep: 0, 10, 50, 200 µs (0 and 50 with
/// `--quick`).
fn busy_poll_windows(opts: &Options) -> &'static [u32] {
    if opts.quick {
        &[0, 50]
    } else {
        &[0, 10, 50, 200]
    }
}

/// The device busy-poll window on paced zero-copy transmit (kick threshold 8).
fn busy_poll_points(opts: &Options) -> Vec<Point> {
    busy_poll_windows(opts)
        .iter()
        .map(|&b| {
            let dev = DevKnobs {
                busy_poll_us: b,
                ..DevKnobs::default()
            };
            let axes = vec![("busy_poll_us", b.to_string())];
            zc_tx_point(opts, axes, 8, dev, Some(BUSY_POLL_PACE))
        })
        .collect()
}

/// The busy-poll-sleep preset's transmit: bursts of 64 frames, 50 µs apart (a guest that
/// pauses longer than a kick-less device stays awake only with a window).
const SLEEP_PACE: Pace = Pace {
    burst: 64,
    pause_us: 50,
};

/// No busy-poll, then a 200 µs window spinning and sleeping 10 / 20 / 50 µs between looks (0,
/// spinning and 20 µs with `--quick`), on zero-copy transmit paced by [`SLEEP_PACE`].
fn busy_poll_sleep_points(opts: &Options) -> Vec<Point> {
    let sleeps: &[u32] = if opts.quick {
        &[0, 20]
    } else {
        &[0, 10, 20, 50]
    };
    let window = |busy_poll_us, busy_poll_sleep_us| {
        let dev = DevKnobs {
            busy_poll_us,
            busy_poll_sleep_us,
            ..DevKnobs::default()
        };
        let axes = vec![
            ("busy_poll_sleep_us", busy_poll_sleep_us.to_string()),
            ("busy_poll_us", busy_poll_us.to_string()),
        ];
        zc_tx_point(opts, axes, 8, dev, Some(SLEEP_PACE))
    };
    std::iter::once(window(0, 0))
        .chain(sleeps.iter().map(|&s| window(200, s)))
        .collect()
}

/// The device's frames per tx call on unpaced zero-copy transmit: what one call's fixed cost
/// (the notification re-check, the used-index store, the interrupt decision, the loop's
/// epoll round) weighs per frame.
fn tx_budget_points(opts: &Options) -> Vec<Point> {
    let budgets: &[u16] = if opts.quick {
        &[1, 256]
    } else {
        &[1, 4, 16, 64, 256]
    };
    budgets
        .iter()
        .map(|&b| {
            let dev = DevKnobs {
                tx_budget: b,
                ..DevKnobs::default()
            };
            zc_tx_point(opts, vec![("tx_budget", b.to_string())], 8, dev, None)
        })
        .collect()
}

/// Sparse rx reads off and on, bidirectional with lazy completion (in the VM: the echo
/// workload): whether skipping the read that finds the backend empty pays when frames come one
/// per wake-up or a few, against an extra poll round per frame when they come in bursts.
fn rx_sparse_reads_points(opts: &Options) -> Vec<Point> {
    [false, true]
        .into_iter()
        .map(|on| Point {
            axes: vec![("rx_sparse_reads", on_off(on).into())],
            config: Config {
                tx_completion: TxCompletion::Lazy,
                ..Config::default()
            },
            dev: DevKnobs {
                rx_sparse_reads: on,
                ..DevKnobs::default()
            },
            workload: Workload::Bidirectional,
            pace: None,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Kick threshold × busy-poll on paced zero-copy transmit.
fn kick_busy_poll_points(opts: &Options) -> Vec<Point> {
    let (ns, us): (&[u16], &[u32]) = if opts.quick {
        (&[1, 8], &[0, 50])
    } else {
        (&[1, 2, 4, 8, 16, 64], &[0, 10, 50, 200])
    };
    let mut v = Vec::new();
    for &b in us {
        for &n in ns {
            let dev = DevKnobs {
                busy_poll_us: b,
                ..DevKnobs::default()
            };
            let axes = vec![
                ("kick_threshold", n.to_string()),
                ("busy_poll_us", b.to_string()),
            ];
            v.push(zc_tx_point(opts, axes, n, dev, Some(BUSY_POLL_PACE)));
        }
    }
    v
}

/// Kick coalescing's look, µs: a few kicks' worth on a nested host (30-40 µs an exit).
const KICK_LOOK_US: u32 = 50;

/// Kick threshold × the device's kick coalescing on unpaced zero-copy transmit.
fn kick_coalesce_points(opts: &Options) -> Vec<Point> {
    let (ns, ks): (&[u16], &[u16]) = if opts.quick {
        (&[8, 64], &[0, 192])
    } else {
        (&[1, 8, 64], &[0, 64, 192])
    };
    let mut v = Vec::new();
    for &k in ks {
        for &n in ns {
            let dev = DevKnobs {
                kick_coalescing: KickCoalescing {
                    max_packets: k,
                    max_usecs: if k == 0 { 0 } else { KICK_LOOK_US },
                },
                ..DevKnobs::default()
            };
            let axes = vec![
                ("kick_threshold", n.to_string()),
                ("kick_coalesce_packets", k.to_string()),
            ];
            v.push(zc_tx_point(opts, axes, n, dev, None));
        }
    }
    v
}

const COMPLETIONS: [(TxCompletion, &str); 3] = [
    (TxCompletion::TxInterrupt, "tx-interrupt"),
    (TxCompletion::CleanFromRx, "clean-from-rx"),
    (TxCompletion::Lazy, "lazy"),
];

/// Coalescing bounds for `max_packets` (0: coalescing off; otherwise with max_usecs 100).
fn coalescing(max_packets: u16) -> DevKnobs {
    DevKnobs {
        coalesce_packets: max_packets,
        coalesce_usecs: if max_packets == 0 { 0 } else { 100 },
        ..DevKnobs::default()
    }
}

/// Each tx completion mode, with EVENT_IDX and with the flags, on traffic both ways.
fn tx_completion_points(opts: &Options) -> Vec<Point> {
    let suppressions: &[(bool, &str)] = if opts.quick {
        &[(true, "eventidx")]
    } else {
        &[(true, "eventidx"), (false, "flags")]
    };
    let mut v = Vec::new();
    for (mode, mode_name) in COMPLETIONS {
        for &(event_idx, suppression) in suppressions {
            v.push(Point {
                axes: vec![("tx_completion", format!("{mode_name}/{suppression}"))],
                config: Config {
                    tx_completion: mode,
                    event_idx,
                    ..Config::default()
                },
                dev: DevKnobs::default(),
                workload: Workload::Bidirectional,
                pace: None,
                frame_size: opts.frame_size.unwrap_or(64),
            });
        }
    }
    v
}

/// Tx completion × coalescing max_packets (max_usecs 100), bidirectional.
fn completion_coalesce_points(opts: &Options) -> Vec<Point> {
    let (modes, packets): (&[(TxCompletion, &str)], &[u16]) = if opts.quick {
        (&COMPLETIONS[..2], &[0, 32])
    } else {
        (&COMPLETIONS, &[0, 8, 32, 128])
    };
    let mut v = Vec::new();
    for &p in packets {
        for &(mode, name) in modes {
            v.push(Point {
                axes: vec![
                    ("tx_completion", name.into()),
                    ("coalesce_packets", p.to_string()),
                ],
                config: Config {
                    tx_completion: mode,
                    ..Config::default()
                },
                dev: coalescing(p),
                workload: Workload::Bidirectional,
                pace: None,
                frame_size: opts.frame_size.unwrap_or(64),
            });
        }
    }
    v
}

fn bounce_point(opts: &Options, axes: Vec<(&'static str, String)>, b: u16, dev: DevKnobs) -> Point {
    Point {
        axes,
        config: Config {
            xdp_bulk: b,
            tx_completion: TxCompletion::CleanFromRx,
            ..Config::default()
        },
        dev,
        workload: Workload::XdpBounce,
        pace: None,
        frame_size: opts.frame_size.unwrap_or(64),
    }
}

/// XDP_TX bulk queue size on the bounce workload.
fn xdp_bulk_points(opts: &Options) -> Vec<Point> {
    let bs: &[u16] = if opts.quick {
        &[1, 16]
    } else {
        &[1, 2, 4, 8, 16]
    };
    bs.iter()
        .map(|&b| {
            bounce_point(
                opts,
                vec![("xdp_bulk", b.to_string())],
                b,
                DevKnobs::default(),
            )
        })
        .collect()
}

/// XDP_TX bulk × coalescing max_packets (max_usecs 100) on the bounce workload.
fn bulk_coalesce_points(opts: &Options) -> Vec<Point> {
    let (bs, packets): (&[u16], &[u16]) = if opts.quick {
        (&[1, 16], &[0, 32])
    } else {
        (&[1, 4, 16], &[0, 8, 32, 128])
    };
    let mut v = Vec::new();
    for &p in packets {
        for &b in bs {
            let axes = vec![
                ("xdp_bulk", b.to_string()),
                ("coalesce_packets", p.to_string()),
            ];
            v.push(bounce_point(opts, axes, b, coalescing(p)));
        }
    }
    v
}

/// AF_XDP transmit, zero-copy against copy, at a few frame sizes.
fn xsk_points(opts: &Options) -> Vec<Point> {
    let sizes: Vec<usize> = match opts.frame_size {
        Some(s) => vec![s],
        None if opts.quick => vec![64],
        None => vec![64, 512, 1456],
    };
    let mut v = Vec::new();
    for s in sizes {
        for (mode, name) in [(XskMode::ZeroCopy, "zero-copy"), (XskMode::Copy, "copy")] {
            v.push(Point {
                axes: vec![("xsk_mode", name.into())],
                config: Config {
                    tx_completion: TxCompletion::CleanFromRx,
                    ..Config::default()
                },
                dev: DevKnobs::default(),
                workload: Workload::XskTx(mode),
                pace: None,
                frame_size: s,
            });
        }
    }
    v
}

/// The device's backend for one trial and what keeps its peer side going.
enum Trial {
    Pair(PairBackend),
    Tap(devices::backend::Tap),
    Sink(SinkBackend),
    Source(SourceBackend),
    Loop(LoopBackend),
}

/// Everything that must live for the trial's duration on the peer side.
struct PeerSide {
    /// The host injector feeding the tap (receive workloads on a tap).
    injector: Option<Injector>,
    /// Dropped before the namespace: the XDP program on its tap.
    _xdp: Option<crate::xdp::XdpAttachment>,
    _ns: Option<NetNs>,
    _sink: Option<Sink>,
    /// Keeps the peer end open while the peer thread or sink uses its raw fd.
    _peer_fd: Option<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<(u64, u64)>>,
}

impl PeerSide {
    /// No peer: the backend makes or takes the frames itself.
    fn alone(stop: Arc<AtomicBool>) -> PeerSide {
        PeerSide {
            injector: None,
            _xdp: None,
            _ns: None,
            _sink: None,
            _peer_fd: None,
            stop,
            thread: None,
        }
    }

    /// Stops sending (and joins the peer thread); the injector's figures, if one ran.
    fn stop(&mut self) -> Option<InjectorStats> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.injector.take().map(Injector::stop)
    }
}

impl Drop for PeerSide {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: dup creates a new descriptor for an open one; we own the result.
    let n = unsafe { libc::dup(fd) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: n is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Who sends frames to the device's backend (pair and tap only; the measurement backends
/// make their own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peers {
    /// Nobody: transmit only.
    None,
    /// A peer thread that sends (at most `window` in flight) and drains what comes back.
    Echo,
    /// The batched host injector (a tap; the pair's peer floods).
    Injector,
}

/// Builds a backend and its peer. `peers`: who sends frames to the device; `window`: the
/// echo peer keeps at most this many in flight (else it floods).
fn make_trial(
    kind: BackendKind,
    host_path: HostPath,
    frame_size: usize,
    peers: Peers,
    window: Option<u64>,
) -> io::Result<(Trial, PeerSide)> {
    let stop = Arc::new(AtomicBool::new(false));
    let alone = |trial| Ok((trial, PeerSide::alone(stop.clone())));
    match kind {
        BackendKind::Sink => alone(Trial::Sink(SinkBackend::new()?)),
        BackendKind::Source => alone(Trial::Source(SourceBackend::new(
            crate::frames::DST_MAC,
            frame_size.max(devices::backend::SOURCE_HEADER_LEN),
        )?)),
        BackendKind::Loop => alone(Trial::Loop(LoopBackend::new()?)),
        BackendKind::Pair => pair_trial(frame_size, peers, window, stop),
        BackendKind::Tap => tap_trial(host_path, frame_size, peers, window, stop),
    }
}

/// A socket pair: its peer end fed by the peer thread, or drained by a sink.
fn pair_trial(
    frame_size: usize,
    peers: Peers,
    window: Option<u64>,
    stop: Arc<AtomicBool>,
) -> io::Result<(Trial, PeerSide)> {
    let (backend, peer) = PairBackend::new()?;
    let peer_fd = dup(peer.as_raw_fd())?;
    drop(peer);
    let (sink, thread) = if peers != Peers::None {
        let (fd, s) = (peer_fd.as_raw_fd(), stop.clone());
        let t = thread::Builder::new()
            .name("cotune-peer".into())
            .spawn(move || peer_loop(fd, frame_size, true, window, &s))?;
        (None, Some(t))
    } else {
        (Some(Sink::start(peer_fd.as_raw_fd())), None)
    };
    Ok((
        Trial::Pair(backend),
        PeerSide {
            injector: None,
            _xdp: None,
            _ns: None,
            _sink: sink,
            _peer_fd: Some(peer_fd),
            stop,
            thread,
        },
    ))
}

/// A tap in a namespace of its own, with the host path's XDP program and the injector or
/// the echo peer.
fn tap_trial(
    host_path: HostPath,
    frame_size: usize,
    peers: Peers,
    window: Option<u64>,
    stop: Arc<AtomicBool>,
) -> io::Result<(Trial, PeerSide)> {
    let ns = crate::env::trial_netns()?;
    let tap = ns.tap("ctap0")?;
    let xdp = host_path.attach(&ns, "ctap0")?;
    // Receive-only trials: the batched injector, not the echo peer.
    let injector = if peers == Peers::Injector {
        let sock = ns.run(|| PacketSocket::open("ctap0", crate::frames::ETHERTYPE))??;
        Some(Injector::start(sock, crate::frames::DST_MAC, frame_size)?)
    } else {
        None
    };
    // Transmit-only trials have no peer socket: a packet socket on the tap would clone
    // every frame the device (or the raw loop) writes, inflating both.
    let (sock, thread) = if peers == Peers::Echo {
        let sock = ns.run(|| crate::env::packet_socket("ctap0"))??;
        let (fd, s) = (sock.as_raw_fd(), stop.clone());
        let t = thread::Builder::new()
            .name("cotune-peer".into())
            .spawn(move || peer_loop(fd, frame_size, false, window, &s))?;
        (Some(sock), Some(t))
    } else {
        (None, None)
    };
    Ok((
        Trial::Tap(tap),
        PeerSide {
            injector,
            _xdp: xdp,
            _ns: Some(ns),
            _sink: None,
            _peer_fd: sock,
            stop,
            thread,
        },
    ))
}

/// Pins the calling (driver) thread, until the guard drops, and the device worker threads
/// (`net-…`) to two CPUs.
fn pin_sim_threads((driver, device): (usize, usize)) -> io::Result<crate::noise::PinGuard> {
    let guard = crate::noise::PinGuard::pin(driver)?;
    for tid in crate::cost::threads_named("net-") {
        crate::noise::pin_thread(tid, device)?;
    }
    Ok(guard)
}

/// Runs one co-simulation trial of `point` and checks the driver and device counters agree.
fn sim_trial(point: &Point, opts: &Options) -> io::Result<Measured> {
    let peers = match point.workload {
        // With xdp-reflect the tap itself returns what the device writes: no peer.
        _ if opts.host_path == HostPath::XdpReflect => Peers::None,
        Workload::Bidirectional | Workload::XdpBounce | Workload::Echo => Peers::Echo,
        Workload::Rx => Peers::Injector,
        Workload::XskTx(_) | Workload::Fwd | Workload::PingPong(_) | Workload::Mixed { .. } => {
            Peers::None
        }
    };
    let window = (point.workload == Workload::Echo).then_some(workloads::ECHO_WINDOW);
    let (backend, mut peer) = make_trial(
        opts.backend,
        opts.host_path,
        point.frame_size,
        peers,
        window,
    )?;
    let rig_config = RigConfig {
        driver: point.config,
        device: point.dev.tuning(),
        kick_cost_ns: opts.kick_cost_ns,
        irq_cost_ns: opts.irq_cost_ns,
        transport: opts.transport,
        ring: point.dev.ring,
    };
    let mut rig = match backend {
        Trial::Pair(b) => Rig::new(b, &rig_config),
        Trial::Tap(b) => Rig::new(b, &rig_config),
        Trial::Sink(b) => Rig::new(b, &rig_config),
        Trial::Source(b) => Rig::new(b, &rig_config),
        Trial::Loop(b) => Rig::new(b, &rig_config),
    }
    .map_err(|e| io::Error::other(format!("{e}: {:?}", std::error::Error::source(&e))))?;
    if !point.ring().negotiated_in(rig.net.features()) {
        return Err(io::Error::other(format!(
            "the driver did not negotiate the {} ring (features {:#x})",
            point.ring().name(),
            rig.net.features()
        )));
    }
    let _pinned = opts.pin.map(pin_sim_threads).transpose()?;
    let sample = workloads::run(
        &mut rig,
        point.workload,
        point.frame_size,
        point.pace,
        opts.warmup,
        opts.duration,
    );
    let host = peer.stop();
    rig.quiesce();
    drop(peer);
    rig.consistency().map_err(io::Error::other)?;
    if let Some(l) = &sample.latency {
        l.check()
            .map_err(|e| io::Error::other(format!("{}: {e}", workload_name(point.workload))))?;
    }
    let mut m = Measured::from(sample);
    m.host_pps = host.map_or(0.0, |h| h.pps());
    Ok(m)
}

/// The raw write loop on the same kind of backend; for receive-only presets on a tap (and the
/// measurement backends), a raw read loop of the tap fed by the host injector.
pub fn baseline(
    kind: BackendKind,
    frame_size: usize,
    opts: &Options,
    receive: bool,
) -> io::Result<BaselineResult> {
    let mut runs = Vec::new();
    let kind = kind.baseline_backend();
    let peers = if receive && kind == BackendKind::Tap {
        Peers::Injector
    } else {
        Peers::None
    };
    for _ in 0..opts.repeat {
        let (trial, peer) = make_trial(kind, opts.host_path, frame_size, peers, None)?;
        let r = match trial {
            Trial::Tap(mut b) if peers == Peers::Injector => {
                b.set_vnet_hdr_size(12)?;
                raw_read_loop(b.as_raw_fd(), opts.duration)
            }
            Trial::Pair(mut b) => {
                b.set_vnet_hdr_size(12)?;
                raw_write_loop(b.as_raw_fd(), frame_size, opts.duration, opts.bare)?
            }
            Trial::Tap(mut b) => {
                b.set_vnet_hdr_size(12)?;
                raw_write_loop(b.as_raw_fd(), frame_size, opts.duration, opts.bare)?
            }
            Trial::Sink(_) | Trial::Source(_) | Trial::Loop(_) => {
                unreachable!("the baseline of a measurement backend is the tap's")
            }
        };
        drop(peer);
        runs.push(r);
    }
    runs.sort_by(|a, b| a.pps.total_cmp(&b.pps));
    Ok(runs[runs.len() / 2])
}

/// The median by pps of `runs` (not empty).
fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.pps().total_cmp(&b.pps()));
    runs[runs.len() / 2]
}

fn xsk_mode_name(w: Workload) -> &'static str {
    match w {
        Workload::XskTx(XskMode::ZeroCopy) => "zero-copy",
        Workload::XskTx(XskMode::Copy) => "copy",
        _ => "",
    }
}

fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::XskTx(_) => "xsk-tx",
        Workload::Bidirectional => "bidirectional",
        Workload::XdpBounce => "xdp-bounce",
        Workload::Echo => "echo",
        Workload::Rx => "rx",
        Workload::Fwd => "fwd",
        Workload::PingPong(_) => "pingpong",
        Workload::Mixed { .. } => "mixed",
    }
}

fn completion_name(c: TxCompletion) -> &'static str {
    match c {
        TxCompletion::TxInterrupt => "tx-interrupt",
        TxCompletion::CleanFromRx => "clean-from-rx",
        TxCompletion::Lazy => "lazy",
    }
}

/// A row for `point` with every knob of both sides and, if measured, its metrics.
fn point_row(
    preset: Preset,
    target: &str,
    point: &Point,
    m: Option<&Measured>,
    base_pps: f64,
    load: f64,
    opts: &Options,
) -> Row {
    let nan = f64::NAN;
    let per = |n: u64| m.map_or(nan, |m| n as f64 / m.packets.max(1) as f64);
    let axis = |i: usize| point.axes.get(i).cloned().unwrap_or(("", String::new()));
    let (knob, value) = axis(0);
    let (knob2, value2) = axis(1);
    let pps = m.map_or(nan, Measured::pps);
    let rtt_us = |f: fn(&workloads::Latency) -> u64| {
        m.and_then(|m| m.latency.as_ref())
            .map_or(nan, |l| f(l) as f64 / 1000.0)
    };
    let sim = target == "sim";
    // CPU times, when they were read.
    let cpu = m
        .filter(|m| m.cpu_secs.is_finite())
        .map(|m| (m.driver_cpu_ns, m.device_cpu_ns));
    Row {
        preset: preset.name().into(),
        target: target.into(),
        knob: knob.into(),
        value,
        knob2: knob2.into(),
        value2,
        workload: workload_name(point.workload).into(),
        frame_size: point.frame_size,
        kick_threshold: point.config.kick_threshold,
        tx_completion: completion_name(point.config.tx_completion).into(),
        event_idx: point.config.event_idx,
        xdp_bulk: point.config.xdp_bulk,
        xsk_mode: xsk_mode_name(point.workload).into(),
        burst: point.pace.map_or(0, |p| p.burst),
        pause_us: point.pace.map_or(0, |p| p.pause_us),
        coalesce_packets: point.dev.coalesce_packets,
        coalesce_usecs: point.dev.coalesce_usecs,
        dev_event_idx: point.dev.event_idx,
        tx_budget: point.dev.tx_budget,
        busy_poll_us: point.dev.busy_poll_us,
        busy_poll_sleep_us: point.dev.busy_poll_sleep_us,
        kick_coalesce_packets: point.dev.kick_coalescing.max_packets,
        kick_coalesce_usecs: point.dev.kick_coalescing.max_usecs,
        rx_sparse_reads: point.dev.rx_sparse_reads,
        ring: point.ring().name().into(),
        dev_adaptive: point.dev.adaptive,
        drv_adaptive: point.config.adaptive,
        pps,
        p50_us: rtt_us(|l| l.p50_ns),
        p99_us: rtt_us(|l| l.p99_ns),
        p999_us: rtt_us(|l| l.p999_ns),
        kicks_per_pkt: per(m.map_or(0, |m| m.kicks)),
        irqs_per_pkt: per(m.map_or(0, |m| m.irqs)),
        tx_irqs_per_pkt: per(m.map_or(0, |m| m.tx_irqs)),
        kicks_suppressed_per_pkt: per(m.map_or(0, |m| m.kicks_suppressed)),
        driver_ns_per_pkt: cpu.map_or(nan, |c| per(c.0)),
        device_ns_per_pkt: cpu.map_or(nan, |c| per(c.1)),
        driver_cpu_pct: m.map_or(nan, |m| cpu_pct(m.driver_cpu_ns, m.cpu_secs)),
        device_cpu_pct: m.map_or(nan, |m| cpu_pct(m.device_cpu_ns, m.cpu_secs)),
        busy_poll_found_per_pkt: per(m.map_or(0, |m| m.busy_poll_found)),
        busy_poll_pct: m.map_or(nan, |m| cpu_pct(m.busy_poll_us * 1000, m.secs)),
        ratio_to_baseline: pps / base_pps,
        vm_sim_ratio: nan,
        loadavg1: load,
        backend: backend_label(
            if sim || opts.backend.is_measurement() {
                opts.backend
            } else {
                BackendKind::Tap
            },
            opts.host_path,
        ),
        device: match (&opts.vm, sim) {
            (Some(vm), false) => vm.device.name().into(),
            _ => crate::vm::DevicePlacement::InProcess.name().into(),
        },
        kick_cost_ns: if sim { Some(opts.kick_cost_ns) } else { None },
        irq_cost_ns: if sim { Some(opts.irq_cost_ns) } else { None },
        note: m.map_or_else(String::new, |m| notes(point, m)),
    }
}

/// The note of a point a host injector fed: its rate, flagged when it ran within 1.5 × of the
/// guest's (then the injector, not the guest, may be what bounds the point).
/// A measured row's note: where adaptation left the knobs, and the host injector.
fn notes(point: &Point, m: &Measured) -> String {
    let adapted = m
        .adapted
        .describe(point.dev.adaptive, point.config.adaptive);
    let host = host_note(m);
    match (adapted.is_empty(), host.is_empty()) {
        (true, _) => host,
        (false, true) => adapted,
        (false, false) => format!("{adapted}; {host}"),
    }
}

fn host_note(m: &Measured) -> String {
    if m.host_pps <= 0.0 {
        return String::new();
    }
    let mut note = format!("host injector {:.0} pps", m.host_pps);
    if m.host_pps < 1.5 * m.pps() {
        note += " (within 1.5x of the guest: the injector may bound this point)";
    }
    note
}

/// The backend column: `tap` with its host path when that is not the stack
/// (`tap+xdp-drop`).
fn backend_label(backend: BackendKind, host_path: HostPath) -> String {
    match (backend, host_path) {
        (BackendKind::Tap, HostPath::XdpDrop | HostPath::XdpReflect) => {
            format!("tap+{}", host_path.name())
        }
        (b, _) => b.name().into(),
    }
}

/// A baseline row: the raw write loop of `target`'s backend.
fn baseline_row(
    target: &str,
    backend: BackendKind,
    size: usize,
    b: &BaselineResult,
    opts: &Options,
) -> Row {
    let name = match opts.bare {
        BareSyscall::Write => "raw-write",
        BareSyscall::Writev => "raw-writev",
        BareSyscall::IoUring => "raw-io-uring",
    };
    let point = Point {
        axes: vec![("loop", name.into())],
        config: Config::default(),
        dev: DevKnobs::default(),
        workload: Workload::XskTx(XskMode::Copy),
        pace: None,
        frame_size: size,
    };
    let mut row = point_row(
        Preset::Baseline,
        target,
        &point,
        None,
        b.pps,
        loadavg1(),
        opts,
    );
    row.workload = name.into();
    row.xsk_mode = String::new();
    row.pps = b.pps;
    row.ratio_to_baseline = 1.0;
    row.kicks_per_pkt = 0.0;
    row.irqs_per_pkt = 0.0;
    row.tx_irqs_per_pkt = 0.0;
    row.kicks_suppressed_per_pkt = 0.0;
    row.driver_ns_per_pkt = b.cpu_ns_per_pkt;
    row.device_ns_per_pkt = 0.0;
    row.busy_poll_found_per_pkt = 0.0;
    row.busy_poll_pct = 0.0;
    row.backend = backend_label(backend.baseline_backend(), opts.host_path);
    row.kick_cost_ns = None;
    row.irq_cost_ns = None;
    row
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

/// Point `p`'s VM row: the median of its trials, or a skipped row when the guest cannot run
/// it. `say` tells the progress before each trial.
fn vm_point_row(
    preset: Preset,
    p: &Point,
    env: &crate::vm::VmEnv,
    base: f64,
    load: f64,
    opts: &Options,
    say: &mut dyn FnMut(&str, usize),
) -> io::Result<Row> {
    let mut skipped = crate::vm::unsupported(p, env.backend).map(str::to_owned);
    let mut runs = Vec::new();
    let mut note = String::new();
    for r in 0..opts.repeat {
        if skipped.is_some() {
            break;
        }
        say("vm", r);
        match crate::vm::run_point(env, p, opts.pin)? {
            crate::vm::VmRun::Measured(m, n) => {
                runs.push(*m);
                note = n;
            }
            crate::vm::VmRun::Unsupported(why) => skipped = Some(why),
        }
    }
    if let Some(why) = skipped {
        let mut row = point_row(preset, "vm", p, None, f64::NAN, load, opts);
        row.note = format!("skipped: {why}");
        return Ok(row);
    }
    let m = median(runs);
    let mut row = point_row(preset, "vm", p, Some(&m), base, load, opts);
    row.note = if row.note.is_empty() {
        note
    } else {
        format!("{note}; {}", row.note)
    };
    if row.driver_cpu_pct < 60.0 && row.device_cpu_pct < 60.0 {
        // From the counters: neither side was saturated, so what bounds the rate is outside
        // them (the host peer, for echo).
        row.note += "; vCPU and device worker both <60% busy: bound outside \
                     them (the host peer for echo)";
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(quick: bool) -> Options {
        Options::for_tests(quick)
    }

    #[test]
    fn seed_presets_run_on_their_regime_and_refuse_what_cannot_run() {
        for preset in Preset::SEEDS {
            assert!(
                preset.backend().is_some_and(BackendKind::is_measurement),
                "{preset:?}"
            );
            for quick in [true, false] {
                let pts = points(preset, &opts(quick));
                assert!(!pts.is_empty(), "{preset:?}");
                let backend = preset.backend().unwrap_or(BackendKind::Pair);
                for p in &pts {
                    let w = backend.adapt(HostPath::Stack, p.workload);
                    assert!(backend.refuses(HostPath::Stack, w).is_none(), "{preset:?}");
                }
            }
        }
        let full = points(Preset::SeedKickThreshold, &opts(false));
        let ns: Vec<u16> = full.iter().map(|p| p.config.kick_threshold).collect();
        assert!(
            (3..=13).all(|n| ns.contains(&n)),
            "every N of the seed's median range: {ns:?}"
        );
        // A loop (or a reflecting tap) forwards what a bounce would echo; a sink receives
        // nothing, nor does a tap whose host path drops.
        let stack = HostPath::Stack;
        assert_eq!(
            BackendKind::Loop.adapt(stack, Workload::XdpBounce),
            Workload::Fwd
        );
        let reflect = HostPath::XdpReflect;
        assert_eq!(
            BackendKind::Tap.adapt(reflect, Workload::Echo),
            Workload::Fwd
        );
        assert_eq!(
            BackendKind::Tap.adapt(stack, Workload::Echo),
            Workload::Echo
        );
        assert!(BackendKind::Sink.refuses(stack, Workload::Echo).is_some());
        assert_eq!(BackendKind::Tap.adapt(stack, Workload::Fwd), Workload::Echo);
        assert_eq!(
            BackendKind::Pair.adapt(stack, Workload::Fwd),
            Workload::Echo
        );
        assert_eq!(
            BackendKind::Tap.adapt(reflect, Workload::Fwd),
            Workload::Fwd
        );
        assert!(BackendKind::Tap.refuses(reflect, Workload::Fwd).is_none());
        assert!(BackendKind::Tap
            .refuses(HostPath::XdpDrop, Workload::Rx)
            .is_some());
        assert!(BackendKind::Pair
            .refuses(HostPath::XdpDrop, Workload::Rx)
            .is_some());
        assert!(BackendKind::Sink.refuses(reflect, Workload::Fwd).is_some());
        assert_eq!(BackendKind::Sink.baseline_backend(), BackendKind::Tap);
        assert_eq!(BackendKind::Pair.baseline_backend(), BackendKind::Pair);
        let err = run_preset(
            Preset::XdpBulk,
            &Options {
                backend: BackendKind::Sink,
                ..opts(true)
            },
            &mut |_| {},
        );
        assert!(err.is_err_and(|e| e.to_string().contains("a sink has nothing to receive")));
    }

    #[test]
    fn measurement_backends_run_in_co_simulation() {
        // No root needed: a sink takes zero-copy transmit, a source feeds rx, a loop forwards.
        for (backend, workload) in [
            (BackendKind::Sink, Workload::XskTx(XskMode::ZeroCopy)),
            (BackendKind::Source, Workload::Rx),
            (BackendKind::Loop, Workload::Fwd),
        ] {
            let o = Options {
                backend,
                ..opts(true)
            };
            let mut p = zc_tx_point(&o, vec![], 8, DevKnobs::default(), None);
            p.workload = workload;
            let sample = sim_trial(&p, &o).expect("trial");
            assert!(sample.packets > 1000, "{backend:?}: {sample:?}");
        }
    }

    #[test]
    fn two_dimensional_presets_cover_their_grid_and_set_the_device_knobs() {
        for preset in [
            Preset::KickBusyPoll,
            Preset::CompletionCoalesce,
            Preset::BulkCoalesce,
        ] {
            for quick in [true, false] {
                let pts = points(preset, &opts(quick));
                assert!(pts.iter().all(|p| p.axes.len() == 2), "{preset:?}");
                let xs: std::collections::BTreeSet<_> = pts.iter().map(|p| &p.axes[0].1).collect();
                let ys: std::collections::BTreeSet<_> = pts.iter().map(|p| &p.axes[1].1).collect();
                assert_eq!(pts.len(), xs.len() * ys.len(), "{preset:?} is a full grid");
                if quick {
                    assert_eq!((xs.len(), ys.len()), (2, 2), "{preset:?} --quick is 2x2");
                }
                for p in &pts {
                    assert!(p.dev.tuning().validate().is_ok(), "{preset:?} {p:?}");
                    let y: u32 = p.axes[1].1.parse().unwrap();
                    let dev_y = match p.axes[1].0 {
                        "busy_poll_us" => p.dev.busy_poll_us,
                        "coalesce_packets" => u32::from(p.dev.coalesce_packets),
                        other => panic!("unexpected axis {other}"),
                    };
                    assert_eq!(y, dev_y, "the second axis is the device knob");
                }
            }
        }
    }

    #[test]
    fn kick_coalesce_option_sets_every_point_of_a_preset_that_does_not_sweep_it() {
        let k = crate::point::parse_kick_coalesce("192/50").expect("valid");
        assert_eq!((k.max_packets, k.max_usecs), (192, 50));
        for bad in [
            "192",
            "0/50",
            "192/0",
            "192/10001",
            "65536/50",
            "a/b",
            "192/50/1",
        ] {
            assert!(crate::point::parse_kick_coalesce(bad).is_err(), "{bad}");
        }
        let o = Options {
            kick_coalescing: Some(k),
            ..opts(true)
        };
        let pts = preset_points(Preset::SeedKickThreshold, &o).expect("points");
        assert!(pts.iter().all(|p| p.dev.kick_coalescing == k));
        assert!(pts.iter().all(|p| p
            .dev
            .net_spec_keys()
            .contains(",kick_coalesce_packets=192,")));
        let err = preset_points(Preset::KickCoalesce, &o).expect_err("it sweeps the knob");
        assert!(err.to_string().contains("--kick-coalesce"), "{err}");
    }

    #[test]
    fn busy_poll_sleep_option_sets_every_point_of_a_preset_that_does_not_sweep_it() {
        let own = preset_points(Preset::BusyPoll, &opts(true)).expect("points");
        assert!(own.iter().all(|p| p.dev.busy_poll_sleep_us == 0));
        let o = Options {
            busy_poll_sleep_us: Some(20),
            ..opts(true)
        };
        let pts = preset_points(Preset::BusyPoll, &o).expect("points");
        assert_eq!(pts.len(), own.len());
        assert!(pts.iter().all(|p| p.dev.busy_poll_sleep_us == 20));
        assert!(pts.iter().all(|p| p.dev.tuning().validate().is_ok()));
        let err = preset_points(Preset::BusyPollSleep, &o).expect_err("it sweeps the sleep");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("--busy-poll-sleep-us"), "{err}");
    }

    #[test]
    fn kick_coalesce_crosses_the_kick_threshold_with_the_device_kick_coalescing() {
        for (quick, n, k) in [(true, 2, 2), (false, 3, 3)] {
            let pts = points(Preset::KickCoalesce, &opts(quick));
            assert_eq!(pts.len(), n * k);
            for p in &pts {
                assert!(p.dev.tuning().validate().is_ok(), "{p:?}");
                assert_eq!(p.dev.busy_poll_us, 0, "kicks, not a busy-poll");
                assert!(p.pace.is_none());
                assert_eq!(p.axes[0].1, p.config.kick_threshold.to_string());
                let k = p.dev.kick_coalescing;
                assert_eq!(p.axes[1].1, k.max_packets.to_string());
                assert_eq!(k.max_usecs > 0, k.max_packets > 0);
            }
            assert!(pts.iter().any(|p| p.dev.kick_coalescing.max_packets == 0));
            assert!(pts.iter().any(|p| p.dev.kick_coalescing.max_packets == 192));
        }
    }

    #[test]
    fn busy_poll_sleep_runs_no_poll_then_one_window_spinning_and_sleeping() {
        for (quick, sleeps) in [(true, vec![0, 20]), (false, vec![0, 10, 20, 50])] {
            let pts = points(Preset::BusyPollSleep, &opts(quick));
            let knobs: Vec<(u32, u32)> = pts
                .iter()
                .map(|p| (p.dev.busy_poll_us, p.dev.busy_poll_sleep_us))
                .collect();
            let want: Vec<(u32, u32)> = std::iter::once((0, 0))
                .chain(sleeps.into_iter().map(|s| (200, s)))
                .collect();
            assert_eq!(knobs, want);
            for p in &pts {
                assert!(p.dev.tuning().validate().is_ok(), "{p:?}");
                // The axes are the knobs, the sleep first.
                assert_eq!(p.axes[0].1, p.dev.busy_poll_sleep_us.to_string());
                assert_eq!(p.axes[1].1, p.dev.busy_poll_us.to_string());
            }
        }
    }

    #[test]
    fn busy_poll_presets_pace_the_driver_with_pauses_shorter_than_the_longest_poll() {
        for preset in [
            Preset::BusyPoll,
            Preset::KickBusyPoll,
            Preset::BusyPollSleep,
        ] {
            let pts = points(preset, &opts(false));
            let longest = pts.iter().map(|p| p.dev.busy_poll_us).max().unwrap();
            assert!(
                pts.iter().any(|p| p.dev.busy_poll_us == 0),
                "{preset:?} has an off point"
            );
            for p in &pts {
                let pace = p.pace.expect("paced");
                assert!(pace.pause_us > 0 && pace.pause_us < longest, "{preset:?}");
            }
        }
        assert!(points(Preset::KickThreshold, &opts(false))
            .iter()
            .all(|p| p.pace.is_none()));
    }

    #[test]
    fn net_spec_names_only_the_knobs_that_differ() {
        assert_eq!(DevKnobs::default().net_spec_keys(), "");
        let k = DevKnobs {
            coalesce_packets: 32,
            coalesce_usecs: 100,
            event_idx: false,
            tx_budget: 64,
            busy_poll_us: 50,
            busy_poll_sleep_us: 10,
            kick_coalescing: KickCoalescing {
                max_packets: 128,
                max_usecs: 50,
            },
            rx_sparse_reads: false,
            ring: RingLayout::PACKED_IN_ORDER,
            adaptive: true,
            adaptive_max_busy_poll_us: 0,
        };
        assert_eq!(
            k.net_spec_keys(),
            ",coalesce_packets=32,coalesce_usecs=100,event_idx=off,tx_budget=64,busy_poll_us=50,\
             busy_poll_sleep_us=10,kick_coalesce_packets=128,kick_coalesce_usecs=50,\
             rx_sparse_reads=off,packed=on,in_order=on,adaptive=on,adaptive_max_busy_poll_us=0"
        );
        // Every key it writes is one the device's --net parser takes, with the same meaning.
        let spec: devices::virtio::net::NetConfig = format!("tap=t0{}", k.net_spec_keys())
            .parse()
            .expect("the device parses what cotune writes");
        assert_eq!(spec.tuning, k.tuning());
        assert!(spec.packed && spec.in_order);
    }

    #[test]
    fn ring_layout_sweeps_both_sides_and_ring_applies_to_other_presets() {
        let pts = points(Preset::RingLayout, &opts(false));
        assert_eq!(pts.len(), RING_LAYOUTS.len() * COMPLETIONS.len());
        for p in &pts {
            let ring = p.ring();
            assert_eq!(
                (p.config.packed, p.config.in_order),
                (ring.packed, ring.in_order)
            );
            assert_eq!(p.axes[0], ("ring", ring.name().to_string()));
        }
        let layouts: std::collections::HashSet<_> = pts.iter().map(|p| p.ring().name()).collect();
        assert_eq!(layouts.len(), 3, "{layouts:?}");
        assert_eq!(points(Preset::RingLayout, &opts(true)).len(), 3);
        // The workload follows the backend's regime.
        let on = |backend| {
            let o = Options {
                backend,
                ..opts(true)
            };
            points(Preset::RingLayout, &o)[0].workload
        };
        assert_eq!(on(BackendKind::Source), Workload::Rx);
        assert_eq!(on(BackendKind::Loop), Workload::Fwd);
        assert!(matches!(on(BackendKind::Sink), Workload::XskTx(_)));
        // --ring packed --in-order puts every other preset's points on that layout.
        let o = Options {
            ring: RingLayout::PACKED_IN_ORDER,
            ..opts(true)
        };
        for p in points(Preset::KickThreshold, &o) {
            assert_eq!(p.ring(), RingLayout::PACKED_IN_ORDER);
            assert!(p.config.packed && p.config.in_order);
        }
    }

    #[test]
    fn mixed_runs_floods_and_trickles_in_co_simulation() {
        let o = Options {
            backend: BackendKind::Loop,
            duration: Duration::from_millis(300),
            ..opts(true)
        };
        let pts = points(Preset::Mixed, &o);
        assert_eq!(pts.len(), 2);
        assert_eq!(Preset::Mixed.backend(), Some(BackendKind::Loop));
        assert!(BackendKind::Sink
            .refuses(HostPath::Stack, pts[0].workload)
            .is_some());
        assert!(BackendKind::Loop
            .refuses(HostPath::Stack, pts[0].workload)
            .is_none());
        // Short phases, so that a 300 ms trial holds many of each.
        let mut p = pts[0].clone();
        p.workload = Workload::Mixed {
            window: 32,
            phase: Duration::from_millis(5),
        };
        let m = sim_trial(&p, &o).expect("trial");
        let l = m.latency.expect("trickle round trips");
        let flood = m.flood_pps.expect("a flood rate");
        // Every packet is a round trip of one phase or the other; the trickle's are timed.
        assert!(l.samples > 10 && l.samples < m.packets, "{m:?}");
        assert!(
            l.min_ns > 0 && l.p50_ns <= l.p99_ns && l.p99_ns <= l.p999_ns,
            "{l:?}"
        );
        assert_eq!((l.bad, l.lost), (0, 0));
        // The CSV's pps is the floods' rate, and 32 frames in flight beat one at a time.
        assert_eq!(m.pps(), flood);
        let trickle_pps = 1e9 / l.p50_ns as f64;
        assert!(
            flood > trickle_pps,
            "flood {flood} pps, trickle {trickle_pps}"
        );
        let row = point_row(Preset::Mixed, "sim", &p, Some(&m), f64::NAN, 0.0, &o);
        assert_eq!((row.workload.as_str(), row.pps), ("mixed", flood));
        assert_eq!(row.p50_us, l.p50_ns as f64 / 1000.0);
    }

    #[test]
    fn tx_completion_applies_to_every_point_of_a_preset_that_does_not_sweep_it() {
        let o = Options {
            backend: BackendKind::Loop,
            tx_completion: Some(TxCompletion::CleanFromRx),
            ..opts(true)
        };
        let pts = preset_points(Preset::Adaptive, &o).expect("the adaptive preset keeps it");
        assert!(!pts.is_empty());
        assert!(pts
            .iter()
            .all(|p| p.config.tx_completion == TxCompletion::CleanFromRx));
        let own = Options {
            tx_completion: None,
            ..o.clone()
        };
        assert!(preset_points(Preset::Adaptive, &own)
            .expect("no override")
            .iter()
            .all(|p| p.config.tx_completion == TxCompletion::TxInterrupt));
        for preset in [Preset::TxCompletion, Preset::SeedTxCompletion] {
            let e = preset_points(preset, &o).expect_err("it sweeps the tx completion");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        }
    }

    /// `--workloads`: the adaptive preset runs only the workloads named, in its own order; a
    /// name it does not run on the backend, or another preset, refuses the option.
    #[test]
    fn workloads_keeps_only_the_adaptive_presets_workloads_named() {
        let o = |names: &[&str]| Options {
            backend: BackendKind::Loop,
            workloads: names.iter().map(|s| s.to_string()).collect(),
            ..opts(true)
        };
        let all = preset_points(Preset::Adaptive, &o(&[])).expect("points");
        let names = |pts: &[Point]| -> Vec<&'static str> {
            let mut v: Vec<_> = pts.iter().map(|p| workload_name(p.workload)).collect();
            v.dedup();
            v
        };
        assert_eq!(names(&all), ["fwd", "pingpong", "mixed"]);
        let some = preset_points(Preset::Adaptive, &o(&["mixed", "fwd"])).expect("points");
        assert_eq!(names(&some), ["fwd", "mixed"]);
        let per_workload = all.len() / 3;
        assert_eq!(some.len(), 2 * per_workload);
        let err = |names: &[&str], preset| {
            preset_points(preset, &o(names))
                .expect_err("refused")
                .to_string()
        };
        let bad = err(&["xsk-tx"], Preset::Adaptive);
        assert!(
            bad.contains("runs fwd, pingpong, mixed, not \"xsk-tx\""),
            "{bad}"
        );
        let other = err(&["fwd"], Preset::Mixed);
        assert!(other.contains("applies to the adaptive preset"), "{other}");
        // On a sink the preset's one workload is zero-copy transmit.
        let sink = Options {
            backend: BackendKind::Sink,
            ..o(&["xsk-tx"])
        };
        let pts = preset_points(Preset::Adaptive, &sink).expect("points");
        assert!(!pts.is_empty() && pts.iter().all(|p| workload_name(p.workload) == "xsk-tx"));
    }

    /// `--no-polling`: the adaptive preset's grid has no busy-poll window and sweeps kick
    /// coalescing instead, its adapting devices may not open a window (said on their `--net`),
    /// `--kick-coalesce` no longer applies to it, and a preset that sets a window refuses it.
    #[test]
    fn no_polling_sweeps_kick_coalescing_in_place_of_the_window() {
        let o = Options {
            backend: BackendKind::Loop,
            no_polling: true,
            ..opts(true)
        };
        let pts = preset_points(Preset::Adaptive, &o).expect("points");
        assert!(pts.iter().all(|p| p.dev.busy_poll_us == 0));
        assert!(pts.iter().all(|p| p.dev.adaptive_max_busy_poll_us == 0));
        let settings = |pts: &[Point]| -> Vec<String> {
            let mixed = pts
                .iter()
                .filter(|p| matches!(p.workload, Workload::Mixed { .. }));
            mixed.map(|p| p.axes[1].1.clone()).collect()
        };
        let with = settings(&pts);
        assert_eq!(
            with,
            [
                "default",
                "bp0-kt1",
                "bp0-kt1-kc192/50",
                "bp0-kt1-kc192/20",
                "bp0-kt32",
                "bp0-kt32-kc192/50",
                "bp0-kt32-kc192/20",
                "adaptive-device",
                "adaptive-driver",
                "adaptive"
            ]
        );
        let adapting = pts
            .iter()
            .find(|p| p.dev.adaptive)
            .expect("an adapting point");
        let spec = adapting.dev.net_spec_keys();
        assert!(
            spec.ends_with(",adaptive=on,adaptive_max_busy_poll_us=0"),
            "{spec}"
        );
        assert_eq!(adapting.dev.tuning().adaptive.max_busy_poll_us, 0);
        let kc = pts
            .iter()
            .find(|p| p.dev.kick_coalescing.is_enabled())
            .expect("kc");
        assert!(kc
            .dev
            .net_spec_keys()
            .contains(",kick_coalesce_packets=192,"));
        // Without the option: the window swept, no kick coalescing, the default bound.
        let own = preset_points(
            Preset::Adaptive,
            &Options {
                no_polling: false,
                ..o.clone()
            },
        )
        .expect("points");
        assert!(own.iter().any(|p| p.dev.busy_poll_us == 64));
        assert!(own.iter().all(|p| !p.dev.kick_coalescing.is_enabled()));
        assert!(own
            .iter()
            .all(|p| !p.dev.net_spec_keys().contains("max_busy_poll")));
        let k = crate::point::parse_kick_coalesce("64/50").expect("valid");
        let both = Options {
            kick_coalescing: Some(k),
            ..o.clone()
        };
        let e = preset_points(Preset::Adaptive, &both).expect_err("it sweeps kick coalescing");
        assert!(e.to_string().contains("--kick-coalesce"), "{e}");
        let e = preset_points(Preset::BusyPoll, &o).expect_err("it sets a window");
        assert!(e.to_string().contains("--no-polling"), "{e}");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn ring_layouts_run_in_co_simulation() {
        for backend in [BackendKind::Sink, BackendKind::Source, BackendKind::Loop] {
            let o = Options {
                backend,
                ..opts(true)
            };
            for p in points(Preset::RingLayout, &o) {
                let m = sim_trial(&p, &o).unwrap_or_else(|e| panic!("{}: {e}", p.label()));
                assert!(
                    m.packets > 0,
                    "{} on {}: no packets",
                    p.label(),
                    backend.name()
                );
            }
        }
    }
}
