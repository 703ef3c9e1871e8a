//! The driver's register and notification seam in co-simulation: register accesses call the
//! device model's virtio-mmio register file exactly as a vCPU MMIO exit would, and a queue
//! notification writes the queue's kick eventfd exactly as KVM does for an ioeventfd. Each
//! notification is charged the configured exit cost on the calling (driver) thread.

use devices::virtio::MmioTransport as DeviceTransport;
use devices::BusDevice;
use vmm_sys_util::eventfd::EventFd;
use vnet_driver::MmioRegisters;

use crate::cost::spin_for_ns;

/// Offset of the device configuration space in the virtio-mmio window.
const CONFIG_SPACE: u64 = 0x100;

/// A [`Transport`] over the device model's register file and kick eventfds.
pub struct CosimTransport {
    device: DeviceTransport,
    kicks: Vec<EventFd>,
    kick_cost_ns: u64,
    kicks_written: u64,
}

impl CosimTransport {
    /// Wraps `device`, cloning its queue notification eventfds.
    pub fn new(device: DeviceTransport, kick_cost_ns: u64) -> std::io::Result<CosimTransport> {
        let kicks = device
            .ioeventfds(0)
            .into_iter()
            .map(|(evt, _, _)| evt.try_clone())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CosimTransport {
            device,
            kicks,
            kick_cost_ns,
            kicks_written: 0,
        })
    }

    /// A clone of the device's interrupt eventfd (what KVM would take as an irqfd).
    pub fn irqfd(&self) -> std::io::Result<EventFd> {
        self.device.irqfd().try_clone()
    }

    /// Notifications written to kick eventfds.
    pub fn kicks_written(&self) -> u64 {
        self.kicks_written
    }

    /// Stops the device worker (as a reset would).
    pub fn shutdown(&mut self) {
        self.device.shutdown();
    }
}

impl MmioRegisters for CosimTransport {
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

    fn notify(&mut self, queue: u16) {
        if let Some(kick) = self.kicks.get(usize::from(queue)) {
            // An eventfd counter cannot overflow in practice (2^64 - 2 writes).
            let _ = kick.write(1);
            self.kicks_written += 1;
            spin_for_ns(self.kick_cost_ns);
        }
    }
}
