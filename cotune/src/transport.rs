//! The driver's transport seam in co-simulation, over either device transport:
//!
//! - virtio-mmio ([`CosimMmio`]): register accesses call the device model's virtio-mmio
//!   register file exactly as a vCPU MMIO exit would;
//! - virtio-pci with MSI-X ([`CosimPci`] under the driver's [`PciTransport`]): configuration
//!   accesses call the device's PCI configuration space as the host bridge would, BAR0 accesses
//!   its BAR handler as a vCPU MMIO exit would, and interrupts arrive on the eventfds of the
//!   MSI-X vectors (what KVM takes as irqfds).
//!
//! Either way a queue notification writes the queue's kick eventfd exactly as KVM does for an
//! ioeventfd, and is charged the configured exit cost on the calling (driver) thread.

use devices::virtio::pci::{PciDevice, VirtioPciTransport, NOTIFY_OFFSET, NOTIFY_OFF_MULTIPLIER};
use devices::virtio::MmioTransport as DeviceTransport;
use devices::BusDevice;
use vmm_sys_util::eventfd::EventFd;
use vnet_driver::pci::{PciBar, PciConfig};
use vnet_driver::transport::QueueSetup;
use vnet_driver::{InitError, MmioRegisters, PciTransport, QueueResetError, Transport};

use crate::cost::spin_for_ns;

/// Offset of the device configuration space in the virtio-mmio window.
const CONFIG_SPACE: u64 = 0x100;
/// Where co-simulation places BAR0 (any address: nothing decodes it but the function).
const COSIM_BAR0: u64 = 0xc000_0000;

/// Which device transport a co-simulation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// virtio-mmio, one interrupt line (the VMM's default).
    #[default]
    Mmio,
    /// Modern virtio-pci with an MSI-X vector per queue.
    Pci,
}

impl TransportKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Mmio => "mmio",
            TransportKind::Pci => "pci",
        }
    }
}

/// The queue kick eventfds and the exit cost of a notification.
struct Kicks {
    fds: Vec<EventFd>,
    cost_ns: u64,
    written: u64,
}

impl Kicks {
    fn new<'a>(fds: impl IntoIterator<Item = &'a EventFd>, cost_ns: u64) -> std::io::Result<Self> {
        Ok(Kicks {
            fds: fds
                .into_iter()
                .map(EventFd::try_clone)
                .collect::<Result<_, _>>()?,
            cost_ns,
            written: 0,
        })
    }

    #[inline]
    fn kick(&mut self, queue: usize) {
        if let Some(kick) = self.fds.get(queue) {
            // An eventfd counter cannot overflow in practice (2^64 - 2 writes).
            let _ = kick.write(1);
            self.written += 1;
            spin_for_ns(self.cost_ns);
        }
    }
}

/// [`MmioRegisters`] over the device model's virtio-mmio register file and kick eventfds.
pub struct CosimMmio {
    device: DeviceTransport,
    kicks: Kicks,
}

impl CosimMmio {
    /// Wraps `device`, cloning its queue notification eventfds.
    pub fn new(device: DeviceTransport, kick_cost_ns: u64) -> std::io::Result<CosimMmio> {
        let kicks = Kicks::new(device.ioeventfds(0).into_iter().map(|e| e.0), kick_cost_ns)?;
        Ok(CosimMmio { device, kicks })
    }
}

impl MmioRegisters for CosimMmio {
    fn read32(&mut self, offset: u32) -> u32 {
        let mut data = [0u8; 4];
        self.device.read(u64::from(offset), &mut data);
        u32::from_le_bytes(data)
    }

    fn write32(&mut self, offset: u32, value: u32) {
        self.device.write(u64::from(offset), &value.to_le_bytes());
    }

    fn read_config_u8(&mut self, offset: u32) -> u8 {
        let mut data = [0u8; 1];
        self.device
            .read(CONFIG_SPACE + u64::from(offset), &mut data);
        data[0]
    }

    #[inline]
    fn notify(&mut self, queue: u16) {
        self.kicks.kick(usize::from(queue));
    }
}

/// The device model's [`VirtioPciTransport`] as a PCI function: configuration space by
/// function calls, BAR0 through its BAR handler, notifications on the kick eventfds.
pub struct CosimPci {
    device: VirtioPciTransport,
    kicks: Kicks,
}

impl CosimPci {
    /// Wraps `device` (placing BAR0), cloning its queue notification eventfds.
    pub fn new(mut device: VirtioPciTransport, kick_cost_ns: u64) -> std::io::Result<CosimPci> {
        device.set_bar0_address(COSIM_BAR0);
        // No KVM routes to keep: the vectors' eventfds are read directly.
        device.set_msix_route_handler(Box::new(|_, _| {}));
        let kicks = Kicks::new(device.ioeventfds(0).into_iter().map(|e| e.0), kick_cost_ns)?;
        Ok(CosimPci { device, kicks })
    }

    /// The device model.
    pub fn device(&self) -> &VirtioPciTransport {
        &self.device
    }
}

impl PciConfig for CosimPci {
    fn config_read32(&mut self, offset: u8) -> u32 {
        let mut data = [0u8; 4];
        self.device
            .read_config_register(u64::from(offset), &mut data);
        u32::from_le_bytes(data)
    }

    fn config_write32(&mut self, offset: u8, value: u32) {
        // BAR0 is never moved in co-simulation (sizing writes report no move).
        let _ = self
            .device
            .write_config_register(u64::from(offset), &value.to_le_bytes());
    }

    fn config_write16(&mut self, offset: u8, value: u16) {
        let _ = self
            .device
            .write_config_register(u64::from(offset), &value.to_le_bytes());
    }
}

macro_rules! bar_access {
    ($read:ident, $write:ident, $t:ty) => {
        fn $read(&mut self, offset: u32) -> $t {
            let mut data = [0u8; std::mem::size_of::<$t>()];
            self.device.read(u64::from(offset), &mut data);
            <$t>::from_le_bytes(data)
        }
        fn $write(&mut self, offset: u32, value: $t) {
            self.device.write(u64::from(offset), &value.to_le_bytes());
        }
    };
}

impl PciBar for CosimPci {
    fn size(&self) -> u64 {
        self.device.bar0().1
    }
    bar_access!(read8, write8, u8);
    bar_access!(read16, write16, u16);
    bar_access!(read32, write32, u32);

    #[inline]
    fn notify(&mut self, offset: u32, _queue: u16) {
        // The ioeventfd registered at this address, as KVM would match it.
        let index =
            u64::from(offset).wrapping_sub(NOTIFY_OFFSET) / u64::from(NOTIFY_OFF_MULTIPLIER);
        self.kicks.kick(index as usize);
    }
}

/// The co-simulation transport: virtio-mmio or virtio-pci (one branch per operation; the
/// driver stays generic over it).
// One per rig, built once and never moved on the datapath: inline, so a kick does not chase a
// box (the PCI variant holds the device's 256-byte configuration space).
#[allow(clippy::large_enum_variant)]
pub enum CosimTransport {
    /// virtio-mmio.
    Mmio(CosimMmio),
    /// virtio-pci with MSI-X.
    Pci(PciTransport<CosimPci>),
}

/// An interrupt line the driver thread waits on: the eventfd, and the MSI-X vector it is
/// (None: the one virtio-mmio line).
pub struct IrqLine {
    /// The eventfd the device signals.
    pub fd: EventFd,
    /// The MSI-X vector, on virtio-pci.
    pub vector: Option<u16>,
}

impl CosimTransport {
    /// Wraps a virtio-mmio device.
    pub fn mmio(device: DeviceTransport, kick_cost_ns: u64) -> std::io::Result<CosimTransport> {
        Ok(CosimTransport::Mmio(CosimMmio::new(device, kick_cost_ns)?))
    }

    /// Wraps a virtio-pci device: walks its capabilities, enables memory decoding and bus
    /// mastering, programs and unmasks every MSI-X entry (address 0xFEE00000, data the entry
    /// number, as a bare-metal guest would) and enables MSI-X.
    pub fn pci(device: VirtioPciTransport, kick_cost_ns: u64) -> Result<CosimTransport, String> {
        let function = CosimPci::new(device, kick_cost_ns).map_err(|e| e.to_string())?;
        let mut t = PciTransport::new(function).map_err(|e| e.to_string())?;
        for entry in 0..t.msix_table_size() {
            t.set_msix_entry(entry, 0xfee0_0000, 0x40 + u32::from(entry))
                .map_err(|e| e.to_string())?;
        }
        t.enable_msix().map_err(|e| e.to_string())?;
        Ok(CosimTransport::Pci(t))
    }

    /// Clones of the device's interrupt eventfds: the one line (virtio-mmio), or every MSI-X
    /// vector (virtio-pci).
    pub fn interrupt_lines(&self) -> std::io::Result<Vec<IrqLine>> {
        match self {
            CosimTransport::Mmio(m) => Ok(vec![IrqLine {
                fd: m.device.irqfd().try_clone()?,
                vector: None,
            }]),
            CosimTransport::Pci(p) => {
                let vectors = p.function().device.msix_vectors().clone();
                (0..vectors.len())
                    .filter_map(|v| vectors.irqfd(v).map(|fd| (v, fd)))
                    .map(|(v, fd)| {
                        Ok(IrqLine {
                            fd: fd.try_clone()?,
                            vector: Some(v),
                        })
                    })
                    .collect()
            }
        }
    }

    fn kicks(&self) -> &Kicks {
        match self {
            CosimTransport::Mmio(m) => &m.kicks,
            CosimTransport::Pci(p) => &p.function().kicks,
        }
    }

    /// Notifications written to kick eventfds.
    pub fn kicks_written(&self) -> u64 {
        self.kicks().written
    }

    /// Stops the device worker (as a reset would).
    pub fn shutdown(&mut self) {
        match self {
            CosimTransport::Mmio(m) => m.device.shutdown(),
            CosimTransport::Pci(p) => p.function_mut().device.shutdown(),
        }
    }
}

macro_rules! delegate {
    ($self:ident, $t:ident => $e:expr) => {
        match $self {
            CosimTransport::Mmio($t) => $e,
            CosimTransport::Pci($t) => $e,
        }
    };
}

impl Transport for CosimTransport {
    fn device_type(&mut self) -> Result<u32, InitError> {
        delegate!(self, t => t.device_type())
    }
    fn device_features(&mut self) -> u64 {
        delegate!(self, t => t.device_features())
    }
    fn set_driver_features(&mut self, features: u64) {
        delegate!(self, t => t.set_driver_features(features))
    }
    fn status(&mut self) -> u32 {
        delegate!(self, t => t.status())
    }
    fn set_status(&mut self, status: u32) {
        delegate!(self, t => t.set_status(status))
    }
    fn queue_max_size(&mut self, queue: u16) -> u32 {
        delegate!(self, t => t.queue_max_size(queue))
    }
    fn queue_enabled(&mut self, queue: u16) -> bool {
        delegate!(self, t => t.queue_enabled(queue))
    }
    fn setup_config_vector(&mut self) -> Result<(), InitError> {
        delegate!(self, t => t.setup_config_vector())
    }
    fn setup_queue(&mut self, queue: u16, setup: &QueueSetup) -> Result<(), InitError> {
        delegate!(self, t => t.setup_queue(queue, setup))
    }
    #[inline]
    fn notify(&mut self, queue: u16) {
        delegate!(self, t => Transport::notify(t, queue))
    }
    fn reset_queue(&mut self, queue: u16, polls: u32) -> Result<(), QueueResetError> {
        delegate!(self, t => t.reset_queue(queue, polls))
    }
    fn config_generation(&mut self) -> u32 {
        delegate!(self, t => t.config_generation())
    }
    fn read_config_u8(&mut self, offset: u32) -> u8 {
        delegate!(self, t => Transport::read_config_u8(t, offset))
    }
    fn read_config_u16(&mut self, offset: u32) -> u16 {
        delegate!(self, t => Transport::read_config_u16(t, offset))
    }
    fn interrupt_status(&mut self) -> u32 {
        delegate!(self, t => t.interrupt_status())
    }
    fn ack_interrupt(&mut self, bits: u32) {
        delegate!(self, t => t.ack_interrupt(bits))
    }
    fn queue_vector(&self, queue: u16) -> Option<u16> {
        delegate!(self, t => t.queue_vector(queue))
    }
    fn config_vector(&self) -> Option<u16> {
        delegate!(self, t => t.config_vector())
    }
}
