//! A PCI type-0 configuration space (256 bytes, no extended space) with one 64-bit memory BAR
//! and a capability list.
//!
//! The space is an image of the registers plus a mask of the guest-writable bits, so any access
//! (any offset, any size) is a byte loop that cannot panic, read-only fields stay read-only and
//! the BAR sizing protocol falls out of the mask (the low address bits of a BAR of size `S`
//! are read-only zeros, so writing all ones reads back `!(S - 1)` and the type bits).

/// Size of the (conventional) configuration space.
pub const PCI_CONFIG_SPACE_SIZE: usize = 256;

/// Vendor ID.
pub const PCI_VENDOR_ID: usize = 0x00;
/// Device ID.
pub const PCI_DEVICE_ID: usize = 0x02;
/// Command register.
pub const PCI_COMMAND: usize = 0x04;
/// Status register.
pub const PCI_STATUS: usize = 0x06;
/// Revision ID.
pub const PCI_REVISION_ID: usize = 0x08;
/// Class code (programming interface, subclass, class: 3 bytes).
pub const PCI_CLASS_PROG: usize = 0x09;
/// Cache line size.
pub const PCI_CACHE_LINE_SIZE: usize = 0x0c;
/// Header type.
pub const PCI_HEADER_TYPE: usize = 0x0e;
/// BAR0.
pub const PCI_BAR0: usize = 0x10;
/// Subsystem vendor ID.
pub const PCI_SUBSYSTEM_VENDOR_ID: usize = 0x2c;
/// Subsystem ID.
pub const PCI_SUBSYSTEM_ID: usize = 0x2e;
/// Capabilities pointer.
pub const PCI_CAPABILITY_LIST: usize = 0x34;
/// Interrupt line.
pub const PCI_INTERRUPT_LINE: usize = 0x3c;
/// Interrupt pin (0: none).
pub const PCI_INTERRUPT_PIN: usize = 0x3d;
/// First byte after the header, where capabilities start.
pub const PCI_CAPS_START: usize = 0x40;

/// Command: memory space enable.
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command: bus master enable.
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;
/// Command: INTx disable.
pub const PCI_COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status: capabilities list present.
pub const PCI_STATUS_CAP_LIST: u16 = 1 << 4;

/// BAR: 64-bit memory BAR type bits.
pub const PCI_BAR_MEM_TYPE_64: u32 = 0b100;
/// BAR: prefetchable.
pub const PCI_BAR_PREFETCH: u32 = 0b1000;

/// Vendor-specific capability ID (virtio's structures).
pub const PCI_CAP_ID_VNDR: u8 = 0x09;
/// MSI-X capability ID.
pub const PCI_CAP_ID_MSIX: u8 = 0x11;

/// The identity of a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciIds {
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Revision ID.
    pub revision: u8,
    /// Class code: class << 16 | subclass << 8 | programming interface.
    pub class: u32,
    /// Subsystem vendor ID.
    pub subsystem_vendor: u16,
    /// Subsystem ID.
    pub subsystem: u16,
}

/// The configuration space of a type-0 function with one 64-bit memory BAR (BAR0/BAR1).
#[derive(Clone)]
pub struct PciConfigSpace {
    bytes: [u8; PCI_CONFIG_SPACE_SIZE],
    wmask: [u8; PCI_CONFIG_SPACE_SIZE],
    bar0_size: u64,
    /// Where the next capability goes, and the last one's `next` byte.
    next_cap: usize,
    last_next: usize,
}

impl std::fmt::Debug for PciConfigSpace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PciConfigSpace")
            .field("bar0", &format_args!("{:#x}", self.bar0_address()))
            .field("bar0_size", &format_args!("{:#x}", self.bar0_size))
            .field(
                "command",
                &format_args!("{:#x}", self.read_u16(PCI_COMMAND)),
            )
            .finish_non_exhaustive()
    }
}

impl PciConfigSpace {
    /// A header with `ids` and BAR0 a 64-bit memory BAR of `bar0_size` bytes (a power of two,
    /// at least 16; rounded up otherwise), no interrupt pin, no capabilities yet.
    pub fn new(ids: PciIds, bar0_size: u64, prefetchable: bool) -> Self {
        let bar0_size = bar0_size.max(16).next_power_of_two();
        let mut s = PciConfigSpace {
            bytes: [0; PCI_CONFIG_SPACE_SIZE],
            wmask: [0; PCI_CONFIG_SPACE_SIZE],
            bar0_size,
            next_cap: PCI_CAPS_START,
            last_next: PCI_CAPABILITY_LIST,
        };
        s.set_u16(PCI_VENDOR_ID, ids.vendor);
        s.set_u16(PCI_DEVICE_ID, ids.device);
        s.set_u16(PCI_STATUS, PCI_STATUS_CAP_LIST);
        s.bytes[PCI_REVISION_ID] = ids.revision;
        s.bytes[PCI_CLASS_PROG..PCI_CLASS_PROG + 3].copy_from_slice(&ids.class.to_le_bytes()[..3]);
        s.bytes[PCI_HEADER_TYPE] = 0;
        s.set_u16(PCI_SUBSYSTEM_VENDOR_ID, ids.subsystem_vendor);
        s.set_u16(PCI_SUBSYSTEM_ID, ids.subsystem);
        s.bytes[PCI_INTERRUPT_PIN] = 0;
        // Writable: memory space, bus master, INTx disable (no I/O BAR: I/O space stays 0).
        let cmd = PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER | PCI_COMMAND_INTX_DISABLE;
        s.wmask[PCI_COMMAND..PCI_COMMAND + 2].copy_from_slice(&cmd.to_le_bytes());
        s.wmask[PCI_CACHE_LINE_SIZE] = 0xff;
        s.wmask[PCI_INTERRUPT_LINE] = 0xff;
        let flags = PCI_BAR_MEM_TYPE_64 | if prefetchable { PCI_BAR_PREFETCH } else { 0 };
        s.set_u32(PCI_BAR0, flags);
        let mask = !(bar0_size - 1);
        s.wmask[PCI_BAR0..PCI_BAR0 + 8].copy_from_slice(&(mask & !0xf).to_le_bytes());
        s
    }

    /// Size of BAR0.
    pub fn bar0_size(&self) -> u64 {
        self.bar0_size
    }

    /// BAR0's address as programmed (both halves; during sizing, the size mask).
    pub fn bar0_address(&self) -> u64 {
        let lo = u64::from(self.read_u32(PCI_BAR0)) & !0xf;
        let hi = u64::from(self.read_u32(PCI_BAR0 + 4));
        hi << 32 | lo
    }

    /// Programs BAR0's address (host side, e.g. at boot); the low bits are dropped to the
    /// BAR's alignment.
    pub fn set_bar0_address(&mut self, address: u64) {
        let flags = self.read_u32(PCI_BAR0) & 0xf;
        let address = address & !(self.bar0_size - 1);
        self.set_u32(PCI_BAR0, address as u32 | flags);
        self.set_u32(PCI_BAR0 + 4, (address >> 32) as u32);
    }

    /// Memory space enable in Command.
    pub fn memory_enabled(&self) -> bool {
        self.read_u16(PCI_COMMAND) & PCI_COMMAND_MEMORY != 0
    }

    /// Bus master enable in Command.
    pub fn bus_master_enabled(&self) -> bool {
        self.read_u16(PCI_COMMAND) & PCI_COMMAND_MASTER != 0
    }

    /// Appends a capability: `id`, then the next pointer (filled in by the next one), then
    /// `body`; `writable` is the guest-writable bit mask over `body` (shorter means the rest is
    /// read-only). Returns the capability's offset, or None when the space is full.
    pub fn add_capability(&mut self, id: u8, body: &[u8], writable: &[u8]) -> Option<usize> {
        let offset = self.next_cap;
        let end = offset + 2 + body.len();
        if end > PCI_CONFIG_SPACE_SIZE {
            return None;
        }
        self.bytes[offset] = id;
        self.bytes[offset + 1] = 0;
        self.bytes[offset + 2..end].copy_from_slice(body);
        for (m, w) in self.wmask[offset + 2..end].iter_mut().zip(writable) {
            *m = *w;
        }
        self.bytes[self.last_next] = offset as u8;
        self.last_next = offset + 1;
        self.next_cap = end.next_multiple_of(4);
        Some(offset)
    }

    /// Reads `data.len()` bytes at `offset`; bytes past the space read as 0.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| self.bytes.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    /// Writes `data` at `offset`, only the writable bits; bytes past the space are ignored.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            let Some(o) = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .filter(|&o| o < PCI_CONFIG_SPACE_SIZE)
            else {
                return;
            };
            self.bytes[o] = (self.bytes[o] & !self.wmask[o]) | (b & self.wmask[o]);
        }
    }

    /// The byte at `offset` (0 past the space).
    pub fn read_u8(&self, offset: usize) -> u8 {
        self.bytes.get(offset).copied().unwrap_or(0)
    }

    /// The little-endian word at `offset`.
    pub fn read_u16(&self, offset: usize) -> u16 {
        let mut b = [0; 2];
        self.read(offset as u64, &mut b);
        u16::from_le_bytes(b)
    }

    /// The little-endian dword at `offset`.
    pub fn read_u32(&self, offset: usize) -> u32 {
        let mut b = [0; 4];
        self.read(offset as u64, &mut b);
        u32::from_le_bytes(b)
    }

    /// Sets a word, ignoring the write mask (device side).
    pub fn set_u16(&mut self, offset: usize, value: u16) {
        if let Some(dst) = self.bytes.get_mut(offset..offset + 2) {
            dst.copy_from_slice(&value.to_le_bytes());
        }
    }

    /// Sets a dword, ignoring the write mask (device side).
    pub fn set_u32(&mut self, offset: usize, value: u32) {
        if let Some(dst) = self.bytes.get_mut(offset..offset + 4) {
            dst.copy_from_slice(&value.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> PciIds {
        PciIds {
            vendor: 0x1234,
            device: 0x5678,
            revision: 2,
            class: 0x0c_0330,
            subsystem_vendor: 0x1af4,
            subsystem: 9,
        }
    }

    #[test]
    fn bar_size_is_a_power_of_two_and_flags_stick() {
        let mut c = PciConfigSpace::new(ids(), 0x3000, true);
        assert_eq!(c.bar0_size(), 0x4000);
        assert_eq!(c.read_u32(PCI_BAR0), 0b1100, "64-bit prefetchable");
        c.write(PCI_BAR0 as u64, &[0xff; 8]);
        assert_eq!(c.read_u32(PCI_BAR0), 0xffff_c00c);
        assert_eq!(c.read_u32(PCI_BAR0 + 4), 0xffff_ffff);
        c.set_bar0_address(0x1_2345_6789);
        assert_eq!(c.bar0_address(), 0x1_2345_4000, "aligned down to the size");
        assert_eq!(c.read_u32(PCI_CLASS_PROG - 1), 0x0c03_3002);
    }

    #[test]
    fn capabilities_until_full() {
        let mut c = PciConfigSpace::new(ids(), 0x1000, false);
        let mut offsets = Vec::new();
        while let Some(at) = c.add_capability(0x09, &[0xaa; 14], &[0xff]) {
            offsets.push(at);
        }
        assert_eq!(offsets.len(), (256 - 0x40) / 16);
        assert_eq!(usize::from(c.read_u8(PCI_CAPABILITY_LIST)), offsets[0]);
        for pair in offsets.windows(2) {
            assert_eq!(usize::from(c.read_u8(pair[0] + 1)), pair[1]);
        }
        assert_eq!(c.read_u8(offsets[offsets.len() - 1] + 1), 0, "end of list");
        // Only the first body byte is writable.
        c.write(offsets[0] as u64, &[0; 4]);
        assert_eq!(
            c.read_u32(offsets[0]),
            0xaa00_0009 | (offsets[1] as u32) << 8
        );
    }
}
