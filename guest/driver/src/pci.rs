//! The modern virtio-pci transport, driver side (virtio 1.2 §4.1): capability walk, common
//! configuration, notification addresses and MSI-X vector assignment.
//!
//! Two small access seams keep it usable on bare metal and in co-simulation:
//! - [`PciConfig`]: the function's configuration space (bare metal: ports 0xCF8/0xCFC;
//!   co-simulation: the device model's configuration space, by function calls);
//! - [`PciBar`]: the BAR holding the virtio structures (bare metal: [`MappedBar`], volatile
//!   accesses to the BAR mapped uncached; co-simulation: the device model's BAR handler).
//!
//! Bring-up: [`find_capabilities`] (config space only, so the caller learns which BAR to map),
//! then [`PciTransport::new`] over the function, then (for MSI-X) [`PciTransport::set_msix_entry`]
//! for each entry, [`PciTransport::enable_msix`], and [`crate::VirtioNet::new`]. The transport
//! assigns MSI-X vectors itself: entry 0 to configuration changes, entry `q + 1` to queue `q`
//! (falling back to entry 0 when the table is too small or the device refuses a vector), each
//! written and read back ([`NO_VECTOR`] read back is an error).

use alloc::vec::Vec;
use core::fmt;
use core::ptr::NonNull;

use crate::error::InitError;
use crate::reset::QueueResetError;
use crate::transport::{QueueSetup, Transport};

/// PCI configuration space registers and bits this transport uses.
pub mod cfg {
    /// Vendor ID (16 bits).
    pub const VENDOR_ID: u8 = 0x00;
    /// Device ID (16 bits).
    pub const DEVICE_ID: u8 = 0x02;
    /// Command (16 bits).
    pub const COMMAND: u8 = 0x04;
    /// Status (16 bits).
    pub const STATUS: u8 = 0x06;
    /// Header type (8 bits; bit 7: multi-function).
    pub const HEADER_TYPE: u8 = 0x0e;
    /// BAR0 (BARs 0..=5 at 0x10 + 4 * n).
    pub const BAR0: u8 = 0x10;
    /// Capabilities pointer.
    pub const CAP_PTR: u8 = 0x34;
    /// Command: memory space enable.
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    /// Command: bus master enable.
    pub const COMMAND_MASTER: u16 = 1 << 2;
    /// Command: INTx disable.
    pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
    /// Status: capabilities list present.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
    /// Capability ID: vendor specific (virtio structures).
    pub const CAP_ID_VNDR: u8 = 0x09;
    /// Capability ID: MSI-X.
    pub const CAP_ID_MSIX: u8 = 0x11;
    /// MSI-X Message Control: enable.
    pub const MSIX_ENABLE: u16 = 1 << 15;
    /// MSI-X Message Control: function mask.
    pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;
}

/// The virtio PCI vendor ID.
pub const VIRTIO_VENDOR_ID: u16 = 0x1af4;
/// Modern device IDs are this plus the virtio device type.
pub const VIRTIO_DEVICE_ID_BASE: u16 = 0x1040;
/// A modern virtio-net function's device ID.
pub const VIRTIO_NET_DEVICE_ID: u16 = VIRTIO_DEVICE_ID_BASE + 1;
/// "No vector" in `config_msix_vector` / `queue_msix_vector`.
pub const NO_VECTOR: u16 = 0xffff;

/// `cfg_type` of the virtio vendor capabilities.
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;
/// Capabilities followed before the walk gives up (a loop in the list).
const MAX_CAPS: usize = 48;
/// Bytes of `virtio_pci_common_cfg` the driver uses (through `queue_device`).
const COMMON_MIN_LEN: u32 = 0x38;
/// Size of one MSI-X table entry.
const MSIX_ENTRY_SIZE: u32 = 16;

/// `virtio_pci_common_cfg` offsets (virtio 1.2 §4.1.4.3).
mod common {
    pub const DEVICE_FEATURE_SELECT: u32 = 0x00;
    pub const DEVICE_FEATURE: u32 = 0x04;
    pub const DRIVER_FEATURE_SELECT: u32 = 0x08;
    pub const DRIVER_FEATURE: u32 = 0x0c;
    pub const CONFIG_MSIX_VECTOR: u32 = 0x10;
    pub const NUM_QUEUES: u32 = 0x12;
    pub const DEVICE_STATUS: u32 = 0x14;
    pub const CONFIG_GENERATION: u32 = 0x15;
    pub const QUEUE_SELECT: u32 = 0x16;
    pub const QUEUE_SIZE: u32 = 0x18;
    pub const QUEUE_MSIX_VECTOR: u32 = 0x1a;
    pub const QUEUE_ENABLE: u32 = 0x1c;
    pub const QUEUE_NOTIFY_OFF: u32 = 0x1e;
    pub const QUEUE_DESC: u32 = 0x20;
    pub const QUEUE_DRIVER: u32 = 0x28;
    pub const QUEUE_DEVICE: u32 = 0x30;
    /// Per-queue reset (VIRTIO_F_RING_RESET): write 1, reads 1 while ongoing.
    pub const QUEUE_RESET: u32 = 0x3a;
}

/// Access to one PCI function's configuration space. Offsets are below 256 and aligned to
/// the access size.
pub trait PciConfig {
    /// Reads the dword at `offset`.
    fn config_read32(&mut self, offset: u8) -> u32;
    /// Writes the dword at `offset`.
    fn config_write32(&mut self, offset: u8, value: u32);
    /// Writes the word at `offset`.
    fn config_write16(&mut self, offset: u8, value: u16);
    /// Reads the word at `offset` (from its dword).
    fn config_read16(&mut self, offset: u8) -> u16 {
        (self.config_read32(offset & !3) >> (8 * (offset & 2))) as u16
    }
    /// Reads the byte at `offset` (from its dword).
    fn config_read8(&mut self, offset: u8) -> u8 {
        (self.config_read32(offset & !3) >> (8 * (offset & 3))) as u8
    }
}

/// Access to the memory BAR holding the virtio structures. Offsets are relative to the BAR,
/// below [`PciBar::size`] and aligned to the access size.
pub trait PciBar {
    /// The BAR's size in bytes (what is mapped).
    fn size(&self) -> u64;
    /// Reads the byte at `offset`.
    fn read8(&mut self, offset: u32) -> u8;
    /// Reads the word at `offset`.
    fn read16(&mut self, offset: u32) -> u16;
    /// Reads the dword at `offset`.
    fn read32(&mut self, offset: u32) -> u32;
    /// Writes the byte at `offset`.
    fn write8(&mut self, offset: u32, value: u8);
    /// Writes the word at `offset`.
    fn write16(&mut self, offset: u32, value: u16);
    /// Writes the dword at `offset`.
    fn write32(&mut self, offset: u32, value: u32);
    /// Notifies queue `queue` at its notification address `offset`: the 16-bit write of the
    /// queue index (virtio 1.2 §4.1.5.2). A co-simulation overrides it to write the queue's
    /// kick eventfd, as KVM does for an ioeventfd.
    #[inline]
    fn notify(&mut self, offset: u32, queue: u16) {
        self.write16(offset, queue);
    }
}

/// A configuration space and a BAR make a function.
impl<C: PciConfig, B> PciConfig for (C, B) {
    fn config_read32(&mut self, offset: u8) -> u32 {
        self.0.config_read32(offset)
    }
    fn config_write32(&mut self, offset: u8, value: u32) {
        self.0.config_write32(offset, value)
    }
    fn config_write16(&mut self, offset: u8, value: u16) {
        self.0.config_write16(offset, value)
    }
}

/// A configuration space and a BAR make a function.
impl<C, B: PciBar> PciBar for (C, B) {
    fn size(&self) -> u64 {
        self.1.size()
    }
    fn read8(&mut self, offset: u32) -> u8 {
        self.1.read8(offset)
    }
    fn read16(&mut self, offset: u32) -> u16 {
        self.1.read16(offset)
    }
    fn read32(&mut self, offset: u32) -> u32 {
        self.1.read32(offset)
    }
    fn write8(&mut self, offset: u32, value: u8) {
        self.1.write8(offset, value)
    }
    fn write16(&mut self, offset: u32, value: u16) {
        self.1.write16(offset, value)
    }
    fn write32(&mut self, offset: u32, value: u32) {
        self.1.write32(offset, value)
    }
    #[inline]
    fn notify(&mut self, offset: u32, queue: u16) {
        self.1.notify(offset, queue)
    }
}

/// Why a virtio-pci function cannot be driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PciError {
    /// Not a modern virtio function (vendor, device ID).
    NotVirtio {
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
    },
    /// The function has no capability list.
    NoCapabilities,
    /// A required virtio structure (`cfg_type`) has no capability.
    MissingCapability(u8),
    /// A capability names a BAR other than the one the others use (or a BAR past 5).
    SplitBars {
        /// The first BAR seen.
        expected: u8,
        /// The BAR of the offending capability.
        found: u8,
    },
    /// A structure (`cfg_type`, 0x11 for the MSI-X table) does not fit in the BAR.
    OutOfBar(u8),
    /// The function has no MSI-X capability.
    NoMsix,
    /// An MSI-X entry past the table.
    NoSuchEntry(u16),
    /// The BAR is not assigned (reads 0) or is not a memory BAR.
    BarUnassigned(u8),
}

impl fmt::Display for PciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PciError::NotVirtio { vendor, device } => {
                write!(
                    f,
                    "{vendor:04x}:{device:04x} is not a modern virtio function"
                )
            }
            PciError::NoCapabilities => write!(f, "the function has no capability list"),
            PciError::MissingCapability(t) => write!(f, "no virtio capability of type {t}"),
            PciError::SplitBars { expected, found } => write!(
                f,
                "virtio structures in BAR{found} and BAR{expected} (one BAR supported)"
            ),
            PciError::OutOfBar(t) => write!(f, "structure of type {t:#x} exceeds its BAR"),
            PciError::NoMsix => write!(f, "the function has no MSI-X capability"),
            PciError::NoSuchEntry(e) => write!(f, "MSI-X entry {e} is past the table"),
            PciError::BarUnassigned(b) => write!(f, "BAR{b} is unassigned or not memory"),
        }
    }
}

impl core::error::Error for PciError {}

/// One virtio structure: offset and length in the BAR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Region {
    /// Offset in the BAR.
    pub offset: u32,
    /// Length in bytes.
    pub length: u32,
}

impl Region {
    fn fits(&self, size: u64) -> bool {
        u64::from(self.offset) + u64::from(self.length) <= size
    }
}

/// The MSI-X capability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixCap {
    /// Offset of the capability in configuration space.
    pub cap: u8,
    /// Number of table entries.
    pub table_size: u16,
    /// Table offset in the BAR.
    pub table_offset: u32,
    /// PBA offset in the BAR.
    pub pba_offset: u32,
}

/// What the capability walk found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciLayout {
    /// The BAR holding every structure.
    pub bar: u8,
    /// Common configuration.
    pub common: Region,
    /// Notification area.
    pub notify: Region,
    /// `notify_off_multiplier`.
    pub notify_multiplier: u32,
    /// ISR status.
    pub isr: Region,
    /// Device configuration (length 0 if the device has none).
    pub device: Region,
    /// MSI-X, if the function has it (its table and PBA in the same BAR).
    pub msix: Option<MsixCap>,
}

/// Walks the capability list of the function behind `cfg`: the first common, notify, ISR and
/// device-configuration capability each (virtio 1.2 §4.1.4: the driver uses the first one it
/// understands), and the MSI-X capability. Every structure must be in one BAR.
pub fn find_capabilities<C: PciConfig + ?Sized>(cfg: &mut C) -> Result<PciLayout, PciError> {
    if cfg.config_read16(cfg::STATUS) & cfg::STATUS_CAP_LIST == 0 {
        return Err(PciError::NoCapabilities);
    }
    let mut found: [Option<(u8, Region, u32)>; 5] = [None; 5];
    let mut msix = None;
    let mut bar: Option<u8> = None;
    let mut check_bar = |b: u8| -> Result<(), PciError> {
        let expected = *bar.get_or_insert(b);
        if b != expected || b > 5 {
            return Err(PciError::SplitBars { expected, found: b });
        }
        Ok(())
    };
    let mut ptr = cfg.config_read8(cfg::CAP_PTR) & !3;
    for _ in 0..MAX_CAPS {
        if ptr < 0x40 {
            break;
        }
        let id = cfg.config_read8(ptr);
        let next = cfg.config_read8(ptr.wrapping_add(1)) & !3;
        // A capability must fit in the 256 bytes; one that does not is skipped.
        let fits = |len: u16| u16::from(ptr) + len <= 256;
        match id {
            cfg::CAP_ID_VNDR if fits(16) => {
                let cfg_type = cfg.config_read8(ptr + 3);
                let b = cfg.config_read8(ptr + 4);
                // Reserved BAR values are ignored (virtio 1.2 §4.1.4), as are types this
                // driver does not use and any but the first of each type.
                let wanted = (CAP_COMMON..=CAP_DEVICE).contains(&cfg_type)
                    && found[usize::from(cfg_type)].is_none()
                    && b <= 5
                    && (cfg_type != CAP_NOTIFY || fits(20));
                if wanted {
                    check_bar(b)?;
                    let region = Region {
                        offset: cfg.config_read32(ptr + 8),
                        length: cfg.config_read32(ptr + 12),
                    };
                    let extra = if cfg_type == CAP_NOTIFY {
                        cfg.config_read32(ptr + 16)
                    } else {
                        0
                    };
                    found[usize::from(cfg_type)] = Some((b, region, extra));
                }
            }
            cfg::CAP_ID_MSIX if msix.is_none() && fits(12) => {
                let (cap, [table_bar, pba_bar]) = read_msix_cap(cfg, ptr);
                check_bar(table_bar)?;
                check_bar(pba_bar)?;
                msix = Some(cap);
            }
            _ => {}
        }
        ptr = next;
    }
    let get = |t: u8| found[usize::from(t)].ok_or(PciError::MissingCapability(t));
    let (bar, common, _) = get(CAP_COMMON)?;
    let (_, notify, notify_multiplier) = get(CAP_NOTIFY)?;
    let (_, isr, _) = get(CAP_ISR)?;
    let device = found[usize::from(CAP_DEVICE)].map_or(Region::default(), |(_, r, _)| r);
    if common.length < COMMON_MIN_LEN {
        return Err(PciError::OutOfBar(CAP_COMMON));
    }
    Ok(PciLayout {
        bar,
        common,
        notify,
        notify_multiplier,
        isr,
        device,
        msix,
    })
}

/// The MSI-X capability at `ptr`, and the BARs of its table and PBA.
fn read_msix_cap<C: PciConfig + ?Sized>(cfg: &mut C, ptr: u8) -> (MsixCap, [u8; 2]) {
    let control = cfg.config_read16(ptr + 2);
    let table = cfg.config_read32(ptr + 4);
    let pba = cfg.config_read32(ptr + 8);
    let cap = MsixCap {
        cap: ptr,
        table_size: (control & 0x7ff) + 1,
        table_offset: table & !7,
        pba_offset: pba & !7,
    };
    (cap, [(table & 7) as u8, (pba & 7) as u8])
}

/// The address memory BAR `bar` is assigned, read from configuration space (both halves of a
/// 64-bit BAR). An I/O BAR or an unassigned one (address 0) is an error.
pub fn bar_address<C: PciConfig + ?Sized>(cfg: &mut C, bar: u8) -> Result<u64, PciError> {
    if bar > 5 {
        return Err(PciError::BarUnassigned(bar));
    }
    let reg = cfg::BAR0 + 4 * bar;
    let low = cfg.config_read32(reg);
    if low & 1 != 0 {
        return Err(PciError::BarUnassigned(bar));
    }
    let mut address = u64::from(low & !0xf);
    if (low >> 1) & 3 == 2 && bar < 5 {
        address |= u64::from(cfg.config_read32(reg + 4)) << 32;
    }
    if address == 0 {
        return Err(PciError::BarUnassigned(bar));
    }
    Ok(address)
}

/// The size of memory BAR `bar` by the sizing protocol (all ones written, the mask read back,
/// the address restored), with memory decoding off meanwhile. 0 if it is not a memory BAR.
pub fn bar_size<C: PciConfig + ?Sized>(cfg: &mut C, bar: u8) -> u64 {
    if bar > 5 {
        return 0;
    }
    let reg = cfg::BAR0 + 4 * bar;
    let command = cfg.config_read16(cfg::COMMAND);
    cfg.config_write16(cfg::COMMAND, command & !cfg::COMMAND_MEMORY);
    let low = cfg.config_read32(reg);
    let is64 = low & 1 == 0 && (low >> 1) & 3 == 2 && bar < 5;
    cfg.config_write32(reg, u32::MAX);
    let mut mask = u64::from(cfg.config_read32(reg) & !0xf);
    cfg.config_write32(reg, low);
    if is64 {
        let high = cfg.config_read32(reg + 4);
        cfg.config_write32(reg + 4, u32::MAX);
        mask |= u64::from(cfg.config_read32(reg + 4)) << 32;
        cfg.config_write32(reg + 4, high);
    } else if mask != 0 {
        mask |= 0xffff_ffff_0000_0000;
    }
    cfg.config_write16(cfg::COMMAND, command);
    if low & 1 != 0 || mask == 0 {
        return 0;
    }
    (!mask).wrapping_add(1)
}

/// [`PciBar`] over a BAR mapped as device (uncached) memory, with volatile accesses.
#[derive(Debug)]
pub struct MappedBar {
    base: NonNull<u8>,
    size: u64,
}

// SAFETY: the constructor's contract gives this object exclusive use of the mapping; moving it
// to another CPU moves every access with it.
unsafe impl Send for MappedBar {}

impl MappedBar {
    /// The BAR mapped at `base`, `size` bytes.
    ///
    /// # Safety
    ///
    /// `base` points to `size` bytes of the function's BAR mapped as device (uncached) memory,
    /// 8-byte aligned, valid for the lifetime of the returned value, and accessed by nothing
    /// else while it lives.
    pub unsafe fn new(base: NonNull<u8>, size: u64) -> MappedBar {
        MappedBar { base, size }
    }

    /// A pointer to the `T` at `offset` if it lies inside the mapping and is aligned.
    #[inline]
    fn at<T>(&self, offset: u32) -> Option<*mut T> {
        let len = core::mem::size_of::<T>() as u64;
        if u64::from(offset) + len > self.size || !u64::from(offset).is_multiple_of(len) {
            return None;
        }
        // SAFETY: offset + len ≤ size: inside the mapping (constructor contract).
        Some(unsafe { self.base.as_ptr().add(offset as usize) }.cast::<T>())
    }
}

macro_rules! mapped_access {
    ($read:ident, $write:ident, $t:ty) => {
        #[inline]
        fn $read(&mut self, offset: u32) -> $t {
            match self.at::<$t>(offset) {
                // SAFETY: aligned, inside the mapping this object owns (constructor).
                Some(p) => <$t>::from_le(unsafe { p.read_volatile() }),
                None => 0,
            }
        }
        #[inline]
        fn $write(&mut self, offset: u32, value: $t) {
            if let Some(p) = self.at::<$t>(offset) {
                // SAFETY: aligned, inside the mapping this object owns (constructor).
                unsafe { p.write_volatile(value.to_le()) };
            }
        }
    };
}

impl PciBar for MappedBar {
    fn size(&self) -> u64 {
        self.size
    }
    mapped_access!(read8, write8, u8);
    mapped_access!(read16, write16, u16);
    mapped_access!(read32, write32, u32);
}

/// A virtio device behind a modern virtio-pci function `F` (its configuration space and the
/// BAR with the virtio structures).
pub struct PciTransport<F> {
    func: F,
    layout: PciLayout,
    device_type: u32,
    num_queues: u16,
    /// Notification offset in the BAR per queue (set when the queue is set up).
    notify_at: Vec<u32>,
    /// MSI-X vector per queue ([`NO_VECTOR`] until set up).
    queue_vectors: Vec<u16>,
    config_vector: u16,
}

impl<F> fmt::Debug for PciTransport<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PciTransport")
            .field("layout", &self.layout)
            .field("device_type", &self.device_type)
            .field("queue_vectors", &self.queue_vectors)
            .field("config_vector", &self.config_vector)
            .finish_non_exhaustive()
    }
}

impl<F: PciConfig + PciBar> PciTransport<F> {
    /// Checks the function's identity, walks its capabilities, checks every structure fits in
    /// the BAR `func` maps, and enables memory decoding and bus mastering (INTx disabled: this
    /// transport signals through MSI-X).
    pub fn new(mut func: F) -> Result<Self, PciError> {
        let vendor = func.config_read16(cfg::VENDOR_ID);
        let device = func.config_read16(cfg::DEVICE_ID);
        if vendor != VIRTIO_VENDOR_ID || !(VIRTIO_DEVICE_ID_BASE..=0x107f).contains(&device) {
            return Err(PciError::NotVirtio { vendor, device });
        }
        let layout = find_capabilities(&mut func)?;
        let size = func.size();
        for (t, region) in [
            (CAP_COMMON, layout.common),
            (CAP_NOTIFY, layout.notify),
            (CAP_ISR, layout.isr),
            (CAP_DEVICE, layout.device),
        ] {
            if !region.fits(size) {
                return Err(PciError::OutOfBar(t));
            }
        }
        if let Some(m) = layout.msix {
            let table = Region {
                offset: m.table_offset,
                length: u32::from(m.table_size) * MSIX_ENTRY_SIZE,
            };
            if !table.fits(size) {
                return Err(PciError::OutOfBar(cfg::CAP_ID_MSIX));
            }
        }
        let command = func.config_read16(cfg::COMMAND);
        func.config_write16(
            cfg::COMMAND,
            command | cfg::COMMAND_MEMORY | cfg::COMMAND_MASTER | cfg::COMMAND_INTX_DISABLE,
        );
        let num_queues = func.read16(layout.common.offset + common::NUM_QUEUES);
        Ok(PciTransport {
            func,
            layout,
            device_type: u32::from(device - VIRTIO_DEVICE_ID_BASE),
            num_queues,
            notify_at: alloc::vec![u32::MAX; usize::from(num_queues)],
            queue_vectors: alloc::vec![NO_VECTOR; usize::from(num_queues)],
            config_vector: NO_VECTOR,
        })
    }

    /// What the capability walk found.
    pub fn layout(&self) -> &PciLayout {
        &self.layout
    }

    /// The number of queues the device has.
    pub fn num_queues(&self) -> u16 {
        self.num_queues
    }

    /// The function.
    pub fn function(&self) -> &F {
        &self.func
    }

    /// The function (e.g. for a co-simulation to reach its device model).
    pub fn function_mut(&mut self) -> &mut F {
        &mut self.func
    }

    /// The number of MSI-X table entries (0 without MSI-X).
    pub fn msix_table_size(&self) -> u16 {
        self.layout.msix.map_or(0, |m| m.table_size)
    }

    fn msix_entry(&self, entry: u16) -> Result<(MsixCap, u32), PciError> {
        let m = self.layout.msix.ok_or(PciError::NoMsix)?;
        if entry >= m.table_size {
            return Err(PciError::NoSuchEntry(entry));
        }
        Ok((m, m.table_offset + u32::from(entry) * MSIX_ENTRY_SIZE))
    }

    /// Writes MSI-X table entry `entry`'s message (`address`, `data`) and unmasks it.
    pub fn set_msix_entry(&mut self, entry: u16, address: u64, data: u32) -> Result<(), PciError> {
        let (_, at) = self.msix_entry(entry)?;
        self.func.write32(at, address as u32);
        self.func.write32(at + 4, (address >> 32) as u32);
        self.func.write32(at + 8, data);
        self.func.write32(at + 12, 0);
        Ok(())
    }

    /// Masks (`true`) or unmasks MSI-X table entry `entry`.
    pub fn mask_msix_entry(&mut self, entry: u16, masked: bool) -> Result<(), PciError> {
        let (_, at) = self.msix_entry(entry)?;
        self.func.write32(at + 12, u32::from(masked));
        Ok(())
    }

    /// True if MSI-X entry `entry` has an interrupt pending (held by a mask).
    pub fn msix_pending(&mut self, entry: u16) -> Result<bool, PciError> {
        let (m, _) = self.msix_entry(entry)?;
        let word = m.pba_offset + u32::from(entry / 32) * 4;
        Ok(self.func.read32(word) & (1 << (entry % 32)) != 0)
    }

    /// Enables MSI-X in the capability's Message Control (and clears the function mask).
    /// Returns the Message Control read back.
    pub fn enable_msix(&mut self) -> Result<u16, PciError> {
        let m = self.layout.msix.ok_or(PciError::NoMsix)?;
        let control = self.func.config_read16(m.cap + 2);
        let control = (control | cfg::MSIX_ENABLE) & !cfg::MSIX_FUNCTION_MASK;
        self.func.config_write16(m.cap + 2, control);
        Ok(self.func.config_read16(m.cap + 2))
    }

    /// True if MSI-X is enabled in Message Control.
    pub fn msix_enabled(&mut self) -> bool {
        match self.layout.msix {
            Some(m) => self.func.config_read16(m.cap + 2) & cfg::MSIX_ENABLE != 0,
            None => false,
        }
    }

    fn common_read16(&mut self, offset: u32) -> u16 {
        self.func.read16(self.layout.common.offset + offset)
    }

    fn common_write16(&mut self, offset: u32, value: u16) {
        self.func.write16(self.layout.common.offset + offset, value)
    }

    fn common_write64(&mut self, offset: u32, value: u64) {
        let at = self.layout.common.offset + offset;
        self.func.write32(at, value as u32);
        self.func.write32(at + 4, (value >> 32) as u32);
    }

    /// Writes `vector` to the 16-bit vector register at `offset` (the queue selected) and
    /// reads it back.
    fn try_vector(&mut self, offset: u32, vector: u16) -> u16 {
        self.common_write16(offset, vector);
        self.common_read16(offset)
    }

    /// Assigns MSI-X vector `wanted`, or entry 0 if the device refuses it; None if it refuses
    /// both (reads back [`NO_VECTOR`]).
    fn assign_vector(&mut self, offset: u32, wanted: u16) -> Option<u16> {
        if self.try_vector(offset, wanted) == wanted {
            return Some(wanted);
        }
        (wanted != 0 && self.try_vector(offset, 0) == 0).then_some(0)
    }
}

impl<F: PciConfig + PciBar> Transport for PciTransport<F> {
    fn device_type(&mut self) -> Result<u32, InitError> {
        Ok(self.device_type)
    }

    fn device_features(&mut self) -> u64 {
        let c = self.layout.common.offset;
        let mut offered = 0u64;
        for sel in 0..2u32 {
            self.func.write32(c + common::DEVICE_FEATURE_SELECT, sel);
            offered |= u64::from(self.func.read32(c + common::DEVICE_FEATURE)) << (32 * sel);
        }
        offered
    }

    fn set_driver_features(&mut self, features: u64) {
        let c = self.layout.common.offset;
        for sel in 0..2u32 {
            self.func.write32(c + common::DRIVER_FEATURE_SELECT, sel);
            self.func
                .write32(c + common::DRIVER_FEATURE, (features >> (32 * sel)) as u32);
        }
    }

    fn status(&mut self) -> u32 {
        u32::from(
            self.func
                .read8(self.layout.common.offset + common::DEVICE_STATUS),
        )
    }

    fn set_status(&mut self, status: u32) {
        if status == 0 {
            // A reset drops the device's vector assignments.
            self.queue_vectors.fill(NO_VECTOR);
            self.config_vector = NO_VECTOR;
        }
        self.func.write8(
            self.layout.common.offset + common::DEVICE_STATUS,
            status as u8,
        );
    }

    fn queue_max_size(&mut self, queue: u16) -> u32 {
        if queue >= self.num_queues {
            return 0;
        }
        self.common_write16(common::QUEUE_SELECT, queue);
        u32::from(self.common_read16(common::QUEUE_SIZE))
    }

    fn queue_enabled(&mut self, queue: u16) -> bool {
        if queue >= self.num_queues {
            return false;
        }
        self.common_write16(common::QUEUE_SELECT, queue);
        self.common_read16(common::QUEUE_ENABLE) != 0
    }

    fn setup_config_vector(&mut self) -> Result<(), InitError> {
        if self.layout.msix.is_none() {
            return Ok(());
        }
        let vector = self
            .assign_vector(common::CONFIG_MSIX_VECTOR, 0)
            .ok_or(InitError::VectorRefused(None))?;
        self.config_vector = vector;
        Ok(())
    }

    /// The spec's order (virtio 1.2 §4.1.5.1.3): select, size, MSI-X vector (read back),
    /// ring addresses, notification offset, enable.
    fn setup_queue(&mut self, queue: u16, setup: &QueueSetup) -> Result<(), InitError> {
        let index = usize::from(queue);
        if queue >= self.num_queues {
            return Err(InitError::QueueUnavailable(queue));
        }
        self.common_write16(common::QUEUE_SELECT, queue);
        self.common_write16(common::QUEUE_SIZE, setup.size);
        if let Some(m) = self.layout.msix {
            let wanted = if u32::from(queue) + 1 < u32::from(m.table_size) {
                queue + 1
            } else {
                0
            };
            let vector = self
                .assign_vector(common::QUEUE_MSIX_VECTOR, wanted)
                .ok_or(InitError::VectorRefused(Some(queue)))?;
            self.queue_vectors[index] = vector;
        }
        self.common_write64(common::QUEUE_DESC, setup.desc);
        self.common_write64(common::QUEUE_DRIVER, setup.avail);
        self.common_write64(common::QUEUE_DEVICE, setup.used);
        let notify_off = self.common_read16(common::QUEUE_NOTIFY_OFF);
        let rel = u64::from(notify_off) * u64::from(self.layout.notify_multiplier);
        if rel + 2 > u64::from(self.layout.notify.length) {
            return Err(InitError::NotifyOutOfRange(queue));
        }
        self.notify_at[index] = self.layout.notify.offset + rel as u32;
        self.common_write16(common::QUEUE_ENABLE, 1);
        Ok(())
    }

    /// Needs a common configuration structure that reaches `queue_reset` (0x3a..0x3c).
    fn reset_queue(&mut self, queue: u16, polls: u32) -> Result<(), QueueResetError> {
        if self.layout.common.length < common::QUEUE_RESET + 2 {
            return Err(QueueResetError::Unsupported);
        }
        if queue >= self.num_queues {
            return Err(QueueResetError::NoSuchQueue(queue));
        }
        self.common_write16(common::QUEUE_SELECT, queue);
        self.common_write16(common::QUEUE_RESET, 1);
        for _ in 0..polls {
            if self.common_read16(common::QUEUE_RESET) == 0
                && self.common_read16(common::QUEUE_ENABLE) == 0
            {
                // The reset dropped the queue's vector; `setup_queue` assigns it again.
                self.queue_vectors[usize::from(queue)] = NO_VECTOR;
                return Ok(());
            }
        }
        Err(QueueResetError::Timeout)
    }

    #[inline]
    fn notify(&mut self, queue: u16) {
        if let Some(&at) = self.notify_at.get(usize::from(queue)) {
            if at != u32::MAX {
                self.func.notify(at, queue);
            }
        }
    }

    fn config_generation(&mut self) -> u32 {
        u32::from(
            self.func
                .read8(self.layout.common.offset + common::CONFIG_GENERATION),
        )
    }

    fn read_config_u8(&mut self, offset: u32) -> u8 {
        if offset >= self.layout.device.length {
            return 0;
        }
        self.func.read8(self.layout.device.offset + offset)
    }

    fn read_config_u16(&mut self, offset: u32) -> u16 {
        if offset.saturating_add(2) > self.layout.device.length || !offset.is_multiple_of(2) {
            return 0;
        }
        self.func.read16(self.layout.device.offset + offset)
    }

    fn interrupt_status(&mut self) -> u32 {
        // Reading the ISR acknowledges it.
        u32::from(self.func.read8(self.layout.isr.offset))
    }

    fn ack_interrupt(&mut self, _bits: u32) {}

    fn queue_vector(&self, queue: u16) -> Option<u16> {
        self.queue_vectors
            .get(usize::from(queue))
            .copied()
            .filter(|&v| v != NO_VECTOR)
    }

    fn config_vector(&self) -> Option<u16> {
        (self.config_vector != NO_VECTOR).then_some(self.config_vector)
    }
}
