//! PCI bus 0 behind configuration mechanism #1 (ports 0xCF8–0xCFF), with a host bridge at
//! device 0.
//!
//! The guest writes a dword to CONFIG_ADDRESS (0xCF8: bit 31 enable, bus in bits 23:16,
//! device in 15:11, function in 10:8, register in 7:2), then reads or writes 1, 2 or 4 bytes
//! of CONFIG_DATA (0xCFC + the register's byte offset). [`PciConfigIo`] decodes that and
//! forwards the access to the [`PciDevice`] in the slot. Only bus 0 and function 0 exist; an
//! empty slot, another bus or function, the enable bit clear, or an access that would cross
//! the dword reads as all ones, and writes to it are dropped (a master abort). CONFIG_ADDRESS
//! is only the dword at 0xCF8; byte and word accesses there (Linux's `outb(1, 0xCFB)` when it
//! probes the mechanism) are ignored and read all ones.
//!
//! A configuration write that moves a BAR ([`BarMove`]) is passed to the handler installed
//! with [`PciConfigIo::set_bar_move_handler`], after the device's lock is released, so that
//! the VMM can move the device's MMIO range and ioeventfds (taking whatever locks it needs).

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{BarMove, PciDevice};
use crate::BusDevice;

/// The port of CONFIG_ADDRESS; CONFIG_DATA follows at +4. The device spans 8 ports.
pub const PCI_CONFIG_IO_PORT: u64 = 0xcf8;
/// Ports taken by the mechanism (0xCF8..=0xCFF).
pub const PCI_CONFIG_IO_LEN: u64 = 8;
/// Device numbers on a bus.
pub const PCI_SLOTS: usize = 32;
/// CONFIG_ADDRESS enable bit.
const CONFIG_ENABLE: u32 = 1 << 31;

/// A function shared between the vCPU threads and the VMM.
pub type SharedPciDevice = Arc<Mutex<dyn PciDevice>>;

/// Called with (device number, move) when the guest moves a BAR.
pub type BarMoveHandler = Box<dyn FnMut(u8, BarMove) + Send>;

/// Why a function could not be placed on the bus.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PciBusError {
    /// Device numbers are 0..32.
    #[error("PCI device number {0} is out of range (0..32)")]
    BadSlot(usize),
    /// The slot is taken.
    #[error("PCI device number {0} is already in use")]
    SlotInUse(usize),
    /// Every slot is taken.
    #[error("no free PCI device number on bus 0")]
    Full,
}

/// The host bridge at 00:00.0: a header-only function (class 0x0600), nothing writable.
pub struct HostBridge {
    config: [u8; 64],
}

/// Vendor ID of the host bridge (Red Hat, Inc., as QEMU's generic host bridges).
pub const HOST_BRIDGE_VENDOR_ID: u16 = 0x1b36;
/// Device ID of the host bridge (QEMU's "PCIe host bridge").
pub const HOST_BRIDGE_DEVICE_ID: u16 = 0x0008;
/// Class code of a host bridge (bridge device, host bridge).
pub const HOST_BRIDGE_CLASS: u32 = 0x06_0000;

impl HostBridge {
    /// A host bridge.
    pub fn new() -> HostBridge {
        let mut config = [0u8; 64];
        config[0..2].copy_from_slice(&HOST_BRIDGE_VENDOR_ID.to_le_bytes());
        config[2..4].copy_from_slice(&HOST_BRIDGE_DEVICE_ID.to_le_bytes());
        // Command: memory space on (it forwards the downstream windows); status 0.
        config[4] = 0x02;
        config[9..12].copy_from_slice(&HOST_BRIDGE_CLASS.to_le_bytes()[..3]);
        // Header type 0, single function; no BARs, no capabilities, no interrupt pin.
        HostBridge { config }
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciDevice for HostBridge {
    fn read_config_register(&mut self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| self.config.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    fn write_config_register(&mut self, _offset: u64, _data: &[u8]) -> Option<BarMove> {
        None
    }

    fn bar0(&self) -> (u64, u64) {
        (0, 0)
    }
}

/// Configuration mechanism #1 over bus 0 (a [`BusDevice`] on the port-I/O bus at
/// [`PCI_CONFIG_IO_PORT`], [`PCI_CONFIG_IO_LEN`] ports).
pub struct PciConfigIo {
    address: u32,
    slots: Vec<Option<SharedPciDevice>>,
    bar_moves: Option<BarMoveHandler>,
}

impl fmt::Debug for PciConfigIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used: Vec<usize> = (0..PCI_SLOTS)
            .filter(|&d| self.slots[d].is_some())
            .collect();
        f.debug_struct("PciConfigIo")
            .field("address", &format_args!("{:#x}", self.address))
            .field("slots", &used)
            .finish_non_exhaustive()
    }
}

impl Default for PciConfigIo {
    fn default() -> Self {
        Self::new()
    }
}

fn lock(device: &SharedPciDevice) -> MutexGuard<'_, dyn PciDevice + 'static> {
    // A device's state stays consistent across a panic elsewhere at this granularity.
    device.lock().unwrap_or_else(|p| p.into_inner())
}

impl PciConfigIo {
    /// Bus 0 with the host bridge at device 0.
    pub fn new() -> PciConfigIo {
        let mut slots: Vec<Option<SharedPciDevice>> = vec![None; PCI_SLOTS];
        slots[0] = Some(Arc::new(Mutex::new(HostBridge::new())));
        PciConfigIo {
            address: 0,
            slots,
            bar_moves: None,
        }
    }

    /// The lowest free device number.
    pub fn next_free_slot(&self) -> Result<u8, PciBusError> {
        self.slots
            .iter()
            .position(Option::is_none)
            .map(|d| d as u8)
            .ok_or(PciBusError::Full)
    }

    /// Puts `device` at device number `slot` (function 0).
    pub fn add_device(&mut self, slot: u8, device: SharedPciDevice) -> Result<(), PciBusError> {
        let entry = self
            .slots
            .get_mut(usize::from(slot))
            .ok_or(PciBusError::BadSlot(usize::from(slot)))?;
        if entry.is_some() {
            return Err(PciBusError::SlotInUse(usize::from(slot)));
        }
        *entry = Some(device);
        Ok(())
    }

    /// Installs the handler told about BAR moves.
    pub fn set_bar_move_handler(&mut self, handler: BarMoveHandler) {
        self.bar_moves = Some(handler);
    }

    /// CONFIG_ADDRESS as last written.
    pub fn config_address(&self) -> u32 {
        self.address
    }

    /// The function and register byte that an access of `len` bytes at CONFIG_DATA + `port_off`
    /// (0..4) reaches: None for a master abort.
    fn target(&self, port_off: u64, len: usize) -> Option<(u8, &SharedPciDevice, u64)> {
        let a = self.address;
        let bus = (a >> 16) & 0xff;
        let device = (a >> 11) & 0x1f;
        let function = (a >> 8) & 0x7;
        if a & CONFIG_ENABLE == 0 || bus != 0 || function != 0 {
            return None;
        }
        if port_off + len as u64 > 4 {
            return None;
        }
        let register = u64::from(a & 0xfc) + port_off;
        let dev = self.slots.get(device as usize)?.as_ref()?;
        Some((device as u8, dev, register))
    }
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match offset {
            0 if data.len() == 4 => data.copy_from_slice(&self.address.to_le_bytes()),
            4..=7 => match self.target(offset - 4, data.len()) {
                Some((_, dev, register)) => lock(dev).read_config_register(register, data),
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            0 if data.len() == 4 => {
                let mut bytes = [0u8; 4];
                bytes.copy_from_slice(data);
                // Bits 1:0 are reserved (read as 0); bits 30:24 are reserved too but Linux
                // only ever writes 0 there.
                self.address = u32::from_le_bytes(bytes) & !0x3;
            }
            4..=7 => {
                let Some((slot, dev, register)) = self.target(offset - 4, data.len()) else {
                    return;
                };
                // The device's lock is released before the handler runs.
                let moved = lock(dev).write_config_register(register, data);
                if let (Some(moved), Some(handler)) = (moved, self.bar_moves.as_mut()) {
                    handler(slot, moved);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function with 256 bytes of plain read/write configuration space that reports a
    /// BAR move when the dword at 0x10 changes.
    struct Plain {
        config: [u8; 256],
    }

    impl PciDevice for Plain {
        fn read_config_register(&mut self, offset: u64, data: &mut [u8]) {
            let o = offset as usize;
            data.copy_from_slice(&self.config[o..o + data.len()]);
        }
        fn write_config_register(&mut self, offset: u64, data: &[u8]) -> Option<BarMove> {
            let o = offset as usize;
            let old = u32::from_le_bytes(self.config[0x10..0x14].try_into().unwrap());
            self.config[o..o + data.len()].copy_from_slice(data);
            let new = u32::from_le_bytes(self.config[0x10..0x14].try_into().unwrap());
            (old != new).then_some(BarMove {
                bar: 0,
                old: old.into(),
                new: new.into(),
                size: 0x1000,
            })
        }
        fn bar0(&self) -> (u64, u64) {
            (0, 0x1000)
        }
    }

    fn plain() -> Arc<Mutex<Plain>> {
        let mut config = [0u8; 256];
        for (i, b) in config.iter_mut().enumerate() {
            *b = i as u8;
        }
        Arc::new(Mutex::new(Plain { config }))
    }

    fn addr(enable: bool, bus: u32, dev: u32, func: u32, reg: u32) -> [u8; 4] {
        (u32::from(enable) << 31 | bus << 16 | dev << 11 | func << 8 | reg).to_le_bytes()
    }

    fn read(io: &mut PciConfigIo, port: u64, len: usize) -> u32 {
        let mut data = vec![0u8; len];
        io.read(port - PCI_CONFIG_IO_PORT, &mut data);
        let mut b = [0u8; 4];
        b[..len].copy_from_slice(&data);
        u32::from_le_bytes(b)
    }

    #[test]
    fn host_bridge_and_absent_functions() {
        let mut io = PciConfigIo::new();
        io.write(0, &addr(true, 0, 0, 0, 0));
        assert_eq!(
            read(&mut io, 0xcfc, 4),
            u32::from(HOST_BRIDGE_DEVICE_ID) << 16 | u32::from(HOST_BRIDGE_VENDOR_ID)
        );
        io.write(0, &addr(true, 0, 0, 0, 8));
        assert_eq!(read(&mut io, 0xcfc, 4) >> 8, HOST_BRIDGE_CLASS);
        assert_eq!(read(&mut io, 0xcfe, 2), 0x0600, "class word");
        assert_eq!(read(&mut io, 0xcff, 1), 0x06, "base class byte");
        // Header type 0 (single function), no BAR.
        io.write(0, &addr(true, 0, 0, 0, 0xc));
        assert_eq!(read(&mut io, 0xcfe, 1), 0);
        io.write(0, &addr(true, 0, 0, 0, 0x10));
        assert_eq!(read(&mut io, 0xcfc, 4), 0);
        // The bridge ignores writes.
        io.write(4, &[0xff; 4]);
        assert_eq!(read(&mut io, 0xcfc, 4), 0);
        // Empty slot, other bus, other function, enable clear: all ones, writes dropped.
        for a in [
            addr(true, 0, 5, 0, 0),
            addr(true, 1, 0, 0, 0),
            addr(true, 0, 0, 3, 0),
            addr(false, 0, 0, 0, 0),
        ] {
            io.write(0, &a);
            assert_eq!(read(&mut io, 0xcfc, 4), 0xffff_ffff, "{a:x?}");
            assert_eq!(read(&mut io, 0xcfd, 1), 0xff);
            io.write(4, &[0; 4]);
        }
    }

    #[test]
    fn address_register_is_the_dword_at_cf8() {
        let mut io = PciConfigIo::new();
        io.write(0, &0x8000_0000u32.to_le_bytes());
        assert_eq!(read(&mut io, 0xcf8, 4), 0x8000_0000);
        // Reserved low bits read 0.
        io.write(0, &0x8000_1233u32.to_le_bytes());
        assert_eq!(read(&mut io, 0xcf8, 4), 0x8000_1230);
        // Linux's probe: outb(1, 0xCFB) is not an address write; byte/word reads are all ones.
        io.write(3, &[1]);
        io.write(0, &[0, 0]);
        assert_eq!(io.config_address(), 0x8000_1230);
        assert_eq!(read(&mut io, 0xcf8, 1), 0xff);
        assert_eq!(read(&mut io, 0xcfa, 2), 0xffff);
    }

    #[test]
    fn byte_word_dword_accesses_reach_the_right_register_bytes() {
        let mut io = PciConfigIo::new();
        let dev = plain();
        io.add_device(3, dev.clone()).unwrap();
        io.write(0, &addr(true, 0, 3, 0, 0x20));
        assert_eq!(read(&mut io, 0xcfc, 4), 0x2322_2120);
        assert_eq!(read(&mut io, 0xcfd, 1), 0x21);
        assert_eq!(read(&mut io, 0xcfe, 2), 0x2322);
        assert_eq!(read(&mut io, 0xcff, 1), 0x23);
        // Crossing the dword: master abort.
        assert_eq!(read(&mut io, 0xcfe, 4), 0xffff_ffff);
        assert_eq!(read(&mut io, 0xcff, 2), 0xffff);
        io.write(6, &[0xaa, 0xbb]);
        io.write(5, &[0xcc]);
        assert_eq!(read(&mut io, 0xcfc, 4), 0xbbaa_cc20);
        io.write(7, &[1, 2]); // crosses: dropped
        assert_eq!(read(&mut io, 0xcfc, 4), 0xbbaa_cc20);
        // The register's low address bits are the port's, not CONFIG_ADDRESS's.
        io.write(0, &addr(true, 0, 3, 0, 0xff));
        assert_eq!(read(&mut io, 0xcfc, 4), 0xfffe_fdfc);
    }

    #[test]
    fn bar_moves_reach_the_handler_with_the_slot() {
        let mut io = PciConfigIo::new();
        io.add_device(2, plain()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        io.set_bar_move_handler(Box::new(move |slot, m| {
            s.lock().unwrap().push((slot, m.new))
        }));
        io.write(0, &addr(true, 0, 2, 0, 0x10));
        io.write(4, &0xe000_0000u32.to_le_bytes());
        io.write(4, &0xe000_0000u32.to_le_bytes()); // unchanged: no move
        assert_eq!(*seen.lock().unwrap(), vec![(2, 0xe000_0000)]);
    }

    #[test]
    fn slots() {
        let mut io = PciConfigIo::new();
        assert_eq!(io.next_free_slot(), Ok(1));
        assert_eq!(
            io.add_device(0, plain()),
            Err(PciBusError::SlotInUse(0)),
            "the host bridge is device 0"
        );
        assert_eq!(io.add_device(32, plain()), Err(PciBusError::BadSlot(32)));
        for d in 1..32 {
            io.add_device(d, plain()).unwrap();
        }
        assert_eq!(io.next_free_slot(), Err(PciBusError::Full));
    }
}
