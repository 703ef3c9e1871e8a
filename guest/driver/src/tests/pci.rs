//! [`PciTransport`] against a fake virtio-pci function: a configuration space with the virtio
//! capabilities and MSI-X, and a BAR whose common configuration, ISR, device configuration and
//! notification area are translated onto the in-crate register file ([`TestTransport`]), so the
//! in-crate test device serves the rings the driver set up over PCI.

use std::vec;
use std::vec::Vec;

use super::{frame, ARENA};
use crate::net::{RX_QUEUE, TX_QUEUE};
use crate::pci::{
    bar_address, bar_size, cfg, find_capabilities, PciBar, PciConfig, PciError, PciTransport,
    Region, NO_VECTOR, VIRTIO_NET_DEVICE_ID,
};
use crate::testing::{Regs, TestDevice, TestHal, TestTransport};
use crate::transport::{regs, MmioRegisters, Transport, INT_USED_BUFFER};
use crate::{Config, InitError, VirtioNet, XdpAction};

const BAR_SIZE: u64 = 0x8000;
const COMMON: u32 = 0;
const ISR: u32 = 0x1000;
const DEVICE: u32 = 0x2000;
const NOTIFY: u32 = 0x3000;
const MULTIPLIER: u32 = 4;
const TABLE: u32 = 0x4000;
const PBA: u32 = 0x5000;

/// The fake function. Queue `q`'s `queue_notify_off` is `q`; vectors past `table_size` (or
/// all, with `refuse_vectors`) read back as NO_VECTOR.
struct FakePci {
    config: [u8; 256],
    bar0: u64,
    regs: TestTransport,
    queue_sel: u16,
    num_queues: u16,
    table_size: u16,
    refuse_vectors: bool,
    queue_vectors: [u16; 3],
    config_vector: u16,
    table: Vec<u32>,
    /// Every notification: (BAR offset, value).
    notifies: Vec<(u32, u16)>,
}

impl FakePci {
    fn new(regs: TestTransport, table_size: u16) -> FakePci {
        let mut c = [0u8; 256];
        c[0..2].copy_from_slice(&0x1af4u16.to_le_bytes());
        c[2..4].copy_from_slice(&VIRTIO_NET_DEVICE_ID.to_le_bytes());
        c[6..8].copy_from_slice(&cfg::STATUS_CAP_LIST.to_le_bytes());
        c[0x10..0x14].copy_from_slice(&0xc000_0004u32.to_le_bytes()); // 64-bit memory BAR
        c[0x34] = 0x40;
        // A capability the driver does not know first, then virtio's, then MSI-X.
        let mut caps: Vec<Vec<u8>> = vec![vec![0x05, 0, 0, 0]]; // MSI, ignored
        let vcap = |cfg_type: u8, offset: u32, length: u32, extra: &[u8]| {
            let mut v = vec![
                cfg::CAP_ID_VNDR,
                0,
                16 + extra.len() as u8,
                cfg_type,
                0,
                0,
                0,
                0,
            ];
            v.extend_from_slice(&offset.to_le_bytes());
            v.extend_from_slice(&length.to_le_bytes());
            v.extend_from_slice(extra);
            v
        };
        caps.push(vcap(1, COMMON, 0x40, &[]));
        caps.push(vcap(2, NOTIFY, 3 * MULTIPLIER, &MULTIPLIER.to_le_bytes()));
        caps.push(vcap(3, ISR, 4, &[]));
        caps.push(vcap(4, DEVICE, 0x100, &[]));
        // A second common capability: the driver takes the first.
        caps.push(vcap(1, 0x7000, 0x40, &[]));
        let mut msix = vec![cfg::CAP_ID_MSIX, 0];
        msix.extend_from_slice(&(table_size - 1).to_le_bytes());
        msix.extend_from_slice(&TABLE.to_le_bytes());
        msix.extend_from_slice(&PBA.to_le_bytes());
        caps.push(msix);
        let mut at = 0x40usize;
        let n = caps.len();
        for (i, cap) in caps.into_iter().enumerate() {
            let len = cap.len().next_multiple_of(4);
            c[at..at + cap.len()].copy_from_slice(&cap);
            c[at + 1] = if i + 1 < n { (at + len) as u8 } else { 0 };
            at += len;
        }
        FakePci {
            config: c,
            bar0: 0xc000_0000,
            regs,
            queue_sel: 0,
            num_queues: 3,
            table_size,
            refuse_vectors: false,
            queue_vectors: [NO_VECTOR; 3],
            config_vector: NO_VECTOR,
            table: vec![0; usize::from(table_size) * 4],
            notifies: Vec::new(),
        }
    }

    fn msix_cap(&self) -> usize {
        let mut p = usize::from(self.config[0x34]);
        while self.config[p] != cfg::CAP_ID_MSIX {
            p = usize::from(self.config[p + 1]);
        }
        p
    }

    fn vector(&self, v: u16) -> u16 {
        if self.refuse_vectors || v >= self.table_size {
            NO_VECTOR
        } else {
            v
        }
    }

    fn common_read(&mut self, offset: u32) -> u32 {
        let r = &mut self.regs;
        match offset {
            0x04 => r.read32(regs::DEVICE_FEATURES),
            0x10 => u32::from(self.config_vector),
            0x12 => u32::from(self.num_queues),
            0x14 => r.read32(regs::STATUS),
            0x15 => r.read32(regs::CONFIG_GENERATION),
            0x16 => u32::from(self.queue_sel),
            0x18 => r.read32(regs::QUEUE_NUM_MAX),
            0x1a => u32::from(self.queue_vectors[usize::from(self.queue_sel)]),
            0x1c => r.read32(regs::QUEUE_READY),
            0x1e => u32::from(self.queue_sel),
            0x3a => r.read32(regs::QUEUE_RESET),
            _ => panic!("unexpected common read at {offset:#x}"),
        }
    }

    fn common_write(&mut self, offset: u32, value: u32) {
        let r = &mut self.regs;
        match offset {
            0x00 => r.write32(regs::DEVICE_FEATURES_SEL, value),
            0x08 => r.write32(regs::DRIVER_FEATURES_SEL, value),
            0x0c => r.write32(regs::DRIVER_FEATURES, value),
            0x10 => self.config_vector = self.vector(value as u16),
            0x14 => {
                if value == 0 {
                    self.queue_vectors = [NO_VECTOR; 3];
                    self.config_vector = NO_VECTOR;
                }
                r.write32(regs::STATUS, value)
            }
            0x16 => {
                self.queue_sel = value as u16;
                r.write32(regs::QUEUE_SEL, value);
            }
            0x18 => r.write32(regs::QUEUE_NUM, value),
            0x1a => self.queue_vectors[usize::from(self.queue_sel)] = self.vector(value as u16),
            0x1c => r.write32(regs::QUEUE_READY, value),
            0x20 => r.write32(regs::QUEUE_DESC_LOW, value),
            0x24 => r.write32(regs::QUEUE_DESC_HIGH, value),
            0x28 => r.write32(regs::QUEUE_AVAIL_LOW, value),
            0x2c => r.write32(regs::QUEUE_AVAIL_HIGH, value),
            0x30 => r.write32(regs::QUEUE_USED_LOW, value),
            0x34 => r.write32(regs::QUEUE_USED_HIGH, value),
            0x3a => {
                // A reset drops the queue's vector.
                self.queue_vectors[usize::from(self.queue_sel)] = NO_VECTOR;
                r.write32(regs::QUEUE_RESET, value)
            }
            _ => panic!("unexpected common write of {value:#x} at {offset:#x}"),
        }
    }

    fn bar_read(&mut self, offset: u32) -> u32 {
        match offset {
            o if o < 0x40 => self.common_read(o),
            ISR => {
                let isr = self.regs.read32(regs::INTERRUPT_STATUS);
                self.regs.write32(regs::INTERRUPT_ACK, isr);
                isr
            }
            o if (DEVICE..DEVICE + 0x100).contains(&o) => {
                u32::from(MmioRegisters::read_config_u8(&mut self.regs, o - DEVICE))
            }
            o if (TABLE..TABLE + self.table.len() as u32 * 4).contains(&o) => {
                self.table[((o - TABLE) / 4) as usize]
            }
            o if o == PBA => 0,
            o => panic!("unexpected BAR read at {o:#x}"),
        }
    }

    fn bar_write(&mut self, offset: u32, value: u32, width: u32) {
        match offset {
            o if o < 0x40 => self.common_write(o, value),
            o if (NOTIFY..NOTIFY + 3 * MULTIPLIER).contains(&o) => {
                assert_eq!(width, 2, "notify is a 16-bit write");
                self.notifies.push((o, value as u16));
                MmioRegisters::notify(&mut self.regs, value as u16);
            }
            o if (TABLE..TABLE + self.table.len() as u32 * 4).contains(&o) => {
                self.table[((o - TABLE) / 4) as usize] = value
            }
            o => panic!("unexpected BAR write of {value:#x} at {o:#x}"),
        }
    }
}

impl PciConfig for FakePci {
    fn config_read32(&mut self, offset: u8) -> u32 {
        assert_eq!(offset % 4, 0);
        let o = usize::from(offset);
        u32::from_le_bytes(self.config[o..o + 4].try_into().expect("4 bytes"))
    }
    fn config_write32(&mut self, offset: u8, value: u32) {
        match offset {
            0x10 => {
                // BAR0 low: size-aligned address bits are writable, the type bits are not.
                let mask = !(BAR_SIZE as u32 - 1);
                self.bar0 = (self.bar0 & !0xffff_ffff) | u64::from(value & mask);
                let v = (value & mask) | 0b100;
                self.config[0x10..0x14].copy_from_slice(&v.to_le_bytes());
            }
            0x14 => {
                self.bar0 = (self.bar0 & 0xffff_ffff) | (u64::from(value) << 32);
                self.config[0x14..0x18].copy_from_slice(&value.to_le_bytes());
            }
            _ => panic!("unexpected config write of {value:#x} at {offset:#x}"),
        }
    }
    fn config_write16(&mut self, offset: u8, value: u16) {
        let o = usize::from(offset);
        let msix_control = self.msix_cap() + 2;
        let value = match o {
            0x04 => value & 0x0406,
            o if o == msix_control => {
                (value & 0xc000) | u16::from_le_bytes([self.config[o], self.config[o + 1]]) & 0x7ff
            }
            _ => panic!("unexpected 16-bit config write of {value:#x} at {offset:#x}"),
        };
        self.config[o..o + 2].copy_from_slice(&value.to_le_bytes());
    }
}

impl PciBar for FakePci {
    fn size(&self) -> u64 {
        BAR_SIZE
    }
    fn read8(&mut self, offset: u32) -> u8 {
        self.bar_read(offset) as u8
    }
    fn read16(&mut self, offset: u32) -> u16 {
        assert_eq!(offset % 2, 0);
        if (DEVICE..DEVICE + 0x100).contains(&offset) {
            return MmioRegisters::read_config_u16(&mut self.regs, offset - DEVICE);
        }
        self.bar_read(offset) as u16
    }
    fn read32(&mut self, offset: u32) -> u32 {
        assert_eq!(offset % 4, 0);
        self.bar_read(offset)
    }
    fn write8(&mut self, offset: u32, value: u8) {
        self.bar_write(offset, u32::from(value), 1)
    }
    fn write16(&mut self, offset: u32, value: u16) {
        assert_eq!(offset % 2, 0);
        self.bar_write(offset, u32::from(value), 2)
    }
    fn write32(&mut self, offset: u32, value: u32) {
        assert_eq!(offset % 4, 0);
        self.bar_write(offset, value, 4)
    }
}

type PciNet = VirtioNet<TestHal, PciTransport<FakePci>>;

fn bring_up(
    table_size: u16,
    edit: impl FnOnce(&mut FakePci),
) -> (Result<PciNet, InitError>, TestHal, TestTransport) {
    let hal = TestHal::new(ARENA);
    let regs = TestTransport::new(Regs::default());
    let mut fake = FakePci::new(regs.clone(), table_size);
    edit(&mut fake);
    let mut t = PciTransport::new(fake).expect("transport");
    for entry in 0..t.msix_table_size() {
        t.set_msix_entry(entry, 0xfee0_0000, 0x40 + u32::from(entry))
            .expect("entry");
    }
    let control = t.enable_msix().expect("msix");
    assert_ne!(control & cfg::MSIX_ENABLE, 0);
    assert_eq!(control & cfg::MSIX_FUNCTION_MASK, 0);
    (VirtioNet::new(hal.clone(), t, Config::default()), hal, regs)
}

#[test]
fn capability_walk_finds_the_first_of_each_and_msix() {
    let mut fake = FakePci::new(TestTransport::new(Regs::default()), 4);
    let layout = find_capabilities(&mut fake).expect("walk");
    assert_eq!(layout.bar, 0);
    assert_eq!(
        layout.common,
        Region {
            offset: COMMON,
            length: 0x40
        }
    );
    assert_eq!(layout.notify.offset, NOTIFY);
    assert_eq!(layout.notify_multiplier, MULTIPLIER);
    assert_eq!(layout.isr.offset, ISR);
    assert_eq!(layout.device.length, 0x100);
    let msix = layout.msix.expect("msix");
    assert_eq!(
        (msix.table_size, msix.table_offset, msix.pba_offset),
        (4, TABLE, PBA)
    );
    assert_eq!(bar_address(&mut fake, 0), Ok(0xc000_0000));
    assert_eq!(bar_size(&mut fake, 0), BAR_SIZE);
    assert_eq!(
        bar_address(&mut fake, 0),
        Ok(0xc000_0000),
        "restored after sizing"
    );
}

#[test]
fn capability_walk_rejects_broken_lists() {
    let regs = TestTransport::new(Regs::default());
    // No capability list.
    let mut fake = FakePci::new(regs.clone(), 4);
    fake.config[6] = 0;
    assert_eq!(find_capabilities(&mut fake), Err(PciError::NoCapabilities));
    // A structure in another BAR.
    let mut fake = FakePci::new(regs.clone(), 4);
    let common_cap = usize::from(fake.config[0x41]);
    let notify_cap = usize::from(fake.config[common_cap + 1]);
    assert_eq!(fake.config[common_cap + 3], 1);
    fake.config[notify_cap + 4] = 2;
    assert_eq!(
        find_capabilities(&mut fake),
        Err(PciError::SplitBars {
            expected: 0,
            found: 2
        })
    );
    // A reserved BAR value: the capability is ignored (then the notify one is missing).
    let mut fake = FakePci::new(regs.clone(), 4);
    fake.config[notify_cap + 4] = 7;
    assert_eq!(
        find_capabilities(&mut fake),
        Err(PciError::MissingCapability(2))
    );
    // A loop in the list ends the walk; the common capability is then missing.
    let mut fake = FakePci::new(regs.clone(), 4);
    fake.config[0x41] = 0x40;
    assert_eq!(
        find_capabilities(&mut fake),
        Err(PciError::MissingCapability(1))
    );
    // A structure past the BAR, and a function that is not virtio.
    let mut fake = FakePci::new(regs.clone(), 4);
    fake.config[notify_cap + 8..notify_cap + 12].copy_from_slice(&0x7ffeu32.to_le_bytes());
    assert_eq!(PciTransport::new(fake).err(), Some(PciError::OutOfBar(2)));
    let mut fake = FakePci::new(regs, 4);
    fake.config[0] = 0x86;
    assert!(matches!(
        PciTransport::new(fake).err(),
        Some(PciError::NotVirtio { .. })
    ));
}

#[test]
fn bring_up_programs_queues_vectors_and_notify_addresses() {
    let (net, hal, regs) = bring_up(4, |_| {});
    let mut net = net.expect("driver init");
    {
        let t = net.transport_mut();
        assert_eq!(t.config_vector(), Some(0));
        assert_eq!(t.queue_vector(RX_QUEUE), Some(1));
        assert_eq!(t.queue_vector(TX_QUEUE), Some(2));
        let f = t.function_mut();
        assert_eq!(f.config_vector, 0);
        assert_eq!(&f.queue_vectors[..2], &[1, 2]);
        // Memory space and bus mastering on, INTx off.
        assert_eq!(f.config[4] & 0x6, 0x6);
        // Table entries written and unmasked.
        assert_eq!(&f.table[4..8], &[0xfee0_0000, 0, 0x41, 0]);
    }
    assert_eq!(net.mac(), Some([0x02, 0, 0, 0, 0, 0x01]));
    let mut dev = TestDevice::attach(&hal, &regs);
    // Frames cross over the PCI transport; each kick lands at the queue's notify address.
    let sent: Vec<Vec<u8>> = (0..8).map(|i| frame(i, 60)).collect();
    for f in &sent {
        net.transmit(f).expect("transmit");
    }
    net.flush_tx();
    assert_eq!(dev.tx_drain(), sent);
    let notifies = net.transport_mut().function_mut().notifies.clone();
    assert!(notifies.contains(&(NOTIFY + MULTIPLIER, TX_QUEUE)));
    assert!(notifies.contains(&(NOTIFY, RX_QUEUE)), "rx refill kick");
    assert!(notifies
        .iter()
        .all(|&(at, q)| at == NOTIFY + MULTIPLIER * u32::from(q)));
    assert!(dev.rx_deliver(&frame(99, 100)));
    // MSI-X: the rx vector's handler, no ISR read.
    let status = net.handle_msix(1);
    assert!(status.used_buffers && !status.config_changed);
    let mut got = Vec::new();
    net.poll_rx(64, &mut |f: &[u8]| {
        got.push(f.to_vec());
        XdpAction::Pass
    });
    assert_eq!(got, vec![frame(99, 100)]);
    assert!(!net.handle_msix(7).any(), "not this device's vector");
    assert_eq!(net.transport_mut().msix_pending(1), Ok(false));
    assert_eq!(
        net.transport_mut().msix_pending(4),
        Err(PciError::NoSuchEntry(4))
    );
    assert_eq!(net.counters().interrupts, 1);
    // The shared-line path still works: ISR read (which acknowledges).
    regs.raise(INT_USED_BUFFER);
    assert!(net.handle_interrupt().used_buffers);
    assert_eq!(regs.regs().interrupt_status, 0);
}

#[test]
fn small_table_shares_vector_zero_and_refusal_fails_init() {
    // Two entries: config on 0, rx on 1, tx falls back to 0.
    let (net, _, _) = bring_up(2, |_| {});
    let mut net = net.expect("driver init");
    let t = net.transport_mut();
    assert_eq!(
        (
            t.config_vector(),
            t.queue_vector(RX_QUEUE),
            t.queue_vector(TX_QUEUE)
        ),
        (Some(0), Some(1), Some(0))
    );
    let status = net.handle_msix(0);
    assert!(status.used_buffers && status.config_changed);
    // Every vector refused: NO_VECTOR read back is an init error, the device FAILED.
    let (net, _, regs) = bring_up(4, |f| f.refuse_vectors = true);
    assert_eq!(net.err(), Some(InitError::VectorRefused(None)));
    assert_ne!(regs.regs().status & crate::transport::status::FAILED, 0);
}

#[test]
fn mapped_bar_accesses_the_mapping() {
    use crate::pci::MappedBar;
    use core::ptr::NonNull;
    let mut bar = vec![0u64; 8];
    let base = NonNull::new(bar.as_mut_ptr().cast::<u8>()).expect("non-null");
    // SAFETY: `bar` is 64 bytes, 8-aligned, outlives `m`, and is only accessed through `m`
    // until the reads at the end (after the last use of `m`).
    let mut m = unsafe { MappedBar::new(base, 64) };
    m.write32(0, 0x1122_3344);
    m.write16(8, 0xabcd);
    m.write8(12, 0x7f);
    PciBar::notify(&mut m, 16, 3);
    assert_eq!(m.read32(0), 0x1122_3344);
    assert_eq!((m.read16(2), m.read8(1)), (0x1122, 0x33));
    // Misaligned or out of range: ignored, reads 0.
    m.write32(62, 0xdead);
    m.write32(64, 0xdead);
    m.write16(9, 0xdead);
    assert_eq!((m.read32(62), m.read16(63), m.read8(64)), (0, 0, 0));
    assert_eq!(bar[0], 0x1122_3344);
    assert_eq!(bar[1], 0x7f_0000_abcd);
    assert_eq!(bar[2], 3, "notify is the 16-bit queue index");
    assert!(bar[3..].iter().all(|&w| w == 0));
}

#[test]
fn queue_reset_over_pci_reassigns_the_vector_and_traffic_flows() {
    let hal = TestHal::new(ARENA);
    let mut r = Regs::default();
    r.device_features |= crate::features::F_RING_RESET;
    r.reset_busy_reads = 2;
    let regs = TestTransport::new(r);
    let mut t = PciTransport::new(FakePci::new(regs.clone(), 4)).expect("transport");
    t.enable_msix().expect("msix");
    let mut net = VirtioNet::new(hal.clone(), t, Config::default()).expect("driver");
    let mut dev = TestDevice::attach(&hal, &regs);
    assert_eq!(net.transport().queue_vector(TX_QUEUE), Some(2));
    net.transmit(&frame(1, 60)).expect("queued");
    let report = net.reset_queue(crate::QueueId::Tx).expect("reset");
    assert_eq!(report.unused, 1, "frame 1 was never sent");
    assert_eq!(regs.regs().queue_resets, [TX_QUEUE]);
    assert!(regs.regs().bad_writes.is_empty());
    assert_eq!(
        net.transport().queue_vector(TX_QUEUE),
        Some(2),
        "reassigned"
    );
    assert_eq!(net.transport().queue_vector(RX_QUEUE), Some(1), "untouched");
    dev.reattach(1);
    net.transmit(&frame(2, 60)).expect("queued");
    let frames = dev.tx_drain();
    assert_eq!(frames, [frame(2, 60)]);
    // The notification still reaches queue 1's notify address.
    assert_eq!(
        net.transport_mut().function_mut().notifies.last(),
        Some(&(NOTIFY + MULTIPLIER, 1))
    );
}
