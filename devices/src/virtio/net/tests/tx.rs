//! Transmit path: frames reach the backend intact (header included), in order.

use virtio_queue::QueueT;

use crate::backend::PairBackend;
use crate::virtio::net::metrics::TxCounters;
use crate::virtio::net::tests::support::{frame, guest_mem, wire, GuestQueue, INDIRECT};
use crate::virtio::net::tx::TX_BUDGET;
use crate::virtio::net::{process_tx, TxQueue, TxStop};
use crate::virtio::vring::Virtqueue;

#[test]
fn frame_split_across_descriptors_reaches_backend_with_its_header() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 16);
    let mut queue = driver.queue();
    let payload = frame(1500, 1);
    let bytes = wire(&payload);
    // Header split from the frame, and the header itself split in two.
    let head = driver.push_tx(&bytes, &[5, 12, 700]);
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut counters = TxCounters::default();

    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");

    assert!(outcome.needs_interrupt);
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(peer.recv_frame().expect("frame"), bytes);
    assert_eq!(driver.used_since(0), vec![(u32::from(head), 0)]);
    assert_eq!(counters.frames, 1);
    assert_eq!(counters.bytes, 1500);
    assert_eq!(counters.interrupts_raised, 1);
    assert_eq!(counters.malformed_chains, 0);
}

#[test]
fn frames_leave_in_ring_order_including_indirect_chains() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 16);
    let mut queue = driver.queue();
    let first = wire(&frame(60, 2));
    let second = wire(&frame(300, 3));
    driver.push_tx(&first, &[]);
    // An indirect table of two descriptors: header, then frame.
    let hdr = driver.alloc(&second[..12]);
    let body = driver.alloc(&second[12..]);
    let mut table = Vec::new();
    for (addr, len, flags, next) in [(hdr, 12u32, 1u16, 1u16), (body, 300, 0, 0)] {
        table.extend_from_slice(&addr.to_le_bytes());
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&flags.to_le_bytes());
        table.extend_from_slice(&next.to_le_bytes());
    }
    let table_addr = driver.alloc(&table);
    let head = driver.write_descs(&[(table_addr, 32, INDIRECT, 0)])[0];
    driver.publish(head);
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut counters = TxCounters::default();

    process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");

    assert_eq!(peer.recv_frame().expect("frame"), first);
    assert_eq!(peer.recv_frame().expect("frame"), second);
    assert_eq!(counters.frames, 2);
    assert_eq!(driver.used_idx(), 2);
}

#[test]
fn full_backend_keeps_the_chain_queued_until_it_drains() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 256);
    let mut queue = driver.queue();
    let bytes = wire(&frame(8000, 4));
    for _ in 0..200 {
        driver.push_tx(&bytes, &[]);
    }
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut counters = TxCounters::default();

    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::BackendFull);
    let sent = counters.frames;
    assert!(
        sent > 0 && sent < 200,
        "socket buffer holds some frames: {sent}"
    );
    assert_eq!(
        u64::from(driver.used_idx()),
        sent,
        "the refused chain is not used"
    );
    assert_eq!(u64::from(queue.next_avail()), sent);

    let mut received = 0u64;
    let mut total_frames = sent;
    loop {
        while let Some(got) = peer.try_recv_frame().expect("recv") {
            assert_eq!(got, bytes);
            received += 1;
        }
        let mut counters = TxCounters::default();
        let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");
        total_frames += counters.frames;
        if outcome.stop == TxStop::Drained {
            break;
        }
    }
    while let Some(got) = peer.try_recv_frame().expect("recv") {
        assert_eq!(got, bytes);
        received += 1;
    }
    assert_eq!((total_frames, received), (200, 200));
    assert_eq!(driver.used_idx(), 200);
}

#[test]
fn budget_bounds_one_call() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 512);
    let mut queue = driver.queue();
    let bytes = wire(&frame(20, 5));
    for _ in 0..TX_BUDGET + 10 {
        driver.push_tx(&bytes, &[]);
    }
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut counters = TxCounters::default();

    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Budget);
    assert_eq!(counters.frames, TX_BUDGET as u64);
    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(counters.frames, TX_BUDGET as u64 + 10);
    let mut n = 0;
    while peer.try_recv_frame().expect("recv").is_some() {
        n += 1;
    }
    assert_eq!(n, TX_BUDGET + 10);
}

#[test]
fn tuned_budget_and_parking() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 16);
    let queue = driver.queue();
    let bytes = wire(&frame(20, 5));
    for _ in 0..10 {
        driver.push_tx(&bytes, &[]);
    }
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    let mut counters = TxCounters::default();
    let mut txq = TxQueue::new(Virtqueue::new(&queue, &mem).expect("ring"));
    txq.set_budget(4);
    for sent in [4, 8] {
        let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
        assert_eq!(outcome.stop, TxStop::Budget);
        assert_eq!(counters.frames, sent);
    }
    // Parked: drained, and notifications stay off (no EVENT_IDX: the NO_NOTIFY flag).
    let outcome = txq.poll(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Idle);
    assert_eq!(counters.frames, 10);
    assert_eq!(driver.used_idx(), 10, "used entries published");
    assert_eq!(driver.used_flags() & 1, 1, "notifications still off");
    assert!(!txq.avail_pending());
    driver.push_tx(&bytes, &[]);
    assert!(txq.avail_pending());
    let outcome = txq.process(&mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(driver.used_flags() & 1, 0, "notifications back on");
    let mut n = 0;
    while peer.try_recv_frame().expect("recv").is_some() {
        n += 1;
    }
    assert_eq!(n, 11);
}

#[test]
fn backend_errors_drop_the_frame_and_move_on() {
    let mem = guest_mem();
    let mut driver = GuestQueue::new(&mem, 16);
    let mut queue = driver.queue();
    driver.push_tx(&wire(&frame(100, 6)), &[]);
    driver.push_tx(&wire(&frame(100, 7)), &[]);
    let (mut backend, peer) = PairBackend::new().expect("socketpair");
    drop(peer); // writes now fail with EPIPE
    let mut counters = TxCounters::default();

    let outcome = process_tx(&mut queue, &mem, &mut backend, &mut counters).expect("ring ok");
    assert_eq!(outcome.stop, TxStop::Drained);
    assert_eq!(counters.backend_errors, 2);
    assert_eq!(counters.frames, 0);
    assert_eq!(driver.used_idx(), 2, "the guest gets its buffers back");
}
