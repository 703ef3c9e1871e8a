//! Slow-path dispatch of vCPU port-I/O and MMIO exits to devices by address range.
//!
//! Virtio queue notifications never come here (they are ioeventfds); what does come is register
//! traffic: the UART, the RTC, the i8042, virtio-mmio configuration, PCI configuration
//! (0xCF8) and virtio-pci BAR0 registers.
//!
//! Clones of a [`Bus`] share one map: a device moved with [`Bus::relocate`] (a PCI BAR the
//! guest reprogrammed) moves for every vCPU. The map is behind a read-write lock, held for
//! reading only while an access is resolved (not while the device runs) and for writing only
//! when a BAR moves.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

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
    #[error("no device is mapped at {0:#x}")]
    NotMapped(u64),
}

#[derive(Clone)]
struct Entry {
    len: u64,
    device: SharedDevice,
}

/// Address ranges mapped to devices (clones share the map).
#[derive(Clone, Default)]
pub struct Bus {
    devices: Arc<RwLock<BTreeMap<u64, Entry>>>,
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps `[base, base + len)` to `device`.
    pub fn insert(&self, device: SharedDevice, base: u64, len: u64) -> Result<(), BusError> {
        insert(&mut self.map_mut(), device, base, len)
    }

    /// Whether `[base, base + len)` is free (and a valid range).
    pub fn is_free(&self, base: u64, len: u64) -> bool {
        check_free(&self.map(), base, len).is_ok()
    }

    /// Moves the device mapped at `old` to `[new, new + len)`; on failure (overlap, bad
    /// range) nothing changes. One write-lock section: no vCPU sees the device unmapped.
    pub fn relocate(&self, old: u64, new: u64, len: u64) -> Result<(), BusError> {
        let mut map = self.map_mut();
        let entry = map.remove(&old).ok_or(BusError::NotMapped(old))?;
        let device = entry.device.clone();
        insert(&mut map, device, new, len).inspect_err(|_| {
            map.insert(old, entry);
        })
    }

    /// Unmaps the device at `base`.
    pub fn remove(&self, base: u64) -> Result<SharedDevice, BusError> {
        self.map_mut()
            .remove(&base)
            .map(|e| e.device)
            .ok_or(BusError::NotMapped(base))
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<u64, Entry>> {
        // The map is never left half-updated by a panic.
        self.devices.read().unwrap_or_else(|p| p.into_inner())
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<u64, Entry>> {
        self.devices.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The device covering the whole access `[addr, addr + size)` and the offset into it.
    /// The map's lock is released before the caller locks the device.
    fn resolve(&self, addr: u64, size: usize) -> Option<(SharedDevice, u64)> {
        let map = self.map();
        let (&base, entry) = map.range(..=addr).next_back()?;
        let offset = addr - base;
        (offset.checked_add(size as u64)? <= entry.len).then(|| (entry.device.clone(), offset))
    }

    /// Reads from the device at `addr`. Returns false when nothing is mapped there (the caller
    /// answers with all-ones, as an unclaimed bus does).
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((device, offset)) => {
                lock(&device).read(offset, data);
                true
            }
            None => false,
        }
    }

    /// Writes to the device at `addr`. Returns false when nothing is mapped there.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((device, offset)) => {
                lock(&device).write(offset, data);
                true
            }
            None => false,
        }
    }
}

fn check_free(map: &BTreeMap<u64, Entry>, base: u64, len: u64) -> Result<u64, BusError> {
    let end = base
        .checked_add(len)
        .filter(|_| len > 0)
        .ok_or(BusError::BadRange { base, len })?;
    let overlaps_prev = map
        .range(..end)
        .next_back()
        .is_some_and(|(&b, e)| b + e.len > base);
    if overlaps_prev {
        return Err(BusError::Overlap { base, len });
    }
    Ok(end)
}

fn insert(
    map: &mut BTreeMap<u64, Entry>,
    device: SharedDevice,
    base: u64,
    len: u64,
) -> Result<(), BusError> {
    check_free(map, base, len)?;
    map.insert(base, Entry { len, device });
    Ok(())
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
        let bus = Bus::new();
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
        let bus = Bus::new();
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

    #[test]
    fn relocate_moves_for_every_clone_and_refuses_overlaps() {
        let bus = Bus::new();
        let vcpu_view = bus.clone();
        let a = Arc::new(Mutex::new(Recorder::default()));
        bus.insert(a.clone(), 0xe000_0000, 0x8000).unwrap();
        bus.insert(
            Arc::new(Mutex::new(Recorder::default())),
            0xe001_0000,
            0x8000,
        )
        .unwrap();
        assert!(vcpu_view.write(0xe000_0004, &[1]));
        // Onto the other device: refused, nothing moves.
        assert_eq!(
            bus.relocate(0xe000_0000, 0xe000_c000, 0x8000),
            Err(BusError::Overlap {
                base: 0xe000_c000,
                len: 0x8000
            })
        );
        assert!(vcpu_view.write(0xe000_0008, &[2]));
        assert_eq!(a.lock().unwrap().last_write, Some((8, vec![2])));
        assert!(!bus.is_free(0xe000_4000, 0x8000));
        assert!(bus.is_free(0xe002_0000, 0x8000));
        bus.relocate(0xe000_0000, 0xe002_0000, 0x8000).unwrap();
        assert!(!vcpu_view.write(0xe000_0004, &[3]), "old range unmapped");
        assert!(vcpu_view.write(0xe002_0010, &[4]));
        assert_eq!(a.lock().unwrap().last_write, Some((0x10, vec![4])));
        assert_eq!(
            bus.relocate(0xe000_0000, 0xe003_0000, 0x8000),
            Err(BusError::NotMapped(0xe000_0000))
        );
        assert!(bus.remove(0xe002_0000).is_ok());
        assert!(!vcpu_view.read(0xe002_0010, &mut [0u8; 4]));
    }
}
