//! PCI, independent of virtio: bus 0 behind configuration mechanism #1 and its host bridge
//! ([`bus`]), a type-0 function's configuration space with its capability list ([`config`]),
//! and MSI-X tables with one irqfd per vector ([`msix`]). The virtio-pci transport
//! (`crate::virtio::pci`) builds on these; nothing here knows virtio.

pub mod bus;
pub mod config;
pub mod msix;

/// BAR0 moved (the guest reprogrammed it): the VMM moves the MMIO range and ioeventfds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarMove {
    /// BAR index (always 0 here).
    pub bar: u8,
    /// The previous address.
    pub old: u64,
    /// The new address.
    pub new: u64,
    /// The BAR's size.
    pub size: u64,
}

/// A PCI function as the host bridge sees it.
pub trait PciDevice: Send {
    /// The guest reads configuration space (`offset` < 256; bytes past it read 0).
    fn read_config_register(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes configuration space. Returns the BAR move it caused, if any.
    fn write_config_register(&mut self, offset: u64, data: &[u8]) -> Option<BarMove>;
    /// BAR0's address and size.
    fn bar0(&self) -> (u64, u64);
}
