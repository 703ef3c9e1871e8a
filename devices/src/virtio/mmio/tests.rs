//! Transport tests: the register window as a table, one test that the registers drive the
//! common status machine (tested itself in `virtio::common`), notifications, and that no
//! guest access panics.

use virtio_bindings::virtio_config::*;
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::*;
use crate::backend::{PairBackend, PairPeer};
use crate::test_utils::mmio::{wait_eventfd, xorshift, Registers};
use crate::virtio::net::{MacAddr, NetDevice};

const VERSION_1: u64 = 1 << 32;
const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10_0000)]).expect("guest memory")
}

fn net_transport(mem: &GuestMemoryMmap) -> (MmioTransport, PairPeer) {
    let (backend, peer) = PairBackend::new().expect("socketpair");
    let device = NetDevice::with_backend(backend, MacAddr::new([2, 1, 2, 3, 4, 5]), 64);
    let t = MmioTransport::new(mem.clone(), Box::new(device)).expect("transport");
    (t, peer)
}

/// Rings for a queue of 64 entries at `base` (desc, avail, used), well inside memory.
fn rings(base: u64) -> (u64, u64, u64) {
    (base, base + 0x400, base + 0x800)
}

fn is_active(t: &MmioTransport) -> bool {
    t.device().is_active()
}

/// Where a row of [`register_table`] starts.
#[derive(Clone, Copy, Debug)]
enum Start {
    Fresh,
    /// VERSION_1 negotiated, FEATURES_OK set.
    FeaturesOk,
    /// Queues 0 and 1 of 32 entries at 0x1000 and 0x2000, DRIVER_OK set.
    Running,
    /// A used-buffer and a configuration interrupt pending.
    Interrupts,
}

/// A guest write: a 32-bit register, or raw bytes at an offset.
#[derive(Clone, Copy, Debug)]
enum Write {
    W32(u32, u32),
    Raw(u64, &'static [u8]),
}
use Write::*;

/// What a row looks at: a guest read of `len` bytes (prefilled with 0xee) at an offset, or
/// queue 0 as the transport holds it (it has no register to read these back).
#[derive(Clone, Copy, Debug)]
enum Probe {
    Read(u64, usize),
    QueueSize,
    DescTable,
    UsedRing,
}
use Probe::*;

fn start(t: &mut MmioTransport, start: Start) {
    match start {
        Start::Fresh => {}
        Start::FeaturesOk => assert!(t.negotiate(VERSION_1)),
        Start::Running => {
            assert!(t.negotiate(VERSION_1));
            t.setup_queue(0, 32, rings(0x1000));
            t.setup_queue(1, 32, rings(0x2000));
            t.driver_ok();
            assert!(is_active(t));
        }
        Start::Interrupts => {
            t.interrupt().signal_used_queue().expect("irq");
            t.interrupt().signal_config_change().expect("irq");
        }
    }
}

fn probe(t: &mut MmioTransport, probe: Probe) -> u64 {
    match probe {
        Read(offset, len) => {
            let mut data = [0xeeu8; 8];
            BusDevice::read(t, offset, &mut data[..len]);
            u64::from_le_bytes(data) & (u64::MAX >> (64 - 8 * len))
        }
        QueueSize => t.state.queues[0].size().into(),
        DescTable => t.state.queues[0].desc_table(),
        UsedRing => t.state.queues[0].used_ring(),
    }
}

/// The register window: every register's offset and width, read-only and write-only
/// registers, reserved offsets, odd widths and misaligned accesses, the values each register
/// accepts, and the device configuration space. Rows: (what, start, writes, probe, value).
#[test]
fn register_table() {
    let mem = mem();
    let (t, _peer) = net_transport(&mem);
    // The device's features, and RING_RESET (the net device resets queues; QueueReset).
    let features = t.device().features() | 1 << VIRTIO_F_RING_RESET;
    assert_eq!(
        features & 1 << VIRTIO_F_ACCESS_PLATFORM,
        0,
        "ACCESS_PLATFORM is PCI's"
    );
    let generation = t.device().config_generation();
    drop(t);
    let ctrl = u64::from(crate::virtio::net::ctrl::CTRL_QUEUE_SIZE);
    let status = |s: u32| W32(VIRTIO_MMIO_STATUS, s);
    let sel = |q: u32| W32(VIRTIO_MMIO_QUEUE_SEL, q);
    use Start::*;
    #[rustfmt::skip]
    let rows: &[(&str, Start, &[Write], Probe, u64)] = &[
        // Identity.
        ("MagicValue", Fresh, &[], Read(0x00, 4), 0x7472_6976),
        ("Version", Fresh, &[], Read(0x04, 4), 2),
        ("DeviceID: net", Fresh, &[], Read(0x08, 4), 1),
        ("VendorID", Fresh, &[], Read(0x0c, 4), MMIO_VENDOR_ID.into()),
        ("DeviceFeatures word 0", Fresh, &[W32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0)], Read(0x10, 4), features & 0xffff_ffff),
        ("DeviceFeatures word 1 (VERSION_1)", Fresh, &[W32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1)], Read(0x10, 4), features >> 32),
        ("DeviceFeatures word 7", Fresh, &[W32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7)], Read(0x10, 4), 0),
        ("QueueNumMax rx", Fresh, &[sel(0)], Read(0x34, 4), 64),
        ("QueueNumMax tx", Fresh, &[sel(1)], Read(0x34, 4), 64),
        ("QueueNumMax control queue", Fresh, &[sel(2)], Read(0x34, 4), ctrl),
        ("QueueNumMax past the queues", Fresh, &[sel(3)], Read(0x34, 4), 0),
        ("QueueNumMax queue u32::MAX", Fresh, &[sel(u32::MAX)], Read(0x34, 4), 0),
        ("QueueReady", Fresh, &[], Read(0x44, 4), 0),
        ("InterruptStatus", Interrupts, &[], Read(0x60, 4), 3),
        ("InterruptACK clears the bits written", Interrupts, &[W32(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING)], Read(0x60, 4), VIRTIO_MMIO_INT_CONFIG.into()),
        ("Status", FeaturesOk, &[], Read(0x70, 4), (ACK | DRIVER | FEATURES_OK).into()),
        ("SHMLenLow: no shared memory", Fresh, &[W32(VIRTIO_MMIO_SHM_SEL, 0)], Read(0xb0, 4), u32::MAX.into()),
        ("SHMLenHigh", Fresh, &[], Read(0xb4, 4), u32::MAX.into()),
        ("SHMBaseLow", Fresh, &[], Read(0xb8, 4), u32::MAX.into()),
        ("SHMBaseHigh", Fresh, &[], Read(0xbc, 4), u32::MAX.into()),
        ("QueueReset", Running, &[], Read(QUEUE_RESET_OFFSET.into(), 4), 0),
        ("ConfigGeneration", Fresh, &[], Read(0xfc, 4), generation.into()),
        // Read-only registers keep their value.
        ("MagicValue written", Fresh, &[W32(VIRTIO_MMIO_MAGIC_VALUE, 0)], Read(0x00, 4), 0x7472_6976),
        ("DeviceID written", Fresh, &[W32(VIRTIO_MMIO_DEVICE_ID, 5)], Read(0x08, 4), 1),
        ("DeviceFeatures written", Fresh, &[W32(VIRTIO_MMIO_DEVICE_FEATURES, 0)], Read(0x10, 4), features & 0xffff_ffff),
        ("QueueNumMax written", Fresh, &[W32(VIRTIO_MMIO_QUEUE_NUM_MAX, 16)], Read(0x34, 4), 64),
        ("InterruptStatus written", Interrupts, &[W32(VIRTIO_MMIO_INTERRUPT_STATUS, 0)], Read(0x60, 4), 3),
        // Write-only registers and reserved offsets read 0.
        ("QueueSel read", Fresh, &[sel(2)], Read(0x30, 4), 0),
        ("QueueNum read", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 16)], Read(0x38, 4), 0),
        ("DriverFeatures read", FeaturesOk, &[], Read(0x20, 4), 0),
        ("QueueDescLow read", Running, &[], Read(0x80, 4), 0),
        ("reserved 0x18", Fresh, &[], Read(0x18, 4), 0),
        ("reserved 0x3c", Fresh, &[], Read(0x3c, 4), 0),
        ("reserved 0xf0", Fresh, &[Raw(0xf0, &[1, 0, 0, 0])], Read(0xf0, 4), 0),
        // Registers are aligned 32-bit words: anything else reads 0 and is not written.
        ("a 1-byte read", Fresh, &[], Read(0x00, 1), 0),
        ("a 2-byte read", Fresh, &[], Read(0x00, 2), 0),
        ("an 8-byte read", Fresh, &[], Read(0x00, 8), 0),
        ("a misaligned read", Fresh, &[], Read(0x02, 4), 0),
        ("a 1-byte Status read", FeaturesOk, &[], Read(0x70, 1), 0),
        ("a 2-byte QueueSel write", Fresh, &[Raw(0x30, &[3, 0])], Read(0x34, 4), 64),
        ("an 8-byte QueueSel write", Fresh, &[Raw(0x30, &[3, 0, 0, 0, 0, 0, 0, 0])], Read(0x34, 4), 64),
        ("a misaligned QueueSel write", Fresh, &[Raw(0x31, &[0, 3, 0, 0])], Read(0x34, 4), 64),
        ("a 1-byte Status write", Fresh, &[Raw(0x70, &[ACK as u8])], Read(0x70, 4), 0),
        // The values QueueNum, the ring addresses and QueueReady accept.
        ("QueueNum 0", FeaturesOk, &[sel(0), W32(VIRTIO_MMIO_QUEUE_NUM, 0)], QueueSize, 64),
        ("QueueNum 3 (not a power of two)", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 3)], QueueSize, 64),
        ("QueueNum 100", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 100)], QueueSize, 64),
        ("QueueNum 128 (past the maximum)", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 128)], QueueSize, 64),
        ("QueueNum 65536 + 64 (not truncated)", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 65536 + 64)], QueueSize, 64),
        ("QueueNum u32::MAX", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, u32::MAX)], QueueSize, 64),
        ("QueueNum 16", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_NUM, 16)], QueueSize, 16),
        ("QueueNum of the selected queue only", FeaturesOk, &[sel(1), W32(VIRTIO_MMIO_QUEUE_NUM, 16)], QueueSize, 64),
        ("QueueNum before FEATURES_OK", Fresh, &[W32(VIRTIO_MMIO_QUEUE_NUM, 16)], QueueSize, 64),
        ("QueueNum after DRIVER_OK", Running, &[sel(0), W32(VIRTIO_MMIO_QUEUE_NUM, 16)], QueueSize, 32),
        ("QueueDescLow and High", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000), W32(VIRTIO_MMIO_QUEUE_DESC_HIGH, 1)], DescTable, 0x1_0000_1000),
        ("QueueDescLow not 16-byte aligned", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1008)], DescTable, 0),
        ("QueueDescLow after DRIVER_OK", Running, &[sel(0), W32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000)], DescTable, 0x1000),
        ("QueueUsedLow and High", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_USED_HIGH, 2), W32(VIRTIO_MMIO_QUEUE_USED_LOW, 0x1004)], UsedRing, 0x2_0000_1004),
        ("QueueUsedLow not 4-byte aligned", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_USED_LOW, 0x1002)], UsedRing, 0),
        ("QueueReady 1", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_READY, 1)], Read(0x44, 4), 1),
        ("QueueReady 7", FeaturesOk, &[W32(VIRTIO_MMIO_QUEUE_READY, 7)], Read(0x44, 4), 0),
        ("QueueReady of a nonexistent queue", FeaturesOk, &[sel(9), W32(VIRTIO_MMIO_QUEUE_NUM, 16), W32(VIRTIO_MMIO_QUEUE_READY, 1)], Read(0x44, 4), 0),
        ("QueueReady 0 after DRIVER_OK", Running, &[sel(0), W32(VIRTIO_MMIO_QUEUE_READY, 0)], Read(0x44, 4), 1),
        ("Status 0 selects queue 0 again", FeaturesOk, &[sel(3), status(0)], Read(0x34, 4), 64),
        // The device configuration space: bytes at any width, read-only.
        ("config: MAC byte 0", Fresh, &[], Read(0x100, 1), 2),
        ("config: MAC byte 5", Fresh, &[], Read(0x105, 1), 5),
        ("config: MAC head as a word", Fresh, &[], Read(0x100, 4), 0x0302_0102),
        ("config: MAC tail + STATUS=LINK_UP", Fresh, &[], Read(0x104, 4), 0x0001_0504),
        ("config: past its end", Fresh, &[], Read(0x108, 8), 0),
        ("config: the window's last byte", Fresh, &[], Read(0xfff, 1), 0),
        ("config: written", Fresh, &[Raw(0x100, &[0xaa; 4])], Read(0x100, 4), 0x0302_0102),
    ];
    for &(what, from, writes, at, value) in rows {
        let (mut t, _peer) = net_transport(&mem);
        start(&mut t, from);
        for &write in writes {
            match write {
                W32(offset, value) => t.w32(offset, value),
                Raw(offset, bytes) => BusDevice::write(&mut t, offset, bytes),
            }
        }
        assert_eq!(
            probe(&mut t, at),
            value,
            "{what} (from {from:?}, {writes:x?})"
        );
    }
}

/// The registers reach the common status machine (see `virtio::common`): the status steps,
/// FEATURES_OK checked with the acknowledged features (the net device's own dependencies
/// too), activation with the queues as programmed, DEVICE_NEEDS_RESET and its interrupt, and
/// reset.
#[test]
fn registers_drive_the_common_status_machine() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    t.w32(VIRTIO_MMIO_STATUS, DRIVER);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0, "DRIVER before ACKNOWLEDGE");
    let offered = t.device().features();
    assert!(!t.negotiate(VERSION_1 | 1 << 41), "feature not offered");
    assert!(!t.negotiate(0), "legacy driver (no VERSION_1)");
    if offered & (1 << VIRTIO_NET_F_HOST_TSO4) != 0 {
        assert!(
            !t.negotiate(VERSION_1 | 1 << VIRTIO_NET_F_HOST_TSO4),
            "HOST_TSO4 without CSUM"
        );
        assert!(t.negotiate(VERSION_1 | 1 << VIRTIO_NET_F_HOST_TSO4 | 1 << VIRTIO_NET_F_CSUM));
    }
    assert!(t.negotiate(offered), "everything offered is acceptable");
    assert_eq!(t.state.acked_features, offered);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES, 0);
    assert_eq!(t.state.acked_features, offered, "frozen after FEATURES_OK");

    // Activation with the queues as programmed.
    assert!(t.negotiate(VERSION_1));
    t.setup_queue(0, 32, rings(0x1000));
    t.setup_queue(1, 32, rings(0x2000));
    t.driver_ok();
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER | FEATURES_OK | DRIVER_OK
    );
    assert!(is_active(&t));

    // Reset: back to the initial state.
    t.interrupt().signal_used_queue().expect("irq");
    t.w32(VIRTIO_MMIO_STATUS, 0);
    assert!(!is_active(&t));
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0);
    assert_eq!(t.r32(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    assert_eq!(t.state.acked_features, 0);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0);
    assert_eq!(t.state.queues[0].size(), 64);
    // Drain what the interrupt above left on the line.
    let _ = t.irqfd().read();

    // A failed activation (queue 1 never made ready): DEVICE_NEEDS_RESET, told on the line.
    assert!(t.negotiate(VERSION_1));
    t.setup_queue(0, 64, rings(0x1000));
    t.driver_ok();
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER | FEATURES_OK | DRIVER_OK | VIRTIO_CONFIG_S_NEEDS_RESET
    );
    assert!(wait_eventfd(t.irqfd(), std::time::Duration::from_secs(1)) > 0);
    assert_eq!(t.r32(VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
    assert!(!is_active(&t));
    assert!(t.negotiate(VERSION_1));
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
}

#[test]
fn ioeventfds_and_queue_notify_fallback() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    let listed: Vec<_> = t
        .ioeventfds(0xd000_0000)
        .into_iter()
        .map(|(_, addr, datamatch)| (addr, datamatch))
        .collect();
    assert_eq!(
        listed,
        [(0xd000_0050, 0), (0xd000_0050, 1), (0xd000_0050, 2)]
    );
    t.w32(VIRTIO_MMIO_QUEUE_NOTIFY, 1);
    t.w32(VIRTIO_MMIO_QUEUE_NOTIFY, 5);
    assert_eq!(t.ioeventfds(0)[1].0.read().expect("kicked"), 1);
    assert!(t.ioeventfds(0)[0].0.read().is_err(), "queue 0 not kicked");
}

/// Hammers the window with pseudo-random accesses: nothing may panic or hang.
#[test]
fn random_guest_accesses_never_panic() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
    let registers = [
        0x00u64, 0x10, 0x14, 0x20, 0x24, 0x30, 0x34, 0x38, 0x44, 0x50, 0x60, 0x64, 0x70, 0x80,
        0x84, 0x90, 0x94, 0xa0, 0xa4, 0xac, 0xfc, 0x100, 0x106,
    ];
    for _ in 0..20_000 {
        let r = next();
        let offset = if r & 3 == 0 {
            (r >> 8) % MMIO_WINDOW_SIZE
        } else {
            registers[((r >> 8) % registers.len() as u64) as usize]
        };
        let len = [1usize, 2, 4, 8][((r >> 40) & 3) as usize];
        let len = if r & 0x30 != 0 { 4 } else { len };
        let len = len.min((MMIO_WINDOW_SIZE - offset) as usize);
        let mut data = next().to_le_bytes();
        // Small values make progress through the state machine likelier.
        if r & 0x100 != 0 {
            data = (next() % 300).to_le_bytes();
        }
        if r & 0x200 != 0 {
            BusDevice::write(&mut t, offset, &data[..len]);
        } else {
            BusDevice::read(&mut t, offset, &mut data[..len]);
        }
    }
}
