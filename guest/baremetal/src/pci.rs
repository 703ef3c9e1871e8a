//! `transport=pci`: finds the virtio-net function on PCI bus 0 through configuration
//! mechanism #1 (ports 0xCF8/0xCFC), sets it up and hands the driver loop its transport.
//!
//! Everything that touches configuration space runs here, once, in kernel mode (port I/O is
//! kernel-only: the TSS has no I/O bitmap). [`init`]:
//! 1. scans bus 0 (every device, every function of a multi-function device) for vendor 0x1af4
//!    device 0x1041;
//! 2. walks its capabilities ([`vnet_driver::pci::find_capabilities`]) to learn the BAR;
//! 3. reads that BAR's address; if it is unassigned (0), assigns one from [`BAR_WINDOW`] and
//!    says so on the console. The BAR must lie in the MMIO hole below the IOAPIC, which the
//!    page tables map uncached and user-accessible (2 MiB pages), so no mapping is added;
//! 4. builds the [`PciTransport`] (memory space and bus mastering on, INTx off), programs
//!    every MSI-X entry `e` of the table (up to [`MSIX_VECTORS`], enough for 16 queue pairs
//!    and the control queue) to LAPIC vector `MSIX_VECTOR_BASE + e` on this CPU
//!    (address 0xFEE00000 | apic_id << 12, data = vector: fixed delivery, edge), unmasked, and
//!    enables MSI-X.
//!
//! The driver loop (either ring) then takes the transport with [`take_transport`]; from then on
//! only BAR0 (memory) is accessed.

use alloc::boxed::Box;
use core::arch::asm;
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicPtr, Ordering};

use vnet_driver::pci::{
    bar_address, bar_size, find_capabilities, MappedBar, PciConfig, PciError, PciTransport,
    VIRTIO_NET_DEVICE_ID, VIRTIO_VENDOR_ID,
};

use crate::arch::cpu::MMIO_START;
use crate::arch::{MSIX_VECTORS, MSIX_VECTOR_BASE};
use crate::sys;

/// Where an unassigned BAR is placed: above the VMM's virtio-mmio slots (from
/// `MMIO_START`), below the IOAPIC (0xFEC00000).
pub const BAR_WINDOW: u64 = 0xe000_0000;
/// End of the usable MMIO hole (the IOAPIC page starts here).
const HOLE_END: u64 = 0xfec0_0000;
/// The configuration-space address and data ports.
const CONFIG_ADDRESS: u16 = 0xcf8;
const CONFIG_DATA: u16 = 0xcfc;

/// The transport [`init`] set up, until the driver loop takes it.
static TRANSPORT: AtomicPtr<GuestPci> = AtomicPtr::new(core::ptr::null_mut());

/// The transport over this guest's function.
pub type GuestPci = PciTransport<(PortConfig, MappedBar)>;

/// One function's configuration space through ports 0xCF8/0xCFC. Kernel mode only.
#[derive(Clone, Copy, Debug)]
pub struct PortConfig {
    /// Bus, device and function in CONFIG_ADDRESS layout (bits 23..8).
    bdf: u32,
}

impl PortConfig {
    fn new(bus: u8, device: u8, function: u8) -> PortConfig {
        PortConfig {
            bdf: u32::from(bus) << 16 | u32::from(device & 31) << 11 | u32::from(function & 7) << 8,
        }
    }

    fn select(&self, offset: u8) {
        outl(
            CONFIG_ADDRESS,
            0x8000_0000 | self.bdf | u32::from(offset & 0xfc),
        );
    }
}

impl PciConfig for PortConfig {
    fn config_read32(&mut self, offset: u8) -> u32 {
        self.select(offset);
        inl(CONFIG_DATA)
    }

    fn config_write32(&mut self, offset: u8, value: u32) {
        self.select(offset);
        outl(CONFIG_DATA, value);
    }

    fn config_write16(&mut self, offset: u8, value: u16) {
        self.select(offset);
        outw(CONFIG_DATA + u16::from(offset & 2), value);
    }
}

fn outl(port: u16, value: u32) {
    // SAFETY: configuration mechanism #1 ports; writing them selects or writes a PCI
    // configuration register and touches no memory of this program. Kernel mode (set-up).
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    };
}

fn outw(port: u16, value: u16) {
    // SAFETY: as in `outl`.
    unsafe {
        asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags))
    };
}

fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: as in `outl`; reading the data port has no side effect on memory.
    unsafe {
        asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags))
    };
    value
}

/// Why `transport=pci` could not set the device up.
#[derive(Debug)]
pub enum SetupError {
    /// No virtio-net function on bus 0.
    NotFound,
    /// The function's capabilities, BAR or MSI-X are unusable.
    Pci(PciError),
    /// The BAR is where this program has no uncached mapping.
    BarOutsideHole {
        /// Its address.
        address: u64,
        /// Its size.
        size: u64,
    },
    /// The function has no MSI-X (this guest takes no INTx).
    NoMsix,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::NotFound => write!(
                f,
                "no virtio-net function ({VIRTIO_VENDOR_ID:04x}:{VIRTIO_NET_DEVICE_ID:04x}) on PCI bus 0 \
                 (start the VMM with --net …,transport=pci)"
            ),
            SetupError::Pci(e) => write!(f, "{e}"),
            SetupError::BarOutsideHole { address, size } => write!(
                f,
                "BAR at {address:#x} ({size:#x} bytes) is outside the MMIO hole \
                 [{MMIO_START:#x}, {HOLE_END:#x})"
            ),
            SetupError::NoMsix => write!(f, "the function has no MSI-X capability"),
        }
    }
}

impl From<PciError> for SetupError {
    fn from(e: PciError) -> Self {
        SetupError::Pci(e)
    }
}

/// The first virtio-net function on bus 0.
fn find() -> Option<PortConfig> {
    for device in 0..32u8 {
        let mut functions = 1;
        let mut function = 0;
        while function < functions {
            let mut cfg = PortConfig::new(0, device, function);
            let id = cfg.config_read32(0);
            if id & 0xffff == 0xffff {
                // No function here (a master abort reads all ones).
                if function == 0 {
                    break;
                }
            } else {
                if function == 0 && cfg.config_read8(vnet_driver::pci::cfg::HEADER_TYPE) & 0x80 != 0
                {
                    functions = 8;
                }
                if id == u32::from(VIRTIO_NET_DEVICE_ID) << 16 | u32::from(VIRTIO_VENDOR_ID) {
                    return Some(cfg);
                }
            }
            function += 1;
        }
    }
    None
}

/// Finds and sets the function up, MSI-X entries aimed at `apic_id`. Kernel mode, once.
pub fn init(apic_id: u32) -> Result<(), SetupError> {
    let mut cfg = find().ok_or(SetupError::NotFound)?;
    let layout = find_capabilities(&mut cfg)?;
    if layout.msix.is_none() {
        return Err(SetupError::NoMsix);
    }
    let size = bar_size(&mut cfg, layout.bar);
    if size == 0 {
        return Err(PciError::BarUnassigned(layout.bar).into());
    }
    let address = match bar_address(&mut cfg, layout.bar) {
        Ok(a) => a,
        Err(PciError::BarUnassigned(_)) => {
            let address = BAR_WINDOW.next_multiple_of(size);
            let reg = vnet_driver::pci::cfg::BAR0 + 4 * layout.bar;
            let low = cfg.config_read32(reg);
            cfg.config_write32(reg, (address as u32) | (low & 0xf));
            if (low >> 1) & 3 == 2 {
                cfg.config_write32(reg + 4, (address >> 32) as u32);
            }
            let mut line = sys::LineBuf::new();
            let _ = fmt::Write::write_fmt(
                &mut line,
                format_args!(
                    "driver-guest: BAR{} was unassigned: placed at {address:#x} ({size:#x} bytes)\n",
                    layout.bar
                ),
            );
            sys::write(line.as_bytes());
            bar_address(&mut cfg, layout.bar)?
        }
        Err(e) => return Err(e.into()),
    };
    if address < MMIO_START || address.saturating_add(size) > HOLE_END {
        return Err(SetupError::BarOutsideHole { address, size });
    }
    let Some(base) = NonNull::new(address as *mut u8) else {
        return Err(SetupError::BarOutsideHole { address, size });
    };
    // SAFETY: the BAR's `size` bytes at `address` lie in the MMIO hole, which the page tables
    // identity-map uncached (and user-accessible); the address is size-aligned (≥ 16 bytes,
    // a power of two), and nothing else in this program accesses the BAR.
    let bar = unsafe { MappedBar::new(base, size) };
    let mut transport = PciTransport::new((cfg, bar))?;
    let entries = usize::from(transport.msix_table_size()).min(MSIX_VECTORS);
    let message_address = 0xfee0_0000 | u64::from(apic_id & 0xff) << 12;
    for entry in 0..entries as u16 {
        let vector = u32::from(MSIX_VECTOR_BASE) + u32::from(entry);
        transport.set_msix_entry(entry, message_address, vector)?;
    }
    transport.enable_msix()?;
    let previous = TRANSPORT.swap(Box::into_raw(Box::new(transport)), Ordering::AcqRel);
    debug_assert!(previous.is_null(), "init runs once");
    Ok(())
}

/// The transport [`init`] set up (once; None before `init` or after the first call).
pub fn take_transport() -> Option<GuestPci> {
    let ptr = TRANSPORT.swap(core::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: a non-null pointer in TRANSPORT came from `Box::into_raw` in `init` and the swap
    // took it out, so this is its only owner.
    (!ptr.is_null()).then(|| *unsafe { Box::from_raw(ptr) })
}
