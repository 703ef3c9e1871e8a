//! [`VirtioPciTransport`]: configuration space, BAR0 (common configuration, ISR, device
//! configuration, notifications, MSI-X) and the device lifecycle.

use std::fmt;
use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_ACCESS_PLATFORM;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::*;
use crate::pci::config::{PciConfigSpace, PciIds, PCI_CAP_ID_MSIX, PCI_CAP_ID_VNDR};
use crate::pci::msix::{
    MsiMessage, MsixTable, MsixVectors, MSIX_CTRL_ENABLE, MSIX_CTRL_FUNCTION_MASK,
};
use crate::virtio::common::{RingPart, TransportFeatures, VirtioState};
use crate::virtio::{VirtioDevice, VirtioInterrupt};
use crate::BusDevice;

/// Transport features not implemented here, never offered whatever the device says:
/// VIRTIO_F_NOTIF_CONFIG_DATA (39, `queue_notif_config_data`) and VIRTIO_F_ADMIN_VQ (41).
/// (VIRTIO_F_RING_RESET is offered when the device can reset a queue.)
pub const UNSUPPORTED_TRANSPORT_FEATURES: u64 = 1 << 39 | 1 << 41;

/// Transport features offered whatever the device: VIRTIO_F_ACCESS_PLATFORM. There is no
/// vIOMMU, so the addresses the driver gives (its DMA addresses) are guest-physical, as without
/// the feature; negotiating it makes Linux use its DMA API for the rings and buffers, which
/// AF_XDP zero-copy in virtio_net requires. A driver may decline it.
pub const TRANSPORT_FEATURES: u64 = 1 << VIRTIO_F_ACCESS_PLATFORM;

// Common configuration registers (struct virtio_pci_common_cfg).
const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const CONFIG_MSIX_VECTOR: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;
const QUEUE_RESET: u64 = 0x3a;

/// Offsets inside a `virtio_pci_cap` (from the capability ID byte).
const CAP_BAR: usize = 4;
const CAP_OFFSET: usize = 8;
const CAP_LENGTH: usize = 12;
/// `pci_cfg_data` in `virtio_pci_cfg_cap`.
const CAP_PCI_CFG_DATA: usize = 16;

/// Errors building a transport.
#[derive(Debug, thiserror::Error)]
pub enum PciTransportError {
    /// The device declared a queue size virtio-queue refuses.
    #[error("queue {index}: invalid maximum size {size}")]
    QueueSize {
        /// Queue index.
        index: usize,
        /// The refused size.
        size: u16,
    },
    /// The device has no queue or more than [`MAX_QUEUES`].
    #[error("{0} queues (1..=255 supported)")]
    QueueCount(usize),
    /// Creating an eventfd failed.
    #[error("failed to create an eventfd")]
    EventFd(#[source] std::io::Error),
}

/// One virtio device behind a modern virtio-pci function.
pub struct VirtioPciTransport {
    state: VirtioState,
    msix: MsixTable,
    config: PciConfigSpace,
    msix_cap: usize,
    pci_cfg_cap: usize,
    bar0_reported: u64,
    queue_sel: u16,
}

impl fmt::Debug for VirtioPciTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VirtioPciTransport")
            .field("device_type", &self.state.device.device_type())
            .field("status", &self.state.status)
            .field("acked_features", &self.state.acked_features)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A `virtio_pci_cap` body (after ID and next): cap_len, cfg_type, bar, id, padding, offset,
/// length, then `extra`.
fn virtio_cap(cfg_type: u8, offset: u64, length: u64, extra: &[u8]) -> Vec<u8> {
    let cap_len = 16 + extra.len() as u8;
    let mut body = vec![cap_len, cfg_type, 0, 0, 0, 0];
    body.extend_from_slice(&(offset as u32).to_le_bytes());
    body.extend_from_slice(&(length as u32).to_le_bytes());
    body.extend_from_slice(extra);
    body
}

/// The function's configuration space for a device of `device_type` with `queues` queues:
/// its IDs, BAR0, and the capability list (the five virtio structures and MSI-X). Returns it
/// with the offsets of the MSI-X and `VIRTIO_PCI_CAP_PCI_CFG` capabilities.
fn config_space(
    device_type: u32,
    queues: usize,
    msix: &MsixTable,
) -> (PciConfigSpace, usize, usize) {
    let ids = PciIds {
        vendor: VIRTIO_PCI_VENDOR_ID,
        device: VIRTIO_PCI_DEVICE_ID_BASE.wrapping_add(device_type as u16),
        revision: VIRTIO_PCI_REVISION,
        class: class_code(device_type),
        subsystem_vendor: VIRTIO_PCI_VENDOR_ID,
        subsystem: device_type as u16,
    };
    let mut config = PciConfigSpace::new(ids, BAR0_SIZE, false);
    let notify_len = queues as u64 * u64::from(NOTIFY_OFF_MULTIPLIER);
    // The capability list; the 40-odd bytes of six capabilities always fit in 192.
    let mut add = |id: u8, body: Vec<u8>, writable: &[u8]| {
        config
            .add_capability(id, &body, writable)
            .expect("the capabilities fit in configuration space")
    };
    add(
        PCI_CAP_ID_VNDR,
        virtio_cap(VIRTIO_PCI_CAP_COMMON_CFG, COMMON_OFFSET, COMMON_LEN, &[]),
        &[],
    );
    add(
        PCI_CAP_ID_VNDR,
        virtio_cap(
            VIRTIO_PCI_CAP_NOTIFY_CFG,
            NOTIFY_OFFSET,
            notify_len,
            &NOTIFY_OFF_MULTIPLIER.to_le_bytes(),
        ),
        &[],
    );
    add(
        PCI_CAP_ID_VNDR,
        virtio_cap(VIRTIO_PCI_CAP_ISR_CFG, ISR_OFFSET, ISR_LEN, &[]),
        &[],
    );
    add(
        PCI_CAP_ID_VNDR,
        virtio_cap(VIRTIO_PCI_CAP_DEVICE_CFG, DEVICE_OFFSET, DEVICE_LEN, &[]),
        &[],
    );
    // virtio_pci_cfg_cap: bar, offset and length are the driver's; pci_cfg_data is the
    // window (handled by the transport, not stored).
    let mut pci_cfg_writable = vec![0u8; 14];
    pci_cfg_writable[CAP_BAR - 2] = 0xff;
    pci_cfg_writable[CAP_OFFSET - 2..CAP_OFFSET + 2].fill(0xff);
    pci_cfg_writable[CAP_LENGTH - 2..CAP_LENGTH + 2].fill(0xff);
    let pci_cfg_cap = add(
        PCI_CAP_ID_VNDR,
        virtio_cap(VIRTIO_PCI_CAP_PCI_CFG, 0, 0, &[0; 4]),
        &pci_cfg_writable,
    );
    let mut msix_body = Vec::new();
    msix_body.extend_from_slice(&msix.message_control().to_le_bytes());
    msix_body.extend_from_slice(&(MSIX_TABLE_OFFSET as u32).to_le_bytes()); // BIR 0
    msix_body.extend_from_slice(&(MSIX_PBA_OFFSET as u32).to_le_bytes()); // BIR 0
    let ctrl_writable = (MSIX_CTRL_ENABLE | MSIX_CTRL_FUNCTION_MASK).to_le_bytes();
    let msix_cap = add(PCI_CAP_ID_MSIX, msix_body, &ctrl_writable);
    (config, msix_cap, pci_cfg_cap)
}

impl VirtioPciTransport {
    /// Wraps `device`; `mem` is the guest memory its queues live in (a clone is fine). BAR0
    /// starts at address 0 until [`Self::set_bar0_address`].
    pub fn new(
        mem: GuestMemoryMmap,
        device: Box<dyn VirtioDevice>,
    ) -> Result<Self, PciTransportError> {
        let sizes = device.queue_max_sizes().to_vec();
        if sizes.is_empty() || sizes.len() > MAX_QUEUES {
            return Err(PciTransportError::QueueCount(sizes.len()));
        }
        let mut queues = Vec::new();
        let mut kicks = Vec::new();
        for (index, &size) in sizes.iter().enumerate() {
            queues
                .push(Queue::new(size).map_err(|_| PciTransportError::QueueSize { index, size })?);
            kicks.push(EventFd::new(EFD_NONBLOCK).map_err(PciTransportError::EventFd)?);
        }
        let num_vectors = sizes.len() as u16 + 1;
        let vectors = Arc::new(
            MsixVectors::new(num_vectors, sizes.len()).map_err(PciTransportError::EventFd)?,
        );
        let interrupt = Arc::new(VirtioInterrupt::with_msix(vectors.clone()));
        let msix = MsixTable::new(vectors);

        let (config, msix_cap, pci_cfg_cap) =
            config_space(device.device_type(), sizes.len(), &msix);
        Ok(VirtioPciTransport {
            state: VirtioState::new(
                "virtio-pci",
                TransportFeatures {
                    added: TRANSPORT_FEATURES,
                    unsupported: UNSUPPORTED_TRANSPORT_FEATURES,
                },
                mem,
                device,
                interrupt,
                queues,
                kicks,
            ),
            msix,
            config,
            msix_cap,
            pci_cfg_cap,
            bar0_reported: 0,
            queue_sel: 0,
        })
    }

    /// Places BAR0 at `address` (host side, before the guest runs; aligned down to the size).
    pub fn set_bar0_address(&mut self, address: u64) {
        self.config.set_bar0_address(address);
        self.bar0_reported = self.config.bar0_address();
    }

    /// BAR0's current address.
    pub fn bar0_address(&self) -> u64 {
        self.config.bar0_address()
    }

    /// The configuration space (read-only view).
    pub fn config_space(&self) -> &PciConfigSpace {
        &self.config
    }

    /// The queue notification eventfds to register as KVM ioeventfds: for each queue, the
    /// eventfd, its notify address (`bar0_base + NOTIFY_OFFSET + 4 * index`) and the access
    /// length to match, 0 meaning any (no datamatch).
    pub fn ioeventfds(&self, bar0_base: u64) -> Vec<(&EventFd, u64, u32)> {
        self.state
            .kicks
            .iter()
            .zip(0u64..)
            .map(|(kick, index)| {
                let addr = bar0_base + NOTIFY_OFFSET + index * u64::from(NOTIFY_OFF_MULTIPLIER);
                (kick, addr, 0)
            })
            .collect()
    }

    /// The MSI-X vectors (their irqfds, masks, pending bits and the queue → vector mapping).
    pub fn msix_vectors(&self) -> &Arc<MsixVectors> {
        self.msix.vectors()
    }

    /// The MSI-X table (messages, enable, function mask).
    pub fn msix_table(&self) -> &MsixTable {
        &self.msix
    }

    /// Installs the handler called with (vector, message) whenever a vector's GSI route must
    /// change (see [`super::msix`]); changes queued before are passed at once.
    pub fn set_msix_route_handler(&mut self, handler: super::msix::RouteHandler) {
        self.msix.set_route_handler(handler);
    }

    /// Route changes queued since the last call, when no handler is installed.
    pub fn take_route_changes(&mut self) -> Vec<(u16, MsiMessage)> {
        self.msix.take_route_changes()
    }

    /// The device's interrupt (ISR bits, DEVICE_NEEDS_RESET, MSI-X vectors).
    pub fn interrupt(&self) -> &Arc<VirtioInterrupt> {
        &self.state.interrupt
    }

    /// The device.
    pub fn device(&self) -> &dyn VirtioDevice {
        self.state.device.as_ref()
    }

    /// The device status as the driver reads it.
    pub fn status(&self) -> u32 {
        self.state.status_register()
    }

    /// The features the driver acknowledged.
    pub fn acked_features(&self) -> u64 {
        self.state.acked_features
    }

    /// Stops the device's worker and resets the device, as if the driver wrote 0 to
    /// device_status. Call at VMM exit (dropping the transport does the same).
    pub fn shutdown(&mut self) {
        self.reset();
    }

    // ---- configuration space ----

    /// The `pci_cfg_data` access the driver set up, if `offset`/`len` is exactly it:
    /// the BAR0 offset and length.
    fn pci_cfg_window(&self, offset: u64, len: usize) -> Option<(u64, usize)> {
        if offset != (self.pci_cfg_cap + CAP_PCI_CFG_DATA) as u64 {
            return None;
        }
        let bar = self.config.read_u8(self.pci_cfg_cap + CAP_BAR);
        let bar_off = u64::from(self.config.read_u32(self.pci_cfg_cap + CAP_OFFSET));
        let bar_len = self.config.read_u32(self.pci_cfg_cap + CAP_LENGTH) as usize;
        let ok = bar == 0
            && matches!(bar_len, 1 | 2 | 4)
            && len == bar_len
            && bar_off.is_multiple_of(bar_len as u64)
            && bar_off + bar_len as u64 <= BAR0_SIZE;
        ok.then_some((bar_off, bar_len))
    }

    fn overlaps(offset: u64, len: usize, start: usize, end: usize) -> bool {
        offset < end as u64 && offset.saturating_add(len as u64) > start as u64
    }

    // ---- common configuration ----

    fn selected_queue(&self) -> Option<&Queue> {
        self.state.queues.get(usize::from(self.queue_sel))
    }

    fn read_common(&mut self, offset: u64, len: usize) -> Option<u64> {
        if (offset, len) == (QUEUE_RESET, 2) {
            return Some(self.state.queue_reset_register(usize::from(self.queue_sel)));
        }
        let q = self.selected_queue();
        let value = match (offset, len) {
            (DEVICE_FEATURE_SELECT, 4) => u64::from(self.state.device_features_sel),
            (DEVICE_FEATURE, 4) => match self.state.device_features_sel {
                0 => self.state.offered_features() & 0xffff_ffff,
                1 => self.state.offered_features() >> 32,
                _ => 0,
            },
            (DRIVER_FEATURE_SELECT, 4) => u64::from(self.state.driver_features_sel),
            (DRIVER_FEATURE, 4) => match self.state.driver_features_sel {
                0 => self.state.acked_features & 0xffff_ffff,
                1 => self.state.acked_features >> 32,
                _ => 0,
            },
            (CONFIG_MSIX_VECTOR, 2) => u64::from(self.msix.vectors().config_vector()),
            (NUM_QUEUES, 2) => self.state.queues.len() as u64,
            (DEVICE_STATUS, 1) => u64::from(self.status() as u8),
            (CONFIG_GENERATION, 1) => u64::from(self.state.device.config_generation() as u8),
            (QUEUE_SELECT, 2) => u64::from(self.queue_sel),
            (QUEUE_SIZE, 2) => q.map_or(0, |q| q.size().into()),
            (QUEUE_MSIX_VECTOR, 2) => u64::from(
                self.msix
                    .vectors()
                    .queue_vector(usize::from(self.queue_sel)),
            ),
            (QUEUE_ENABLE, 2) => q.map_or(0, |q| q.ready().into()),
            (QUEUE_NOTIFY_OFF, 2) => q.map_or(0, |_| u64::from(self.queue_sel)),
            (QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE, 8)
            | (QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE, 4) => q.map_or(0, |q| match offset {
                QUEUE_DESC => q.desc_table(),
                QUEUE_DRIVER => q.avail_ring(),
                _ => q.used_ring(),
            }),
            (0x24 | 0x2c | 0x34, 4) => q.map_or(0, |q| {
                (match offset {
                    0x24 => q.desc_table(),
                    0x2c => q.avail_ring(),
                    _ => q.used_ring(),
                }) >> 32
            }),
            // queue_notif_config_data, admin_queue_index, admin_queue_num.
            (0x38 | 0x3c | 0x3e, 2) => 0,
            _ => return None,
        };
        let value = if len == 4 && matches!(offset, QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE) {
            value & 0xffff_ffff
        } else {
            value
        };
        Some(value)
    }

    fn write_common(&mut self, offset: u64, len: usize, value: u64) {
        match (offset, len) {
            (DEVICE_FEATURE_SELECT, 4) => self.state.device_features_sel = value as u32,
            (DRIVER_FEATURE_SELECT, 4) => self.state.driver_features_sel = value as u32,
            (DRIVER_FEATURE, 4) => self
                .state
                .write_driver_features(value as u32, "driver_feature"),
            (CONFIG_MSIX_VECTOR, 2) => {
                let stored = self.msix.vectors().set_config_vector(value as u16);
                if stored != value as u16 {
                    self.state
                        .guest_warn(format_args!("config_msix_vector {value} out of range"));
                }
            }
            (DEVICE_STATUS, 1) => {
                if self.state.write_status(value as u32) {
                    self.reset();
                }
            }
            (QUEUE_SELECT, 2) => self.queue_sel = value as u16,
            (QUEUE_SIZE, 2) => self.write_queue_size(value as u16),
            (QUEUE_MSIX_VECTOR, 2) => self.write_queue_vector(value as u16),
            (QUEUE_ENABLE, 2) => self.write_queue_enable(value as u16),
            (QUEUE_RESET, 2) => {
                self.state
                    .write_queue_reset(usize::from(self.queue_sel), value, "queue_reset")
            }
            (QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE, 8) => {
                self.write_ring_addr(offset, |_| value)
            }
            (QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE, 4) => {
                self.write_ring_addr(offset, |old| (old & !0xffff_ffff) | value)
            }
            (0x24 | 0x2c | 0x34, 4) => {
                self.write_ring_addr(offset - 4, |old| (old & 0xffff_ffff) | (value << 32))
            }
            _ => self.state.guest_warn(format_args!(
                "{len}-byte write of {value:#x} to read-only, unknown or misaligned common \
                 configuration offset {offset:#x}"
            )),
        }
    }

    fn write_queue_size(&mut self, value: u16) {
        let Some(queue) = self
            .state
            .configurable_queue(usize::from(self.queue_sel), "queue_size")
        else {
            return;
        };
        if queue.try_set_size(value).is_err() {
            self.state.guest_warn(format_args!(
                "queue_size {value} refused (must be a power of two ≤ the maximum)"
            ));
        }
    }

    fn write_queue_vector(&mut self, value: u16) {
        let sel = usize::from(self.queue_sel);
        if sel >= self.state.queues.len() {
            self.state.guest_warn(format_args!(
                "queue_msix_vector written for nonexistent queue {sel}"
            ));
            return;
        }
        // A vector past the table reads back as NO_VECTOR: the driver's check of the mapping.
        if self.msix.vectors().set_queue_vector(sel, value) != value {
            self.state
                .guest_warn(format_args!("queue_msix_vector {value} out of range"));
        }
    }

    fn write_queue_enable(&mut self, value: u16) {
        if value == 1 {
            // Before DRIVER_OK: the queue is ready; after, a reset queue starts again.
            self.state
                .write_queue_enable(usize::from(self.queue_sel), true, "queue_enable");
        } else {
            // The driver must not write 0 (a queue is disabled by a (queue) reset).
            self.state
                .guest_warn(format_args!("queue_enable {value} refused"));
        }
    }

    fn write_ring_addr(&mut self, offset: u64, new: impl FnOnce(u64) -> u64) {
        let part = match offset {
            QUEUE_DESC => RingPart::Desc,
            QUEUE_DRIVER => RingPart::Avail,
            _ => RingPart::Used,
        };
        self.state
            .write_ring_addr(usize::from(self.queue_sel), part, new);
    }

    fn reset(&mut self) {
        self.state.reset();
        // The MSI-X table and capability are PCI state and survive a virtio reset; the queue
        // and config vector assignments and pending interrupts do not.
        self.msix.vectors().reset_signals();
        self.queue_sel = 0;
    }

    // ---- BAR0 regions ----

    fn notify(&mut self, offset: u64) {
        self.state.notify(offset / u64::from(NOTIFY_OFF_MULTIPLIER));
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        let len = data.len();
        match offset {
            o if o < COMMON_OFFSET + COMMON_LEN => {
                data.fill(0);
                if len > 8 {
                    return;
                }
                match self.read_common(o - COMMON_OFFSET, len) {
                    Some(v) => data.copy_from_slice(&v.to_le_bytes()[..len]),
                    None => self.state.guest_warn(format_args!(
                        "{len}-byte read at unknown or misaligned common configuration offset {o:#x}"
                    )),
                }
            }
            o if (ISR_OFFSET..ISR_OFFSET + ISR_LEN).contains(&o) => {
                data.fill(0);
                if o == ISR_OFFSET && len > 0 {
                    // Read to clear: the bits returned are the bits acknowledged.
                    let isr = self.state.interrupt.status();
                    self.state.interrupt.ack(isr);
                    data[0] = isr as u8;
                }
            }
            o if (DEVICE_OFFSET..DEVICE_OFFSET + DEVICE_LEN).contains(&o) => {
                self.state.device.read_config(o - DEVICE_OFFSET, data)
            }
            o if (MSIX_TABLE_OFFSET..MSIX_TABLE_OFFSET + self.msix.table_size()).contains(&o) => {
                self.msix.read_table(o - MSIX_TABLE_OFFSET, data)
            }
            o if (MSIX_PBA_OFFSET..MSIX_PBA_OFFSET + self.msix.pba_size()).contains(&o) => {
                self.msix.read_pba(o - MSIX_PBA_OFFSET, data)
            }
            // The notification area and the gaps read as 0.
            _ => data.fill(0),
        }
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        let len = data.len();
        let notify_len = self.state.kicks.len() as u64 * u64::from(NOTIFY_OFF_MULTIPLIER);
        match offset {
            o if o < COMMON_OFFSET + COMMON_LEN => {
                if len > 8 {
                    return self
                        .state
                        .guest_warn(format_args!("{len}-byte common configuration write"));
                }
                let mut bytes = [0u8; 8];
                bytes[..len].copy_from_slice(data);
                self.write_common(o - COMMON_OFFSET, len, u64::from_le_bytes(bytes));
            }
            o if (DEVICE_OFFSET..DEVICE_OFFSET + DEVICE_LEN).contains(&o) => {
                self.state.device.write_config(o - DEVICE_OFFSET, data)
            }
            o if (NOTIFY_OFFSET..NOTIFY_OFFSET + notify_len).contains(&o) => {
                self.notify(o - NOTIFY_OFFSET)
            }
            o if (MSIX_TABLE_OFFSET..MSIX_TABLE_OFFSET + self.msix.table_size()).contains(&o) => {
                if !self.msix.write_table(o - MSIX_TABLE_OFFSET, data) {
                    self.state.guest_warn(format_args!(
                        "{len}-byte MSI-X table write at {o:#x} ignored (aligned dwords or qwords)"
                    ));
                }
            }
            o => self.state.guest_warn(format_args!(
                "{len}-byte write to read-only or unused BAR0 offset {o:#x}"
            )),
        }
    }
}

/// BAR0 accesses (offsets relative to BAR0). While the guest has memory space disabled in
/// Command, the function does not decode them: reads return all ones (a master abort), writes
/// are dropped. (Kicks registered as ioeventfds are KVM's and still land.)
impl BusDevice for VirtioPciTransport {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        if !self.config.memory_enabled() {
            data.fill(0xff);
            return;
        }
        self.bar_read(offset, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if !self.config.memory_enabled() {
            let len = data.len();
            self.state.guest_warn(format_args!(
                "{len}-byte BAR0 write at {offset:#x} with memory space disabled"
            ));
            return;
        }
        self.bar_write(offset, data);
    }
}

impl PciDevice for VirtioPciTransport {
    fn read_config_register(&mut self, offset: u64, data: &mut [u8]) {
        if let Some((bar_off, _)) = self.pci_cfg_window(offset, data.len()) {
            self.bar_read(bar_off, data);
            return;
        }
        self.config.read(offset, data);
        // Message Control lives in the table (it has the enable and mask in force).
        let ctrl_at = self.msix_cap + 2;
        let ctrl = self.msix.message_control().to_le_bytes();
        for (i, b) in data.iter_mut().enumerate() {
            let at = offset.saturating_add(i as u64);
            if at == ctrl_at as u64 || at == ctrl_at as u64 + 1 {
                *b = ctrl[(at - ctrl_at as u64) as usize];
            }
        }
    }

    fn write_config_register(&mut self, offset: u64, data: &[u8]) -> Option<BarMove> {
        if let Some((bar_off, _)) = self.pci_cfg_window(offset, data.len()) {
            self.bar_write(bar_off, data);
            return None;
        }
        self.config.write(offset, data);
        let len = data.len();
        let ctrl_at = self.msix_cap + 2;
        if Self::overlaps(offset, len, ctrl_at, ctrl_at + 2) {
            let ctrl = self.config.read_u16(ctrl_at);
            self.msix.write_message_control(ctrl);
        }
        let bar = super::config::PCI_BAR0;
        if Self::overlaps(offset, len, bar, bar + 8) {
            // A sizing write (all ones) is not a move; the restore that follows is compared
            // with the last address reported.
            let sizing = data.iter().all(|&b| b == 0xff);
            let new = self.config.bar0_address();
            if !sizing && new != self.bar0_reported {
                let old = std::mem::replace(&mut self.bar0_reported, new);
                return Some(BarMove {
                    bar: 0,
                    old,
                    new,
                    size: BAR0_SIZE,
                });
            }
        }
        None
    }

    fn bar0(&self) -> (u64, u64) {
        (self.config.bar0_address(), BAR0_SIZE)
    }
}

impl Drop for VirtioPciTransport {
    fn drop(&mut self) {
        self.state.device.reset();
    }
}
