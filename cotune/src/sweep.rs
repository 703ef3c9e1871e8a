//! Presets: which knob each sweeps, over which workload, and how a point is measured (fresh rig
//! per repeat, median by pps).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use devices::backend::{NetBackend, PairBackend};
use devices::test_utils::netns::NetNs;
use vnet_driver::xsk::XskMode;
use vnet_driver::{Config, TxCompletion};

use crate::baseline::{raw_write_loop, BaselineResult};
use crate::env::Sink;
use crate::report::Row;
use crate::rig::{Rig, RigConfig};
use crate::workloads::{self, peer_loop, Sample, Workload};

/// Which backend the device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// socketpair(AF_UNIX, SOCK_SEQPACKET) with a peer thread (no root needed).
    Pair,
    /// A real tap in a network namespace the tool creates (root).
    Tap,
}

impl BackendKind {
    fn name(self) -> &'static str {
        match self {
            BackendKind::Pair => "pair",
            BackendKind::Tap => "tap",
        }
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
    /// The raw backend write loop alone.
    Baseline,
}

impl Preset {
    /// All presets, in report order.
    pub const ALL: [Preset; 5] = [
        Preset::Baseline,
        Preset::KickThreshold,
        Preset::TxCompletion,
        Preset::XdpBulk,
        Preset::XskZc,
    ];

    /// The preset's name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Preset::KickThreshold => "kick-threshold",
            Preset::TxCompletion => "tx-completion",
            Preset::XdpBulk => "xdp-bulk",
            Preset::XskZc => "xsk-zc",
            Preset::Baseline => "baseline",
        }
    }
}

/// How to measure.
#[derive(Clone, Debug)]
pub struct Options {
    /// Measured time per trial.
    pub duration: Duration,
    /// Warm-up per trial.
    pub warmup: Duration,
    /// Trials per point (the median is reported).
    pub repeat: usize,
    /// Frame size override (Ethernet bytes); presets have their own defaults.
    pub frame_size: Option<usize>,
    /// Backend.
    pub backend: BackendKind,
    /// Exit-cost model.
    pub kick_cost_ns: u64,
    /// Exit-cost model.
    pub irq_cost_ns: u64,
    /// Fewer points (CI).
    pub quick: bool,
}

/// A point of a sweep: a label and the driver config and workload it runs.
struct Point {
    knob: &'static str,
    value: String,
    config: Config,
    workload: Workload,
    frame_size: usize,
}

fn points(preset: Preset, opts: &Options) -> Vec<Point> {
    match preset {
        Preset::Baseline => Vec::new(),
        Preset::KickThreshold => kick_threshold_points(opts),
        Preset::TxCompletion => tx_completion_points(opts),
        Preset::XdpBulk => xdp_bulk_points(opts),
        Preset::XskZc => xsk_points(opts),
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
        .map(|&n| Point {
            knob: "kick_threshold",
            value: n.to_string(),
            config: Config {
                kick_threshold: n,
                tx_completion: TxCompletion::CleanFromRx,
                ..Config::default()
            },
            workload: Workload::XskTx(XskMode::ZeroCopy),
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
}

/// Each tx completion mode, with EVENT_IDX and with the flags, on traffic both ways.
fn tx_completion_points(opts: &Options) -> Vec<Point> {
    let modes = [
        (TxCompletion::TxInterrupt, "tx-interrupt"),
        (TxCompletion::CleanFromRx, "clean-from-rx"),
        (TxCompletion::Lazy, "lazy"),
    ];
    let suppressions: &[(bool, &str)] = if opts.quick {
        &[(true, "eventidx")]
    } else {
        &[(true, "eventidx"), (false, "flags")]
    };
    let mut v = Vec::new();
    for (mode, mode_name) in modes {
        for &(event_idx, suppression) in suppressions {
            v.push(Point {
                knob: "tx_completion",
                value: format!("{mode_name}/{suppression}"),
                config: Config {
                    tx_completion: mode,
                    event_idx,
                    ..Config::default()
                },
                workload: Workload::Bidirectional,
                frame_size: opts.frame_size.unwrap_or(64),
            });
        }
    }
    v
}

/// XDP_TX bulk queue size on the bounce workload.
fn xdp_bulk_points(opts: &Options) -> Vec<Point> {
    let bs: &[u16] = if opts.quick {
        &[1, 16]
    } else {
        &[1, 2, 4, 8, 16]
    };
    bs.iter()
        .map(|&b| Point {
            knob: "xdp_bulk",
            value: b.to_string(),
            config: Config {
                xdp_bulk: b,
                tx_completion: TxCompletion::CleanFromRx,
                ..Config::default()
            },
            workload: Workload::XdpBounce,
            frame_size: opts.frame_size.unwrap_or(64),
        })
        .collect()
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
                knob: "xsk_mode",
                value: name.into(),
                config: Config {
                    tx_completion: TxCompletion::CleanFromRx,
                    ..Config::default()
                },
                workload: Workload::XskTx(mode),
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
}

/// Everything that must live for the trial's duration on the peer side.
struct PeerSide {
    _ns: Option<NetNs>,
    _sink: Option<Sink>,
    /// Keeps the peer end open while the peer thread or sink uses its raw fd.
    _peer_fd: Option<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<(u64, u64)>>,
}

impl PeerSide {
    /// Stops sending (and joins the peer thread).
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PeerSide {
    fn drop(&mut self) {
        self.stop();
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

/// Builds a backend and its peer. `receives`: the workload needs frames sent to the device.
fn make_trial(
    kind: BackendKind,
    frame_size: usize,
    receives: bool,
) -> io::Result<(Trial, PeerSide)> {
    let stop = Arc::new(AtomicBool::new(false));
    match kind {
        BackendKind::Pair => {
            let (backend, peer) = PairBackend::new()?;
            let peer_fd = dup(peer.as_raw_fd())?;
            drop(peer);
            let (sink, thread) = if receives {
                let (fd, s) = (peer_fd.as_raw_fd(), stop.clone());
                let t = thread::Builder::new()
                    .name("cotune-peer".into())
                    .spawn(move || peer_loop(fd, frame_size, true, true, &s))?;
                (None, Some(t))
            } else {
                (Some(Sink::start(peer_fd.as_raw_fd())), None)
            };
            Ok((
                Trial::Pair(backend),
                PeerSide {
                    _ns: None,
                    _sink: sink,
                    _peer_fd: Some(peer_fd),
                    stop,
                    thread,
                },
            ))
        }
        BackendKind::Tap => {
            let ns = crate::env::trial_netns()?;
            let tap = ns.tap("ctap0")?;
            // Transmit-only trials have no peer socket: a packet socket on the tap would clone
            // every frame the device (or the raw loop) writes, inflating both.
            let (sock, thread) = if receives {
                let sock = ns.run(|| crate::env::packet_socket("ctap0"))??;
                let (fd, s) = (sock.as_raw_fd(), stop.clone());
                let t = thread::Builder::new()
                    .name("cotune-peer".into())
                    .spawn(move || peer_loop(fd, frame_size, false, true, &s))?;
                (Some(sock), Some(t))
            } else {
                (None, None)
            };
            Ok((
                Trial::Tap(tap),
                PeerSide {
                    _ns: Some(ns),
                    _sink: None,
                    _peer_fd: sock,
                    stop,
                    thread,
                },
            ))
        }
    }
}

/// Runs one trial of `point` and checks the driver and device counters agree.
fn trial(point: &Point, opts: &Options) -> io::Result<Sample> {
    let receives = matches!(
        point.workload,
        Workload::Bidirectional | Workload::XdpBounce
    );
    let (backend, mut peer) = make_trial(opts.backend, point.frame_size, receives)?;
    let rig_config = RigConfig {
        driver: point.config,
        kick_cost_ns: opts.kick_cost_ns,
        irq_cost_ns: opts.irq_cost_ns,
    };
    let mut rig = match backend {
        Trial::Pair(b) => Rig::new(b, &rig_config),
        Trial::Tap(b) => Rig::new(b, &rig_config),
    }
    .map_err(|e| io::Error::other(e.to_string()))?;
    let sample = workloads::run(
        &mut rig,
        point.workload,
        point.frame_size,
        opts.warmup,
        opts.duration,
    );
    peer.stop();
    rig.quiesce();
    drop(peer);
    crate::check::consistency(&mut rig).map_err(io::Error::other)?;
    Ok(sample)
}

/// The raw write loop on the same kind of backend.
pub fn baseline(
    kind: BackendKind,
    frame_size: usize,
    opts: &Options,
) -> io::Result<BaselineResult> {
    let mut runs = Vec::new();
    for _ in 0..opts.repeat {
        let (trial, peer) = make_trial(kind, frame_size, false)?;
        let r = match trial {
            Trial::Pair(mut b) => {
                b.set_vnet_hdr_size(12)?;
                raw_write_loop(b.as_raw_fd(), frame_size, opts.duration)
            }
            Trial::Tap(mut b) => {
                b.set_vnet_hdr_size(12)?;
                raw_write_loop(b.as_raw_fd(), frame_size, opts.duration)
            }
        };
        drop(peer);
        runs.push(r);
    }
    runs.sort_by(|a, b| a.pps.total_cmp(&b.pps));
    Ok(runs[runs.len() / 2])
}

/// Runs `preset`, calling `progress` before each trial. Returns its rows (with a baseline row
/// for each frame size it uses).
pub fn run_preset(
    preset: Preset,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> io::Result<Vec<Row>> {
    let pts = points(preset, opts);
    let mut sizes: Vec<usize> = pts.iter().map(|p| p.frame_size).collect();
    if sizes.is_empty() {
        sizes.push(opts.frame_size.unwrap_or(64));
    }
    sizes.sort_unstable();
    sizes.dedup();
    let mut rows = Vec::new();
    let mut baselines = Vec::new();
    for &s in &sizes {
        progress(&format!(
            "{}: raw {} write loop, {s} B",
            preset.name(),
            opts.backend.name()
        ));
        let b = baseline(opts.backend, s, opts)?;
        baselines.push((s, b));
        if preset == Preset::Baseline {
            rows.push(Row {
                preset: preset.name().into(),
                knob: "loop".into(),
                value: "raw-write".into(),
                frame_size: s,
                pps: b.pps,
                kicks_per_pkt: 0.0,
                irqs_per_pkt: 0.0,
                driver_ns_per_pkt: b.cpu_ns_per_pkt,
                device_ns_per_pkt: 0.0,
                ratio_to_baseline: 1.0,
                tx_irqs_per_pkt: 0.0,
                kicks_suppressed_per_pkt: 0.0,
                backend: opts.backend.name().into(),
                kick_cost_ns: opts.kick_cost_ns,
                irq_cost_ns: opts.irq_cost_ns,
            });
        }
    }
    for (i, p) in pts.iter().enumerate() {
        let mut samples = Vec::new();
        for r in 0..opts.repeat {
            progress(&format!(
                "{} [{}/{}] {}={} {} B, trial {}/{}",
                preset.name(),
                i + 1,
                pts.len(),
                p.knob,
                p.value,
                p.frame_size,
                r + 1,
                opts.repeat
            ));
            samples.push(trial(p, opts)?);
        }
        samples.sort_by(|a, b| a.pps().total_cmp(&b.pps()));
        let m = samples[samples.len() / 2];
        let pk = m.packets.max(1) as f64;
        let base = baselines
            .iter()
            .find(|(s, _)| *s == p.frame_size)
            .map(|(_, b)| b.pps)
            .unwrap_or(f64::NAN);
        rows.push(Row {
            preset: preset.name().into(),
            knob: p.knob.into(),
            value: p.value.clone(),
            frame_size: p.frame_size,
            pps: m.pps(),
            kicks_per_pkt: (m.driver.kicks + m.driver.rx_kicks) as f64 / pk,
            irqs_per_pkt: m.driver.interrupts as f64 / pk,
            driver_ns_per_pkt: m.driver_cpu_ns as f64 / pk,
            device_ns_per_pkt: m.device_cpu_ns as f64 / pk,
            ratio_to_baseline: m.pps() / base,
            tx_irqs_per_pkt: m.dev_tx_irqs as f64 / pk,
            kicks_suppressed_per_pkt: m.driver.kicks_suppressed as f64 / pk,
            backend: opts.backend.name().into(),
            kick_cost_ns: opts.kick_cost_ns,
            irq_cost_ns: opts.irq_cost_ns,
        });
    }
    Ok(rows)
}
