//! The interrupt controllers: the legacy PICs masked, the local APIC enabled with a periodic
//! tick, and one IOAPIC pin routed to the device vector (edge-triggered: a KVM irqfd without a
//! resample fd delivers a pulse per signal).

use core::ptr::{read_volatile, write_volatile};

use super::cpu::outb;
use super::{SPURIOUS_VECTOR, TIMER_VECTOR};

const LAPIC_BASE: usize = 0xfee0_0000;
const LAPIC_ID: usize = 0x20;
const LAPIC_TPR: usize = 0x80;
const LAPIC_SVR: usize = 0xf0;
const LAPIC_LVT_TIMER: usize = 0x320;
const LAPIC_LVT_LINT0: usize = 0x350;
const LAPIC_LVT_ERROR: usize = 0x370;
const LAPIC_TIMER_INITIAL: usize = 0x380;
const LAPIC_TIMER_DIVIDE: usize = 0x3e0;
const LVT_MASKED: u32 = 1 << 16;
const LVT_PERIODIC: u32 = 1 << 17;
const SVR_ENABLE: u32 = 1 << 8;
/// Divide by 16.
const TIMER_DIVIDE_16: u32 = 0x3;
/// About 10 ms at KVM's 1 GHz APIC bus, divided by 16: the tick only bounds waits.
const TIMER_COUNT: u32 = 625_000;

const IOAPIC_BASE: usize = 0xfec0_0000;
const IOAPIC_REGSEL: usize = 0x00;
const IOAPIC_WINDOW: usize = 0x10;
const IOAPIC_REDTBL: u32 = 0x10;
/// Pins of KVM's in-kernel IOAPIC.
pub const IOAPIC_PINS: u32 = 24;

fn lapic_write(reg: usize, value: u32) {
    // SAFETY: a 32-bit register of the local APIC page, identity-mapped uncached; the register
    // offsets are the architectural ones.
    unsafe { write_volatile((LAPIC_BASE + reg) as *mut u32, value) };
}

fn lapic_read(reg: usize) -> u32 {
    // SAFETY: as in `lapic_write`.
    unsafe { read_volatile((LAPIC_BASE + reg) as *const u32) }
}

fn ioapic_write(reg: u32, value: u32) {
    // SAFETY: IOREGSEL and IOWIN of the IOAPIC page, identity-mapped uncached.
    unsafe {
        write_volatile((IOAPIC_BASE + IOAPIC_REGSEL) as *mut u32, reg);
        write_volatile((IOAPIC_BASE + IOAPIC_WINDOW) as *mut u32, value);
    }
}

/// Reads the local APIC's ID register: a side-effect-free MMIO read that KVM's in-kernel local
/// APIC answers (used by `calibrate=` as a no-op exit). Either ring: the page is mapped
/// user-accessible.
pub fn read_id() -> u32 {
    lapic_read(LAPIC_ID)
}

/// Restarts the periodic tick with `count` (APIC bus cycles / 16) instead of the usual ~10 ms,
/// or with the usual count for `None`. Either ring (the page is mapped user-accessible).
pub fn restart_tick(count: Option<u32>) {
    lapic_write(LAPIC_TIMER_INITIAL, count.unwrap_or(TIMER_COUNT));
}

/// This CPU's local APIC ID (the destination of its MSI messages).
pub fn apic_id() -> u32 {
    lapic_read(LAPIC_ID) >> 24
}

/// Masks the PICs, enables the local APIC with the tick, and routes `gsi` to `vector` on this
/// CPU (edge, active high). Kernel mode, interrupts off.
pub fn init(gsi: Option<u32>, vector: u8) {
    // The 8259s also see GSIs 0-15 in KVM's default routing: mask them, and LINT0 (ExtINT).
    outb(0x21, 0xff);
    outb(0xa1, 0xff);
    lapic_write(LAPIC_LVT_LINT0, LVT_MASKED);
    lapic_write(LAPIC_LVT_ERROR, LVT_MASKED);
    lapic_write(LAPIC_TPR, 0);
    lapic_write(LAPIC_SVR, SVR_ENABLE | u32::from(SPURIOUS_VECTOR));
    lapic_write(LAPIC_TIMER_DIVIDE, TIMER_DIVIDE_16);
    lapic_write(LAPIC_LVT_TIMER, LVT_PERIODIC | u32::from(TIMER_VECTOR));
    lapic_write(LAPIC_TIMER_INITIAL, TIMER_COUNT);
    if let Some(gsi) = gsi.filter(|&g| g < IOAPIC_PINS) {
        let apic_id = lapic_read(LAPIC_ID) >> 24;
        let entry = IOAPIC_REDTBL + 2 * gsi;
        ioapic_write(entry + 1, apic_id << 24);
        // Fixed delivery, physical destination, active high, edge, unmasked.
        ioapic_write(entry, u32::from(vector));
    }
}
