//! A co-simulation rig: the real device model (transport, worker thread, backend) and the
//! guest driver crate over one shared guest memory. The driver runs on the calling thread (the
//! "vCPU"); the device's worker runs on its own thread, woken by the same kick eventfds KVM's
//! ioeventfds would write; its interrupts arrive on the eventfd KVM would take as an irqfd.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use devices::backend::NetBackend;
use devices::virtio::net::{MacAddr, NetDevice, NetMetrics, NetTuning, TuningError};
use devices::virtio::pci::VirtioPciTransport;
use devices::virtio::MmioTransport as DeviceTransport;
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vnet_driver::{Config, QueueId, Rearm, Transport, VirtioNet, XdpAction};

use crate::check::{device_agreement, from_metrics, DeviceCounters, DriverCounters, Taken};
use crate::cost::{spin_for_ns, thread_cpu_ns};
use crate::env::wait_readable;
use crate::hal::GuestMemHal;
use crate::transport::{CosimTransport, IrqLine, TransportKind};

/// Guest memory of a rig.
pub const MEM_SIZE: u64 = 64 << 20;
/// Driver rings and buffers come from [DRIVER_DMA_START, UMEM_START).
const DRIVER_DMA_START: u64 = 1 << 20;
/// Caller-owned umem comes from [UMEM_START, MEM_SIZE).
const UMEM_START: u64 = 32 << 20;

/// The virtqueue layout of a point, offered by the device (`--net …,packed=on,in_order=on`)
/// and requested by the driver (`Config::packed`, `Config::in_order`; the driver guest's
/// `packed=1 in_order=1`): both sides the same, so a point runs on the layout it names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingLayout {
    /// VIRTIO_F_RING_PACKED (false: the split ring).
    pub packed: bool,
    /// VIRTIO_F_IN_ORDER: a batch completed with one used entry.
    pub in_order: bool,
}

impl RingLayout {
    /// The split ring, buffers completed one by one (the default).
    pub const SPLIT: RingLayout = RingLayout {
        packed: false,
        in_order: false,
    };
    /// The packed ring.
    pub const PACKED: RingLayout = RingLayout {
        packed: true,
        in_order: false,
    };
    /// The packed ring with IN_ORDER.
    pub const PACKED_IN_ORDER: RingLayout = RingLayout {
        packed: true,
        in_order: true,
    };

    /// The layout as a sweep value: `split`, `packed`, `split+in_order`, `packed+in_order`.
    pub fn name(self) -> &'static str {
        match (self.packed, self.in_order) {
            (false, false) => "split",
            (true, false) => "packed",
            (false, true) => "split+in_order",
            (true, true) => "packed+in_order",
        }
    }

    /// Whether a driver's negotiated `features` run this layout.
    pub fn negotiated_in(self, features: u64) -> bool {
        use vnet_driver::features::{F_IN_ORDER, F_RING_PACKED};
        (features & F_RING_PACKED != 0) == self.packed
            && (features & F_IN_ORDER != 0) == self.in_order
    }
}

/// Driver knobs, device knobs and the exit-cost model.
#[derive(Clone, Copy, Debug)]
pub struct RigConfig {
    /// The guest driver's configuration.
    pub driver: Config,
    /// The device's tuning (coalescing, EVENT_IDX override, tx budget, busy-poll), set before
    /// the driver brings the device up.
    pub device: NetTuning,
    /// ns charged to the driver thread per kick.
    pub kick_cost_ns: u64,
    /// ns charged to the driver thread per interrupt taken.
    pub irq_cost_ns: u64,
    /// The device transport (virtio-mmio, or virtio-pci with MSI-X).
    pub transport: TransportKind,
    /// The ring layout the device offers (what the driver asks for is in `driver`).
    pub ring: RingLayout,
}

/// Why a rig could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    #[error("cannot allocate guest memory")]
    Memory(#[source] vm_memory::mmap::FromRangesError),
    #[error("cannot create the virtio-mmio transport")]
    Transport(#[source] devices::virtio::mmio::MmioError),
    #[error("cannot create the virtio-pci transport")]
    PciTransport(#[source] devices::virtio::pci::PciTransportError),
    #[error("cannot drive the virtio-pci function: {0}")]
    PciFunction(String),
    #[error("guest memory [{start:#x}, {end:#x}) cannot hold a DMA area")]
    Layout {
        /// Start of the area.
        start: u64,
        /// End of the area.
        end: u64,
    },
    #[error("eventfd")]
    EventFd(#[source] std::io::Error),
    #[error("device tuning refused")]
    Tuning(#[source] TuningError),
    #[error("driver initialisation failed: {0:?}")]
    Driver(vnet_driver::InitError),
}

/// The driver side of a running co-simulation.
pub struct Rig {
    /// The guest driver.
    pub net: VirtioNet<GuestMemHal, CosimTransport>,
    /// The device's metrics.
    pub metrics: Arc<NetMetrics>,
    /// DMA memory for caller-owned frame areas (umem).
    pub umem_hal: GuestMemHal,
    /// The interrupt lines: the one virtio-mmio line, or every MSI-X vector.
    irqs: Vec<IrqLine>,
    irq_cost_ns: u64,
    /// Every device interrupt signal consumed: the values read from the one irqfd
    /// (virtio-mmio), or from every queue's vector (virtio-pci: a queue pair's signal fires the
    /// vector of each of its queues that wanted it, the control queue's its own).
    pub irq_signals_taken: u64,
    /// Values read per line ([`Rig::lines`] order).
    pub line_signals: Vec<u64>,
    /// Per line: whether its reads count in `irq_signals_taken`.
    counts: Vec<bool>,
    /// The device's counters as the driver read them over the control queue in
    /// [`Rig::quiesce`] (`None`: VIRTIO_NET_F_DEVICE_STATS not negotiated, or not quiesced
    /// yet).
    pub device_stats: Option<Result<crate::check::DeviceCounters, String>>,
}

/// Nanoseconds on the host's monotonic clock since the first call: the co-simulated driver's
/// adaptation clock.
fn monotonic_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl Rig {
    /// Builds memory, device (with `backend`), transport and driver, and brings the device up.
    pub fn new<B: NetBackend>(backend: B, config: &RigConfig) -> Result<Rig, RigError> {
        Rig::with_backends(vec![backend], config)
    }

    /// [`Rig::new`] with one queue pair per backend (the device offers VIRTIO_NET_F_MQ with
    /// several; the driver uses `config.driver.queue_pairs` of them).
    pub fn with_backends<B: NetBackend>(
        backends: Vec<B>,
        config: &RigConfig,
    ) -> Result<Rig, RigError> {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
            .map_err(RigError::Memory)?;
        let queue_size = config.driver.rx_queue_size.max(config.driver.tx_queue_size);
        let device =
            NetDevice::with_backends(backends, MacAddr::derived_from("cotune"), queue_size)
                .with_ring_features(config.ring.packed, config.ring.in_order);
        let metrics = device.metrics();
        device
            .tuning_control()
            .set(config.device)
            .map_err(RigError::Tuning)?;
        let transport = match config.transport {
            TransportKind::Mmio => {
                let device = DeviceTransport::new(mem.clone(), Box::new(device))
                    .map_err(RigError::Transport)?;
                CosimTransport::mmio(device, config.kick_cost_ns).map_err(RigError::EventFd)?
            }
            TransportKind::Pci => {
                let device = VirtioPciTransport::new(mem.clone(), Box::new(device))
                    .map_err(RigError::PciTransport)?;
                CosimTransport::pci(device, config.kick_cost_ns).map_err(RigError::PciFunction)?
            }
        };
        let mut irqs = transport.interrupt_lines().map_err(RigError::EventFd)?;
        let layout = |start, end| RigError::Layout { start, end };
        let hal = GuestMemHal::new(mem.clone(), DRIVER_DMA_START, UMEM_START)
            .ok_or_else(|| layout(DRIVER_DMA_START, UMEM_START))?;
        let umem_hal = GuestMemHal::new(mem, UMEM_START, MEM_SIZE)
            .ok_or_else(|| layout(UMEM_START, MEM_SIZE))?;
        let mut net = VirtioNet::new(hal, transport, config.driver).map_err(RigError::Driver)?;
        if config.driver.adaptive {
            // The driver guest's clock is its TSC; here the host's monotonic clock.
            net.set_adapt_clock(Some(monotonic_ns));
        }
        // MSI-X: the vectors the driver assigned to its queues first (rx's first), then the
        // configuration vector; unused vectors are not waited on.
        if config.transport == TransportKind::Pci {
            let t = net.transport();
            let mut wanted: Vec<u16> = [0, 1, 2]
                .iter()
                .filter_map(|&q| t.queue_vector(q))
                .collect();
            wanted.extend(t.config_vector());
            wanted.dedup();
            let mut ordered = Vec::new();
            for v in wanted {
                if let Some(i) = irqs.iter().position(|l| l.vector == Some(v)) {
                    ordered.push(irqs.swap_remove(i));
                }
            }
            irqs = ordered;
        }
        let lines = irqs.len();
        // Interrupt signals: the one line, or every queue vector (not the configuration one).
        let config_vector = net.transport().config_vector();
        let counts = irqs
            .iter()
            .map(|l| l.vector.is_none() || l.vector != config_vector)
            .collect();
        Ok(Rig {
            counts,
            net,
            metrics,
            umem_hal,
            irqs,
            irq_cost_ns: config.irq_cost_ns,
            irq_signals_taken: 0,
            line_signals: vec![0; lines],
            device_stats: None,
        })
    }

    /// Takes the device's interrupt if it is pending, waiting up to `timeout_ms` for it: reads
    /// the irqfd, charges the interrupt cost and runs the driver's interrupt handler. Returns
    /// true if an interrupt was taken.
    ///
    /// On virtio-pci every pending MSI-X vector is taken (each charged the interrupt cost, as
    /// each is its own interrupt in a VM) and handled as that vector's interrupt: no ISR read.
    pub fn take_interrupt(&mut self, timeout_ms: i32) -> bool {
        if let [line] = self.irqs.as_slice() {
            if !wait_readable(line.fd.as_raw_fd(), timeout_ms) {
                return false;
            }
        } else if !wait_any_readable(&self.irqs, timeout_ms) {
            return false;
        }
        let mut taken = false;
        for (i, line) in self.irqs.iter().enumerate() {
            let Ok(n) = line.fd.read() else {
                continue;
            };
            self.line_signals[i] += n;
            if self.counts[i] {
                self.irq_signals_taken += n;
            }
            spin_for_ns(self.irq_cost_ns);
            taken |= match line.vector {
                None => self.net.handle_interrupt().any(),
                Some(v) => self.net.handle_msix(v).any(),
            };
        }
        taken
    }

    /// The transport in use.
    pub fn transport_kind(&self) -> TransportKind {
        match self.net.transport() {
            CosimTransport::Mmio(_) => TransportKind::Mmio,
            CosimTransport::Pci(_) => TransportKind::Pci,
        }
    }

    /// The interrupt lines' MSI-X vectors (None: the one virtio-mmio line), in
    /// [`Rig::line_signals`] order.
    pub fn lines(&self) -> Vec<Option<u16>> {
        self.irqs.iter().map(|l| l.vector).collect()
    }

    /// The tx poll (Linux's napi_tx): reclaims used tx buffers, re-arms tx interrupts, and
    /// reclaims again if completions raced in while re-arming.
    pub fn tx_poll(&mut self) {
        self.net.reclaim_tx();
        if self.net.enable_interrupts(QueueId::Tx) == Rearm::UsedPending {
            self.net.reclaim_tx();
        }
    }

    /// The rx NAPI poll: interrupts off, polls in budgets of 64 until the ring is empty,
    /// re-arms, and polls once more if frames raced in while re-arming.
    pub fn rx_poll(&mut self, program: &mut impl FnMut(&mut [u8]) -> XdpAction) {
        self.net.disable_interrupts(QueueId::Rx);
        while self.net.poll_rx_mut(64, program) == 64 {}
        if self.net.enable_interrupts(QueueId::Rx) == Rearm::UsedPending {
            self.net.poll_rx_mut(64, program);
        }
    }

    /// The driver thread's CPU time so far, ns.
    pub fn cpu_ns(&self) -> u64 {
        thread_cpu_ns()
    }

    /// Lets the device finish what the driver gave it, reads the device's counters over the
    /// control queue if VIRTIO_NET_F_DEVICE_STATS is negotiated ([`Rig::device_stats`]),
    /// takes the last interrupt signals, and stops the device worker, so every counter is
    /// final. (A device reset drains the irqfd, so signals are taken before it.) Call after
    /// traffic sources have stopped.
    pub fn quiesce(&mut self) {
        self.settle();
        self.device_stats = crate::check::read_device_stats(&mut self.net);
        if self.device_stats.is_some() {
            // The statistics commands' kicks.
            self.settle();
        }
        self.net.transport_mut().shutdown();
    }

    /// Waits until the device has seen every kick the transport wrote (the control queue's
    /// too) and none of its kicks, signals and frames moved over 20 ms, taking the signals;
    /// a worker descheduled on a loaded machine is waited for up to 3 s. (A fixed pause lost
    /// a trial's last signal under load: device signalled 3, driver took 2.)
    fn settle(&mut self) {
        let start = std::time::Instant::now();
        let mut last = None;
        loop {
            std::thread::sleep(SETTLE);
            // The device counts a signal after writing its eventfd: read the counters first,
            // then the lines, and every signal counted is taken.
            let m = &self.metrics;
            let seen = (
                m.tx.kicks.get() + m.rx.kicks.get() + m.ctrl.kicks.get(),
                m.irqfd_signals.get(),
                m.tx.frames.get() + m.rx.frames.get(),
            );
            self.read_lines();
            let all_kicks_seen = seen.0 == self.net_transport_kicks();
            if (all_kicks_seen && last == Some(seen)) || start.elapsed() > SETTLE_LIMIT {
                break;
            }
            last = Some(seen);
        }
    }

    /// Reads every interrupt line without waiting, adding what it held to the counts.
    fn read_lines(&mut self) {
        for (i, line) in self.irqs.iter().enumerate() {
            if let Ok(n) = line.fd.read() {
                self.line_signals[i] += n;
                if self.counts[i] {
                    self.irq_signals_taken += n;
                }
            }
        }
    }
}

/// How long the device's counters must stand still for [`Rig::quiesce`].
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);
/// The longest [`Rig::quiesce`] waits for the device to settle.
const SETTLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Rig {
    /// Notifications the transport wrote to kick eventfds.
    pub fn net_transport_kicks(&mut self) -> u64 {
        self.net.transport_mut().kicks_written()
    }
}

/// Waits up to `ms` for any of `lines` to become readable.
fn wait_any_readable(lines: &[IrqLine], ms: i32) -> bool {
    let mut fds: Vec<libc::pollfd> = lines
        .iter()
        .map(|l| libc::pollfd {
            fd: l.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes only the pollfds of `fds`, which live for the call and
    // whose count is passed with them.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) > 0 }
}

impl Rig {
    /// Used entries not popped over the pairs: (rx, tx).
    fn used_pending(&mut self) -> (u64, u64) {
        let current = self.net.current_pair();
        let (mut rx, mut tx) = (0, 0);
        for pair in 0..self.net.queue_pairs() {
            if self.net.select_pair(pair).is_ok() {
                rx += u64::from(self.net.rx_used_pending());
                tx += u64::from(self.net.tx_used_pending());
            }
        }
        let _ = self.net.select_pair(current);
        (rx, tx)
    }

    /// Checks the counters of a quiesced rig (device worker stopped): the driver's, the
    /// transport's and the device's agree (`crate::check`).
    pub fn consistency(&mut self) -> Result<(), String> {
        let d = self.net.counters();
        let written = self.net_transport_kicks();
        let m = &self.metrics;
        // Every control command is kicked once.
        let driver_kicks = d.kicks + d.rx_kicks + d.ctrl_commands;
        let device_kicks = m.tx.kicks.get() + m.rx.kicks.get() + m.ctrl.kicks.get();
        if driver_kicks != written || written != device_kicks {
            return Err(format!(
                "kicks disagree: driver counted {driver_kicks}, transport wrote {written}, device saw {device_kicks}"
            ));
        }
        let taken = self.interrupts_taken(m.irqfd_signals.get())?;
        if m.tx.malformed_chains.get() + m.rx.malformed_chains.get() != 0 {
            return Err("the device saw malformed chains from the driver".into());
        }
        let dev = self.device_counters(m)?;
        let (rx_pending, tx_pending) = self.used_pending();
        let tx_completed = d.tx_reclaimed + tx_pending;
        let driver = DriverCounters {
            tx_completed,
            tx_in_flight: (d.tx_frames + d.xdp_tx).saturating_sub(tx_completed),
            kicks: d.kicks,
            rx_kicks: d.rx_kicks,
            rx_frames: d.rx_frames,
            rx_slack: rx_pending,
            ctrl_commands: d.ctrl_commands,
            ctrl_failed: d.ctrl_failed,
        };
        device_agreement(&driver, &dev, taken)
    }

    /// The interrupts the driver took, against the `signals` the device raised.
    fn interrupts_taken(&self, signals: u64) -> Result<Taken, String> {
        if self.transport_kind() == TransportKind::Mmio {
            if self.irq_signals_taken != signals {
                return Err(format!(
                    "interrupts disagree: device signalled {signals}, driver took {}",
                    self.irq_signals_taken
                ));
            }
            return Ok(Taken::Shared(self.irq_signals_taken));
        }
        // virtio-pci: a queue pair's signal fires the vectors of those of its queues that
        // wanted it (one or both), the control queue's its own; the configuration vector none.
        let t = self.net.transport();
        let taken = |v: Option<u16>| {
            self.lines()
                .iter()
                .position(|&l| l.is_some() && l == v)
                .map_or(0, |i| self.line_signals[i])
        };
        let (rx, tx, ctrl) = (
            taken(t.queue_vector(0)),
            taken(t.queue_vector(1)),
            taken(t.queue_vector(2)),
        );
        let config = taken(t.config_vector());
        if rx.max(tx) + ctrl > signals || signals > rx + tx + ctrl {
            return Err(format!(
                "interrupts disagree: device signalled {signals}, driver took rx {rx}, tx {tx}, \
                 ctrl {ctrl} on their MSI-X vectors"
            ));
        }
        if config != 0 {
            return Err(format!("MSI-X: {config} configuration interrupts"));
        }
        Ok(Taken::PerQueue { rx, tx })
    }

    /// The device's counters: its statistics as the driver read them, which must be its
    /// metrics, else (none read) its metrics.
    fn device_counters(&self, m: &NetMetrics) -> Result<DeviceCounters, String> {
        let metrics = from_metrics(m);
        match &self.device_stats {
            Some(Ok(stats)) => {
                // The device's answer is its metrics: what the driver moves (everything on
                // tx, the rx kicks) has not moved since the GETs; the frames a peer delivers
                // (and their interrupts) may have grown by those in flight when the rig
                // quiesced (a tap's peer), never shrunk.
                let read = DeviceCounters {
                    cvq: None,
                    ..*stats
                };
                let settled = DeviceCounters {
                    rx_packets: read.rx_packets,
                    rx_interrupts: read.rx_interrupts,
                    ..metrics
                };
                if read != settled
                    || read.rx_packets > metrics.rx_packets
                    || read.rx_interrupts > metrics.rx_interrupts
                {
                    return Err(format!(
                        "the device's statistics disagree with its metrics: read {read:?}, \
                         metrics {metrics:?}"
                    ));
                }
                Ok(DeviceCounters {
                    cvq: stats.cvq,
                    ..metrics
                })
            }
            Some(Err(e)) => Err(format!("device statistics: {e}")),
            None => Ok(metrics),
        }
    }
}
