//! The presets' points: which knobs of the driver and of the device each sweeps, over which
//! workload.

use std::time::Duration;

use devices::virtio::net::{adapt, KickCoalescing};
use vnet_driver::xsk::XskMode;
use vnet_driver::{Config, TxCompletion};

use crate::workloads::{Pace, Workload};

use super::*;
use crate::point::{BackendKind, DevKnobs, Point, RingLayout};

/// The layouts the ring-layout preset compares.
pub(super) const RING_LAYOUTS: [RingLayout; 3] = [
    RingLayout::SPLIT,
    RingLayout::PACKED,
    RingLayout::PACKED_IN_ORDER,
];

/// Each ring layout × each tx completion mode (lazy only with `--quick`), on the workload of
/// the backend: receive from a source, forwarding through a loop, transmit elsewhere.
pub(super) fn ring_layout_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn seed_kick_threshold_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn fwd_completion_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn pingpong_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn mixed_points(opts: &Options) -> Vec<Point> {
    coalesce_points(
        opts,
        Workload::Mixed {
            window: MIXED_WINDOW,
            phase: MIXED_PHASE,
        },
    )
}

/// The adaptive preset's workloads on `backend`.
pub(super) fn adaptive_workloads(backend: BackendKind) -> Vec<Workload> {
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
pub(super) const NO_POLLING_KICK_COALESCING: [KickCoalescing; 3] = [
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
pub(super) fn adaptive_grid(quick: bool, no_polling: bool) -> Vec<GridPoint> {
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
pub(super) fn grid_label((b, c, k, kc): GridPoint) -> String {
    let coal = if c { "-coal32" } else { "" };
    let kicks = if kc.is_enabled() {
        format!("-kc{}/{}", kc.max_packets, kc.max_usecs)
    } else {
        String::new()
    };
    format!("bp{b}{coal}-kt{k}{kicks}")
}

/// Per workload: the defaults, each fixed grid point and both sides adaptive.
pub(super) fn adaptive_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn rx_coalesce_points(opts: &Options) -> Vec<Point> {
    coalesce_points(opts, Workload::Rx)
}

/// Receive with the device's busy-poll window 0, 10, 50, 200 µs (0 and 50 with `--quick`).
pub(super) fn rx_busy_poll_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn coalesce_points(opts: &Options, workload: Workload) -> Vec<Point> {
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
pub(super) fn zc_tx_point(
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
pub(super) fn kick_threshold_points(opts: &Options) -> Vec<Point> {
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
pub(super) const BUSY_POLL_PACE: Pace = Pace {
    burst: 8,
    pause_us: 20,
};

/// The busy-poll windows the 1-D busy-poll presets sweep: 0, 10, 50, 200 µs (0 and 50 with
/// `--quick`).
pub(super) fn busy_poll_windows(opts: &Options) -> &'static [u32] {
    if opts.quick {
        &[0, 50]
    } else {
        &[0, 10, 50, 200]
    }
}

/// The device busy-poll window on paced zero-copy transmit (kick threshold 8).
pub(super) fn busy_poll_points(opts: &Options) -> Vec<Point> {
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
pub(super) const SLEEP_PACE: Pace = Pace {
    burst: 64,
    pause_us: 50,
};

/// No busy-poll, then a 200 µs window spinning and sleeping 10 / 20 / 50 µs between looks (0,
/// spinning and 20 µs with `--quick`), on zero-copy transmit paced by [`SLEEP_PACE`].
pub(super) fn busy_poll_sleep_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn tx_budget_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn rx_sparse_reads_points(opts: &Options) -> Vec<Point> {
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

pub(super) fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Kick threshold × busy-poll on paced zero-copy transmit.
pub(super) fn kick_busy_poll_points(opts: &Options) -> Vec<Point> {
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
pub(super) const KICK_LOOK_US: u32 = 50;

/// Kick threshold × the device's kick coalescing on unpaced zero-copy transmit.
pub(super) fn kick_coalesce_points(opts: &Options) -> Vec<Point> {
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

pub(super) const COMPLETIONS: [(TxCompletion, &str); 3] = [
    (TxCompletion::TxInterrupt, "tx-interrupt"),
    (TxCompletion::CleanFromRx, "clean-from-rx"),
    (TxCompletion::Lazy, "lazy"),
];

/// Coalescing bounds for `max_packets` (0: coalescing off; otherwise with max_usecs 100).
pub(super) fn coalescing(max_packets: u16) -> DevKnobs {
    DevKnobs {
        coalesce_packets: max_packets,
        coalesce_usecs: if max_packets == 0 { 0 } else { 100 },
        ..DevKnobs::default()
    }
}

/// Each tx completion mode, with EVENT_IDX and with the flags, on traffic both ways.
pub(super) fn tx_completion_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn completion_coalesce_points(opts: &Options) -> Vec<Point> {
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

pub(super) fn bounce_point(
    opts: &Options,
    axes: Vec<(&'static str, String)>,
    b: u16,
    dev: DevKnobs,
) -> Point {
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
pub(super) fn xdp_bulk_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn bulk_coalesce_points(opts: &Options) -> Vec<Point> {
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
pub(super) fn xsk_points(opts: &Options) -> Vec<Point> {
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
