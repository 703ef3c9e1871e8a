//! What a sweep point is and what it measured, shared by the co-simulation (`sweep`) and the
//! real-VM runner (`vm`): the backend and host path, the device's knobs, the point itself and
//! its measurement.

use std::io;

use devices::test_utils::netns::NetNs;
use devices::virtio::net::{Adaptive, InterruptCoalescing, KickCoalescing, NetTuning};
use vnet_driver::Config;

use crate::workloads::{Pace, Sample, Workload};

/// Which backend the co-simulated device uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// socketpair(AF_UNIX, SOCK_SEQPACKET) with a peer thread (no root needed).
    Pair,
    /// A real tap in a network namespace the tool creates (root).
    Tap,
    /// Measurement: the device discards what the driver sends (`vmm --net backend=sink`): a
    /// host side faster than the guest.
    Sink,
    /// Measurement: the device generates numbered test frames for the driver to receive
    /// (`backend=source`); what the driver sends is discarded.
    Source,
    /// Measurement: what the driver sends comes back as received frames, MACs swapped
    /// (`backend=loop`); receiving workloads forward ([`Workload::Fwd`]).
    Loop,
}

impl BackendKind {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Pair => "pair",
            BackendKind::Tap => "tap",
            BackendKind::Sink => "sink",
            BackendKind::Source => "source",
            BackendKind::Loop => "loop",
        }
    }

    /// A measurement backend of the device itself (no peer, no kernel path).
    pub fn is_measurement(self) -> bool {
        matches!(
            self,
            BackendKind::Sink | BackendKind::Source | BackendKind::Loop
        )
    }

    /// The backend whose raw write loop is the baseline: the tap's for the measurement
    /// backends (they have no system call to compare with).
    pub fn baseline_backend(self) -> BackendKind {
        if self.is_measurement() {
            BackendKind::Tap
        } else {
            self
        }
    }

    /// Why `workload` cannot run on this backend with `host_path`, if it cannot.
    pub fn refuses(self, host_path: HostPath, workload: Workload) -> Option<&'static str> {
        let receives = !matches!(workload, Workload::XskTx(_));
        if host_path != HostPath::Stack && self != BackendKind::Tap {
            return Some("--host-path xdp-drop|xdp-reflect needs --backend tap");
        }
        if host_path == HostPath::XdpDrop && receives {
            return Some("the tap's xdp-drop host path returns nothing to receive");
        }
        let loops = self == BackendKind::Loop
            || (self == BackendKind::Tap && host_path == HostPath::XdpReflect);
        if workload.round_trips() && !loops {
            return Some(
                "pingpong and mixed need every frame back: --backend loop, or --backend tap \
                 --host-path xdp-reflect",
            );
        }
        match self {
            BackendKind::Sink if receives => Some("a sink has nothing to receive"),
            BackendKind::Loop if matches!(workload, Workload::Rx) => {
                Some("a loop returns only what is sent: use fwd")
            }
            _ => None,
        }
    }

    /// `workload` as it runs on this backend and host path: a loop (or a tap that reflects)
    /// forwards what a bounce would echo; elsewhere forwarding is the echo of a host peer.
    pub fn adapt(self, host_path: HostPath, workload: Workload) -> Workload {
        let loops = self == BackendKind::Loop
            || (self == BackendKind::Tap && host_path == HostPath::XdpReflect);
        match workload {
            Workload::Bidirectional | Workload::XdpBounce | Workload::Echo if loops => {
                Workload::Fwd
            }
            Workload::Fwd if matches!(self, BackendKind::Pair | BackendKind::Tap) && !loops => {
                Workload::Echo
            }
            w => w,
        }
    }
}

/// What the host does with the frames the device writes to a tap (`--host-path`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HostPath {
    /// The kernel's network stack (no XDP program).
    #[default]
    Stack,
    /// An XDP_DROP program on the tap: a non-blocking writer's frames skip the skb.
    XdpDrop,
    /// An XDP_TX program on the tap: every written frame comes back to the same fd, so a
    /// forwarding workload circulates through the host's tun path.
    XdpReflect,
}

impl HostPath {
    /// The name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            HostPath::Stack => "stack",
            HostPath::XdpDrop => "xdp-drop",
            HostPath::XdpReflect => "xdp-reflect",
        }
    }

    /// The XDP program it attaches, if any.
    pub fn program(self) -> Option<crate::xdp::XdpProgram> {
        match self {
            HostPath::Stack => None,
            HostPath::XdpDrop => Some(crate::xdp::XdpProgram::Drop),
            HostPath::XdpReflect => Some(crate::xdp::XdpProgram::Reflect),
        }
    }

    /// Attaches the program (if any) to `tap` in `ns`; detached when the guard drops or the
    /// process ends, however it ends (a bpf link).
    pub fn attach(self, ns: &NetNs, tap: &str) -> io::Result<Option<crate::xdp::XdpAttachment>> {
        let Some(program) = self.program() else {
            return Ok(None);
        };
        let tap = tap.to_owned();
        ns.run(move || crate::xdp::attach(&tap, program))?.map(Some)
    }
}

pub use crate::rig::RingLayout;

/// The device-side knobs of a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevKnobs {
    /// Interrupt coalescing: frames that release a held interrupt (0: no packet bound).
    pub coalesce_packets: u16,
    /// Interrupt coalescing: µs an interrupt may be held (0: off).
    pub coalesce_usecs: u32,
    /// Honour the driver's `used_event` (the device's EVENT_IDX override when false).
    pub event_idx: bool,
    /// Frames per tx call.
    pub tx_budget: u16,
    /// Device busy-poll, µs (0: off).
    pub busy_poll_us: u32,
    /// The busy-poll's sleep between looks, µs (0: it spins).
    pub busy_poll_sleep_us: u32,
    /// Kick coalescing: buffers the driver queues past a drained tx ring before it kicks
    /// (`max_packets` 0: off), and µs after which the device looks at the ring by itself.
    pub kick_coalescing: KickCoalescing,
    /// Sparse rx reads (skip the read that finds the backend empty when frames come singly).
    pub rx_sparse_reads: bool,
    /// The ring layout the device offers (the driver's request is in the point's config).
    pub ring: RingLayout,
    /// Device-side adaptation (`adaptive=on`, default bounds but this one): the device then
    /// chooses its busy-poll window, interrupt coalescing and kick coalescing itself.
    pub adaptive: bool,
    /// The longest busy-poll window adaptation may choose, µs (`adaptive_max_busy_poll_us`;
    /// 0: the device may not poll, and coalesces kicks instead where that pays).
    pub adaptive_max_busy_poll_us: u32,
}

impl Default for DevKnobs {
    fn default() -> Self {
        let t = NetTuning::default();
        DevKnobs {
            coalesce_packets: t.interrupt_coalescing.max_packets,
            coalesce_usecs: t.interrupt_coalescing.max_usecs,
            event_idx: t.event_idx,
            tx_budget: t.tx_budget,
            busy_poll_us: t.busy_poll_us,
            busy_poll_sleep_us: t.busy_poll_sleep_us,
            kick_coalescing: t.kick_coalescing,
            rx_sparse_reads: t.rx_sparse_reads,
            ring: RingLayout::SPLIT,
            adaptive: t.adaptive.enabled,
            adaptive_max_busy_poll_us: t.adaptive.max_busy_poll_us,
        }
    }
}

/// Parses `--kick-coalesce N/US`: N buffers (1..=65535) the driver queues past a drained tx
/// ring without a kick, US µs (1..=10000) before the device looks by itself.
pub fn parse_kick_coalesce(s: &str) -> Result<KickCoalescing, String> {
    let bad = || format!("{s:?} is not N/US (N 1..=65535 buffers, US 1..=10000 µs)");
    let (n, us) = s.split_once('/').ok_or_else(bad)?;
    let k = KickCoalescing {
        max_packets: n.parse().map_err(|_| bad())?,
        max_usecs: us.parse().map_err(|_| bad())?,
    };
    // `validate` refuses a packet bound without a time bound.
    if k.max_packets == 0 || k.validate().is_err() {
        return Err(bad());
    }
    Ok(k)
}

impl DevKnobs {
    /// The device tuning these knobs make.
    pub fn tuning(&self) -> NetTuning {
        NetTuning {
            interrupt_coalescing: InterruptCoalescing {
                max_packets: self.coalesce_packets,
                max_usecs: self.coalesce_usecs,
            },
            event_idx: self.event_idx,
            tx_budget: self.tx_budget,
            busy_poll_us: self.busy_poll_us,
            busy_poll_sleep_us: self.busy_poll_sleep_us,
            kick_coalescing: self.kick_coalescing,
            rx_sparse_reads: self.rx_sparse_reads,
            adaptive: Adaptive {
                enabled: self.adaptive,
                max_busy_poll_us: self.adaptive_max_busy_poll_us,
                ..Adaptive::default()
            },
        }
    }

    /// The `--net` spec keys that set these knobs (only those that differ from the device's
    /// defaults, each as `,key=value`).
    pub fn net_spec_keys(&self) -> String {
        let d = DevKnobs::default();
        let mut s = String::new();
        if self.coalesce_packets != d.coalesce_packets {
            s += &format!(",coalesce_packets={}", self.coalesce_packets);
        }
        if self.coalesce_usecs != d.coalesce_usecs {
            s += &format!(",coalesce_usecs={}", self.coalesce_usecs);
        }
        if self.event_idx != d.event_idx {
            s += if self.event_idx {
                ",event_idx=on"
            } else {
                ",event_idx=off"
            };
        }
        if self.tx_budget != d.tx_budget {
            s += &format!(",tx_budget={}", self.tx_budget);
        }
        if self.busy_poll_us != d.busy_poll_us {
            s += &format!(",busy_poll_us={}", self.busy_poll_us);
        }
        if self.busy_poll_sleep_us != d.busy_poll_sleep_us {
            s += &format!(",busy_poll_sleep_us={}", self.busy_poll_sleep_us);
        }
        if self.kick_coalescing != d.kick_coalescing {
            s += &format!(
                ",kick_coalesce_packets={},kick_coalesce_usecs={}",
                self.kick_coalescing.max_packets, self.kick_coalescing.max_usecs
            );
        }
        if self.rx_sparse_reads != d.rx_sparse_reads {
            s += if self.rx_sparse_reads {
                ",rx_sparse_reads=on"
            } else {
                ",rx_sparse_reads=off"
            };
        }
        if self.ring.packed {
            s += ",packed=on";
        }
        if self.ring.in_order {
            s += ",in_order=on";
        }
        if self.adaptive {
            s += ",adaptive=on";
            if self.adaptive_max_busy_poll_us != d.adaptive_max_busy_poll_us {
                s += &format!(
                    ",adaptive_max_busy_poll_us={}",
                    self.adaptive_max_busy_poll_us
                );
            }
        }
        s
    }
}

/// A point of a sweep: the swept knobs' names and values (one axis or two), and the driver
/// config, device knobs and workload it runs.
#[derive(Clone, Debug)]
pub struct Point {
    /// (knob, value) per axis: one for a 1-D sweep, two for a 2-D sweep.
    pub axes: Vec<(&'static str, String)>,
    /// Driver knobs.
    pub config: Config,
    /// Device knobs.
    pub dev: DevKnobs,
    /// The workload.
    pub workload: Workload,
    /// Pacing of a transmit workload (None: as fast as the ring takes frames).
    pub pace: Option<Pace>,
    /// Ethernet frame size.
    pub frame_size: usize,
}

impl Point {
    /// This point on `ring`, on both sides: the device offers it and the driver requests it.
    pub fn on_ring(mut self, ring: RingLayout) -> Point {
        self.dev.ring = ring;
        self.config.packed = ring.packed;
        self.config.in_order = ring.in_order;
        self
    }

    /// The ring layout the point runs on.
    pub fn ring(&self) -> RingLayout {
        self.dev.ring
    }

    pub(crate) fn label(&self) -> String {
        self.axes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What one trial measured, in co-simulation or in a VM.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    /// Measured wall time, s.
    pub secs: f64,
    /// Packets (see [`Sample::packets`]).
    pub packets: u64,
    /// Driver kicks (tx + rx).
    pub kicks: u64,
    /// Interrupts the driver took.
    pub irqs: u64,
    /// The device's tx-queue interrupts.
    pub tx_irqs: u64,
    /// Kicks EVENT_IDX let the driver skip.
    pub kicks_suppressed: u64,
    /// Driver (vCPU) thread CPU, ns.
    pub driver_cpu_ns: u64,
    /// Device worker CPU, ns.
    pub device_cpu_ns: u64,
    /// Wall time over which the CPU times were taken, s.
    pub cpu_secs: f64,
    /// Device busy-poll windows that found work (a kick or wake-up saved).
    pub busy_poll_found: u64,
    /// Microseconds the device spent busy-polling.
    pub busy_poll_us: u64,
    /// The host injector's rate when one fed the point (receive on a tap), else 0.
    pub host_pps: f64,
    /// Round-trip times, for a request/response workload ([`Workload::PingPong`]; the
    /// trickle phases' of [`Workload::Mixed`]).
    pub latency: Option<crate::workloads::Latency>,
    /// [`Workload::Mixed`]: the flood phases' round trips per second.
    pub flood_pps: Option<f64>,
    /// Where adaptation left the knobs (co-simulation: exact; VMs: from the result line and
    /// the device's metrics).
    pub adapted: crate::workloads::Adapted,
}

impl Measured {
    /// Packets per second; of [`Workload::Mixed`], the flood phases' round trips per second.
    pub fn pps(&self) -> f64 {
        self.flood_pps
            .unwrap_or_else(|| self.packets as f64 / self.secs.max(1e-9))
    }
}

impl From<Sample> for Measured {
    fn from(m: Sample) -> Measured {
        Measured {
            secs: m.secs,
            packets: m.packets,
            kicks: m.driver.kicks + m.driver.rx_kicks,
            irqs: m.driver.interrupts,
            tx_irqs: m.dev_tx_irqs,
            kicks_suppressed: m.driver.kicks_suppressed,
            driver_cpu_ns: m.driver_cpu_ns,
            device_cpu_ns: m.device_cpu_ns,
            cpu_secs: m.secs,
            busy_poll_found: m.dev_busy_poll_found,
            busy_poll_us: m.dev_busy_poll_us,
            host_pps: 0.0,
            latency: m.latency,
            flood_pps: m.flood_pps,
            adapted: m.adapted,
        }
    }
}
