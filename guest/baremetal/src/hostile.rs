//! `hostile=…`: a driver that misprograms the device on purpose, to check that the VMM refuses
//! it, survives it and still ends the VM when the guest resets the machine.
//!
//! `hostile=overlap-used`: the transmit queue's used ring is placed on its avail ring (the used
//! ring's `flags` on the avail ring's `idx`), so that every used entry the device wrote would
//! rewrite what the driver publishes. The device must refuse the queue at DRIVER_OK (set
//! DEVICE_NEEDS_RESET) instead of spinning on it. The program then kicks the queue anyway,
//! resets the device (Status 0), prints its result line and resets the machine.

use alloc::string::String;
use core::fmt::Write;
use core::ptr;

use vnet_baremetal::cmdline::Hostile;
use vnet_driver::transport::{regs, status, MmioRegisters};
use vnet_driver::{Hal, MmioTransport};

use crate::memory::DmaHal;
use crate::sys::{self, fail_early};

/// Queue size used for both queues (every device offers at least this many).
const QUEUE_SIZE: u16 = 8;
/// VIRTIO_F_VERSION_1 (bit 32): the only feature acknowledged.
const FEATURES_HIGH: u32 = 1;
const TX_QUEUE: u32 = 1;

/// Runs the hostile sequence `which`; never returns.
pub fn run(mut t: MmioTransport, which: Hostile) -> ! {
    match which {
        Hostile::OverlapUsed => overlap_used(&mut t),
    }
}

fn overlap_used(t: &mut MmioTransport) -> ! {
    t.write32(regs::STATUS, 0);
    t.write32(regs::STATUS, status::ACKNOWLEDGE);
    t.write32(regs::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    for (sel, value) in [(0, 0), (1, FEATURES_HIGH)] {
        t.write32(regs::DRIVER_FEATURES_SEL, sel);
        t.write32(regs::DRIVER_FEATURES, value);
    }
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    t.write32(regs::STATUS, s);
    if t.read32(regs::STATUS) & status::FEATURES_OK == 0 {
        fail_early("hostile: the device refused VERSION_1 alone");
    }
    let Some((paddr, vaddr)) = DmaHal.dma_alloc(1) else {
        fail_early("hostile: out of DMA memory");
    };
    let base = vaddr.as_ptr();
    // One page: rx rings at 0x000/0x080/0x100; tx descriptor table at 0x200, avail ring at
    // 0x282 (2-aligned) and used ring at 0x284 (4-aligned): used.flags is avail.idx.
    let (tx_desc, tx_avail, tx_used) = (0x200u64, 0x282u64, 0x284u64);
    // One 72-byte buffer (header + 60-byte frame) at 0x800, published as tx chain 0.
    // SAFETY: every offset written is inside the page just allocated for this program alone.
    unsafe {
        ptr::write_bytes(base, 0, 4096);
        let d = base.add(tx_desc as usize);
        ptr::write_volatile(d.cast::<u64>(), (paddr + 0x800).to_le());
        ptr::write_volatile(d.add(8).cast::<u32>(), 72u32.to_le());
        let a = base.add(tx_avail as usize);
        ptr::write_volatile(a.add(4).cast::<u16>(), 0);
        ptr::write_volatile(a.add(2).cast::<u16>(), 1u16.to_le());
    }
    for (queue, (desc, avail, used)) in [
        (0u32, (0x000u64, 0x080u64, 0x100u64)),
        (TX_QUEUE, (tx_desc, tx_avail, tx_used)),
    ] {
        t.write32(regs::QUEUE_SEL, queue);
        t.write32(regs::QUEUE_NUM, u32::from(QUEUE_SIZE));
        for (low, offset) in [
            (regs::QUEUE_DESC_LOW, desc),
            (regs::QUEUE_AVAIL_LOW, avail),
            (regs::QUEUE_USED_LOW, used),
        ] {
            let addr = paddr + offset;
            t.write32(low, addr as u32);
            t.write32(low + 4, (addr >> 32) as u32);
        }
        t.write32(regs::QUEUE_READY, 1);
    }
    t.write32(regs::STATUS, s | status::DRIVER_OK);
    let after_driver_ok = t.read32(regs::STATUS);
    t.notify(TX_QUEUE as u16);
    t.write32(regs::STATUS, 0);
    let after_reset = t.read32(regs::STATUS);
    // SAFETY: inside the page (the avail ring's idx).
    let avail_idx = unsafe { ptr::read_volatile(base.add(tx_avail as usize + 2).cast::<u16>()) };

    let mut line = String::new();
    let _ = writeln!(
        line,
        "{{\"driver\":{{\"status\":\"done\",\"hostile\":\"overlap-used\",\
         \"status_after_driver_ok\":{after_driver_ok},\"needs_reset\":{},\
         \"status_after_reset\":{after_reset},\"tx_avail_idx\":{}}}}}",
        after_driver_ok & status::DEVICE_NEEDS_RESET != 0,
        u16::from_le(avail_idx),
    );
    sys::write(line.as_bytes());
    sys::power_off()
}
