//! The transport seam: the virtio operations the driver needs ([`Transport`]), virtio-mmio
//! (virtio 1.x, Version 2) register access ([`MmioRegisters`], a [`Transport`] through a blanket
//! implementation) and its bare-metal implementation over a mapped MMIO window
//! ([`MmioTransport`]). The virtio-pci transport is in [`crate::pci`].

use core::ptr::NonNull;

use crate::error::InitError;
use crate::reset::QueueResetError;

/// Register offsets of the virtio-mmio window (virtio 1.2 §4.2.2).
pub mod regs {
    /// "virt" (0x74726976).
    pub const MAGIC_VALUE: u32 = 0x000;
    /// Device version (2 for virtio 1.x).
    pub const VERSION: u32 = 0x004;
    /// Virtio device type (1 for net).
    pub const DEVICE_ID: u32 = 0x008;
    /// Vendor ID.
    pub const VENDOR_ID: u32 = 0x00c;
    /// Device features, 32 bits selected by DEVICE_FEATURES_SEL.
    pub const DEVICE_FEATURES: u32 = 0x010;
    /// Device features word selector.
    pub const DEVICE_FEATURES_SEL: u32 = 0x014;
    /// Driver (acknowledged) features, 32 bits selected by DRIVER_FEATURES_SEL.
    pub const DRIVER_FEATURES: u32 = 0x020;
    /// Driver features word selector.
    pub const DRIVER_FEATURES_SEL: u32 = 0x024;
    /// Queue selector.
    pub const QUEUE_SEL: u32 = 0x030;
    /// Maximum size of the selected queue (0: the queue does not exist).
    pub const QUEUE_NUM_MAX: u32 = 0x034;
    /// Size of the selected queue.
    pub const QUEUE_NUM: u32 = 0x038;
    /// Ready bit of the selected queue.
    pub const QUEUE_READY: u32 = 0x044;
    /// Queue notification (the value is the queue index).
    pub const QUEUE_NOTIFY: u32 = 0x050;
    /// Pending interrupt causes.
    pub const INTERRUPT_STATUS: u32 = 0x060;
    /// Acknowledges interrupt causes.
    pub const INTERRUPT_ACK: u32 = 0x064;
    /// Device status.
    pub const STATUS: u32 = 0x070;
    /// Descriptor table address, low 32 bits.
    pub const QUEUE_DESC_LOW: u32 = 0x080;
    /// Descriptor table address, high 32 bits.
    pub const QUEUE_DESC_HIGH: u32 = 0x084;
    /// Available ring ("driver area") address, low 32 bits.
    pub const QUEUE_AVAIL_LOW: u32 = 0x090;
    /// Available ring address, high 32 bits.
    pub const QUEUE_AVAIL_HIGH: u32 = 0x094;
    /// Used ring ("device area") address, low 32 bits.
    pub const QUEUE_USED_LOW: u32 = 0x0a0;
    /// Used ring address, high 32 bits.
    pub const QUEUE_USED_HIGH: u32 = 0x0a4;
    /// Per-queue reset of the selected queue (with VIRTIO_F_RING_RESET): write 1 to reset,
    /// reads 1 while the reset is ongoing.
    pub const QUEUE_RESET: u32 = 0x0c0;
    /// Configuration generation.
    pub const CONFIG_GENERATION: u32 = 0x0fc;
    /// Start of the device configuration space.
    pub const CONFIG: u32 = 0x100;
}

/// The magic value at [`regs::MAGIC_VALUE`].
pub const MAGIC: u32 = 0x7472_6976;
/// The only register layout version supported (virtio 1.x "modern").
pub const VERSION_MODERN: u32 = 2;
/// Bytes of configuration space [`MmioTransport`] lets the driver read.
pub const CONFIG_SPACE_SIZE: u32 = 0x100;
/// Bytes of MMIO window [`MmioTransport::new`] requires (registers + configuration space).
pub const WINDOW_SIZE: usize = (regs::CONFIG + CONFIG_SPACE_SIZE) as usize;

/// Device status bits (virtio 1.2 §2.1).
pub mod status {
    /// The driver noticed the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The driver knows how to drive it.
    pub const DRIVER: u32 = 2;
    /// The driver is ready.
    pub const DRIVER_OK: u32 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u32 = 8;
    /// The device hit an error and needs a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u32 = 0x80;
}

/// InterruptStatus: used buffers were returned on some queue.
pub const INT_USED_BUFFER: u32 = 1;
/// InterruptStatus: the configuration changed.
pub const INT_CONFIG_CHANGE: u32 = 2;

/// What a transport must offer the driver: the virtio operations of virtio 1.2 §2 and
/// §3.1, in the spirit of Linux's `virtio_config_ops`, independent of the register layout.
///
/// virtio-mmio devices get it from [`MmioRegisters`] (a blanket implementation maps every
/// operation onto the register window, exactly as the driver always did); virtio-pci devices
/// from [`crate::pci::PciTransport`].
///
/// # Contract
///
/// This is a safe trait: the driver's memory safety does not depend on it. Every value the
/// driver reads through it (features, queue sizes, configuration bytes, interrupt status) is
/// validated or only steers protocol decisions. [`Transport::notify`] must not let the device
/// observe the notification before the ring writes that precede the call: the driver issues a
/// full fence (`SeqCst`) just before, and an eventfd `write(2)` (co-simulation) or an uncached
/// MMIO store (x86) keeps that order.
///
/// Methods take `&mut self`: the driver owns its transport, so a co-simulation transport can own
/// the device model's register state without a lock. The driver is generic over the transport
/// (no `dyn`): `notify`, the only operation on the datapath, inlines into the kick.
pub trait Transport {
    /// The virtio device type (1 for net), after checking that the transport found a device
    /// it can drive (virtio-mmio: magic value and register layout version).
    fn device_type(&mut self) -> Result<u32, InitError>;
    /// The 64 feature bits the device offers.
    fn device_features(&mut self) -> u64;
    /// Writes the 64 feature bits the driver acknowledges.
    fn set_driver_features(&mut self, features: u64);
    /// Reads the device status.
    fn status(&mut self) -> u32;
    /// Writes the device status (0 resets the device; completion is polled with
    /// [`Transport::status`]).
    fn set_status(&mut self, status: u32);
    /// The largest size queue `queue` allows (0: no such queue).
    fn queue_max_size(&mut self, queue: u16) -> u32;
    /// True if queue `queue` is already enabled (in use: the driver must not set it up).
    fn queue_enabled(&mut self, queue: u16) -> bool;
    /// Assigns the configuration-change interrupt vector where the transport has per-source
    /// vectors (virtio-pci with MSI-X); called after feature negotiation, before the queues are
    /// set up. Nothing to do elsewhere.
    fn setup_config_vector(&mut self) -> Result<(), InitError> {
        Ok(())
    }
    /// Sets queue `queue` up with `setup` (size, ring addresses, and the transport's interrupt
    /// vector for it where it has per-queue vectors) and enables it.
    fn setup_queue(&mut self, queue: u16, setup: &QueueSetup) -> Result<(), InitError>;
    /// Notifies the device that queue `queue` has new available buffers.
    fn notify(&mut self, queue: u16);
    /// Resets queue `queue` alone (VIRTIO_F_RING_RESET negotiated, DRIVER_OK set; virtio 1.2
    /// §2.6.1): selects it, writes 1 to its reset register, and polls (at most `polls` reads)
    /// until the reset register reads 0 and the queue reads disabled. On `Ok` the device no
    /// longer touches the queue's rings or buffers; the driver brings it back with
    /// [`Transport::setup_queue`]. The default refuses (a transport without the register).
    fn reset_queue(&mut self, queue: u16, polls: u32) -> Result<(), QueueResetError> {
        let _ = (queue, polls);
        Err(QueueResetError::Unsupported)
    }
    /// The configuration generation (0 where the transport has none).
    fn config_generation(&mut self) -> u32;
    /// Reads byte `offset` of the device configuration space.
    fn read_config_u8(&mut self, offset: u32) -> u8;
    /// Reads the little-endian 16-bit field at `offset` (2-aligned) of the configuration space.
    fn read_config_u16(&mut self, offset: u32) -> u16 {
        u16::from_le_bytes([self.read_config_u8(offset), self.read_config_u8(offset + 1)])
    }
    /// Reads the pending interrupt causes of a shared interrupt line ([`INT_USED_BUFFER`],
    /// [`INT_CONFIG_CHANGE`]); the caller acknowledges them with
    /// [`Transport::ack_interrupt`]. (On virtio-pci the read itself acknowledges.)
    fn interrupt_status(&mut self) -> u32;
    /// Acknowledges interrupt causes `bits` read with [`Transport::interrupt_status`].
    fn ack_interrupt(&mut self, bits: u32);
    /// The MSI-X vector queue `queue` signals on, if the transport assigned one (virtio-pci with
    /// MSI-X); None means the shared line ([`Transport::interrupt_status`]).
    fn queue_vector(&self, queue: u16) -> Option<u16> {
        let _ = queue;
        None
    }
    /// The MSI-X vector configuration changes are signalled on, if any.
    fn config_vector(&self) -> Option<u16> {
        None
    }
}

/// A queue's size and ring addresses (guest-physical), for [`Transport::setup_queue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSetup {
    /// Number of descriptors (a power of two ≤ the queue's maximum).
    pub size: u16,
    /// Descriptor table.
    pub desc: u64,
    /// Available ring ("driver area").
    pub avail: u64,
    /// Used ring ("device area").
    pub used: u64,
}

/// Register access to one virtio-mmio device; every such type is a [`Transport`].
///
/// # Contract
///
/// A safe trait, like [`Transport`]. What an implementation must do for the driver to *work*:
///
/// - `read32`/`write32` act as 32-bit accesses to the register at `offset` of a virtio-mmio
///   Version 2 window (offsets from [`regs`], all below [`regs::CONFIG`], 4-byte aligned);
/// - `read_config_u8(offset)` reads byte `offset` of the device configuration space (window
///   offset `0x100 + offset`); `read_config_u16` reads the 16-bit field there (the spec wants
///   16-bit fields read with one aligned 16-bit access; the default composes two byte reads,
///   which is enough for a device model that accepts any width);
/// - `notify(queue)` is the QueueNotify write of `queue`, with the ordering of
///   [`Transport::notify`].
pub trait MmioRegisters {
    /// Reads the 32-bit register at `offset`.
    fn read32(&mut self, offset: u32) -> u32;
    /// Writes the 32-bit register at `offset`.
    fn write32(&mut self, offset: u32, value: u32);
    /// Reads byte `offset` of the device configuration space.
    fn read_config_u8(&mut self, offset: u32) -> u8;
    /// Reads the little-endian 16-bit field at `offset` (2-aligned) of the configuration space.
    fn read_config_u16(&mut self, offset: u32) -> u16 {
        u16::from_le_bytes([self.read_config_u8(offset), self.read_config_u8(offset + 1)])
    }
    /// Notifies the device that queue `queue` has new available buffers.
    fn notify(&mut self, queue: u16);
}

/// The virtio operations over a virtio-mmio register window (virtio 1.2 §4.2.3).
impl<R: MmioRegisters> Transport for R {
    fn device_type(&mut self) -> Result<u32, InitError> {
        let magic = self.read32(regs::MAGIC_VALUE);
        if magic != MAGIC {
            return Err(InitError::BadMagic(magic));
        }
        let version = self.read32(regs::VERSION);
        if version != VERSION_MODERN {
            return Err(InitError::UnsupportedVersion(version));
        }
        Ok(self.read32(regs::DEVICE_ID))
    }

    fn device_features(&mut self) -> u64 {
        let mut offered = 0u64;
        for sel in 0..2u32 {
            self.write32(regs::DEVICE_FEATURES_SEL, sel);
            offered |= u64::from(self.read32(regs::DEVICE_FEATURES)) << (32 * sel);
        }
        offered
    }

    fn set_driver_features(&mut self, features: u64) {
        for sel in 0..2u32 {
            self.write32(regs::DRIVER_FEATURES_SEL, sel);
            self.write32(regs::DRIVER_FEATURES, (features >> (32 * sel)) as u32);
        }
    }

    fn status(&mut self) -> u32 {
        self.read32(regs::STATUS)
    }

    fn set_status(&mut self, status: u32) {
        self.write32(regs::STATUS, status);
    }

    fn queue_max_size(&mut self, queue: u16) -> u32 {
        self.write32(regs::QUEUE_SEL, u32::from(queue));
        self.read32(regs::QUEUE_NUM_MAX)
    }

    fn queue_enabled(&mut self, queue: u16) -> bool {
        self.write32(regs::QUEUE_SEL, u32::from(queue));
        self.read32(regs::QUEUE_READY) != 0
    }

    fn setup_queue(&mut self, queue: u16, setup: &QueueSetup) -> Result<(), InitError> {
        self.write32(regs::QUEUE_SEL, u32::from(queue));
        self.write32(regs::QUEUE_NUM, u32::from(setup.size));
        for (low, addr) in [
            (regs::QUEUE_DESC_LOW, setup.desc),
            (regs::QUEUE_AVAIL_LOW, setup.avail),
            (regs::QUEUE_USED_LOW, setup.used),
        ] {
            self.write32(low, addr as u32);
            self.write32(low + 4, (addr >> 32) as u32);
        }
        self.write32(regs::QUEUE_READY, 1);
        Ok(())
    }

    #[inline]
    fn notify(&mut self, queue: u16) {
        MmioRegisters::notify(self, queue);
    }

    fn reset_queue(&mut self, queue: u16, polls: u32) -> Result<(), QueueResetError> {
        self.write32(regs::QUEUE_SEL, u32::from(queue));
        self.write32(regs::QUEUE_RESET, 1);
        for _ in 0..polls {
            if self.read32(regs::QUEUE_RESET) == 0 && self.read32(regs::QUEUE_READY) == 0 {
                return Ok(());
            }
        }
        Err(QueueResetError::Timeout)
    }

    fn config_generation(&mut self) -> u32 {
        self.read32(regs::CONFIG_GENERATION)
    }

    fn read_config_u8(&mut self, offset: u32) -> u8 {
        MmioRegisters::read_config_u8(self, offset)
    }

    fn read_config_u16(&mut self, offset: u32) -> u16 {
        MmioRegisters::read_config_u16(self, offset)
    }

    fn interrupt_status(&mut self) -> u32 {
        self.read32(regs::INTERRUPT_STATUS)
    }

    fn ack_interrupt(&mut self, bits: u32) {
        self.write32(regs::INTERRUPT_ACK, bits);
    }
}

/// [`MmioRegisters`] (hence [`Transport`]) over a mapped virtio-mmio window, with volatile accesses (bare metal).
#[derive(Debug)]
pub struct MmioTransport {
    base: NonNull<u8>,
}

// SAFETY: the constructor's contract gives this object exclusive use of the window; moving it
// to another CPU moves every access with it.
unsafe impl Send for MmioTransport {}

impl MmioTransport {
    /// A transport over the window mapped at `base`.
    ///
    /// # Safety
    ///
    /// `base` points to at least [`WINDOW_SIZE`] bytes of a virtio-mmio device's register
    /// window, mapped as device (uncached) memory, 4-byte aligned, valid for the lifetime of the
    /// returned value, and accessed by nothing else while it lives.
    pub unsafe fn new(base: NonNull<u8>) -> MmioTransport {
        MmioTransport { base }
    }

    /// A pointer to the 32-bit register at `offset`, if it is one.
    fn register(&self, offset: u32) -> Option<*mut u32> {
        if offset >= regs::CONFIG || !offset.is_multiple_of(4) {
            return None;
        }
        // SAFETY: `offset` < 0x100 ≤ WINDOW_SIZE: inside the window (constructor contract).
        Some(unsafe { self.base.as_ptr().add(offset as usize) }.cast::<u32>())
    }
}

impl MmioRegisters for MmioTransport {
    fn read32(&mut self, offset: u32) -> u32 {
        match self.register(offset) {
            // SAFETY: an aligned register inside the window this object owns (constructor).
            Some(reg) => u32::from_le(unsafe { reg.read_volatile() }),
            None => 0,
        }
    }

    fn write32(&mut self, offset: u32, value: u32) {
        if let Some(reg) = self.register(offset) {
            // SAFETY: an aligned register inside the window this object owns (constructor).
            unsafe { reg.write_volatile(value.to_le()) };
        }
    }

    fn read_config_u8(&mut self, offset: u32) -> u8 {
        if offset >= CONFIG_SPACE_SIZE {
            return 0;
        }
        // SAFETY: 0x100 + offset < WINDOW_SIZE: inside the window (constructor contract).
        unsafe {
            self.base
                .as_ptr()
                .add((regs::CONFIG + offset) as usize)
                .read_volatile()
        }
    }

    fn read_config_u16(&mut self, offset: u32) -> u16 {
        if offset >= CONFIG_SPACE_SIZE - 1 || !offset.is_multiple_of(2) {
            return 0;
        }
        // SAFETY: 0x100 + offset + 2 ≤ WINDOW_SIZE: inside the window, and 2-aligned (the base
        // is 4-aligned by the constructor contract).
        let raw = unsafe {
            self.base
                .as_ptr()
                .add((regs::CONFIG + offset) as usize)
                .cast::<u16>()
                .read_volatile()
        };
        u16::from_le(raw)
    }

    fn notify(&mut self, queue: u16) {
        self.write32(regs::QUEUE_NOTIFY, u32::from(queue));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn mmio_transport_accesses_the_window() {
        // A fake window in ordinary memory, 4-byte aligned.
        let mut window = vec![0u32; WINDOW_SIZE / 4];
        window[0] = MAGIC.to_le();
        window[(regs::CONFIG / 4) as usize] = u32::from_le_bytes([0x02, 0xaa, 0xbb, 0xcc]);
        window[(regs::CONFIG / 4 + 1) as usize] = u32::from_le_bytes([0xdd, 0xee, 0x01, 0x00]);
        let base = NonNull::new(window.as_mut_ptr().cast::<u8>()).expect("non-null");
        // SAFETY: `window` is WINDOW_SIZE bytes, 4-aligned, outlives `t`, and is only accessed
        // through `t` until the reads at the end (after the last use of `t`).
        let mut t = unsafe { MmioTransport::new(base) };
        assert_eq!(t.read32(regs::MAGIC_VALUE), MAGIC);
        t.write32(regs::STATUS, status::ACKNOWLEDGE);
        MmioRegisters::notify(&mut t, 1);
        assert_eq!(MmioRegisters::read_config_u8(&mut t, 1), 0xaa);
        assert_eq!(MmioRegisters::read_config_u16(&mut t, 6), 1);
        // Out of range or misaligned: ignored, reads 0.
        t.write32(regs::CONFIG, 0xdead);
        t.write32(regs::STATUS + 1, 0xdead);
        assert_eq!(t.read32(regs::CONFIG + 4), 0);
        assert_eq!(MmioRegisters::read_config_u8(&mut t, CONFIG_SPACE_SIZE), 0);
        assert_eq!(MmioRegisters::read_config_u16(&mut t, 7), 0);
        // The virtio operations go through the same registers.
        assert_eq!(Transport::status(&mut t), status::ACKNOWLEDGE);
        Transport::ack_interrupt(&mut t, INT_USED_BUFFER);
        assert_eq!(window[(regs::INTERRUPT_ACK / 4) as usize], INT_USED_BUFFER);
        assert_eq!(
            Transport::device_type(&mut t),
            Err(InitError::UnsupportedVersion(0))
        );
        assert_eq!(window[(regs::STATUS / 4) as usize], status::ACKNOWLEDGE);
        assert_eq!(window[(regs::QUEUE_NOTIFY / 4) as usize], 1);
        assert_eq!(
            window[(regs::CONFIG / 4) as usize],
            u32::from_le_bytes([0x02, 0xaa, 0xbb, 0xcc])
        );
    }
}
