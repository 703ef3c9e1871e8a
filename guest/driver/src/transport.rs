//! The register seam: virtio-mmio (virtio 1.x, Version 2) register access ([`Transport`]) and
//! its bare-metal implementation over a mapped MMIO window ([`MmioTransport`]).

use core::ptr::NonNull;

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

/// Register access to one virtio-mmio device.
///
/// # Contract
///
/// This is a safe trait: the driver's memory safety does not depend on it. Every value the
/// driver reads through it (features, queue sizes, configuration bytes, interrupt status) is
/// validated or only steers protocol decisions. What an implementation must do for the driver to
/// *work*:
///
/// - `read32`/`write32` act as 32-bit accesses to the register at `offset` of a virtio-mmio
///   Version 2 window (offsets from [`regs`], all below [`regs::CONFIG`], 4-byte aligned);
/// - `read_config_u8(offset)` reads byte `offset` of the device configuration space (window
///   offset `0x100 + offset`); `read_config_u16` reads the 16-bit field there (the spec wants
///   16-bit fields read with one aligned 16-bit access; the default composes two byte reads,
///   which is enough for a device model that accepts any width);
/// - `notify(queue)` is the QueueNotify write of `queue`. It must not let the device observe the
///   notification before the ring writes that precede the call: the driver issues a full fence
///   (`SeqCst`) just before, and an eventfd `write(2)` (co-simulation) or an uncached MMIO store
///   (x86) keeps that order.
///
/// Methods take `&mut self`: the driver owns its transport, so a co-simulation transport can own
/// the device model's register state without a lock.
pub trait Transport {
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

/// [`Transport`] over a mapped virtio-mmio window, with volatile accesses (bare metal).
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

impl Transport for MmioTransport {
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
        t.notify(1);
        assert_eq!(t.read_config_u8(1), 0xaa);
        assert_eq!(t.read_config_u16(6), 1);
        // Out of range or misaligned: ignored, reads 0.
        t.write32(regs::CONFIG, 0xdead);
        t.write32(regs::STATUS + 1, 0xdead);
        assert_eq!(t.read32(regs::CONFIG + 4), 0);
        assert_eq!(t.read_config_u8(CONFIG_SPACE_SIZE), 0);
        assert_eq!(t.read_config_u16(7), 0);
        assert_eq!(window[(regs::STATUS / 4) as usize], status::ACKNOWLEDGE);
        assert_eq!(window[(regs::QUEUE_NOTIFY / 4) as usize], 1);
        assert_eq!(
            window[(regs::CONFIG / 4) as usize],
            u32::from_le_bytes([0x02, 0xaa, 0xbb, 0xcc])
        );
    }
}
