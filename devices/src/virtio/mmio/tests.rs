//! Transport tests: registers, the status state machine, feature refusal, validation of every
//! guest write, and that no guest value panics.

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

#[test]
fn identity_registers() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    assert_eq!(t.r32(VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
    assert_eq!(t.r32(VIRTIO_MMIO_VERSION), 2);
    assert_eq!(t.r32(VIRTIO_MMIO_DEVICE_ID), 1);
    assert_eq!(t.r32(VIRTIO_MMIO_VENDOR_ID), MMIO_VENDOR_ID);
    // rx, tx, and the control queue (its own size).
    let ctrl = u32::from(crate::virtio::net::ctrl::CTRL_QUEUE_SIZE);
    for (sel, max) in [(0, 64), (1, 64), (2, ctrl), (3, 0), (u32::MAX, 0)] {
        t.w32(VIRTIO_MMIO_QUEUE_SEL, sel);
        assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_NUM_MAX), max, "queue {sel}");
    }
    // The device's features, and RING_RESET (the net device resets queues; QueueReset).
    let features = t.device().features() | 1 << VIRTIO_F_RING_RESET;
    assert_eq!(
        features & 1 << VIRTIO_F_ACCESS_PLATFORM,
        0,
        "ACCESS_PLATFORM is PCI's"
    );
    t.w32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_DEVICE_FEATURES), features as u32);
    t.w32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
    assert_eq!(t.r32(VIRTIO_MMIO_DEVICE_FEATURES), (features >> 32) as u32);
    assert_eq!(
        t.r32(VIRTIO_MMIO_DEVICE_FEATURES) & 1,
        1,
        "VERSION_1 offered"
    );
    t.w32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
    assert_eq!(t.r32(VIRTIO_MMIO_DEVICE_FEATURES), 0);
    assert_eq!(t.r32(VIRTIO_MMIO_SHM_LEN_LOW), u32::MAX, "no shared memory");
}

#[test]
fn config_space_holds_mac_and_status() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    let mut mac = [0u8; 6];
    for (i, byte) in mac.iter_mut().enumerate() {
        let mut b = [0u8; 1];
        BusDevice::read(&mut t, 0x100 + i as u64, &mut b);
        *byte = b[0];
    }
    assert_eq!(mac, [2, 1, 2, 3, 4, 5]);
    let mut word = [0u8; 4];
    BusDevice::read(&mut t, 0x104, &mut word);
    assert_eq!(word, [4, 5, 1, 0], "MAC tail + STATUS=LINK_UP");
    let mut beyond = [0xffu8; 8];
    BusDevice::read(&mut t, 0x108, &mut beyond);
    assert_eq!(beyond, [0; 8]);
    BusDevice::read(&mut t, 0xfff, &mut beyond[..1]);
    assert_eq!(beyond[0], 0);
    BusDevice::write(&mut t, 0x100, &[0xaa; 4]);
    BusDevice::read(&mut t, 0x100, &mut word);
    assert_eq!(word, [2, 1, 2, 3], "config is read-only");
}

#[test]
fn status_steps_must_come_in_order() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    t.w32(VIRTIO_MMIO_STATUS, DRIVER);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0, "DRIVER before ACKNOWLEDGE");
    t.w32(VIRTIO_MMIO_STATUS, ACK);
    t.w32(VIRTIO_MMIO_STATUS, ACK | FEATURES_OK);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), ACK, "FEATURES_OK before DRIVER");
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER);
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER | DRIVER_OK);
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER,
        "DRIVER_OK before FEATURES_OK"
    );
    t.w32(VIRTIO_MMIO_STATUS, ACK);
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER,
        "bits cleared without reset"
    );
    t.w32(
        VIRTIO_MMIO_STATUS,
        ACK | DRIVER | VIRTIO_CONFIG_S_NEEDS_RESET,
    );
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER,
        "NEEDS_RESET is the device's"
    );
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER | VIRTIO_CONFIG_S_FAILED);
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS),
        ACK | DRIVER | VIRTIO_CONFIG_S_FAILED
    );
    t.w32(
        VIRTIO_MMIO_STATUS,
        ACK | DRIVER | VIRTIO_CONFIG_S_FAILED | FEATURES_OK,
    );
    assert_eq!(
        t.r32(VIRTIO_MMIO_STATUS) & FEATURES_OK,
        0,
        "no progress after FAILED"
    );
    t.w32(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0);
    // Several steps in one write are taken in order.
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES, 1);
    t.w32(VIRTIO_MMIO_STATUS, 0);
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES, 1);
    t.w32(VIRTIO_MMIO_STATUS, ACK | DRIVER | FEATURES_OK);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), ACK | DRIVER | FEATURES_OK);
}

#[test]
fn features_ok_is_refused_for_bad_feature_sets() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    let offered = t.device().features();
    let not_offered = 1u64 << 41;
    assert_eq!(offered & not_offered, 0);
    assert!(!t.negotiate(VERSION_1 | not_offered), "feature not offered");
    assert!(!t.negotiate(0), "legacy driver (no VERSION_1)");
    if offered & (1 << VIRTIO_NET_F_HOST_TSO4) != 0 {
        assert!(
            !t.negotiate(VERSION_1 | 1 << VIRTIO_NET_F_HOST_TSO4),
            "HOST_TSO4 without CSUM"
        );
        assert!(t.negotiate(VERSION_1 | 1 << VIRTIO_NET_F_HOST_TSO4 | 1 << VIRTIO_NET_F_CSUM));
    }
    assert!(t.negotiate(VERSION_1));
    assert!(t.negotiate(offered), "everything offered is acceptable");
    // Features are frozen once FEATURES_OK is set.
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    t.w32(VIRTIO_MMIO_DRIVER_FEATURES, 0);
    assert_eq!(t.state.acked_features, offered);
}

#[test]
fn queue_registers_are_validated() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    // Before FEATURES_OK: ignored.
    t.setup_queue(0, 64, rings(0x1000));
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0);
    assert!(t.negotiate(VERSION_1));
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    for bad in [0u32, 3, 100, 128, 65536 + 64, u32::MAX] {
        t.w32(VIRTIO_MMIO_QUEUE_NUM, bad);
        assert_eq!(t.state.queues[0].size(), 64, "QueueNum {bad} refused");
    }
    t.w32(VIRTIO_MMIO_QUEUE_NUM, 16);
    assert_eq!(t.state.queues[0].size(), 16);
    t.w32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1008);
    assert_ne!(
        t.state.queues[0].desc_table(),
        0x1008,
        "descriptor table must be 16-aligned"
    );
    t.w32(VIRTIO_MMIO_QUEUE_USED_LOW, 0x1002);
    assert_ne!(
        t.state.queues[0].used_ring(),
        0x1002,
        "used ring must be 4-aligned"
    );
    t.w32(VIRTIO_MMIO_QUEUE_READY, 7);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 9);
    t.w32(VIRTIO_MMIO_QUEUE_NUM, 16);
    t.w32(VIRTIO_MMIO_QUEUE_READY, 1);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0, "nonexistent queue");
    // Odd access sizes and unknown registers are ignored.
    BusDevice::write(&mut t, u64::from(VIRTIO_MMIO_QUEUE_SEL), &[1, 0]);
    BusDevice::write(&mut t, 0x31, &[0; 4]);
    BusDevice::write(&mut t, 0xf0, &[0; 4]);
    let mut two = [0xffu8; 2];
    BusDevice::read(&mut t, 0, &mut two);
    assert_eq!(two, [0, 0]);

    t.setup_queue(0, 64, rings(0x1000));
    t.setup_queue(1, 64, rings(0x2000));
    t.driver_ok();
    assert!(is_active(&t));
    // After DRIVER_OK the queue configuration is frozen.
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    t.w32(VIRTIO_MMIO_QUEUE_NUM, 32);
    t.w32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000);
    t.w32(VIRTIO_MMIO_QUEUE_READY, 0);
    assert_eq!(t.state.queues[0].size(), 64);
    assert_eq!(t.state.queues[0].desc_table(), 0x1000);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 1);
}

#[test]
fn driver_ok_with_bad_rings_needs_reset() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    // Queue 1 never made ready.
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

    // Rings beyond the end of guest memory.
    assert!(t.negotiate(VERSION_1));
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    t.setup_queue(0, 64, rings(0x1000));
    t.setup_queue(1, 64, rings(0xf_fc00));
    t.driver_ok();
    assert_ne!(t.r32(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert!(!is_active(&t));
}

#[test]
fn reset_returns_to_the_initial_state() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    assert!(t.negotiate(VERSION_1));
    t.setup_queue(0, 32, rings(0x1000));
    t.setup_queue(1, 32, rings(0x2000));
    t.driver_ok();
    assert!(is_active(&t));
    t.interrupt().signal_used_queue().expect("irq");
    t.w32(VIRTIO_MMIO_STATUS, 0);
    assert!(!is_active(&t));
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0);
    assert_eq!(t.r32(VIRTIO_MMIO_INTERRUPT_STATUS), 0);
    assert_eq!(t.state.acked_features, 0);
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0);
    assert_eq!(t.state.queues[0].size(), 64);
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

#[test]
fn interrupt_ack_clears_bits() {
    let mem = mem();
    let (mut t, _peer) = net_transport(&mem);
    t.interrupt().signal_used_queue().expect("irq");
    t.interrupt().signal_config_change().expect("irq");
    assert_eq!(t.r32(VIRTIO_MMIO_INTERRUPT_STATUS), 3);
    t.w32(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
    assert_eq!(t.r32(VIRTIO_MMIO_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
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
