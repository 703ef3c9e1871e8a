//! The modern virtio-pci transport (virtio 1.2 §4.1) with MSI-X, device side.
//!
//! [`VirtioPciTransport`] puts any [`super::VirtioDevice`] behind a PCI type-0 function:
//! vendor 0x1AF4, device 0x1040 + device type, revision 1, no legacy I/O BAR, no INTx pin.
//! Everything lives in BAR0, a 64-bit non-prefetchable memory BAR of [`BAR0_SIZE`] bytes:
//!
//! | offset            | structure                       | capability                   |
//! |-------------------|---------------------------------|------------------------------|
//! | [`COMMON_OFFSET`] | common configuration (0x40)     | `VIRTIO_PCI_CAP_COMMON_CFG`  |
//! | [`ISR_OFFSET`]    | ISR status (read clears)        | `VIRTIO_PCI_CAP_ISR_CFG`     |
//! | [`DEVICE_OFFSET`] | device configuration            | `VIRTIO_PCI_CAP_DEVICE_CFG`  |
//! | [`NOTIFY_OFFSET`] | one 4-byte notify slot per queue| `VIRTIO_PCI_CAP_NOTIFY_CFG`  |
//! | [`MSIX_TABLE_OFFSET`] | MSI-X table (queues + 1 vectors) | MSI-X                   |
//! | [`MSIX_PBA_OFFSET`]   | MSI-X PBA                    | MSI-X                        |
//!
//! plus a `VIRTIO_PCI_CAP_PCI_CFG` window in configuration space.
//!
//! # Wiring it into a VMM
//!
//! * Configuration space: the host bridge forwards the function's config accesses to
//!   [`PciDevice::read_config_register`] / [`PciDevice::write_config_register`]; the latter
//!   returns a [`BarMove`] when the guest moves BAR0, whereupon the VMM moves the MMIO range and
//!   the ioeventfds. Set the initial address with [`VirtioPciTransport::set_bar0_address`].
//! * BAR0 accesses go to the transport's [`crate::BusDevice`] implementation (offset relative
//!   to BAR0).
//! * Kicks: register every [`VirtioPciTransport::ioeventfds`] entry as a KVM ioeventfd without
//!   datamatch (length 0: any access size).
//! * Interrupts: allocate one GSI per MSI-X vector ([`VirtioPciTransport::msix_vectors`]),
//!   register each vector's [`msix::MsixVectors::irqfd`] on its GSI, and install a route
//!   handler ([`VirtioPciTransport::set_msix_route_handler`]) that rewrites the GSI's MSI route
//!   (`KVM_SET_GSI_ROUTING`) when called. The handler runs on the vCPU thread inside the
//!   config/BAR write, before a pending interrupt of that vector is fired.
//! * The device worker signals through the [`super::VirtioInterrupt`] it is handed at
//!   activation: `signal_queue(index)` fires that queue's vector lock-free (the net workers
//!   signal their own queues this way); `signal_used_queue()` fires every queue vector once.
//!
//! The `vmm` crate does all of this in `src/pci.rs`, with bus 0 and the host bridge of
//! [`crate::pci::bus`] on ports 0xCF8–0xCFF.

mod transport;

#[cfg(test)]
mod tests;

pub use crate::pci::{config, msix, BarMove, PciDevice};
pub use transport::{
    PciTransportError, VirtioPciTransport, TRANSPORT_FEATURES, UNSUPPORTED_TRANSPORT_FEATURES,
};

/// The virtio PCI vendor ID.
pub const VIRTIO_PCI_VENDOR_ID: u16 = 0x1af4;
/// Modern device IDs are this plus the virtio device type.
pub const VIRTIO_PCI_DEVICE_ID_BASE: u16 = 0x1040;
/// Revision ID of modern-only devices.
pub const VIRTIO_PCI_REVISION: u8 = 1;

/// `cfg_type`: common configuration.
pub const VIRTIO_PCI_CAP_COMMON_CFG: u8 = 1;
/// `cfg_type`: notifications.
pub const VIRTIO_PCI_CAP_NOTIFY_CFG: u8 = 2;
/// `cfg_type`: ISR status.
pub const VIRTIO_PCI_CAP_ISR_CFG: u8 = 3;
/// `cfg_type`: device-specific configuration.
pub const VIRTIO_PCI_CAP_DEVICE_CFG: u8 = 4;
/// `cfg_type`: PCI configuration access window.
pub const VIRTIO_PCI_CAP_PCI_CFG: u8 = 5;

/// Size of BAR0.
pub const BAR0_SIZE: u64 = 0x8000;
/// Common configuration in BAR0.
pub const COMMON_OFFSET: u64 = 0x0000;
/// Length of the common configuration structure (through `queue_reset` at 0x3a and the admin
/// queue fields, which read 0).
pub const COMMON_LEN: u64 = 0x40;
/// ISR status in BAR0.
pub const ISR_OFFSET: u64 = 0x1000;
/// Length of the ISR structure.
pub const ISR_LEN: u64 = 4;
/// Device configuration in BAR0.
pub const DEVICE_OFFSET: u64 = 0x2000;
/// Length of the device configuration window.
pub const DEVICE_LEN: u64 = 0x1000;
/// Notification area in BAR0; queue `i` is notified at `NOTIFY_OFFSET + 4 * i`.
pub const NOTIFY_OFFSET: u64 = 0x3000;
/// `notify_off_multiplier`.
pub const NOTIFY_OFF_MULTIPLIER: u32 = 4;
/// MSI-X table in BAR0.
pub const MSIX_TABLE_OFFSET: u64 = 0x4000;
/// MSI-X PBA in BAR0.
pub const MSIX_PBA_OFFSET: u64 = 0x5000;
/// The most queues a device may have (one MSI-X vector each plus config, in 4 KiB of table).
pub const MAX_QUEUES: usize = 255;

/// Class code for a virtio device type: network controller for net, mass storage for block,
/// "other" otherwise.
pub fn class_code(device_type: u32) -> u32 {
    match device_type {
        1 => 0x02_0000,
        2 => 0x01_8000,
        _ => 0xff_0000,
    }
}
