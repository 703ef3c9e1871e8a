//! Device models for `vmm`.
//!
//! Nothing in this crate knows KVM: devices are driven through [`BusDevice`] (the slow path of
//! vCPU port/MMIO exits) and signal the guest through eventfds that the VMM registers as irqfds.
//! Virtio queue notifications arrive on eventfds that the VMM registers as ioeventfds.

pub mod backend;
pub mod counters;
#[doc(hidden)]
pub mod fuzzing;
pub mod iovec;
pub mod legacy;
pub mod pci;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod virtio;

/// An error and its causes on one line (`error: cause: root cause`), for logs and messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A device that answers guest accesses to an address range (port I/O or MMIO).
///
/// `offset` is relative to the start of the range the device was registered at. The bus never
/// passes an access that crosses the end of the range. `data.len()` is 1, 2, 4 or 8.
pub trait BusDevice: Send {
    /// The guest reads `data.len()` bytes at `offset`; the device fills `data`.
    fn read(&mut self, offset: u64, data: &mut [u8]);
    /// The guest writes `data` at `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}
