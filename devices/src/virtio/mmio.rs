//! The virtio-mmio transport (virtio 1.x "modern" only: Version register 2, VERSION_1 required).
//!
//! [`MmioTransport`] answers the guest's accesses to the device's 4 KiB MMIO window through
//! [`BusDevice`]. Every register write is validated against the device status state machine
//! (ACKNOWLEDGE → DRIVER → FEATURES_OK → DRIVER_OK); a write out of order or with a bad value
//! is ignored with a (rate-limited) warning, so a misbehaving guest can break its own device but
//! never the VMM. Queue notifications normally never reach [`BusDevice::write`]: the VMM
//! registers the eventfds listed by [`MmioTransport::ioeventfds`] with KVM.

use std::fmt;
use std::sync::Arc;

use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::common::{RingPart, TransportFeatures, VirtioState};
use super::{VirtioDevice, VirtioInterrupt};
use crate::BusDevice;

/// Size of one device's MMIO window.
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;
/// "virt" in little endian.
pub const MMIO_MAGIC_VALUE: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
pub const MMIO_VERSION: u32 = 2;
/// Vendor ID reported to the driver.
pub const MMIO_VENDOR_ID: u32 = 0;
/// Offset of QueueNotify inside the window (where ioeventfds are registered).
pub const QUEUE_NOTIFY_OFFSET: u64 = VIRTIO_MMIO_QUEUE_NOTIFY as u64;
/// Offset of the device configuration space inside the window.
pub const CONFIG_SPACE_OFFSET: u64 = VIRTIO_MMIO_CONFIG as u64;
/// QueueReset (virtio 1.2 §4.2.2, with VIRTIO_F_RING_RESET): write 1 to reset the selected
/// queue; reads 1 while the reset is ongoing.
pub const QUEUE_RESET_OFFSET: u32 = 0x0c0;

/// Errors building a transport.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// The device declared a queue size virtio-queue refuses.
    #[error("queue {index}: invalid maximum size {size}")]
    QueueSize {
        /// Queue index.
        index: usize,
        /// The refused size.
        size: u16,
    },
    /// Creating an eventfd failed.
    #[error("failed to create an eventfd")]
    EventFd(#[source] std::io::Error),
}

/// Which half of a 64-bit register a write targets.
#[derive(Clone, Copy, Debug)]
enum Half {
    Low,
    High,
}

/// One virtio device behind a virtio-mmio window.
pub struct MmioTransport {
    state: VirtioState,
    queue_sel: u32,
    /// The device's line (the same eventfd its [`VirtioInterrupt`] signals).
    irqfd: EventFd,
}

impl fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.state.device.device_type())
            .field("status", &self.state.status)
            .field("acked_features", &self.state.acked_features)
            .finish_non_exhaustive()
    }
}

impl MmioTransport {
    /// Wraps `device`; `mem` is the guest memory its queues live in (a clone is fine).
    pub fn new(mem: GuestMemoryMmap, device: Box<dyn VirtioDevice>) -> Result<Self, MmioError> {
        let mut queues = Vec::new();
        let mut kicks = Vec::new();
        for (index, &size) in device.queue_max_sizes().iter().enumerate() {
            queues.push(Queue::new(size).map_err(|_| MmioError::QueueSize { index, size })?);
            kicks.push(EventFd::new(EFD_NONBLOCK).map_err(MmioError::EventFd)?);
        }
        let irqfd = EventFd::new(EFD_NONBLOCK).map_err(MmioError::EventFd)?;
        let line = irqfd.try_clone().map_err(MmioError::EventFd)?;
        let interrupt = Arc::new(VirtioInterrupt::line(line));
        Ok(MmioTransport {
            irqfd,
            state: VirtioState::new(
                "virtio-mmio",
                TransportFeatures {
                    added: 0,
                    unsupported: 0,
                },
                mem,
                device,
                interrupt,
                queues,
                kicks,
            ),
            queue_sel: 0,
        })
    }

    /// The queue notification eventfds to register as KVM ioeventfds: for each queue, the
    /// eventfd, the guest physical address of QueueNotify (`mmio_base + 0x50`, 4-byte write)
    /// and the datamatch value (the queue index).
    pub fn ioeventfds(&self, mmio_base: u64) -> Vec<(&EventFd, u64, u32)> {
        self.state
            .kicks
            .iter()
            .zip(0u32..)
            .map(|(kick, index)| (kick, mmio_base + QUEUE_NOTIFY_OFFSET, index))
            .collect()
    }

    /// The eventfd to register as the KVM irqfd of the device's interrupt line.
    pub fn irqfd(&self) -> &EventFd {
        &self.irqfd
    }

    /// The device's interrupt line (InterruptStatus and DEVICE_NEEDS_RESET).
    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.state.interrupt
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.state.device.as_ref()
    }

    /// The Status register as the driver reads it.
    pub fn status(&self) -> u32 {
        self.state.status_register()
    }

    /// Stops the device's worker and resets the device, as if the driver wrote 0 to Status.
    /// Call at VMM exit (dropping the transport does the same).
    pub fn shutdown(&mut self) {
        self.reset();
    }

    fn read_register(&mut self, offset: u32) -> u32 {
        match offset {
            VIRTIO_MMIO_MAGIC_VALUE => MMIO_MAGIC_VALUE,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.state.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => MMIO_VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.state.device_features_sel {
                0 => self.state.offered_features() as u32,
                1 => (self.state.offered_features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size().into()),
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| q.ready().into()),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.state.interrupt.status(),
            VIRTIO_MMIO_STATUS => self.status(),
            // No shared memory regions: length and base read as all ones.
            VIRTIO_MMIO_SHM_LEN_LOW
            | VIRTIO_MMIO_SHM_LEN_HIGH
            | VIRTIO_MMIO_SHM_BASE_LOW
            | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            VIRTIO_MMIO_CONFIG_GENERATION => self.state.device.config_generation(),
            QUEUE_RESET_OFFSET => self.state.queue_reset_register(self.queue_sel as usize) as u32,
            _ => {
                self.state
                    .guest_warn(format_args!("read of unknown register {offset:#x}"));
                0
            }
        }
    }

    fn write_register(&mut self, offset: u32, value: u32) {
        match offset {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.state.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => {
                self.state.write_driver_features(value, "DriverFeatures")
            }
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.state.driver_features_sel = value,
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => self.write_queue_num(value),
            VIRTIO_MMIO_QUEUE_READY => self.write_queue_ready(value),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.state.notify(value.into()),
            VIRTIO_MMIO_INTERRUPT_ACK => self.state.interrupt.ack(value),
            VIRTIO_MMIO_STATUS => {
                if self.state.write_status(value) {
                    self.reset();
                }
            }
            VIRTIO_MMIO_QUEUE_DESC_LOW => self.write_ring_addr(RingPart::Desc, Half::Low, value),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => self.write_ring_addr(RingPart::Desc, Half::High, value),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => self.write_ring_addr(RingPart::Avail, Half::Low, value),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.write_ring_addr(RingPart::Avail, Half::High, value)
            }
            VIRTIO_MMIO_QUEUE_USED_LOW => self.write_ring_addr(RingPart::Used, Half::Low, value),
            VIRTIO_MMIO_QUEUE_USED_HIGH => self.write_ring_addr(RingPart::Used, Half::High, value),
            VIRTIO_MMIO_SHM_SEL => {}
            QUEUE_RESET_OFFSET => {
                self.state
                    .write_queue_reset(self.queue_sel as usize, value.into(), "QueueReset")
            }
            _ => self.state.guest_warn(format_args!(
                "write of {value:#x} to unknown or read-only register {offset:#x}"
            )),
        }
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.state.queues.get(self.queue_sel as usize)
    }

    fn write_queue_num(&mut self, value: u32) {
        let Some(queue) = self
            .state
            .configurable_queue(self.queue_sel as usize, "QueueNum")
        else {
            return;
        };
        let ok = u16::try_from(value)
            .ok()
            .is_some_and(|size| queue.try_set_size(size).is_ok());
        if !ok {
            self.state.guest_warn(format_args!(
                "QueueNum {value} refused (must be a power of two ≤ QueueNumMax)"
            ));
        }
    }

    fn write_queue_ready(&mut self, value: u32) {
        match value {
            0 | 1 => {
                self.state
                    .write_queue_enable(self.queue_sel as usize, value == 1, "QueueReady")
            }
            _ => self
                .state
                .guest_warn(format_args!("QueueReady {value} refused")),
        }
    }

    fn write_ring_addr(&mut self, part: RingPart, half: Half, value: u32) {
        self.state
            .write_ring_addr(self.queue_sel as usize, part, |old| match half {
                Half::Low => (old & !0xffff_ffff) | u64::from(value),
                Half::High => (old & 0xffff_ffff) | (u64::from(value) << 32),
            });
    }

    fn reset(&mut self) {
        self.state.reset();
        self.queue_sel = 0;
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.state
                .device
                .read_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            data.fill(0);
            let len = data.len();
            self.state.guest_warn(format_args!(
                "{len}-byte read at register offset {offset:#x} (registers are 4-byte aligned words)"
            ));
            return;
        }
        let value = self.read_register(offset as u32);
        data.copy_from_slice(&value.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.state
                .device
                .write_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            let len = data.len();
            self.state.guest_warn(format_args!(
                "{len}-byte write at register offset {offset:#x} (registers are 4-byte words)"
            ));
            return;
        };
        if !offset.is_multiple_of(4) {
            self.state
                .guest_warn(format_args!("misaligned register write at {offset:#x}"));
            return;
        }
        self.write_register(offset as u32, u32::from_le_bytes(bytes));
    }
}

impl Drop for MmioTransport {
    fn drop(&mut self) {
        self.state.device.reset();
    }
}

#[cfg(test)]
mod tests;
