//! Running one point in co-simulation: the rig, its peers (a pair, a tap and its host side),
//! and the bare backend loops a point is compared against.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use devices::backend::{LoopBackend, NetBackend, PairBackend, SinkBackend, SourceBackend};
use devices::test_utils::link::PacketSocket;
use devices::test_utils::netns::NetNs;

use crate::baseline::{raw_read_loop, raw_write_loop, BaselineResult};
use crate::env::Sink;
use crate::injector::{Injector, InjectorStats};
use crate::rig::{Rig, RigConfig};
use crate::workloads::{self, peer_loop, Workload};

use super::*;
use crate::point::{BackendKind, HostPath, Measured, Point};

/// The device's backend for one trial and what keeps its peer side going.
pub(super) enum Trial {
    Pair(PairBackend),
    Tap(devices::backend::Tap),
    Sink(SinkBackend),
    Source(SourceBackend),
    Loop(LoopBackend),
}

/// Everything that must live for the trial's duration on the peer side.
pub(super) struct PeerSide {
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

pub(super) fn dup(fd: RawFd) -> io::Result<OwnedFd> {
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
pub(super) enum Peers {
    /// Nobody: transmit only.
    None,
    /// A peer thread that sends (at most `window` in flight) and drains what comes back.
    Echo,
    /// The batched host injector (a tap; the pair's peer floods).
    Injector,
}

/// Builds a backend and its peer. `peers`: who sends frames to the device; `window`: the
/// echo peer keeps at most this many in flight (else it floods).
pub(super) fn make_trial(
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
pub(super) fn pair_trial(
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
pub(super) fn tap_trial(
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
pub(super) fn pin_sim_threads(
    (driver, device): (usize, usize),
) -> io::Result<crate::noise::PinGuard> {
    let guard = crate::noise::PinGuard::pin(driver)?;
    for tid in crate::cost::threads_named("net-") {
        crate::noise::pin_thread(tid, device)?;
    }
    Ok(guard)
}

/// Runs one co-simulation trial of `point` and checks the driver and device counters agree.
pub(super) fn sim_trial(point: &Point, opts: &Options) -> io::Result<Measured> {
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
pub(super) fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.pps().total_cmp(&b.pps()));
    runs[runs.len() / 2]
}
