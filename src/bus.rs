//! Slow-path dispatch of vCPU port-I/O and MMIO exits to devices by address range.
//!
//! Virtio queue notifications never come here (they are ioeventfds); what does come is register
//! traffic: the UART, the RTC, the i8042 and virtio-mmio configuration.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use devices::BusDevice;

/// A device shared between the vCPUs that may access it.
pub type SharedDevice = Arc<Mutex<dyn BusDevice>>;

/// Why a device could not be placed on the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    #[error("range {base:#x}+{len:#x} overlaps a device already on the bus")]
    Overlap { base: u64, len: u64 },
    #[error("range {base:#x}+{len:#x} is empty or wraps around")]
    BadRange { base: u64, len: u64 },
}

#[derive(Clone)]
struct Entry {
    len: u64,
    device: SharedDevice,
}

/// Address ranges mapped to devices.
#[derive(Clone, Default)]
pub struct Bus {
    devices: BTreeMap<u64, Entry>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `[base, base + len)` to `device`.
    pub fn insert(&mut self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        let end = base
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or(BusError::BadRange { base, len })?;
        let overlaps_prev = self
            .devices
            .range(..end)
            .next_back()
            .is_some_and(|(&b, e)| b + e.len > base);
        if overlaps_prev {
            return Err(BusError::Overlap { base, len });
        }
        self.devices.insert(base, Entry { len, device });
        Ok(())
    }

    /// The device covering the whole access `[addr, addr + size)` and the offset into it.
    fn resolve(&self, addr: u64, size: usize) -> Option<(&Entry, u64)> {
        let (&base, entry) = self.devices.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(size as u64)? <= entry.len).then_some((entry, offset))
    }

    /// Reads from the device at `addr`. Returns false when nothing is mapped there (the caller
    /// answers with all-ones, as an unclaimed bus does).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((entry, offset)) => {
                lock(&entry.device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Writes to the device at `addr`. Returns false when nothing is mapped there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((entry, offset)) => {
                lock(&entry.device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

/// Locks a device, tolerating a poisoned mutex: a panic on another thread already ended the
/// VMM's usefulness, but the device state itself is still consistent at this granularity.
fn lock(device: &SharedDevice) -> std::sync::MutexGuard<'_, dyn BusDevice + 'static> {
    device.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset as u8);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let mut bus = Bus::new();
        let a = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(a.clone(), 0x3f8, 8).unwrap();
        let mut d = [0u8; 1];
        assert!(bus.read(0x3fd, &mut d));
        assert_eq!(d[0], 5);
        assert!(bus.write(0x3f8, &[7]));
        assert_eq!(a.lock().unwrap().last_write, Some((0, vec![7])));
        assert!(!bus.read(0x3f7, &mut d));
        assert!(!bus.read(0x400, &mut d));
        // An access that runs past the end of the range is not dispatched.
        let mut wide = [0u8; 2];
        assert!(!bus.read(0x3ff, &mut wide));
    }

    #[test]
    fn rejects_overlaps_and_empty_ranges() {
        let mut bus = Bus::new();
        let dev = || Arc::new(Mutex::new(Recorder::default()));
        bus.insert(dev(), 0x100, 0x10).unwrap();
        assert!(bus.insert(dev(), 0x10f, 1).is_err());
        assert!(bus.insert(dev(), 0xf8, 0x10).is_err());
        assert!(bus.insert(dev(), 0x80, 0x100).is_err());
        assert!(bus.insert(dev(), 0x110, 1).is_ok());
        assert!(bus.insert(dev(), 0xf0, 0x10).is_ok());
        assert_eq!(
            bus.insert(dev(), 0x200, 0),
            Err(BusError::BadRange {
                base: 0x200,
                len: 0
            })
        );
        assert!(bus.insert(dev(), u64::MAX, 2).is_err());
    }
}
