//! The device on packed rings (VIRTIO_F_RING_PACKED, offered with `packed=on`) through the
//! virtio-mmio transport and the worker: frames both ways, EVENT_IDX suppression of interrupts
//! and kicks, IN_ORDER transmit completions (packed and split), the control queue, a per-queue
//! reset, and layouts the device refuses. The driver's side is `test_utils::packed`.

use std::time::Duration;

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_IN_ORDER, VIRTIO_F_RING_PACKED, VIRTIO_F_RING_RESET,
};
use virtio_bindings::virtio_mmio::{
    VIRTIO_MMIO_INT_VRING, VIRTIO_MMIO_QUEUE_READY, VIRTIO_MMIO_QUEUE_SEL,
};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, VIRTIO_NET_F_CTRL_RX, VIRTIO_NET_F_CTRL_VQ,
    VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::driver::DriverRing;
use super::support::{frame, guest_mem, wire, GuestQueue};
use super::worker::{kick, no_interrupt, rig_with, take_interrupt, Rig, TIMEOUT, VERSION_1};
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::{GuestPackedQueue, NEXT, WRITE};
use crate::virtio::mmio::QUEUE_RESET_OFFSET;
use crate::virtio::net::ctrl::{ACK_ERR, ACK_OK, CTRL_QUEUE_SIZE};
use crate::virtio::packed::{EVENT_FLAG_DESC, EVENT_FLAG_DISABLE, EVENT_WRAP_BIT};
use crate::virtio::MmioTransport;

const fn bit(feature: u32) -> u64 {
    1 << feature
}

const PACKED: u64 = VERSION_1 | bit(VIRTIO_F_RING_PACKED);
const QSIZE: u16 = 256;

/// A rig whose device offers the packed ring, and IN_ORDER when `in_order`.
fn packed_rig(mem: &GuestMemoryMmap, in_order: bool) -> Rig {
    rig_with(mem, |d| d.offer_ring_features(true, in_order))
}

/// A packed queue of `size` descriptors with its ring at `base` (both event areas right after
/// it) and its buffers from `data` on.
fn packed_queue(mem: &GuestMemoryMmap, base: u64, size: u16, data: u64) -> GuestPackedQueue {
    DriverRing::at(mem, base, size, data)
}

/// The rx and tx queues of pair 0.
fn pair_queues(mem: &GuestMemoryMmap) -> (GuestPackedQueue, GuestPackedQueue) {
    (
        packed_queue(mem, 0, QSIZE, 0x10_0000),
        packed_queue(mem, 0x1_0000, QSIZE, 0x40_0000),
    )
}

/// A [`packed_rig`] (offering IN_ORDER when `features` has it) with the queues of
/// [`pair_queues`] started with `features`.
fn started_packed(
    mem: &GuestMemoryMmap,
    features: u64,
) -> (Rig, GuestPackedQueue, GuestPackedQueue) {
    let mut rig = packed_rig(mem, features & bit(VIRTIO_F_IN_ORDER) != 0);
    let (rx, tx) = pair_queues(mem);
    start_packed(&mut rig.transport, features, &[&rx, &tx]);
    (rig, rx, tx)
}

/// Negotiates `features`, programs the given queues (queue i from `queues[i]`), DRIVER_OK.
fn start_packed(t: &mut MmioTransport, features: u64, queues: &[&GuestPackedQueue]) {
    assert!(t.negotiate(features), "FEATURES_OK accepted");
    for (i, q) in queues.iter().enumerate() {
        t.setup_queue(i as u32, q.size(), q.ring_addrs());
    }
    t.driver_ok();
}

fn needs_reset(t: &mut MmioTransport) -> bool {
    t.status() & VIRTIO_CONFIG_S_NEEDS_RESET != 0
}

/// Sends one frame on the packed tx queue and waits for its used descriptor.
fn send_one(rig: &Rig, tx: &mut GuestPackedQueue, seed: u8) -> Vec<u8> {
    let out = wire(&frame(64, seed));
    let id = tx.push_readable(&[&out]);
    kick(&rig.transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), out);
    assert!(wait_until(TIMEOUT, || tx.peek_used().is_some()));
    assert_eq!(tx.take_used().expect("used").id, id);
    out
}

#[test]
fn packed_is_offered_only_with_packed_on() {
    let mem = guest_mem();
    let mut plain = rig_with(&mem, |_| {});
    let offered = plain.transport.device_features();
    assert_eq!(offered & bit(VIRTIO_F_RING_PACKED), 0);
    assert_eq!(offered & bit(VIRTIO_F_IN_ORDER), 0);
    assert!(!plain.transport.negotiate(PACKED), "not offered: refused");
    let mut rig = packed_rig(&mem, true);
    let offered = rig.transport.device_features();
    assert_ne!(offered & bit(VIRTIO_F_RING_PACKED), 0);
    assert_ne!(offered & bit(VIRTIO_F_IN_ORDER), 0);
}

#[test]
fn frames_flow_both_ways_on_packed_rings() {
    let mem = guest_mem();
    let (mut rig, mut rx, mut tx) = started_packed(&mem, PACKED | bit(VIRTIO_NET_F_MRG_RXBUF));
    assert!(!needs_reset(&mut rig.transport));

    // tx: a frame split across two descriptors, then one more.
    let out = wire(&frame(1000, 1));
    let id = tx.push_readable(&[&out[..12], &out[12..]]);
    kick(&rig.transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), out);
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    let used = tx.take_used().expect("used descriptor");
    assert_eq!((used.id, used.len), (id, 0));
    send_one(&rig, &mut tx, 2);

    // rx: buffers posted, the rx kick, a frame in.
    let (first, bufs) = rx.push_writable(&[2048]);
    rx.push_writable(&[2048]);
    kick(&rig.transport, 0);
    let inbound = frame(700, 3);
    rig.peer.send_frame(&wire(&inbound)).expect("send");
    assert!(wait_until(TIMEOUT, || rx.peek_used().is_some()));
    let used = rx.take_used().expect("used descriptor");
    assert_eq!((used.id, used.len), (first, 12 + 700));
    assert_ne!(used.flags & WRITE, 0, "a written buffer is marked WRITE");
    assert_eq!(rx.read(bufs[0] + 12, 700), inbound);
    assert_eq!(rx.read(bufs[0] + 10, 2), [1, 0], "num_buffers");

    assert!(wait_until(TIMEOUT, || rig.metrics.rx.frames.get() == 1));
    assert_eq!(rig.metrics.tx.frames.get(), 2);
    assert_eq!(rig.metrics.needs_reset_events.get(), 0);
}

#[test]
fn event_idx_suppresses_interrupts_and_kicks_on_packed_rings() {
    let mem = guest_mem();
    let (mut rig, _rx, mut tx) = started_packed(&mem, PACKED | bit(VIRTIO_RING_F_EVENT_IDX));

    // Interrupts: the driver asks for one only at a position far ahead.
    tx.set_driver_event(100 | EVENT_WRAP_BIT, EVENT_FLAG_DESC);
    send_one(&rig, &mut tx, 1);
    assert!(no_interrupt(&rig.transport), "suppressed by off_wrap");
    assert!(wait_until(TIMEOUT, || {
        rig.metrics.tx.interrupts_suppressed_event_idx.get() >= 1
    }));
    // ... then at its next used descriptor: the next frame raises one.
    tx.want_next_used();
    send_one(&rig, &mut tx, 2);
    assert_eq!(take_interrupt(&mut rig.transport), VIRTIO_MMIO_INT_VRING);
    // DISABLE: none at all.
    tx.set_driver_event(0, EVENT_FLAG_DISABLE);
    send_one(&rig, &mut tx, 3);
    assert!(no_interrupt(&rig.transport), "suppressed by DISABLE");

    // Kicks: a drained device asks for one at the driver's next descriptor (DESC with the
    // position as off_wrap), so a second chain made available after an unkicked first one
    // needs no kick of its own.
    let (offset, wrap) = tx.avail_position();
    assert!(wait_until(TIMEOUT, || tx.device_event()
        == (
            offset | if wrap { EVENT_WRAP_BIT } else { 0 },
            EVENT_FLAG_DESC
        )));
    let a = wire(&frame(64, 4));
    let b = wire(&frame(64, 5));
    tx.push_readable(&[&a]);
    assert!(tx.kick_needed(1), "the first new descriptor needs a kick");
    tx.push_readable(&[&b]);
    assert!(!tx.kick_needed(1), "the second does not");
    kick(&rig.transport, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), a);
    assert_eq!(rig.peer.recv_frame().expect("frame"), b);
}

#[test]
fn in_order_returns_a_tx_batch_with_one_used_descriptor() {
    let mem = guest_mem();
    let (rig, _rx, mut tx) = started_packed(&mem, PACKED | bit(VIRTIO_F_IN_ORDER));
    let frames: Vec<Vec<u8>> = (0..5).map(|i| wire(&frame(100, i))).collect();
    let ids: Vec<u16> = frames.iter().map(|f| tx.push_readable(&[f])).collect();
    kick(&rig.transport, 1);
    for f in &frames {
        assert_eq!(rig.peer.recv_frame().expect("frame"), *f);
    }
    assert!(wait_until(TIMEOUT, || tx.peek_used().is_some()));
    let (used, chains) = tx.take_used_in_order().expect("used descriptor");
    assert_eq!(
        (used.id, chains),
        (ids[4], 5),
        "one descriptor for the batch"
    );
    assert!(tx.peek_used().is_none(), "and nothing after it");
    assert_eq!(tx.outstanding(), 0);
    // The ring goes on from past the batch.
    send_one(&rig, &mut tx, 9);
}

#[test]
fn in_order_on_a_split_ring_returns_a_tx_batch_with_one_used_element() {
    let mem = guest_mem();
    let mut rig = rig_with(&mem, |d| d.offer_ring_features(false, true));
    let rx = GuestQueue::at(&mem, GuestAddress(0), 256, 0x10_0000);
    let mut tx = GuestQueue::at(&mem, GuestAddress(0x1_0000), 256, 0x40_0000);
    let t = &mut rig.transport;
    assert!(t.negotiate(VERSION_1 | bit(VIRTIO_F_IN_ORDER)));
    t.setup_queue(0, 256, rx.ring_addrs());
    t.setup_queue(1, 256, tx.ring_addrs());
    t.driver_ok();
    let frames: Vec<Vec<u8>> = (0..4).map(|i| wire(&frame(80, i))).collect();
    let mut heads = Vec::new();
    for f in &frames {
        heads.push(tx.push_tx(f, &[]));
    }
    kick(&rig.transport, 1);
    for f in &frames {
        assert_eq!(rig.peer.recv_frame().expect("frame"), *f);
    }
    assert!(wait_until(TIMEOUT, || tx.used_idx() == 4));
    // One element per batch, at the batch's first slot, naming its last buffer: the used
    // index moves past the whole batch (the device may have sent the four in one batch or
    // more). Walked as a driver does.
    let mut at = 0;
    let mut elements = 0;
    while at < 4 {
        let (id, _) = tx.used(at);
        let last = heads
            .iter()
            .position(|&h| u32::from(h) == id)
            .expect("an element names a buffer of the batch");
        assert!(
            last >= usize::from(at),
            "element {at} names an earlier buffer"
        );
        at = last as u16 + 1;
        elements += 1;
    }
    assert_eq!(at, 4);
    assert!(elements <= 4);
}

#[test]
fn the_control_queue_runs_on_a_packed_ring() {
    let mem = guest_mem();
    let mut rig = packed_rig(&mem, false);
    let (rx, tx) = pair_queues(&mem);
    let mut ctrl = packed_queue(&mem, 0x2_0000, CTRL_QUEUE_SIZE, 0x60_0000);
    start_packed(
        &mut rig.transport,
        PACKED | bit(VIRTIO_NET_F_CTRL_VQ) | bit(VIRTIO_NET_F_CTRL_RX),
        &[&rx, &tx, &ctrl],
    );
    let mut send = |class: u8, cmd: u8, data: &[u8]| {
        let mut readable = vec![class, cmd];
        readable.extend_from_slice(data);
        let out = ctrl.alloc(&readable);
        let ack = ctrl.alloc(&[0xAA]);
        let id = ctrl.add_chain(&[(out, readable.len() as u32, 0), (ack, 1, WRITE)]);
        kick(&rig.transport, 2);
        assert!(wait_until(TIMEOUT, || ctrl.peek_used().is_some()));
        let used = ctrl.take_used().expect("used descriptor");
        assert_eq!((used.id, used.len), (id, 1));
        ctrl.read(ack, 1)[0]
    };
    let rx_class = VIRTIO_NET_CTRL_RX as u8;
    assert_eq!(
        send(rx_class, VIRTIO_NET_CTRL_RX_PROMISC as u8, &[1]),
        ACK_OK
    );
    assert_eq!(send(0xEE, 0, &[]), ACK_ERR, "an unknown class");
    assert!(wait_until(TIMEOUT, || rig.metrics.ctrl.commands.get() == 2));
}

#[test]
fn a_reset_packed_queue_restarts_at_offset_0_wrap_1() {
    let mem = guest_mem();
    let (mut rig, _rx, mut tx) = started_packed(&mem, PACKED | bit(VIRTIO_F_RING_RESET));
    for seed in 0..3 {
        send_one(&rig, &mut tx, seed);
    }
    let t = &mut rig.transport;
    t.w32(VIRTIO_MMIO_QUEUE_SEL, 1);
    t.w32(QUEUE_RESET_OFFSET, 1);
    assert!(wait_until(TIMEOUT, || t.r32(QUEUE_RESET_OFFSET) == 0));
    assert_eq!(t.r32(VIRTIO_MMIO_QUEUE_READY), 0, "queue 1 disabled");
    // The driver re-initialises the same ring (zeroed: offset 0, wrap counter 1).
    let mut tx = packed_queue(&mem, 0x1_0000, QSIZE, 0x50_0000);
    t.setup_queue(1, QSIZE, tx.ring_addrs());
    assert_eq!(tx.avail_position(), (0, true));
    send_one(&rig, &mut tx, 7);
    assert_eq!(
        tx.used_position(),
        (1, true),
        "used at offset 0 with wrap 1"
    );
    assert_eq!(rig.metrics.queue_reenables.get(), 1);
    assert!(!needs_reset(&mut rig.transport));
}

#[test]
fn a_hostile_packed_layout_sets_needs_reset() {
    let mem = guest_mem();
    let layouts = [
        // The driver event area inside the descriptor ring (the device writes the ring).
        (0x1_0000, 0x1_0000 + 64, 0x1_0000 + 16 * u64::from(QSIZE)),
        // The device event area on the driver's.
        (0x1_0000, 0x2_0000, 0x2_0000),
        // The descriptor ring running past the end of guest memory.
        (
            crate::test_utils::packed::MEM_SIZE - 0x800,
            0x2_0000,
            0x2_0010,
        ),
    ];
    for (i, (desc, driver, device)) in layouts.into_iter().enumerate() {
        let mut rig = packed_rig(&mem, false);
        let rx = packed_queue(&mem, 0, QSIZE, 0x10_0000);
        let t = &mut rig.transport;
        assert!(t.negotiate(PACKED));
        t.setup_queue(0, QSIZE, rx.ring_addrs());
        t.setup_queue(1, QSIZE, (desc, driver, device));
        t.driver_ok();
        assert!(
            wait_until(TIMEOUT, || needs_reset(t)),
            "layout {i}: NEEDS_RESET"
        );
        assert_eq!(
            rig.metrics.needs_reset_events.get(),
            1,
            "layout {i}: counted"
        );
        // Nothing runs: a frame from the peer is not delivered.
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(rig.metrics.rx.frames.get(), 0);
    }
}

/// The device's per-chain limit on a packed ring: an indirect table of more entries than a
/// chain may have is refused and returned with length 0 (the queue goes on, as on a split
/// ring); a direct chain whose NEXT flags run over the whole ring has no end the device can
/// find, so it cannot be returned: the device asks for a reset.
#[test]
fn chains_past_the_per_chain_limit_are_refused_on_packed_rings() {
    use crate::virtio::guest::MAX_CHAIN_DESCRIPTORS;

    let mem = guest_mem();
    let (mut rig, _rx, mut tx) = started_packed(&mem, PACKED);
    let entries = MAX_CHAIN_DESCRIPTORS as usize + 1;
    let bytes = wire(&frame(64, 1));
    let buf = tx.alloc(&bytes);
    let table = vec![(buf, 1, 0); entries];
    let id = tx.add_indirect(&table);
    kick(&rig.transport, 1);
    assert!(wait_until(TIMEOUT, || tx.peek_used().is_some()));
    assert_eq!(tx.take_used().map(|u| (u.id, u.len)), Some((id, 0)));
    assert_eq!(rig.metrics.tx.malformed_chains.get(), 1);
    assert!(
        rig.peer.try_recv_frame().expect("recv").is_none(),
        "nothing sent"
    );
    send_one(&rig, &mut tx, 2);

    // NEXT on every descriptor of the ring.
    let raw: Vec<_> = (0..QSIZE).map(|_| (buf, 1, 0, NEXT)).collect();
    tx.write_raw(&raw);
    kick(&rig.transport, 1);
    assert!(wait_until(TIMEOUT, || needs_reset(&mut rig.transport)));
    assert_eq!(rig.metrics.needs_reset_events.get(), 1);
    assert_eq!(rig.metrics.tx.frames.get(), 1);
}
