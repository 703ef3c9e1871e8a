//! Work bounds and nonsensical rings (hostile guests must not make the device spin or stall a
//! reset): every call is bounded by the descriptors it visits, whatever the chains look like,
//! and a used ring that overlaps what the device reads is refused at activation.

use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use virtio_bindings::virtio_mmio::VIRTIO_MMIO_STATUS;
use vm_memory::GuestAddress;

use super::driver::DriverRing;
use super::support::{
    desc_bytes, frame, guest_mem, pair, wire, GuestQueue, Ring, INDIRECT, MEM_SIZE, NEXT, WRITE,
};
use super::worker::{kick, queues, queues_after_reset, rig, start, TIMEOUT, VERSION_1};
use crate::test_utils::mmio::{wait_until, Registers};
use crate::test_utils::packed::GuestPackedQueue;
use crate::test_utils::queue::DATA_START;
use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::rx::RX_GATHER_NO_GSO_BYTES;
use crate::virtio::net::{RxMode, RxStop, TxStop};
use crate::virtio::net::{RxQueue, TxQueue};
use crate::virtio::ring::{RingError, RingPart};
use crate::virtio::vring::{Virtqueue, CALL_DESCRIPTOR_BUDGET, MAX_CHAIN_DESCRIPTORS};

/// Makes `chains` chains of `links` empty descriptors each available.
fn publish_empty_chains<Q: DriverRing>(driver: &mut Q, chains: usize, links: u16, flags: u16) {
    for _ in 0..chains {
        driver.offer(&vec![(0x20_0000, 0, flags); usize::from(links)]);
    }
}

/// A driver's 8192-entry ring of `Q`'s kind at the start of fresh guest memory.
fn big_ring<Q: DriverRing>() -> Q {
    Q::at(&guest_mem(), 0, 8192, DATA_START)
}

/// A [`big_ring`] with 60 chains of 100 empty descriptors (`flags` on each) made available.
fn empty_chains<Q: DriverRing>(flags: u16) -> Q {
    let mut driver = big_ring::<Q>();
    publish_empty_chains(&mut driver, 60, 100, flags);
    driver
}

/// Takes `n` used entries, each of length 0, and checks that no more were returned.
#[track_caller]
fn assert_all_returned_empty<Q: DriverRing>(driver: &mut Q, n: usize) {
    for _ in 0..n {
        assert_eq!(driver.next_used().expect("returned").1, 0);
    }
    assert!(driver.next_used().is_none());
}

#[test]
fn tx_call_is_bounded_by_descriptors_visited_not_frames() {
    tx_call_bounded::<GuestQueue>();
}

#[test]
fn tx_call_is_bounded_by_descriptors_visited_on_a_packed_ring() {
    tx_call_bounded::<GuestPackedQueue>();
}

fn tx_call_bounded<Q: DriverRing>() {
    // 60 chains of 100 empty descriptors: no frame in any of them.
    let mut driver = empty_chains::<Q>(0);
    let mut txq = TxQueue::new(driver.device_ring(0));
    let (mut backend, _peer) = pair();
    let mut counters = TxCounters::default();
    let mut tx = |counters: &mut TxCounters| txq.process(&mut backend, counters).expect("ring ok");
    let outcome = tx(&mut counters);
    assert_eq!(outcome.stop, TxStop::Budget);
    let per_call = u64::from(CALL_DESCRIPTOR_BUDGET / 100 + 1);
    assert_eq!(counters.malformed_chains, per_call, "one call's share");
    // The rest comes in later calls; each is returned with length 0.
    while tx(&mut counters).stop == TxStop::Budget {}
    assert_eq!(counters.malformed_chains, 60);
    assert_all_returned_empty(&mut driver, 60);
}

#[test]
fn huge_indirect_tables_cost_a_bounded_walk() {
    let mut ring = Ring::new(16);
    // A 65535-entry indirect table of empty, linked descriptors (1 MiB).
    let entries = 65535u32;
    let table: Vec<u8> = (0..entries)
        .flat_map(|i| {
            let next = (i + 1).min(entries - 1) as u16;
            let flags = if i + 1 < entries { NEXT } else { 0 };
            desc_bytes(0x20_0000, 0, flags, next)
        })
        .collect();
    let at = ring.driver.alloc(&table);
    for _ in 0..8 {
        let slot = ring.driver.write_descs(&[(at, entries * 16, INDIRECT, 0)])[0];
        ring.driver.publish(slot);
    }
    let (mut backend, _peer) = pair();
    let mut counters = TxCounters::default();
    let outcome = ring.tx(&mut backend, &mut counters);
    // Each chain is cut at MAX_CHAIN_DESCRIPTORS, and the call at its descriptor budget.
    assert_eq!(outcome.stop, TxStop::Budget);
    assert_eq!(
        counters.malformed_chains,
        u64::from(CALL_DESCRIPTOR_BUDGET.div_ceil(MAX_CHAIN_DESCRIPTORS + 1))
    );
}

#[test]
fn rx_fill_is_bounded_when_every_chain_is_malformed() {
    rx_fill_bounded::<GuestQueue>();
}

#[test]
fn rx_fill_is_bounded_when_every_chain_is_malformed_on_a_packed_ring() {
    rx_fill_bounded::<GuestPackedQueue>();
}

fn rx_fill_bounded<Q: DriverRing>() {
    // Chains of 100 empty device-writable descriptors: walked to the end, then refused (no
    // room for a header).
    let mut driver = empty_chains::<Q>(WRITE);
    let mut rxq = RxQueue::new(
        driver.device_ring(0),
        RxMode::Mergeable,
        RX_GATHER_NO_GSO_BYTES,
    );
    let (mut backend, peer) = pair();
    peer.send_frame(&wire(&frame(64, 1))).expect("send");
    let mut counters = RxCounters::default();
    let mut rx = |counters: &mut RxCounters| rxq.process(&mut backend, counters).expect("ring ok");
    let outcome = rx(&mut counters);
    assert_eq!(outcome.stop, RxStop::Budget);
    assert!(counters.malformed_chains < 60, "{counters:?}");
    assert_eq!(counters.frames, 0);
    // Later calls finish the job: everything refused, then no buffers.
    let mut stop = outcome.stop;
    for _ in 0..10 {
        if stop != RxStop::Budget {
            break;
        }
        stop = rx(&mut counters).stop;
    }
    assert_eq!(stop, RxStop::NoBuffers);
    assert_eq!(counters.malformed_chains, 60);
    assert_all_returned_empty(&mut driver, 60);
}

#[test]
fn used_ring_overlapping_the_avail_ring_or_table_is_refused() {
    let mem = guest_mem();
    let driver = GuestQueue::new(&mem, 16);
    let (desc, avail, _) = driver.ring_addrs();
    for (used, part) in [
        // The used ring's flags word on the avail ring's idx.
        (avail + 2 - 2, RingPart::AvailRing),
        (avail + 4, RingPart::AvailRing),
        (desc + 16 * 8, RingPart::DescTable),
    ] {
        let mut queue = driver.queue();
        queue
            .try_set_used_ring_address(GuestAddress(used & !3))
            .expect("aligned");
        let err = Virtqueue::new(&queue, &mem).expect_err("overlap refused");
        assert!(
            matches!(err, RingError::Overlap(p) if p == part),
            "{used:#x}: {err:?}"
        );
    }
    // Misaligned or outside memory: refused too.
    let mut queue = driver.queue();
    queue
        .try_set_used_ring_address(GuestAddress(MEM_SIZE - 16))
        .expect("aligned");
    assert!(matches!(
        Virtqueue::new(&queue, &mem),
        Err(RingError::OutsideMemory(RingPart::UsedRing))
    ));
}

#[test]
fn overlapping_rings_make_the_device_need_a_reset_not_spin() {
    let mem = guest_mem();
    let mut rig = rig(&mem);
    let (rx, tx) = queues(&mem);
    let t = &mut rig.transport;
    assert!(t.negotiate(VERSION_1));
    t.setup_queue(0, 256, rx.ring_addrs());
    let (desc, avail, _) = tx.ring_addrs();
    // The used ring's flags land on the avail ring's idx: without the check, every used entry
    // would publish another avail entry.
    t.setup_queue(1, 256, (desc, avail, avail + 2 - 2));
    t.driver_ok();
    assert_ne!(t.r32(VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert_eq!(rig.metrics.needs_reset_events.get(), 1);
    // A reset completes at once, and a good ring works afterwards.
    t.w32(VIRTIO_MMIO_STATUS, 0);
    assert_eq!(t.r32(VIRTIO_MMIO_STATUS), 0);
    let (rx2, mut tx2) = queues_after_reset(&mem);
    start(t, VERSION_1, &rx2, &tx2);
    let out = wire(&frame(64, 7));
    tx2.push_tx(&out, &[]);
    kick(t, 1);
    assert_eq!(rig.peer.recv_frame().expect("frame"), out);
    assert!(wait_until(TIMEOUT, || rig.metrics.tx.frames.get() == 1));
}

#[test]
fn a_burst_publishes_the_used_index_in_batches_and_decides_once() {
    let mut ring = Ring::new(256);
    let frames: Vec<Vec<u8>> = (0..100).map(|i| wire(&frame(60, i as u8))).collect();
    ring.push_frames(&frames);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let outcome = ring.tx(&mut backend, &mut counters);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert!(outcome.needs_interrupt);
    assert_eq!(
        ring.driver.used_idx(),
        100,
        "everything published by the end"
    );
    assert_eq!(counters.interrupts_raised, 1, "one decision per call");
    for f in &frames {
        assert_eq!(&peer.recv_frame().expect("frame"), f);
    }
}

#[test]
fn rx_queue_keeps_its_pool_across_calls() {
    rx_pool_kept::<GuestQueue>();
    rx_pool_kept::<GuestPackedQueue>();
}

/// Mergeable buffers of 2048 bytes: each call delivers its frame and keeps about one maximal
/// frame's worth of buffers ahead, never the whole ring.
fn rx_pool_kept<Q: DriverRing>() {
    let mut driver = Q::at(&guest_mem(), 0, 64, DATA_START);
    let bufs: Vec<u64> = (0..64).map(|_| driver.offer_rx(&[2048]).1[0]).collect();
    let mut rxq = RxQueue::new(
        driver.device_ring(0),
        RxMode::Mergeable,
        RX_GATHER_NO_GSO_BYTES,
    );
    let (mut backend, peer) = pair();
    let mut counters = RxCounters::default();
    for i in 0..20u8 {
        let f = wire(&frame(64, i));
        peer.send_frame(&f).expect("send");
        let out = rxq.process(&mut backend, &mut counters).expect("ring ok");
        assert_eq!(out.stop, RxStop::BackendEmpty);
        let held = rxq.pooled_chains() as u64 * 2048;
        assert!(held >= RX_GATHER_NO_GSO_BYTES, "{held}");
        assert!(held < RX_GATHER_NO_GSO_BYTES + 2 * 2048, "{held}");
        assert_eq!(driver.next_used().map(|u| u.1), Some(f.len() as u32));
        assert_eq!(driver.peek(bufs[usize::from(i)] + 12, 64), frame(64, i));
    }
    assert_eq!(counters.frames, 20);
    assert_eq!(counters.malformed_chains, 0);
}
