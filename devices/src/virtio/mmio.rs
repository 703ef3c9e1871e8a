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

use log::{error, warn};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::{GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::common::{self, ActivationProblem, StatusChange};
use super::{ActivationContext, VirtioDevice, VirtioInterrupt};
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

/// Warnings about guest misbehaviour logged per transport before going quiet.
const MAX_GUEST_WARNINGS: u32 = 32;

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

/// Which ring address register pair a write targets.
#[derive(Clone, Copy, Debug)]
enum RingPart {
    Desc,
    Avail,
    Used,
}

/// Which half of a 64-bit register a write targets.
#[derive(Clone, Copy, Debug)]
enum Half {
    Low,
    High,
}

/// One virtio device behind a virtio-mmio window.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: GuestMemoryMmap,
    interrupt: Arc<VirtioInterrupt>,
    queues: Vec<Queue>,
    kicks: Vec<EventFd>,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    guest_warnings: u32,
}

impl fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_type", &self.device.device_type())
            .field("status", &self.status)
            .field("acked_features", &self.acked_features)
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
        let interrupt = Arc::new(VirtioInterrupt::new().map_err(MmioError::EventFd)?);
        Ok(MmioTransport {
            device,
            mem,
            interrupt,
            queues,
            kicks,
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            guest_warnings: 0,
        })
    }

    /// The queue notification eventfds to register as KVM ioeventfds: for each queue, the
    /// eventfd, the guest physical address of QueueNotify (`mmio_base + 0x50`, 4-byte write)
    /// and the datamatch value (the queue index).
    pub fn ioeventfds(&self, mmio_base: u64) -> Vec<(&EventFd, u64, u32)> {
        self.kicks
            .iter()
            .zip(0u32..)
            .map(|(kick, index)| (kick, mmio_base + QUEUE_NOTIFY_OFFSET, index))
            .collect()
    }

    /// The eventfd to register as the KVM irqfd of the device's interrupt line.
    pub fn irqfd(&self) -> &EventFd {
        self.interrupt.irqfd()
    }

    /// The device's interrupt line (InterruptStatus and DEVICE_NEEDS_RESET).
    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.interrupt
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.device.as_ref()
    }

    /// The Status register as the driver reads it.
    pub fn status(&self) -> u32 {
        if self.interrupt.needs_reset() {
            self.status | VIRTIO_CONFIG_S_NEEDS_RESET
        } else {
            self.status
        }
    }

    /// Stops the device's worker and resets the device, as if the driver wrote 0 to Status.
    /// Call at VMM exit (dropping the transport does the same).
    pub fn shutdown(&mut self) {
        self.reset();
    }

    fn guest_warn(&mut self, args: fmt::Arguments<'_>) {
        self.guest_warnings = self.guest_warnings.saturating_add(1);
        let dev = self.name();
        if self.guest_warnings <= MAX_GUEST_WARNINGS {
            warn!("{dev}: {args}");
        } else if self.guest_warnings == MAX_GUEST_WARNINGS + 1 {
            warn!("{dev}: further guest errors are not logged");
        }
    }

    /// "virtio-mmio LABEL (device type N)" for log lines.
    fn name(&self) -> String {
        format!(
            "virtio-mmio {} (device type {})",
            self.device.label(),
            self.device.device_type()
        )
    }

    fn has(&self, bits: u32) -> bool {
        self.status & bits == bits
    }

    fn read_register(&mut self, offset: u32) -> u32 {
        match offset {
            VIRTIO_MMIO_MAGIC_VALUE => MMIO_MAGIC_VALUE,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => MMIO_VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| q.max_size().into()),
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| q.ready().into()),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt.status(),
            VIRTIO_MMIO_STATUS => self.status(),
            // No shared memory regions: length and base read as all ones.
            VIRTIO_MMIO_SHM_LEN_LOW
            | VIRTIO_MMIO_SHM_LEN_HIGH
            | VIRTIO_MMIO_SHM_BASE_LOW
            | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            VIRTIO_MMIO_CONFIG_GENERATION => self.device.config_generation(),
            _ => {
                self.guest_warn(format_args!("read of unknown register {offset:#x}"));
                0
            }
        }
    }

    fn write_register(&mut self, offset: u32, value: u32) {
        match offset {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM => self.write_queue_num(value),
            VIRTIO_MMIO_QUEUE_READY => self.write_queue_ready(value),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt.ack(value),
            VIRTIO_MMIO_STATUS => self.write_status(value),
            VIRTIO_MMIO_QUEUE_DESC_LOW => self.write_ring_addr(RingPart::Desc, Half::Low, value),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => self.write_ring_addr(RingPart::Desc, Half::High, value),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => self.write_ring_addr(RingPart::Avail, Half::Low, value),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => {
                self.write_ring_addr(RingPart::Avail, Half::High, value)
            }
            VIRTIO_MMIO_QUEUE_USED_LOW => self.write_ring_addr(RingPart::Used, Half::Low, value),
            VIRTIO_MMIO_QUEUE_USED_HIGH => self.write_ring_addr(RingPart::Used, Half::High, value),
            VIRTIO_MMIO_SHM_SEL => {}
            _ => self.guest_warn(format_args!(
                "write of {value:#x} to unknown or read-only register {offset:#x}"
            )),
        }
    }

    fn selected_queue(&self) -> Option<&Queue> {
        self.queues.get(self.queue_sel as usize)
    }

    /// The selected queue, if its configuration may be written now (after FEATURES_OK,
    /// before DRIVER_OK); warns otherwise.
    fn configurable_queue(&mut self, what: &str) -> Option<&mut Queue> {
        if !self.has(VIRTIO_CONFIG_S_FEATURES_OK) || self.has(VIRTIO_CONFIG_S_DRIVER_OK) {
            let status = self.status;
            self.guest_warn(format_args!(
                "{what} written in status {status:#x} (allowed after FEATURES_OK, before DRIVER_OK)"
            ));
            return None;
        }
        let sel = self.queue_sel;
        if self.queues.get(sel as usize).is_none() {
            self.guest_warn(format_args!("{what} written for nonexistent queue {sel}"));
            return None;
        }
        self.queues.get_mut(sel as usize)
    }

    fn write_driver_features(&mut self, value: u32) {
        if !self.has(VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER)
            || self.has(VIRTIO_CONFIG_S_FEATURES_OK)
        {
            let status = self.status;
            self.guest_warn(format_args!(
                "DriverFeatures written in status {status:#x} (allowed after DRIVER, before FEATURES_OK)"
            ));
            return;
        }
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(value),
            1 => {
                self.acked_features = (self.acked_features & 0xffff_ffff) | (u64::from(value) << 32)
            }
            sel => self.guest_warn(format_args!("DriverFeatures written with selector {sel}")),
        }
    }

    fn write_queue_num(&mut self, value: u32) {
        let Some(queue) = self.configurable_queue("QueueNum") else {
            return;
        };
        let ok = u16::try_from(value)
            .ok()
            .is_some_and(|size| queue.try_set_size(size).is_ok());
        if !ok {
            self.guest_warn(format_args!(
                "QueueNum {value} refused (must be a power of two ≤ QueueNumMax)"
            ));
        }
    }

    fn write_queue_ready(&mut self, value: u32) {
        let Some(queue) = self.configurable_queue("QueueReady") else {
            return;
        };
        match value {
            0 => queue.set_ready(false),
            1 => queue.set_ready(true),
            _ => self.guest_warn(format_args!("QueueReady {value} refused")),
        }
    }

    fn write_ring_addr(&mut self, part: RingPart, half: Half, value: u32) {
        let Some(queue) = self.configurable_queue("a queue address register") else {
            return;
        };
        let old = match part {
            RingPart::Desc => queue.desc_table(),
            RingPart::Avail => queue.avail_ring(),
            RingPart::Used => queue.used_ring(),
        };
        let addr = GuestAddress(match half {
            Half::Low => (old & !0xffff_ffff) | u64::from(value),
            Half::High => (old & 0xffff_ffff) | (u64::from(value) << 32),
        });
        let result = match part {
            RingPart::Desc => queue.try_set_desc_table_address(addr),
            RingPart::Avail => queue.try_set_avail_ring_address(addr),
            RingPart::Used => queue.try_set_used_ring_address(addr),
        };
        if result.is_err() {
            self.guest_warn(format_args!(
                "{part:?} ring address {:#x} refused (misaligned)",
                addr.0
            ));
        }
    }

    fn notify(&mut self, value: u32) {
        match self.kicks.get(value as usize) {
            Some(kick) => {
                if let Err(e) = kick.write(1) {
                    error!(
                        "{}: failed to signal queue {value}'s kick eventfd: {e}",
                        self.name()
                    );
                }
            }
            None => self.guest_warn(format_args!("QueueNotify for nonexistent queue {value}")),
        }
    }

    fn write_status(&mut self, value: u32) {
        let offered = self.device.features();
        let acked = self.acked_features;
        let change = common::write_status(self.status, value, || {
            common::check_features(self.device.as_ref(), offered, acked)
        });
        match change {
            StatusChange::Reset => self.reset(),
            StatusChange::Update {
                status,
                activate,
                warning,
            } => {
                self.status = status;
                if activate {
                    self.activate();
                }
                if let Some(w) = warning {
                    self.guest_warn(format_args!("{w}"));
                }
            }
        }
    }

    fn activate(&mut self) {
        let in_use = self.device.queues_in_use(self.acked_features);
        let prepared = common::activation_queues(
            &self.mem,
            &self.queues,
            &self.kicks,
            in_use,
            self.acked_features,
        );
        let (queues, kicks) = match prepared {
            Ok(q) => q,
            Err(ActivationProblem::Guest(why)) => {
                self.guest_warn(format_args!("{why}"));
                return self.fail_activation();
            }
            Err(ActivationProblem::Host(why)) => {
                error!("{}: {why}", self.name());
                return self.fail_activation();
            }
        };
        let ctx = ActivationContext {
            mem: self.mem.clone(),
            queues,
            kicks,
            interrupt: self.interrupt.clone(),
            acked_features: self.acked_features,
        };
        if let Err(e) = self.device.activate(ctx) {
            error!("{}: activation failed: {e}", self.name());
            self.fail_activation();
        }
    }

    fn fail_activation(&mut self) {
        if let Err(e) = self.interrupt.set_needs_reset() {
            error!("{}: failed to signal DEVICE_NEEDS_RESET: {e}", self.name());
        }
    }

    fn reset(&mut self) {
        self.device.reset();
        for queue in &mut self.queues {
            queue.reset();
        }
        for kick in &self.kicks {
            // A WouldBlock only means no stale kick was pending.
            let _ = kick.read();
        }
        self.interrupt.reset();
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
    }
}

impl BusDevice for MmioTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.read_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        if data.len() != 4 || !offset.is_multiple_of(4) {
            data.fill(0);
            let len = data.len();
            self.guest_warn(format_args!(
                "{len}-byte read at register offset {offset:#x} (registers are 4-byte aligned words)"
            ));
            return;
        }
        let value = self.read_register(offset as u32);
        data.copy_from_slice(&value.to_le_bytes());
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset >= CONFIG_SPACE_OFFSET {
            self.device.write_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            let len = data.len();
            self.guest_warn(format_args!(
                "{len}-byte write at register offset {offset:#x} (registers are 4-byte words)"
            ));
            return;
        };
        if !offset.is_multiple_of(4) {
            self.guest_warn(format_args!("misaligned register write at {offset:#x}"));
            return;
        }
        self.write_register(offset as u32, u32::from_le_bytes(bytes));
    }
}

impl Drop for MmioTransport {
    fn drop(&mut self) {
        self.device.reset();
    }
}

#[cfg(test)]
mod tests;
