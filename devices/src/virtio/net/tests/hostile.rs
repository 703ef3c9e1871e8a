//! Hostile driver input: every case neither crashes nor hangs. Per-chain errors return the
//! chain with length 0 and count `malformed_chains`; ring-level errors are `RingError`s (the
//! worker then sets DEVICE_NEEDS_RESET).

use virtio_queue::QueueT;

use crate::backend::PairBackend;
use crate::test_utils::mmio::xorshift;
use crate::virtio::net::metrics::{RxCounters, TxCounters};
use crate::virtio::net::tests::support::{
    desc_bytes, drain, frame, guest_mem, pair, wire, GuestQueue, Ring, INDIRECT, MEM_SIZE, NEXT,
    WRITE,
};
use crate::virtio::net::tx::MAX_TX_CHAIN_LEN;
use crate::virtio::net::{process_rx, process_tx, RxMode};
use crate::virtio::ring::RingError;

/// Runs tx over whatever the driver queued plus one valid frame queued last, and checks that
/// only the valid frame reached the backend. Returns the counters.
fn tx_after(ring: &mut Ring) -> TxCounters {
    let good = wire(&frame(80, 0xee));
    ring.driver.push_tx(&good, &[]);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    ring.try_tx(&mut backend, &mut counters)
        .expect("per-chain errors are not fatal");
    assert_eq!(peer.recv_frame().expect("good frame"), good);
    assert_eq!(
        peer.try_recv_frame().expect("recv"),
        None,
        "nothing else sent"
    );
    assert_eq!(counters.frames, 1);
    counters
}

/// Asserts the first used entries are the chains `heads`, in order, each with length 0.
fn assert_returned_empty(driver: &GuestQueue, heads: &[u16]) {
    let used = driver.used_since(0);
    for (i, &head) in heads.iter().enumerate() {
        assert_eq!(used[i], (u32::from(head), 0), "chain {head}");
    }
}

/// [`tx_after`], asserting that every chain of `heads` was refused: each counted malformed
/// and returned with length 0, in order.
fn assert_refused(ring: &mut Ring, heads: &[u16]) {
    let counters = tx_after(ring);
    assert_eq!(counters.malformed_chains, heads.len() as u64);
    assert_returned_empty(&ring.driver, heads);
}

#[test]
fn descriptor_loop() {
    let mut ring = Ring::new(16);
    let buf = ring.driver.alloc(&wire(&frame(10, 0)));
    // a → b → a → ...
    let a = ring.driver.next_slot();
    let slots = ring
        .driver
        .write_descs(&[(buf, 22, NEXT, a + 1), (buf, 22, NEXT, a)]);
    ring.driver.publish(slots[0]);
    // A self-loop.
    let self_loop = ring.driver.next_slot();
    let slot = ring.driver.write_descs(&[(buf, 22, NEXT, self_loop)])[0];
    ring.driver.publish(slot);

    assert_refused(&mut ring, &[slots[0], slot]);
}

#[test]
fn next_index_out_of_range() {
    let mut ring = Ring::new(16);
    let buf = ring.driver.alloc(&wire(&frame(10, 0)));
    let slot = ring.driver.write_descs(&[(buf, 22, NEXT, 500)])[0];
    ring.driver.publish(slot);
    assert_refused(&mut ring, &[slot]);
}

#[test]
fn buffer_outside_guest_memory() {
    let mut ring = Ring::new(16);
    let hdr = ring.driver.alloc(&wire(&[]));
    let mut heads = Vec::new();
    for (addr, len) in [
        (MEM_SIZE, 100u32),         // just past the end
        (MEM_SIZE - 50, 100),       // straddles the end
        (u64::MAX - 10, 100),       // wraps around the address space
        (0xdead_0000_0000, 0x1000), // far away
    ] {
        heads.push(ring.driver.add_chain(&[(hdr, 12), (addr, len)], 0));
    }
    assert_refused(&mut ring, &heads);
}

#[test]
fn wrong_direction() {
    let mut ring = Ring::new(16);
    let buf = ring.driver.alloc(&wire(&frame(50, 0)));
    // tx: a device-writable descriptor.
    let head = ring.driver.add_chain(&[(buf, 12), (buf + 12, 50)], WRITE);
    assert_refused(&mut ring, &[head]);

    // rx: a device-readable descriptor. It is returned empty and the frame waits for a good
    // buffer.
    let mut rx = ring.second();
    let bad = rx.driver.add_chain(&[(buf, 2048)], 0);
    let (mut backend, peer) = pair();
    peer.send_frame(&wire(&frame(64, 1))).expect("send");
    let counters = rx_run(&mut rx, &mut backend, RxMode::Mergeable);
    assert_eq!(counters.malformed_chains, 1);
    assert_eq!(counters.frames, 0);
    assert_eq!(rx.driver.used_since(0), vec![(u32::from(bad), 0)]);
    let (good, bufs) = rx.driver.push_rx(&[2048]);
    let counters = rx_run(&mut rx, &mut backend, RxMode::Mergeable);
    assert_eq!(counters.frames, 1);
    assert_eq!(rx.driver.used(1), (u32::from(good), 76));
    assert_eq!(rx.driver.read(bufs[0] + 12, 64), frame(64, 1));
}

#[test]
fn zero_length_frames() {
    let mut ring = Ring::new(16);
    let hdr = ring.driver.alloc(&wire(&[]));
    let heads = vec![
        ring.driver.add_chain(&[(hdr, 12)], 0), // header only
        ring.driver.add_chain(&[(hdr, 5)], 0),  // not even a header
        ring.driver.add_chain(&[(hdr, 0)], 0),  // zero-length descriptor
        ring.driver.add_chain(&[(hdr, 12), (hdr + 64, 0)], 0), // header + empty buffer
    ];
    assert_refused(&mut ring, &heads);
}

#[test]
fn oversized_frames() {
    let mut ring = Ring::new(16);
    let max = MAX_TX_CHAIN_LEN as usize;
    let biggest = wire(&frame(max - 12, 1));
    let too_big = ring.driver.push_tx(&wire(&frame(max - 11, 2)), &[30_000]);
    // The limit also holds when the length only overflows u32 across descriptors.
    let buf = ring.driver.alloc_zeroed(16);
    let overflow = ring
        .driver
        .add_chain(&[(buf, 12), (buf, u32::MAX - 4), (buf, 100)], 0);
    ring.driver.push_tx(&biggest, &[12]);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    ring.tx(&mut backend, &mut counters);
    assert_eq!(counters.malformed_chains, 2);
    assert_returned_empty(&ring.driver, &[too_big, overflow]);
    assert_eq!(peer.recv_frame().expect("largest legal frame"), biggest);
    assert_eq!(counters.frames, 1);
}

#[test]
fn malformed_indirect_tables() {
    let mut ring = Ring::new(16);
    let hdr = ring.driver.alloc(&wire(&frame(20, 0)));
    // An indirect table whose own descriptor is indirect (nesting is forbidden).
    let nested_addr = ring.driver.alloc(&desc_bytes(hdr, 32, INDIRECT, 0));
    // A table whose only descriptor points to an entry beyond the table.
    let dangling_addr = ring.driver.alloc(&desc_bytes(hdr, 32, NEXT, 7));
    let mut heads = Vec::new();
    for (addr, len) in [
        (hdr, 24),               // length not a multiple of 16
        (hdr, 0),                // empty table
        (MEM_SIZE + 0x1000, 32), // table outside guest memory
        (nested_addr, 16),
        (dangling_addr, 16),
    ] {
        let slot = ring.driver.write_descs(&[(addr, len, INDIRECT, 0)])[0];
        ring.driver.publish(slot);
        heads.push(slot);
    }
    // An indirect descriptor in the middle of a chain, with a bad table.
    let first = ring.driver.next_slot();
    let slots = ring
        .driver
        .write_descs(&[(hdr, 12, NEXT, (first + 1) % 16), (hdr, 8, INDIRECT, 0)]);
    ring.driver.publish(slots[0]);
    heads.push(slots[0]);

    assert_refused(&mut ring, &heads);
}

#[test]
fn avail_index_jump_is_a_ring_error() {
    let mut ring = Ring::new(16);
    ring.driver.push_tx(&wire(&frame(64, 0)), &[]);
    ring.driver.set_avail_idx(17);
    let (mut backend, peer) = pair();
    let mut counters = TxCounters::default();
    let err = ring.try_tx(&mut backend, &mut counters).expect_err("jump");
    assert!(matches!(err, RingError::AvailIndexJump), "{err:?}");
    assert_eq!(peer.try_recv_frame().expect("recv"), None);

    let mut rx = ring.second();
    rx.driver.set_avail_idx(40_000);
    peer.send_frame(&wire(&frame(64, 0))).expect("send");
    let mut counters = RxCounters::default();
    let err = rx
        .try_rx(&mut backend, RxMode::Mergeable, &mut counters)
        .expect_err("jump");
    assert!(matches!(err, RingError::AvailIndexJump), "{err:?}");
}

#[test]
fn head_index_out_of_range_is_a_ring_error() {
    let mut ring = Ring::new(16);
    ring.driver.publish(16);
    let (mut backend, _peer) = pair();
    let mut counters = TxCounters::default();
    let err = ring
        .try_tx(&mut backend, &mut counters)
        .expect_err("bad head");
    assert!(matches!(err, RingError::HeadOutOfRange(16)), "{err:?}");
}

#[test]
fn rx_chain_shorter_than_the_header() {
    let mut ring = Ring::new(16);
    let short = ring.driver.push_rx(&[8]).0;
    let (good, bufs) = ring.driver.push_rx(&[4, 8, 1000]); // header straddles three descriptors
    let (mut backend, peer) = pair();
    peer.send_frame(&wire(&frame(500, 5))).expect("send");
    let counters = rx_run(&mut ring, &mut backend, RxMode::SingleChain);
    assert_eq!(counters.malformed_chains, 1);
    assert_eq!(counters.frames, 1);
    assert_eq!(
        ring.driver.used_since(0),
        vec![(u32::from(short), 0), (u32::from(good), 512)]
    );
    // Header bytes 4..12: the backend's fields, then num_buffers = 1 written by the device.
    assert_eq!(ring.driver.read(bufs[1], 8), [0, 0, 34, 0, 16, 0, 1, 0]);
    assert_eq!(ring.driver.read(bufs[2], 500), frame(500, 5));
}

#[test]
fn rx_malformed_chain_after_good_ones_is_returned_once_in_order() {
    let mut ring = Ring::new(16);
    let a = ring.driver.push_rx(&[1024]).0;
    let b = ring.driver.push_rx(&[1024]).0;
    let bad = ring.driver.add_chain(&[(MEM_SIZE, 1024)], WRITE);
    let c = ring.driver.push_rx(&[1024]).0;
    let (mut backend, peer) = pair();
    for i in 0..3 {
        peer.send_frame(&wire(&frame(900, i))).expect("send");
    }
    let mut counters = rx_run(&mut ring, &mut backend, RxMode::Mergeable);
    // A second call with nothing to read must not count the bad chain again.
    let again = rx_run(&mut ring, &mut backend, RxMode::Mergeable);
    counters.malformed_chains += again.malformed_chains;
    assert_eq!(counters.frames, 3);
    assert_eq!(counters.malformed_chains, 1);
    let ids: Vec<u32> = ring.driver.used_since(0).iter().map(|u| u.0).collect();
    assert_eq!(ids, [a, b, bad, c].map(u32::from));
}

fn rx_run(ring: &mut Ring, backend: &mut PairBackend, mode: RxMode) -> RxCounters {
    let mut counters = RxCounters::default();
    ring.try_rx(backend, mode, &mut counters)
        .expect("per-chain errors are not fatal");
    counters
}

/// Random descriptor tables, avail rings and indexes: the datapath may refuse chains or report
/// a broken ring, but never panics or spins.
#[test]
fn random_rings_never_panic() {
    let mem = guest_mem();
    let mut next = xorshift(0x2545_f491_4f6c_dd1d);
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut broken = 0;
    for round in 0..300 {
        let mut driver = GuestQueue::new(&mem, 16);
        let mut queue = driver.queue();
        queue.set_event_idx(round % 2 == 0);
        let descs: Vec<_> = (0..16)
            .map(|_| {
                let r = next();
                let addr = match r % 4 {
                    0 => next(),
                    _ => 0x10_0000 + (next() % 0x1000) * 16,
                };
                let len = match (r >> 8) % 4 {
                    0 => next() as u32,
                    1 => 0,
                    _ => (next() % 4096) as u32,
                };
                let flags = ((r >> 16) % 8) as u16; // NEXT | WRITE | INDIRECT
                let next_index = ((r >> 24) % 20) as u16;
                (addr, len, flags, next_index)
            })
            .collect();
        driver.write_descs(&descs);
        for _ in 0..(next() % 20) {
            driver.publish((next() % 18) as u16);
        }
        if next().is_multiple_of(8) {
            driver.set_avail_idx(next() as u16);
        }
        peer.try_send_frame(&wire(&frame(100, round as u8))).ok();
        let mut tx = TxCounters::default();
        let mut rx = RxCounters::default();
        let mode = if round % 3 == 0 {
            RxMode::SingleChain
        } else {
            RxMode::Mergeable
        };
        let tx_result = process_tx(&mut queue, &mem, &mut backend, &mut tx);
        // The same hostile ring, seen as an rx queue.
        let mut rx_queue = driver.queue();
        let rx_result = process_rx(&mut rx_queue, &mem, &mut backend, mode, &mut rx);
        broken += usize::from(tx_result.is_err()) + usize::from(rx_result.is_err());
        drain(&peer);
    }
    assert!(broken > 0, "some rings were broken enough to need a reset");
}
